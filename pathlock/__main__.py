"""``python -m pathlock``: the same command line as ``pathlock``."""

import sys

from pathlock.cli import main

sys.exit(main())

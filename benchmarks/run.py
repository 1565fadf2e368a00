"""The benchmark suite, from a checkout: the same as ``pathlock bench``.

    python benchmarks/run.py [--url URL] [--only N[,N...]] [--quick]
                             [--output PATH | --no-report]

The suite itself lives in ``pathlock/bench/`` so that an installed pathlock
has it too; ``--help`` lists the experiments and options.
"""

import sys

from pathlock.cli import main

# The guard matters: worker processes are spawned, and each imports this file.
if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))

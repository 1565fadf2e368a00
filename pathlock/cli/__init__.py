"""The ``pathlock`` command line (also ``python -m pathlock``).

- :mod:`pathlock.cli.commands`: the subcommands, and :func:`main`;
- :mod:`pathlock.cli.arguments`: what the command line accepts (argparse);
- :mod:`pathlock.cli.runner`: ``pathlock lock``: a command run under locks;
- :mod:`pathlock.cli.keeper`: the process between ``pathlock lock`` and its
  command, which stops every process the command started;
- :mod:`pathlock.cli.listing`: ``pathlock ls``'s table, tree and JSON.

Each is a thin layer over the library.
"""

from pathlock.cli.commands import main

__all__ = ["main"]

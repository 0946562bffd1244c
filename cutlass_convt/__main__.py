"""``python -m cutlass_convt COMMAND ...``: the command line (``cutlass_convt.cli``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m cutlass_convt"))

"""``python -m cutlass_convt bench [...]``: the benchmark suite (see ``benchmark.main``)."""

import sys

from .benchmark import main

USAGE = "usage: python -m cutlass_convt bench [--problem ...] [--trials N] [--compile] [--out DIR]"

if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(USAGE + "\n(python -m cutlass_convt bench --help for the options)")
    elif sys.argv[1:2] != ["bench"]:  # a usage error: exit status 2 and message, as argparse
        given = f"unknown command {sys.argv[1]!r}" if sys.argv[1:] else "a command is required"
        print(f"{USAGE}\npython -m cutlass_convt: error: {given} (the one command is bench)",
              file=sys.stderr)
        sys.exit(2)
    else:
        main(sys.argv[2:], prog="python -m cutlass_convt bench")

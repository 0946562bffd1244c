"""``python -m cutlass_convt bench [...]``: the benchmark suite (see ``benchmark.main``)."""

import sys

from .benchmark import main

if __name__ == "__main__":
    if sys.argv[1:2] != ["bench"]:
        sys.exit("usage: python -m cutlass_convt bench [--problem ...] [--trials N] [--out DIR]")
    main(sys.argv[2:])

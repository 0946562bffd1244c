"""Benchmark every route of named problems side by side on the GPU; writes a markdown table,
JSON and a PNG chart per problem (``python scripts/bench.py --problem all --out results``).
Same as ``python -m cutlass_convt bench``."""

from cutlass_convt.benchmark import main

if __name__ == "__main__":
    main()

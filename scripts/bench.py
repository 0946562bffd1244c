"""Benchmark every route of named problems side by side on the GPU; writes a markdown table,
JSON and a PNG chart per problem (``python scripts/bench.py --problem all --out DIR``). The
same as ``cutlass-convt bench`` (``cutlass_convt.benchmark.main``)."""

from cutlass_convt.benchmark import main

if __name__ == "__main__":
    main()

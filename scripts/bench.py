"""Benchmark every route of named problems side by side on the GPU; writes a markdown table,
JSON and a PNG chart per problem (``python scripts/bench.py --problem all --out DIR``;
``--problem e2e``: the end-to-end benchmark). The same as ``cutlass-convt bench``
(``cutlass_convt.cli.bench_main``)."""

from cutlass_convt.cli import bench_main

if __name__ == "__main__":
    bench_main()

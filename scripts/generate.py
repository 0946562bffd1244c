"""Build (emit + nvcc + cache) the kernels a problem needs, on any machine with nvcc; no GPU.
With --candidates, build every tuning candidate too; with --tune (needs a GPU), time the
candidates on the problem and store the winner as a tuning record under the cache folder.
The same as ``cutlass-convt generate`` (``cutlass_convt.cli``).

    python scripts/generate.py --problem kernelbench-71
    python scripts/generate.py --problem kernelbench-71 --candidates     # ahead of --tune
    python scripts/generate.py --problem kernelbench-71 --tune
    python scripts/generate.py --problem kernelbench-71 --dtype bfloat16   # 16-bit tensors
    python scripts/generate.py --shape 8 32 32 512 1024 3 3 --stride 2 --padding 1 \\
        --output-padding 1 --precision tf32
"""

import sys

from cutlass_convt.cli import generate_main

if __name__ == "__main__":
    sys.exit(generate_main(sys.argv[1:], prog="generate.py"))

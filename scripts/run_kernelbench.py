"""The main job: a KernelBench transposed-convolution problem (default: level 1 problem 71) run
as KernelBench runs it - default-initialised module, fresh ``torch.rand`` input - on
cutlass_convt in tf32 and fp32 (NCHW and channels_last), checked against float64 and timed
next to PyTorch in one process (the routes of ``scripts/bench.py``).

    python scripts/run_kernelbench.py                       # problem 71, errors + times
    python scripts/run_kernelbench.py --startup --json out.json
    python scripts/run_kernelbench.py --list                # the problems --problem takes

Exits non-zero if an error bound fails (``cutlass_convt.benchmark.REL_BOUND``: fp32 rel <= 1e-6;
tf32 rel <= 1e-3 and max abs error <= 2x PyTorch eager TF32's on the same input).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from cutlass_convt import env, problems
from cutlass_convt.benchmark import bound_failure, markdown, require_gpu, run_suite, trials_argument
from cutlass_convt.cli import plain
from cutlass_convt.spec import PRECISIONS

_STARTUP = """
import json, sys, time
t0 = time.perf_counter()
import torch, cutlass_convt
from cutlass_convt import problems
case = problems.find(sys.argv[1])
x = case.make_input()
w = torch.rand(case.C_in, case.C_out // case.groups, *case.kernel_size, device="cuda")
torch.cuda.synchronize()
t1 = time.perf_counter()
cutlass_convt.conv_transpose2d(x, w, precision="tf32")
torch.cuda.synchronize()
t2 = time.perf_counter()
print(json.dumps({"import_and_setup_s": t1 - t0, "first_call_s": t2 - t1}))
"""


def startup(problem: str) -> dict:
    """Time to the first result in fresh processes: cold (empty cache: emit + nvcc) and warm."""
    result = {}
    with tempfile.TemporaryDirectory() as cache:
        for name in ("cold", "warm"):
            out = subprocess.run([sys.executable, "-c", _STARTUP, problem], capture_output=True,
                                 text=True, check=True,
                                 env={**os.environ, env.CACHE_DIR_VARIABLE: cache})
            result[name] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def failures(rows: dict) -> list[str]:
    """The error bounds (``benchmark.bound_failure``) each cutlass_convt row misses."""
    torch_tf32 = rows["torch eager NCHW (TF32)"]["max_abs"]
    found = []
    for name, r in rows.items():
        for precision in PRECISIONS:
            if name.startswith(f"cutlass_convt {precision}"):
                why = bound_failure(r, precision, torch_tf32)
                if why:
                    found.append(f"{name}: {why}")
    return found


def listing() -> str:
    """One line per case (``cutlass_convt.problems``): its id, input shape and module."""
    lines = []
    for case in problems.cases().values():
        kwargs = case.module_kwargs()
        module = ", ".join([str(kwargs.pop("in_channels")), str(kwargs.pop("out_channels")),
                            str(kwargs.pop("kernel_size"))]
                           + [f"{name}={value}" for name, value in kwargs.items()])
        lines.append(f"{case.id:30} input {case.N} x {case.C_in} x {case.H} x {case.W}, "
                     f"ConvTranspose2d({module})")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=plain(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problem", type=problems.argument, default="kernelbench-71",
                        help="a case id (--list names them) or KernelBench level-1 number: 71, "
                             "kernelbench-71 and kernelbench-l1-71 name the default")
    parser.add_argument("--list", action="store_true",
                        help="print every case's id, input shape and module, and exit")
    parser.add_argument("--trials", type=trials_argument, default=100,
                        help="timed calls per route (default 100)")
    parser.add_argument("--startup", action="store_true", help="also time cold and warm starts")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.list:
        print(listing())
        return 0
    folder = os.path.dirname(os.path.abspath(args.json)) if args.json else None
    if folder and not os.path.isdir(folder):
        parser.error(f"--json: no folder {folder}")
    case = args.problem
    require_gpu()

    report = run_suite(case, trials=args.trials)
    print(markdown(report))
    if args.startup:
        report["startup"] = startup(case.id)
        for name, s in report["startup"].items():
            print(f"{name} start: import+setup {s['import_and_setup_s']:.2f} s, "
                  f"first call {s['first_call_s']:.2f} s")
    report["failures"] = failures(report["rows"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print("FAILED:\n  " + "\n  ".join(report["failures"]) if report["failures"]
          else "all error bounds met")
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

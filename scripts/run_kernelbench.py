"""The main job: a KernelBench transposed-convolution problem (default: level 1 problem 71) run
as KernelBench runs it - default-initialised module, fresh ``torch.rand`` input, NCHW - on
cutlass_convt in tf32 and fp32, checked against float64 and timed next to PyTorch eager.

    python scripts/run_kernelbench.py                       # problem 71, errors + times
    python scripts/run_kernelbench.py --startup --json out.json

Exits non-zero if an error bound fails: fp32 rel <= 1e-6; tf32 rel <= 1e-3 and max abs error
<= 2x PyTorch eager TF32's on the same input.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

import cutlass_convt
from cutlass_convt import env, problems
from cutlass_convt.benchmark import cuda_time_ms, errors, host_time_us

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problem", default="kernelbench-71")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--startup", action="store_true", help="also time cold and warm starts")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    case = problems.find(args.problem)
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    torch_module = torch.nn.ConvTranspose2d(**case.module_kwargs()).cuda()
    x = case.make_input()
    weight, bias = torch_module.weight.detach(), torch_module.bias
    x_cl = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        ref = F.conv_transpose2d(x.double(), weight.double(),
                                 None if bias is None else bias.double(), case.stride,
                                 case.padding, case.output_padding, case.groups, case.dilation)

        def torch_eager(inp=x):
            return torch_module(inp)

        def torch_fp32():
            with torch.backends.cudnn.flags(enabled=True, benchmark=False,
                                            deterministic=False, allow_tf32=False):
                return torch_module(x)

        def ours(precision, inp=x):
            module = cutlass_convt.ConvTranspose2d(**case.module_kwargs(), precision=precision)
            module.load_state_dict(torch_module.state_dict())
            module.cuda()
            return lambda: module(inp)

        rows = {
            "torch eager, TF32 (default), NCHW": torch_eager,
            "torch eager, TF32 off, NCHW": torch_fp32,
            "torch eager, TF32, channels_last": lambda: torch_eager(x_cl),
            "cutlass_convt tf32, NCHW": ours("tf32"),
            "cutlass_convt fp32 (3xTF32), NCHW": ours("fp32"),
            "cutlass_convt tf32, channels_last": ours("tf32", x_cl),
            "cutlass_convt fp32 (3xTF32), channels_last": ours("fp32", x_cl),
        }
        results = {}
        for name, fn in rows.items():
            out = fn()
            err = errors(out, ref)
            del out
            results[name] = {**cuda_time_ms(fn, trials=args.trials), **err}
            if name.startswith("cutlass_convt"):
                results[name]["host_us"] = host_time_us(fn)

    props = torch.cuda.get_device_properties(0)
    report = {
        "problem": case.id, "gpu": props.name, "torch": torch.__version__,
        "cutlass": env.cutlass_version(), "nvcc": env.nvcc_version(),
        "results": results,
    }
    if args.startup:
        report["startup"] = startup(case.id)

    print(f"{case.id} on {props.name}: x {tuple(x.shape)} -> y {tuple(ref.shape)}, "
          f"torch {torch.__version__}, CUTLASS {env.cutlass_version()}")
    print(f"{'':44} {'median ms':>10} {'mean ms':>9} {'rel err':>9} {'max abs':>9} {'host us':>8}")
    for name, r in results.items():
        host = f"{r['host_us']:8.1f}" if "host_us" in r else ""
        print(f"{name:44} {r['median']:10.3f} {r['mean']:9.3f} {r['rel']:9.2e} "
              f"{r['max_abs']:9.2e} {host}")
    if "startup" in report:
        for name, s in report["startup"].items():
            print(f"{name} start: import+setup {s['import_and_setup_s']:.2f} s, "
                  f"first call {s['first_call_s']:.2f} s")

    torch_tf32 = results["torch eager, TF32 (default), NCHW"]["max_abs"]
    failures = []
    for name, r in results.items():
        if "fp32 (3xTF32)" in name and not r["rel"] <= 1e-6:
            failures.append(f"{name}: rel {r['rel']:.2e} > 1e-6")
        if "cutlass_convt tf32" in name and not (r["rel"] <= 1e-3 and r["max_abs"] <= 2 * torch_tf32):
            failures.append(f"{name}: rel {r['rel']:.2e}, max abs {r['max_abs']:.2e} "
                            f"(bound {2 * torch_tf32:.2e})")
    report["failures"] = failures
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print("FAILED:\n  " + "\n  ".join(failures) if failures else "all error bounds met")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

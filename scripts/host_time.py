"""Host time per cached call (GPU): ours against PyTorch's, as a function and as a module, side
by side in one process, on a tiny layer (1 x 32 x 16 x 16, 32 -> 32 k3), a DCGAN layer (64 x 256
x 8 x 8, 256 -> 128 k4 s2 p1) and KernelBench 71, in three modes: the forward without
gradients, the forward and backward of a training step, and the bfloat16-autocast forward
(weights requiring grad, no gradient recorded); and where our microseconds go (a cProfile of the
cached module call, and the pieces timed alone).

    python scripts/host_time.py [--json out.json] [--rounds 30] [--calls 50]

Host time per call: ``calls`` calls without synchronization, divided by ``calls``
(``benchmark.host_time_us``), the routes interleaved round by round, the median of ``rounds``.
The C++ per-call path is on where it is loaded (``CUTLASS_CONVT_EXTENSION``); the report says.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import timeit

import torch
import torch.nn.functional as F

import cutlass_convt
from cutlass_convt import cuda, ops
from cutlass_convt.benchmark import host_time_us, require_gpu
from cutlass_convt.cli import plain

# name: (module arguments, input shape, the family also timed forced)
SHAPES = {
    "tiny (1x32x16x16, 32->32 k3)": (dict(in_channels=32, out_channels=32, kernel_size=3),
                                     (1, 32, 16, 16), "direct"),
    "dcgan (64x256x8x8, 256->128 k4 s2 p1)": (dict(in_channels=256, out_channels=128,
                                                   kernel_size=4, stride=2, padding=1),
                                              (64, 256, 8, 8), "phase"),
    "kernelbench-71 (8x32x512x1024, 32->32 k3)": (dict(in_channels=32, out_channels=32,
                                                       kernel_size=3, bias=False),
                                                  (8, 32, 512, 1024), "strip"),
}
MODES = ("forward", "forward+backward", "bf16 autocast forward")


def _routes(kwargs, shape, mode):
    """The routes of one layer in one mode: name -> a call (one step of the mode)."""
    torch.manual_seed(0)
    theirs = torch.nn.ConvTranspose2d(**kwargs).cuda()
    ours = cutlass_convt.ConvTranspose2d(**kwargs).cuda()
    ours.load_state_dict(theirs.state_dict())
    x = torch.rand(*shape, device="cuda", requires_grad=mode == "forward+backward")
    w, b = theirs.weight, theirs.bias
    args = dict(stride=theirs.stride, padding=theirs.padding)
    calls = {
        "torch F.conv_transpose2d": lambda: F.conv_transpose2d(x, w, b, **args),
        "ours conv_transpose2d": lambda: cutlass_convt.conv_transpose2d(x, w, b, **args),
        "torch nn.ConvTranspose2d": lambda: theirs(x),
        "ours ConvTranspose2d": lambda: ours(x),
    }
    if mode == "forward":
        def step(call):
            with torch.no_grad():
                return call()
    elif mode == "forward+backward":
        grad = torch.ones_like(theirs(x)).contiguous(memory_format=torch.contiguous_format)

        def step(call):
            call().backward(grad)
    else:
        def step(call):
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                return call()
    return ours, x, {name: (lambda call=call: step(call)) for name, call in calls.items()}


def _pieces(ours, x, forced: str) -> dict[str, float]:
    """Microseconds of the pieces of our cached call, timed alone (the launch path: of the
    family ``forced``)."""
    w, b = ours.weight, ours.bias
    chosen = ops._routed(x, w, b, ours.stride, ours.padding, (0, 0), 1, ours.dilation, None,
                         forced)
    device = x.device.index
    pieces = {
        "_eager (the tracing checks)": lambda: ops._eager(x, w, b),
        "_signature": lambda: ops._signature(x, w, b, ours.stride, ours.padding, (0, 0), 1,
                                             ours.dilation, None, "auto"),
        "_routed (signature + lookup)": lambda: ops._routed(x, w, b, ours.stride, ours.padding,
                                                            (0, 0), 1, ours.dilation, None,
                                                            "auto"),
        "cuda.current_stream": lambda: cuda.current_stream(device),
        "cuda.OnDevice enter+exit": lambda: cuda.OnDevice(device).__enter__().__exit__(),
        "torch.empty of y": lambda: torch.empty(chosen.spec.out_shape, device="cuda")
        if isinstance(chosen, ops.Prepared) else None,
        "run_prepared (the whole launch path)": lambda: ops.run_prepared(chosen, x, w, b)
        if isinstance(chosen, ops.Prepared) else None,
        "module._output_padding": lambda: ours._output_padding(x, None, ours.stride,
                                                               ours.padding, ours.kernel_size,
                                                               2, ours.dilation),
    }
    result = {}
    for name, fn in pieces.items():
        fn()
        torch.cuda.synchronize()
        times = timeit.repeat(fn, number=200, repeat=7)
        torch.cuda.synchronize()
        result[name] = min(times) / 200 * 1e6
    return result


def _profile(fn, calls: int = 2000) -> str:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=plain(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the numbers here")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--profile", help="write the cProfile reports here")
    parser.add_argument("--no-pieces", action="store_true", help="skip the pieces timed alone")
    args = parser.parse_args()
    require_gpu()
    report = {"native": ops.NATIVE, "device": torch.cuda.get_device_name(), "layers": {}}
    profiles = []
    for name, (kwargs, shape, forced) in SHAPES.items():
        row = report["layers"][name] = {}
        for mode in MODES:
            ours, x, routes = _routes(kwargs, shape, mode)
            for fn in routes.values():  # builds, loads, plans
                fn()
            samples = {route: [] for route in routes}
            for _ in range(args.rounds):
                for route, fn in routes.items():
                    samples[route].append(host_time_us(fn, calls=args.calls))
            row[mode] = {route: statistics.median(t) for route, t in samples.items()}
            if mode == "forward":
                profiles.append(f"## {name}: ours ConvTranspose2d, {mode}\n"
                                + _profile(routes["ours ConvTranspose2d"]))
                if not args.no_pieces:
                    with torch.no_grad():
                        row["pieces_us"] = _pieces(ours, x.detach(), forced)
                with torch.no_grad():
                    chosen = ops._routed(x, ours.weight, ours.bias, ours.stride, ours.padding,
                                         (0, 0), 1, ours.dilation, None, "auto")
                row["kernel"] = getattr(getattr(chosen, "config", None), "name", "torch")
    print(f"{report['device']}, C++ per-call path {'on' if ops.NATIVE else 'off'}")
    for name, row in report["layers"].items():
        print(f"\n{name} ({row['kernel']})")
        print("| mode | torch F | ours F | ours - torch | torch module | ours module | "
              "ours - torch |")
        print("|---|---|---|---|---|---|---|")
        for mode in MODES:
            h = row[mode]
            tf, of = h["torch F.conv_transpose2d"], h["ours conv_transpose2d"]
            tm, om = h["torch nn.ConvTranspose2d"], h["ours ConvTranspose2d"]
            print(f"| {mode} | {tf:.1f} | {of:.1f} | {of - tf:+.1f} | {tm:.1f} | {om:.1f} | "
                  f"{om - tm:+.1f} |")
        if "pieces_us" in row:
            print("pieces (us, each timed alone): " + ", ".join(
                f"{k} {v:.2f}" for k, v in row["pieces_us"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.profile:
        with open(args.profile, "w") as f:
            f.write("\n".join(profiles))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

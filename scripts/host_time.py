"""Host time per cached call (GPU): ours against PyTorch's, function and module, side by side
in one process, on KernelBench 71 and a small layer (DCGAN's 512 -> 256, k4 s2 p1, on 1 x 512 x
4 x 4), and where our microseconds go (a cProfile of the cached call, and the pieces timed
alone).

    python scripts/host_time.py [--json out.json] [--rounds 30] [--calls 100]

Host time per call: ``calls`` calls without synchronization, divided by ``calls``
(``benchmark.host_time_us``), the routes interleaved round by round, the median of ``rounds``.
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
    "kernelbench-71 (8x32x512x1024, 32->32 k3)": (dict(in_channels=32, out_channels=32,
                                                       kernel_size=3, bias=False),
                                                  (8, 32, 512, 1024), "strip"),
    "small (1x512x4x4, 512->256 k4 s2 p1)": (dict(in_channels=512, out_channels=256,
                                                  kernel_size=4, stride=2, padding=1),
                                             (1, 512, 4, 4), "phase"),
}


def _routes(kwargs, shape, forced):
    torch.manual_seed(0)
    theirs = torch.nn.ConvTranspose2d(**kwargs).cuda()
    ours = cutlass_convt.ConvTranspose2d(**kwargs).cuda()
    ours.load_state_dict(theirs.state_dict())
    x = torch.rand(*shape, device="cuda")
    w, b = theirs.weight, theirs.bias
    args = dict(stride=theirs.stride, padding=theirs.padding)
    return ours, {
        "torch F.conv_transpose2d": lambda: F.conv_transpose2d(x, w, b, **args),
        "ours conv_transpose2d": lambda: cutlass_convt.conv_transpose2d(x, w, b, **args),
        f"ours conv_transpose2d, backend={forced!r}": lambda: cutlass_convt.conv_transpose2d(
            x, w, b, **args, backend=forced),
        "ours op (dispatcher)": lambda: ops.OP(x, w, b, list(theirs.stride),
                                               list(theirs.padding), [0, 0], 1, [1, 1], None,
                                               "auto"),
        "torch nn.ConvTranspose2d": lambda: theirs(x),
        "ours ConvTranspose2d": lambda: ours(x),
    }, x


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
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--profile", help="write the cProfile reports here")
    args = parser.parse_args()
    require_gpu()
    report, profiles = {}, []
    with torch.no_grad():
        for name, (kwargs, shape, forced) in SHAPES.items():
            ours, routes, x = _routes(kwargs, shape, forced)
            for fn in routes.values():  # builds, loads, plans
                fn()
            samples = {route: [] for route in routes}
            for _ in range(args.rounds):
                for route, fn in routes.items():
                    samples[route].append(host_time_us(fn, calls=args.calls))
            medians = {route: statistics.median(t) for route, t in samples.items()}
            chosen = ops._routed(x, ours.weight, ours.bias, ours.stride, ours.padding, (0, 0),
                                 1, ours.dilation, None, "auto")
            report[name] = {"host_us": medians, "pieces_us": _pieces(ours, x, forced),
                            "kernel": getattr(getattr(chosen, "config", None), "name", "torch")}
            profiles.append(f"## {name}: ours ConvTranspose2d\n"
                            + _profile(routes["ours ConvTranspose2d"]))
    for name, row in report.items():
        h = row["host_us"]
        print(f"\n{name} ({row['kernel']})")
        print("| route | host us per call | ours / torch |")
        print("|---|---|---|")
        for route, us in h.items():
            base = h["torch F.conv_transpose2d"] if "conv_transpose2d" in route or "op" in route \
                else h["torch nn.ConvTranspose2d"]
            print(f"| {route} | {us:.1f} | {us / base:.2f}x |")
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

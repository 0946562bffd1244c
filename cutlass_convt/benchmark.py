"""Measuring: CUDA-event timing, host time per call, and error against a reference.

Protocol (after KernelBench and the device notes): warm-up calls first, then ``trials`` timed
calls, each between two CUDA events on the current stream, with the L2 cache flushed before
each trial (outside the timed region); report the median and the mean in milliseconds. Routes
compared side by side are timed interleaved (:func:`cuda_times_ms`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import statistics
import time
from typing import Callable

import torch
from torch._prims_common import suggest_memory_format

from .args import torch_conv_precision

_L2_FLUSH_BYTES = 256 * 2**20  # > 4x the H200's 60 MB L2


def cuda_times_ms(fns: dict[str, Callable[[], object]], *, warmup: int = 10, trials: int = 100,
                  flush_l2: bool = True, synchronize: bool = False) -> dict[str, dict[str, float]]:
    """Device time of each ``fns[name]()`` in ms, ``{name: {"median", "mean", "min",
    "trials"}}``, the calls interleaved: each trial calls every function once, in an order
    shuffled per trial (seeded: runs repeat it), each call between two CUDA events, the L2
    flushed before each call (outside the timed region). So the routes share the GPU's clock
    and power state, which drift over a run, and no route always follows the same one (timed in
    consecutive blocks, one kernel's medians differ by up to about 10% between blocks on an
    H200 at its power cap). ``synchronize``: wait for the GPU before each call, so that each
    call starts on an empty queue and its time includes the GPU's waits for the host (for whole
    program steps, whose host time is part of their cost; without it a route whose host time
    exceeds its GPU time is timed while the GPU still drains its neighbour's queued work)."""
    flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda") if flush_l2 else None
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    events = {name: [] for name in names}
    order, shuffle = list(names), random.Random(0).shuffle
    for _ in range(trials):
        shuffle(order)
        for name in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if flush is not None:
                flush.zero_()
            if synchronize:
                torch.cuda.synchronize()
            start.record()
            fns[name]()
            end.record()
            events[name].append((start, end))
    torch.cuda.synchronize()
    result = {}
    for name in names:
        times = [start.elapsed_time(end) for start, end in events[name]]
        result[name] = {"median": statistics.median(times), "mean": statistics.fmean(times),
                        "min": min(times), "trials": trials}
    return result


def cuda_time_ms(fn: Callable[[], object], *, warmup: int = 10, trials: int = 100,
                 flush_l2: bool = True) -> dict[str, float]:
    """Device time of ``fn()`` in ms: ``{"median", "mean", "min", "trials"}``
    (:func:`cuda_times_ms` with one function)."""
    return cuda_times_ms({"fn": fn}, warmup=warmup, trials=trials, flush_l2=flush_l2)["fn"]


def host_time_us(fn: Callable[[], object], *, calls: int = 100) -> float:
    """Host time per call in microseconds: ``calls`` calls without synchronization, divided by
    ``calls`` (the GPU queue absorbs the work, so this is the Python + launch cost). Keep
    ``calls`` x launches per call well under the driver's launch queue (about 1000 entries):
    once it fills, the loop waits for the GPU and measures device time instead."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


# Error bounds against a float64 reference, per precision (defined once: the tests, the main
# job and the benchmark check these): the relative Frobenius error at most REL_BOUND; in TF32
# also the max abs error at most TF32_MAX_ABS_FACTOR x PyTorch's own TF32 error on the same input.
REL_BOUND = {"fp32": 1e-6, "tf32": 1e-3}
TF32_MAX_ABS_FACTOR = 2.0


def bound_failure(err: dict[str, float], precision: str,
                  torch_tf32_max_abs: float | None = None) -> str | None:
    """Why ``err`` (:func:`errors`) misses ``precision``'s bound, or None when it meets it.
    ``torch_tf32_max_abs``: PyTorch's TF32 max abs error on the same input (TF32 only)."""
    if not err["rel"] <= REL_BOUND[precision]:
        return f"rel {err['rel']:.2e} > {REL_BOUND[precision]:g}"
    if precision == "tf32" and torch_tf32_max_abs is not None:
        bound = TF32_MAX_ABS_FACTOR * torch_tf32_max_abs
        if not err["max_abs"] <= bound:
            return f"max abs {err['max_abs']:.2e} > {bound:.2e} ({TF32_MAX_ABS_FACTOR:g}x torch's)"
    return None


# 16-bit elements (float16, bfloat16), against float64 of the same 16-bit inputs: the relative
# Frobenius error at most SIXTEEN_TORCH_FACTOR x PyTorch's own in that dtype on the same inputs,
# and at most the dtype's rounding model: exact inputs, float32 sums and y rounded once to
# nearest give at most the unit roundoff u = 2**-p (p: significand bits with the implicit one)
# plus float32 summation's share. float16: u = 2**-11. bfloat16: u / 2 = 2**-9, tighter than
# the model's worst case but above random data's once-rounded error (about 0.4 u; H200 runs
# measured 0.43 u, 1.66e-3, on every phase class and benchmark layer).
SIXTEEN_BITS = {"bfloat16": "bf16", "float16": "fp16"}  # dtype -> its tag in names and tables
SIXTEEN_REL_BOUND = {"float16": 2.0**-11, "bfloat16": 2.0**-9}
SIXTEEN_TORCH_FACTOR = 2.0


def sixteen_bound_failure(err: dict[str, float], dtype: str, torch_rel: float) -> str | None:
    """Why ``err`` (:func:`errors`) of a ``dtype`` result misses the 16-bit bounds, PyTorch's
    relative error on the same inputs being ``torch_rel``; None when it meets them."""
    if not err["rel"] <= SIXTEEN_TORCH_FACTOR * torch_rel:
        return f"rel {err['rel']:.2e} > {SIXTEEN_TORCH_FACTOR:g}x torch's {torch_rel:.2e}"
    if not err["rel"] <= SIXTEEN_REL_BOUND[dtype] + 1e-6:
        return f"rel {err['rel']:.2e} > {SIXTEEN_REL_BOUND[dtype]:.2e} ({dtype}'s model bound)"
    return None


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """``{"rel": ||out - ref||_F / ||ref||_F, "max_abs": max |out - ref|}``, computed in float64.
    NaN or inf anywhere in ``out`` gives ``inf`` for both."""
    diff = out.double() - ref.double()
    if not torch.isfinite(diff).all():
        return {"rel": float("inf"), "max_abs": float("inf")}
    return {"rel": (diff.norm() / ref.double().norm()).item(), "max_abs": diff.abs().max().item()}


# ----------------------------------------------------------------------------------------------
# The benchmark suite: one problem, every route side by side in one process.

def _gb_per_s(nbytes: int, ms: float) -> float:
    return nbytes / ms / 1e6


def _conv2d_rewrite_applies(case) -> bool:
    """PyTorch's fastest fp32-accurate route for stride 1: ``conv2d`` on the flipped,
    transposed filter with padding ``dilation * (k - 1) - padding`` (no output_padding)."""
    return (case.stride == (1, 1) and case.groups == 1 and case.output_padding == (0, 0)
            and all(d * (k - 1) >= p for d, k, p in zip(case.dilation, case.kernel_size,
                                                         case.padding)))


def phase_decomposition(x: torch.Tensor, weight: torch.Tensor, bias=None, stride=(2, 2),
                        padding=(0, 0), output_padding=(0, 0), *, conv: Callable) -> torch.Tensor:
    """``conv_transpose2d(x, weight, bias, stride, padding, output_padding)`` (groups 1,
    dilation 1) as ``stride[0] * stride[1]`` stride-1 transposed convolutions, one per output
    phase (sub-pixel decomposition), each written into its strided slice of the output.

    Output row ``o = o0 + stride * t`` of phase ``(o + padding) % stride = phi`` only meets the
    filter rows ``phi + stride * m``; with ``c = (o0 + padding - phi) / stride`` it is row
    ``t + c`` of the stride-1, padding-0 transposed convolution ``conv(x, w[:, :, phi::stride])``
    (zero where that row does not exist); the same holds for columns.

    ``x``: (N, C_in, H, W), NCHW or channels_last; ``weight``: (C_in, C_out, R, S); ``conv``:
    a stride-1 ``conv_transpose2d(x, w)`` (cutlass_convt's, or PyTorch's to check this one).
    Returns (N, C_out, P, Q) in ``x``'s memory format. A benchmark route (it reads x once per
    phase and writes the output through the interleaving slices), not a kernel family."""
    from .spec import conv_transpose_output_size

    size = [conv_transpose_output_size(*args, 1) for args in
            zip(x.shape[2:], weight.shape[2:], stride, padding, output_padding)]
    y = torch.empty(x.shape[0], weight.shape[1], *size, device=x.device, dtype=x.dtype,
                    memory_format=suggest_memory_format(x))
    for phi_h in range(stride[0]):
        for phi_w in range(stride[1]):
            phase = (phi_h, phi_w)
            o0 = [(phi - p) % st for phi, p, st in zip(phase, padding, stride)]
            target = y[:, :, o0[0]::stride[0], o0[1]::stride[1]]
            sub = weight[:, :, phi_h::stride[0], phi_w::stride[1]]
            if sub.numel() == 0:  # the phase meets no filter tap
                target.zero_()
                continue
            z = conv(x, sub.contiguous())
            c = [(o + p - phi) // st for o, p, phi, st in zip(o0, padding, phase, stride)]
            rows = [(max(0, -ci), min(t, zi - ci)) for ci, t, zi in
                    zip(c, target.shape[2:], z.shape[2:])]
            if any(lo > 0 or hi < t for (lo, hi), t in zip(rows, target.shape[2:])):
                target.zero_()
            (h0, h1), (w0, w1) = rows
            target[:, :, h0:h1, w0:w1] = z[:, :, h0 + c[0]:h1 + c[0], w0 + c[1]:w1 + c[1]]
    if bias is not None:
        y += bias.view(1, -1, 1, 1)
    return y


def _graph_replay(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """``fn`` captured in a CUDA graph on its first call (after one eager call), then replayed:
    each call returns the same output tensor, now holding the replay's result."""
    state = {}

    def replay():
        if not state:
            fn()
            torch.cuda.synchronize()
            state["graph"] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(state["graph"]):
                state["out"] = fn()
        state["graph"].replay()
        return state["out"]

    return replay


def trials_argument(text: str) -> int:
    """A trial count as an ``argparse`` type: a positive int, else the parser's usage error."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"trials must be a positive int, got {text!r}")
    return value


def require_gpu(what: str = "this benchmark") -> None:
    """Exit with a one-line message when no CUDA GPU is visible (``what`` needs one)."""
    if not torch.cuda.is_available():
        raise SystemExit(f"cutlass_convt: {what} needs a CUDA GPU, and none is visible")


def run_suite(case, *, trials: int = 100, compile_torch: bool = False) -> dict:
    """Time and check every route for one :class:`cutlass_convt.problems.Case` on the current
    GPU, as KernelBench runs it (default-initialised module, fresh ``torch.rand`` input):
    PyTorch eager (NCHW and channels_last, TF32 on; NCHW with TF32 off), the conv2d
    rewrite with TF32 off where it applies, optionally ``torch.compile``, a plain device copy
    of x (the memory floor), the layout passes, and cutlass_convt in tf32 and fp32 for NCHW and
    channels_last (the kernel choice, and each kernel family when more than one can run the
    problem: rows ending in ``[family]``); the same in bfloat16 and float16 (PyTorch eager,
    ours, a copy of x in that dtype); all timed in one interleaved pass
    (:func:`cuda_times_ms`). Returns ``{"rows": {name: {...}}, ...}`` with
    median/mean ms, error against float64 (conv rows; 16-bit rows against float64 of the same
    16-bit inputs), GB/s (copy rows), TFLOP/s (conv rows), host us and the kernel
    configuration (our rows)."""
    import copy

    import torch.nn.functional as F

    import cutlass_convt

    from . import choose, env
    from .families import layout as layout_passes

    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    module = torch.nn.ConvTranspose2d(**case.module_kwargs()).cuda()
    x = case.make_input()
    x_cl = x.contiguous(memory_format=torch.channels_last)
    weight, bias = module.weight.detach(), None if module.bias is None else module.bias.detach()
    args = (case.stride, case.padding, case.output_padding, case.groups, case.dilation)
    ref = F.conv_transpose2d(x.double(), weight.double(),
                             None if bias is None else bias.double(), *args)
    flops = 2.0 * x.numel() * weight.shape[1] * weight.shape[2] * weight.shape[3]
    def fp32_eager():
        with torch_conv_precision("fp32"):
            return module(x)

    conv_rows = {  # modules, as KernelBench runs them
        "torch eager NCHW (TF32)": lambda: module(x),
        "torch eager channels_last (TF32)": lambda: module(x_cl),
        "torch eager NCHW, TF32 off": fp32_eager,
    }
    if _conv2d_rewrite_applies(case):
        w_fwd = weight.flip(2, 3).transpose(0, 1).contiguous()
        pad = tuple(d * (k - 1) - p for d, k, p in zip(case.dilation, case.kernel_size,
                                                       case.padding))

        def conv2d_rewrite():
            with torch_conv_precision("fp32"):
                return F.conv2d(x, w_fwd, bias, 1, pad, case.dilation)

        conv_rows["torch conv2d rewrite NCHW, TF32 off"] = conv2d_rewrite
    if compile_torch:
        compiled = torch.compile(module)
        conv_rows["torch.compile NCHW (TF32)"] = lambda: compiled(x)
    kernels = {}  # our row -> the kernel configuration it runs
    for precision in ("tf32", "fp32"):
        for layout, inp in (("NCHW", x), ("channels_last", x_cl)):
            spec = dataclasses.replace(case.spec(precision, env.device_arch(x.device.index)),
                                       channels_last=layout != "NCHW")
            families = [f.name for f in choose.FAMILIES if not f.unsupported_reasons(spec)]
            # the kernel choice ("auto"), and each family when more than one can run the problem
            for backend in ["auto", *families] if len(families) > 1 else ["auto"]:
                ours = cutlass_convt.ConvTranspose2d(**case.module_kwargs(), precision=precision,
                                                     backend=backend).cuda()
                ours.load_state_dict(module.state_dict())
                name = f"cutlass_convt {precision} {layout}"
                name += "" if backend == "auto" else f" [{backend}]"
                conv_rows[name] = functools.partial(ours, inp)
                if families:
                    kernels[name] = choose.choose(
                        spec, choose.NAMES if backend == "auto" else (backend,)).name

    # 16-bit: PyTorch's module and ours in the dtype, on x rounded to it (row -> its dtype)
    sixteen_rows, sixteen_inputs = {}, {}
    for dtype, tag in SIXTEEN_BITS.items():
        module16 = copy.deepcopy(module).to(getattr(torch, dtype))
        x16 = x.to(getattr(torch, dtype))
        sixteen_inputs[dtype] = x16
        for layout, inp in (("NCHW", x16),
                            ("channels_last", x16.contiguous(memory_format=torch.channels_last))):
            sixteen_rows[f"torch eager {layout} ({tag})"] = dtype
            conv_rows[f"torch eager {layout} ({tag})"] = functools.partial(module16, inp)
            spec = dataclasses.replace(case.spec("tf32", env.device_arch(x.device.index)),
                                       channels_last=layout != "NCHW", dtype=dtype)
            families = [f.name for f in choose.FAMILIES if not f.unsupported_reasons(spec)]
            for backend in ["auto", *families] if len(families) > 1 else ["auto"]:
                ours = cutlass_convt.ConvTranspose2d(**case.module_kwargs(),
                                                     backend=backend).cuda().to(x16.dtype)
                ours.load_state_dict(module16.state_dict())
                name = f"cutlass_convt {tag} {layout}"
                name += "" if backend == "auto" else f" [{backend}]"
                conv_rows[name] = functools.partial(ours, inp)
                sixteen_rows[name] = dtype
                kernels[name] = ops_route_name(spec, backend)

    if case.stride != (1, 1) and case.dilation == (1, 1) and case.groups == 1:
        # stride > 1: the same problem as stride-1 kernels, one per output phase; also replayed
        # from a CUDA graph, since its dozen launches from Python can leave the GPU waiting
        for precision in ("tf32", "fp32"):
            for layout, inp in (("NCHW", x), ("channels_last", x_cl)):
                phases = functools.partial(
                    phase_decomposition, inp, weight, bias, case.stride, case.padding,
                    case.output_padding, conv=functools.partial(cutlass_convt.conv_transpose2d,
                                                                precision=precision))
                conv_rows[f"cutlass_convt {precision} {layout} [phases]"] = phases
                conv_rows[f"cutlass_convt {precision} {layout} [phases, CUDA graph]"] = (
                    _graph_replay(phases))

    rows = {}
    with torch.no_grad():
        for name, fn in conv_rows.items():
            if name not in sixteen_rows:
                out = fn()
                rows[name] = errors(out, ref)
                del out
        y_shape = ref.shape
        del ref  # 8 bytes per output element, not needed for the timing
        for dtype, x16 in sixteen_inputs.items():  # one float64 reference at a time
            ref = F.conv_transpose2d(x16.double(), weight.to(x16.dtype).double(),
                                     None if bias is None else bias.to(x16.dtype).double(), *args)
            for name in (n for n, d in sixteen_rows.items() if d == dtype):
                out = conv_rows[name]()
                rows[name] = errors(out, ref)
                del out
            del ref

        passes = layout_passes.kernels(env.device_arch(x.device.index))
        n, c, h, w = x.shape
        y_nhwc = torch.empty(y_shape, device="cuda", memory_format=torch.channels_last)
        y_nchw = torch.empty(y_shape, device="cuda")
        x_copy = torch.empty_like(x)
        stream = torch.cuda.current_stream().cuda_stream
        moved = {"x": 2 * 4 * x.numel(), "y": 2 * 4 * y_nchw.numel()}
        copy_rows = {
            "device copy of x (floor)": (lambda: x_copy.copy_(x), moved["x"]),
            "layout pass x NCHW->NHWC (ours)": (lambda: passes.transpose(
                True, x.data_ptr(), x_copy.data_ptr(), n, c, h * w, 0, stream), moved["x"]),
            "layout pass y NHWC->NCHW (ours)": (lambda: passes.transpose(
                False, y_nhwc.data_ptr(), y_nchw.data_ptr(), y_shape[0], y_shape[1],
                y_shape[2] * y_shape[3], 0, stream), moved["y"]),
            "torch x.contiguous(channels_last)": (
                lambda: x.contiguous(memory_format=torch.channels_last), moved["x"]),
        }
        for dtype, x16 in sixteen_inputs.items():
            x16_copy = torch.empty_like(x16)
            copy_rows[f"device copy of x ({SIXTEEN_BITS[dtype]}) (floor)"] = (
                functools.partial(x16_copy.copy_, x16), 2 * 2 * x16.numel())
        # every route timed in one interleaved pass, side by side
        times = cuda_times_ms({**conv_rows, **{k: fn for k, (fn, _) in copy_rows.items()}},
                              trials=trials)
        for name, fn in conv_rows.items():
            rows[name].update(times[name])
            rows[name]["tflops"] = flops / rows[name]["median"] / 1e9
            if name.startswith("cutlass_convt"):
                rows[name]["host_us"] = host_time_us(fn)
            if name in kernels:
                rows[name]["kernel"] = kernels[name]
        for name, (_, nbytes) in copy_rows.items():
            rows[name] = {**times[name], "gb_per_s": _gb_per_s(nbytes, times[name]["median"])}
    return {"problem": case.id, "input_shape": list(x.shape), "output_shape": list(y_shape),
            "gflop": flops / 1e9, "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "cutlass": env.cutlass_version(),
            "nvcc": env.nvcc_version(), "trials": trials, "rows": rows}


def _eager_of(result: dict, name: str) -> float:
    """The median of PyTorch's eager NCHW route in the dtype of row ``name`` (16-bit rows
    name their tag), the baseline of its "vs eager" ratio."""
    tag = next((t for t in SIXTEEN_BITS.values() if f" {t} " in name or f"({t})" in name), None)
    return result["rows"][f"torch eager NCHW ({tag or 'TF32'})"]["median"]


def markdown(result: dict) -> str:
    """The suite's result as a markdown table (times in ms, median and mean; "vs eager": to
    PyTorch's eager NCHW route in the row's dtype, TF32 for float32)."""
    lines = [f"{result['problem']}: x {tuple(result['input_shape'])} -> y "
             f"{tuple(result['output_shape'])}, {result['gpu']}, torch {result['torch']}, "
             f"CUTLASS {result['cutlass']}, {result['trials']} trials, L2 flushed", "",
             "| route | median ms | mean ms | vs eager | rel. error | max abs error | TFLOP/s "
             "| GB/s | host us |",
             "|---|---|---|---|---|---|---|---|---|"]

    def cell(row, key, fmt):
        return format(row[key], fmt) if key in row else ""

    for name, row in result["rows"].items():
        lines.append(f"| {name} | {row['median']:.3f} | {row['mean']:.3f} | "
                     f"{_eager_of(result, name) / row['median']:.2f}x | "
                     f"{cell(row, 'rel', '.1e')} | "
                     f"{cell(row, 'max_abs', '.1e')} | {cell(row, 'tflops', '.0f')} | "
                     f"{cell(row, 'gb_per_s', '.0f')} | {cell(row, 'host_us', '.1f')} |")
    return "\n".join(lines) + "\n"


def chart(result: dict, path) -> None:
    """A PNG bar chart of the medians, labelled with the speed-up over eager NCHW in the row's
    dtype (TF32 for float32)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["rows"])
    times = [result["rows"][n]["median"] for n in names]
    fig, ax = plt.subplots(figsize=(9, 0.38 * len(names) + 1.2))
    colors = ["tab:green" if n.startswith("cutlass") else "tab:gray" if "copy" in n or "layout" in n
              or "contiguous" in n else "tab:blue" for n in names]
    ax.barh(names, times, color=colors)
    for i, (name, t) in enumerate(zip(names, times)):
        ax.text(t, i, f" {t:.3f} ms ({_eager_of(result, name) / t:.2f}x)", va="center",
                fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("median time per call, ms (lower is better)")
    ax.set_title(f"{result['problem']} on {result['gpu']}", fontsize=10)
    ax.set_xlim(0, max(times) * 1.35)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# The benchmark set: every model layer, KernelBench case and upsampling case in one summary.

TF32_PEAK_TFLOPS = 495.0  # dense TF32 on an H100/H200 (datasheet): the compute floor


def _prebuild(specs, workers: int = 12, chosen_only: bool = False) -> int:
    """Build every kernel the ``specs``' routes need (each family's default that can compute
    a spec; with ``chosen_only`` only the one ``backend="auto"`` runs, none where it picks
    PyTorch), nvcc runs in parallel (threads: each waits for its own nvcc), before any timing.
    Returns how many kernels it built or found cached."""
    import concurrent.futures

    from . import build, choose

    builds = {}
    for spec in specs:
        if chosen_only:
            families = [f for f in choose.FAMILIES if not f.unsupported_reasons(spec)]
            chosen = choose.choose(spec, choose.NAMES, True) if families else choose.TORCH
            configs = [] if chosen is choose.TORCH else [chosen]
        else:
            configs = [choose.choose_config(spec, (f.name,)) for f in choose.FAMILIES
                       if not f.unsupported_reasons(spec)]
        for config in configs:
            for built, sources in choose.family_of(config).builds(config):
                builds.setdefault(built, sources)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(build.build, c, s, progress=False) for c, s in builds.items()]:
            try:
                future.result()
            except Exception as e:  # a failed build shows as that family's missing row
                print(f"build failed: {e}", flush=True)
    return len(builds)


def _copy_rate() -> float:
    """GB/s of a device copy of 1 GiB (bytes read and written)."""
    big = torch.empty(2**28, device="cuda")
    copy = torch.empty_like(big)
    return 2 * big.numel() * 4 / cuda_time_ms(lambda: copy.copy_(big), trials=20)["median"] / 1e6


def run_set(cases, *, trials: int = 30) -> dict:
    """For each case and layout (NCHW, channels_last): PyTorch eager and ours (the choice, and
    each family that can compute it) in TF32, PyTorch with TF32 off and ours in fp32, and in
    bfloat16 and float16 PyTorch and ours (the choice, and each family that can compute it),
    timed interleaved (:func:`cuda_times_ms`, ``trials`` each); our errors against float64
    (16-bit: of the same 16-bit inputs; checked against the bounds); the layer's floor
    max(bytes / copy rate, FLOPs / TF32 peak), the copy rate measured in this run. Returns
    ``{"rows": [...], "copy_gb_per_s": ...}``."""
    import copy

    import torch.nn.functional as F

    import cutlass_convt

    from . import choose, env

    arch = env.device_arch(torch.cuda.current_device())
    _prebuild([dataclasses.replace(case.spec(p, arch), channels_last=cl, dtype=dtype)
               for case in cases for p, dtype in (("tf32", "float32"), ("fp32", "float32"),
                                                  *(("tf32", d) for d in SIXTEEN_BITS))
               for cl in (False, True)])
    copy_rate = _copy_rate()
    rows = []
    for case in cases:
        torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
        module = torch.nn.ConvTranspose2d(**case.module_kwargs()).cuda()
        x = case.make_input()
        w, b = module.weight.detach(), None if module.bias is None else module.bias.detach()
        args = (case.stride, case.padding, case.output_padding, case.groups, case.dilation)
        with torch.no_grad():
            ref = F.conv_transpose2d(x.double(), w.double(), None if b is None else b.double(),
                                     *args)
        flops = 2.0 * x.numel() * w.shape[1] * w.shape[2] * w.shape[3]
        nbytes = 4 * (x.numel() + ref.numel() + w.numel())
        floor_ms = max(nbytes / copy_rate / 1e6, flops / TF32_PEAK_TFLOPS / 1e9)
        for layout in ("NCHW", "channels_last"):
            inp = x.contiguous(memory_format=torch.channels_last) if layout != "NCHW" else x
            spec = dataclasses.replace(case.spec("tf32", arch), channels_last=layout != "NCHW")
            families = [f.name for f in choose.FAMILIES if not f.unsupported_reasons(spec)]
            routes, chosen = {}, {}
            for precision, backends in (("tf32", ["auto", *families]), ("fp32", ["auto"])):
                for backend in backends:
                    ours = cutlass_convt.ConvTranspose2d(**case.module_kwargs(),
                                                         precision=precision,
                                                         backend=backend).cuda()
                    ours.load_state_dict(module.state_dict())
                    routes[f"{precision} {backend}"] = functools.partial(ours, inp)
                    chosen[f"{precision} {backend}"] = ops_route_name(
                        dataclasses.replace(spec, precision=precision), backend)
            def fp32_eager(inp=inp):
                with torch_conv_precision("fp32"):
                    return module(inp)

            routes["torch tf32"] = functools.partial(module, inp)
            routes["torch fp32"] = fp32_eager
            for dtype, tag in SIXTEEN_BITS.items():  # on the inputs rounded to the dtype
                spec16 = dataclasses.replace(spec, dtype=dtype)
                module16 = copy.deepcopy(module).to(getattr(torch, dtype))
                inp16 = inp.to(module16.weight.dtype)
                families16 = [f.name for f in choose.FAMILIES
                              if not f.unsupported_reasons(spec16)]
                for backend in ["auto", *families16]:
                    ours = cutlass_convt.ConvTranspose2d(**case.module_kwargs(),
                                                         backend=backend).cuda().to(inp16.dtype)
                    ours.load_state_dict(module16.state_dict())
                    routes[f"{tag} {backend}"] = functools.partial(ours, inp16)
                    chosen[f"{tag} {backend}"] = ops_route_name(spec16, backend)
                routes[f"torch {tag}"] = functools.partial(module16, inp16)
            with torch.no_grad():
                errs = {}
                for name in ("tf32 auto", "fp32 auto", "torch tf32"):
                    errs[name] = errors(routes[name](), ref)
                for dtype, tag in SIXTEEN_BITS.items():
                    x16, w16 = (t.to(getattr(torch, dtype)) for t in (x, w))
                    ref16 = F.conv_transpose2d(
                        x16.double(), w16.double(),
                        None if b is None else b.to(x16.dtype).double(), *args)
                    for name in (f"{tag} auto", f"torch {tag}"):
                        errs[name] = errors(routes[name](), ref16)
                    del ref16
                times = cuda_times_ms(routes, warmup=3, trials=trials)
            bound = {p: bound_failure(errs[f"{p} auto"], p, errs["torch tf32"]["max_abs"])
                     for p in ("tf32", "fp32")}
            # (a 16-bit default on PyTorch's route is PyTorch's result, not held to our bounds)
            bound.update({tag: None if chosen[f"{tag} auto"] == "torch" else
                          sixteen_bound_failure(errs[f"{tag} auto"], dtype,
                                                errs[f"torch {tag}"]["rel"])
                          for dtype, tag in SIXTEEN_BITS.items()})
            row = {"case": case.id, "layout": layout, "floor_ms": floor_ms,
                   "ms": {name: t["median"] for name, t in times.items()},
                   "kernels": chosen, "errors": errs, "bound": bound}
            rows.append(row)
            print(_set_line(row), flush=True)
            print(_sixteen_line(row), flush=True)
        del ref
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "copy_gb_per_s": copy_rate, "trials": trials, "rows": rows}


def ops_route_name(spec, backend: str) -> str:
    """The kernel (or ``"torch"``) that ``backend`` runs ``spec`` on, without building."""
    from . import choose, ops

    if backend == "torch":
        return "torch"
    try:
        names = (backend,) if backend in choose.NAMES else choose.NAMES
        return choose.choose(spec, names, backend == "auto").name
    except ops.UnsupportedProblem:
        return "torch"


def _sixteen_line(row) -> str:
    """A row of the 16-bit table: per dtype eager, ours (the default) and its route, the
    speedup, and the fastest of our families with its speedup."""
    ms, cells = row["ms"], [row["case"], row["layout"]]
    for tag in SIXTEEN_BITS.values():
        eager, auto = ms[f"torch {tag}"], ms[f"{tag} auto"]
        families = [k for k in ms if k.startswith(f"{tag} ") and k != f"{tag} auto"]
        best = min(families, key=lambda k: ms[k], default=f"{tag} auto")
        cells += [f"{eager:.3f}", f"{auto:.3f}", row["kernels"][f"{tag} auto"].split("_")[0],
                  f"{eager / auto:.2f}x", f"{best.split()[1]} {ms[best]:.3f}",
                  f"{eager / ms[best]:.2f}x"]
    missed = any(row["bound"][tag] for tag in SIXTEEN_BITS.values())
    cells += [f"{row['errors']['bf16 auto']['rel']:.1e}", "MISSED" if missed else "ok"]
    return "| " + " | ".join(cells) + " |"


SIXTEEN_HEADER = ("| layer | layout | eager bf16 ms | ours bf16 ms | route | speedup | best "
                  "family ms | its speedup | eager fp16 ms | ours fp16 ms | route | speedup | "
                  "best family ms | its speedup | rel. error bf16 | bounds |\n" + "|---" * 16
                  + "|")


def _set_line(row) -> str:
    ms = row["ms"]
    best = min((k for k in ms if k.startswith("tf32 ") and k != "tf32 auto"),
               key=lambda k: ms[k], default="tf32 auto")
    return (f"| {row['case']} | {row['layout']} | {ms['torch tf32']:.3f} | {ms['tf32 auto']:.3f} "
            f"| {row['kernels']['tf32 auto'].split('_')[0]} | "
            f"{ms['torch tf32'] / ms['tf32 auto']:.2f}x | {best.split()[1]} {ms[best]:.3f} | "
            f"{ms['torch tf32'] / ms[best]:.2f}x | {row['floor_ms']:.3f} | "
            f"{ms['tf32 auto'] / row['floor_ms']:.1f}x | {ms['torch fp32']:.3f} | "
            f"{ms['fp32 auto']:.3f} | {ms['torch fp32'] / ms['fp32 auto']:.2f}x | "
            f"{row['errors']['tf32 auto']['rel']:.1e} | "
            f"{'MISSED' if row['bound']['tf32'] or row['bound']['fp32'] else 'ok'} |")


SET_HEADER = ("| layer | layout | eager TF32 ms | ours ms | our family | speedup | best family ms "
              "| its speedup | floor ms | ours / floor | torch fp32 ms | ours fp32 ms | fp32 "
              "speedup | rel. error | bounds |\n" + "|---" * 15 + "|")


def set_markdown(result: dict) -> str:
    """The benchmark set's summary table and its geometric means."""
    import math

    rows = result["rows"]

    def gmean(values):
        values = list(values)
        return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")

    lines = [f"Benchmark set on {result['gpu']}, torch {result['torch']}, {result['trials']} "
             f"trials, copy rate {result['copy_gb_per_s']:.0f} GB/s", "", SET_HEADER,
             *(_set_line(r) for r in rows), ""]
    for layout in ("NCHW", "channels_last"):
        mine = [r for r in rows if r["layout"] == layout]
        lines.append(f"{layout}: geometric-mean speedup over eager TF32: default "
                     f"{gmean(r['ms']['torch tf32'] / r['ms']['tf32 auto'] for r in mine):.2f}x,"
                     f" fp32 over PyTorch's fp32 "
                     f"{gmean(r['ms']['torch fp32'] / r['ms']['fp32 auto'] for r in mine):.2f}x")
    lines += ["", "16 bits (eager: PyTorch in the dtype, on the same rounded inputs; rel. error "
              "against float64 of them)", "", SIXTEEN_HEADER, *(_sixteen_line(r) for r in rows),
              ""]
    for layout in ("NCHW", "channels_last"):
        mine = [r for r in rows if r["layout"] == layout]
        for tag in SIXTEEN_BITS.values():
            ratios = [r["ms"][f"torch {tag}"] / r["ms"][f"{tag} auto"] for r in mine]
            best = [r["ms"][f"torch {tag}"] / min(v for k, v in r["ms"].items()
                                                  if k.startswith(f"{tag} ")) for r in mine]
            lines.append(f"{layout} {tag}: geometric-mean speedup over eager: default "
                         f"{gmean(ratios):.2f}x (slowest row {min(ratios, default=1):.2f}x), "
                         f"fastest of ours {gmean(best):.2f}x")
    return "\n".join(lines) + "\n"


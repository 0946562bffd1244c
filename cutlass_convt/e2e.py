"""The end-to-end benchmark (``cutlass-convt bench --problem e2e``): the decoders of
:mod:`cutlass_convt.decoders` as their users run them, PyTorch eager against the same model
converted (:func:`cutlass_convt.convert_` of a ``copy.deepcopy``, so the same weights), in each
mode of :data:`MODES`.

Protocol. PyTorch's TF32 switches are read once and never set (its defaults: TF32 for cuDNN
convolutions, IEEE float32 for matmuls; ``cudnn.benchmark`` off), so both routes run what users
get. Per model, the kernels every mode needs are built first (nvcc in parallel) and
:func:`cutlass_convt.warmup` plans them; per mode, both routes run a few untimed steps
(``torch.compile``'s compilation among them), then ``trials`` steps each, interleaved in a
shuffled order, each step between two CUDA events after a device synchronization and without an
L2 flush (:func:`~cutlass_convt.benchmark.cuda_times_ms` with ``synchronize=True,
flush_l2=False``): a whole step's working set is its own (its weights and activations pass
through L2 in any loop), while its host time is part of what it costs, and a step that starts on
an empty queue is timed with the GPU's waits for the host in it. Training steps are timed
back to back without resetting anything (the models keep training). Reported: medians, ms.

Accuracy, not asserted (a benchmark): the outputs of converted against eager on the same inputs
(relative Frobenius difference over every output tensor), and for inference both against a
float64 copy of the eager model; for training modes, from identical states, the outputs of one
step and the weight gradient of the first ConvTranspose2d layer.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time

import torch
import torch.nn.functional as F

from . import args as checks
from . import decoders, env
from .benchmark import _prebuild, cuda_times_ms, errors
from .nn import convert_, warmup


@dataclasses.dataclass(frozen=True)
class Mode:
    """How a model runs: an inference call (``torch.no_grad``) or a training step (forward,
    MSE to a fixed random target, backward, SGD step); in NCHW or channels_last (model and
    inputs); in float32 (TF32 convolutions, PyTorch's default) or under bfloat16 autocast;
    eager or ``torch.compile``-d (both routes compiled)."""

    name: str
    label: str
    train: bool = False
    channels_last: bool = False
    autocast: bool = False
    compiled: bool = False


MODES = {m.name: m for m in (
    Mode("tf32", "inference, TF32, NCHW"),
    Mode("tf32-cl", "inference, TF32, channels_last", channels_last=True),
    Mode("bf16", "inference, bf16 autocast", autocast=True),
    Mode("train-tf32", "training step, TF32", train=True),
    Mode("train-bf16", "training step, bf16 autocast", train=True, autocast=True),
    Mode("compile", "torch.compile inference, TF32", compiled=True),
)}
# compile is opt-in: compiling two copies of each model costs more than the rest of a run
DEFAULT_MODES = tuple(name for name in MODES if name != "compile")
WARMUP = 3  # untimed steps per route and mode, after the kernels are built and planned


def _outputs(out) -> list[torch.Tensor]:
    """A model's output as a list of tensors (a dict of heads in its order)."""
    return list(out.values()) if isinstance(out, dict) else [out]


def _flat(out) -> torch.Tensor:
    """Every tensor of a model's output, flattened into one float64 vector."""
    return torch.cat([t.detach().double().flatten() for t in _outputs(out)])


def _autocast(on: bool):
    return torch.autocast("cuda", dtype=torch.bfloat16) if on else contextlib.nullcontext()


def _infer(model, inputs, mode: Mode):
    """One inference call of ``model`` on ``inputs`` in ``mode`` (a function of no
    arguments returning the output)."""
    def call():
        with torch.no_grad(), _autocast(mode.autocast):
            return model(*inputs)

    return call


def _train(model, inputs, targets, mode: Mode):
    """One training step of ``model`` (SGD, lr 0.01, momentum 0.9; the sum of the outputs'
    MSE to ``targets``), as a function of no arguments returning the step's output."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with _autocast(mode.autocast):
            out = model(*inputs)
            loss = sum(F.mse_loss(o.float(), t) for o, t in zip(_outputs(out), targets))
        loss.backward()
        optimizer.step()
        return out

    return step


def _first_convt(model: torch.nn.Module) -> torch.nn.ConvTranspose2d:
    return next(m for m in model.modules() if isinstance(m, torch.nn.ConvTranspose2d))


def layer_specs(model: torch.nn.Module, inputs, dtype: str) -> set:
    """The :class:`~cutlass_convt.spec.ProblemSpec` of every ConvTranspose2d call of one
    inference pass of ``model`` on CUDA ``inputs``, with tensors of ``dtype`` (the autocast
    dtype, or float32) and PyTorch's current TF32 setting."""
    specs = set()

    def record(module, args):
        x = args[0]
        call = checks.check_call(x, module.weight, module.bias, module.stride, module.padding,
                                 module.output_padding, module.groups, module.dilation)
        spec = checks.spec_of_call(call, x, module.bias is not None,
                                   checks.resolve_precision(None))
        specs.add(dataclasses.replace(spec, dtype=dtype))

    hooks = [m.register_forward_pre_hook(record) for m in model.modules()
             if isinstance(m, torch.nn.ConvTranspose2d)]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return specs


def _layout(model, inputs, mode: Mode):
    """``model`` and ``inputs`` in ``mode``'s memory format (the model in place)."""
    if not mode.channels_last:
        return model, inputs
    return (model.to(memory_format=torch.channels_last),
            tuple(x.contiguous(memory_format=torch.channels_last) for x in inputs))


def _run_mode(s: Setup, mode: Mode, trials: int) -> dict:
    """One row: the decoder's model copied twice, one copy converted, warmed up, compared and
    timed in ``mode``."""
    eager, inputs = _layout(copy.deepcopy(s.base), s.inputs, mode)
    converted = copy.deepcopy(eager)
    convert_(converted)
    for model in (eager, converted):
        model.train(mode.train)
    with _autocast(mode.autocast):
        warmup(converted, *inputs)  # (the kernels are built: this plans them)
    row = {"model": s.name, "mode": mode.name}
    if mode.train:
        fns = {"eager": _train(eager, inputs, s.targets, mode),
               "converted": _train(converted, inputs, s.targets, mode)}
        outs = {route: fn() for route, fn in fns.items()}  # one step from identical states
        row["grad_rel"] = errors(_first_convt(converted).weight.grad,
                                 _first_convt(eager).weight.grad)["rel"]
    else:
        if mode.compiled:
            eager, converted = torch.compile(eager), torch.compile(converted)
        fns = {"eager": _infer(eager, inputs, mode), "converted": _infer(converted, inputs, mode)}
        start = time.perf_counter()
        outs = {route: fn() for route, fn in fns.items()}  # (compiles, when compiled)
        if mode.compiled:
            row["compile_s"] = time.perf_counter() - start
    flat = {route: _flat(out) for route, out in outs.items()}
    row["out_rel"] = errors(flat["converted"], flat["eager"])["rel"]
    if not mode.train:
        row["eager_f64_rel"] = errors(flat["eager"], s.reference)["rel"]
        row["converted_f64_rel"] = errors(flat["converted"], s.reference)["rel"]
    del outs, flat
    times = cuda_times_ms(fns, warmup=WARMUP, trials=trials, flush_l2=False, synchronize=True)
    row.update({f"{route}_ms": t["median"] for route, t in times.items()})
    row["ratio"] = row["eager_ms"] / row["converted_ms"]
    return row


@dataclasses.dataclass
class Setup:
    """One decoder ready to run: the model (eval mode, float32, on the GPU), its inputs, the
    training targets, the float64 model's output (flattened; None without inference modes)
    and the ConvTranspose2d problems the modes run."""

    name: str
    base: torch.nn.Module
    inputs: tuple
    targets: list
    reference: torch.Tensor | None
    specs: set


def setup(decoder: decoders.Decoder, modes: list[Mode], shrink: int = 1,
          batch: int | None = None) -> Setup:
    """``decoder`` built with ``shrink`` at ``batch`` (default: the decoder's own) on the
    current GPU, seeded: runs repeat their inputs and weights."""
    torch.manual_seed(0)
    generator = torch.Generator(device="cuda").manual_seed(0)
    base = decoder.build(shrink=shrink).cuda().eval()
    inputs = decoders.example_inputs(base, batch or decoder.batch, "cuda", generator)
    with torch.no_grad():
        targets = [torch.randn(o.shape, device="cuda", generator=generator)
                   for o in _outputs(base(*inputs))]
    reference = None
    if any(not m.train for m in modes):
        with torch.no_grad():
            reference = _flat(copy.deepcopy(base).double()(*(x.double() for x in inputs)))
    specs = set()  # one pass per memory format and dtype the modes run
    for mode in {(m.channels_last, m.autocast): m for m in modes}.values():
        model, layout_inputs = _layout(copy.deepcopy(base), inputs, mode)
        specs |= layer_specs(model, layout_inputs, "bfloat16" if mode.autocast else "float32")
    return Setup(decoder.name, base, inputs, targets, reference, specs)


def environment() -> dict:
    """The GPU, versions and PyTorch's precision switches, as the run sees them."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": cudnn,
            "cutlass": env.cutlass_version(), "conv_tf32": checks.torch_conv_tf32(),
            "matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark}


def run(models: list[str], modes: list[str], *, trials: int = 20, shrink: int = 1,
        batch: int | None = None, report=print) -> dict:
    """The benchmark for the named ``models`` (keys of :data:`cutlass_convt.decoders.DECODERS`)
    and ``modes`` (keys of :data:`MODES`) on the current GPU, ``trials`` timed steps per route,
    the models built with ``shrink`` at ``batch`` (:func:`setup`); ``report`` gets a line per
    row as it is measured, and one for the kernel builds.
    Returns ``{"rows": [...], "trials", "modes", "protocol", and :func:`environment`}``; each row
    has ``model``, ``mode``, ``eager_ms``, ``converted_ms``, ``ratio`` (eager / converted),
    ``out_rel`` (converted against eager), in inference modes ``eager_f64_rel`` and
    ``converted_f64_rel`` (against float64), in training modes ``grad_rel``, when compiled
    ``compile_s`` (both models' first calls)."""
    chosen = [MODES[m] for m in modes]
    setups = [setup(decoders.DECODERS[name], chosen, shrink, batch) for name in models]
    start = time.perf_counter()
    specs = set().union(*(s.specs for s in setups))
    count = _prebuild(specs, chosen_only=True)  # every model's kernels, nvcc in parallel
    report(f"{len(specs)} layer problems, {count} kernels built or found in the cache in "
           f"{time.perf_counter() - start:.1f} s")
    rows = []
    for s in setups:
        for mode in chosen:
            rows.append(_run_mode(s, mode, trials))
            report(row_line(rows[-1]))
    return {**environment(), "trials": trials, "shrink": shrink, "batch": batch,
            "modes": {m.name: m.label for m in chosen}, "rows": rows,
            "protocol": "medians of interleaved steps, CUDA events after a device "
                        "synchronization, no L2 flush"}


HEADER = ("| model | mode | eager ms | converted ms | eager / converted | output rel. diff | "
          "grad rel. diff | eager vs f64 | converted vs f64 |\n" + "|---" * 9 + "|")


def row_line(row: dict) -> str:
    """One row of the markdown table (differences in scientific notation, blank where the
    mode has none)."""
    def cell(key):
        return f"{row[key]:.1e}" if key in row else ""

    return (f"| {row['model']} | {MODES[row['mode']].label} | {row['eager_ms']:.3f} | "
            f"{row['converted_ms']:.3f} | {row['ratio']:.2f}x | {cell('out_rel')} | "
            f"{cell('grad_rel')} | {cell('eager_f64_rel')} | {cell('converted_f64_rel')} |")


def geometric_means(result: dict) -> dict[str, float]:
    """Per mode, the geometric mean of eager / converted over the models."""
    means = {}
    for mode in result["modes"]:
        ratios = [r["ratio"] for r in result["rows"] if r["mode"] == mode]
        if ratios:
            means[mode] = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    return means


def markdown(result: dict) -> str:
    """The result as a markdown page: a header naming the GPU, the versions and the protocol,
    the table, and the geometric means per mode (with the slowest model's ratio)."""
    lines = [f"End to end, eager against converted: {result['gpu']}, torch {result['torch']}, "
             f"cuDNN {result['cudnn']}, CUTLASS {result['cutlass']}; convolutions in "
             f"{'TF32' if result['conv_tf32'] else 'IEEE float32'}, matmul precision "
             f"{result['matmul_precision']}; {result['trials']} trials, "
             f"{result['protocol']}" + (f"; channels / {result['shrink']}"
                                         if result["shrink"] != 1 else ""), "", HEADER,
             *(row_line(r) for r in result["rows"]), "",
             "| mode | eager / converted, geometric mean | slowest model |", "|---|---|---|"]
    for mode, mean in geometric_means(result).items():
        worst = min((r for r in result["rows"] if r["mode"] == mode), key=lambda r: r["ratio"])
        lines.append(f"| {result['modes'][mode]} | {mean:.2f}x | {worst['ratio']:.2f}x "
                     f"({worst['model']}) |")
    return "\n".join(lines) + "\n"


def chart(result: dict, path) -> None:
    """A PNG bar chart of eager / converted per row (above 1: the converted model is faster),
    one colour per mode. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    colors = dict(zip(result["modes"], plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(rows) + 1.4))
    labels = [f"{r['model']}, {r['mode']}" for r in rows]
    ax.barh(labels, [r["ratio"] for r in rows], color=[colors[r["mode"]] for r in rows])
    for i, r in enumerate(rows):
        ax.text(r["ratio"], i, f" {r['ratio']:.2f}x", va="center", fontsize=8)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("eager time / converted time (above 1: converted is faster)")
    ax.set_title(f"End to end on {result['gpu']}, torch {result['torch']}", fontsize=10)
    ax.set_xlim(0, max(r["ratio"] for r in rows) * 1.25)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

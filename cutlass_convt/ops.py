"""The functional API: validation, routing (CUTLASS or PyTorch), and launch of
``conv_transpose2d``."""

from __future__ import annotations

import functools
import operator
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import build, cuda, launch
from .args import InvalidArgument, check_choice, problem_spec
from .spec import DirectConfig, FpropSm90Config, LayoutConfig, ProblemSpec, StripConfig
from .choose import FAMILIES, Config, choose

# "cutlass": the best kernel family that can compute the problem; a family name: that one.
BACKENDS = ("auto", "cutlass", *FAMILIES, "torch")


@dataclass(frozen=True)
class Prepared:
    """A problem ready to run on one kernel configuration, loaded in this process.

    Direct family: ``kernel`` is a :class:`~cutlass_convt.launch.DirectKernel` and ``plan`` its
    :class:`~cutlass_convt.launch.DirectPlan`; strip family: a
    :class:`~cutlass_convt.launch.StripKernel` and its :class:`~cutlass_convt.launch.StripPlan`.
    SM90 fprop family: a
    :class:`~cutlass_convt.launch.FpropSm90Kernel` and its forward problem. Dgrad family: a
    :class:`~cutlass_convt.launch.Kernel` and, per launch, its plan and the element offsets
    of its views of x, the KRSC filter, the bias and y (see
    :meth:`ProblemSpec.dgrad_launches`). ``device``: the CUDA device index it was planned for
    (persistent grids are sized for its SMs). ``layout``: the layout-pass kernels (not for the
    direct family)."""

    spec: ProblemSpec
    config: Config
    kernel: launch.Kernel | launch.DirectKernel | launch.StripKernel | launch.FpropSm90Kernel
    plan: object
    device: int
    layout: launch.LayoutKernels | None = None


@dataclass(frozen=True)
class TorchRoute:
    """A problem routed to PyTorch's own ``conv_transpose2d``, and why."""

    spec: ProblemSpec
    reason: str


def uses_layout_passes(config: Config) -> bool:
    """Whether ``config``'s family needs our layout-pass kernels: the CUTLASS families (dgrad,
    fprop_sm90) read and write NHWC; ours (direct, strip) read the caller's layout."""
    return not isinstance(config, (DirectConfig, StripConfig))


def prepare_config(spec: ProblemSpec, config: Config, device: int | None = None) -> Prepared:
    """Build (cached on disk), load and plan ``config`` for ``spec`` on CUDA device index
    ``device`` (default: the current one), once per process and device (a plan's grid is sized
    for its device's SMs). Raises :class:`cutlass_convt.launch.UnsupportedProblem` when CUTLASS's
    ``can_implement`` rejects the problem, :class:`cutlass_convt.build.BuildError` when the
    kernel is not cached and cannot be compiled."""
    return _prepare_config(spec, config, _device_index(device))


def _device_index(device: int | None) -> int:
    return torch.cuda.current_device() if device is None else operator.index(device)


@functools.lru_cache(maxsize=256)
def _prepare_config(spec: ProblemSpec, config: Config, device: int) -> Prepared:
    with cuda.OnDevice(device):  # (before the build: without CUDA, no nvcc run)
        artifact = build.build(config)
        if not uses_layout_passes(config):
            load = launch.load_direct if isinstance(config, DirectConfig) else launch.load_strip
            kernel = load(artifact)
            return Prepared(spec, config, kernel, kernel.plan(spec, device), device)
        layout = launch.load_layout(build.build(LayoutConfig(spec.arch)))
        if isinstance(config, FpropSm90Config):
            kernel = launch.load_fprop_sm90(artifact)
            return Prepared(spec, config, kernel, kernel.plan(spec), device, layout)
        kernel = launch.load(artifact)
        plans: dict = {}
        launches = []
        for item in spec.dgrad_launches():
            key = (item.problem, item.x_strides, item.y_strides)
            if key not in plans:
                plans[key] = kernel.plan(item, spec.bias)
            launches.append((plans[key], item.offsets))
        return Prepared(spec, config, kernel, tuple(launches), device, layout)


def prepare(spec: ProblemSpec, families: tuple[str, ...] = FAMILIES,
            device: int | None = None) -> Prepared:
    """Kernel choice among ``families`` (:func:`choose`) -> :func:`prepare_config` on CUDA
    device ``device`` (default: the current one).

    Raises :class:`cutlass_convt.launch.UnsupportedProblem` naming every family's reasons when
    none of ``families`` can compute ``spec``, and what :func:`prepare_config` raises.
    """
    return prepare_config(spec, choose(spec, families), device)


_WARNED: set[str] = set()


def route(spec: ProblemSpec, backend: str, device: int | None = None) -> Prepared | TorchRoute:
    """Where a problem runs on CUDA device ``device`` (default: the current one). ``"auto"``:
    the best kernel family that can compute it, else PyTorch with a one-time
    ``RuntimeWarning`` naming the reasons; ``"cutlass"``: the best family or
    :class:`~cutlass_convt.launch.UnsupportedProblem`; a family name (``"strip"``,
    ``"direct"``, ``"fprop_sm90"``, ``"dgrad"``): that family or UnsupportedProblem;
    ``"torch"``: PyTorch."""
    if backend == "torch":
        return TorchRoute(spec, "backend='torch'")
    try:
        return prepare(spec, (backend,) if backend in FAMILIES else FAMILIES, device)
    except launch.UnsupportedProblem as e:
        if backend != "auto":
            raise
        reason = str(e)
    if reason not in _WARNED:
        _WARNED.add(reason)
        warnings.warn(f"cutlass_convt: running PyTorch's conv_transpose2d instead of a CUTLASS "
                      f"kernel: {reason}", RuntimeWarning, stacklevel=3)
    return TorchRoute(spec, reason)


# Calls seen before, by everything problem_spec and route read: a hit skips both.
_SEEN: dict[tuple, Prepared | TorchRoute] = {}
_SEEN_MAX = 1024


def _signature(input, weight, bias, stride, padding, output_padding, groups, dilation,
               precision, backend):
    """Hashable summary of the arguments, or None when they are not all tensors with shapes and
    strides (then every call validates them). Layouts are part of it, so that a sparse tensor
    never hits a dense call's entry. The plain arguments enter by ``repr``, so that ``1``,
    ``1.0`` and ``True`` stay apart."""
    try:
        return (input.shape, input.stride(), input.dtype, input.device, input.layout,
                weight.shape, weight.stride(), weight.dtype, weight.device, weight.layout,
                None if bias is None else (bias.shape, bias.dtype, bias.device, bias.layout),
                repr((stride, padding, output_padding, groups, dilation, precision, backend)),
                torch.backends.cudnn.allow_tf32 if precision is None else None)
    except (AttributeError, TypeError, RuntimeError):  # RuntimeError: no strides (sparse CSR)
        return None


def _aligned(t: torch.Tensor, bytes_: int, memory_format) -> torch.Tensor:
    """``t`` packed in ``memory_format`` with its address a multiple of ``bytes_``."""
    if not t.is_contiguous(memory_format=memory_format):
        t = t.contiguous(memory_format=memory_format)
    if t.data_ptr() % bytes_:
        t = t.clone(memory_format=memory_format)
    return t


def _cudnn_precision(precision: str):
    """cuDNN's flags as they are, with TF32 on for ``"tf32"`` and off for ``"fp32"``."""
    cudnn = torch.backends.cudnn
    return cudnn.flags(enabled=cudnn.enabled, benchmark=cudnn.benchmark,
                       deterministic=cudnn.deterministic, allow_tf32=precision == "tf32")


def _run_torch(spec: ProblemSpec, input, weight, bias) -> torch.Tensor:
    """PyTorch's own transposed convolution, with TF32 on or off as ``spec.precision`` says."""
    with _cudnn_precision(spec.precision):
        return F.conv_transpose2d(input, weight, bias, spec.stride, spec.padding,
                                  spec.output_padding, spec.groups, spec.dilation)


def run_prepared(prepared: Prepared, input, weight, bias) -> torch.Tensor:
    """Run a prepared kernel on tensors that match its problem (validated by the caller) on
    PyTorch's current stream; returns y in the problem's memory format. Raises
    :class:`InvalidArgument` when the tensors are on another device than the one ``prepared``
    was planned for."""
    device = input.device.index
    if device != prepared.device:
        raise InvalidArgument(f"cutlass_convt: a problem planned for cuda:{prepared.device} "
                              f"run on cuda:{device}")
    stream = cuda.current_stream(device)
    batched = input if input.dim() == 4 else input.unsqueeze(0)
    with cuda.OnDevice(device):
        if not uses_layout_passes(prepared.config):
            y = _run_direct(prepared, batched, weight, bias, device, stream)
        elif isinstance(prepared.config, FpropSm90Config):
            y = _run_fprop_sm90(prepared, batched, weight, device, stream)
        else:
            y = _run_dgrad(prepared, batched, weight, bias, device, stream)
    return y if input.dim() == 4 else y.squeeze(0)


def _run_direct(prepared: Prepared, x, weight, bias, device: int, stream: int) -> torch.Tensor:
    """The direct and strip families: x and y in the problem's memory format, the filter as
    PyTorch holds it; no layout passes."""
    memory_format = torch.channels_last if prepared.spec.channels_last else torch.contiguous_format
    x = _aligned(x, 16, memory_format)
    weight = _aligned(weight, 4, torch.contiguous_format)
    y = torch.empty(prepared.spec.out_shape, dtype=x.dtype, device=x.device,
                    memory_format=memory_format)
    b = _aligned(bias, 4, torch.contiguous_format).data_ptr() if bias is not None else 0
    prepared.kernel.run(prepared.plan, device, stream, x.data_ptr(), weight.data_ptr(), b,
                        y.data_ptr())
    return y


def _run_fprop_sm90(prepared: Prepared, x, weight, device: int, stream: int) -> torch.Tensor:
    """The SM90 fprop family: NHWC x and y (layout passes for NCHW), the filter flipped and
    transposed to the forward convolution's KRSC (K = C_out, C = C_in)."""
    x = _to_nhwc(x, 16, prepared.layout, device, stream)
    filter_krsc = weight.flip(2, 3).permute(1, 2, 3, 0).contiguous()
    y = torch.empty(prepared.spec.out_shape, dtype=x.dtype, device=x.device,
                    memory_format=torch.channels_last)
    prepared.kernel.run(prepared.plan, device, stream, x.data_ptr(), filter_krsc.data_ptr(),
                        y.data_ptr())
    return _from_nhwc(prepared, y, device, stream)


def _from_nhwc(prepared: Prepared, y: torch.Tensor, device: int, stream: int) -> torch.Tensor:
    """``y`` (packed NHWC) in the problem's memory format: itself, or through the layout pass."""
    if prepared.spec.channels_last:
        return y
    y_nchw = torch.empty(prepared.spec.out_shape, dtype=y.dtype, device=y.device)
    n, c, h, w = prepared.spec.out_shape
    prepared.layout.transpose(False, y.data_ptr(), y_nchw.data_ptr(), n, c, h * w, device,
                              stream)
    return y_nchw


def _run_dgrad(prepared: Prepared, x, weight, bias, device: int, stream: int) -> torch.Tensor:
    """The dgrad family: NHWC x, KRSC filter and NHWC y, through the layout passes for NCHW."""
    spec, config, layout = prepared.spec, prepared.config, prepared.layout
    x = _to_nhwc(x, 4 * config.alignment_a, layout, device, stream)
    filter_krsc = _to_nhwc(weight, 4 * config.alignment_c, layout, device, stream)
    y = torch.empty(spec.out_shape, dtype=x.dtype, device=x.device,
                    memory_format=torch.channels_last)
    # without bias the kernel reads no C operand (beta = 0): any address will do
    b = _aligned(bias, 4 * config.alignment_c, torch.contiguous_format) if spec.bias else y
    prepared.kernel.run(prepared.plan, device, stream, x.data_ptr(), filter_krsc.data_ptr(),
                        b.data_ptr(), y.data_ptr())
    return _from_nhwc(prepared, y, device, stream)


def _to_nhwc(t: torch.Tensor, alignment_bytes: int, layout: launch.LayoutKernels, device: int,
             stream: int) -> torch.Tensor:
    """A 4-D tensor as packed, aligned channels_last: itself when it already is; through our
    layout pass when it is packed NCHW; else through PyTorch's copy."""
    if t.is_contiguous(memory_format=torch.channels_last) or not t.is_contiguous():
        return _aligned(t, alignment_bytes, torch.channels_last)
    out = torch.empty_like(t, memory_format=torch.channels_last)
    n, c, h, w = t.shape
    layout.transpose(True, t.data_ptr(), out.data_ptr(), n, c, h * w, device, stream)
    return out


def conv_transpose2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     stride=1, padding=0, output_padding=0, groups: int = 1, dilation=1, *,
                     precision: str | None = None, backend: str = "auto") -> torch.Tensor:
    """``torch.nn.functional.conv_transpose2d`` on kernels emitted, compiled and cached by
    cutlass_convt.

    Args:
        input: float32 CUDA tensor (N, C_in, H_in, W_in) or unbatched (C_in, H_in, W_in), NCHW
            or channels_last.
        weight: float32 (C_in, C_out / groups, R, S) on the same device.
        bias: optional float32 (C_out,), added in the kernel's epilogue.
        stride, padding, output_padding, dilation: int or (h, w) pair; groups: int. Same
            meaning, defaults and limits as PyTorch.
        precision: ``"tf32"`` (TF32 tensor cores, PyTorch's default for convolutions),
            ``"fp32"`` (3xTF32: fp32-accurate) or ``None`` (follow
            ``torch.backends.cudnn.allow_tf32``).
        backend: ``"auto"`` (the best kernel family that can compute the problem; otherwise
            PyTorch's own implementation, with a one-time ``RuntimeWarning`` naming the
            reasons), ``"cutlass"`` (the best family or an error), ``"strip"``, ``"direct"``,
            ``"fprop_sm90"`` or ``"dgrad"`` (that family or an error), or ``"torch"``. The
            README lists what runs where.

    Returns:
        float32 (N, C_out, H_out, W_out) with ``H_out = (H_in - 1) * stride - 2 * padding +
        dilation * (R - 1) + output_padding + 1`` (likewise W_out), channels_last when the input
        or the weight is channels_last (PyTorch's rule on CUDA), else NCHW. Differentiable
        in input, weight and bias: the forward runs on our kernels, the backward on PyTorch's
        own (``torch.ops.aten.convolution_backward``, TF32 as ``precision`` says).

    Kernel families (``cutlass_convt.choose``), in order of preference: ``"strip"``, our own
    TMA + wgmma kernel for the case of KernelBench problem 71 on an H100/H200 (stride 1, TF32,
    32 -> 32 channels, 3 filter rows, channels_last or NCHW; on NCHW the input width and the
    output's P x Q multiples of 4); ``"direct"``, our own kernel for stride 1, dilation 1,
    groups 1, channels in multiples of 8 (at most 32 out, or multiples of 32 in blocks of 32 on
    an H100/H200; fp32 at most 64 in): it reads and writes the caller's layout (NCHW or NHWC)
    and PyTorch's filter layout directly (``wgmma`` on an H100/H200, else ``mma.sync``; after
    the two CUTLASS families where its filter is split in blocks of output channels, except
    fp32 blocks of 32 on 4-row tiles, or in fp32 on one stage and blocks of 8 with more than 16
    taps, :func:`cutlass_convt.choose.family_order`); ``"fprop_sm90"``, CUTLASS 3.x SM90 TMA +
    wgmma fprop on the flipped filter (TF32, stride 1, no bias); ``"dgrad"``, CUTLASS 2.x
    implicit-GEMM dgrad for everything else it can do (the unity-stride kernel for stride 1,
    strided dgrad otherwise, one launch per group, batches of 2 GiB or more in chunks). The
    CUTLASS families read and write NHWC: NCHW tensors pass through our layout kernels. A
    tuning record (``scripts/generate.py --tune``) can pick any family for a problem.

    Raises:
        TypeError, ValueError: invalid arguments (see :func:`problem_spec`; the value errors
        are :class:`InvalidArgument`, also a RuntimeError as PyTorch's), before any GPU
        work. :class:`cutlass_convt.launch.UnsupportedProblem` (a NotImplementedError) when the
        requested family (or, for ``backend="cutlass"``, every family) cannot compute the
        problem. :class:`cutlass_convt.build.BuildError` if the kernel is not cached and cannot
        be compiled.

    The first call for a new kernel configuration compiles it with nvcc (on 2 CPU cores: 2-10 s,
    about 30 s for an SM90 kernel), unless ``scripts/generate.py`` built it ahead; later calls
    and processes reuse the cache.
    """
    key = _signature(input, weight, bias, stride, padding, output_padding, groups, dilation,
                     precision, backend)
    chosen = _SEEN.get(key) if key is not None else None
    if chosen is None:
        check_choice(backend, "backend", BACKENDS)
        spec = problem_spec(input, weight, bias, stride, padding, output_padding, groups,
                            dilation, precision)
        if spec.batch == 0:  # nothing to compute; PyTorch's route keeps autograd's graph
            if _needs_grad(input, weight, bias):
                return _run_torch(spec, input, weight, bias)
            out = torch.empty(spec.out_shape, dtype=input.dtype, device=input.device,
                              memory_format=torch.channels_last if spec.channels_last
                              else torch.contiguous_format)
            return out if input.dim() == 4 else out.squeeze(0)
        chosen = route(spec, backend, input.device.index)
        if key is not None:
            if len(_SEEN) >= _SEEN_MAX:
                _SEEN.clear()
            _SEEN[key] = chosen
    if isinstance(chosen, TorchRoute):
        return _run_torch(chosen.spec, input, weight, bias)
    if _needs_grad(input, weight, bias):
        return _Differentiable.apply(chosen, input, weight, bias)
    return run_prepared(chosen, input, weight, bias)


def _needs_grad(*tensors) -> bool:
    """Whether autograd records a call on ``tensors`` (None entries allowed)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


class _Differentiable(torch.autograd.Function):
    """A prepared kernel's forward with PyTorch's own backward: the gradients of x, the
    filter and the bias from ``torch.ops.aten.convolution_backward`` (the transposed
    convolution's backward that ``F.conv_transpose2d`` records), with TF32 on or off as the
    problem's precision says."""

    @staticmethod
    def forward(ctx, prepared: Prepared, input, weight, bias):
        ctx.prepared = prepared
        ctx.save_for_backward(input, weight)
        return run_prepared(prepared, input, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        spec, (input, weight) = ctx.prepared.spec, ctx.saved_tensors
        unbatched = input.dim() == 3
        x, grad = (input.unsqueeze(0), grad.unsqueeze(0)) if unbatched else (input, grad)
        mask = list(ctx.needs_input_grad[1:])  # input, weight, bias
        with _cudnn_precision(spec.precision):
            grad_x, grad_w, grad_b = torch.ops.aten.convolution_backward(
                grad, x, weight, [spec.out_channels] if spec.bias else None, spec.stride,
                spec.padding, spec.dilation, True, spec.output_padding, spec.groups, mask)
        if unbatched and grad_x is not None:
            grad_x = grad_x.squeeze(0)
        return None, grad_x, grad_w, grad_b

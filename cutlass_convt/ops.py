"""The functional API: routing (a kernel family or PyTorch), the per-call fast path, and
autograd of ``conv_transpose2d``. The argument checks are ``args``'s, the choice ``choose``'s,
the kernels the families'."""

from __future__ import annotations

import functools
import operator
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import choose, cuda
from .args import InvalidArgument, check_choice, problem_spec
from .families import Prepared, UnsupportedProblem
from .spec import ProblemSpec

# "cutlass": the best kernel family that can compute the problem; a family name: that one.
BACKENDS = ("auto", "cutlass", *choose.NAMES, "torch")


@dataclass(frozen=True)
class TorchRoute:
    """A problem routed to PyTorch's own ``conv_transpose2d``, and why."""

    spec: ProblemSpec
    reason: str


def prepare_config(spec: ProblemSpec, config, device: int | None = None) -> Prepared:
    """Build (cached on disk), load and plan ``config`` for ``spec`` on CUDA device index
    ``device`` (default: the current one), once per process and device (a plan's grid is sized
    for its device's SMs). Raises :class:`~cutlass_convt.UnsupportedProblem` when the kernel
    cannot implement the problem (CUTLASS's ``can_implement``),
    :class:`~cutlass_convt.BuildError` when it is not cached and cannot be compiled."""
    return _prepare_config(spec, config, _device_index(device))


def _device_index(device: int | None) -> int:
    return torch.cuda.current_device() if device is None else operator.index(device)


@functools.lru_cache(maxsize=256)
def _prepare_config(spec: ProblemSpec, config, device: int) -> Prepared:
    with cuda.OnDevice(device):  # (before the build: without CUDA, no nvcc run)
        return choose.family_of(config).prepare(spec, config, device)


def prepare(spec: ProblemSpec, families: tuple[str, ...] = choose.NAMES,
            device: int | None = None) -> Prepared:
    """Kernel choice among the named ``families`` (:func:`cutlass_convt.choose.choose`) ->
    :func:`prepare_config` on CUDA device ``device`` (default: the current one).

    Raises :class:`~cutlass_convt.UnsupportedProblem` naming every family's reasons when none
    of ``families`` can compute ``spec``, and what :func:`prepare_config` raises.
    """
    return prepare_config(spec, choose.choose(spec, families), device)


_WARNED: set[str] = set()


def route(spec: ProblemSpec, backend: str, device: int | None = None) -> Prepared | TorchRoute:
    """Where a problem runs on CUDA device ``device`` (default: the current one). ``"auto"``:
    the best kernel family that can compute it, else PyTorch with a one-time
    ``RuntimeWarning`` naming the reasons; ``"cutlass"``: the best family or
    :class:`~cutlass_convt.UnsupportedProblem`; a family name (``"strip"``,
    ``"direct"``, ``"fprop_sm90"``, ``"dgrad"``): that family or UnsupportedProblem;
    ``"torch"``: PyTorch."""
    if backend == "torch":
        return TorchRoute(spec, "backend='torch'")
    try:
        return prepare(spec, (backend,) if backend in choose.NAMES else choose.NAMES, device)
    except UnsupportedProblem as e:
        if backend != "auto":
            raise
        reason = str(e)
    if reason not in _WARNED:
        _WARNED.add(reason)
        warnings.warn(f"cutlass_convt: running PyTorch's conv_transpose2d instead of a CUTLASS "
                      f"kernel: {reason}", RuntimeWarning, stacklevel=3)
    return TorchRoute(spec, reason)


def clear_caches() -> None:
    """Forget what this process remembers of earlier calls: the arguments seen, the kernel
    choices, the tuning records read, the plans and the warnings given (not the loaded kernels,
    nor the kernel cache on disk), so that the next call of each problem chooses and plans
    again. Writing a tuning record calls it."""
    _SEEN.clear()
    _WARNED.clear()
    _prepare_config.cache_clear()
    choose.clear_cache()


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
        y = prepared.family.run(prepared, batched, weight, bias, stream)
    return y if input.dim() == 4 else y.squeeze(0)


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
        work. :class:`cutlass_convt.UnsupportedProblem` (a NotImplementedError) when the
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

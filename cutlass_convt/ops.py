"""The functional API: validation, kernel choice and launch of ``conv_transpose2d``."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch._prims_common import suggest_memory_format

from . import build, env, launch
from .spec import (PRECISIONS, KernelConfig, ProblemSpec, choose_config,
                   conv_transpose_output_size)

_MAX_TENSOR_BYTES = 2**31  # CUTLASS 2.x conv kernels index tensors with 32-bit offsets


def _pair(value, name: str) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if (isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        return (value[0], value[1])
    raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")


def _prefers_channels_last(t: torch.Tensor) -> bool:
    """PyTorch's ``suggest_memory_format`` rule, with a fast path for unambiguous tensors."""
    if t.is_contiguous() != t.is_contiguous(memory_format=torch.channels_last):
        return not t.is_contiguous()
    return suggest_memory_format(t) is torch.channels_last


def resolve_precision(precision: str | None) -> str:
    """``"tf32"`` or ``"fp32"``; ``None`` follows ``torch.backends.cudnn.allow_tf32`` (True by
    default), as PyTorch's own cuDNN convolutions do. Raises ValueError for other values."""
    if precision is None:
        return "tf32" if torch.backends.cudnn.allow_tf32 else "fp32"
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS} or None, got {precision!r}")
    return precision


def problem_spec(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                 dilation=1, precision=None) -> ProblemSpec:
    """Validate ``conv_transpose2d``'s arguments and describe the problem. No GPU work.

    Raises TypeError (non-tensors, dtypes other than float32, malformed int pairs), ValueError
    (CPU or mixed devices, wrong ranks or shapes, invalid sizes), NotImplementedError
    (arguments valid in PyTorch that this version does not run yet: stride > 1, groups > 1,
    tensors of 2 GiB or more).
    """
    tensors = {"input": input, "weight": weight, "bias": bias}
    for name, t in tensors.items():
        if t is None and name == "bias":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {t.dtype}")
    if input.dim() not in (3, 4):
        raise ValueError("expected 3-D (unbatched) or 4-D (batched) input to conv_transpose2d, "
                         f"got input of shape {tuple(input.shape)}")
    if weight.dim() != 4:
        raise ValueError("expected 4-D weight (in_channels, out_channels/groups, kH, kW), got "
                         f"weight of shape {tuple(weight.shape)}")
    precision = resolve_precision(precision)
    stride, padding = _pair(stride, "stride"), _pair(padding, "padding")
    output_padding, dilation = _pair(output_padding, "output_padding"), _pair(dilation, "dilation")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups!r}")
    if min(stride) < 1 or min(dilation) < 1:
        raise ValueError(f"stride and dilation must be positive, got stride={stride}, "
                         f"dilation={dilation}")
    if min(padding) < 0 or min(output_padding) < 0:
        raise ValueError(f"padding and output_padding must be non-negative, got "
                         f"padding={padding}, output_padding={output_padding}")
    for op, s, d in zip(output_padding, stride, dilation):
        if op >= s and op >= d:
            raise ValueError(f"output_padding must be smaller than either stride or dilation, "
                             f"got output_padding={output_padding}, stride={stride}, "
                             f"dilation={dilation}")
    batched = input if input.dim() == 4 else input.unsqueeze(0)
    n, c_in, h_in, w_in = batched.shape
    if weight.shape[0] != c_in:
        raise ValueError(f"weight of shape {tuple(weight.shape)} expects input with "
                         f"{weight.shape[0]} channels, got input of shape {tuple(input.shape)}")
    if c_in % groups:
        raise ValueError(f"in_channels ({c_in}) must be divisible by groups ({groups})")
    c_out = weight.shape[1] * groups
    if bias is not None and tuple(bias.shape) != (c_out,):
        raise ValueError(f"bias must have shape ({c_out},), got {tuple(bias.shape)}")
    if min(weight.shape) < 1 or min(h_in, w_in) < 1:
        raise ValueError(f"weight and input sizes must be positive (batch may be 0), got weight "
                         f"{tuple(weight.shape)} and input {tuple(input.shape)}")
    kernel_size = (weight.shape[2], weight.shape[3])
    out_size = tuple(conv_transpose_output_size(*args) for args in zip(
        (h_in, w_in), kernel_size, stride, padding, output_padding, dilation))
    if min(out_size) < 1:
        raise ValueError(f"input spatial size {(h_in, w_in)} gives output size {out_size}: "
                         "too small")
    if stride != (1, 1):
        raise NotImplementedError(f"stride={stride}: only stride 1 runs in this version")
    if groups != 1:
        raise NotImplementedError(f"groups={groups}: only groups=1 runs in this version")
    if max(batched.numel(), n * c_out * out_size[0] * out_size[1]) * 4 >= _MAX_TENSOR_BYTES:
        raise NotImplementedError("input or output of 2 GiB or more: CUTLASS 2.x convolution "
                                  "kernels use 32-bit offsets")
    for name, t in tensors.items():  # devices last, so that every other error shows on the CPU
        if t is not None and t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor, got a tensor on {t.device}")
        if t is not None and t.device != input.device:
            raise ValueError(f"{name} is on {t.device} but input is on {input.device}")

    return ProblemSpec(
        batch=n, in_channels=c_in, out_channels=c_out, in_size=(h_in, w_in),
        kernel_size=kernel_size, stride=stride, padding=padding,
        output_padding=output_padding, dilation=dilation, groups=groups,
        bias=bias is not None,
        channels_last=_prefers_channels_last(weight) or (
            input.dim() == 4 and _prefers_channels_last(input)),
        precision=precision,
        arch=env.device_arch(input.device.index),
    )


@dataclass(frozen=True)
class Prepared:
    """What a call needs once its arguments are validated: the problem, the chosen kernel
    configuration, the loaded kernel and its launch plan."""

    spec: ProblemSpec
    config: KernelConfig
    kernel: launch.Kernel
    plan: launch.LaunchPlan


@functools.lru_cache(maxsize=256)
def prepare(spec: ProblemSpec) -> Prepared:
    """Kernel choice -> build (cached on disk) -> load -> plan, once per problem per process."""
    config = choose_config(spec)
    kernel = launch.load(build.build(config))
    return Prepared(spec, config, kernel, kernel.plan(spec.dgrad(), spec.bias))


# Calls seen before, by everything problem_spec reads: a hit skips validation and planning.
_SEEN: dict[tuple, Prepared] = {}
_SEEN_MAX = 1024


def _signature(input, weight, bias, stride, padding, output_padding, groups, dilation, precision):
    """Hashable summary of the arguments, or None when they are not all tensors. The plain
    arguments enter by ``repr``, so that ``1``, ``1.0`` and ``True`` stay apart."""
    try:
        key = (input.shape, input.stride(), input.dtype, input.device,
               weight.shape, weight.stride(), weight.dtype, weight.device,
               None if bias is None else (bias.shape, bias.dtype, bias.device),
               repr((stride, padding, output_padding, groups, dilation, precision)),
               torch.backends.cudnn.allow_tf32 if precision is None else None)
    except (AttributeError, TypeError):
        return None
    return key


def _current_raw_stream(device: int) -> int:
    """``torch.cuda.current_stream(device).cuda_stream``, through the 0.3 us binding that
    Triton and Inductor use when this PyTorch has it (the public call costs about 3 us)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def _aligned(t: torch.Tensor, bytes_: int, memory_format) -> torch.Tensor:
    """``t`` packed in ``memory_format`` with its address a multiple of ``bytes_``."""
    if not t.is_contiguous(memory_format=memory_format):
        t = t.contiguous(memory_format=memory_format)
    if t.data_ptr() % bytes_:
        t = t.clone(memory_format=memory_format)
    return t


def conv_transpose2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     stride=1, padding=0, output_padding=0, groups: int = 1, dilation=1, *,
                     precision: str | None = None) -> torch.Tensor:
    """``torch.nn.functional.conv_transpose2d`` on a CUTLASS dgrad kernel.

    Args:
        input: float32 CUDA tensor (N, C_in, H_in, W_in) or unbatched (C_in, H_in, W_in), NCHW
            or channels_last.
        weight: float32 (C_in, C_out / groups, R, S) on the same device.
        bias: optional float32 (C_out,), added in the kernel's epilogue.
        stride, padding, output_padding, dilation: int or (h, w) pair; groups: int. Same
            meaning and defaults as PyTorch. This version runs stride 1 and groups 1.
        precision: ``"tf32"`` (TF32 tensor cores, PyTorch's default for convolutions),
            ``"fp32"`` (3xTF32: fp32-accurate) or ``None`` (follow
            ``torch.backends.cudnn.allow_tf32``).

    Returns:
        float32 (N, C_out, H_out, W_out) with ``H_out = (H_in - 1) * stride - 2 * padding +
        dilation * (R - 1) + output_padding + 1`` (likewise W_out), channels_last when the input
        or the weight is channels_last (PyTorch's rule on CUDA), else NCHW. The kernel reads and
        writes NHWC; NCHW tensors are converted on the way in and out.

    Raises:
        TypeError, ValueError, NotImplementedError: see :func:`problem_spec`; all before any
        GPU work. :class:`cutlass_convt.build.BuildError` if the kernel is not cached and cannot
        be compiled; :class:`cutlass_convt.launch.UnsupportedProblem` (a NotImplementedError)
        if CUTLASS's ``can_implement`` rejects the problem.

    The first call for a new kernel configuration compiles it with nvcc (about 10 s), unless
    ``scripts/generate.py`` built it ahead; later calls and processes reuse the cache.
    """
    key = _signature(input, weight, bias, stride, padding, output_padding, groups, dilation,
                     precision)
    prepared = _SEEN.get(key) if key is not None else None
    if prepared is None:
        spec = problem_spec(input, weight, bias, stride, padding, output_padding, groups,
                            dilation, precision)
        if spec.batch == 0:
            out = torch.empty(spec.out_shape, dtype=input.dtype, device=input.device,
                              memory_format=torch.channels_last if spec.channels_last
                              else torch.contiguous_format)
            return out if input.dim() == 4 else out.squeeze(0)
        prepared = prepare(spec)
        if key is not None:
            if len(_SEEN) >= _SEEN_MAX:
                _SEEN.clear()
            _SEEN[key] = prepared
    spec, config = prepared.spec, prepared.config

    x = input if input.dim() == 4 else input.unsqueeze(0)
    x = _aligned(x, 4 * config.alignment_a, torch.channels_last)
    filter_krsc = _aligned(weight.permute(0, 2, 3, 1), 4 * config.alignment_c,
                           torch.contiguous_format)
    y = torch.empty(spec.out_shape, dtype=input.dtype, device=input.device,
                    memory_format=torch.channels_last)
    b = _aligned(bias, 4 * config.alignment_c, torch.contiguous_format) if spec.bias else y
    device = input.device.index
    stream = _current_raw_stream(device)
    args = (prepared.plan, device, stream, x.data_ptr(), filter_krsc.data_ptr(), b.data_ptr(),
            y.data_ptr())
    if torch.cuda.current_device() == device:
        prepared.kernel.launch(*args)
    else:  # the kernel runs in the current context: make it the tensors' device's
        with torch.cuda.device(device):
            prepared.kernel.launch(*args)
    if not spec.channels_last:
        y = y.contiguous()
    return y if input.dim() == 4 else y.squeeze(0)

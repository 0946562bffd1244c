"""Argument checks of ``conv_transpose2d``: PyTorch's rules, and the problem they describe.

:func:`problem_spec` validates the tensors and size arguments exactly as
``torch.nn.functional.conv_transpose2d`` does (same refusals, as ``TypeError`` or
:class:`InvalidArgument`) and returns the :class:`~cutlass_convt.spec.ProblemSpec` the kernel
choice works on. No GPU work; the scripts use the same checks for their ``--shape`` options.
"""

from __future__ import annotations

import operator

import torch
from torch._prims_common import suggest_memory_format

from . import env
from .spec import PRECISIONS, ProblemSpec, conv_transpose_output_size


class InvalidArgument(ValueError, RuntimeError):
    """An argument value (size, shape, device) that ``conv_transpose2d`` refuses. A
    ValueError, and a RuntimeError like PyTorch's own refusals of these values, so that code
    written for ``torch.nn.functional.conv_transpose2d`` catches it too."""


def _int(value) -> int | None:
    """``value`` as an int if it is an integer other than a bool (numpy integers included)."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _pair(value, name: str) -> tuple[int, int]:
    """An int, or a sequence of one or two ints, as an (h, w) pair (PyTorch's ``_pair``)."""
    if _int(value) is not None:
        return (_int(value), _int(value))
    if isinstance(value, (tuple, list)) and len(value) in (1, 2):
        ints = [_int(v) for v in value]
        if None not in ints:
            return (ints[0], ints[-1])
    raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")


def check_choice(value, name: str, allowed: tuple) -> None:
    """Raise ValueError unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


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
    check_choice(precision, "precision", (*PRECISIONS, None))
    return precision


def check_arguments(stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """``conv_transpose2d``'s size arguments as ``(stride, padding, output_padding, groups,
    dilation)``, each an (h, w) pair of ints but ``groups`` (an int). Raises TypeError
    (malformed ints or pairs) and :class:`InvalidArgument` (stride or dilation below 1,
    negative padding, groups below 1, output_padding not smaller than stride or dilation), as
    PyTorch does."""
    stride, padding = _pair(stride, "stride"), _pair(padding, "padding")
    output_padding, dilation = _pair(output_padding, "output_padding"), _pair(dilation, "dilation")
    if _int(groups) is None:
        raise TypeError(f"groups must be an int, got {groups!r}")
    groups = _int(groups)
    if groups < 1:
        raise InvalidArgument(f"groups must be a positive int, got {groups!r}")
    if min(stride) < 1 or min(dilation) < 1:
        raise InvalidArgument(f"stride and dilation must be positive, got stride={stride}, "
                              f"dilation={dilation}")
    if min(padding) < 0 or min(output_padding) < 0:
        raise InvalidArgument(f"padding and output_padding must be non-negative, got "
                              f"padding={padding}, output_padding={output_padding}")
    for op, s, d in zip(output_padding, stride, dilation):
        if op >= s and op >= d:
            raise InvalidArgument(f"output_padding must be smaller than either stride or "
                                  f"dilation, got output_padding={output_padding}, "
                                  f"stride={stride}, dilation={dilation}")
    return stride, padding, output_padding, groups, dilation


def check_groups(in_channels: int, out_channels: int, groups: int) -> None:
    """Raises :class:`InvalidArgument` unless ``groups`` divides both channel counts (as
    PyTorch requires)."""
    for name, channels in (("in_channels", in_channels), ("out_channels", out_channels)):
        if channels % groups:
            raise InvalidArgument(f"{name} ({channels}) must be divisible by groups ({groups})")


def check_output_size(in_size, kernel_size, stride, padding, output_padding, dilation):
    """The output (H_out, W_out) of (h, w) pairs of sizes (see
    :func:`cutlass_convt.spec.conv_transpose_output_size`); raises :class:`InvalidArgument`
    when either is below 1, as PyTorch does ("too small")."""
    out_size = tuple(conv_transpose_output_size(*args) for args in zip(
        in_size, kernel_size, stride, padding, output_padding, dilation))
    if min(out_size) < 1:
        raise InvalidArgument(f"input spatial size {tuple(in_size)} gives output size "
                              f"{out_size}: too small")
    return out_size


def problem_spec(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                 dilation=1, precision=None) -> ProblemSpec:
    """Validate ``conv_transpose2d``'s arguments and describe the problem. No GPU work.

    Raises TypeError (non-tensors, dtypes other than float32, sparse or nested tensors,
    malformed int pairs) and :class:`InvalidArgument`, a ValueError and RuntimeError (CPU or
    mixed devices, wrong ranks or shapes, invalid sizes), for the arguments that
    ``torch.nn.functional.conv_transpose2d`` refuses too (with RuntimeError).
    """
    tensors = {"input": input, "weight": weight, "bias": bias}
    for name, t in tensors.items():
        if t is None and name == "bias":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {t.dtype}")
        if t.layout != torch.strided or t.is_nested:
            raise TypeError(f"{name} must be a dense (strided) tensor, got "
                            f"{'a nested tensor' if t.is_nested else t.layout}")
    if input.dim() not in (3, 4):
        raise InvalidArgument("expected 3-D (unbatched) or 4-D (batched) input to "
                              f"conv_transpose2d, got input of shape {tuple(input.shape)}")
    if weight.dim() != 4:
        raise InvalidArgument("expected 4-D weight (in_channels, out_channels/groups, kH, kW), "
                              f"got weight of shape {tuple(weight.shape)}")
    precision = resolve_precision(precision)
    stride, padding, output_padding, groups, dilation = check_arguments(
        stride, padding, output_padding, groups, dilation)
    batched = input if input.dim() == 4 else input.unsqueeze(0)
    n, c_in, h_in, w_in = batched.shape
    if weight.shape[0] != c_in:
        raise InvalidArgument(f"weight of shape {tuple(weight.shape)} expects input with "
                              f"{weight.shape[0]} channels, got input of shape "
                              f"{tuple(input.shape)}")
    c_out = weight.shape[1] * groups
    check_groups(c_in, c_out, groups)
    if bias is not None and tuple(bias.shape) != (c_out,):
        raise InvalidArgument(f"bias must have shape ({c_out},), got {tuple(bias.shape)}")
    if min(weight.shape) < 1 or min(h_in, w_in) < 1:
        raise InvalidArgument(f"weight and input sizes must be positive (batch may be 0), got "
                              f"weight {tuple(weight.shape)} and input {tuple(input.shape)}")
    kernel_size = (weight.shape[2], weight.shape[3])
    check_output_size((h_in, w_in), kernel_size, stride, padding, output_padding, dilation)
    for name, t in tensors.items():  # devices last, so that every other error shows on the CPU
        if t is not None and t.device.type != "cuda":
            raise InvalidArgument(f"{name} must be a CUDA tensor, got a tensor on {t.device}")
        if t is not None and t.device != input.device:
            raise InvalidArgument(f"{name} is on {t.device} but input is on {input.device}")

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

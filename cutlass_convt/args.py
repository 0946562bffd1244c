"""Argument checks of ``conv_transpose2d``: PyTorch's rules, and the problem they describe.

:func:`problem_spec` validates the tensors and size arguments exactly as
``torch.nn.functional.conv_transpose2d`` does (same refusals, as ``TypeError`` or
:class:`InvalidArgument`) and returns the :class:`~cutlass_convt.spec.ProblemSpec` the kernel
choice works on. No GPU work; the scripts use the same checks for their ``--shape`` options.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import os
import sys
import threading
from dataclasses import dataclass

import torch
from torch._prims_common import suggest_memory_format

from . import env
from .spec import PRECISIONS, ProblemSpec, conv_transpose_output_size


class InvalidArgument(ValueError, RuntimeError):
    """An argument value (size, shape, device) that ``conv_transpose2d`` refuses. A
    ValueError, and a RuntimeError like PyTorch's own refusals of these values, so that code
    written for ``torch.nn.functional.conv_transpose2d`` catches it too."""


def _int(value) -> int | None:
    """``value`` as an int if it is an integer other than a bool (numpy integers included).
    Sequences are answered without ``operator.index``'s TypeError, which ``torch.compile``'s
    tracer does not turn into one."""
    if isinstance(value, bool) or isinstance(value, (tuple, list)):
        return None
    if isinstance(value, int):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return None


def _pair(value, name: str) -> tuple[int, int]:
    """An int, or a tuple or list of one or two ints, as an (h, w) pair (PyTorch's ``_pair``).
    Raises TypeError for anything but an int or a tuple or list of ints, and
    :class:`InvalidArgument` for a tuple or list of ints of another length, as PyTorch does
    (its argument parser takes any number of ints; the convolution refuses the length)."""
    if _int(value) is not None:
        return (_int(value), _int(value))
    ints = [_int(v) for v in value] if isinstance(value, (tuple, list)) else [None]
    if None in ints:
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    if len(ints) not in (1, 2):
        raise InvalidArgument(f"expected {name} to be a single int or a list of 2 ints, got "
                              f"{len(ints)} values: {value!r}")
    return (ints[0], ints[-1])


def check_choice(value, name: str, allowed: tuple) -> None:
    """Raise ValueError unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def _prefers_channels_last(t: torch.Tensor) -> bool:
    """PyTorch's ``suggest_memory_format`` rule, with a fast path for unambiguous tensors."""
    if t.is_contiguous() != t.is_contiguous(memory_format=torch.channels_last):
        return not t.is_contiguous()
    return suggest_memory_format(t) is torch.channels_last


@functools.lru_cache(maxsize=None)
def _conv_precision_switches():
    """PyTorch's TF32 switches for convolutions, most specific first (``cudnn.conv``,
    ``cudnn``, the global one), on a PyTorch that has them (2.9 and later), else None."""
    cudnn = torch.backends.cudnn
    conv = getattr(cudnn, "conv", None)
    if conv is None or not hasattr(conv, "fp32_precision"):
        return None
    return conv, cudnn, torch.backends


def torch_conv_tf32() -> bool:
    """Whether PyTorch's own convolutions compute float32 in TF32 now: the first of
    ``torch.backends.cudnn.conv.fp32_precision``, ``cudnn.fp32_precision`` and
    ``torch.backends.fp32_precision`` that is not ``"none"`` says (``"tf32"``; all ``"none"``:
    IEEE), as PyTorch reads them; ``torch.backends.cudnn.allow_tf32`` on a PyTorch without
    them. Never raises for a mix of the legacy and the new switches."""
    getters = _conv_precision_getters()
    if getters is None:
        return torch.backends.cudnn.allow_tf32
    for getter in getters:
        value = getter()
        if value != "none":
            return value == "tf32"
    return False


# The (backend, op) names under which PyTorch's C++ context keeps the switches of
# _conv_precision_switches, in the same order.
_SWITCH_NAMES = (("cuda", "conv"), ("cuda", "all"), ("generic", "all"))


@functools.lru_cache(maxsize=None)
def _conv_precision_getters():
    """Callables reading the switches of :func:`_conv_precision_switches` (None where that is
    None): PyTorch's C++ getter where it answers as the Python attributes do (a fifth of their
    cost: every call reads the switches), else the attributes."""
    switches = _conv_precision_switches()
    if switches is None:
        return None
    getter = getattr(torch._C, "_get_fp32_precision_getter", None)
    if getter is not None and (switches[0].backend, switches[0].op) == _SWITCH_NAMES[0]:
        direct = tuple(functools.partial(getter, *names) for names in _SWITCH_NAMES)
        if all(read() == s.fp32_precision for read, s in zip(direct, switches)):
            return direct
    return tuple(functools.partial(getattr, s, "fp32_precision") for s in switches)


def resolve_precision(precision: str | None) -> str:
    """``"tf32"`` or ``"fp32"``; ``None`` follows PyTorch's TF32 setting for convolutions
    (:func:`torch_conv_tf32`; TF32 by default), as PyTorch's own cuDNN convolutions do. Raises
    ValueError for other values."""
    if precision is None:
        return "tf32" if torch_conv_tf32() else "fp32"
    check_choice(precision, "precision", (*PRECISIONS, None))
    return precision


_PRECISION_LOCK = threading.RLock()


@contextlib.contextmanager
def torch_conv_precision(precision: str):
    """PyTorch's convolutions in ``precision`` (``"tf32"`` or ``"fp32"``) inside the block, the
    process-wide switch restored after: ``cudnn.conv.fp32_precision`` where PyTorch has it
    (setting it never mixes APIs), else ``cudnn.flags(allow_tf32=...)``. The block holds a
    lock, so that threads (the autograd engine's, DataParallel's) never interleave their
    saves and restores of the switch; PyTorch's own convolutions started meanwhile by other
    threads, outside cutlass_convt, still see the block's setting, as with ``cudnn.flags``."""
    with _PRECISION_LOCK:
        switches = _conv_precision_switches()
        if switches is None:
            cudnn = torch.backends.cudnn
            with cudnn.flags(enabled=cudnn.enabled, benchmark=cudnn.benchmark,
                             deterministic=cudnn.deterministic, allow_tf32=precision == "tf32"):
                yield
            return
        conv = switches[0]
        before = conv.fp32_precision
        conv.fp32_precision = "tf32" if precision == "tf32" else "ieee"
        try:
            yield
        finally:
            conv.fp32_precision = before


def output_channels_last(input: torch.Tensor, weight: torch.Tensor) -> bool:
    """PyTorch's memory-format rule for ``conv_transpose2d``'s result: channels_last when the
    weight, or a 4-D input, is channels_last by PyTorch's own judgement of ambiguous strides;
    on CUDA, float64 results are contiguous (cuDNN's rule)."""
    if input.device.type == "cuda" and torch.float64 in (input.dtype, weight.dtype):
        return False
    return _prefers_channels_last(weight) or (input.dim() == 4 and _prefers_channels_last(input))


def check_arguments(stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """``conv_transpose2d``'s size arguments as ``(stride, padding, output_padding, groups,
    dilation)``, each an (h, w) pair of ints but ``groups`` (an int). Raises TypeError
    (values other than ints and tuples or lists of ints) and :class:`InvalidArgument` (tuples
    or lists of ints of a length other than 1 or 2, stride or dilation below 1, negative
    padding, groups below 1, output_padding not smaller than stride or dilation), as PyTorch
    does."""
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


@dataclass(frozen=True)
class Call:
    """A validated ``conv_transpose2d`` call: its size arguments as (h, w) pairs (``groups`` an
    int), the logical (N, C_in, H_in, W_in) input shape (N = 1 for an unbatched input), C_out,
    the kernel size, and whether the result is channels_last (:func:`output_channels_last`)."""

    stride: tuple[int, int]
    padding: tuple[int, int]
    output_padding: tuple[int, int]
    groups: int
    dilation: tuple[int, int]
    in_shape: tuple[int, int, int, int]
    out_channels: int
    kernel_size: tuple[int, int]
    channels_last: bool


def check_call(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
               dilation=1, one_dtype: bool = True) -> Call:
    """Validate ``conv_transpose2d``'s arguments as PyTorch does, for tensors of any dtype on
    any device (of one dtype unless ``one_dtype`` is False: under autocast, whose casts come
    later). No GPU work.

    Raises TypeError (non-tensors, sparse or nested tensors, size arguments other than ints
    and tuples or lists of ints) and :class:`InvalidArgument`, a ValueError and RuntimeError
    (wrong ranks or shapes, size arguments of a length other than 1 or 2, invalid sizes,
    tensors of different dtypes or devices), for the arguments that
    ``torch.nn.functional.conv_transpose2d`` refuses too (with RuntimeError).
    """
    tensors = {"input": input, "weight": weight, "bias": bias}
    for name, t in tensors.items():
        if t is None and name == "bias":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided or t.is_nested:
            raise TypeError(f"{name} must be a dense (strided) tensor, got "
                            f"{'a nested tensor' if t.is_nested else t.layout}")
    if input.dim() not in (3, 4):
        raise InvalidArgument("expected 3-D (unbatched) or 4-D (batched) input to "
                              f"conv_transpose2d, got input of shape {tuple(input.shape)}")
    if weight.dim() != 4:
        raise InvalidArgument("expected 4-D weight (in_channels, out_channels/groups, kH, kW), "
                              f"got weight of shape {tuple(weight.shape)}")
    stride, padding, output_padding, groups, dilation = check_arguments(
        stride, padding, output_padding, groups, dilation)
    n, c_in, h_in, w_in = input.shape if input.dim() == 4 else (1, *input.shape)
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
    for name, t in tensors.items():  # dtypes and devices last, as PyTorch checks them
        if t is not None and t.device != input.device:
            raise InvalidArgument(f"{name} is on {t.device} but input is on {input.device}")
        if one_dtype and t is not None and t.dtype != input.dtype:
            raise InvalidArgument(f"{name} is {t.dtype} but input is {input.dtype}: the "
                                  "tensors must have one dtype")
    return Call(stride, padding, output_padding, groups, dilation, (n, c_in, h_in, w_in),
                c_out, kernel_size, output_channels_last(input, weight))


def problem_spec(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                 dilation=1, precision=None) -> ProblemSpec:
    """Validate ``conv_transpose2d``'s arguments (:func:`check_call`) and describe the problem
    of CUDA tensors (any dtype: the families say which they compute). No GPU work.

    Raises what :func:`check_call` raises, ValueError for an unknown ``precision``, and
    :class:`InvalidArgument` for tensors that are not on a CUDA device.
    """
    call = check_call(input, weight, bias, stride, padding, output_padding, groups, dilation)
    if input.device.type != "cuda":
        raise InvalidArgument(f"a ProblemSpec describes CUDA tensors, got tensors on "
                              f"{input.device}")
    return spec_of_call(call, input, bias is not None, resolve_precision(precision))


def spec_of_call(call: Call, input: torch.Tensor, bias: bool, precision: str) -> ProblemSpec:
    """The :class:`ProblemSpec` of a validated call on CUDA ``input`` (its dtype and its
    device's SM)."""
    n, c_in, h_in, w_in = call.in_shape
    return ProblemSpec(
        batch=n, in_channels=c_in, out_channels=call.out_channels, in_size=(h_in, w_in),
        kernel_size=call.kernel_size, stride=call.stride, padding=call.padding,
        output_padding=call.output_padding, dilation=call.dilation, groups=call.groups,
        bias=bias, channels_last=call.channels_last, precision=precision,
        arch=env.device_arch(input.device.index), dtype=str(input.dtype).removeprefix("torch."),
    )


# Frames a warning skips to name its user's line: this package's, PyTorch's (a module's
# __call__, the dispatcher) and the import machinery's
_INNER = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
          os.path.dirname(os.path.abspath(torch.__file__)) + os.sep, "<frozen ")


def user_stacklevel() -> int:
    """The ``stacklevel`` for ``warnings.warn`` called by this function's caller that names
    the first frame outside this package, PyTorch and the import machinery: the user's call
    (or ``import``) that led there."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_INNER):
        frame, level = frame.f_back, level + 1
    return level

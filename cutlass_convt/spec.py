"""The problem: :class:`ProblemSpec` (frozen, hashable), the output-size arithmetic, and the
limits common to every kernel family.

A transposed convolution ``y = conv_transpose2d(x, W)`` is the data gradient (dgrad) of the
forward convolution whose output gradient is ``x`` and whose filter is ``W``. In CUTLASS's
conv notation (``cutlass::conv::Conv2dProblemSize``):

======================  =================================  ==========================
PyTorch                 CUTLASS dgrad                      layout in the kernel
======================  =================================  ==========================
x (N, C_in, H_in, W_in)   dy, output gradient (N, P, Q, K)     NHWC
W (C_in, C_out, R, S)     filter (K, R, S, C)                  KRSC = ``W.permute(0, 2, 3, 1)``
y (N, C_out, H_out, W_out) dx, activation gradient (N, H, W, C) NHWC
======================  =================================  ==========================

so K = C_in, C = C_out, (P, Q) = (H_in, W_in) and (H, W) = (H_out, W_out); stride, padding and
dilation keep their meaning. Source: CUTLASS example ``34_transposed_conv2d``. The kernel
families (``cutlass_convt/families/``) each read a ``ProblemSpec`` in these terms.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

PRECISIONS = ("tf32", "fp32")
Pair = tuple[int, int]
# bytes of an element, by ProblemSpec.dtype, of the dtypes that some kernel family computes
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def math_name(dtype: str, precision: str) -> str:
    """The math of a kernel in its name: ``precision`` for float32 (``"tf32"``, ``"fp32"``),
    ``"fp16"`` or ``"bf16"`` for 16-bit elements (where ``precision`` has no meaning)."""
    return {"float16": "fp16", "bfloat16": "bf16"}.get(dtype, precision)


def from_json_fields(cls, fields: dict):
    """A ``cls`` dataclass from JSON-decoded fields (lists back to tuples); keys that are not
    fields of ``cls`` are ignored."""
    names = cls.__dataclass_fields__
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()
                  if k in names})


def _exact(value, hint) -> bool:
    """Whether the JSON-decoded ``value`` is exactly of the type ``hint``: a plain type (``int``,
    ``bool``, ``str``: no float or bool for an int), or a list of exact values for a tuple."""
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        if args[-1:] == (Ellipsis,):
            return isinstance(value, list) and all(_exact(v, args[0]) for v in value)
        return (isinstance(value, list) and len(value) == len(args)
                and all(map(_exact, value, args)))
    return type(value) is hint


def exact_fields(cls, fields: dict):
    """:func:`from_json_fields` of ``fields`` (untrusted JSON, a tuning record's) whose values
    are each exactly of their field's annotated type (:func:`_exact`: the plain types and tuples
    of them that problems and configurations use). Raises TypeError naming the first field that
    is not, or where a field is missing."""
    hints = typing.get_type_hints(cls)
    for name, value in fields.items():
        if name in cls.__dataclass_fields__ and not _exact(value, hints[name]):
            hint = hints[name]
            raise TypeError(f"{cls.__name__}.{name} = {value!r} is not of type "
                            f"{hint.__name__ if isinstance(hint, type) else hint}")
    return from_json_fields(cls, fields)


def conv_transpose_output_size(
    in_size: int, kernel_size: int, stride: int, padding: int, output_padding: int, dilation: int
) -> int:
    """Output length of one spatial dimension of a transposed convolution.

    ``(in_size - 1) * stride - 2 * padding + dilation * (kernel_size - 1) + output_padding + 1``,
    the formula of ``torch.nn.ConvTranspose2d``'s documentation.
    """
    return (in_size - 1) * stride - 2 * padding + dilation * (kernel_size - 1) + output_padding + 1


class UnsupportedProblem(NotImplementedError):
    """A kernel family, or every family allowed, cannot compute the problem (the message names
    the reasons), or CUTLASS's ``can_implement`` rejected it."""


INT32_MAX = 2**31 - 1  # the largest size or argument a kernel's C int holds
SHARED_MEMORY_LIMIT = 227 * 1024  # bytes per CTA on sm_90 (the opt-in maximum)


@dataclass(frozen=True)
class ProblemSpec:
    """One transposed-convolution problem as the kernel sees it (PyTorch argument names).

    ``in_size`` is the input's (H_in, W_in); all pairs are (height, width). ``channels_last``
    is the memory format of the result (and of the kernel's view of the input). ``precision``
    is ``"tf32"`` or ``"fp32"``; ``arch`` the GPU's SM version (90 for an H200); ``dtype`` the
    tensors' (PyTorch's name without ``torch.``: ``"float32"``, ``"float16"``, ...).
    """

    batch: int
    in_channels: int
    out_channels: int
    in_size: Pair
    kernel_size: Pair
    stride: Pair
    padding: Pair
    output_padding: Pair
    dilation: Pair
    groups: int
    bias: bool
    channels_last: bool
    precision: str
    arch: int
    dtype: str = "float32"

    @property
    def out_size(self) -> Pair:
        """(H_out, W_out) by :func:`conv_transpose_output_size`."""
        return tuple(  # type: ignore[return-value]
            conv_transpose_output_size(*args)
            for args in zip(self.in_size, self.kernel_size, self.stride, self.padding,
                            self.output_padding, self.dilation)
        )

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        """Logical (N, C_out, H_out, W_out) shape of the result."""
        return (self.batch, self.out_channels, *self.out_size)

    @property
    def in_shape(self) -> tuple[int, int, int, int]:
        """Logical (N, C_in, H_in, W_in) shape of the input."""
        return (self.batch, self.in_channels, *self.in_size)

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        """PyTorch's filter shape, (C_in, C_out / groups, R, S)."""
        return (self.in_channels, self.out_channels // self.groups, *self.kernel_size)

    @property
    def group_channels(self) -> tuple[int, int]:
        """(C_in, C_out) of one group."""
        return self.in_channels // self.groups, self.out_channels // self.groups

    def float32_reasons(self, family: str) -> list[str]:
        """Why ``family``, a family of float32 kernels, cannot compute the problem's dtype
        (empty for float32)."""
        if self.dtype != "float32":
            return [f"{self.dtype} tensors: the {family} family computes float32"]
        return []

    def element_reasons(self, family: str) -> list[str]:
        """Why ``family``, a family of float32, float16 and bfloat16 kernels, cannot compute the
        problem's dtype (empty for those three)."""
        if self.dtype not in ELEMENT_BYTES:
            return [f"{self.dtype} tensors: the {family} family computes float32, float16 and "
                    "bfloat16"]
        return []

    def int32_reasons(self) -> list[str]:
        """Why no kernel family can take the problem's sizes (empty if every family's 32-bit
        integer arguments hold them): every kernel receives the sizes, strides, paddings and
        dilations as C ``int``; larger values would wrap (a stride of 2**32 would reach CUTLASS's
        host code as 0 and divide by zero)."""
        values = (self.batch, self.in_channels, self.out_channels, *self.in_size, *self.out_size,
                  *self.kernel_size, *self.stride, *self.padding, *self.output_padding,
                  *self.dilation)
        if max(values) > INT32_MAX:
            return [f"a size or argument above 2**31 - 1 (stride={self.stride}, padding="
                    f"{self.padding}, dilation={self.dilation}, output {self.out_size}): the "
                    "kernels take 32-bit ints"]
        return []

"""Problem and kernel descriptions: frozen, hashable dataclasses and the size arithmetic.

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
dilation keep their meaning. Source: CUTLASS example ``34_transposed_conv2d``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

PRECISIONS = ("tf32", "fp32")
Pair = tuple[int, int]


def from_json_fields(cls, fields: dict):
    """A ``cls`` dataclass from JSON-decoded fields (lists back to tuples); keys that are not
    fields of ``cls`` are ignored."""
    names = cls.__dataclass_fields__
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()
                  if k in names})


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


@dataclass(frozen=True)
class DgradProblem:
    """A ``cutlass::conv::Conv2dProblemSize`` for dgrad (cross-correlation mode, one split, one
    group), in the order of its 15-integer constructor."""

    N: int
    H: int
    W: int
    C: int
    K: int
    R: int
    S: int
    P: int
    Q: int
    pad_h: int
    pad_w: int
    stride_h: int
    stride_w: int
    dilation_h: int
    dilation_w: int

    def as_tuple(self) -> tuple[int, ...]:
        return dataclasses.astuple(self)


@dataclass(frozen=True)
class DgradLaunch:
    """One kernel launch of a problem: a dgrad problem over one group of channels and one chunk
    of the batch. ``x_strides`` and ``y_strides`` are the (W, H, N) strides in elements of the
    NHWC views of x and y (``cutlass::layout::TensorNHWC``: channels are contiguous; the channel
    slice of one group keeps the full tensors' pixel pitch); the filter is a packed KRSC slice.
    ``offsets`` are the element offsets of the views' first elements in x, the KRSC filter,
    the bias and y."""

    problem: DgradProblem
    x_strides: tuple[int, int, int]
    y_strides: tuple[int, int, int]
    offsets: tuple[int, int, int, int]


# CUTLASS 2.x conv kernels refuse tensors of 2**31 bytes or more (32-bit offsets and strides;
# cutlass/conv/device/implicit_gemm_convolution.h can_implement): larger batches are chunked.
MAX_LAUNCH_BYTES = 2**31
INT32_MAX = 2**31 - 1  # the largest size or argument a kernel's C int holds
SHARED_MEMORY_LIMIT = 227 * 1024  # bytes per CTA on sm_90 (the opt-in maximum)


@dataclass(frozen=True)
class ProblemSpec:
    """One transposed-convolution problem as the kernel sees it (PyTorch argument names).

    ``in_size`` is the input's (H_in, W_in); all pairs are (height, width). ``channels_last``
    is the memory format of the result (and of the kernel's view of the input). ``precision``
    is ``"tf32"`` or ``"fp32"``; ``arch`` the GPU's SM version (90 for an H200). Tensors are
    float32.
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
    def group_channels(self) -> tuple[int, int]:
        """(C_in, C_out) of one group: the dgrad K and C of each launch."""
        return self.in_channels // self.groups, self.out_channels // self.groups

    @property
    def sample_bytes(self) -> int:
        """Bytes of the larger of one input sample and one output sample (float32)."""
        (h_in, w_in), (h_out, w_out) = self.in_size, self.out_size
        return 4 * max(self.in_channels * h_in * w_in, self.out_channels * h_out * w_out)

    def dgrad(self, batch: int | None = None) -> DgradProblem:
        """The CUTLASS dgrad problem of one group over ``batch`` samples (default: all)."""
        (p, q), (r, s), (h, w) = self.in_size, self.kernel_size, self.out_size
        k, c = self.group_channels
        return DgradProblem(
            N=self.batch if batch is None else batch, H=h, W=w, C=c, K=k, R=r, S=s, P=p, Q=q,
            pad_h=self.padding[0], pad_w=self.padding[1],
            stride_h=self.stride[0], stride_w=self.stride[1],
            dilation_h=self.dilation[0], dilation_w=self.dilation[1],
        )

    def dgrad_launches(self) -> tuple[DgradLaunch, ...]:
        """The launches that compute this problem: one per group and per chunk of the batch,
        each chunk under :data:`MAX_LAUNCH_BYTES` (see :meth:`cutlass_unsupported_reasons`)."""
        (h_in, w_in), (h_out, w_out) = self.in_size, self.out_size
        x_strides = (self.in_channels, w_in * self.in_channels, h_in * w_in * self.in_channels)
        y_strides = (self.out_channels, w_out * self.out_channels,
                     h_out * w_out * self.out_channels)
        k, c = self.group_channels
        r, s = self.kernel_size
        chunk = max(1, (MAX_LAUNCH_BYTES - 1) // self.sample_bytes)
        return tuple(
            DgradLaunch(self.dgrad(min(chunk, self.batch - n0)), x_strides, y_strides,
                        (n0 * x_strides[2] + g * k, g * k * r * s * c, g * c,
                         n0 * y_strides[2] + g * c))
            for n0 in range(0, self.batch, chunk) for g in range(self.groups))

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

    def _arch_reasons(self) -> list[str]:
        if self.arch < 80:
            return [f"sm_{self.arch}: the kernels use SM80 tensor-core instructions (mma.sync "
                    "TF32, cp.async) and need sm_80 or later"]
        return []

    def cutlass_unsupported_reasons(self) -> list[str]:
        """Why the dgrad family (CUTLASS 2.x dgrad) cannot compute the problem (empty if it
        can)."""
        reasons = self._arch_reasons()
        if self.stride != (1, 1) and self.dilation != (1, 1):
            reasons.append(f"dilation={self.dilation} with stride={self.stride}: CUTLASS 2.x "
                           "strided dgrad does not support dilation > 1 (can_implement)")
        if max(self.kernel_size) > 32:
            reasons.append(f"kernel_size={self.kernel_size}: CUTLASS dgrad iterators support "
                           "filters up to 32x32")
        if self.sample_bytes >= MAX_LAUNCH_BYTES:
            reasons.append(f"one sample of {self.sample_bytes} bytes: CUTLASS 2.x conv kernels "
                           "need each launch under 2 GiB (32-bit offsets)")
        return reasons


@dataclass(frozen=True)
class KernelConfig:
    """Template configuration of one CUTLASS 2.x implicit-GEMM dgrad kernel: everything that
    changes the binary, and nothing else (the problem's sizes are runtime arguments).

    - ``precision``: ``"tf32"`` (``OpMultiplyAdd`` on float operands: TF32 tensor cores,
      instruction 16x8x8) or ``"fp32"`` (``OpMultiplyAddFastF32``: 3xTF32, fp32-accurate).
    - ``threadblock_shape`` (M, N, K) of the implicit GEMM; ``warp_count`` warps along each;
      ``stages`` of the multistage main loop.
    - ``alignment_a``: elements per access of the input x (divides C_in); ``alignment_c``:
      of the filter and the output (divides C_out).
    - ``stride_support``: ``"unity"`` (stride 1 only) or ``"strided"`` (any stride, with the
      strided-dgrad kernel); ``iterator_algorithm``: ``"optimized"`` or ``"analytic"``;
      ``swizzle``: a ``cutlass_library.SwizzlingFunctor`` name (``Identity1``: the GEMM
      identity swizzle; ``StridedDgradIdentity1``: the one strided dgrad needs).
    - ``arch``: the SM version the cubin is built for (``sm_<arch>``); the kernels are SM80-style
      (``mma.sync``) and run on later GPUs.
    """

    precision: str
    threadblock_shape: tuple[int, int, int]
    warp_count: tuple[int, int, int]
    stages: int
    alignment_a: int
    alignment_c: int
    arch: int
    stride_support: str = "unity"
    iterator_algorithm: str = "optimized"
    swizzle: str = "Identity1"

    @property
    def name(self) -> str:
        """Readable, unique name, e.g.
        ``dgrad_tf32_256x64x16_4x2x1_s4_a4x4_unity_optimized_identity1_sm90``."""
        m, n, k = self.threadblock_shape
        wm, wn, wk = self.warp_count
        return (f"dgrad_{self.precision}_{m}x{n}x{k}_{wm}x{wn}x{wk}_s{self.stages}"
                f"_a{self.alignment_a}x{self.alignment_c}_{self.stride_support}"
                f"_{self.iterator_algorithm}_{self.swizzle.lower()}_sm{self.arch}")


def _alignment(channels: int) -> int:
    """Widest access (4, 2 or 1 floats: at most 16 bytes) that divides a channel count."""
    return next(a for a in (4, 2, 1) if channels % a == 0)


# Threadblock (M, N, K), warps, stages per precision when no tuning record exists, for narrow
# (C_out per group <= 32) and wide outputs: the winners of tune.py's candidates on the
# KernelBench problems on an H200 (docs/perf-notes.md, v0.3): 71 and 78 (C_out = 32) and
# 57, 65, 69 (C_out = 64, 128).
_DEFAULT_TILES = {
    ("tf32", True): ((128, 32, 32), (4, 1, 1), 3),
    ("tf32", False): ((128, 64, 32), (2, 2, 1), 3),
    ("fp32", True): ((256, 32, 16), (4, 1, 1), 3),
    ("fp32", False): ((128, 64, 16), (2, 2, 1), 4),
}


def default_config(spec: ProblemSpec) -> KernelConfig:
    """The untuned kernel configuration for a problem: optimized dgrad (unity-stride kernel for stride 1,
    strided-dgrad kernel otherwise) with the default tile of its precision and output width,
    and the widest accesses one group's channel counts allow."""
    k, c = spec.group_channels
    tile, warps, stages = _DEFAULT_TILES[(spec.precision, c <= 32)]
    unity = spec.stride == (1, 1)
    return KernelConfig(
        precision=spec.precision, threadblock_shape=tile, warp_count=warps, stages=stages,
        alignment_a=_alignment(k), alignment_c=_alignment(c), arch=spec.arch,
        stride_support="unity" if unity else "strided",
        swizzle="Identity1" if unity else "StridedDgradIdentity1",
    )

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

    def fprop_sm90_unsupported_reasons(self) -> list[str]:
        """Why CUTLASS's SM90 fprop kernels (stride 1, as a forward convolution on the flipped
        filter) cannot compute the problem (empty if they can)."""
        reasons = []
        if self.precision != "tf32" or self.arch != 90:
            reasons.append(f"precision={self.precision!r} on sm_{self.arch}: the SM90 kernels "
                           "are TF32 on sm_90 (CUTLASS has 3xTF32 only for SM80-style kernels)")
        if self.stride != (1, 1) or self.dilation != (1, 1) or self.groups != 1:
            reasons.append(f"stride={self.stride}, dilation={self.dilation}, groups="
                           f"{self.groups}: the SM90 fprop route needs 1, 1 and 1")
        if self.in_channels % 4 or self.out_channels % 32:
            reasons.append(f"{self.in_channels} -> {self.out_channels} channels: the SM90 "
                           "kernels need C_in % 4 == 0 (16-byte TMA strides) and C_out % 32 == 0")
        if any(p > k - 1 for p, k in zip(self.padding, self.kernel_size)):
            reasons.append(f"padding={self.padding} > kernel_size - 1: the forward convolution "
                           "would need negative padding")
        if self.bias:
            reasons.append("bias: the SM90 kernels are built without a bias epilogue")
        return reasons

    def direct_unsupported_reasons(self) -> list[str]:
        """Why our own direct-family kernel cannot compute the problem (empty if it can)."""
        reasons = self._arch_reasons()
        if self.stride != (1, 1) or self.dilation != (1, 1) or self.groups != 1:
            reasons.append(f"stride={self.stride}, dilation={self.dilation}, groups="
                           f"{self.groups}: the direct family needs 1, 1 and 1")
        if self.in_channels % 8 or self.out_channels % 8 or (
                self.out_channels > 32 and (self.out_channels % 32 or self.arch != 90)):
            reasons.append(f"{self.in_channels} -> {self.out_channels} channels: the direct "
                           "family needs multiples of 8 and at most 32 output channels (more "
                           "in blocks of 32 on sm_90's wgmma)")
        elif self.precision == "fp32" and self.in_channels > 64:
            # docs/perf-notes.md v0.27: rel. 4.4e-7 to 5.6e-7 at C_in = 64, 0.9e-6 to 1.0e-6 at
            # 128, 1.6e-6 to 1.9e-6 at 256 (the bound is 1e-6)
            reasons.append(f"{self.in_channels} input channels in fp32: the direct family's "
                           "3xTF32 error grows with C_in (a tap's sums over its input channels "
                           "are the tensor cores', rounded toward zero) and passes the 1e-6 "
                           "bound beyond 64")
        elif direct_config(self) is None:
            reasons.append(f"kernel_size={self.kernel_size} with {self.in_channels} x "
                           f"{self.out_channels} channels: no block of the filter fits in "
                           "shared memory beside an input tile (or the tile needs more than "
                           "32 input rows; fp32 on mma.sync: an 8-row tile with 2 stages)")
        return reasons

    def strip_unsupported_reasons(self) -> list[str]:
        """Why the strip family (``templates/strip.cu`` and ``strip_rs.cu``: TMA + wgmma) cannot
        compute the problem (empty if it can)."""
        reasons = []
        if self.arch != 90:
            reasons.append(f"sm_{self.arch}: the strip family is built for sm_90 (TMA, wgmma)")
        if self.precision == "fp32" and self.kernel_size[1] != 3:
            reasons.append(f"precision='fp32' with kernel_size={self.kernel_size}: the strip "
                           "family's 3xTF32 form (strip_rs.cu) is built for 3 x 3 filters")
        if self.stride != (1, 1) or self.dilation != (1, 1) or self.groups != 1:
            reasons.append(f"stride={self.stride}, dilation={self.dilation}, groups="
                           f"{self.groups}: the strip family needs 1, 1 and 1")
        (p, q) = self.out_size
        if not self.channels_last and self.in_size[1] % 4:
            reasons.append(f"NCHW input of width {self.in_size[1]}: the strip family's TMA loads "
                           "need input rows of a multiple of 16 bytes (width % 4 == 0)")
        # the TF32 "ss" form stores NCHW rows with TMA (strip_rs.cu's threads store them)
        if not self.channels_last and self.precision == "tf32" and p * q % 4:
            reasons.append(f"NCHW output planes of {p} x {q}: the strip family's TF32 TMA "
                           "stores need output planes of a multiple of 16 bytes (P x Q % 4 == 0)")
        if (self.in_channels, self.out_channels) != (32, 32) or self.kernel_size[0] != 3:
            reasons.append(f"{self.in_channels} -> {self.out_channels} channels, kernel_size="
                           f"{self.kernel_size}: the strip family is built for 32 -> 32 "
                           "channels (128-byte pixel rows, M = 2 rows x 32) and 3 filter rows")
        elif not reasons and not strip_configs(self):
            reasons.append(f"kernel_size={self.kernel_size}: the filter and the row ring do "
                           "not fit in shared memory")
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


@dataclass(frozen=True)
class FpropSm90Config:
    """Template configuration of one CUTLASS 3.x SM90 convolution kernel (TMA im2col loads,
    warp-specialized wgmma TF32 main loop, TMA epilogue), emitted by ``cutlass_library``'s 3.x
    conv emitter as a forward convolution: a stride-1 transposed convolution is the forward
    convolution of x with the filter flipped and transposed (``W.flip(2, 3).permute(1, 2, 3,
    0)``, KRSC with K = C_out, C = C_in) and padding ``R - 1 - padding``. NHWC tensors.

    - ``tile``: CTA tile (M pixels, N output channels, K input channels); ``cluster``: CTAs per
      cluster (only 1x1x1 is launched); ``stages``: main-loop stages (0: as many as fit).
    """

    precision: str
    tile: tuple[int, int, int]
    cluster: tuple[int, int, int] = (1, 1, 1)
    stages: int = 0
    arch: int = 90

    @property
    def name(self) -> str:
        """E.g. ``fprop_sm90_tf32_128x64x32_c1x1x1_sauto_sm90``."""
        return (f"fprop_sm90_{self.precision}_{'x'.join(map(str, self.tile))}"
                f"_c{'x'.join(map(str, self.cluster))}_s{self.stages or 'auto'}_sm{self.arch}")


def fprop_sm90_configs(spec: ProblemSpec) -> list[FpropSm90Config]:
    """The SM90 fprop candidates for ``spec``, default first: the widest N tile (32, 64 or 128)
    that divides C_out, M = 128 with 4 stages (tuned on problem 71: 0.80 ms against 0.93 ms with
    as many stages as fit, docs/perf-notes.md), then with as many as fit, then M = 256."""
    n = max(t for t in (32, 64, 128) if spec.out_channels % t == 0)
    return [FpropSm90Config(spec.precision, (m, n, 32), (1, 1, 1), stages, spec.arch)
            for m, stages in ((128, 4), (128, 0), (256, 0))]


@dataclass(frozen=True)
class DirectConfig:
    """Template configuration of our own stride-1 kernel (``templates/direct.cu``), which
    reads and writes the caller's layout (no layout passes) and the filter in PyTorch's
    (C_in, C_out, R, S) layout. Channel counts and filter size are compile-time constants;
    batch and image sizes and padding are runtime arguments.

    - ``precision``: ``"tf32"`` (operands rounded to the nearest TF32) or ``"fp32"``
      (3xTF32).
    - ``channels_last``: NHWC in and out, else NCHW in and out.
    - ``in_channels`` (C_in, the GEMM K per tap), ``out_channels`` (C_out), ``kernel_size``
      (R, S).
    - ``out_block``: output channels per CTA (the GEMM N, a multiple of 8 dividing C_out):
      C_out, all of a tile's channels in one CTA, unless the filter does not fit in shared
      memory or C_out > 32 (then blocks of 32 on wgmma); then the grid is C_out /
      ``out_block`` groups of CTAs, each with its block of the filter resident, reading each
      input tile once per block (the later reads from L2).
    - ``tile``: output rows x columns of a tile, which one group of warps computes. mma.sync:
      each warp computes ``warp_tiles_m`` m16 tiles (16 consecutive pixels each) of one row, so
      ``tile[1]`` is a multiple of ``16 * warp_tiles_m``. wgmma: each warpgroup computes
      ``warp_tiles_m`` rows of 64 columns, so ``tile[0]`` is a multiple of ``warp_tiles_m`` and
      ``tile[1]`` of 64.
    - ``stages``: input tiles (with their halo) in shared memory.
    - ``consumers``: groups of warps that compute tiles, each its own tile, taking turns (so one
      group's stores overlap another's math); ``producer_warps``: warps that only load input
      tiles (0: the one group loads its own tiles, ``stages - 1`` ahead).
    - ``vector``: floats per NCHW input load (4: 16 bytes, needs W_in % 4 == 0; or 1).
    - ``math``: ``"wgmma"`` (SM90 warpgroup MMA, blocks of 8, 16 or 32; 3xTF32 as three wgmma per
      step on the filter's big and small parts, both in shared memory; built for
      ``sm_90a``) or ``"mma_sync"`` (``mma.sync``, any SM80+ GPU).
    """

    precision: str
    channels_last: bool
    in_channels: int
    out_channels: int
    kernel_size: Pair
    out_block: int
    tile: Pair = (8, 64)
    warp_tiles_m: int = 4
    stages: int = 2
    vector: int = 4
    arch: int = 90
    math: str = "mma_sync"
    consumers: int = 1
    producer_warps: int = 4

    @property
    def threads(self) -> int:
        """Threads per CTA: the producer warps plus ``consumers`` groups of the warps of a tile."""
        group_warps = self.tile[0] * self.tile[1] // (16 * self.warp_tiles_m)
        return 32 * (self.producer_warps + self.consumers * group_warps)

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory per CTA (bytes): the filter, ``stages`` input tiles with their
        halo, padded as ``direct.cu`` lays them out (it checks this number), the mbarriers
        (a full one per consumer group and stage, an empty one per stage) and (NCHW with wgmma)
        an output row per consumer warpgroup."""
        (r, s), (th, tw) = self.kernel_size, self.tile
        align = 1 if self.channels_last else self.vector
        halo_h, halo_w = th + r - 1, -(-(tw + s - 1 + align - 1) // align) * align
        if self.channels_last:  # wgmma: 8-byte fragment loads need a pitch of C_in + 8
            halo = halo_h * halo_w * (self.in_channels + (8 if self.math == "wgmma" else 4))
        else:
            plane = halo_h * halo_w
            halo = self.in_channels * (plane + (24 - plane % 16) % 16)
        staged = 0  # NCHW with wgmma: one output row per consumer warpgroup
        if self.math == "wgmma" and not self.channels_last:
            warpgroups = self.consumers * self.tile[0] * self.tile[1] // (64 * self.warp_tiles_m)
            staged = warpgroups * self.out_block * 68
        barriers = 8 * (self.consumers + 1) * self.stages  # full per group and stage, empty
        copies = 2 if self.math == "wgmma" and self.precision == "fp32" else 1  # big, small
        filter_ = copies * r * s * self.in_channels * self.out_block
        return 4 * (filter_ + self.stages * halo + staged) + barriers

    @property
    def name(self) -> str:
        """E.g. ``direct_tf32_nchw_c32x32_k3x3_t4x64_m4_s3_g2p4_v4_wgmma_sm90`` (C_out in one
        block) or ``direct_tf32_nchw_c32x32b16_k7x7_...`` (blocks of 16 output channels)."""
        (r, s), (th, tw) = self.kernel_size, self.tile
        block = "" if self.out_block == self.out_channels else f"b{self.out_block}"
        return (f"direct_{self.precision}_{'nhwc' if self.channels_last else 'nchw'}"
                f"_c{self.in_channels}x{self.out_channels}{block}_k{r}x{s}_t{th}x{tw}"
                f"_m{self.warp_tiles_m}_s{self.stages}_g{self.consumers}p{self.producer_warps}"
                f"_v{self.vector}_{self.math}_sm{self.arch}")


@dataclass(frozen=True)
class StripConfig:
    """Template configuration of the strip family: stride 1, C_in = C_out = 32, R = 3, on
    sm_90a, x and y both NCHW or both NHWC (channels_last), persistent CTAs over strips of
    ``tile_n`` output columns, input rows loaded by TMA into a ring. Filter columns S, the
    layout and the tile are compile-time constants; batch, image sizes and padding are runtime
    arguments. Two forms, by ``mma``:

    - ``"ss"`` (``templates/strip.cu``, TF32): both wgmma operands in shared memory, the
      filter as A (M = 2 output rows x 32 channels), the input rows as B (NCHW rows transposed
      in shared memory first);
    - ``"rs"`` (``templates/strip_rs.cu``, S = 3, TF32 or 3xTF32): x as wgmma's A operand from
      registers, read straight from the landed rows (NCHW: no transpose), and the filter as B
      (N = 3 filter rows x 32 channels); two consumer warpgroups of 64 columns each (``tile_n``
      = 128), 6 ring rows, storer warps writing each output row from shared memory
      (docs/perf-notes.md v0.18, v0.19); up to 8 output columns beyond whole strips go to its
      edge kernel (plain fp32 on CUDA cores, launched after it) instead of a last strip that
      overlaps the one before it (:meth:`cutlass_convt.launch.StripKernel.plan`, v0.23).

    Fields:

    - ``kernel_size``: (R, S), R = 3.
    - ``channels_last``: NHWC x and y (TMA loads and stores) or NCHW (TMA loads of
      [channel][pixel] rows; ``"ss"``: per strip and output row, two TMA stores of its body,
      :meth:`store_body` columns of the even and of the odd channels' planes, each from its
      first 32-byte aligned column; strips :attr:`strip_step` apart, the columns before the
      row's first body (up to 7) and after its last from the registers; ``"rs"``: stores by
      the threads);
      the ``"rs"`` form's edge kernel reads and writes the columns beyond whole strips with
      plain loads and stores in either layout.
    - ``tile_n``: output columns per strip (``"ss"``: the N of each ``wgmma`` m64nNk8, 64, 96,
      104, 112 (NCHW) or 128).
    - ``ring``: input rows (:attr:`pixels` x 32 channels) in the ring that the TMA producer
      fills; two pairs of output rows in flight hold 6.
    - ``stage_rows``: output rows per store (2: a pair at once; 1: each row in turn, half the
      staging memory).
    - ``prep_groups``: warpgroups that prepare (round, or transpose) landed input rows besides
      the producer's warps 1-3: 0 or 1 (docs/perf-notes.md v0.14); ``"rs"``: 0.
    - ``register_a`` (``"ss"`` without a preparing warpgroup only): of the 16 S wgmma steps of a
      pair of output rows (input row, filter column s, 8 channels), the first ones whose A
      operand, the filter, the consumers hold in registers (wgmma's RS form; loaded once per
      CTA) instead of reading it from shared memory, the port that binds the kernel; the
      consumers' 208 registers hold 19 without spills at N = 112 (NCHW) and 18 at N = 104
      (channels_last), and spill with 20 in both; the choice takes 18 and 16
      (docs/perf-notes.md v0.30, v0.31).
    - ``precision``: ``"tf32"`` or ``"fp32"`` (3xTF32, ``"rs"`` only).
    - ``mma``: ``"ss"`` or ``"rs"``, above.
    - ``split_all`` (``"rs"`` only): the CTAs split the units (strip, image, pair of output rows)
      of all strips evenly as one sequence, instead of each strip's among as many CTAs per
      strip (``strip_common.cuh``'s ``for_each_run``; docs/perf-notes.md v0.20).

    Raises ValueError for a combination that neither template builds.
    """

    kernel_size: Pair
    channels_last: bool
    tile_n: int = 104
    ring: int = 8
    stage_rows: int = 2
    prep_groups: int = 0
    arch: int = 90
    precision: str = "tf32"
    mma: str = "ss"
    split_all: bool = False
    register_a: int = 0

    def __post_init__(self):
        if self.kernel_size[0] != 3:
            raise ValueError(f"{self}: the strip family's kernels are built for R = 3")
        if self.mma == "rs" and (self.kernel_size[1], self.tile_n, self.ring, self.stage_rows,
                                 self.prep_groups) != (3, 128, 6, 1, 0):
            raise ValueError(f"{self}: the rs form is S = 3, tile_n = 128, ring = 6, "
                             "stage_rows = 1, prep_groups = 0")
        if self.mma not in ("ss", "rs") or self.precision not in PRECISIONS or (
                self.precision == "fp32" and self.mma != "rs"):
            raise ValueError(f"{self}: mma 'ss' (TF32) or 'rs' (TF32 or fp32)")
        if self.split_all and self.mma != "rs":
            raise ValueError(f"{self}: split_all is the rs form's")
        if self.register_a and (self.mma != "ss" or self.prep_groups or
                                not 0 < self.register_a <= 16 * self.kernel_size[1]):
            raise ValueError(f"{self}: register_a is 1 to 16 S, the ss form's without a "
                             "preparing warpgroup")

    @property
    def threads(self) -> int:
        """Threads per CTA: a producer warpgroup, two consumer warpgroups and
        :attr:`prep_groups` preparing warpgroups."""
        return 128 * (3 + self.prep_groups)

    @property
    def strip_step(self) -> int:
        """Output columns from one strip's first to the next one's (``strip_common.cuh``'s
        ``kStripStep``), the last strip ending at Q; ``tile_n`` but for the ``"ss"`` form on
        NCHW, where it is the width of an output row's TMA store bodies, so that the bodies of
        neighbouring strips abut and only a row's two ends are stored from the registers
        (docs/perf-notes.md v0.26). Those bodies start on a 32-byte sector and are whole sectors
        (a multiple of 8 columns, at most ``tile_n`` - 7: v0.28 measured 16-byte offset pieces
        to store 1.6x slower), and as a dense TMA box's rows in shared memory they are 8 or 24
        floats mod 32 wide, so that the consumers' stage writes meet at most 2-way bank
        conflicts: ``tile_n`` - 8, or ``tile_n`` - 16 where ``tile_n`` - 8 is 0 or 16 mod 32
        (104: 88; 112: 104)."""
        if self.mma == "ss" and not self.channels_last:
            width = self.tile_n - 8
            return width if width % 32 in (8, 24) else width - 8
        return self.tile_n

    def strips(self, q: int) -> int:
        """Strips for Q output columns, :attr:`strip_step` apart, the last one ending at Q
        (``strip_common.cuh``'s ``strip_q0``): 1 + ceil((Q - ``tile_n``) / step), or 1 when
        Q <= ``tile_n``. (The rs form with its edge kernel takes floor(Q / ``tile_n``) instead:
        :meth:`cutlass_convt.launch.StripKernel.plan`.)"""
        return 1 + max(0, -(-(q - self.tile_n) // self.strip_step))

    def store_body(self, q: int) -> int:
        """Columns of an NCHW output row that one TMA store of the ``"ss"`` form takes (the
        y map's box, from the strip's first 32-byte aligned column of the row in the even or the
        odd channels' planes, up to 7 columns in): :attr:`strip_step` when Q >= ``tile_n``, else
        (Q - 7) // 8 x 8 up to that; 0 (no y map) for channels_last and the rs form."""
        if self.channels_last or self.mma != "ss":
            return 0
        return max(0, min(self.strip_step, (q - 7) // 8 * 8))

    @property
    def pixels(self) -> int:
        """Columns of a staged input row (``strip_common.cuh``'s ``kPix``): the
        ``tile_n + S - 1`` the wgmmas read (NCHW: 3 more, for TMA boxes that start at multiples
        of 16 bytes; the ``"ss"`` form starts them at 32 bytes where the rounding leaves room),
        rounded up to 8 (1024-byte rows)."""
        extra = 0 if self.channels_last else 3
        return -(-(self.tile_n + self.kernel_size[1] - 1 + extra) // 8) * 8

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory per CTA (bytes), as the template lays it out (and checks).
        ``"ss"``: the filter blocks ((1 + 4 S) x 32 x 32 floats), the ring of ``pixels`` x 32
        floats per row, two output stages of ``stage_rows`` x 32 rows of ``tile_n`` floats
        (NCHW: :attr:`strip_step`, the most a TMA store takes) and three mbarriers per ring row.
        ``"rs"``: the filter (3 S x 32 x 32 floats; 3xTF32: twice, big and small parts), the
        ring, four stages of an output row of 64 columns x 32 channels (NCHW: 68 columns, the
        padding against bank conflicts), two mbarriers per ring row and per stage, and the
        bias (32 floats)."""
        s, pixels = self.kernel_size[1], self.pixels
        if self.mma == "rs":
            filter_ = (2 if self.precision == "fp32" else 1) * 3 * s * 32 * 32
            stage = 32 * (64 if self.channels_last else 68)
            floats = filter_ + self.ring * pixels * 32 + 4 * stage
            return 4 * (floats + 32) + 2 * 8 * (self.ring + 4)
        pitch = self.strip_step
        floats = (1 + 4 * s) * 32 * 32 + self.ring * pixels * 32 + 2 * self.stage_rows * 32 * pitch
        return 4 * floats + 3 * 8 * self.ring

    @property
    def name(self) -> str:
        """E.g. ``strip_tf32_nchw_c32x32_k3x3_n112_r8_o2_p0_a18_sm90``,
        ``strip_tf32_nhwc_c32x32_k3x3_n104_r8_o2_p1_sm90``,
        ``strip_fp32_nchw_c32x32_k3x3_n128_r6_o1_p0_rs_sm90``."""
        r, s = self.kernel_size
        layout = "nhwc" if self.channels_last else "nchw"
        rs = ("_rs" if self.mma == "rs" else "") + ("_all" if self.split_all else "")
        a = f"_a{self.register_a}" if self.register_a else ""
        return (f"strip_{self.precision}_{layout}_c32x32_k{r}x{s}_n{self.tile_n}_r{self.ring}"
                f"_o{self.stage_rows}_p{self.prep_groups}{a}{rs}_sm{self.arch}")


# (tile_n, ring, stage_rows) of the strip family in order of preference, channels_last and NCHW
# (problem 71 on an H200): channels_last N = 104 covers Q = 1026 in 10 strips with 1% waste
# (docs/perf-notes.md v0.8); NCHW strips are StripConfig.strip_step apart, and N = 112 covers it
# in 10 strips 104 apart (9% more columns computed), 3.2-3.3% faster than N = 104 in 12 strips
# 88 apart, 12-13% faster than N = 128 or N = 112 with a ring of 6, and a row per store
# (stage_rows 1) 11-39% slower than a pair (v0.28).
_STRIP_TILES = {True: ((104, 8, 2), (104, 10, 1), (96, 8, 2), (128, 6, 2), (64, 10, 2)),
                False: ((112, 8, 2), (104, 8, 2), (96, 8, 2), (128, 6, 2), (64, 10, 2),
                        (104, 10, 1))}
# StripConfig.register_a of the first tile, channels_last and NCHW (at most 16 S, all steps):
# problem 71 on an H200, interleaved A/B against 0 (docs/perf-notes.md v0.30): NCHW 1.3-1.4%
# (8), 2.5-3.9% (12-14) and 2.7-4.1% (16) faster, 20 (spilling) 2.0-2.9%; channels_last
# 1.7-2.5% faster than a preparing warpgroup without it. Against 16 (v0.31): NCHW 18 0.4-0.8%
# faster in two runs (0.1-0.6% in v0.30's), channels_last 18 1.1-1.2% slower; 20 spills in both.
_REGISTER_A = {True: 16, False: 18}


def strip_configs(spec: ProblemSpec) -> list[StripConfig]:
    """The strip-family configurations for ``spec`` whose shared memory fits, in order of
    preference. Does not check the other limits of
    :meth:`ProblemSpec.strip_unsupported_reasons`.

    TF32: the ``"ss"`` form's tiles. The first without a preparing warpgroup and with A
    fragments in registers for its first steps (``register_a``: channels_last 16, NCHW 18, at
    most 16 S; problem 71, H200, docs/perf-notes.md v0.30: 16 of them NCHW 2.7-4.1% faster than
    none, channels_last 1.7-2.5% faster than a preparing warpgroup without them, v0.14's choice;
    v0.31: NCHW 18 another 0.4-0.8%), then the same tile with a preparing warpgroup
    and without them; the other tiles as v0.14 measured: channels_last with a preparing
    warpgroup (4-5% faster in three of five A/B runs, level in two), NCHW without (2% faster in
    one, 1.3-1.5% slower in three), and no A fragments in registers (with 16, ptxas spills
    at N = 128 and at N = 104 on NCHW; the other tiles not measured with them). With S = 3
    the ``"rs"`` form comes last (problem 71 NCHW: 7-9% slower than the ``"ss"`` default,
    docs/perf-notes.md v0.17).
    fp32 (3xTF32): the ``"rs"`` form alone, S = 3, with both walks: NCHW splitting all strips'
    units first, channels_last each strip's (problem 71, H200, docs/perf-notes.md v0.20: NCHW
    4% faster, channels_last 2.7% slower; TF32 15-26% slower, so TF32 offers only each strip's).
    """
    walks = (not spec.channels_last, spec.channels_last) if spec.precision == "fp32" else (False,)
    rs = [StripConfig(spec.kernel_size, spec.channels_last, 128, 6, 1, 0, spec.arch,
                      spec.precision, "rs", split_all)
          for split_all in (walks if spec.kernel_size[1] == 3 else ())]
    if spec.precision == "fp32":
        return rs
    prep = 1 if spec.channels_last else 0
    preferred = _STRIP_TILES[spec.channels_last]
    tiles = [(n, ring, rows, prep, 0) for n, ring, rows in preferred]
    register_a = min(_REGISTER_A[spec.channels_last], 16 * spec.kernel_size[1])
    tiles[:1] = [(*preferred[0], 0, register_a), (*preferred[0], 1, 0)]
    configs = [StripConfig(spec.kernel_size, spec.channels_last, n, ring, rows, p, spec.arch,
                           register_a=a)
               for n, ring, rows, p, a in tiles]
    return [c for c in configs + rs if c.shared_bytes <= SHARED_MEMORY_LIMIT]


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


SHARED_MEMORY_LIMIT = 227 * 1024  # bytes per CTA on sm_90 (the opt-in maximum)
# Output tile (rows, columns), m tiles per warp, stages, consumer groups and producer warps of
# the direct family, in order of preference per math (the first that fits in shared memory is
# the default): the order of the measured times on problem 71 on an H200 (docs/perf-notes.md,
# v0.6); mma.sync groups load their own tiles, since 3xTF32 needs all 255 registers of 8 warps.
_MMA_SYNC_TILES = (((8, 64), 4, 2, 1, 0), ((8, 64), 2, 2, 1, 0), ((4, 64), 4, 2, 1, 0),
                   ((4, 64), 2, 2, 1, 0), ((2, 64), 2, 2, 1, 0), ((8, 64), 4, 1, 1, 0),
                   ((4, 64), 4, 1, 1, 0), ((4, 64), 2, 1, 1, 0), ((2, 64), 2, 1, 1, 0))
_DIRECT_TILES = {
    ("wgmma", "tf32"): (((4, 64), 4, 3, 2, 4), ((4, 64), 4, 2, 2, 4), ((8, 64), 4, 2, 1, 4),
                        ((2, 64), 2, 4, 2, 4), ((2, 64), 2, 2, 2, 4), ((2, 64), 2, 2, 1, 4),
                        ((2, 64), 2, 1, 1, 4)),
    # 3xTF32: a tap's partial sums double the accumulators, so 2 rows per warpgroup
    ("wgmma", "fp32"): (((4, 64), 2, 2, 1, 4), ((2, 64), 2, 3, 2, 4), ((2, 64), 2, 2, 2, 4),
                        ((2, 64), 2, 2, 1, 4), ((2, 64), 2, 1, 1, 4)),
    ("mma_sync", "tf32"): _MMA_SYNC_TILES,
    ("mma_sync", "fp32"): _MMA_SYNC_TILES,
}


def direct_configs(spec: ProblemSpec) -> list[DirectConfig]:
    """Every direct-family configuration for ``spec`` whose shared memory fits (and whose
    input tile has at most 32 rows), in order of preference: all C_out in one block first, then
    blocks of 16 and 8 output channels (the filter split among CTAs); for each, ``wgmma`` first
    where it applies (SM90, blocks of 8, 16 or 32 channels), then ``mma.sync``. C_out > 32
    (a multiple of 32, SM90): blocks of 32 on ``wgmma`` only (docs/perf-notes.md v0.27).
    16-byte NCHW loads when W_in % 4 == 0. fp32 on ``mma.sync`` only on 8-row tiles with 2 stages: on 4-row
    tiles 3xTF32 was twice as slow as the dgrad family (KernelBench 78: 6.8 ms against 3.5 ms,
    ``docs/perf-notes.md`` v0.5b; 32 -> 24 channels 5 x 5: 2.0 against 1.0 ms, v0.25); on one
    stage it was 9% slower than dgrad in one case and 10% faster in another (v0.25). Does not
    check the other limits of :meth:`ProblemSpec.direct_unsupported_reasons`."""
    vector = 4 if spec.channels_last or spec.in_size[1] % 4 == 0 else 1
    c_out = spec.out_channels
    blocks = ([32] if c_out % 32 == 0 else []) if c_out > 32 else (
        [c_out] + [b for b in (16, 8) if b < c_out and c_out % b == 0])
    configs = [DirectConfig(spec.precision, spec.channels_last, spec.in_channels, c_out,
                            spec.kernel_size, block, tile, m, stages, vector, spec.arch, math,
                            consumers, producer_warps)
               for block in blocks
               for math in ("wgmma", "mma_sync")
               if (math == "mma_sync" and c_out <= 32)
               or (math == "wgmma" and spec.arch == 90 and block in (8, 16, 32))
               for tile, m, stages, consumers, producer_warps
               in _DIRECT_TILES[math, spec.precision]]
    # direct.cu keeps one bit per input row of a tile (at most 32) and a stage per group
    return [c for c in configs if c.shared_bytes <= SHARED_MEMORY_LIMIT
            and c.tile[0] + c.kernel_size[0] - 1 <= 32 and c.stages >= c.consumers
            and not (c.precision == "fp32" and c.math == "mma_sync"
                     and (c.tile[0] < 8 or c.stages < 2))]


def direct_config(spec: ProblemSpec) -> DirectConfig | None:
    """The default direct-family configuration for ``spec``, or None if none fits."""
    return next(iter(direct_configs(spec)), None)

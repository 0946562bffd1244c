"""The phase family: our own TMA + ``wgmma`` kernel for strided transposed convolutions on sm_90
(stride-2/4 upsampling, k = s, k = 2 s, k > s, output padding, dilation, groups; stride 1 too),
by the phase (sub-pixel) decomposition: every output pixel of phase (ph, pw) is a stride-1 sum
over at most :func:`unified_taps` taps of the input grid, and one implicit GEMM computes all
phases of a tile of input-grid positions at once (``templates/phase.cu``).

x is read as NHWC (NCHW through our layout pass); y is
written by the threads in the caller's layout (NCHW or NHWC), bias fused. float32 in TF32 or
3xTF32 (``precision="fp32"``), float16 and bfloat16 in their own ``wgmma`` (float32 sums).
``docs/design/phase.md`` explains the algorithm, its limits and its defaults.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from .. import cuda, emit, program
from ..build import Sources
from ..cuda import MapShape, ParamStruct
from ..spec import (
    ELEMENT_BYTES,
    INT32_MAX,
    PRECISIONS,
    SHARED_MEMORY_LIMIT,
    Pair,
    ProblemSpec,
    from_json_fields,
    math_name,
)
from . import layout
from .base import (
    Family,
    Prepared,
    UnsupportedProblem,
    element_type,
    load,
)

PHASE_SYMBOL = "cutlass_convt_phase_kernel"
FILTER_SYMBOL = "cutlass_convt_phase_filter"
# phase.cu's PhaseParams and FilterParams, passed by value (before the two tensor maps)
PHASE_PARAMS = ParamStruct("PhaseParams", "y bias",
                           "N P Q K K_total s_h s_w pad_h pad_w J0 I0 tiles_j tiles_i tiles_n "
                           "tiles_b chunks G R S exact")
FILTER_PARAMS = ParamStruct("FilterParams", "w b", "G C K R S s_h s_w d_h d_w chunks")
THREADS = 384          # phase.cu's kThreads: two consumer warpgroups and the producer's
TILE_PIXELS = 128      # phase.cu's kM: a tile's phase-grid pixels
FILTER_THREADS = 256   # cutlass_convt_phase_filter's block
TWO_CTA_BYTES = 113 * 1024  # shared memory per CTA that lets two share an SM (228 KB, 1 KB each)
MAP_CACHE_SIZE = 64
# (images, rows, columns) of the phase-grid tile (128 pixels, columns a multiple of 8)
TILES: tuple[tuple[int, int, int], ...] = ((1, 16, 8), (1, 8, 16), (1, 4, 32), (1, 2, 64),
                                           (2, 8, 8), (4, 4, 8), (8, 2, 8), (16, 1, 8))
BLOCK_N_MAX = 128      # the most columns of a default tile
THREE_PASS_CHANNELS = 16  # output channels per group up to which TF32 requests run 3xTF32
WAVE_TILES = 128       # tiles below which the default takes PyTorch's route (~one wave)
SIXTEEN_BIT_CHANNELS = 32  # 16-bit: output channels from which the default takes PyTorch's route


def unified_taps(size: int, stride: int, dilation: int) -> int:
    """Taps per phase along one dimension of a filter of ``size`` elements: tap u of phase ph
    is filter element (u stride + ph) / dilation when that is exact and below ``size``, so
    u < floor((size - 1) dilation / stride) + 1."""
    return (size - 1) * dilation // stride + 1


def tap_element(u: int, phase: int, size: int, stride: int, dilation: int) -> int | None:
    """The filter element that tap ``u`` of ``phase`` multiplies (None: that phase has no such
    tap). Output o, with o + padding = J stride + phase, sums x[J - u] times it."""
    r, rest = divmod(u * stride + phase, dilation)
    return r if rest == 0 and r < size else None


def phase_grid(out: int, padding: int, stride: int) -> tuple[int, int]:
    """(first position, extent) of the phase grid along one dimension: J = (o + padding) //
    stride for the outputs o in [0, out)."""
    first = padding // stride
    return first, (out - 1 + padding) // stride - first + 1


@dataclass(frozen=True)
class PhaseConfig:
    """Template configuration of one phase-family kernel; sizes, stride, padding, dilation and
    groups are runtime arguments.

    - ``taps``: (kTH, kTW), :func:`unified_taps` of each dimension.
    - ``tile``: (images, rows, columns) of phase-grid pixels a CTA computes, 128 in all.
    - ``block_n``: the CTA's GEMM columns (phase x output channel), a multiple of 8 up to 256.
    - ``stages_a`` / ``stages_b``: ring slots of input boxes (per 32 input channels) and of
      filter blocks (per 32 input channels and tap).
    - ``ctas_per_sm``: 1 or 2 (2: 104 registers a consumer thread and :data:`TWO_CTA_BYTES` of
      shared memory); :func:`max_block_n` columns at most.
    - ``precision``: ``"tf32"`` or ``"fp32"`` (3xTF32), float32's math (``"tf32"`` for
      16-bit elements, where it has no meaning); ``nchw_out``: y is NCHW (else NHWC).
    - ``dtype``: the tensors' element type, ``"float32"``, ``"float16"`` or ``"bfloat16"``
      (16-bit: its own ``wgmma``, float32 sums).

    Raises ValueError for a combination the template does not build.
    """

    taps: Pair
    tile: tuple[int, int, int] = (1, 8, 16)
    block_n: int = 128
    stages_a: int = 2
    stages_b: int = 4
    ctas_per_sm: int = 2
    precision: str = "tf32"
    nchw_out: bool = False
    arch: int = 90
    dtype: str = "float32"

    def __post_init__(self):
        images, rows, cols = self.tile
        if images * rows * cols != TILE_PIXELS or cols % 8 or min(self.taps) < 1:
            raise ValueError(f"{self}: a tile of 128 pixels in rows of a multiple of 8, taps >= 1")
        if self.block_n % 8 or not 8 <= self.block_n <= 256:
            raise ValueError(f"{self}: block_n is a multiple of 8 from 8 to 256")
        if self.stages_a < 1 or self.stages_b < 2 or self.ctas_per_sm not in (1, 2):
            raise ValueError(f"{self}: stages_a >= 1, stages_b >= 2, ctas_per_sm 1 or 2")
        if self.precision not in PRECISIONS or self.dtype not in ELEMENT_BYTES:
            raise ValueError(f"{self}: precision is one of {PRECISIONS}, dtype of "
                             f"{tuple(ELEMENT_BYTES)}")
        if self.dtype != "float32" and self.precision != "tf32":
            raise ValueError(f"{self}: 16-bit elements take precision 'tf32' (unused)")
        if self.block_n > max_block_n(self.precision, self.ctas_per_sm):
            raise ValueError(f"{self}: at most {max_block_n(self.precision, self.ctas_per_sm)} "
                             "columns fit the registers")
        if max(self.box) > 256:
            raise ValueError(f"{self}: TMA boxes take at most 256 elements a dimension")

    @property
    def box(self) -> tuple[int, int, int]:
        """(images, rows, columns) of the input box a tile reads per 32 channels: the tile's
        rows and columns + taps - 1."""
        images, rows, cols = self.tile
        return images, rows + self.taps[0] - 1, cols + self.taps[1] - 1

    @property
    def slot_a(self) -> int:
        """Bytes of an input-box slot: 128 a pixel, rounded up to 1024 (the swizzle)."""
        images, rows, cols = self.box
        return -(-images * rows * cols * 128 // 1024) * 1024

    @property
    def slot_b(self) -> int:
        """Bytes of a filter-block slot: ``block_n`` rows of 32 channels (3xTF32: twice)."""
        return (2 if self.precision == "fp32" else 1) * self.block_n * 128

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory per CTA, as phase.cu lays it out (and checks)."""
        return (self.stages_a * self.slot_a + self.stages_b * self.slot_b +
                16 * (self.stages_a + self.stages_b))

    @property
    def name(self) -> str:
        """E.g. ``phase_tf32_nhwc_t2x2_m1x8x16_n128_a2_b8_c1_sm90`` (16-bit: ``phase_bf16_``,
        ``phase_fp16_``)."""
        layout_ = "nchw" if self.nchw_out else "nhwc"
        (th, tw), (images, rows, cols) = self.taps, self.tile
        math = math_name(self.dtype, self.precision)
        return (f"phase_{math}_{layout_}_t{th}x{tw}_m{images}x{rows}x{cols}"
                f"_n{self.block_n}"
                f"_a{self.stages_a}_b{self.stages_b}_c{self.ctas_per_sm}_sm{self.arch}")


def max_block_n(precision: str, ctas_per_sm: int) -> int:
    """The most columns whose accumulators (``block_n`` / 2 registers a thread) fit beside two
    sets of A fragments (3xTF32: four, and a group's products) without spills or serialized
    wgmmas: 232 registers a consumer thread with one CTA an SM, 104 with two (TF32 only;
    phase.cu's kConsumerRegs). Measured with ptxas (nvcc 13.0)."""
    if ctas_per_sm == 2:
        return 32 if precision == "tf32" else 0
    return 256 if precision == "tf32" else 96


def spec_taps(spec: ProblemSpec) -> Pair:
    """(kTH, kTW) of ``spec``."""
    return tuple(unified_taps(k, s, d) for k, s, d in  # type: ignore[return-value]
                 zip(spec.kernel_size, spec.stride, spec.dilation))


def spec_grid(spec: ProblemSpec) -> tuple[Pair, Pair]:
    """((J0, I0), (PJ, QI)): the unified phase grid's origin and extent."""
    rows, cols = (phase_grid(o, p, s) for o, p, s in zip(spec.out_size, spec.padding, spec.stride))
    return (rows[0], cols[0]), (rows[1], cols[1])


def exact_mode(spec: ProblemSpec, block_n: int) -> int:
    """PhaseParams::exact for ``block_n`` columns a tile: 1 (each tile's phase's own grid and
    taps) where the tiles' columns lie in one phase (K % ``block_n`` == 0) at dilation 1, else
    0 (one unified grid: the exact grid's tap counts assume dilation 1)."""
    if spec.group_channels[1] % block_n or spec.dilation != (1, 1):
        return 0
    return 1


def chunk_channels(dtype: str) -> int:
    """Input channels of a 128-byte box row (and of a filter row) of ``dtype``: 32 float32 or
    64 16-bit channels."""
    return 128 // ELEMENT_BYTES[dtype]


def kernel_precision(spec: ProblemSpec) -> str:
    """The precision of the kernels for ``spec``: its own, but 3xTF32 ("fp32") for TF32 with
    at most :data:`THREE_PASS_CHANNELS` output channels per group, where cuDNN runs exact fp32
    (its "TF32" error is fp32's, and the bound is twice PyTorch's error); "tf32" (unused) for
    16-bit elements."""
    if spec.dtype != "float32":
        return "tf32"
    if spec.precision == "tf32" and spec.group_channels[1] <= THREE_PASS_CHANNELS:
        return "fp32"
    return spec.precision


def grid_extent(spec: ProblemSpec, exact: int) -> Pair:
    """Rows and columns of the phase grid that tiles cover: the unified grid's, or with an
    exact grid the most any phase has, ceil(P / s_h) x ceil(Q / s_w)."""
    if exact:
        return tuple(-(-o // s) for o, s in zip(spec.out_size, spec.stride))  # type: ignore
    return spec_grid(spec)[1]


def columns(spec: ProblemSpec) -> int:
    """GEMM columns of one group: s_h s_w output channels."""
    return spec.stride[0] * spec.stride[1] * spec.group_channels[1]


def tile_grid(spec: ProblemSpec, config: PhaseConfig) -> tuple[int, int, int, int]:
    """PhaseParams' (tiles_j, tiles_i, tiles_n, tiles_b) of ``config`` for ``spec``: tiles of
    the grid's rows and columns, column blocks, image blocks (per group)."""
    pj, qi = grid_extent(spec, exact_mode(spec, config.block_n))
    images, rows, cols = config.tile
    return (-(-pj // rows), -(-qi // cols), -(-columns(spec) // config.block_n),
            -(-spec.batch // images))


def tile_count(spec: ProblemSpec, config: PhaseConfig) -> int:
    """Tiles of ``config``'s grid for ``spec`` (all groups): the CTAs' work items."""
    tiles_j, tiles_i, tiles_n, tiles_b = tile_grid(spec, config)
    return tiles_j * tiles_i * tiles_n * tiles_b * spec.groups


def _fitted(config: PhaseConfig) -> PhaseConfig | None:
    """``config`` with the most filter slots (up to 8, at least 2) that fit its CTAs per SM,
    with two input slots, else one; with two CTAs an SM, else one; None when nothing
    fits."""
    for ctas in ((2, 1) if config.ctas_per_sm == 2 else (1,)):
        budget = TWO_CTA_BYTES if ctas == 2 else SHARED_MEMORY_LIMIT
        for stages_a in (config.stages_a, 1):
            for stages_b in range(8, 1, -1):
                fitted = dataclasses.replace(config, ctas_per_sm=ctas, stages_a=stages_a,
                                             stages_b=stages_b)
                if fitted.shared_bytes <= budget:
                    return fitted
    return None


def default_tile(spec: ProblemSpec, taps: Pair, block_n: int) -> tuple[int, int, int]:
    """The tile of :data:`TILES` computing the fewest padded pixels of the grid
    (:func:`grid_extent`), with the input box's halo as a quarter-weight tie-breaker (wider
    rows first on ties)."""
    pj, qi = grid_extent(spec, exact_mode(spec, block_n))

    def cost(tile) -> float:
        images, rows, cols = tile
        tiles = -(-spec.batch // images) * -(-pj // rows) * -(-qi // cols)
        box = images * (rows + taps[0] - 1) * (cols + taps[1] - 1)
        return tiles * (TILE_PIXELS + 0.25 * (box - TILE_PIXELS)) - cols * 1e-6
    return min(TILES, key=cost)


def default_block_n(spec: ProblemSpec, cap: int = BLOCK_N_MAX) -> int:
    """Columns a tile: with at least 64 output channels a multiple of 8, the most up to ``cap``
    that divide them (a tile in one phase: :func:`exact_mode`); else the columns split evenly
    into the fewest tiles of at most ``cap``, rounded up to 8."""
    k = spec.group_channels[1]
    if k % 8 == 0 and k >= 64:
        return max(b for b in range(8, min(cap, k) + 1, 8) if k % b == 0)
    ncols = columns(spec)
    tiles = -(-ncols // cap)
    return -(-(-(-ncols // tiles)) // 8) * 8


def phase_configs(spec: ProblemSpec) -> list[PhaseConfig]:
    """The candidate configurations for ``spec`` that fit, the default first: the
    :func:`default_tile` with :func:`default_block_n` columns (two CTAs an SM where those are
    at most 32 in TF32, else one), then the other tiles, then at most 256 (TF32) and at most
    32 columns."""
    taps = spec_taps(spec)
    nchw = not spec.channels_last
    precision = kernel_precision(spec)
    cap = max_block_n(precision, 1)
    first_n = default_block_n(spec, min(cap, BLOCK_N_MAX))
    first = default_tile(spec, taps, first_n)
    wanted = [(t, first_n) for t in [first] + [t for t in TILES if t != first]]
    wanted += [(first, default_block_n(spec, cap)), (first, default_block_n(spec, 32))]
    found: list[PhaseConfig] = []
    for tile, block_n in wanted:
        if max(tile[1] + taps[0] - 1, tile[2] + taps[1] - 1) > 256:  # a TMA box dimension
            continue
        ctas = 2 if block_n <= max_block_n(precision, 2) else 1
        config = PhaseConfig(taps, tile, block_n, 2, 2, ctas, precision, nchw, spec.arch,
                             spec.dtype)
        fitted = _fitted(config)
        if fitted is not None and fitted not in found:
            found.append(fitted)
    return found


@dataclass(frozen=True)
class PhasePlan:
    """One problem for a phase-family kernel: the PhaseParams and FilterParams ints (packed),
    the grids, the tensor-map shapes of x and of the prepared filter, its elements (all
    parts), and the layout passes (NCHW float32 x)."""

    sizes: bytes
    filter_sizes: bytes
    grid: tuple[int, int, int]
    filter_grid: int
    x_map: MapShape
    b_map: MapShape
    filter_elements: int
    passes: layout.LayoutKernels


class PhaseKernel:
    """One built phase-family kernel (and its filter preparation) in this process."""

    def __init__(self, artifact):
        self.artifact = artifact
        self.config = from_json_fields(PhaseConfig, artifact.manifest["config"])
        self._library = cuda.Library(artifact.cubin.read_bytes())
        self._maps = cuda.TensorMaps(MAP_CACHE_SIZE, self.config.dtype)

    def plan(self, spec: ProblemSpec, device: int) -> PhasePlan:
        """Sizes, grids and tensor-map shapes for ``spec`` (a problem the configuration is
        built for: :meth:`PhaseFamily.bound_fields`): a persistent grid of as many CTAs as are
        resident at once on ``device`` (at most one a tile). Raises
        :class:`UnsupportedProblem` when the tiles exceed a 32-bit index or no CTA fits on an
        SM of ``device``."""
        config = self.config
        (c, k), g = spec.group_channels, spec.groups
        (h, w), (p, q), n = spec.in_size, spec.out_size, spec.batch
        (j0, i0), _ = spec_grid(spec)
        exact = exact_mode(spec, config.block_n)
        images = config.tile[0]
        chunk, size = chunk_channels(config.dtype), ELEMENT_BYTES[config.dtype]
        chunks = -(-c // chunk)
        ncols = columns(spec)
        tiles, total = tile_grid(spec, config), tile_count(spec, config)
        resident = self._library.resident_ctas(PHASE_SYMBOL, THREADS, config.shared_bytes,
                                               device)
        if resident < 1:
            raise UnsupportedProblem(f"{config.name} does not fit on an SM of device {device}")
        if total + resident > INT32_MAX:  # the walk adds the grid to a tile index
            raise UnsupportedProblem(f"{config.name}: {total} tiles exceed the kernel's 32-bit "
                                     "tile index")
        self._library.kernel(FILTER_SYMBOL, device)  # loaded now, not during a graph capture
        sizes = (n, p, q, k, k * g, *spec.stride, *spec.padding, j0, i0, *tiles, chunks, g,
                 *spec.kernel_size, exact)
        taps = config.taps[0] * config.taps[1]
        kd = taps * chunks * chunk
        parts = 2 if config.precision == "fp32" else 1
        per_part = g * ncols * kd
        _, box_h, box_w = config.box
        channel = c * g * size  # bytes of a pixel
        x_map = ((c, g, w, h, n), (c * size, channel, w * channel, h * w * channel),
                 (chunk, 1, box_w, box_h, images), 128, 256)
        b_map = ((kd, ncols, g, parts), (kd * size, ncols * kd * size, per_part * size),
                 (chunk, config.block_n, 1, 1), 128, 256)
        filter_sizes = (g, c, k, *spec.kernel_size, *spec.stride, *spec.dilation, chunks)
        filter_grid = min(-(-per_part // FILTER_THREADS), 65535)
        return PhasePlan(PHASE_PARAMS.pack_ints(*sizes), FILTER_PARAMS.pack_ints(*filter_sizes),
                         (min(total, resident), 1, 1), filter_grid, x_map, b_map,
                         parts * per_part, layout.kernels(spec.arch))

    def run(self, plan: PhasePlan, device: int, ex, x: int, weight: int, bias: int,
            y: int, b: int) -> None:
        """Launch through ``ex`` on ``device``: the filter preparation into ``b``
        (``plan.filter_elements`` elements), then the kernel. ``x`` packed NHWC at a 16-byte
        aligned address, ``weight`` PyTorch's packed (C_in, C_out / groups, R, S), ``bias``
        (C_out,) or 0, ``y`` packed in the configuration's layout."""
        config = self.config
        ex.launch(self._library.kernel(FILTER_SYMBOL, device), (plan.filter_grid, 1, 1),
                  FILTER_THREADS, 0, program.params((weight, b), plan.filter_sizes))
        kernel = self._library.kernel(PHASE_SYMBOL, device, config.shared_bytes)
        ex.launch(kernel, plan.grid, THREADS, config.shared_bytes,
                  program.params((y, bias), plan.sizes), ex.tensor_map(self._maps, x, plan.x_map),
                  ex.tensor_map(self._maps, b, plan.b_map))


def config_h(config: PhaseConfig) -> str:
    """``config.h`` of a phase-family kernel: its template constants."""
    (th, tw), (images, rows, cols) = config.taps, config.tile
    constants = {"kTN": images, "kBH": rows, "kBW": cols, "kTH": th, "kTW": tw,
                 "kBN": config.block_n, "kStagesA": config.stages_a, "kStagesB": config.stages_b,
                 "kMinBlocks": config.ctas_per_sm, "kSharedBytes": config.shared_bytes}
    return emit.config_header(config.name, constants, {"kThreePass": config.precision == "fp32",
                                                       "kNchwOut": config.nchw_out,
                                                       "kHalf": config.dtype == "float16",
                                                       "kBf16": config.dtype == "bfloat16"})


class PhaseFamily(Family):
    name = "phase"
    config_class = PhaseConfig
    summary = ("any stride, padding, output padding, dilation and groups with input channels "
               "per group a multiple of 4 (16-bit: 8); float32, float16, bfloat16; sm_90",
               "our TMA + wgmma phase-decomposition kernel (`phase.cu`): all phases of a tile "
               "in one implicit GEMM, bias fused, y in the caller's layout (NCHW x through "
               "our layout pass)")

    def supports_arch(self, arch: int) -> bool:
        return arch == 90

    def demoted(self, spec: ProblemSpec) -> bool:
        """Stride 1: the stride-1 families (or PyTorch) first; in TF32 they, or PyTorch,
        measured faster on KernelBench 57, 65, 69, 71 and 78 (``docs/design/phase.md``,
        "Against PyTorch"), in fp32 the phase family was measured on too few stride-1 classes
        to take them over."""
        return spec.stride == (1, 1)

    def torch_preferred(self, spec: ProblemSpec) -> bool:
        """The classes where PyTorch's implementation measured faster than the default
        configuration on the benchmark set (``docs/design/phase.md``, "Against PyTorch"):
        at most 4 output channels per group with 9 or more taps a phase (FSRCNN), in either
        precision; in TF32 on NCHW an odd filter with 512 or more input channels per group
        (StyleGAN's k3 s2), a column stride of 4 or more (the epilogue's single floats that
        far apart: DPT, KernelBench 81) and at most 4 output channels per group (DCGAN's last
        layer, in 3xTF32: :func:`kernel_precision`); in TF32 on channels_last every class but
        fewer than 32 output channels per group, k = 2 s with 256 or more, and k = s with at
        most 64, where cuDNN's NHWC kernels are the faster. In TF32 in either layout, fewer
        than :data:`WAVE_TILES` tiles (batch-1 and 4 x 4 to 16 x 16 layers: most SMs idle
        while each CTA runs its tile's K alone): PyTorch's route was faster on the GPU on 10 of
        14 such layers and on the host on all (``docs/design/phase.md``). 16-bit elements:
        :data:`SIXTEEN_BIT_CHANNELS` or more output channels (in all groups), or fewer than
        :data:`WAVE_TILES` tiles (cuDNN's 16-bit kernels were faster on 40 of the benchmark
        set's 46 rows, all with 64 or more, KernelBench 75's 4 groups of 16 among them; ours
        1.2-8.5x faster on the 6 with 1, 3 and 17)."""
        (c, k), taps = spec.group_channels, spec_taps(spec)
        configs = phase_configs(spec)
        below_wave = bool(configs) and tile_count(spec, configs[0]) < WAVE_TILES
        if spec.dtype != "float32":
            return spec.out_channels >= SIXTEEN_BIT_CHANNELS or below_wave
        if k <= 4 and taps[0] * taps[1] >= 9:
            return True
        if spec.precision != "tf32":
            return False
        if below_wave:
            return True
        (r, s), stride = spec.kernel_size, spec.stride
        if not spec.channels_last:
            return (r % 2 == 1 and c >= 512) or stride[1] >= 4 or k <= 4
        k_is_s = (r, s) == stride and spec.padding == (0, 0)
        k_is_2s = (r, s) == (2 * stride[0], 2 * stride[1])
        return not (k < 32 or (k_is_2s and k >= 256) or (k_is_s and k <= 64))

    def unsupported_reasons(self, spec: ProblemSpec) -> list[str]:
        reasons = spec.element_reasons("phase")
        if spec.arch != 90:
            reasons.append(f"sm_{spec.arch}: the phase family is built for sm_90 (TMA, wgmma)")
        c, _ = spec.group_channels
        if columns(spec) > INT32_MAX:
            reasons.append(f"{columns(spec)} columns (stride x stride x output channels per "
                           "group): the kernel takes them as a 32-bit int")
        multiple = 16 // ELEMENT_BYTES.get(spec.dtype, 4)
        if c % multiple:
            reasons.append(f"{c} input channels per group: the phase family's TMA loads of "
                           f"{spec.dtype} need a multiple of {multiple} (16-byte strides)")
        if not reasons and not phase_configs(spec):
            reasons.append(f"kernel_size={spec.kernel_size}, stride={spec.stride}, dilation="
                           f"{spec.dilation}: {spec_taps(spec)} taps a phase; the input box "
                           "and two filter slots do not fit in shared memory")
        return spec.int32_reasons() + reasons

    def candidates(self, spec: ProblemSpec) -> list[PhaseConfig]:
        return phase_configs(spec)

    def bound_fields(self, spec: ProblemSpec) -> dict[str, object]:
        return {"arch": spec.arch, "dtype": spec.dtype, "taps": spec_taps(spec),
                "nchw_out": not spec.channels_last, "precision": kernel_precision(spec)}

    def sources(self, config: PhaseConfig) -> Sources:
        return Sources("phase.cu", (PHASE_SYMBOL, FILTER_SYMBOL),
                       includes=("common.cuh", "element.cuh"),
                       header="config.h", emit=functools.partial(config_h, config),
                       emitters=(config_h, emit.config_header), arch=f"{config.arch}a")

    def builds(self, config):
        return ((config, self.sources(config)), layout.build_of(config.arch))

    def prepare(self, spec, config, device):
        kernel = load(self, config, PhaseKernel)
        return Prepared(spec, config, self, kernel, kernel.plan(spec, device), device)

    def run(self, prepared, ex, input, weight, bias):
        """x as packed NHWC (packed NCHW through our layout pass), y new in the problem's
        memory format. One scratch allocation a call holds the prepared filter and, for the
        layout pass, x's NHWC copy before it (rounded up to 128 bytes: the filter's TMA
        address)."""
        spec, plan, device = prepared.spec, prepared.plan, prepared.device
        nchw = input.is_contiguous() and not input.is_contiguous(
            memory_format=torch.channels_last)
        x = input if nchw else ex.packed(input, 16, torch.channels_last)
        dtype, size = element_type(spec), x.element_size()
        row = 128 // size
        x_elements = -(-x.numel() // row) * row if nchw else 0
        scratch = ex.new_empty(x, x_elements + plan.filter_elements)
        workspace = ex.address("workspace", scratch, (x_elements + plan.filter_elements,), dtype,
                               16)
        if nchw:  # x's NHWC copy first, the filter 128-byte aligned after it
            n, c, h, w = x.shape
            plan.passes.transpose(ex, True, ex.address("x", x, spec.in_shape, dtype, size),
                                  workspace, n, c, h * w, device, size)
            x_address = workspace
        else:
            x_address = ex.address("x", x, spec.in_shape, dtype, 16, True)
        weight = ex.packed(weight, 1, torch.contiguous_format)
        out_shape = spec.out_shape
        y = ex.new_packed(x, out_shape, spec.channels_last)
        bias_address = (ex.address("bias", ex.packed(bias, 1, torch.contiguous_format),
                                   (spec.out_channels,), dtype, size) if spec.bias else 0)
        prepared.kernel.run(plan, device, ex, x_address,
                            ex.address("weight", weight, spec.weight_shape, dtype, size),
                            bias_address,
                            ex.address("y", y, out_shape, dtype, 16, spec.channels_last),
                            workspace + size * x_elements)
        return y


FAMILY = PhaseFamily()

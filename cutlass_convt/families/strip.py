"""The strip family: our own TMA + ``wgmma`` kernels for stride 1, 32 -> 32 channels and 3
filter rows on sm_90 (KernelBench 71's class), on the caller's layout (NCHW or channels_last)
and PyTorch's filter as it is.

Persistent CTAs, one per SM, walk vertical strips of ``tile_n`` output columns, a pair of output
rows at a time; a producer warp loads input rows by TMA into a ring, consumer warpgroups run
``wgmma`` on them, and the output leaves by TMA stores (NCHW ``strip_rs.cu``: by the threads).
Two forms (:attr:`StripConfig.mma`): ``"ss"`` (``templates/strip.cu``, TF32, the filter as A and
the input rows as B, both from shared memory) and ``"rs"`` (``templates/strip_rs.cu``, S = 3,
TF32 or 3xTF32, float16 or bfloat16, x as A from registers, the filter as B);
``strip_common.cuh`` holds what they share. ``docs/design/strip.md`` explains the algorithm,
its limits and its defaults.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .. import cuda, emit, program
from ..build import Sources
from ..cuda import MapShape, ParamStruct
from ..spec import (
    ELEMENT_BYTES,
    PRECISIONS,
    SHARED_MEMORY_LIMIT,
    Pair,
    ProblemSpec,
    from_json_fields,
    math_name,
)
from .base import CallerLayoutFamily, UnsupportedProblem

STRIP_SYMBOL = "cutlass_convt_strip_kernel"
STRIP_EDGE_SYMBOL = "cutlass_convt_strip_edge_kernel"  # strip_rs.cu: columns beyond the strips
# strip_common.cuh's StripParams, passed by value before the two tensor maps
STRIP_PARAMS = ParamStruct("StripParams", "w bias y",
                           "N H W P Q pad_h pad_w strips pairs body")
# The most output columns beyond whole strips that strip_rs.cu's edge kernel takes (a kernel on
# CUDA cores whose time grows with them) rather than a last strip overlapping the one before.
EDGE_COLUMNS = 8
# strip_rs.cu's kEdgeThreads (per block) and kEdgePixels (output pixels a block takes at once)
EDGE_THREADS, EDGE_PIXELS = 128, 32
# Edge blocks that fit on an SM beside each other (their register use, 130-148 a thread).
EDGE_BLOCKS_PER_CTA = 3
MAP_CACHE_SIZE = 64  # tensor maps kept per kernel, by (address, shape)
RS_RINGS = (6, 16)  # the rs form's ring rows, least and most


@dataclass(frozen=True)
class StripConfig:
    """Template configuration of one strip-family kernel. Filter columns S, the layout and the
    tile are compile-time constants; batch, image sizes and padding are runtime arguments.

    - ``kernel_size``: (R, S), R = 3.
    - ``channels_last``: NHWC x and y (TMA loads and stores), else NCHW x and y (TMA loads of
      [channel][pixel] rows; ``"ss"``: per strip and output row two TMA stores of its body,
      :meth:`store_body` columns of the even and of the odd channels' planes, each from its
      first 32-byte aligned column, strips :attr:`strip_step` apart, the columns outside the
      bodies from the registers; ``"rs"``: stores by the threads).
    - ``tile_n``: output columns per strip (``"ss"``: the N of each ``wgmma`` m64nNk8: 64, 96,
      104, 112 or 128; ``"rs"``: 128, two consumer warpgroups of 64 columns).
    - ``ring``: input rows (:attr:`pixels` x 32 channels) in the ring that the TMA producer
      fills; two pairs of output rows in flight hold 6.
    - ``stage_rows``: output rows per store (2: a pair at once; 1: each row in turn, half the
      staging memory).
    - ``prep_groups``: warpgroups that prepare (round, or transpose) landed input rows besides
      the producer's warps 1-3: 0 or 1; ``"rs"``: 0.
    - ``register_a`` (``"ss"`` without a preparing warpgroup): of the 16 S ``wgmma`` steps of a
      pair of output rows (input row, filter column, 8 channels), the first ones whose A
      operand, the filter, the consumers hold in registers (loaded once per CTA) instead of
      reading it from shared memory, the port that binds the kernel; at most 16 S.
    - ``precision``: ``"tf32"`` or ``"fp32"`` (3xTF32, ``"rs"`` only), float32's math
      (``"tf32"`` for 16-bit elements, where it has no meaning); ``mma``: the form.
    - ``split_all`` (``"rs"`` only): the CTAs split the units (strip, image, pair of output
      rows) of all strips evenly as one sequence, instead of each strip's among as many CTAs
      per strip (``strip_common.cuh``'s ``for_each_run``).
    - ``dtype``: the tensors' element type, ``"float32"``, or (``"rs"`` only) ``"float16"`` or
      ``"bfloat16"`` (their ``wgmma`` k16, float32 sums).

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
    dtype: str = "float32"

    def __post_init__(self):
        if self.kernel_size[0] != 3:
            raise ValueError(f"{self}: the strip family's kernels are built for R = 3")
        if self.mma == "rs" and ((self.kernel_size[1], self.tile_n, self.stage_rows,
                                  self.prep_groups) != (3, 128, 1, 0)
                                 or not RS_RINGS[0] <= self.ring <= RS_RINGS[1]):
            raise ValueError(f"{self}: the rs form is S = 3, tile_n = 128, ring = "
                             f"{RS_RINGS[0]} to {RS_RINGS[1]}, stage_rows = 1, prep_groups = 0")
        if self.mma == "rs" and self.shared_bytes > SHARED_MEMORY_LIMIT:
            raise ValueError(f"{self}: {self.shared_bytes} bytes of shared memory, above "
                             f"{SHARED_MEMORY_LIMIT}")
        if self.mma not in ("ss", "rs") or self.precision not in PRECISIONS or (
                self.precision == "fp32" and self.mma != "rs"):
            raise ValueError(f"{self}: mma 'ss' (TF32) or 'rs' (TF32 or fp32)")
        if self.split_all and self.mma != "rs":
            raise ValueError(f"{self}: split_all is the rs form's")
        if self.dtype not in ELEMENT_BYTES or (self.dtype != "float32" and (
                self.mma != "rs" or self.precision != "tf32")):
            raise ValueError(f"{self}: dtype is one of {tuple(ELEMENT_BYTES)}; 16-bit elements "
                             "are the rs form's, with precision 'tf32' (unused)")
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
        ``kStripStep``), the last strip ending at Q. ``tile_n``, but for the ``"ss"`` form on
        NCHW: there it is the width of an output row's TMA store bodies, so that the bodies of
        neighbouring strips abut and only a row's two ends are stored from the registers. A
        body starts on a 32-byte sector and is whole sectors (a multiple of 8 columns, at most
        ``tile_n`` - 7), and as a dense TMA box's rows in shared memory it is 8 or 24 floats
        mod 32 wide, so that the consumers' stage writes meet at most 2-way bank conflicts:
        ``tile_n`` - 8, or ``tile_n`` - 16 where ``tile_n`` - 8 is 0 or 16 mod 32 (104: 88;
        112: 104)."""
        if self.mma == "ss" and not self.channels_last:
            width = self.tile_n - 8
            return width if width % 32 in (8, 24) else width - 8
        return self.tile_n

    def strips(self, q: int) -> int:
        """Strips for Q output columns, :attr:`strip_step` apart, the last one ending at Q
        (``strip_common.cuh``'s ``strip_q0``): 1 + ceil((Q - ``tile_n``) / step), or 1 when
        Q <= ``tile_n``. (The rs form with its edge kernel takes floor(Q / ``tile_n``):
        :meth:`StripKernel.plan`.)"""
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
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[self.dtype]

    @property
    def pixels(self) -> int:
        """Columns of a staged input row (``strip_common.cuh``'s ``kPix``): the
        ``tile_n + S - 1`` the wgmmas read (NCHW: 16 bytes - 1 element more, for TMA boxes that
        start at multiples of 16 bytes, the ``"ss"`` form's at 32 bytes where the rounding leaves
        room; 16-bit NCHW one more, the words of two columns it reads), rounded up to 8; 16-bit
        NCHW then to 8 or 24 mod 32 (its A loads' banks)."""
        sixteen = self.element_bytes == 2
        extra = 0 if self.channels_last else 16 // self.element_bytes - 1 + sixteen
        pixels = -(-(self.tile_n + self.kernel_size[1] - 1 + extra) // 8) * 8
        return pixels + 8 if sixteen and not self.channels_last and pixels % 16 == 0 else pixels

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory per CTA (bytes), as the template lays it out (and checks).
        ``"ss"``: the filter blocks ((1 + 4 S) x 32 x 32 floats), the ring of ``pixels`` x 32
        floats per row, two output stages of ``stage_rows`` x 32 rows of ``tile_n`` floats
        (NCHW: :attr:`strip_step`, the most a TMA store takes) and three mbarriers per ring row.
        ``"rs"``: the filter (3 S x 32 x 32 elements; 3xTF32: twice, big and small parts), the
        ring, four stages of an output row of 64 columns x 32 channels (NCHW: 68 columns, 16-bit
        72, the padding against bank conflicts), two mbarriers per ring row and per stage, and
        the bias (32 floats)."""
        s, pixels = self.kernel_size[1], self.pixels
        if self.mma == "rs":
            filter_ = (2 if self.precision == "fp32" else 1) * 3 * s * 32 * 32
            pitch = 64 + (8 if self.element_bytes == 2 else 4)
            stage = 32 * (64 if self.channels_last else pitch)
            elements = filter_ + self.ring * pixels * 32 + 4 * stage
            return self.element_bytes * elements + 4 * 32 + 2 * 8 * (self.ring + 4)
        pitch = self.strip_step
        floats = (1 + 4 * s) * 32 * 32 + self.ring * pixels * 32 + 2 * self.stage_rows * 32 * pitch
        return 4 * floats + 3 * 8 * self.ring

    @property
    def name(self) -> str:
        """E.g. ``strip_tf32_nchw_c32x32_k3x3_n112_r8_o2_p0_a18_sm90``,
        ``strip_tf32_nhwc_c32x32_k3x3_n104_r8_o2_p1_sm90``,
        ``strip_fp32_nchw_c32x32_k3x3_n128_r6_o1_p0_rs_sm90`` (16-bit: ``strip_bf16_``,
        ``strip_fp16_``)."""
        r, s = self.kernel_size
        layout = "nhwc" if self.channels_last else "nchw"
        rs = ("_rs" if self.mma == "rs" else "") + ("_all" if self.split_all else "")
        a = f"_a{self.register_a}" if self.register_a else ""
        math = math_name(self.dtype, self.precision)
        return (f"strip_{math}_{layout}_c32x32_k{r}x{s}_n{self.tile_n}_r{self.ring}"
                f"_o{self.stage_rows}_p{self.prep_groups}{a}{rs}_sm{self.arch}")


# (tile_n, ring, stage_rows) of the "ss" form in order of preference, channels_last and NCHW:
# the order of their measured times on problem 71 (docs/design/strip.md, "Defaults").
_TILES = {True: ((104, 8, 2), (104, 10, 1), (96, 8, 2), (128, 6, 2), (64, 10, 2)),
          False: ((112, 8, 2), (104, 8, 2), (96, 8, 2), (128, 6, 2), (64, 10, 2),
                  (104, 10, 1))}
# StripConfig.register_a of the first tile, channels_last and NCHW (at most 16 S): the most
# the consumers' 208 registers hold without spilling, less one where one more measured slower.
_REGISTER_A = {True: 16, False: 18}


def config_precision(spec: ProblemSpec) -> str:
    """The precision field of ``spec``'s configurations: its own for float32, ``"tf32"``
    (unused) for 16-bit elements."""
    return spec.precision if spec.dtype == "float32" else "tf32"


def strip_configs(spec: ProblemSpec) -> list[StripConfig]:
    """The strip-family configurations for ``spec`` whose shared memory fits, in order of
    preference (checks no other limit of :meth:`StripFamily.unsupported_reasons`).

    TF32: the ``"ss"`` form's tiles: the first without a preparing warpgroup and with
    :data:`_REGISTER_A` steps' A fragments in registers, then the same tile with a preparing
    warpgroup; the other tiles with a preparing warpgroup on channels_last and without on NCHW,
    no A fragments in registers; with S = 3 the ``"rs"`` form last. fp32 (3xTF32) and 16-bit
    elements: the ``"rs"`` form alone (S = 3), with both walks: 3xTF32 NCHW's default
    splitting all strips' units (:attr:`StripConfig.split_all`), channels_last's and 16-bit's
    each strip's (docs/design/strip.md, Defaults)."""
    sixteen = spec.dtype != "float32"
    rs_only = spec.precision == "fp32" or sixteen
    split_first = not (spec.channels_last or sixteen)  # 3xTF32 NCHW
    walks = (split_first, not split_first) if rs_only else (False,)
    precision = config_precision(spec)
    rs = [StripConfig(spec.kernel_size, spec.channels_last, 128, 6, 1, 0, spec.arch,
                      precision, "rs", split_all, dtype=spec.dtype)
          for split_all in (walks if spec.kernel_size[1] == 3 else ())]
    if rs_only:
        return rs
    prep = 1 if spec.channels_last else 0
    preferred = _TILES[spec.channels_last]
    tiles = [(n, ring, rows, prep, 0) for n, ring, rows in preferred]
    register_a = min(_REGISTER_A[spec.channels_last], 16 * spec.kernel_size[1])
    tiles[:1] = [(*preferred[0], 0, register_a), (*preferred[0], 1, 0)]
    configs = [StripConfig(spec.kernel_size, spec.channels_last, n, ring, rows, p, spec.arch,
                           register_a=a)
               for n, ring, rows, p, a in tiles]
    return [c for c in configs + rs if c.shared_bytes <= SHARED_MEMORY_LIMIT]


@dataclass(frozen=True)
class StripPlan:
    """One problem for a strip-family kernel: its ``StripParams`` values without the three
    addresses, the tensor-map shapes of x and y (None: no TMA stores), its persistent grid
    (CTAs) and the grid (blocks of :data:`EDGE_THREADS`) of ``strip_rs.cu``'s edge kernel
    (0: none), which computes the output columns beyond the last whole strip."""

    sizes: tuple[int, ...]
    x_map: MapShape
    y_map: MapShape | None
    ctas: int
    edge_blocks: int = 0


class StripKernel:
    """One built strip-family kernel in this process. Its tensor maps (of its dtype, zero fill;
    NHWC with the 128-byte swizzle, 16-bit the 64-byte one: a pixel's 32 channels) are encoded on
    the host and kept by address and shape."""

    def __init__(self, artifact):
        self.artifact = artifact
        self.config = from_json_fields(StripConfig, artifact.manifest["config"])
        self._library = cuda.Library(artifact.cubin.read_bytes())
        self._maps = cuda.TensorMaps(MAP_CACHE_SIZE, self.config.dtype)

    def plan(self, spec: ProblemSpec, device: int) -> StripPlan:
        """Sizes, tensor-map shapes and grid for ``spec`` on ``device`` (whose primary
        context must be current). One CTA per SM (the shared memory allows no more); on
        channels_last the CTAs left over when the strips do not divide them take the strips'
        last pairs (``strip_common.cuh``'s walk); NCHW ``strip.cu``: as many CTAs per strip for
        every strip. ``strip_rs.cu`` with 1 to :data:`EDGE_COLUMNS` output columns beyond whole
        strips (Q > 128): the strips end before them and its edge kernel computes them.
        Raises :class:`UnsupportedProblem` when no CTA fits on an SM."""
        config = self.config
        (h, w), (p, q) = spec.in_size, spec.out_size
        n, tile_n = spec.batch, config.tile_n
        rest = q % tile_n  # columns beyond whole strips: the edge kernel's, if it takes them
        edge = rest if config.mma == "rs" and q > tile_n and rest <= EDGE_COLUMNS else 0
        # strips strip_step apart, the last one ending at Q (or before the edge's columns)
        strips = q // tile_n if edge else config.strips(q)
        pairs = -(-p // 2)
        ctas = self._library.resident_ctas(STRIP_SYMBOL, config.threads, config.shared_bytes,
                                           device)
        if ctas < 1:
            raise UnsupportedProblem(f"{config.name} does not fit on an SM of device {device}")
        pixels, body = config.pixels, config.store_body(q)  # body: NCHW strip.cu
        size = config.element_bytes
        if config.channels_last:
            pixel = 32 * size  # bytes: 32 channels, the swizzle's width
            x_map = ((32, w, h, n), (pixel, w * pixel, h * w * pixel), (32, pixels, 1, 1), pixel,
                     256)
            # a store per pair of rows (strip.cu) or per row and consumer (strip_rs.cu)
            store = (tile_n, config.stage_rows) if config.mma == "ss" else (64, 1)
            y_map = ((32, q, p, n), (pixel, q * pixel, p * q * pixel), (32, *store, 1), pixel,
                     256)
        else:
            # NCHW rows promote 128 bytes to L2 (measured faster than 256)
            x_map = ((w, h, 32, n), (w * size, h * w * size, 32 * h * w * size), (pixels, 1, 32, 1),
                     0, 128)
            # y's planes as flat rows (strip.cu), even and odd channels apart: two TMA stores
            # per output row of a strip take its bodies in the two parities' planes, each from
            # its first 32-byte aligned column (strip_rs.cu's threads store every NCHW column:
            # no y map)
            plane = p * q * 4
            y_map = (((p * q, 16, 2, n), (2 * plane, plane, 32 * plane), (body, 16, 1, 1), 0,
                      128) if body else None)
        sizes = (n, h, w, p, q, *spec.padding, strips, pairs, body)
        even = not config.channels_last and config.mma == "ss" and ctas >= strips
        ctas = min(n * pairs * strips, ctas // strips * strips if even else ctas)
        # the edge kernel: a block per EDGE_PIXELS pixels, at most EDGE_BLOCKS_PER_CTA per CTA
        # of the strip kernel, more pixels in rounds (grid-stride)
        edge_blocks = min(-(-n * p * edge // EDGE_PIXELS), EDGE_BLOCKS_PER_CTA * ctas)
        if edge_blocks:  # loaded now, not first during a launch (which may be a graph capture)
            self._library.kernel(STRIP_EDGE_SYMBOL, device)
        return StripPlan(sizes, x_map, y_map, ctas, edge_blocks)

    def run(self, plan: StripPlan, device: int, ex, x: int, weight: int, bias: int,
            y: int) -> None:
        """Launch through ``ex`` on ``device``: ``x`` and ``y`` packed in the configuration's
        layout (NCHW or NHWC) with 16-byte aligned addresses, ``weight`` packed (32, 32, 3, S),
        ``bias`` (32,) or 0 for none, all of the configuration's dtype. With
        ``plan.edge_blocks``, the edge kernel follows on the same stream."""
        config = self.config
        kernel = self._library.kernel(STRIP_SYMBOL, device, config.shared_bytes)
        x_map = ex.tensor_map(self._maps, x, plan.x_map)
        # without a y map (NCHW rows of fewer than 7 columns, or NCHW strip_rs.cu) the kernel
        # does not read its argument; x's map fills it
        y_map = ex.tensor_map(self._maps, y, plan.y_map) if plan.y_map else x_map
        params = program.params((weight, bias, y), STRIP_PARAMS.pack_ints(*plan.sizes))
        ex.launch(kernel, (plan.ctas, 1, 1), config.threads, config.shared_bytes, params, x_map,
                  y_map)
        if plan.edge_blocks:
            ex.launch(self._library.kernel(STRIP_EDGE_SYMBOL, device), (plan.edge_blocks, 1, 1),
                      EDGE_THREADS, 0, params, program.params((x,)))


def config_h(config: StripConfig) -> str:
    """``config.h`` of a strip-family kernel: its template constants."""
    constants = {"kS": config.kernel_size[1], "kTileN": config.tile_n,
                 "kStripStep": config.strip_step, "kRing": config.ring,
                 "kStageRows": config.stage_rows, "kPrepGroups": config.prep_groups,
                 "kRegisterA": config.register_a, "kSharedBytes": config.shared_bytes}
    return emit.config_header(config.name, constants, {"kNhwc": config.channels_last,
                                                       "kThreePass": config.precision == "fp32",
                                                       "kSplitAll": config.split_all,
                                                       "kHalf": config.dtype == "float16",
                                                       "kBf16": config.dtype == "bfloat16"})


class StripFamily(CallerLayoutFamily):
    name = "strip"
    kernel_class = StripKernel
    config_class = StripConfig
    summary = ("stride 1, dilation 1, groups 1, 32 -> 32 channels, kernel (3, S) with S <= 6 in "
               "TF32, (3, 3) in fp32, float16 and bfloat16; channels_last, or NCHW with W (and "
               "in TF32 P x Q) a multiple of 4 (16-bit: W a multiple of 8); sm_90 "
               "(KernelBench 71)",
               "our TMA + wgmma strip kernels (`strip.cu`, `strip_rs.cu`) on the caller's "
               "layout")

    def supports_arch(self, arch: int) -> bool:
        return arch == 90

    def unsupported_reasons(self, spec: ProblemSpec) -> list[str]:
        reasons = spec.element_reasons("strip")
        if spec.dtype != "float32" and spec.kernel_size[1] != 3:
            reasons.append(f"{spec.dtype} with kernel_size={spec.kernel_size}: the strip "
                           "family's 16-bit form (strip_rs.cu) is built for 3 x 3 filters")
        if spec.arch != 90:
            reasons.append(f"sm_{spec.arch}: the strip family is built for sm_90 (TMA, wgmma)")
        if spec.dtype == "float32" and spec.precision == "fp32" and spec.kernel_size[1] != 3:
            reasons.append(f"precision='fp32' with kernel_size={spec.kernel_size}: the strip "
                           "family's 3xTF32 form (strip_rs.cu) is built for 3 x 3 filters")
        if spec.stride != (1, 1) or spec.dilation != (1, 1) or spec.groups != 1:
            reasons.append(f"stride={spec.stride}, dilation={spec.dilation}, groups="
                           f"{spec.groups}: the strip family needs 1, 1 and 1")
        (p, q) = spec.out_size
        multiple = 16 // ELEMENT_BYTES.get(spec.dtype, 4)
        if not spec.channels_last and spec.in_size[1] % multiple:
            reasons.append(f"NCHW {spec.dtype} input of width {spec.in_size[1]}: the strip "
                           "family's TMA loads need input rows of a multiple of 16 bytes "
                           f"(width % {multiple} == 0)")
        # the TF32 "ss" form stores NCHW rows with TMA (strip_rs.cu's threads store them)
        if (not spec.channels_last and spec.dtype == "float32" and spec.precision == "tf32"
                and p * q % 4):
            reasons.append(f"NCHW output planes of {p} x {q}: the strip family's TF32 TMA "
                           "stores need output planes of a multiple of 16 bytes (P x Q % 4 == 0)")
        if (spec.in_channels, spec.out_channels) != (32, 32) or spec.kernel_size[0] != 3:
            reasons.append(f"{spec.in_channels} -> {spec.out_channels} channels, kernel_size="
                           f"{spec.kernel_size}: the strip family is built for 32 -> 32 "
                           "channels (128-byte pixel rows, M = 2 rows x 32) and 3 filter rows")
        elif not reasons and not strip_configs(spec):
            reasons.append(f"kernel_size={spec.kernel_size}: the filter and the row ring do "
                           "not fit in shared memory")
        return spec.int32_reasons() + reasons

    def candidates(self, spec: ProblemSpec) -> list[StripConfig]:
        return strip_configs(spec)

    def bound_fields(self, spec: ProblemSpec) -> dict[str, object]:
        return {"arch": spec.arch, "dtype": spec.dtype, "kernel_size": spec.kernel_size,
                "channels_last": spec.channels_last,
                "precision": config_precision(spec)}

    def sources(self, config: StripConfig) -> Sources:
        device = "strip_rs.cu" if config.mma == "rs" else "strip.cu"
        symbols = (STRIP_SYMBOL, STRIP_EDGE_SYMBOL) if config.mma == "rs" else (STRIP_SYMBOL,)
        return Sources(device, symbols,
                       includes=("strip_common.cuh", "common.cuh", "element.cuh"),
                       header="config.h", emit=functools.partial(config_h, config),
                       emitters=(config_h, emit.config_header), arch=f"{config.arch}a")



FAMILY = StripFamily()

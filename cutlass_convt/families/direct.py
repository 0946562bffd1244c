"""The direct family: our own stride-1 kernel (``templates/direct.cu``, on CuTe's SM80/SM90
atoms) for up to 32 output channels (more in blocks of 32 on sm_90), on the caller's layout
(NCHW or channels_last) and PyTorch's filter as it is.

Persistent CTAs walk output tiles: an input tile with its halo in shared memory, the filter (or
a block of its output channels) resident, ``wgmma`` on sm_90 (producer warps load the tiles
while consumer warpgroups take turns computing and storing them, on mbarriers) or
``mma.sync``, TF32 or 3xTF32. ``docs/design/direct.md`` explains the algorithm, its limits and
its defaults.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .. import cuda, emit, program
from ..build import Sources
from ..cuda import ParamStruct
from ..spec import SHARED_MEMORY_LIMIT, Pair, ProblemSpec, from_json_fields
from .base import CallerLayoutFamily, UnsupportedProblem, sm80_reasons

DIRECT_SYMBOL = "cutlass_convt_direct_kernel"
# direct.cu's DirectParams, passed by value
DIRECT_PARAMS = ParamStruct("DirectParams", "x w bias y",
                            "N H W P Q pad_h pad_w tiles_q tiles_p total_tiles")


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



# Output tile (rows, columns), m tiles per warp, stages, consumer groups and producer warps, in
# order of preference per math (the first that fits in shared memory is the default): the order
# of their measured times on problem 71 (docs/design/direct.md, "Defaults"); mma.sync groups
# load their own tiles (no producer warps), since 3xTF32 needs all 255 registers of 8 warps.
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


def load_vector(spec: ProblemSpec) -> int:
    """Floats per input load ``spec`` allows: 4 (16 bytes) on channels_last or NCHW rows of a
    width that is a multiple of 4, else 1."""
    return 4 if spec.channels_last or spec.in_size[1] % 4 == 0 else 1


def direct_configs(spec: ProblemSpec) -> list[DirectConfig]:
    """Every direct-family configuration for ``spec`` whose shared memory fits (and whose
    input tile has at most 32 rows), in order of preference: all C_out in one block first, then
    blocks of 16 and 8 output channels (the filter split among CTAs); for each, ``wgmma`` first
    where it applies (sm_90, blocks of 8, 16 or 32 channels), then ``mma.sync``. C_out > 32 (a
    multiple of 32, sm_90): blocks of 32 on ``wgmma`` only. 16-byte NCHW loads when
    W_in % 4 == 0. fp32 on ``mma.sync`` only on 8-row tiles with 2 stages (the smaller ones
    measured up to twice as slow as the dgrad family). Checks no other limit of
    :meth:`DirectFamily.unsupported_reasons`."""
    vector = load_vector(spec)
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


@dataclass(frozen=True)
class DirectPlan:
    """One problem for a direct-family kernel: the packed ints of its ``DirectParams``
    (everything but the four addresses) and its persistent grid (CTAs)."""

    sizes: bytes
    ctas: int


class DirectKernel:
    """One built direct-family kernel in this process: persistent CTAs over output tiles,
    NCHW or NHWC as its configuration says."""

    def __init__(self, artifact):
        self.artifact = artifact
        self.config = from_json_fields(DirectConfig, artifact.manifest["config"])
        self._library = cuda.Library(artifact.cubin.read_bytes())

    def plan(self, spec: ProblemSpec, device: int) -> DirectPlan:
        """Sizes and grid for ``spec`` on ``device`` (whose primary context must be current):
        per block of ``out_block`` output channels, one CTA per output tile, at most as many as
        fit on the GPU at once over all blocks (at least one per block). Raises
        :class:`UnsupportedProblem` when no CTA fits on an SM."""
        config = self.config
        (h, w), (p, q), (th, tw) = spec.in_size, spec.out_size, config.tile
        tiles_q, tiles_p = -(-q // tw), -(-p // th)
        total = spec.batch * tiles_p * tiles_q
        blocks = config.out_channels // config.out_block
        ctas = self._library.resident_ctas(DIRECT_SYMBOL, config.threads, config.shared_bytes,
                                           device)
        if ctas < 1:
            raise UnsupportedProblem(f"{config.name} does not fit on an SM of device {device}")
        sizes = DIRECT_PARAMS.pack_ints(spec.batch, h, w, p, q, *spec.padding, tiles_q, tiles_p,
                                        total)
        return DirectPlan(sizes, blocks * min(total, max(1, ctas // blocks)))

    def run(self, plan: DirectPlan, device: int, ex, x: int, weight: int, bias: int,
            y: int) -> None:
        """Launch through ``ex`` on ``device``: ``x`` and ``y`` packed in the configuration's
        layout, ``weight`` packed (C_in, C_out, R, S), ``bias`` (C_out,) or 0 for none."""
        config = self.config
        kernel = self._library.kernel(DIRECT_SYMBOL, device, config.shared_bytes)
        ex.launch(kernel, (plan.ctas, 1, 1), config.threads, config.shared_bytes,
                  program.params((x, weight, bias, y), plan.sizes))


def config_h(config: DirectConfig) -> str:
    """``config.h`` of a direct-family kernel: its template constants."""
    (r, s), (th, tw) = config.kernel_size, config.tile
    constants = {
        "kCI": config.in_channels, "kCO": config.out_channels, "kCOBlock": config.out_block,
        "kR": r, "kS": s,
        "kTileH": th, "kTileW": tw, "kWarpTilesM": config.warp_tiles_m,
        "kStages": config.stages, "kConsumers": config.consumers,
        "kProducerWarps": config.producer_warps, "kVec": config.vector,
        "kConfigThreads": config.threads, "kSharedBytes": config.shared_bytes,
    }
    flags = {"kNhwc": config.channels_last, "kThreePass": config.precision == "fp32",
             "kWgmma": config.math == "wgmma"}
    return emit.config_header(config.name, constants, flags)


class DirectFamily(CallerLayoutFamily):
    name = "direct"
    kernel_class = DirectKernel
    config_class = DirectConfig
    summary = ("other stride-1 problems with dilation 1, groups 1, channels in multiples of 8, "
               "C_out <= 32 (a multiple of 32 beyond, sm_90) and a filter block that fits in "
               "shared memory beside an input tile; fp32 with C_in <= 64 (KernelBench 78)",
               "our kernel (`direct.cu`) on the caller's layout: wgmma on sm_90, else mma.sync")

    def unsupported_reasons(self, spec: ProblemSpec) -> list[str]:
        reasons = spec.float32_reasons("direct") + sm80_reasons(spec)
        if spec.stride != (1, 1) or spec.dilation != (1, 1) or spec.groups != 1:
            reasons.append(f"stride={spec.stride}, dilation={spec.dilation}, groups="
                           f"{spec.groups}: the direct family needs 1, 1 and 1")
        if spec.in_channels % 8 or spec.out_channels % 8 or (
                spec.out_channels > 32 and (spec.out_channels % 32 or spec.arch != 90)):
            reasons.append(f"{spec.in_channels} -> {spec.out_channels} channels: the direct "
                           "family needs multiples of 8 and at most 32 output channels (more "
                           "in blocks of 32 on sm_90's wgmma)")
        elif spec.precision == "fp32" and spec.in_channels > 64:
            # the error of its 3xTF32 sums grows with C_in and passes 1e-6 beyond 64
            reasons.append(f"{spec.in_channels} input channels in fp32: the direct family's "
                           "3xTF32 error grows with C_in (a tap's sums over its input channels "
                           "are the tensor cores', rounded toward zero) and passes the 1e-6 "
                           "bound beyond 64")
        elif direct_config(spec) is None:
            reasons.append(f"kernel_size={spec.kernel_size} with {spec.in_channels} x "
                           f"{spec.out_channels} channels: no block of the filter fits in "
                           "shared memory beside an input tile (or the tile needs more than "
                           "32 input rows; fp32 on mma.sync: an 8-row tile with 2 stages)")
        return spec.int32_reasons() + reasons

    def candidates(self, spec: ProblemSpec) -> list[DirectConfig]:
        return direct_configs(spec)

    def bound_fields(self, spec: ProblemSpec) -> dict[str, object]:
        return {"arch": spec.arch, "precision": spec.precision,
                "channels_last": spec.channels_last, "in_channels": spec.in_channels,
                "out_channels": spec.out_channels, "kernel_size": spec.kernel_size}

    def config_reasons(self, spec: ProblemSpec, config: DirectConfig) -> list[str]:
        """Also: a block of output channels that does not divide them, 16-byte NCHW loads
        (``vector`` 4) of rows whose width is not a multiple of 4."""
        reasons = super().config_reasons(spec, config)
        if config.out_channels % config.out_block:
            reasons.append(f"{config.name}: blocks of {config.out_block} do not divide "
                           f"{config.out_channels} output channels")
        if config.vector > load_vector(spec):
            reasons.append(f"{config.name}: loads of {config.vector} floats on NCHW rows of "
                           f"width {spec.in_size[1]}")
        return reasons

    def demoted(self, spec: ProblemSpec) -> bool:
        """After CUTLASS's stock families where the default configuration splits the output
        channels among CTAs (the filter does not fit whole), and in fp32 on one stage with
        blocks of 8 output channels and more than 16 taps: there it measured slower than they;
        except fp32 with C_out > 32 on the 4-row tile, where it measured faster
        (``docs/design/direct.md``)."""
        config = direct_config(spec)
        if config is None:
            return False
        wide_fp32 = (config.precision == "fp32" and config.out_channels > 32
                     and config.tile[0] >= 4)
        return not wide_fp32 and (
            config.out_block < config.out_channels
            or (config.precision == "fp32" and config.out_block == 8 and config.stages == 1
                and config.kernel_size[0] * config.kernel_size[1] > 16))

    def sources(self, config: DirectConfig) -> Sources:
        arch = f"{config.arch}a" if config.math == "wgmma" else str(config.arch)
        return Sources("direct.cu", (DIRECT_SYMBOL,), includes=("common.cuh",),
                       header="config.h", emit=functools.partial(config_h, config),
                       emitters=(config_h, emit.config_header), arch=arch)



FAMILY = DirectFamily()

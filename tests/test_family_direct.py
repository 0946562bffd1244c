"""The direct family: its limits and configurations (CPU), its builds (nvcc) and its values
against float64 (GPU)."""

from __future__ import annotations

import dataclasses

import pytest

from cutlass_convt import choose, ops, problems
from cutlass_convt.families import dgrad as dgrad_family
from cutlass_convt.families.dgrad import DgradConfig
from cutlass_convt.families.direct import DIRECT_SYMBOL, DirectConfig, direct_config, direct_configs
from cutlass_convt.families.direct import FAMILY as DIRECT
from cutlass_convt.families.fprop_sm90 import FpropSm90Config
from cutlass_convt.spec import PRECISIONS, SHARED_MEMORY_LIMIT

from helpers import CASE, build_config, problem71, run_config, run_shape, spec_of


def test_direct_family_limits():
    """The direct family takes stride-1, ungrouped problems with channels in multiples of 8
    (at most 32 out, or multiples of 32 on sm_90) whose filter block and input tile fit in
    shared memory; its default configuration fits, holds all output channels in one CTA where
    the filter fits (blocks of 16 or 8 where not, of 32 beyond 32), and NCHW inputs with
    W_in % 4 != 0 use 4-byte loads."""

    spec = problems.find("kernelbench-71").spec("tf32", 90)
    assert DIRECT.unsupported_reasons(spec) == []
    config = direct_config(spec)
    assert config.shared_bytes <= SHARED_MEMORY_LIMIT and config.vector == 4
    assert config.math == "wgmma" and config.tile == (4, 64) and config.warp_tiles_m == 4
    assert (config.consumers, config.producer_warps, config.threads) == (2, 4, 32 * 12)
    assert config.out_block == 32
    assert direct_config(problem71(in_channels=32, out_channels=32, in_size=(9, 13))).vector == 1
    assert direct_config(problem71(in_channels=32, out_channels=32, in_size=(9, 13),
                               channels_last=True)).vector == 4
    for kwargs, word in [(dict(stride=(2, 2)), "stride"), (dict(groups=2), "groups"),
                         (dict(in_channels=12, out_channels=16), "multiples of 8"),
                         (dict(in_channels=32, out_channels=40), "at most 32"),
                         (dict(in_channels=32, out_channels=64, arch=80), "at most 32"),
                         (dict(in_channels=64, out_channels=32, kernel_size=(7, 7)),
                          "shared memory"),
                         (dict(in_channels=8, out_channels=8, kernel_size=(40, 3)),
                          "32 input rows")]:
        (reason,) = DIRECT.unsupported_reasons(problem71(**kwargs))
        assert word in reason, (kwargs, reason)
    small = direct_config(problem71(in_channels=16, out_channels=16, kernel_size=(7, 7)))
    assert small is not None and small.shared_bytes <= SHARED_MEMORY_LIMIT
    assert small.out_block == 16
    # filters that do not fit whole: the output channels in blocks, the filter split among CTAs
    for kernel, precision, block in [((3, 3), "tf32", 32), ((7, 7), "tf32", 16),
                                     ((5, 5), "fp32", 16), ((7, 7), "fp32", 8),
                                     ((3, 7), "fp32", 32)]:
        spec = problem71(kernel_size=kernel, precision=precision)
        config = direct_config(spec)
        assert (config.math, config.out_block) == ("wgmma", block), (kernel, precision)
        assert config.shared_bytes <= SHARED_MEMORY_LIMIT
        assert ("b" in config.name.split("_")[3]) == (block < 32)
        # a split default (measured slower than the stock kernels) puts them first; only the
        # families that take the problem are ordered (and asked whether they are demoted)
        able = [f for f in choose.FAMILIES if not f.unsupported_reasons(spec)]
        order = [f.name for f in able if not f.demoted(spec)]
        order += [f.name for f in able if f.demoted(spec)]
        assert [f.name for f in choose.family_order(spec)] == order
        assert (order.index("direct") > order.index("dgrad")) == (block < 32)
    assert isinstance(choose.choose_config(problem71(kernel_size=(7, 7))), FpropSm90Config)
    # with bias too: the SM90 fprop kernels add it in their epilogue
    assert isinstance(choose.choose_config(problem71(kernel_size=(7, 7), bias=True)),
                      FpropSm90Config)
    assert choose.choose_config(problem71(kernel_size=(7, 7)), ("direct",)).out_block == 16
    # fp32 on one stage and 8 output channels: the direct family up to 16 taps, dgrad first
    # beyond
    for c_in, kernel, family in [(64, (4, 4), DirectConfig), (64, (5, 5), DgradConfig),
                                 (64, (3, 7), DgradConfig), (32, (7, 7), DgradConfig)]:
        spec = problem71(in_channels=c_in, out_channels=8, precision="fp32", kernel_size=kernel)
        assert direct_config(spec).stages == 1
        assert isinstance(choose.choose_config(spec), family), (c_in, kernel)
    # C_out > 32: blocks of 32 on wgmma; the default choice in fp32 on the 4-row tile with
    # C_in <= 64 (measured faster than dgrad), else the stock families first
    for c_in, c_out, kernel, precision, family in [
            (32, 64, (3, 3), "fp32", DirectConfig), (16, 128, (4, 4), "fp32", DirectConfig),
            (64, 64, (3, 3), "fp32", DgradConfig), (128, 64, (1, 1), "fp32", DgradConfig),
            (32, 64, (3, 3), "tf32", FpropSm90Config)]:
        spec = problem71(in_channels=c_in, out_channels=c_out, kernel_size=kernel,
                     precision=precision)
        configs = direct_configs(spec)
        assert configs and {(c.math, c.out_block) for c in configs} == {("wgmma", 32)}
        assert isinstance(choose.choose_config(spec), family), (c_in, c_out, kernel, precision)
    # fp32 beyond 64 input channels: the 3xTF32 error passes the 1e-6 bound (TF32 runs)
    wide_in = problem71(in_channels=128, kernel_size=(1, 1), precision="fp32")
    (reason,) = DIRECT.unsupported_reasons(wide_in)
    assert "1e-6" in reason
    assert isinstance(choose.choose_config(wide_in), dgrad_family.DgradConfig)
    assert DIRECT.unsupported_reasons(problem71(in_channels=128, kernel_size=(1, 1))) == []
    # C_out = 24: whole on mma.sync before blocks of 8 on wgmma
    assert direct_config(problem71(out_channels=24)).math == "mma_sync"
    # fp32 on mma.sync: 8-row tiles with 2 stages only (4-row ones measured twice as slow as
    # the dgrad family)
    on_sm80 = problem71(kernel_size=(3, 7), precision="fp32", arch=80)
    config = direct_config(on_sm80)
    assert config.math == "mma_sync" and config.tile[0] == 8 and config.stages == 2
    assert isinstance(choose.choose_config(on_sm80), DgradConfig)  # a split: dgrad first
    assert direct_config(dataclasses.replace(on_sm80, precision="tf32")).tile == (4, 64)
    (reason,) = DIRECT.unsupported_reasons(problem71(kernel_size=(5, 5), precision="fp32", arch=80))
    assert "8-row tile with 2 stages" in reason


def test_direct_family_runs_the_fixed_shapes():
    """The direct shapes of the GPU tests (``DIRECT_SHAPES``): the direct family runs every
    one in both precisions, among them output channels split in blocks of 16 and of 8 (the
    filter does not fit whole) in both layouts."""
    shapes = DIRECT_SHAPES
    configs = [direct_configs(spec_of(shape, p, cl))[0] for shape in shapes
               for p in PRECISIONS for cl in (False, True)]
    assert not [(shape, p) for shape in shapes for p in PRECISIONS
                if DIRECT.unsupported_reasons(spec_of(shape, p))]
    split = {(c.precision, c.channels_last, c.out_block) for c in configs
             if c.out_block < c.out_channels}
    assert split >= {(p, cl, b) for p in PRECISIONS for cl in (False, True) for b in (32, 16, 8)
                     if (p, b) != ("tf32", 8)}  # 32: C_out > 32


def test_direct_family_blocks_cover_both_maths():
    """The block cases of the GPU tests (``BLOCK_CASES``) take every math and block size
    that fits."""
    assert {(s.precision, c.math, c.out_block) for s, c in BLOCK_CASES} >= {
        ("tf32", "wgmma", 16), ("tf32", "wgmma", 8), ("tf32", "mma_sync", 16),
        ("tf32", "mma_sync", 8), ("fp32", "wgmma", 8)}


@pytest.mark.nvcc
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_direct_family_blocks_build_without_spills(tmp_path, channels_last):
    """A direct-family kernel with output-channel blocks (blocks of 8 of 32 channels, wgmma)
    builds for sm_90a without spills: direct.cu's static_assert holds its shared-memory layout
    (filter block, staged NCHW rows of the block) to ``DirectConfig.shared_bytes``."""
    spec = dataclasses.replace(CASE.spec("tf32", 90), kernel_size=(4, 4),
                               channels_last=channels_last)
    config = next(c for c in direct_configs(spec) if c.out_block == 8 and c.math == "wgmma")
    artifact = build_config(config, tmp_path)
    assert DIRECT_SYMBOL.encode() in artifact.cubin.read_bytes()
    ptxas = " ".join(artifact.manifest["ptxas"])
    assert "Used " in ptxas and " 0 bytes spill stores" in ptxas, ptxas


# The direct family: partial tiles at every border (tiles are 2-8 rows x 64 columns), padding
# from 0 to beyond R - 1, kernels 1x1 to 7x7, W_in % 4 != 0 (4-byte loads), bias.
DIRECT_SHAPES = [
    (2, 32, 32, 19, 150, (3, 3), 1, 0, 1, 0, 1, False),   # problem 71's channels
    (3, 32, 32, 17, 67, (3, 3), 1, 1, 1, 0, 1, True),     # W_in % 4 == 3
    (1, 32, 32, 6, 64, (3, 7), 1, (1, 3), 1, 0, 1, True),  # problem 78's filter, 4-row tiles
    (1, 16, 16, 23, 70, (7, 7), 1, 3, 1, 0, 1, True),
    (2, 8, 24, 9, 33, (5, 5), 1, 4, 1, 0, 1, False),      # padding > R - 1
    (2, 32, 8, 30, 64, (1, 1), 1, 0, 1, 0, 1, True),
    (1, 24, 32, 12, 130, (2, 4), 1, (1, 2), 1, 0, 1, False),
    (4, 64, 16, 5, 3, (3, 3), 1, 0, 1, 0, 1, True),       # image narrower than the halo
    # problem 71's channels with filters that do not fit whole: output channels in blocks of
    # 16 (TF32 7x7, fp32 5x5) or 8 (fp32 7x7); P = 15, Q = 133, W_in % 4 == 3 / P = 11, Q = 70
    (1, 32, 32, 13, 131, (7, 7), 1, 2, 1, 0, 1, True),
    (2, 32, 32, 9, 68, (5, 5), 1, 1, 1, 0, 1, False),
    # C_out > 32: blocks of 32 on wgmma (2 and 4 blocks); P = 13, Q = 70, W_in % 4 == 3
    (2, 16, 64, 13, 70, (3, 3), 1, 1, 1, 0, 1, True),
    (1, 32, 128, 9, 67, (1, 1), 1, 0, 1, 0, 1, False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("shape, precision", [
    (shape, precision) for shape in DIRECT_SHAPES for precision in PRECISIONS
    if not DIRECT.unsupported_reasons(spec_of(shape, precision))],
    ids=lambda v: v if isinstance(v, str) else "x".join(map(str, v[:5])))
def test_direct_family(shape, precision, channels_last):
    run_shape(shape, precision, backend="direct", channels_last=channels_last)


# Output-channel blocks on more tiles than CTAs: 8 images of P = 30, Q = 197 (a partial last
# column of tiles), 7 x 7 on 32 -> 32 channels, W_in % 4 == 1, padding, bias.
BLOCKS_SHAPE = (8, 32, 32, 30, 197, (7, 7), 1, 3, 1, 0, 1, True)


BLOCK_CASES = [(spec, config) for spec in (spec_of(BLOCKS_SHAPE, p, cl) for p in PRECISIONS
                                           for cl in (False, True))
               for config in {(c.math, c.out_block): c for c in reversed(direct_configs(spec))
                              if c.out_block < c.out_channels}.values()]


@pytest.mark.gpu
@pytest.mark.parametrize("spec, config", BLOCK_CASES, ids=[c.name for _, c in BLOCK_CASES])
def test_direct_family_blocks_take_many_tiles(spec, config):
    """Each math and block size's first configuration (wgmma and mma.sync, blocks of 16 and 8
    where they fit), every block's CTAs walking several tiles: the grid a multiple of the
    blocks, fewer CTAs per block than tiles; poisoned output against float64."""
    plan = ops.prepare_config(spec, config).plan
    blocks = config.out_channels // config.out_block
    (p, q), (th, tw) = spec.out_size, config.tile
    assert plan.ctas % blocks == 0 and plan.ctas // blocks < spec.batch * -(-p // th) * -(-q // tw)
    run_config(BLOCKS_SHAPE, spec, config)


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("shape", DIRECT_SHAPES[:3], ids=lambda s: "x".join(map(str, s[:5])))
def test_direct_family_tf32_on_mma_sync(shape, channels_last):
    """TF32 through the mma.sync path too (the kernel choice prefers wgmma on an H200)."""
    spec = spec_of(shape, "tf32", channels_last)
    run_config(shape, spec, next(c for c in direct_configs(spec) if c.math == "mma_sync"))

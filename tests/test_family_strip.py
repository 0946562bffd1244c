"""The strip family: its limits, configurations and models of its NCHW stores (CPU), its
builds (nvcc) and its values against float64 (GPU)."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import torch.nn.functional as F

import cutlass_convt
from cutlass_convt import choose, ops, problems
from cutlass_convt.args import problem_spec
from cutlass_convt.benchmark import errors
from cutlass_convt.families.strip import FAMILY as STRIP
from cutlass_convt.families.strip import STRIP_SYMBOL, StripConfig, config_h, strip_configs
from cutlass_convt.spec import PRECISIONS, SHARED_MEMORY_LIMIT

from helpers import (
    build_config,
    check,
    fresh_generator,
    poison_allocator,
    problem71,
    random_problem,
    run_config,
    run_plan,
    run_shape,
    run_sixteen,
    spec_of,
)


def test_strip_family_limits():
    """The strip family takes problem 71 in both layouts in TF32 on sm_90 and is then the
    kernel choice's first family; its configurations fit in shared memory up to S = 6, and
    every other case names its cause."""

    for channels_last, layout in [(True, "nhwc"), (False, "nchw")]:
        spec = problem71(channels_last=channels_last)
        assert STRIP.unsupported_reasons(spec) == []
        configs = strip_configs(spec)
        # channels_last N = 104, NCHW N = 112, without a preparing warpgroup and with 16 (NCHW
        # 18) steps' A fragments in registers; the same tile with a preparing warpgroup (and
        # none) second
        tile_n, register_a = (104, 16) if channels_last else (112, 18)
        assert configs[:2] == [StripConfig((3, 3), channels_last, tile_n, register_a=register_a),
                               StripConfig((3, 3), channels_last, tile_n, prep_groups=1)]
        assert all(c.register_a == 0 and c.prep_groups == channels_last
                   for c in configs[2:] if c.mma == "ss")
        assert (configs[0].threads, configs[1].threads) == (384, 512)
        # NCHW: ring rows of 120 pixels, stage lines of a TMA store's body, 104 floats
        assert configs[0].shared_bytes == (221376 if channels_last else 229568)
        assert all(c.shared_bytes <= SHARED_MEMORY_LIMIT for c in configs)
        assert configs[0].name == (f"strip_tf32_{layout}_c32x32_k3x3_n{tile_n}_r8_o2_p0"
                                   f"_a{register_a}_sm90")
        assert configs[1].name == f"strip_tf32_{layout}_c32x32_k3x3_n{tile_n}_r8_o2_p1_sm90"
        assert (f"constexpr int kRegisterA = {register_a};"
                in config_h(configs[0]))
        assert choose.candidates(spec)[:len(configs)] == configs
        prep = 1 if channels_last else 0
        assert StripConfig((3, 3), channels_last, 104, 10, 1, prep) in configs  # a row per store
        wide = problem71(channels_last=channels_last, kernel_size=(3, 6))
        assert [c.tile_n for c in strip_configs(wide)] == [64]
    # NCHW strips of the ss form are a TMA store body apart (whole sectors, 8 or 24 mod 32
    # floats wide: tile_n - 8, or tile_n - 16), all others tile_n
    assert [StripConfig((3, 3), False, n).strip_step for n in (64, 96, 104, 112, 128)] == [
        56, 88, 88, 104, 120]
    assert StripConfig((3, 3), True).strip_step == 104
    assert StripConfig((3, 3), False, 128, 6, 1, mma="rs").strip_step == 128
    assert [StripConfig((3, 3), False).strips(q) for q in (1, 104, 105, 192, 193, 1026)] == [
        1, 1, 2, 2, 3, 12]
    assert StripConfig((3, 3), False, 112).strips(1026) == 10
    # NCHW rows: 3 more columns for 16-byte aligned TMA boxes, rounded up to 8
    assert StripConfig((3, 1), False).pixels == 112 and StripConfig((3, 1), True).pixels == 104
    for kwargs, word in [(dict(channels_last=False, in_size=(512, 1022)), "width % 4"),
                         (dict(channels_last=False, in_size=(511, 1024)), "P x Q % 4"),
                         (dict(precision="fp32", kernel_size=(3, 2)), "3 x 3 filters"),
                         (dict(precision="fp32", channels_last=False, kernel_size=(3, 4)),
                          "3 x 3 filters"),
                         (dict(arch=80), "sm_90"), (dict(stride=(2, 2)), "stride"),
                         (dict(in_channels=64), "32 -> 32"), (dict(kernel_size=(5, 3)), "3 filter"),
                         (dict(kernel_size=(3, 7)), "shared memory")]:
        (reason,) = STRIP.unsupported_reasons(problem71(**{"channels_last": True, **kwargs}))
        assert word in reason, (kwargs, reason)


def test_strip_rs_form_limits():
    """The strip family's rs form (strip_rs.cu: x as wgmma's A from registers) is the only
    fp32 (3xTF32) strip kernel, in both layouts with 3 filter columns, and the last TF32
    candidate there; NCHW, it stores y by the threads, so an fp32 output plane need not be a
    multiple of 4 floats."""

    rs = dict(tile_n=128, ring=6, stage_rows=1, prep_groups=0, mma="rs")
    for channels_last, layout in [(False, "nchw"), (True, "nhwc")]:
        spec = problem71(channels_last=channels_last, precision="fp32")
        assert STRIP.unsupported_reasons(spec) == []
        # both walks, NCHW's default splitting all strips' units, channels_last's each strip's
        config, other = strip_configs(spec)
        assert config == StripConfig((3, 3), channels_last, precision="fp32", **rs,
                                     split_all=not channels_last)
        assert other == dataclasses.replace(config, split_all=channels_last)
        all_ = "" if channels_last else "_all"
        assert config.name == f"strip_fp32_{layout}_c32x32_k3x3_n128_r6_o1_p0_rs{all_}_sm90"
        assert choose.choose_config(spec) == config
        assert f"constexpr bool kSplitAll = {str(not channels_last).lower()};" in (
            config_h(config))
        # 3xTF32: the filter twice (2 x 9 x 32 x 32 floats), 6 rows of 136 x 32, 4 stages of
        # 32 x 68 (NHWC: 32 x 64), 20 mbarriers, the bias
        stage = 32 * (64 if channels_last else 68)
        assert config.shared_bytes == 4 * (18432 + 6 * 136 * 32 + 4 * stage) + 8 * 20 + 4 * 32
        tf32 = strip_configs(problem71(channels_last=channels_last))
        assert tf32[-1] == StripConfig((3, 3), channels_last, **rs)  # each strip's units
        assert not any(c.split_all for c in tf32)
        assert tf32[-1].shared_bytes == config.shared_bytes - 4 * 9216
        assert all(c.mma == "ss" for c in tf32[:-1])
        assert all(c.mma == "ss" for c in strip_configs(problem71(channels_last=channels_last,
                                                               kernel_size=(3, 4))))
    odd_planes = problem71(channels_last=False, precision="fp32", in_size=(511, 1024))
    assert STRIP.unsupported_reasons(odd_planes) == []
    sources = STRIP.sources(config)
    assert sources.templates == ("strip_rs.cu", "strip_common.cuh", "common.cuh", "element.cuh")
    assert "constexpr bool kThreePass = true;" in sources.emit()
    assert "constexpr bool kThreePass = false;" in config_h(tf32[0])
    assert STRIP.sources(tf32[0]).device == "strip.cu"
    for bad in [dict(precision="fp32"), dict(mma="rs"), dict(mma="sr"), dict(split_all=True),
                dict(precision="fp16", **rs), dict(**{**rs, "ring": 5}),
                dict(**{**rs, "ring": 17}),
                dict(**{**rs, "tile_n": 104}), dict(register_a=16, **rs),
                dict(register_a=16, prep_groups=1), dict(register_a=49), dict(register_a=-1)]:
        with pytest.raises(ValueError):
            StripConfig((3, 3), False, **bad)
    assert StripConfig((3, 3), False, register_a=48).register_a == 48  # all 16 S steps
    with pytest.raises(ValueError, match="16 S"):
        StripConfig((3, 1), False, register_a=17)
    with pytest.raises(ValueError):
        StripConfig((3, 4), True, **rs)
    with pytest.raises(ValueError, match="R = 3"):
        StripConfig((5, 3), False, **rs)


def test_strip_nchw_writes_every_column_once_or_twice():
    """A model of ``strip.cu``'s NCHW output columns (``strip_common.cuh``'s ``strip_q0``, its
    ``nchw_head``, the epilogue's checked and unchecked column blocks and its end-column rule)
    on :meth:`StripConfig.strips` strips and :meth:`StripConfig.store_body` wide bodies: every
    value staged for a TMA body lands inside it, each body position exactly once; bodies stay
    inside the strip and the row; every column of every row is written, by a body or by the
    threads, at most twice (where the last strip overlaps the one before it), for every tile
    width, Q from 1 to 700 and each offset of the row modulo 8 floats (the even and the odd
    channels' planes may be 4 apart)."""
    for tile_n in (64, 96, 104, 112, 128):
        config = StripConfig((3, 3), False, tile_n)
        step = config.strip_step
        assert step % 8 == 0 and step % 32 in (8, 24) and step <= tile_n - 7
        for q in range(1, 701):
            body = config.store_body(q)
            assert body % 8 == 0 and body <= step
            for row_start in range(8):  # (plane offset + pp x Q) mod 8
                written = [0] * q
                for strip in range(config.strips(q)):
                    q0 = max(0, min(strip * step, q - tile_n))
                    head = (8 - (row_start + q0)) & 7
                    lo = 0 if q0 == 0 else head
                    cols = min(tile_n, q - q0) if q0 + tile_n >= q else head + body
                    if body:  # no y map otherwise
                        assert head + body <= min(tile_n, q - q0), (tile_n, q, strip)
                    staged = [0] * body
                    for col in range(tile_n):  # the strip's computed columns
                        j = col // 8  # unchecked blocks only with a full body
                        check = body != step or j == 0 or 8 * j + 7 >= step
                        if not check or head <= col < head + body:
                            assert 0 <= col - head < body and q0 + col < q, (tile_n, q, col)
                            staged[col - head] += 1
                        elif lo <= col < cols:
                            assert q0 + col < q
                            written[q0 + col] += 1
                    assert all(n == 1 for n in staged), (tile_n, q, strip, row_start)
                    for col in range(head, head + body):  # the TMA body
                        written[q0 + col] += 1
                assert all(1 <= n <= 2 for n in written), (tile_n, q, row_start)


def test_strip_nchw_stage_writes_are_conflict_free():
    """A model of ``strip.cu``'s NCHW stage writes (its ``channel_of_row``, the wgmma
    accumulator layout: thread ``lane`` of warp ``w`` holds rows m = 16 w + lane / 4 + 8 h of
    M, columns 8 j + 2 (lane % 4) + e; a box row per channel, (co & 1) 16 + co / 2, of
    :attr:`StripConfig.strip_step` floats): each output row's 32 channels once, a thread's two
    channels of one parity 16 apart, and, where the row's head is even, every 64-bit write
    8-byte aligned and each half-warp's 16 writes on 32 distinct banks, for every tile
    width."""
    def channel_of_row(m):
        return 2 * (m % 16) + m // 16

    for tile_n in (64, 96, 104, 112, 128):
        pitch = StripConfig((3, 3), False, tile_n).strip_step  # kBodyMax: a box row's floats
        for prow in range(2):  # the pair's output rows: warps 2 prow and 2 prow + 1
            seen = []
            for w in (2 * prow, 2 * prow + 1):
                for lane in range(32):
                    m0 = (16 * w + lane // 4) % 32
                    co0, co1 = channel_of_row(m0), channel_of_row(m0 + 8)
                    assert co0 % 2 == co1 % 2 and co1 - co0 == 16
                    assert (co0 % 2) * 16 + co0 // 2 == m0  # the box row is the accumulator row
                    seen += [co0, co1]
            assert sorted(seen) == [c for c in range(32) for _ in range(4)]  # 4 lanes a channel
        for head in range(0, 8, 2):
            for w in range(4):
                for j in range(1, tile_n // 8):  # unchecked blocks
                    for h in range(2):
                        for half in range(2):  # the half-warps' wavefronts
                            banks = []
                            for lane in range(16 * half, 16 * half + 16):
                                m = (16 * w + lane // 4) % 32 + 8 * h
                                co = channel_of_row(m)
                                box_row = (co % 2) * 16 + co // 2
                                word = box_row * pitch + 8 * j + 2 * (lane % 4) - head
                                assert word % 2 == 0  # 8-byte aligned (the stage is)
                                banks += [word % 32, (word + 1) % 32]
                            assert len(set(banks)) == 32, (tile_n, head, w, j, h)


def test_strip_16_bit_configurations_and_refusals():
    """float16 and bfloat16 take the rs form alone (S = 3), both walks (each strip's units
    first), their own kernel names and element-size layout: NHWC rows of 136 pixels (64-byte
    swizzle), NCHW rows of 152 columns (an 8-element TMA start, words of two columns, 24 words
    mod 32); they are refused for other filters and for NCHW widths that make no 16-byte TMA
    rows."""
    for dtype, tag in (("bfloat16", "bf16"), ("float16", "fp16")):
        for channels_last, layout in [(False, "nchw"), (True, "nhwc")]:
            spec = problem71(channels_last=channels_last, dtype=dtype)
            assert STRIP.unsupported_reasons(spec) == []
            config, other = strip_configs(spec)
            assert (config.mma, config.dtype, config.precision) == ("rs", dtype, "tf32")
            # each strip's units first in both layouts (NCHW: 16% faster than splitting all)
            assert other == dataclasses.replace(config, split_all=True) and not config.split_all
            assert config.name == f"strip_{tag}_{layout}_c32x32_k3x3_n128_r6_o1_p0_rs_sm90"
            assert config.pixels == (136 if channels_last else 152)
            # the filter (9 x 32 x 32), 6 ring rows, 4 stages of 32 x 64 (NCHW: 32 x 72)
            # 16-bit elements; 20 mbarriers, the bias in floats
            stage = 32 * (64 if channels_last else 72)
            assert config.shared_bytes == 2 * (9216 + 6 * config.pixels * 32 + 4 * stage) + (
                8 * 20 + 4 * 32)
            header = config_h(config)
            assert ("kBf16 = true" in header) == (dtype == "bfloat16")
            assert ("kHalf = true" in header) == (dtype == "float16")
            assert "element.cuh" in STRIP.sources(config).templates
            # precision has no meaning for 16-bit elements: fp32 asks for the same kernels
            assert strip_configs(dataclasses.replace(spec, precision="fp32")) == [config, other]
            for change, word in [(dict(kernel_size=(3, 4)), "3 x 3 filters"),
                                 (dict(kernel_size=(3, 1)), "3 x 3 filters")]:
                assert any(word in r for r in STRIP.unsupported_reasons(
                    dataclasses.replace(spec, **change)))
        narrow = problem71(channels_last=False, dtype=dtype, in_size=(512, 1020))
        (reason,) = STRIP.unsupported_reasons(narrow)
        assert "width % 8 == 0" in reason
        assert STRIP.unsupported_reasons(dataclasses.replace(narrow, channels_last=True)) == []
        rs = dict(tile_n=128, ring=6, stage_rows=1, prep_groups=0, mma="rs")
        with pytest.raises(ValueError, match="16-bit"):
            StripConfig((3, 3), False, dtype=dtype)  # the ss form
        with pytest.raises(ValueError, match="16-bit"):
            StripConfig((3, 3), False, precision="fp32", dtype=dtype, **rs)
    assert STRIP.unsupported_reasons(problem71(dtype="float64"))
    with pytest.raises(ValueError):
        StripConfig((3, 3), False, dtype="float64")


@pytest.mark.nvcc
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("precision, dtype", [("tf32", "float32"), ("fp32", "float32"),
                                              ("tf32", "bfloat16"), ("tf32", "float16")],
                         ids=["tf32", "fp32", "bf16", "fp16"])
def test_strip_rs_form_builds_without_spills(tmp_path, precision, dtype, channels_last):
    """The strip family's rs form (strip_rs.cu, with strip_common.cuh) builds for sm_90a in
    both precisions, both 16-bit types and both layouts (on each one's default walk: fp32
    NCHW splitting all strips' units, the others each strip's), its entry holding the
    templates it includes, without spills (ptxas -v)."""
    split_all = precision == "fp32" and dtype == "float32" and not channels_last
    config = StripConfig((3, 3), channels_last, 128, 6, 1, 0, 90, precision, "rs", split_all,
                         dtype=dtype)
    artifact = build_config(config, tmp_path)
    assert STRIP_SYMBOL.encode() in artifact.cubin.read_bytes()
    assert {"strip_rs.cu", "strip_common.cuh", "common.cuh", "element.cuh", "config.h"} <= set(
        artifact.manifest["files"])
    ptxas = " ".join(artifact.manifest["ptxas"])
    assert "Used " in ptxas and " 0 bytes spill stores" in ptxas, ptxas


@pytest.mark.nvcc
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("s", [1, 3])
def test_strip_default_builds_without_spills(tmp_path, channels_last, s):
    """The strip family's first configuration for problem 71 and for S = 1 (strip.cu, A
    fragments in registers for the first 16 (NCHW: 18) of 48 steps, and for all 16) builds for
    sm_90a without spills (ptxas -v), in both layouts, with the 168 registers a thread at
    launch that its setmaxnreg counts (88 + 2 x 208) take as the CTA's pool: with fewer, the
    consumers' setmaxnreg.inc would wait forever."""
    spec = dataclasses.replace(problems.find("kernelbench-71").spec("tf32", 90),
                               channels_last=channels_last, kernel_size=(3, s))
    config = strip_configs(spec)[0]
    assert config.register_a == min(16 if channels_last else 18, 16 * s)
    assert config.threads == 384
    artifact = build_config(config, tmp_path)
    ptxas = " ".join(artifact.manifest["ptxas"])
    assert "Used 168 registers" in ptxas and " 0 bytes spill stores" in ptxas, ptxas


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_problem71(precision):
    """KernelBench level 1 problem 71 as KernelBench runs it: default-initialised module,
    ``torch.rand`` input, NCHW."""
    case = problems.find("kernelbench-71")
    gen, seed = fresh_generator()
    torch.manual_seed(seed)
    module = cutlass_convt.ConvTranspose2d(**case.module_kwargs(), precision=precision).cuda()
    x = case.make_input(generator=gen)
    with torch.no_grad():
        eager = F.conv_transpose2d(x, module.weight)  # cuDNN, TF32 by default
        ref = F.conv_transpose2d(x.double(), module.weight.double())
        torch_err = errors(eager, ref)
        del eager, ref
        poison_allocator(3 * 8 * 32 * 514 * 1026 * 4)
        out = module(x)
    assert out.is_contiguous()
    err = check(out, x, module.weight, None, precision, seed, torch_err["max_abs"])
    if precision == "tf32":  # the bound, stated on torch's own TF32 error
        assert err["max_abs"] <= 2 * torch_err["max_abs"], (err, torch_err)


# The strip family (TF32, 32 -> 32 channels, R = 3): partial strips (tiles of 64 to 128
# columns) and a half-empty last pair of rows (P odd), padding from 0 to beyond R - 1, S from
# 1 to 5, an image narrower than the halo, bias. channels_last: any width; NCHW: widths and output
# planes (P x Q) of multiples of 4 (TMA rows), Q odd and even, P odd.
STRIP_SHAPES = [
    (2, 32, 32, 19, 150, (3, 3), 1, 0, 1, 0, 1, False),
    (3, 32, 32, 17, 67, (3, 3), 1, 1, 1, 0, 1, True),
    (1, 32, 32, 6, 300, (3, 1), 1, (3, 0), 1, 0, 1, True),
    (2, 32, 32, 5, 3, (3, 5), 1, (0, 3), 1, 0, 1, False),
    (1, 32, 32, 24, 1026, (3, 3), 1, 0, 1, 0, 1, True),
    (4, 32, 32, 9, 207, (3, 2), 1, 1, 1, 0, 1, False),
]


STRIP_NCHW_SHAPES = [
    (2, 32, 32, 19, 148, (3, 3), 1, (0, 1), 1, 0, 1, False),  # P = 21
    (3, 32, 32, 20, 68, (3, 4), 1, 1, 1, 0, 1, True),     # Q = 69
    (1, 32, 32, 6, 300, (3, 1), 1, (3, 0), 1, 0, 1, True),
    (2, 32, 32, 6, 4, (3, 5), 1, (0, 3), 1, 0, 1, False),  # Q = 2
    (1, 32, 32, 24, 1024, (3, 3), 1, 0, 1, 0, 1, True),
    (4, 32, 32, 12, 208, (3, 2), 1, 1, 1, 0, 1, False),   # Q = 207
    (1, 32, 32, 10, 216, (3, 3), 1, 1, 1, 0, 1, False),   # Q = 216: the last strip on the step
    (1, 32, 32, 10, 112, (3, 2), 1, 0, 1, 0, 1, False),   # Q = 113: tile_n + 1
    (1, 32, 32, 10, 104, (3, 2), 1, 0, 1, 0, 1, False),   # Q = 105: one strip, a narrower body
]


STRIP_CASES = ([(shape, True) for shape in STRIP_SHAPES]
               + [(shape, False) for shape in STRIP_NCHW_SHAPES])


def _strip_id(case) -> str:
    shape, channels_last = case
    return "x".join(map(str, shape[:6])) + ("-nhwc" if channels_last else "-nchw")


@pytest.mark.gpu
@pytest.mark.parametrize("case", STRIP_CASES, ids=_strip_id)
def test_strip_family(case):
    shape, channels_last = case
    assert STRIP.unsupported_reasons(spec_of(shape, "tf32", channels_last)) == []
    run_shape(shape, "tf32", backend="strip", channels_last=channels_last)


@pytest.mark.gpu
@pytest.mark.parametrize("case", STRIP_CASES[:2] + STRIP_CASES[6::5], ids=_strip_id)
def test_strip_family_every_tile(case):
    """Every strip configuration (N = 64, 96, 104, 128, and 112 on NCHW; rings of 6 to 10
    rows), not only the default the choice takes."""
    shape, channels_last = case
    spec = spec_of(shape, "tf32", channels_last)
    configs = strip_configs(spec)
    expected = {64, 96, 104, 128} if channels_last else {64, 96, 104, 112, 128}
    assert {c.tile_n for c in configs} == expected
    for config in configs:
        run_config(shape, spec, config)


# The strip family's rs form (strip_rs.cu: S = 3, x as wgmma's A from registers; TF32 and
# 3xTF32), NCHW and channels_last: strips of 128 columns with the last one overlapping (Q = 148,
# 150, 600, 601, and 137, 138: 9 and 10 columns beyond whole strips, more than the edge kernel
# takes), or ending before the edge kernel's 1 to 8 columns (Q = 129, 134, 136, 264, 1026,
# 1028; with padding, P odd, 2 or 3 images, with and without bias), Q < 128 (the second
# consumer's half partial, Q = 67, 70) and Q < 64 (that half empty, Q = 5, 6), P odd, 2 input
# rows, padding 0 to 2 (NCHW fp32: an output plane of 11 x 254 floats, not a multiple of 4;
# channels_last: odd widths), bias; more units (strip, image, pair of rows) than CTAs (300
# units: 5 strips of 3 images x 20 pairs, Q = 600), so that on up to 150 SMs some CTAs' walks
# over all strips (split_all) run across strips and images.
STRIP_RS_CASES = [
    ((2, 32, 32, 19, 148, (3, 3), 1, (0, 1), 1, 0, 1, False), False, PRECISIONS),  # P = 21
    ((3, 32, 32, 20, 68, (3, 3), 1, 0, 1, 0, 1, True), False, PRECISIONS),          # Q = 70
    ((2, 32, 32, 6, 4, (3, 3), 1, 0, 1, 0, 1, True), False, PRECISIONS),            # Q = 6
    ((1, 32, 32, 2, 132, (3, 3), 1, 0, 1, 0, 1, False), False, PRECISIONS),         # P = 4
    ((1, 32, 32, 24, 1024, (3, 3), 1, 0, 1, 0, 1, True), False, PRECISIONS),        # 8 + edge
    ((2, 32, 32, 13, 256, (3, 3), 1, 2, 1, 0, 1, False), False, ("fp32",)),         # 11 x 254
    ((3, 32, 32, 40, 600, (3, 3), 1, 1, 1, 0, 1, True), False, PRECISIONS),         # runs across
    ((2, 32, 32, 13, 136, (3, 3), 1, 1, 1, 0, 1, False), False, PRECISIONS),        # edge of 8
    ((1, 32, 32, 8, 136, (3, 3), 1, 0, 1, 0, 1, True), False, PRECISIONS),          # Q = 138
    ((2, 32, 32, 19, 150, (3, 3), 1, (0, 1), 1, 0, 1, False), True, PRECISIONS),   # Q = 150
    ((3, 32, 32, 17, 67, (3, 3), 1, 1, 1, 0, 1, True), True, PRECISIONS),          # Q = 67
    ((2, 32, 32, 5, 3, (3, 3), 1, 0, 1, 0, 1, False), True, PRECISIONS),           # Q = 5
    ((1, 32, 32, 24, 1026, (3, 3), 1, 0, 1, 0, 1, True), True, PRECISIONS),        # Q = 1028
    ((2, 32, 32, 13, 255, (3, 3), 1, 2, 1, 0, 1, False), True, PRECISIONS),        # 11 x 253
    ((3, 32, 32, 40, 601, (3, 3), 1, 1, 1, 0, 1, True), True, PRECISIONS),         # runs across
    ((2, 32, 32, 13, 127, (3, 3), 1, 0, 1, 0, 1, False), True, PRECISIONS),        # edge of 1
    ((3, 32, 32, 11, 264, (3, 3), 1, 1, 1, 0, 1, True), True, PRECISIONS),         # edge of 8
    ((1, 32, 32, 6, 135, (3, 3), 1, 0, 1, 0, 1, False), True, PRECISIONS),         # Q = 137
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape, channels_last, precision", [
    (shape, channels_last, precision) for shape, channels_last, precisions in STRIP_RS_CASES
    for precision in precisions],
    ids=lambda v: v if isinstance(v, str) else ("nhwc" if v else "nchw") if isinstance(v, bool)
    else "x".join(map(str, v[:5])))
def test_strip_rs_form(shape, channels_last, precision):
    """fp32 through the kernel choice (the rs form is the strip family's only 3xTF32 kernel,
    and the choice's first family), then with its other walk; TF32 on the rs configuration
    itself (the choice takes the ss form)."""
    spec = spec_of(shape, precision, channels_last)
    assert STRIP.unsupported_reasons(spec) == []
    if precision == "fp32":
        config, other = strip_configs(spec)
        assert config.mma == other.mma == "rs" and config.split_all != other.split_all
        assert ops.prepare(spec).config == config
        run_shape(shape, precision, channels_last=channels_last)
        run_config(shape, spec, other)
    else:
        config = strip_configs(spec)[-1]
        assert config.mma == "rs"
        run_config(shape, spec, config)


# 16-bit on the rs form: its NHWC cases, and NCHW cases of widths a multiple of 8 (16-byte
# TMA rows) with the same borders: partial and overlapping last strips (Q = 144, 254, 600, 138),
# the second consumer's half partial (Q = 66) and empty (Q = 10), the edge kernel (Q = 1026:
# 2 columns; Q = 136: 8), P odd, padding 0 to 2, odd padding (the words of odd columns:
# Q = 144, 600, 136, 128), bias, runs across strips and images.
SIXTEEN_CASES = [
    ((2, 32, 32, 19, 144, (3, 3), 1, (0, 1), 1, 0, 1, False), False),  # P = 21, Q = 144
    ((3, 32, 32, 20, 64, (3, 3), 1, 0, 1, 0, 1, True), False),           # Q = 66
    ((2, 32, 32, 6, 8, (3, 3), 1, 0, 1, 0, 1, True), False),             # Q = 10
    ((1, 32, 32, 24, 1024, (3, 3), 1, 0, 1, 0, 1, True), False),         # 8 + edge of 2
    ((2, 32, 32, 13, 256, (3, 3), 1, 2, 1, 0, 1, False), False),         # 11 x 254
    ((3, 32, 32, 40, 600, (3, 3), 1, 1, 1, 0, 1, True), False),          # runs across
    ((2, 32, 32, 13, 136, (3, 3), 1, 1, 1, 0, 1, False), False),         # edge of 8
    ((1, 32, 32, 8, 136, (3, 3), 1, 0, 1, 0, 1, True), False),           # Q = 138
    ((2, 32, 32, 9, 128, (3, 3), 1, 1, 1, 0, 1, True), False),           # Q = 128
] + [(shape, True) for shape, channels_last, _ in STRIP_RS_CASES if channels_last]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", SIXTEEN_CASES, ids=_strip_id)
def test_strip_rs_form_in_16_bits(case, dtype):
    """float16 and bfloat16 on the rs form (wgmma k16, float32 sums, y rounded once), through
    backend="strip" (its default walk) and on its other walk, within helpers.run_sixteen's
    bounds."""
    shape, channels_last = case
    spec = dataclasses.replace(spec_of(shape, "tf32", channels_last),
                               dtype=str(dtype).removeprefix("torch."))
    assert STRIP.unsupported_reasons(spec) == []
    config, other = strip_configs(spec)
    assert ops.prepare(spec, ("strip",)).config == config
    run_sixteen(shape, dtype, channels_last, backend="strip")
    run_sixteen(shape, dtype, channels_last, config=other)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_problem71_in_16_bits(channels_last, dtype):
    """KernelBench 71's full size in 16 bits on the strip family (every CTA through
    the ring many times), within helpers.run_sixteen's bounds."""
    run_sixteen((8, 32, 32, 512, 1024, (3, 3), 1, 0, 1, 0, 1, False), dtype, channels_last,
                backend="strip")


@pytest.mark.gpu
def test_strip_rs_edge_plan():
    """The rs form's plan: with at most 8 output columns beyond whole strips of 128 (problem
    71: Q = 1026), 8 strips and the edge kernel for the last 2 columns, a block per 32 output
    pixels (at most 3 per CTA of the strip kernel: 257 blocks here); with more (Q = 150: 22),
    a last strip that overlaps the one before it, no edge."""
    for w, strips, pixels in ((1024, 8, 8 * 514 * 2), (148, 2, 0)):
        shape = (8, 32, 32, 512, w, (3, 3), 1, 0, 1, 0, 1, False)
        for channels_last in (False, True):
            spec = spec_of(shape, "fp32", channels_last)
            plan = ops.prepare(spec, ("strip",)).plan
            assert plan.sizes[7] == strips  # sizes[7]: strips
            assert plan.edge_blocks == min(-(-pixels // 32), 3 * plan.ctas)


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_strip_rs_edge_grid_stride(channels_last):
    """The edge kernel's blocks take more than one round of 32 output pixels when its grid is
    short: one block for 2 x 13 rows x 8 edge columns (208 pixels, 7 rounds, the last
    partial), with padding and bias, poisoned output, against float64."""
    shape = (2, 32, 32, 13, 136, (3, 3), 1, 1, 1, 0, 1, True)
    spec = spec_of(shape, "fp32", channels_last)
    prepared = ops.prepare(spec, ("strip",))
    plan = dataclasses.replace(prepared.plan, edge_blocks=1)
    assert prepared.plan.edge_blocks > 1 and plan.sizes[7] == 1  # sizes[7]: strips
    run_plan(prepared, plan, *random_problem(shape, channels_last), padding=1)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", PRECISIONS)
def test_strip_walk_on_any_grid(precision):
    """strip_common.cuh's walk on channels_last (the ss form for TF32, the rs form's per-strip
    walk for fp32): 3 strips of 30 units (2 images x 15 pairs of rows) on grids of fewer CTAs
    than strips (2), a multiple of them (3, 9), and ones that leave CTAs over, which take the
    strips' tails (4, 5, 7, 11 CTAs: tails of 7, 10, 4 and 4 units; 61: a tail of 0, the one
    left over idle); every output against float64, poisoned before each launch."""
    shape = (2, 32, 32, 30, 298, (3, 3), 1, 1, 1, 0, 1, True)  # P = 30, Q = 298
    spec = spec_of(shape, precision, True)
    tensors = random_problem(shape, True)
    config = strip_configs(spec)[0]
    assert not config.split_all
    prepared = ops.prepare_config(spec, config)
    strips = prepared.plan.sizes[7]  # sizes[7]: strips
    assert strips == 3 and prepared.plan.sizes[8] == 15  # sizes[8]: pairs
    for ctas in (2, 3, 4, 5, 7, 9, 11, 61):
        run_plan(prepared, dataclasses.replace(prepared.plan, ctas=ctas), *tensors, padding=1)


@pytest.mark.gpu
def test_strip_plan_gives_each_nchw_strip_as_many_ctas():
    """The ss form on NCHW plans as many CTAs for each strip, so up to strips - 1 SMs idle
    (docs/design/strip.md, Defaults); channels_last takes every SM; neither more CTAs than
    units (strip, image, pair of rows)."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    for batch in (1, 2):
        shape = (batch, 32, 32, 24, 1024, (3, 3), 1, 0, 1, 0, 1, False)  # Q = 1026, P = 26
        for channels_last in (False, True):
            spec = spec_of(shape, "tf32", channels_last)
            plan = ops.prepare_config(spec, strip_configs(spec)[0]).plan
            strips = plan.sizes[7]  # sizes[7]: strips
            assert strips == 10  # NCHW: 112 columns, 104 apart; channels_last: 104
            units = batch * 13 * strips
            ctas = sms if channels_last else sms // strips * strips
            assert plan.ctas == min(ctas, units), (batch, channels_last, plan.ctas)


@pytest.mark.gpu
@pytest.mark.parametrize("precision, kernel_size", [("tf32", (3, 4)), ("fp32", (3, 3))])
def test_strip_family_in_cuda_graph(precision, kernel_size):
    """An NCHW strip call captured into a CUDA graph is right on every replay, and so are eager
    calls after it: TF32 on the ss form; fp32 on the rs form, whose 4 output columns beyond its
    one strip (Q = 132) go to the edge kernel, a second launch in the graph."""
    gen, seed = fresh_generator()
    x = torch.randn(3, 32, 20, 132, device="cuda", generator=gen)
    w = torch.randn(32, 32, *kernel_size, device="cuda", generator=gen)
    b = torch.randn(32, device="cuda", generator=gen)
    run = functools.partial(cutlass_convt.conv_transpose2d, weight=w, bias=b, padding=1,
                            precision=precision, backend="strip")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: build, load, plan
        run(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(x)
    for _ in range(2):
        x.copy_(torch.randn(x.shape, device="cuda", generator=gen))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(out, x, w, b, precision, seed, padding=1)
    check(run(x), x, w, b, precision, seed, padding=1)
    spec = problem_spec(x, w, b, padding=1, precision=precision)
    # the ss form (TF32) in one launch; the rs form (fp32) with its edge kernel's
    prepared = ops.prepare(spec, ("strip",))
    expected = ("ss", False) if precision == "tf32" else ("rs", True)
    assert (prepared.config.mma, prepared.plan.edge_blocks > 0) == expected

"""GPU tests: values against a float64 reference, poisoned outputs, layouts, streams, graphs.

Every test draws fresh random inputs (the seed is in each failure message). Outputs are
poisoned: the caching allocator is filled with NaN before the call, so any element the kernel
does not write comes back NaN and fails the error check.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import shutil
import struct
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from cuda.bindings import driver

import cutlass_convt
from cutlass_convt import autotune, choose, env, ops, problems
from cutlass_convt.families import strip as strip_family
from cutlass_convt.families import direct as direct_family
from cutlass_convt.families import fprop_sm90 as fprop_family
from cutlass_convt.spec import PRECISIONS, ProblemSpec
from cutlass_convt.benchmark import errors

pytestmark = pytest.mark.gpu

FP32_REL = 1e-6   # 3xTF32 is fp32-accurate (DESIGN.md section 5: 3.1e-7 measured)
TF32_REL = 1e-3


def fresh_generator() -> tuple[torch.Generator, int]:
    seed = int.from_bytes(os.urandom(4), "little")
    return torch.Generator("cuda").manual_seed(seed), seed


def poison_allocator(large_bytes: int) -> None:
    """Fill every free block of PyTorch's caching allocator with NaN, after reserving a free
    block of ``large_bytes`` (large pool) and 16 of 1 MB (small pool), so that the op under
    test allocates only NaN-filled memory. Checks that a fresh allocation reads NaN."""
    torch.cuda.synchronize()
    reserve = [torch.empty(large_bytes // 4, device="cuda")]
    reserve += [torch.empty(2**18, device="cuda") for _ in range(16)]
    del reserve
    nan_bits = struct.unpack("<I", struct.pack("<f", float("nan")))[0]
    for segment in torch.cuda.memory_snapshot():
        address = segment["address"]
        for block in segment["blocks"]:
            if block["state"] == "inactive":
                err, = driver.cuMemsetD32(block.get("address", address), nan_bits, block["size"] // 4)
                assert err == driver.CUresult.CUDA_SUCCESS, err
            address += block["size"]
    torch.cuda.synchronize()
    for probe in (torch.empty(large_bytes // 8, device="cuda"), torch.empty(1000, device="cuda")):
        assert probe.isnan().all(), "poisoning failed"


def to_tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 -> nearest TF32 value (10 mantissa bits), as float32."""
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def check(out, x, w, b, precision, seed, torch_tf32_max_abs=None, **kwargs):
    """Assert ``out`` matches float64 within the precision's bounds; returns the errors."""
    ref = F.conv_transpose2d(x.double(), w.double(), None if b is None else b.double(), **kwargs)
    assert out.shape == ref.shape
    err = errors(out, ref)
    where = f"seed={seed} precision={precision} shape={tuple(x.shape)} {kwargs}: {err}"
    if precision == "fp32":
        assert err["rel"] <= FP32_REL, where
    else:
        emulated = errors(F.conv_transpose2d(
            to_tf32(x).double(), to_tf32(w).double(), None if b is None else b.double(), **kwargs), ref)
        bound = 2 * max(emulated["max_abs"], torch_tf32_max_abs or 0.0)
        assert err["rel"] <= TF32_REL and err["max_abs"] <= bound, f"{where}, max_abs bound {bound}"
    return err


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


SHAPES = [
    # N, C_in, C_out, H, W, (R, S), stride, padding, dilation, output_padding, groups, bias
    (2, 32, 32, 37, 53, (3, 3), 1, 0, 1, 0, 1, False),
    (3, 16, 8, 20, 17, (1, 1), 1, 0, 1, 0, 1, True),
    (1, 8, 24, 9, 31, (7, 7), 1, 3, 1, 0, 1, True),
    (2, 12, 20, 15, 11, (5, 3), 1, (2, 1), 1, 0, 1, False),
    (2, 6, 10, 13, 14, (3, 3), 1, 1, 2, 1, 1, True),          # alignment 2, output_padding via dilation
    (1, 3, 5, 19, 23, (3, 5), 1, 0, (2, 1), (1, 0), 1, True),  # alignment 1
    (5, 64, 32, 7, 9, (2, 2), 1, 0, 1, 0, 1, True),
    (2, 32, 16, 12, 10, (4, 4), 2, 1, 1, 0, 1, True),         # DCGAN-style 2x upsampling
    (2, 16, 16, 9, 11, (3, 3), 2, 1, 1, 1, 1, False),         # output_padding < stride
    (1, 8, 12, 7, 6, (3, 5), (3, 2), (1, 2), 1, (2, 1), 1, True),
    (2, 8, 8, 6, 7, (2, 2), 5, 0, 1, 0, 1, True),             # stride > kernel: untouched pixels
    (2, 32, 48, 11, 13, (3, 3), 1, 1, 1, 0, 4, True),         # groups
    (2, 32, 32, 11, 13, (3, 3), 2, 1, 1, 1, 32, True),        # depthwise, strided
    (1, 24, 24, 8, 9, (5, 5), 1, 2, 1, 0, 24, False),         # depthwise
    (1, 256, 32, 9, 20, (1, 1), 1, 0, 1, 0, 1, False),        # wide input: fp32 not direct
]


def _random_shapes(count: int, seed: int = 2026):
    """A fixed sweep of argument combinations (values are drawn fresh in each test)."""
    rng = random.Random(seed)
    shapes = []
    while len(shapes) < count:
        groups = rng.choice([1, 1, 1, 2, 4])
        c_in, c_out = groups * rng.randint(1, 12), groups * rng.randint(1, 12)
        kernel = (rng.randint(1, 5), rng.randint(1, 5))
        stride = (rng.randint(1, 3), rng.randint(1, 3))
        dilation = (1, 1) if stride != (1, 1) and rng.random() < 0.8 else (rng.randint(1, 2), rng.randint(1, 2))
        padding = (rng.randint(0, 2), rng.randint(0, 2))
        output_padding = tuple(rng.randint(0, max(s, d) - 1) for s, d in zip(stride, dilation))
        h, w = rng.randint(1, 20), rng.randint(1, 20)
        out = [(i - 1) * s - 2 * p + d * (k - 1) + o + 1 for i, s, p, d, k, o in
               zip((h, w), stride, padding, dilation, kernel, output_padding)]
        if min(out) >= 1:
            shapes.append((rng.randint(1, 3), c_in, c_out, h, w, kernel, stride, padding,
                           dilation, output_padding, groups, rng.random() < 0.5))
    return shapes


SWEEP = _random_shapes(24)


def _random_problem(shape, channels_last: bool):
    """Fresh random x (NCHW or channels_last), weight (C_in, C_out / groups, R, S) and bias
    (None without) of ``shape``, and the seed they were drawn from."""
    n, c_in, c_out, h, w, kernel, stride, padding, dilation, output_padding, groups, bias = shape
    gen, seed = fresh_generator()
    x = torch.randn(n, c_in, h, w, device="cuda", generator=gen)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    wt = torch.randn(c_in, c_out // groups, *kernel, device="cuda", generator=gen)
    b = torch.randn(c_out, device="cuda", generator=gen) if bias else None
    return x, wt, b, seed


def _run_shape(shape, precision, backend="auto", channels_last=False):
    n, c_in, c_out, h, w, kernel, stride, padding, dilation, output_padding, groups, bias = shape
    x, wt, b, seed = _random_problem(shape, channels_last)
    kwargs = dict(stride=stride, padding=padding, dilation=dilation,
                  output_padding=output_padding, groups=groups)
    poison_allocator(64 * 2**20)
    out = cutlass_convt.conv_transpose2d(x, wt, b, precision=precision, backend=backend, **kwargs)
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last
                             else torch.contiguous_format)
    check(out, x, wt, b, precision, seed, **kwargs)


def _spec_of(shape, precision="tf32", channels_last=False) -> ProblemSpec:
    n, c_in, c_out, h, w, kernel, stride, padding, dilation, output_padding, groups, bias = shape
    pair = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
    return ProblemSpec(batch=n, in_channels=c_in, out_channels=c_out, in_size=(h, w),
                       kernel_size=kernel, stride=pair(stride), padding=pair(padding),
                       output_padding=pair(output_padding), dilation=pair(dilation),
                       groups=groups, bias=bias, channels_last=channels_last,
                       precision=precision, arch=90)


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


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("shape, precision", [
    (shape, precision) for shape in DIRECT_SHAPES for precision in PRECISIONS
    if not direct_family.FAMILY.unsupported_reasons(_spec_of(shape, precision))],
    ids=lambda v: v if isinstance(v, str) else "x".join(map(str, v[:5])))
def test_direct_family(shape, precision, channels_last):
    _run_shape(shape, precision, backend="direct", channels_last=channels_last)


# Output-channel blocks on more tiles than CTAs: 8 images of P = 30, Q = 197 (a partial last
# column of tiles), 7 x 7 on 32 -> 32 channels, W_in % 4 == 1, padding, bias.
BLOCKS_SHAPE = (8, 32, 32, 30, 197, (7, 7), 1, 3, 1, 0, 1, True)
BLOCK_CASES = [(spec, config) for spec in (_spec_of(BLOCKS_SHAPE, p, cl) for p in PRECISIONS
                                           for cl in (False, True))
               for config in {(c.math, c.out_block): c for c in reversed(direct_family.direct_configs(spec))
                              if c.out_block < c.out_channels}.values()]


@pytest.mark.parametrize("spec, config", BLOCK_CASES, ids=[c.name for _, c in BLOCK_CASES])
def test_direct_family_blocks_take_many_tiles(spec, config):
    """Each math and block size's first configuration (wgmma and mma.sync, blocks of 16 and 8
    where they fit), every block's CTAs walking several tiles: the grid a multiple of the
    blocks, fewer CTAs per block than tiles; poisoned output against float64."""
    plan = ops.prepare_config(spec, config).plan
    blocks = config.out_channels // config.out_block
    (p, q), (th, tw) = spec.out_size, config.tile
    assert plan.ctas % blocks == 0 and plan.ctas // blocks < spec.batch * -(-p // th) * -(-q // tw)
    _run_config(BLOCKS_SHAPE, spec, config)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("shape", DIRECT_SHAPES[:3], ids=lambda s: "x".join(map(str, s[:5])))
def test_direct_family_tf32_on_mma_sync(shape, channels_last):
    """TF32 through the mma.sync path too (the kernel choice prefers wgmma on an H200)."""
    spec = _spec_of(shape, "tf32", channels_last)
    _run_config(shape, spec, next(c for c in direct_family.direct_configs(spec) if c.math == "mma_sync"))


def _run_config(shape, spec: ProblemSpec, config) -> None:
    """One stride-1, ungrouped ``shape`` in ``spec``'s precision (fresh random tensors in
    ``spec``'s layout, poisoned output) on the kernel ``config`` itself, not the one the choice
    would take."""
    padding = shape[7]  # (stride 1, dilation 1, groups 1 on these kernels)
    x, wt, b, seed = _random_problem(shape, spec.channels_last)
    poison_allocator(64 * 2**20)
    out = ops.run_prepared(ops.prepare_config(spec, config), x, wt, b)
    check(out, x, wt, b, spec.precision, seed, padding=padding)


def _run_plan(prepared: ops.Prepared, plan, x, wt, b, seed, padding) -> None:
    """``prepared``'s strip kernel launched on ``plan`` (a changed copy of its own), into a
    NaN-poisoned output in the problem's layout, checked against float64."""
    spec = prepared.spec
    y = torch.full(spec.out_shape, float("nan"), device="cuda")
    if spec.channels_last:
        y = y.contiguous(memory_format=torch.channels_last)
    prepared.kernel.run(plan, torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream,
                        x.data_ptr(), wt.data_ptr(), b.data_ptr(), y.data_ptr())
    check(y, x, wt, b, spec.precision, seed, padding=padding)


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


@pytest.mark.parametrize("case", STRIP_CASES, ids=_strip_id)
def test_strip_family(case):
    shape, channels_last = case
    assert strip_family.FAMILY.unsupported_reasons(_spec_of(shape, "tf32", channels_last)) == []
    _run_shape(shape, "tf32", backend="strip", channels_last=channels_last)


@pytest.mark.parametrize("case", STRIP_CASES[:2] + STRIP_CASES[6::5], ids=_strip_id)
def test_strip_family_every_tile(case):
    """Every strip configuration (N = 64, 96, 104, 128, and 112 on NCHW; rings of 6 to 10
    rows), not only the default the choice takes."""
    shape, channels_last = case
    spec = _spec_of(shape, "tf32", channels_last)
    configs = strip_family.strip_configs(spec)
    expected = {64, 96, 104, 128} if channels_last else {64, 96, 104, 112, 128}
    assert {c.tile_n for c in configs} == expected
    for config in configs:
        _run_config(shape, spec, config)


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


@pytest.mark.parametrize("shape, channels_last, precision", [
    (shape, channels_last, precision) for shape, channels_last, precisions in STRIP_RS_CASES
    for precision in precisions],
    ids=lambda v: v if isinstance(v, str) else ("nhwc" if v else "nchw") if isinstance(v, bool)
    else "x".join(map(str, v[:5])))
def test_strip_rs_form(shape, channels_last, precision):
    """fp32 through the kernel choice (the rs form is the strip family's only 3xTF32 kernel,
    and the choice's first family), then with its other walk; TF32 on the rs configuration
    itself (the choice takes the ss form)."""
    spec = _spec_of(shape, precision, channels_last)
    assert strip_family.FAMILY.unsupported_reasons(spec) == []
    if precision == "fp32":
        config, other = strip_family.strip_configs(spec)
        assert config.mma == other.mma == "rs" and config.split_all != other.split_all
        assert ops.prepare(spec).config == config
        _run_shape(shape, precision, channels_last=channels_last)
        _run_config(shape, spec, other)
    else:
        config = strip_family.strip_configs(spec)[-1]
        assert config.mma == "rs"
        _run_config(shape, spec, config)


def test_strip_rs_edge_plan():
    """The rs form's plan: with at most 8 output columns beyond whole strips of 128 (problem
    71: Q = 1026), 8 strips and the edge kernel for the last 2 columns, a block per 32 output
    pixels (at most 3 per CTA of the strip kernel: 257 blocks here); with more (Q = 150: 22),
    a last strip that overlaps the one before it, no edge."""
    for w, strips, pixels in ((1024, 8, 8 * 514 * 2), (148, 2, 0)):
        shape = (8, 32, 32, 512, w, (3, 3), 1, 0, 1, 0, 1, False)
        for channels_last in (False, True):
            spec = _spec_of(shape, "fp32", channels_last)
            plan = ops.prepare(spec, ("strip",)).plan
            assert plan.sizes[7] == strips  # sizes[7]: strips
            assert plan.edge_blocks == min(-(-pixels // 32), 3 * plan.ctas)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_strip_rs_edge_grid_stride(channels_last):
    """The edge kernel's blocks take more than one round of 32 output pixels when its grid is
    short: one block for 2 x 13 rows x 8 edge columns (208 pixels, 7 rounds, the last
    partial), with padding and bias, poisoned output, against float64."""
    shape = (2, 32, 32, 13, 136, (3, 3), 1, 1, 1, 0, 1, True)
    spec = _spec_of(shape, "fp32", channels_last)
    prepared = ops.prepare(spec, ("strip",))
    plan = dataclasses.replace(prepared.plan, edge_blocks=1)
    assert prepared.plan.edge_blocks > 1 and plan.sizes[7] == 1  # sizes[7]: strips
    _run_plan(prepared, plan, *_random_problem(shape, channels_last), padding=1)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_strip_walk_on_any_grid(precision):
    """strip_common.cuh's walk on channels_last (the ss form for TF32, the rs form's per-strip
    walk for fp32): 3 strips of 30 units (2 images x 15 pairs of rows) on grids of fewer CTAs
    than strips (2), a multiple of them (3, 9), and ones that leave CTAs over, which take the
    strips' tails (4, 5, 7, 11 CTAs: tails of 7, 10, 4 and 4 units; 61: a tail of 0, the one
    left over idle); every output against float64, poisoned before each launch."""
    shape = (2, 32, 32, 30, 298, (3, 3), 1, 1, 1, 0, 1, True)  # P = 30, Q = 298
    spec = _spec_of(shape, precision, True)
    tensors = _random_problem(shape, True)
    config = strip_family.strip_configs(spec)[0]
    assert not config.split_all
    prepared = ops.prepare_config(spec, config)
    strips = prepared.plan.sizes[7]  # sizes[7]: strips
    assert strips == 3 and prepared.plan.sizes[8] == 15  # sizes[8]: pairs
    for ctas in (2, 3, 4, 5, 7, 9, 11, 61):
        _run_plan(prepared, dataclasses.replace(prepared.plan, ctas=ctas), *tensors, padding=1)


def test_strip_plan_gives_each_nchw_strip_as_many_ctas():
    """The ss form on NCHW plans as many CTAs for each strip, so up to strips - 1 SMs idle
    (problem 71 on an H200: 130 CTAs 0.2-1% faster than 132, docs/perf-notes.md v0.28, v0.29;
    as fast as 132 with the left-over CTAs taking the strips' tails, v0.34); channels_last
    takes every SM; neither more CTAs than units (strip, image, pair of rows)."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    for batch in (1, 2):
        shape = (batch, 32, 32, 24, 1024, (3, 3), 1, 0, 1, 0, 1, False)  # Q = 1026, P = 26
        for channels_last in (False, True):
            spec = _spec_of(shape, "tf32", channels_last)
            plan = ops.prepare_config(spec, strip_family.strip_configs(spec)[0]).plan
            strips = plan.sizes[7]  # sizes[7]: strips
            assert strips == 10  # NCHW: 112 columns, 104 apart; channels_last: 104
            units = batch * 13 * strips
            ctas = sms if channels_last else sms // strips * strips
            assert plan.ctas == min(ctas, units), (batch, channels_last, plan.ctas)


# The SM90 fprop family (TF32, stride 1, C_in % 4 == 0, C_out % 32 == 0, padding <= R - 1,
# no bias): N tiles of 32, 64 and 128, partial M tiles, padding 0 to R - 1.
SM90_SHAPES = [
    (2, 32, 32, 37, 53, (3, 3), 1, 0, 1, 0, 1, False),
    (1, 16, 64, 20, 36, (3, 5), 1, (1, 2), 1, 0, 1, False),
    (2, 8, 128, 9, 17, (1, 1), 1, 0, 1, 0, 1, False),
    (1, 64, 32, 33, 65, (5, 5), 1, 4, 1, 0, 1, False),
]


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("shape", SM90_SHAPES, ids=lambda s: "x".join(map(str, s[:5])))
def test_fprop_sm90_family(shape, channels_last):
    assert fprop_family.FAMILY.unsupported_reasons(_spec_of(shape, "tf32", channels_last)) == []
    _run_shape(shape, "tf32", backend="fprop_sm90", channels_last=channels_last)


# Every family on every fixed shape and precision it can compute (the choice may prefer another).
FAMILY_SHAPES = [(family, shape, precision) for shape in SHAPES for precision in PRECISIONS
                 for family in choose.NAMES
                 if not choose.family(family).unsupported_reasons(_spec_of(shape, precision))]


@pytest.mark.parametrize("family, shape, precision", FAMILY_SHAPES,
                         ids=lambda v: v if isinstance(v, str) else "x".join(map(str, v[:5])))
def test_shapes_on_each_family(family, shape, precision):
    _run_shape(shape, precision, backend=family)


def test_every_fixed_shape_has_a_family():
    assert {(shape, precision) for _, shape, precision in FAMILY_SHAPES} == {
        (shape, precision) for shape in SHAPES for precision in PRECISIONS}


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("shape", SWEEP, ids=lambda s: "x".join(map(str, s[:5])))
def test_random_sweep(shape, precision):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the PyTorch route, tested below
        _run_shape(shape, precision)


_KB_CACHE: dict = {}


def _kernelbench_case(case_id):
    """Input, module and float64 reference of a KernelBench case, kept for the next test."""
    if case_id not in _KB_CACHE:
        _KB_CACHE.clear()
        torch.cuda.empty_cache()
        case = problems.find(case_id)
        gen, seed = fresh_generator()
        torch.manual_seed(seed)
        module = torch.nn.ConvTranspose2d(**case.module_kwargs()).cuda()
        x = case.make_input(generator=gen)
        with torch.no_grad():
            ref = F.conv_transpose2d(x.double(), module.weight.double(), None, case.stride,
                                     case.padding, case.output_padding, case.groups, case.dilation)
            torch_tf32 = errors(module(x), ref)["max_abs"]  # eager, TF32 on by default
        _KB_CACHE[case_id] = (case, module, x, ref, torch_tf32, seed)
    return _KB_CACHE[case_id]


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("case_id", list(problems.cases()))
def test_kernelbench_cases(case_id, precision, channels_last, monkeypatch):
    monkeypatch.setattr(ops, "_WARNED", set())  # the PyTorch-route warning is once per reason
    case, module, x, ref, torch_tf32, seed = _kernelbench_case(case_id)
    ours = cutlass_convt.ConvTranspose2d(**case.module_kwargs(), precision=precision).cuda()
    ours.load_state_dict(module.state_dict())
    inp = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    spec = case.spec(precision, 90)
    poison_allocator(2 * 4 * (x.numel() + ref.numel()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            out = ours(inp)
    routed = [w for w in caught if "instead of a CUTLASS kernel" in str(w.message)]
    refused = all(family.unsupported_reasons(spec) for family in choose.FAMILIES)
    assert bool(routed) == refused, [str(w.message) for w in caught]
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last
                             else torch.contiguous_format)
    err = errors(out, ref)
    where = f"{case_id} seed={seed} {precision} channels_last={channels_last}: {err}"
    if precision == "fp32":
        assert err["rel"] <= FP32_REL, where
    else:
        assert err["rel"] <= TF32_REL and err["max_abs"] <= 2 * torch_tf32, f"{where} torch {torch_tf32}"


def test_backend_choice_for_what_cutlass_cannot_run():
    """Stride 5 with dilation 2 (KernelBench 81) is refused by CUTLASS's strided dgrad."""
    x = torch.randn(2, 8, 6, 7, device="cuda")
    w = torch.randn(8, 4, 3, 3, device="cuda")
    kwargs = dict(stride=5, dilation=2, padding=1, precision="fp32")
    with pytest.raises(NotImplementedError, match="dilation"):
        cutlass_convt.conv_transpose2d(x, w, backend="cutlass", **kwargs)
    with pytest.warns(RuntimeWarning, match="dilation"):
        auto = cutlass_convt.conv_transpose2d(x, w, backend="auto", stride=5, dilation=2,
                                              padding=1, output_padding=1, precision="fp32")
    check(auto, x, w, None, "fp32", 0, stride=5, dilation=2, padding=1, output_padding=1)
    via_torch = cutlass_convt.conv_transpose2d(x, w, backend="torch", **kwargs)
    check(via_torch, x, w, None, "fp32", 0, stride=5, dilation=2, padding=1)


@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_channels_last_gives_same_values_and_layout(precision):
    gen, seed = fresh_generator()
    x = torch.randn(4, 32, 33, 45, device="cuda", generator=gen)
    w = torch.randn(32, 16, 3, 3, device="cuda", generator=gen)
    b = torch.randn(16, device="cuda", generator=gen)
    nchw = cutlass_convt.conv_transpose2d(x, w, b, padding=1, precision=precision)
    poison_allocator(64 * 2**20)
    x_cl = x.contiguous(memory_format=torch.channels_last)
    nhwc = cutlass_convt.conv_transpose2d(x_cl, w, b, padding=1, precision=precision)
    torch_nhwc = F.conv_transpose2d(x_cl, w, b, padding=1)
    assert nhwc.is_contiguous(memory_format=torch.channels_last) and not nhwc.is_contiguous()
    assert torch_nhwc.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(nhwc, nchw), f"seed={seed}"
    check(nhwc, x, w, b, precision, seed, padding=1)
    # a channels_last weight makes the output channels_last too (PyTorch's rule on CUDA)
    w_cl = w.contiguous(memory_format=torch.channels_last)
    out = cutlass_convt.conv_transpose2d(x, w_cl, b, padding=1, precision=precision)
    assert out.is_contiguous(memory_format=torch.channels_last) == \
        F.conv_transpose2d(x, w_cl, b, padding=1).is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, nchw)


def test_non_default_stream_is_honoured():
    """The kernel must run on the current stream, after work queued there before it."""
    gen, seed = fresh_generator()
    x = torch.randn(8, 32, 128, 128, device="cuda", generator=gen)
    w = torch.randn(32, 32, 3, 3, device="cuda", generator=gen)
    cutlass_convt.conv_transpose2d(x, w, precision="fp32")  # build and load outside the timing
    x_new = torch.randn(x.shape, device="cuda", generator=gen)
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)  # ~0.1 s: a kernel on another stream would run first
        x.copy_(x_new)
        out = cutlass_convt.conv_transpose2d(x, w, precision="fp32")
    stream.synchronize()
    check(out, x_new, w, None, "fp32", seed)


def test_cuda_graph_capture_and_replay():
    gen, seed = fresh_generator()
    x = torch.randn(2, 16, 40, 50, device="cuda", generator=gen)
    w = torch.randn(16, 8, 3, 3, device="cuda", generator=gen)
    b = torch.randn(8, device="cuda", generator=gen)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: build, load, plan
        cutlass_convt.conv_transpose2d(x, w, b, precision="fp32")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = cutlass_convt.conv_transpose2d(x, w, b, precision="fp32")
    x.copy_(torch.randn(x.shape, device="cuda", generator=gen))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check(out, x, w, b, "fp32", seed)


def test_first_call_in_a_fresh_thread():
    """A call from a thread whose first CUDA work is ours, where PyTorch's runtime has not made
    its context current (before, both calls failed with CUDA_ERROR_INVALID_CONTEXT): a problem
    new to the process (kernel choice and planning in that thread; the strip family's NCHW
    kernel of STRIP_NCHW_SHAPES[1] with another padding and batch), then the same problem
    cached, from a second fresh thread (launch only); poisoned outputs against float64."""
    x, w, b, seed = _random_problem((2, 32, 32, 20, 68, (3, 4), 1, (1, 0), 1, 0, 1, True), False)
    results = {}

    def call(tag):
        try:
            assert not int(driver.cuCtxGetCurrent()[1]), "a context is current: nothing tested"
            results[tag] = cutlass_convt.conv_transpose2d(x, w, b, padding=(1, 0),
                                                          precision="tf32", backend="strip")
            torch.cuda.synchronize()
        except Exception as error:  # reported below, in the test's thread
            results[tag] = error

    for tag in ("new problem", "cached problem"):
        poison_allocator(64 * 2**20)
        thread = threading.Thread(target=call, args=(tag,))
        thread.start()
        thread.join()
        y = results[tag]
        assert isinstance(y, torch.Tensor), f"{tag}: {y!r}"
        check(y, x, w, b, "tf32", seed, padding=(1, 0))


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
    spec = ops.problem_spec(x, w, b, padding=1, precision=precision)
    # the ss form (TF32) in one launch; the rs form (fp32) with its edge kernel's
    prepared = ops.prepare(spec, ("strip",))
    expected = ("ss", False) if precision == "tf32" else ("rs", True)
    assert (prepared.config.mma, prepared.plan.edge_blocks > 0) == expected


def test_unbatched_and_empty_batch():
    gen, seed = fresh_generator()
    w = torch.randn(8, 4, 3, 3, device="cuda", generator=gen)
    x = torch.randn(8, 10, 12, device="cuda", generator=gen)
    out = cutlass_convt.conv_transpose2d(x, w, precision="fp32")
    assert out.shape == (4, 12, 14)
    check(out, x, w, None, "fp32", seed)
    empty = cutlass_convt.conv_transpose2d(torch.randn(0, 8, 10, 12, device="cuda"), w)
    assert empty.shape == F.conv_transpose2d(torch.randn(0, 8, 10, 12, device="cuda"), w).shape
    # an empty batch that needs gradients keeps autograd's graph, as PyTorch's does: the
    # filter's and the bias's gradients are zeros
    x0 = torch.randn(0, 8, 10, 12, device="cuda", requires_grad=True)
    w0, b0 = w.clone().requires_grad_(), torch.randn(4, device="cuda", requires_grad=True)
    y0 = cutlass_convt.conv_transpose2d(x0, w0, b0)
    assert y0.shape == (0, 4, 12, 14) and y0.grad_fn is not None
    y0.sum().backward()
    assert x0.grad.shape == x0.shape and not w0.grad.any() and not b0.grad.any()


# (family, shape as in _run_shape, precision, channels_last, unbatched)
GRAD_CASES = [
    ("strip", (2, 32, 32, 9, 40, (3, 3), 1, 1, 1, 0, 1, True), "tf32", True, False),
    ("direct", (2, 16, 8, 7, 9, (3, 3), 1, 1, 1, 0, 1, True), "fp32", False, False),
    ("dgrad", (1, 8, 12, 5, 6, (3, 3), 2, 1, 1, 1, 1, True), "fp32", False, True),
]


@pytest.mark.parametrize("family, shape, precision, channels_last, unbatched", GRAD_CASES,
                         ids=lambda v: v if isinstance(v, str) else None)
def test_gradients_match_float64(family, shape, precision, channels_last, unbatched):
    """With grad enabled, our forward feeds PyTorch's backward: the gradients of x, the filter
    and the bias match float64 autograd (TF32 on or off as the precision says). Under no_grad
    nothing is recorded."""
    n, c_in, c_out, h, w, kernel, stride, padding, dilation, output_padding, groups, bias = shape
    gen, seed = fresh_generator()
    x = torch.randn(n, c_in, h, w, device="cuda", generator=gen)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    x = x[0] if unbatched else x
    wt = torch.randn(c_in, c_out // groups, *kernel, device="cuda", generator=gen)
    b = torch.randn(c_out, device="cuda", generator=gen)
    kwargs = dict(stride=stride, padding=padding, dilation=dilation,
                  output_padding=output_padding, groups=groups)
    leaves = [t.clone().requires_grad_() for t in (x, wt, b)]
    poison_allocator(64 * 2**20)
    out = cutlass_convt.conv_transpose2d(*leaves, precision=precision, backend=family, **kwargs)
    assert out.grad_fn is not None
    check(out.detach(), x, wt, b, precision, seed, **kwargs)
    grad = torch.randn(out.shape, device="cuda", generator=gen)
    out.backward(grad)
    refs = [t.detach().double().requires_grad_() for t in (x, wt, b)]
    F.conv_transpose2d(*refs, **kwargs).backward(grad.double())
    bound = TF32_REL if precision == "tf32" else 1e-5
    for name, ours, ref in zip(("input", "weight", "bias"), leaves, refs):
        err = errors(ours.grad, ref.grad)
        assert ours.grad.shape == ref.grad.shape and err["rel"] <= bound, (
            f"seed={seed} {family} {precision} grad of {name}: {err}")
    with torch.no_grad():
        assert cutlass_convt.conv_transpose2d(*leaves, precision=precision, backend=family,
                                              **kwargs).grad_fn is None


def test_module_loads_torch_state_dict_and_honours_output_size():
    gen, seed = fresh_generator()
    torch.manual_seed(seed)
    ref = torch.nn.ConvTranspose2d(16, 8, 3, padding=1, dilation=2, bias=True).cuda()
    ours = cutlass_convt.ConvTranspose2d(16, 8, 3, padding=1, dilation=2, bias=True,
                                         precision="fp32").cuda()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 16, 21, 22, device="cuda", generator=gen)
    size = [x.shape[2] + 2, x.shape[3] + 2]  # the only size stride 1 allows
    out = ours(x, output_size=size)
    assert out.shape == ref(x, output_size=size).shape == (2, 8, *size)
    check(out, x, ref.weight, ref.bias, "fp32", seed, padding=1, dilation=2)
    too_big = [size[0] + 1, size[1]]
    with pytest.raises(ValueError, match="requested an output size"):
        ref(x, output_size=too_big)
    with pytest.raises(ValueError, match="requested an output size"):
        ours(x, output_size=too_big)


def test_module_traced_by_torch_fx_computes_the_same():
    gen, seed = fresh_generator()
    torch.manual_seed(seed)
    ours = cutlass_convt.ConvTranspose2d(16, 8, 3, padding=1, precision="fp32").cuda()
    # inside a model, as a layer (a root's optional output_size would be traced as an input,
    # which torch's own module does not take either)
    traced = torch.fx.symbolic_trace(torch.nn.Sequential(ours))
    x = torch.randn(2, 16, 21, 22, device="cuda", generator=gen)
    with torch.no_grad():
        out = traced(x)
        assert torch.equal(out, ours(x))
    check(out, x, ours.weight, ours.bias, "fp32", seed, padding=1)


def test_seen_arguments_are_still_checked():
    """The per-signature fast path must not let through what the slow path refuses."""
    x = torch.randn(1, 4, 6, 6, device="cuda")
    w = torch.randn(4, 4, 3, 3, device="cuda")
    cutlass_convt.conv_transpose2d(x, w, stride=1, precision="fp32")
    with pytest.raises(TypeError, match="stride must be an int"):
        cutlass_convt.conv_transpose2d(x, w, stride=1.0, precision="fp32")
    with pytest.raises(TypeError, match="float32"):
        cutlass_convt.conv_transpose2d(x.double(), w, precision="fp32")


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 33, 17, 31), (3, 70, 2, 65), (70000, 1, 1, 2),
                                   (2, 32, 514, 1026)])
def test_layout_passes_are_exact(shape):
    """Our NCHW <-> NHWC kernels against PyTorch's copies, on poisoned outputs."""
    from cutlass_convt.families import layout as layout_passes

    layout = layout_passes.kernels(90)
    n, c, h, w = shape
    x = torch.randn(shape, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    nhwc = torch.full_like(x, float("nan"), memory_format=torch.channels_last)
    layout.transpose(True, x.data_ptr(), nhwc.data_ptr(), n, c, h * w, 0, stream)
    assert torch.equal(nhwc, x)
    back = torch.full_like(x, float("nan"))
    layout.transpose(False, nhwc.data_ptr(), back.data_ptr(), n, c, h * w, 0, stream)
    assert torch.equal(back, x)


def test_interleaved_timing_measures_each_route():
    """``benchmark.cuda_times_ms``: every trial calls each function once, in orders that vary,
    and each function's median is its own work (GPU sleeps of 1 and 3 units)."""
    from cutlass_convt.benchmark import cuda_times_ms

    unit = 200_000  # clock cycles: about 0.1 ms
    calls = []
    fns = {name: functools.partial(lambda name, units: (calls.append(name),
                                                        torch.cuda._sleep(units * unit)), name, units)
           for name, units in (("short", 1), ("long", 3), ("none", 0))}
    times = cuda_times_ms(fns, warmup=2, trials=20)
    assert set(times) == set(fns) and all(t["trials"] == 20 for t in times.values())
    trials = [calls[i:i + 3] for i in range(6, len(calls), 3)]
    assert len(trials) == 20 and all(sorted(order) == sorted(fns) for order in trials)
    assert len({tuple(order) for order in trials}) > 1
    ratio = (times["long"]["median"] - times["none"]["median"]) / (
        times["short"]["median"] - times["none"]["median"])
    assert 2.7 < ratio < 3.3, times


def test_mixed_devices_raise_before_gpu_work():
    x = torch.randn(1, 4, 5, 5, device="cuda")
    with pytest.raises(ValueError, match="weight must be a CUDA tensor"):
        cutlass_convt.conv_transpose2d(x, torch.randn(4, 4, 3, 3))
    with pytest.raises(ValueError, match="bias must be a CUDA tensor"):
        cutlass_convt.conv_transpose2d(x, torch.randn(4, 4, 3, 3, device="cuda"), torch.randn(4))


def test_tune_writes_a_record_that_the_next_call_uses(tmp_path, monkeypatch):
    """Tuning times the candidates on the real sizes and persists the fastest; the op uses it."""
    spec = ProblemSpec(batch=2, in_channels=32, out_channels=32, in_size=(40, 60),
                       kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), output_padding=(0, 0),
                       dilation=(1, 1), groups=1, bias=True, channels_last=False,
                       precision="fp32", arch=90)
    cache = tmp_path / "cache"
    shutil.copytree(env.cache_dir(), cache, ignore=shutil.ignore_patterns("tuning", ".locks"))
    monkeypatch.setenv("CUTLASS_CONVT_CACHE_DIR", str(cache))
    record = autotune.tune(spec, trials=5)
    timed = [r for r in record["results"] if "median_ms" in r]
    assert len(timed) == len(choose.candidates(spec))
    assert record["winner_name"] == min(timed, key=lambda r: r["median_ms"])["config"]
    assert choose.choose_config(spec).name == record["winner_name"]
    cutlass_convt.clear_caches()
    gen, seed = fresh_generator()
    x = torch.randn(2, 32, 40, 60, device="cuda", generator=gen)
    w = torch.randn(32, 32, 3, 3, device="cuda", generator=gen)
    b = torch.randn(32, device="cuda", generator=gen)
    out = cutlass_convt.conv_transpose2d(x, w, b, padding=1, precision="fp32")
    check(out, x, w, b, "fp32", seed, padding=1)
    (prepared,) = [v for v in ops._SEEN.values() if isinstance(v, ops.Prepared)]
    assert prepared.config.name == record["winner_name"]
    cutlass_convt.clear_caches()

"""The phase family: the phase arithmetic against PyTorch in float64 (CPU), its configurations
and limits (CPU), its build (nvcc), and its kernels on every class of problem it takes (GPU)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
import torch.nn.functional as F

from cutlass_convt import emit, problems
from cutlass_convt.families import phase
from cutlass_convt.families.phase import FAMILY as PHASE
from cutlass_convt.families.phase import (
    PhaseConfig,
    phase_configs,
    phase_grid,
    spec_grid,
    spec_taps,
    tap_element,
    unified_taps,
)

from helpers import run_shape, run_sixteen, spec_of


def decomposed(x, w, bias, stride, padding, output_padding, dilation, groups):
    """conv_transpose2d by the phase decomposition, with the family's own arithmetic
    (unified_taps, tap_element, phase_grid), in x's dtype: the GEMM the kernel computes."""
    n, c_in, h, w_in = x.shape
    k = w.shape[1]
    r, s = w.shape[2:]
    out = [(i - 1) * st - 2 * p + d * (kk - 1) + op + 1 for i, st, p, d, kk, op in
           zip((h, w_in), stride, padding, dilation, (r, s), output_padding)]
    th, tw = (unified_taps(kk, st, d) for kk, st, d in zip((r, s), stride, dilation))
    (j0, pj), (i0, qi) = (phase_grid(o, p, st) for o, p, st in zip(out, padding, stride))
    c = c_in // groups
    y = torch.empty(n, k * groups, *out, dtype=x.dtype)
    # x on the rows J - uh, columns I - uw that the taps reach, zero outside the image
    pad = torch.zeros(n, c_in, pj + th - 1, qi + tw - 1, dtype=x.dtype)
    rows = [j0 - (th - 1) + a for a in range(pj + th - 1)]
    cols = [i0 - (tw - 1) + b for b in range(qi + tw - 1)]
    for a, ih in enumerate(rows):
        for b, iw in enumerate(cols):
            if 0 <= ih < h and 0 <= iw < w_in:
                pad[:, :, a, b] = x[:, :, ih, iw]
    for g in range(groups):
        for ph in range(stride[0]):
            for pw in range(stride[1]):
                acc = torch.zeros(n, k, pj, qi, dtype=x.dtype)
                for uh in range(th):
                    for uw in range(tw):
                        rr = tap_element(uh, ph, r, stride[0], dilation[0])
                        ss = tap_element(uw, pw, s, stride[1], dilation[1])
                        if rr is None or ss is None:
                            continue
                        a0, b0 = th - 1 - uh, tw - 1 - uw
                        xs = pad[:, g * c:(g + 1) * c, a0:a0 + pj, b0:b0 + qi]
                        acc += torch.einsum("nchw,ck->nkhw", xs, w[g * c:(g + 1) * c, :, rr, ss])
                for jj in range(pj):
                    oh = (j0 + jj) * stride[0] + ph - padding[0]
                    if not 0 <= oh < out[0]:
                        continue
                    for ii in range(qi):
                        ow = (i0 + ii) * stride[1] + pw - padding[1]
                        if 0 <= ow < out[1]:
                            y[:, g * k:(g + 1) * k, oh, ow] = acc[:, :, jj, ii]
    if bias is not None:
        y += bias.view(1, -1, 1, 1)
    return y


def test_phase_decomposition_equals_conv_transpose2d_in_float64():
    rng = random.Random(35)
    for _ in range(60):
        stride = (rng.randint(1, 4), rng.randint(1, 4))
        dilation = (rng.randint(1, 3), rng.randint(1, 3))
        kernel = (rng.randint(1, 6), rng.randint(1, 6))
        padding = tuple(rng.randint(0, d * (kk - 1)) for d, kk in zip(dilation, kernel))
        output_padding = tuple(rng.randint(0, max(0, max(st, d) - 1))
                               for st, d in zip(stride, dilation))
        groups = rng.choice((1, 2))
        c_in, k = groups * rng.randint(1, 3), rng.randint(1, 3)
        h, w = rng.randint(1, 6), rng.randint(1, 6)
        out = [(i - 1) * st - 2 * p + d * (kk - 1) + op + 1 for i, st, p, d, kk, op in
               zip((h, w), stride, padding, dilation, kernel, output_padding)]
        if min(out) < 1:
            continue
        x = torch.randn(2, c_in, h, w, dtype=torch.float64)
        wt = torch.randn(c_in, k, *kernel, dtype=torch.float64)
        bias = torch.randn(k * groups, dtype=torch.float64)
        args = dict(stride=stride, padding=padding, output_padding=output_padding,
                    dilation=dilation, groups=groups)
        ref = F.conv_transpose2d(x, wt, bias, **args)
        got = decomposed(x, wt, bias, stride, padding, output_padding, dilation, groups)
        assert torch.allclose(got, ref, rtol=1e-12, atol=1e-12), args


def test_phase_arithmetic_of_the_model_classes():
    assert unified_taps(2, 2, 1) == 1 and unified_taps(4, 4, 1) == 1  # k = s
    assert unified_taps(4, 2, 1) == 2 and unified_taps(3, 2, 1) == 2  # k = 2 s, k3 s2
    assert unified_taps(9, 2, 1) == 5 and unified_taps(16, 8, 1) == 2  # FSRCNN, FCN
    assert unified_taps(3, 1, 1) == 3 and unified_taps(3, 2, 2) == 3  # stride 1; d = s
    # k3 s2: phase 0 has filter rows 0 and 2, phase 1 row 1 only
    assert [tap_element(u, 0, 3, 2, 1) for u in (0, 1)] == [0, 2]
    assert [tap_element(u, 1, 3, 2, 1) for u in (0, 1)] == [1, None]
    # k4 s2 p1 on 8 rows: output 16, J = (o + 1) // 2 in 0 ... 8
    assert phase_grid(16, 1, 2) == (0, 9)
    assert phase_grid(28, 0, 2) == (0, 14)  # k2 s2 on 14
    spec = spec_of((2, 64, 3, 32, 32, (4, 4), 2, 1, 1, 0, 1, False))
    assert spec_taps(spec) == (2, 2) and spec_grid(spec) == ((0, 0), (33, 33))


def test_configurations_fit_and_name_themselves():
    spec = spec_of((256, 256, 256, 14, 14, (2, 2), 2, 0, 1, 0, 1, True), channels_last=True)
    default, *others = phase_configs(spec)
    assert default.taps == (1, 1) and default.tile == (8, 2, 8) and default.block_n == 128
    assert default.ctas_per_sm == 1 and default.shared_bytes <= 227 * 1024
    assert default.name.startswith("phase_tf32_nhwc_t1x1_m8x2x8_n128_")
    assert {(c.block_n, c.ctas_per_sm) for c in others} >= {(256, 1), (32, 2)}
    assert phase.exact_mode(spec, 128) == 1 and phase.exact_mode(spec, 96) == 0
    assert len({c.name for c in [default, *others]}) == len(others) + 1
    tiny = spec_of((1, 56, 1, 540, 960, (9, 9), 2, 4, 1, 1, 1, True), precision="fp32")
    config = phase_configs(tiny)[0]
    assert config.taps == (5, 5) and config.block_n == 8 and config.ctas_per_sm == 1
    narrow = spec_of((2, 64, 48, 16, 16, (4, 4), 2, 1, 1, 0, 1, False))
    assert (phase_configs(narrow)[-1].block_n, phase_configs(narrow)[-1].ctas_per_sm) == (32, 2)
    assert config.nchw_out and config.precision == "fp32"
    assert config.shared_bytes <= 227 * 1024
    header = phase.config_h(config)
    assert "constexpr int kTH = 5;" in header and "constexpr bool kThreePass = true;" in header
    with pytest.raises(ValueError):
        PhaseConfig((1, 1), tile=(1, 8, 8))
    with pytest.raises(ValueError):
        PhaseConfig((1, 1), block_n=12)
    with pytest.raises(ValueError):  # the registers of two CTAs an SM hold 32 columns
        PhaseConfig((1, 1), block_n=64, ctas_per_sm=2)


def test_tf32_with_few_output_channels_runs_3xtf32():
    """cuDNN computes <= 16 output channels per group in exact fp32; the bound is twice its
    error, so the family's TF32 kernels there are 3xTF32 ones."""
    few = spec_of((2, 64, 16, 9, 9, (4, 4), 2, 1, 1, 0, 1, False))
    many = spec_of((2, 64, 24, 9, 9, (4, 4), 2, 1, 1, 0, 1, False))
    assert phase.kernel_precision(few) == "fp32" and phase_configs(few)[0].precision == "fp32"
    assert phase.kernel_precision(many) == "tf32"
    dilated = spec_of((2, 64, 64, 9, 9, (3, 3), 2, 1, 2, 0, 1, False))
    assert phase.exact_mode(dilated, 64) == 0


def test_huge_dilations_are_refused_not_raised():
    """Over 256 pixels a box dimension (k3 s2 at dilation 200): no configuration, a reason."""
    spec = spec_of((1, 8, 8, 8, 8, (3, 3), 2, 0, 200, 0, 1, False))
    assert phase_configs(spec) == []
    assert any("do not fit" in r for r in PHASE.unsupported_reasons(spec))


def test_limits():
    odd = spec_of((1, 6, 8, 8, 8, (4, 4), 2, 1, 1, 0, 1, False))
    assert any("multiple of 4" in r for r in PHASE.unsupported_reasons(odd))
    fine = spec_of((1, 8, 6, 8, 8, (3, 3), 2, 1, 2, 1, 2, True))
    assert PHASE.unsupported_reasons(fine) == []
    sm80 = dataclasses.replace(spec_of((1, 8, 8, 8, 8, (4, 4), 2, 1, 1, 0, 1, False)), arch=80)
    assert any("sm_80" in r for r in PHASE.unsupported_reasons(sm80))
    sources = PHASE.sources(phase_configs(fine)[0])
    assert sources.arch == "90a" and sources.symbols == (phase.PHASE_SYMBOL, phase.FILTER_SYMBOL)
    assert phase.PHASE_SYMBOL in emit.template("phase.cu")


# Every class of the issue: (n, c_in, c_out, h, w, kernel, stride, padding, dilation,
# output_padding, groups, bias); odd sizes leave partial tiles at every border.
CLASSES = {
    "k2s2": (3, 64, 48, 13, 21, (2, 2), 2, 0, 1, 0, 1, True),
    "k4s4": (2, 32, 40, 9, 11, (4, 4), 4, 0, 1, 0, 1, True),
    "k4s2p1": (2, 48, 64, 11, 17, (4, 4), 2, 1, 1, 0, 1, False),
    "k3s2op1": (2, 40, 24, 15, 9, (3, 3), 2, 1, 1, 1, 1, True),
    "k3s2p0": (1, 64, 64, 17, 19, (3, 3), 2, 0, 1, 0, 1, False),
    "k9s2": (1, 56, 1, 37, 45, (9, 9), 2, 4, 1, 1, 1, True),
    "k9s3": (1, 24, 3, 19, 23, (9, 9), 3, 3, 1, 0, 1, True),
    "k16s8": (1, 20, 17, 7, 9, (16, 16), 8, 4, 1, 0, 1, True),
    "dilated": (2, 32, 16, 13, 15, (3, 3), 2, 1, 2, 1, 1, True),
    "k3s5d2": (2, 32, 64, 9, 13, (3, 3), 5, 1, 2, 2, 1, True),  # KernelBench 81's class
    "cout1": (2, 64, 1, 21, 19, (4, 4), 2, 1, 1, 0, 1, True),
    "cout3": (4, 64, 3, 16, 16, (4, 4), 2, 1, 1, 0, 1, False),
    "cout17": (3, 128, 17, 14, 14, (4, 4), 2, 1, 1, 0, 1, True),
    "cin1024": (2, 1024, 64, 6, 10, (4, 4), 2, 1, 1, 0, 1, True),
    "groups": (2, 64, 96, 9, 13, (4, 4), 2, 1, 1, 0, 4, True),
    "stride1": (2, 64, 64, 19, 23, (3, 3), 1, 1, 1, 0, 1, True),
    "rect": (2, 36, 40, 10, 14, (4, 2), (2, 1), (1, 0), 1, (1, 0), 1, True),
}


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("case", sorted(CLASSES))
def test_phase_kernel_classes(case, channels_last, precision):
    run_shape(CLASSES[case], precision, backend="phase", channels_last=channels_last)


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_phase_kernel_at_scale_every_run(channels_last):
    """KernelBench 81's full size (25600 tiles, every CTA through both rings many times), run
    three times on fresh inputs: the size at which the box's release without a proxy fence
    let TMA overwrite pending reads (a few thousand outputs wrong per run, never at the
    classes' sizes)."""
    shape = (16, 32, 64, 64, 128, (3, 3), 5, 1, 2, 0, 1, False)
    for _ in range(3):
        run_shape(shape, "tf32", backend="phase", channels_last=channels_last)


SIXTEEN_BIT_CLASSES = ("k2s2", "k4s2p1", "k3s2op1", "k4s4", "k9s2", "dilated", "k3s5d2",
                       "cout3", "cout17", "cin1024", "groups", "stride1")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("case", SIXTEEN_BIT_CLASSES)
def test_phase_kernel_in_16_bits(case, channels_last, dtype):
    """float16 and bfloat16 on the phase family (wgmma k16, float32 sums, y rounded once),
    within helpers.run_sixteen's bounds."""
    run_sixteen(CLASSES[case], dtype, channels_last, backend="phase")


def test_16_bit_configurations_and_refusals():
    """16-bit problems get 64-channel chunks, TF32's register limits, no 3xTF32, their own
    kernel names, and are refused where their channels make no 16-byte TMA stride; the
    default takes ours with fewer than 32 output channels and a wave of tiles or more
    (FSRCNN, the keypoint head, DCGAN's last layer: 1.2-8.5x cuDNN's 16-bit kernels),
    PyTorch's otherwise (cuDNN faster on every benchmark row with 64 or more)."""
    for dtype, tag in (("bfloat16", "bf16"), ("float16", "fp16")):
        spec = dataclasses.replace(spec_of(CLASSES["cout3"], "fp32"), dtype=dtype)
        assert phase.kernel_precision(spec) == "tf32" and phase.chunk_channels(dtype) == 64
        config = phase.phase_configs(spec)[0]
        assert config.dtype == dtype and config.name.startswith(f"phase_{tag}_")
        assert config.slot_b == config.block_n * 128
        assert not PHASE.unsupported_reasons(spec)
        assert PHASE.torch_preferred(spec)  # 3 output channels, but 8 tiles: below a wave
        for case, ours in (("fsrcnn-x2", True), ("keypoint-train", True), ("dcgan-g5-b64", True),
                           ("sam-up1", False), ("centernet-deconv", False),
                           ("kernelbench-75", False)):  # 4 groups of 16: cuDNN faster
            for channels_last in (False, True):
                layer = dataclasses.replace(problems.find(case).spec("tf32", 90), dtype=dtype,
                                            channels_last=channels_last)
                assert PHASE.torch_preferred(layer) != ours, (case, channels_last)
        header = phase.config_h(config)
        assert ("kBf16 = true" in header) == (dtype == "bfloat16")
        assert ("kHalf = true" in header) == (dtype == "float16")
        rect = dataclasses.replace(spec_of(CLASSES["rect"]), dtype=dtype)  # 36 channels
        assert any("multiple of 8" in r for r in PHASE.unsupported_reasons(rect))
        with pytest.raises(ValueError):
            phase.PhaseConfig((1, 1), precision="fp32", dtype=dtype)
    float64 = dataclasses.replace(spec_of(CLASSES["k2s2"]), dtype="float64")
    assert PHASE.unsupported_reasons(float64)

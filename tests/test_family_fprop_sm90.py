"""The fprop_sm90 family: its limits, candidates, emission and forward-problem geometry (CPU)
and its values (GPU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from cutlass_convt import choose, program
from cutlass_convt.families.fprop_sm90 import FAMILY as FPROP_SM90
from cutlass_convt.families.fprop_sm90 import (
    FpropSm90Config,
    forward_bias,
    forward_filter,
    forward_problem,
    fprop_sm90_configs,
    k_is_s_wins,
    operation_h,
)

from helpers import (
    WEIGHT_FORMS,
    make_bias,
    make_weight,
    problem71,
    run_shape,
    run_sixteen,
    spec_of,
)


def test_fprop_sm90_family_limits():
    """TF32, float16 or bfloat16; stride 1 or kernel_size == stride with padding 0; 16-byte
    channel rows; the forward problem's K a multiple of 32; padding <= R - 1. The N tile is
    the widest of 32, 64, 128 that divides that K, the K tile 128 bytes of channels."""
    assert FPROP_SM90.unsupported_reasons(problem71()) == []
    assert FPROP_SM90.unsupported_reasons(problem71(bias=True, dtype="bfloat16")) == []
    assert fprop_sm90_configs(problem71(out_channels=64))[0].tile == (128, 64, 32)
    assert fprop_sm90_configs(problem71(out_channels=96))[0].tile == (128, 32, 32)
    assert fprop_sm90_configs(problem71(out_channels=256))[0].tile == (128, 128, 32)
    assert fprop_sm90_configs(problem71(dtype="float16"))[0].tile == (128, 32, 64)
    k_is_s = problem71(kernel_size=(2, 2), stride=(2, 2), out_channels=48, bias=True)
    assert FPROP_SM90.unsupported_reasons(k_is_s) == []
    (default, *_) = fprop_sm90_configs(k_is_s)
    assert default.tile == (128, 32, 32) and default.bias
    for kwargs, word in [(dict(precision="fp32"), "TF32"), (dict(stride=(2, 2)), "stride"),
                         (dict(kernel_size=(2, 2), stride=(2, 2), padding=(1, 0)), "stride"),
                         (dict(kernel_size=(2, 2), stride=(2, 2), output_padding=(1, 1)),
                          "stride"),
                         (dict(in_channels=6), "multiples of 4"),
                         (dict(out_channels=48), "multiple of 32"),
                         (dict(in_channels=36, dtype="bfloat16"), "multiples of 8"),
                         (dict(dtype="float64"), "float64"),
                         (dict(groups=2), "groups"),
                         (dict(padding=(3, 0)), "negative padding")]:
        (reason,) = FPROP_SM90.unsupported_reasons(problem71(**kwargs))
        assert word in reason, (kwargs, reason)


@pytest.mark.parametrize("changes, wins", [
    (dict(batch=32, in_channels=128, out_channels=128, in_size=(32, 32)), True),
    (dict(batch=32, in_channels=256, out_channels=64, in_size=(48, 48)), True),
    (dict(batch=4, in_channels=64, out_channels=32, in_size=(8, 8)), False),         # tiles
    (dict(batch=32, in_channels=512, out_channels=256, in_size=(32, 32)), False),    # C_in
], ids=["128ch", "256to64", "few-tiles", "512ch"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fprop_sm90_routes_kernel_size_equal_stride(changes, wins, dtype):
    """kernel_size == stride: the default choice is this family's default with at most 256
    input channels and 1024 tiles; otherwise it is tried after the others and prefers
    PyTorch's route. Stride 1 always prefers PyTorch's route."""
    spec = problem71(kernel_size=(2, 2), stride=(2, 2), bias=True, dtype=dtype, **changes)
    assert FPROP_SM90.unsupported_reasons(spec) == []
    assert k_is_s_wins(spec) is wins
    assert FPROP_SM90.demoted(spec) is not wins
    assert FPROP_SM90.torch_preferred(spec) is not wins
    order = [f.name for f in choose.family_order(spec)]
    assert (order.index("fprop_sm90") < order.index("phase")) is wins
    if wins:
        assert choose.choose_config(spec, torch_ok=True) == fprop_sm90_configs(spec)[0]
    assert FPROP_SM90.torch_preferred(problem71(dtype=dtype)) and not FPROP_SM90.demoted(
        problem71(dtype=dtype))


def test_fprop_sm90_config_names_and_emission():
    """The dtype and the bias are in the name and the emitted kernel: 16-bit operands, and
    the per-column bias fusion only with bias."""
    plain = FpropSm90Config("tf32", (128, 64, 32))
    half = FpropSm90Config("tf32", (128, 64, 64), dtype="bfloat16", bias=True)
    assert plain.name == "fprop_sm90_tf32_128x64x32_c1x1x1_sauto_sm90"
    assert half.name == "fprop_sm90_bf16_bias_128x64x64_c1x1x1_sauto_sm90"
    plain_h, half_h = operation_h(plain), operation_h(half)
    assert "LinCombPerColBias" not in plain_h and "CUTLASS_CONVT_BIAS 0" in plain_h
    assert "LinCombPerColBias<cutlass::bfloat16_t, float>" in half_h
    assert "CUTLASS_CONVT_BIAS 1" in half_h and "bf16nhwc" in half_h
    with pytest.raises(ValueError, match="precision"):
        FpropSm90Config("fp32", (128, 64, 32))


def _forward_on_cpu(spec, x, weight, bias):
    """y of ``spec`` computed the family's way, on the CPU in float64: x as
    :func:`forward_problem`'s packed NHWC activation, PyTorch's conv2d on
    :func:`forward_filter` with its padding, plus :func:`forward_bias`, read back as y."""
    n, h, w, c, k, r, s, p, q, pad_h, pad_w = forward_problem(spec)
    activation = x.permute(0, 2, 3, 1).reshape(n, h, w, c).permute(0, 3, 1, 2)
    upper_h, upper_w = p - 1 + r - h - pad_h, q - 1 + s - w - pad_w
    padded = F.pad(activation, (pad_w, upper_w, pad_h, upper_h))
    filter_krsc = forward_filter(program.Direct(0), spec, weight)
    assert tuple(filter_krsc.shape) == (k, r, s, c) and filter_krsc.is_contiguous()
    out = F.conv2d(padded, filter_krsc.permute(0, 3, 1, 2))
    if bias is not None:
        out = out + forward_bias(program.Direct(0), spec, bias).view(1, k, 1, 1)
    batch, c_out, h_out, w_out = spec.out_shape
    return out.permute(0, 2, 3, 1).reshape(batch, h_out, w_out, c_out).permute(0, 3, 1, 2)


@pytest.mark.parametrize("case", [
    dict(kernel_size=(3, 3), padding=(0, 0)), dict(kernel_size=(3, 5), padding=(1, 2)),
    dict(kernel_size=(5, 3), padding=(4, 0), output_padding=(0, 0)),
    dict(kernel_size=(2, 2), stride=(2, 2)), dict(kernel_size=(4, 4), stride=(4, 4)),
    dict(kernel_size=(2, 3), stride=(2, 3)), dict(kernel_size=(3, 1), stride=(3, 1)),
], ids=lambda c: "_".join(f"{k}{'x'.join(map(str, v))}" for k, v in c.items()))
@pytest.mark.parametrize("weight_form", WEIGHT_FORMS)
def test_forward_problem_equals_the_transposed_convolution(case, weight_form):
    """The forward problem, filter and bias of every form the family takes, computed with
    PyTorch's conv2d on the CPU in float64, equal conv_transpose2d (random sizes), from a
    weight in every layout and a strided bias; the filter the kernel reads is packed (a
    channels_last weight at kernel_size == stride gave a strided view before)."""
    gen = torch.Generator().manual_seed(sum(map(ord, str(case))))
    n, c_in, c_out = 2, 8, 16
    h, w = (int(v) for v in torch.randint(3, 9, (2,), generator=gen))
    spec = dataclasses.replace(
        spec_of((n, c_in, c_out, h, w, case["kernel_size"], case.get("stride", (1, 1)),
                 case.get("padding", (0, 0)), 1, case.get("output_padding", (0, 0)), 1, True)))
    assert FPROP_SM90.unsupported_reasons(dataclasses.replace(spec, out_channels=32)) == []
    x = torch.randn(n, c_in, h, w, generator=gen, dtype=torch.float64)
    weight = make_weight(spec.weight_shape, weight_form, torch.float64, gen)
    bias = make_bias(c_out, "strided", torch.float64, gen)
    ref = F.conv_transpose2d(x, weight, bias, stride=spec.stride, padding=spec.padding,
                             output_padding=spec.output_padding)
    torch.testing.assert_close(_forward_on_cpu(spec, x, weight, bias), ref, rtol=1e-12,
                               atol=1e-12)


# The SM90 fprop family: N tiles of 32, 64 and 128, partial M tiles, padding 0 to R - 1 at
# stride 1; kernel_size == stride (2, 4 and unequal; odd widths: partial M tiles at every
# image row); bias or not.
SM90_SHAPES = [
    (2, 32, 32, 37, 53, (3, 3), 1, 0, 1, 0, 1, False),
    (1, 16, 64, 20, 36, (3, 5), 1, (1, 2), 1, 0, 1, False),
    (2, 8, 128, 9, 17, (1, 1), 1, 0, 1, 0, 1, True),
    (1, 64, 32, 33, 65, (5, 5), 1, 4, 1, 0, 1, True),
    (3, 64, 64, 13, 19, (2, 2), 2, 0, 1, 0, 1, True),
    (2, 32, 48, 11, 7, (2, 2), 2, 0, 1, 0, 1, False),
    (1, 16, 32, 9, 10, (4, 4), 4, 0, 1, 0, 1, True),
    (2, 24, 32, 5, 14, (2, 3), (2, 3), 0, 1, 0, 1, True),
    (2, 136, 256, 7, 9, (2, 2), 2, 0, 1, 0, 1, True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("shape", SM90_SHAPES, ids=lambda s: "x".join(map(str, s[:6])))
def test_fprop_sm90_family(shape, channels_last):
    assert FPROP_SM90.unsupported_reasons(spec_of(shape, "tf32", channels_last)) == []
    run_shape(shape, "tf32", backend="fprop_sm90", channels_last=channels_last)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("shape", SM90_SHAPES, ids=lambda s: "x".join(map(str, s[:6])))
def test_fprop_sm90_family_sixteen_bit(shape, channels_last, dtype):
    """float16 and bfloat16 against float64 of the same 16-bit inputs (C_in a multiple of 8:
    the 8-channel shape is in, the 24-channel one too)."""
    spec = dataclasses.replace(spec_of(shape, "tf32", channels_last),
                               dtype=str(dtype).removeprefix("torch."))
    assert FPROP_SM90.unsupported_reasons(spec) == []
    run_sixteen(shape, dtype, channels_last, backend="fprop_sm90")

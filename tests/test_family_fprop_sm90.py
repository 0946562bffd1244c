"""The fprop_sm90 family: its limits and candidates (CPU) and its values (GPU)."""

from __future__ import annotations

import pytest

from cutlass_convt.families.fprop_sm90 import FAMILY as FPROP_SM90
from cutlass_convt.families.fprop_sm90 import fprop_sm90_configs

from helpers import problem71, run_shape, spec_of


def test_fprop_sm90_family_limits():
    """TF32 only, stride 1, C_in % 4 == 0, C_out % 32 == 0, padding <= R - 1, no bias; the N
    tile is the widest of 32, 64, 128 that divides C_out."""
    assert FPROP_SM90.unsupported_reasons(problem71()) == []
    assert fprop_sm90_configs(problem71(out_channels=64))[0].tile == (128, 64, 32)
    assert fprop_sm90_configs(problem71(out_channels=96))[0].tile == (128, 32, 32)
    assert fprop_sm90_configs(problem71(out_channels=256))[0].tile == (128, 128, 32)
    for kwargs, word in [(dict(precision="fp32"), "TF32"), (dict(stride=(2, 2)), "stride"),
                         (dict(in_channels=6), "C_in % 4"), (dict(out_channels=48), "C_out % 32"),
                         (dict(padding=(3, 0)), "negative padding"), (dict(bias=True), "bias")]:
        (reason,) = FPROP_SM90.unsupported_reasons(problem71(**kwargs))
        assert word in reason, (kwargs, reason)


# The SM90 fprop family (TF32, stride 1, C_in % 4 == 0, C_out % 32 == 0, padding <= R - 1,
# no bias): N tiles of 32, 64 and 128, partial M tiles, padding 0 to R - 1.
SM90_SHAPES = [
    (2, 32, 32, 37, 53, (3, 3), 1, 0, 1, 0, 1, False),
    (1, 16, 64, 20, 36, (3, 5), 1, (1, 2), 1, 0, 1, False),
    (2, 8, 128, 9, 17, (1, 1), 1, 0, 1, 0, 1, False),
    (1, 64, 32, 33, 65, (5, 5), 1, 4, 1, 0, 1, False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("shape", SM90_SHAPES, ids=lambda s: "x".join(map(str, s[:5])))
def test_fprop_sm90_family(shape, channels_last):
    assert FPROP_SM90.unsupported_reasons(spec_of(shape, "tf32", channels_last)) == []
    run_shape(shape, "tf32", backend="fprop_sm90", channels_last=channels_last)

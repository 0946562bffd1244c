"""The layout passes (NCHW <-> NHWC): their build (nvcc) and exactness (GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cutlass_convt import build, program
from cutlass_convt.families import layout


@pytest.mark.nvcc
def test_layout_passes_build(tmp_path, monkeypatch):
    """The layout kernels build, here into a cache folder given as a relative path (as
    CUTLASS_CONVT_CACHE_DIR may be), with nothing but the entry's files in it."""
    monkeypatch.chdir(tmp_path)
    config = layout.LayoutConfig(90)
    artifact = build.build(config, layout.LAYOUT.sources(config), Path("cache"))
    cubin = artifact.cubin.read_bytes()
    assert len(layout.SYMBOLS) == 4
    for symbol in layout.SYMBOLS:
        assert symbol.encode() in cubin
    assert not (artifact.path / build.HOST_LIB).exists()
    assert set(artifact.manifest["files"]) == {build.CUBIN, "layout.cu"}


def test_layout_passes_refuse_other_element_sizes():
    """Only 2- and 4-byte elements move (before any GPU work)."""
    passes = layout.LayoutKernels.__new__(layout.LayoutKernels)
    with pytest.raises(ValueError, match="2- or 4-byte"):
        passes.transpose(program.Direct(0), True, 0, 0, 1, 1, 1, 0, element_bytes=8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 33, 17, 31), (3, 70, 2, 65), (70000, 1, 1, 2),
                                   (2, 32, 514, 1026)])
def test_layout_passes_are_exact(shape, dtype):
    """Our NCHW <-> NHWC kernels against PyTorch's copies, on poisoned outputs, per dtype."""
    from cutlass_convt.families import layout as layout_passes

    layout = layout_passes.kernels(90)
    n, c, h, w = shape
    x = torch.randn(shape, device="cuda").to(dtype)
    ex = program.Direct(torch.cuda.current_stream().cuda_stream)
    nhwc = torch.full_like(x, float("nan"), memory_format=torch.channels_last)
    layout.transpose(ex, True, x.data_ptr(), nhwc.data_ptr(), n, c, h * w, 0, x.element_size())
    assert torch.equal(nhwc, x)
    back = torch.full_like(x, float("nan"))
    layout.transpose(ex, False, nhwc.data_ptr(), back.data_ptr(), n, c, h * w, 0,
                     x.element_size())
    assert torch.equal(back, x)

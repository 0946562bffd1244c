"""The layout passes: our NCHW <-> NHWC transposes (``templates/layout.cu``) for the families
whose kernels read and write NHWC only (CUTLASS's: ``dgrad``, ``fprop_sm90``).

One batched transpose of [N][C][HW] <-> [N][HW][C] of packed float32, float16 or bfloat16
tensors through a padded shared-memory tile of 32 channels x 128 pixels, coalesced both ways;
sizes are runtime arguments, so one build per SM serves every problem.
``docs/design/layout.md``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from .. import cuda, program
from ..build import Sources
from .base import load

NCHW_TO_NHWC_SYMBOL = "cutlass_convt_nchw_to_nhwc"
NHWC_TO_NCHW_SYMBOL = "cutlass_convt_nhwc_to_nchw"
SIXTEEN_BIT_SUFFIX = "_16"  # the same kernels on 16-bit elements
SYMBOLS = (NCHW_TO_NHWC_SYMBOL, NHWC_TO_NCHW_SYMBOL, NCHW_TO_NHWC_SYMBOL + SIXTEEN_BIT_SUFFIX,
           NHWC_TO_NCHW_SYMBOL + SIXTEEN_BIT_SUFFIX)


@dataclass(frozen=True)
class LayoutConfig:
    """The layout-pass kernels for one SM version (``arch``)."""

    arch: int

    @property
    def name(self) -> str:
        return f"layout_sm{self.arch}"


class LayoutKernels:
    """The layout passes of one build, loaded in this process."""

    # layout.cu's kTileC, kTilePixels and kRows (blockDim = (32, kRows)); the grid's z limit
    TILE_C, TILE_PIXELS, ROWS, MAX_GRID_Z = 32, 128, 8, 65535

    def __init__(self, artifact):
        self.artifact = artifact
        self._library = cuda.Library(artifact.cubin.read_bytes())

    def transpose(self, ex, to_nhwc: bool, src: int, dst: int, n: int, c: int, hw: int,
                  device: int, element_bytes: int = 4) -> None:
        """``src`` [n][c][hw] -> ``dst`` [n][hw][c] when ``to_nhwc``, else [n][hw][c] ->
        [n][c][hw]; device addresses of packed tensors of ``element_bytes`` (4: float32, 2:
        float16 or bfloat16) on ``device``, launched on ``stream``. Raises ValueError for
        other element sizes."""
        if element_bytes not in (2, 4):
            raise ValueError(f"layout passes move 2- or 4-byte elements, not {element_bytes}")
        symbol = NCHW_TO_NHWC_SYMBOL if to_nhwc else NHWC_TO_NCHW_SYMBOL
        kernel = self._library.kernel(symbol + (SIXTEEN_BIT_SUFFIX if element_bytes == 2
                                                else ""), device)
        grid_x, grid_y = -(-hw // self.TILE_PIXELS), -(-c // self.TILE_C)
        for n0 in range(0, n, self.MAX_GRID_Z):
            offset = element_bytes * n0 * c * hw
            # the kernels' arguments: (T const *src, T *dst, int C, int64_t HW)
            ex.launch(kernel, (grid_x, grid_y, min(n - n0, self.MAX_GRID_Z)),
                      (32, self.ROWS, 1), 0, program.params((src + offset,)),
                      program.params((dst + offset,)), program.Params(struct.pack("<i", c)),
                      program.Params(struct.pack("<q", hw)))


class _Layout:
    """The layout passes as a build: ``sources`` as the families give theirs."""

    config_class = LayoutConfig

    def sources(self, config: LayoutConfig) -> Sources:
        return Sources("layout.cu", SYMBOLS, arch=str(config.arch), cutlass=False)


LAYOUT = _Layout()


def build_of(arch: int) -> tuple[LayoutConfig, Sources]:
    """The layout passes' build for SM ``arch``, as a family's ``builds`` lists it."""
    config = LayoutConfig(arch)
    return config, LAYOUT.sources(config)


def kernels(arch: int) -> LayoutKernels:
    """The process-wide layout passes for SM ``arch`` (built and cached on first use)."""
    return load(LAYOUT, LayoutConfig(arch), LayoutKernels)


def to_nhwc(ex, t: torch.Tensor, alignment_bytes: int, passes: LayoutKernels,
            device: int) -> torch.Tensor:
    """A 4-D float32, float16 or bfloat16 tensor as packed channels_last with its address a
    multiple of ``alignment_bytes``: itself when it already is; through our layout pass when
    it is packed NCHW; else through PyTorch's copy."""
    if t.is_contiguous(memory_format=torch.channels_last) or not t.is_contiguous():
        return ex.packed(t, alignment_bytes, torch.channels_last)
    out = ex.new_packed(t, t.shape, True)
    n, c, h, w = t.shape
    size = t.element_size()
    passes.transpose(ex, True, ex.address("NCHW source", t, t.shape, t.dtype, size),
                     ex.address("NHWC copy", out, t.shape, t.dtype, size, True), n, c, h * w,
                     device, size)
    return out


def from_nhwc(ex, y: torch.Tensor, channels_last: bool, passes: LayoutKernels,
              device: int) -> torch.Tensor:
    """Packed NHWC ``y`` (float32, float16 or bfloat16) in the problem's memory format: itself
    for ``channels_last``, else through the layout pass into a new NCHW tensor."""
    if channels_last:
        return y
    y_nchw = ex.new_packed(y, y.shape, False)
    n, c, h, w = y.shape
    size = y.element_size()
    passes.transpose(ex, False, ex.address("NHWC source", y, y.shape, y.dtype, size, True),
                     ex.address("NCHW copy", y_nchw, y.shape, y.dtype, size), n, c, h * w,
                     device, size)
    return y_nchw

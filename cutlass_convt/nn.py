"""``ConvTranspose2d``: a drop-in for ``torch.nn.ConvTranspose2d`` running on CUTLASS."""

from __future__ import annotations

import torch

from .args import check_choice
from .ops import BACKENDS, conv_transpose2d
from .spec import PRECISIONS

# torch.fx.symbolic_trace records the call as one node (as it does F.conv_transpose2d for
# torch's module) instead of tracing into its checks of the tensors.
torch.fx.wrap("conv_transpose2d")


class ConvTranspose2d(torch.nn.ConvTranspose2d):
    """``torch.nn.ConvTranspose2d`` whose forward runs :func:`cutlass_convt.conv_transpose2d`.

    Same constructor (plus keyword-only ``precision``: ``"tf32"``, ``"fp32"`` or ``None`` to
    follow ``torch.backends.cudnn.allow_tf32``; and ``backend``: ``"auto"``, ``"cutlass"``,
    ``"strip"``, ``"direct"``, ``"fprop_sm90"``, ``"dgrad"`` or ``"torch"``, see
    :func:`cutlass_convt.conv_transpose2d`), same parameters (``weight`` of shape
    (in_channels, out_channels / groups, kH, kW), optional ``bias`` of shape (out_channels,)),
    same initialisation and ``state_dict``, so a torch module's ``state_dict`` loads into it and
    ``isinstance(m, torch.nn.ConvTranspose2d)`` holds. ``forward(input, output_size=None)``
    picks ``output_padding`` from ``output_size`` as PyTorch does. Inputs must be float32 CUDA
    tensors; see :func:`cutlass_convt.conv_transpose2d` for shapes, layouts and errors.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1,
                 padding_mode: str = "zeros", device=None, dtype=None, *,
                 precision: str | None = None, backend: str = "auto"):
        check_choice(precision, "precision", (*PRECISIONS, None))
        check_choice(backend, "backend", BACKENDS)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, output_padding,
                         groups, bias, dilation, padding_mode, device, dtype)
        self.precision = precision
        self.backend = backend

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        if self.padding_mode != "zeros":
            raise ValueError("Only 'zeros' padding mode is supported for ConvTranspose2d")
        num_spatial_dims = 2
        output_padding = self._output_padding(input, output_size, self.stride, self.padding,
                                              self.kernel_size, num_spatial_dims, self.dilation)
        return conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding,
                                output_padding, self.groups, self.dilation,
                                precision=self.precision, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, precision={self.precision!r}, backend={self.backend!r}"

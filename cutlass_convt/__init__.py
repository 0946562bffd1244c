"""cutlass_convt: ``conv_transpose2d`` for PyTorch on kernels emitted from Python (CUTLASS's and
our own, on CUTLASS/CuTe headers).

Data flows one way: arguments -> :class:`~cutlass_convt.spec.ProblemSpec` (``spec``) ->
kernel family and configuration (``tune.choose_config``) -> C++ source (``emit``) -> nvcc + cache under
``generated/`` (``build``) -> ``cuda.bindings.driver`` launch on PyTorch's current stream
(``launch``) -> output tensor (``ops``, ``nn``).
"""

from .nn import ConvTranspose2d
from .ops import conv_transpose2d

__all__ = ["ConvTranspose2d", "conv_transpose2d"]
__version__ = "0.1.0"

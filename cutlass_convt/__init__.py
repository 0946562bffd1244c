"""cutlass_convt: ``conv_transpose2d`` for PyTorch on kernels emitted from Python (CUTLASS's and
our own, on CUTLASS/CuTe headers).

Data flows one way: arguments -> :class:`~cutlass_convt.spec.ProblemSpec` (``args``) ->
kernel family and configuration (``choose``) -> C++ source (the family's ``sources``, ``emit``)
-> nvcc + cache under ``generated/`` (``build``) -> ``cuda.bindings.driver`` launch on
PyTorch's current stream (the family's ``prepare`` and ``run``, ``cuda``) -> output tensor
(``ops``, ``nn``). ``docs/design/overview.md`` describes it.
"""

from .args import InvalidArgument
from .build import BuildError
from .nn import ConvTranspose2d, convert_, revert_, warmup
from .ops import clear_caches, conv_transpose2d, set_measuring
from .spec import UnsupportedProblem

__all__ = ["BuildError", "ConvTranspose2d", "InvalidArgument", "UnsupportedProblem",
           "clear_caches", "conv_transpose2d", "convert_", "revert_", "set_measuring", "warmup"]
__version__ = "0.1.0"

"""``ConvTranspose2d``, a drop-in for ``torch.nn.ConvTranspose2d`` on cutlass_convt, and the
conversion of whole models (``convert_``, ``revert_``, ``warmup``)."""

from typing import List, Optional  # (evaluated annotations: torch.jit.script reads them)

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
    follow PyTorch's TF32 setting for convolutions; and ``backend``: ``"auto"``, ``"cutlass"``,
    ``"strip"``, ``"direct"``, ``"fprop_sm90"``, ``"dgrad"`` or ``"torch"``, see
    :func:`cutlass_convt.conv_transpose2d`), same parameters (``weight`` of shape
    (in_channels, out_channels / groups, kH, kW), optional ``bias`` of shape (out_channels,)),
    same initialisation and ``state_dict``, so a torch module's ``state_dict`` loads into it and
    ``isinstance(m, torch.nn.ConvTranspose2d)`` holds. ``forward(input, output_size=None)``
    picks ``output_padding`` from ``output_size`` as PyTorch does. Float32 CUDA inputs run on
    our kernels, others on PyTorch's; see :func:`cutlass_convt.conv_transpose2d` for shapes,
    layouts and errors. :func:`convert_` turns a model's ``torch.nn.ConvTranspose2d`` layers
    into these in place.
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

    precision: Optional[str]  # (attribute types for torch.jit.script)
    backend: str

    def forward(self, input: torch.Tensor,
                output_size: Optional[List[int]] = None) -> torch.Tensor:
        if self.padding_mode != "zeros":
            raise ValueError("Only 'zeros' padding mode is supported for ConvTranspose2d")
        num_spatial_dims = 2
        output_padding = self._output_padding(input, output_size, self.stride, self.padding,
                                              self.kernel_size, num_spatial_dims, self.dilation)
        if torch.jit.is_scripting():  # a scripted module calls the op (as jit.trace records it)
            return torch.ops.cutlass_convt.conv_transpose2d(
                input, self.weight, self.bias, self.stride, self.padding, output_padding,
                self.groups, self.dilation, self.precision, self.backend)
        return self._eager(input, output_padding)

    @torch.jit.unused
    def _eager(self, input: torch.Tensor, output_padding: List[int]) -> torch.Tensor:
        return conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding,
                                output_padding, self.groups, self.dilation,
                                precision=self.precision, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, precision={self.precision!r}, backend={self.backend!r}"


# ----------------------------------------------------------------------------------------------
# Model conversion: the class of each converted module is swapped in place, so that the module
# object, its Parameters (optimizer state, DDP buckets, tied weights), buffers, hooks and
# parametrizations stay what they were.

def _swap(module: torch.nn.Module, base: type, model_class: type) -> bool:
    """Make ``module`` one of class ``base`` if its class is ``model_class``, or the subclass
    ``torch.nn.utils.parametrize`` made of it (then a copy of that subclass on ``base``, so
    that its properties keep working and ``remove_parametrizations`` lands on ``base``);
    False, unchanged, for anything else (a user's subclass may have its own forward)."""
    cls = type(module)
    if cls is model_class:
        module.__class__ = base
        return True
    if cls.__bases__ != (model_class,) or not torch.nn.utils.parametrize.is_parametrized(module):
        return False
    body = {k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")}
    module.__class__ = type(cls.__name__, (base,), body)
    return True


def _check_module(model, function: str) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{function}() takes a torch.nn.Module, got {type(model).__name__}")


def convert_(model: torch.nn.Module, *, filter_fn=None, precision: str | None = None,
             backend: str = "auto") -> list[str]:
    """Run every ``torch.nn.ConvTranspose2d`` of ``model`` (the model itself included) on
    cutlass_convt, in place: each module's class becomes :class:`ConvTranspose2d` with
    ``precision`` and ``backend`` (see :func:`cutlass_convt.conv_transpose2d`), and nothing else
    changes (the same module and Parameter objects, so optimizer state, DDP's buckets, tied
    weights, hooks and parametrizations survive). ``filter_fn(module, name)`` may refuse
    layers. Skipped: padding modes other than ``"zeros"``, subclasses of
    ``torch.nn.ConvTranspose2d`` (their forward may differ) and modules already converted.
    Returns the converted modules' names (``""`` for the model itself). Raises TypeError when
    ``model`` is not a ``torch.nn.Module``, ValueError for an unknown ``precision`` or
    ``backend``."""
    _check_module(model, "convert_")
    check_choice(precision, "precision", (*PRECISIONS, None))
    check_choice(backend, "backend", BACKENDS)
    converted = []
    for name, module in model.named_modules():
        if (not isinstance(module, torch.nn.ConvTranspose2d) or module.padding_mode != "zeros"
                or (filter_fn is not None and not filter_fn(module, name))
                or not _swap(module, ConvTranspose2d, torch.nn.ConvTranspose2d)):
            continue
        module.precision, module.backend = precision, backend
        converted.append(name)
    return converted


def revert_(model: torch.nn.Module) -> list[str]:
    """Undo :func:`convert_` in place: every :class:`ConvTranspose2d` of ``model`` (converted,
    or made as one; parametrized or not, but not a user's subclass) becomes a
    ``torch.nn.ConvTranspose2d`` again, with the same module and Parameter objects. Returns
    their names. Raises TypeError when ``model`` is not a ``torch.nn.Module``."""
    _check_module(model, "revert_")
    reverted = []
    for name, module in model.named_modules():
        if (isinstance(module, ConvTranspose2d)
                and _swap(module, torch.nn.ConvTranspose2d, ConvTranspose2d)):
            del module.precision, module.backend
            reverted.append(name)
    return reverted


def warmup(model: torch.nn.Module, *example_inputs, **example_kwargs) -> None:
    """Build and load every kernel ``model``'s cutlass_convt layers need for these inputs, plan
    them and measure the default choice of each new problem (:mod:`cutlass_convt.measure`),
    before training or graph capture: one forward pass in eval mode without
    gradients (no batch-norm statistics change, no dropout), the training flags restored
    after. The shapes, dtypes, layouts and devices of ``example_inputs`` should be those of
    the real runs. Raises TypeError when ``model`` is not a ``torch.nn.Module``."""
    _check_module(model, "warmup")
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        with torch.no_grad():
            model(*example_inputs, **example_kwargs)
    finally:
        for module, training in modes:
            module.training = training

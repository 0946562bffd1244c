"""The kernel-family protocol and what the families share.

A kernel family is one module of this package exporting one object, ``FAMILY``, that implements
:class:`Family`: which problems it computes (:meth:`Family.unsupported_reasons`), its candidate
configurations (default first), the C++ a build of one configuration compiles
(:meth:`Family.sources`), and how a built kernel is planned for a problem on a device and run
on tensors. ``families/__init__.py`` lists the families in order of preference; nothing outside
a family's module switches on the family. ``docs/design/overview.md`` says how to add one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .. import build, cuda
from ..build import Sources
from ..spec import ProblemSpec, UnsupportedProblem

__all__ = ["CallerLayoutFamily", "Family", "Prepared", "UnsupportedProblem", "cutlass_status",
           "element_type", "load", "memory_format", "sm80_reasons"]


class Family:
    """One kernel family: the protocol every family module's ``FAMILY`` implements (subclasses
    override every method but :meth:`supports_arch`, :meth:`torch_preferred`,
    :meth:`demoted`, :meth:`bound_fields`, :meth:`config_reasons` and :meth:`builds`).
    :meth:`candidates`, :meth:`torch_preferred` and :meth:`demoted` are called only for a
    problem :meth:`unsupported_reasons` has no reason against, and :meth:`candidates` then
    returns at least one configuration, each with no :meth:`config_reasons` against it.
    ``name`` is its ``backend=`` name; ``config_class`` its frozen configuration dataclass (with
    a ``name`` and an ``arch``); ``summary`` its row of the README's "what runs where" table:
    (the problems it takes, what runs them)."""

    name: str
    config_class: type
    summary: tuple[str, str]

    def unsupported_reasons(self, spec: ProblemSpec) -> list[str]:
        """Why the family cannot compute ``spec`` (empty if it can)."""
        raise NotImplementedError

    def candidates(self, spec: ProblemSpec) -> list:
        """The configurations worth timing for ``spec`` (one the family can compute), its
        default first."""
        raise NotImplementedError

    def bound_fields(self, spec: ProblemSpec) -> dict[str, object]:
        """The configuration fields that ``spec`` fixes, with the values of a configuration
        built for it (default: its SM, and its dtype where the configuration has one)."""
        fields = {"arch": spec.arch}
        if "dtype" in self.config_class.__dataclass_fields__:
            fields["dtype"] = spec.dtype
        return fields

    def config_reasons(self, spec: ProblemSpec, config) -> list[str]:
        """Why ``config``, one of this family's configurations, cannot compute ``spec`` (a
        problem the family takes): a field of :meth:`bound_fields` with another value
        (built for another SM, dtype, precision, layout or shape). Checked before a
        configuration is prepared, so that no kernel runs on a problem it was not built for."""
        return [f"{config.name} has {name}={getattr(config, name, None)!r}; the problem needs "
                f"{value!r}" for name, value in self.bound_fields(spec).items()
                if getattr(config, name, None) != value]

    def supports_arch(self, arch: int) -> bool:
        """Whether the family's kernels run on GPUs of SM ``arch`` (default: sm_80 or later)."""
        return arch >= 80

    def torch_preferred(self, spec: ProblemSpec) -> bool:
        """Whether PyTorch's own implementation measured faster than this family's default on
        ``spec``'s class, so that the default choice (``backend="auto"``, no tuning record)
        takes PyTorch's when this family would be the one chosen (default: False)."""
        return False

    def demoted(self, spec: ProblemSpec) -> bool:
        """Whether the default choice tries this family after the others for ``spec`` (its
        default configuration was measured slower than theirs there). False unless a family
        says otherwise."""
        return False

    def sources(self, config) -> Sources:
        """What a build of ``config`` compiles: templates, emitted header, entry symbols,
        host files, target SM."""
        raise NotImplementedError

    def builds(self, config) -> tuple[tuple[object, Sources], ...]:
        """Every build a run of ``config`` needs, as (configuration, sources): its own, and,
        for a family that needs them, the layout passes'."""
        return ((config, self.sources(config)),)

    def prepare(self, spec: ProblemSpec, config, device: int) -> Prepared:
        """Build (cached), load and plan ``config`` for ``spec`` on CUDA device ``device``,
        whose primary context is current. Raises :class:`UnsupportedProblem` when the kernel
        cannot implement the problem, :class:`~cutlass_convt.build.BuildError` when it cannot
        be built."""
        raise NotImplementedError

    def run(self, prepared: Prepared, ex, input: torch.Tensor, weight: torch.Tensor,
            bias: torch.Tensor | None) -> torch.Tensor:
        """y for the 4-D ``input`` (and ``weight``, ``bias``) of ``prepared.spec``, computed on
        ``ex.stream`` of ``prepared.device`` (its context current), layout passes included; y
        in the problem's memory format. Every step goes through the executor ``ex``
        (:class:`cutlass_convt.program.Executor`), and its branches read the tensors' sizes,
        strides and dtypes alone, so that a recording replays on any call of that signature."""
        raise NotImplementedError


@dataclass(frozen=True)
class Prepared:
    """A problem ready to run on one kernel configuration, loaded in this process: the
    family's kernel object and its plan for the problem on CUDA device ``device`` (persistent
    grids are sized for its SMs)."""

    spec: ProblemSpec
    config: object
    family: Family
    kernel: object
    plan: object
    device: int


def load(family: Family, config, factory: Callable):
    """The process-wide ``factory(artifact)`` of ``config``'s build (cached on disk)."""
    return cuda.load(build.build(config, family.sources(config)), factory)


def sm80_reasons(spec: ProblemSpec) -> list[str]:
    """Why a family of SM80 tensor-core kernels (``mma.sync`` TF32, ``cp.async``) cannot run on
    ``spec``'s GPU (empty from sm_80 on)."""
    if spec.arch < 80:
        return [f"sm_{spec.arch}: the kernels use SM80 tensor-core instructions (mma.sync "
                "TF32, cp.async) and need sm_80 or later"]
    return []


def element_type(spec: ProblemSpec) -> torch.dtype:
    """The torch dtype of ``spec``'s tensors."""
    return getattr(torch, spec.dtype)


def memory_format(spec: ProblemSpec) -> torch.memory_format:
    """The memory format of ``spec``'s result (and of the kernel's view of x)."""
    return torch.channels_last if spec.channels_last else torch.contiguous_format


_CUTLASS_STATUS = (  # cutlass::Status, cutlass/cutlass.h
    "kSuccess", "kErrorMisalignedOperand", "kErrorInvalidDataType", "kErrorInvalidLayout",
    "kErrorInvalidProblem", "kErrorNotSupported", "kErrorWorkspaceNull", "kErrorInternal",
    "kErrorArchMismatch", "kErrorInsufficientDriver", "kErrorMemoryAllocation", "kInvalid",
)


def cutlass_status(code: int) -> str:
    """The name of a ``cutlass::Status`` code (the number itself when it is none)."""
    return _CUTLASS_STATUS[code] if 0 <= code < len(_CUTLASS_STATUS) else str(code)


class CallerLayoutFamily(Family):
    """A family whose kernels read and write the caller's layout (NCHW or NHWC) and PyTorch's
    filter as it is: its ``kernel_class(artifact)`` plans with ``plan(spec, device)`` and
    launches with ``run(plan, device, stream, x, weight, bias or 0, y)``."""

    kernel_class: type

    def prepare(self, spec: ProblemSpec, config, device: int) -> Prepared:
        kernel = load(self, config, self.kernel_class)
        return Prepared(spec, config, self, kernel, kernel.plan(spec, device), device)

    def run(self, prepared: Prepared, ex, input: torch.Tensor, weight: torch.Tensor,
            bias: torch.Tensor | None) -> torch.Tensor:
        """x and y packed in the problem's memory format at 16-byte aligned addresses (TMA),
        the filter (C_in, C_out, R, S) and bias (C_out,) packed (read an element at a time)."""
        spec, form, cl = prepared.spec, memory_format(prepared.spec), prepared.spec.channels_last
        x = ex.packed(input, 16, form)
        weight = ex.packed(weight, 1, torch.contiguous_format)
        out_shape = spec.out_shape
        y = ex.new_packed(x, out_shape, cl)
        dtype, size = element_type(spec), x.element_size()
        b = (ex.address("bias", ex.packed(bias, 1, torch.contiguous_format),
                        (spec.out_channels,), dtype, size) if spec.bias else 0)
        prepared.kernel.run(prepared.plan, prepared.device, ex,
                            ex.address("x", x, spec.in_shape, dtype, 16, cl),
                            ex.address("weight", weight, spec.weight_shape, dtype, size), b,
                            ex.address("y", y, out_shape, dtype, 16, cl))
        return y

"""Named problems (``cases/*.json``): module arguments and input shape of each.

- ``kernelbench_convt2d.json``: the transposed convolutions of KernelBench level 1 (source:
  ScalingIntelligence/KernelBench, ``KernelBench/level1/*.py``);
- ``upsampling.json``: two common stride-2 upsampling layers with problem 71's output size, for
  the stride > 1 measurements;
- ``models.json``: the transposed convolutions of 14 public models, sized as they run them (each
  case names its source).

Each file is a group (``kernelbench``, ``upsampling``, ``models``): a group's name selects its
cases in the scripts (``--problem models``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from importlib import resources

import torch

from .spec import ProblemSpec, from_json_fields


@dataclass(frozen=True)
class Case:
    """One problem: ``ConvTranspose2d(C_in, C_out, kernel_size, stride, padding, output_padding,
    groups, bias, dilation)`` applied to ``torch.rand(N, C_in, H, W)`` (float32)."""

    id: str
    N: int
    C_in: int
    C_out: int
    H: int
    W: int
    kernel_size: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    output_padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    bias: bool

    def module_kwargs(self) -> dict:
        """Constructor arguments of ``torch.nn.ConvTranspose2d`` (and of ours)."""
        return dict(in_channels=self.C_in, out_channels=self.C_out, kernel_size=self.kernel_size,
                    stride=self.stride, padding=self.padding, output_padding=self.output_padding,
                    groups=self.groups, bias=self.bias, dilation=self.dilation)

    def make_input(self, device="cuda", generator: torch.Generator | None = None) -> torch.Tensor:
        """A fresh ``torch.rand(N, C_in, H, W)`` float32 input, as KernelBench draws it."""
        return torch.rand(self.N, self.C_in, self.H, self.W, device=device, generator=generator)

    def spec(self, precision: str, arch: int, channels_last: bool = False) -> ProblemSpec:
        """The :class:`ProblemSpec` of this case (no tensors needed)."""
        return ProblemSpec(
            batch=self.N, in_channels=self.C_in, out_channels=self.C_out, in_size=(self.H, self.W),
            kernel_size=self.kernel_size, stride=self.stride, padding=self.padding,
            output_padding=self.output_padding, dilation=self.dilation, groups=self.groups,
            bias=self.bias, channels_last=channels_last, precision=precision, arch=arch)


GROUPS = {"kernelbench": "kernelbench_convt2d.json", "upsampling": "upsampling.json",
          "models": "models.json"}


def cases(group: str | None = None) -> dict[str, Case]:
    """The cases of one group (:data:`GROUPS`; default: all) by id (``kernelbench-l1-57``, ...,
    ``upsample-k4s2``, ..., ``maskrcnn-mask-train``, ...)."""
    folder = resources.files(__package__) / "cases"
    return {c["id"]: from_json_fields(Case, c)
            for name in ([GROUPS[group]] if group else GROUPS.values())
            for c in json.loads((folder / name).read_text())["cases"]}


_LEVEL1 = "kernelbench-l1-"


def find(name: str) -> Case:
    """A case by id, or by its KernelBench number: ``kernelbench-l1-71``, ``kernelbench-71``
    and ``71`` name the same case. Raises KeyError listing the known ids."""
    known = cases()
    for case in known.values():
        number = case.id.removeprefix(_LEVEL1)
        if name == case.id or (number != case.id and name in (number, f"kernelbench-{number}")):
            return case
    raise KeyError(f"unknown problem {name!r}; known: {', '.join(known)} (a KernelBench case "
                   "also by its number: 71 or kernelbench-71)")


def argument(name: str) -> Case:
    """:func:`find` as an ``argparse`` type: an unknown name becomes the parser's usage error
    (exit status 2) before the script does any work."""
    try:
        return find(name)
    except KeyError as e:
        raise argparse.ArgumentTypeError(e.args[0]) from None

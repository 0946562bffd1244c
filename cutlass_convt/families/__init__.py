"""The kernel families, one module each, and the registry: :data:`FAMILIES` in order of
preference (the default choice takes the first that can compute a problem, after moving the
ones that call themselves demoted for it to the end). The protocol is
:class:`~cutlass_convt.families.base.Family`; ``docs/design/overview.md`` says how to add a
family."""

from . import dgrad, direct, fprop_sm90, phase, strip
from .base import Family, Prepared, UnsupportedProblem

FAMILIES: tuple[Family, ...] = (strip.FAMILY, direct.FAMILY, fprop_sm90.FAMILY, phase.FAMILY,
                                 dgrad.FAMILY)

__all__ = ["FAMILIES", "Family", "Prepared", "UnsupportedProblem"]

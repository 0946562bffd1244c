"""The runtime kernel choice: which family and configuration compute a problem.

The families (:data:`FAMILIES`, ``cutlass_convt.families``) are tried in order of preference,
the ones that call themselves demoted for a problem moved to the end
(:func:`family_order`); the first that can compute the problem gives its default
configuration. A tuning record under ``<cache>/tuning/`` (written by
:func:`cutlass_convt.autotune.tune`, e.g. through ``scripts/generate.py --tune``) overrides
that when its winner is still one of its family's candidates for the problem and the family is
allowed. A record is keyed by the whole problem and the CUTLASS version and is reused by later
processes without timing again. Nothing here times anything or switches on a family.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path

from . import build, env
from .families import FAMILIES, Family, UnsupportedProblem
from .spec import ProblemSpec, exact_fields

NAMES: tuple[str, ...] = tuple(f.name for f in FAMILIES)
_BY_NAME = {f.name: f for f in FAMILIES}


def family(name: str) -> Family:
    """The family called ``name`` (``"strip"``, ...); KeyError for another name."""
    return _BY_NAME[name]


def family_of(config) -> Family:
    """The family whose configuration class ``config`` is."""
    return next(f for f in FAMILIES if isinstance(config, f.config_class))


def family_order(spec: ProblemSpec, names: tuple[str, ...] = NAMES) -> tuple[Family, ...]:
    """The families named in ``names`` that can compute ``spec`` (no
    :meth:`~cutlass_convt.families.base.Family.unsupported_reasons`), in the order the default
    choice tries them: registry order, those that call themselves demoted for ``spec``
    (:meth:`~cutlass_convt.families.base.Family.demoted`) last. A family is asked whether it
    is demoted only once its limits allow the problem."""
    able = [f for f in FAMILIES if f.name in names and not f.unsupported_reasons(spec)]
    demoted = [f.demoted(spec) for f in able]
    return (tuple(f for f, d in zip(able, demoted) if not d)
            + tuple(f for f, d in zip(able, demoted) if d))


def candidates(spec: ProblemSpec, names: tuple[str, ...] = NAMES) -> list:
    """The configurations worth timing for ``spec``: of the families named in ``names`` that
    can compute it, family by family in registry order, each family's default first."""
    return [config for f in FAMILIES
            if f.name in names and not f.unsupported_reasons(spec)
            for config in f.candidates(spec)]


def _record_key(spec: ProblemSpec) -> str:
    payload = json.dumps({"spec": dataclasses.asdict(spec), "cutlass": env.cutlass_version()},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def record_path(spec: ProblemSpec) -> Path:
    """Where the tuning record of ``spec`` lives."""
    return env.cache_dir() / "tuning" / f"{_record_key(spec)}.json"


def config_from_record(family_name: str, fields: dict):
    """A configuration from a record's family name and ``dataclasses.asdict`` form (lists back
    to tuples). Raises KeyError for an unknown family, TypeError where a field is missing or
    not exactly of its type (:func:`cutlass_convt.spec.exact_fields`)."""
    return exact_fields(family(family_name).config_class, fields)


class _Torch:
    """The choice of PyTorch's own implementation (:data:`TORCH`): a candidate of the default
    choice beside the families' configurations."""

    name = "torch"

    def __repr__(self):
        return "TORCH"


TORCH = _Torch()


@functools.lru_cache(maxsize=512)
def _winner(path: Path, mtime_ns: int):
    """The winner the tuning record ``path`` (``<cache>/tuning/<name>``, modified at
    ``mtime_ns``) names: :data:`TORCH` or a configuration; None where the record is unreadable,
    malformed, or not read because someone other than this user or root could have written it
    (or a folder above it), or it is not a regular file of at most
    :data:`~cutlass_convt.build.MAX_RECORD_BYTES` (:func:`cutlass_convt.build.read_file`)."""
    try:
        record = json.loads(build.read_file(path.parent.parent, path.parent.name, path.name,
                                            build.MAX_RECORD_BYTES))
        if record["winner_family"] == TORCH.name:
            return TORCH
        return config_from_record(record["winner_family"], record["winner"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


def choose_config(spec: ProblemSpec, names: tuple[str, ...] = NAMES, torch_ok: bool = False):
    """The tuned winner for ``spec`` if a valid record exists, its family is named in
    ``names`` and can compute ``spec``, and the winner is one of that family's candidates for
    ``spec`` (or it is PyTorch, with ``torch_ok``); else the default of the first family named
    in ``names`` (in :func:`family_order`) that can compute ``spec``, or, with ``torch_ok``,
    :data:`TORCH` where that family measured slower than PyTorch on the problem's class
    (:meth:`~cutlass_convt.families.base.Family.torch_preferred`). Raises
    :class:`~cutlass_convt.families.base.UnsupportedProblem` when none can."""
    try:
        path = record_path(spec)
        winner = _winner(path, path.stat().st_mtime_ns)
    except (OSError, env.ConfigError):  # no record, or no valid cache folder to hold one
        winner = None
    # a record from another version, or edited, whose winner is no longer a candidate falls
    # back to the default
    if winner is TORCH and torch_ok:
        return TORCH
    if winner is not None and winner is not TORCH:
        owner = family_of(winner)
        if owner.name in names and not owner.unsupported_reasons(spec):
            # the family's own candidate equal to the winner, never the record's object
            ours = [c for c in owner.candidates(spec) if c == winner]
            if ours:
                return ours[0]
    for f in family_order(spec, names):
        return TORCH if torch_ok and f.torch_preferred(spec) else f.candidates(spec)[0]
    raise UnsupportedProblem(f"none of the families {names} can compute {spec}")


@functools.lru_cache(maxsize=256)
def choose(spec: ProblemSpec, names: tuple[str, ...] = NAMES, torch_ok: bool = False):
    """What :func:`choose_config` picks among the families named in ``names`` that can compute
    ``spec`` (with ``torch_ok``, possibly :data:`TORCH`), once per problem per process. Raises
    :class:`~cutlass_convt.families.base.UnsupportedProblem` naming every family's reasons
    when none can."""
    reasons = {name: family(name).unsupported_reasons(spec) for name in names}
    allowed = tuple(name for name in names if not reasons[name])
    if not allowed:
        raise UnsupportedProblem("; ".join(f"{name}: {', '.join(r)}"
                                           for name, r in reasons.items()))
    return choose_config(spec, allowed, torch_ok)


def clear_cache() -> None:
    """Forget this process's choices and the tuning records read (:func:`choose`)."""
    choose.cache_clear()
    _winner.cache_clear()


# The PyTorch route's row of the "what runs where" table (after the families' rows).
TORCH_ROUTE = ("anything no family takes: before sm_90, or with input channels per group not a "
               "multiple of 4, stride > 1 with dilation > 1, kernels above 32 x 32 and samples "
               "of 2 GiB or more; sizes above 2**31 - 1; GPUs before sm_80; float16 and "
               "bfloat16 (unless the backend names a family) with 32 or more output channels "
               "or under a wave of tiles, where neither the strip family nor fprop_sm90 "
               "(kernel_size == stride) takes them; other dtypes",
               "PyTorch's `conv_transpose2d` (a `RuntimeWarning` once per reason)")


def what_runs_where() -> str:
    """The README's "what runs where" table (markdown), one row per family in the order the
    default choice tries them, then the PyTorch route; generated from the families' own
    summaries, so that the README cannot drift from the registry (a test compares them)."""
    rows = [(f"`{f.name}`", *f.summary) for f in FAMILIES] + [("PyTorch", *TORCH_ROUTE)]
    lines = ["| backend | problems | what runs |", "|---|---|---|"]
    return "\n".join([*lines, *(f"| {name} | {problems} | {runs} |"
                                for name, problems, runs in rows)]) + "\n"

"""The runtime kernel choice: which family and configuration compute a problem.

The families (:data:`FAMILIES`, ``cutlass_convt.families``) are tried in order of preference,
the ones that call themselves demoted for a problem moved to the end
(:func:`family_order`); the first that can compute the problem gives its default
configuration (the rules). A tuning record under ``<cache>/tuning/`` overrides that when its
winner is still one of its family's candidates for the problem and the family is allowed. A
record is keyed by the whole problem and by the machine it was measured on
(:func:`cutlass_convt.measure.machine`: GPU, driver, PyTorch, cuDNN and CUTLASS versions), so
that a record never crosses to another GPU or library version; it is written by a call's
first-use measurement (:mod:`cutlass_convt.measure`) or by :func:`cutlass_convt.autotune.tune`
and reused by later processes without timing again. Nothing here times anything or switches on
a family.
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


# A machine: (field, value) pairs (:func:`cutlass_convt.measure.machine`); None: rules only.
Machine = tuple[tuple[str, object], ...]


def measured_candidates(spec: ProblemSpec, exhaustive: bool = False) -> list:
    """The configurations a first-use measurement times against PyTorch's route
    (:mod:`cutlass_convt.measure`): the default of the first family of :func:`family_order`
    (the rules' pick, built as without measuring; or the family the rules passed over for
    PyTorch: then a build the rules alone would not need), or, ``exhaustive``,
    :func:`candidates`; empty where no family can compute ``spec``."""
    if exhaustive:
        return candidates(spec)
    return [f.candidates(spec)[0] for f in family_order(spec)[:1]]


def _record_key(spec: ProblemSpec, machine: Machine) -> str:
    payload = json.dumps({"spec": dataclasses.asdict(spec), "machine": dict(machine)},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def record_path(spec: ProblemSpec, machine: Machine) -> Path:
    """Where the tuning record of ``spec`` measured on ``machine`` lives."""
    return env.cache_dir() / "tuning" / f"{_record_key(spec, machine)}.json"


def machine_fields(pairs) -> Machine:
    """``pairs`` (a record's ``machine``: [field, value] lists) as a :data:`Machine`; raises
    TypeError where they are not pairs of a str and a str or int."""
    if not isinstance(pairs, list):
        raise TypeError("a record's machine is a list of [field, value] pairs")
    machine = []
    for pair in pairs:
        if (not isinstance(pair, list) or len(pair) != 2 or type(pair[0]) is not str
                or type(pair[1]) not in (str, int)):
            raise TypeError(f"a record's machine field {pair!r} is not [str, str or int]")
        machine.append(tuple(pair))
    return tuple(machine)


def save_record(spec: ProblemSpec, machine: Machine, record: dict) -> Path:
    """Write ``record`` (with ``spec`` and ``machine`` added) as the tuning record of ``spec``
    on ``machine``, replacing any, atomically and following no link, and forget this process's
    choices (:func:`clear_cache`); returns its path. Raises
    :class:`~cutlass_convt.build.BuildError` where the record folder cannot be created or it or
    a folder above it is a link or someone else could write it
    (:func:`cutlass_convt.build.own_folder`), OSError where the record cannot be written."""
    path = record_path(spec, machine)
    build.own_folder(path.parent)
    record = {**record, "spec": dataclasses.asdict(spec), "machine": [list(p) for p in machine]}
    build.write_file(path, json.dumps(record, indent=1).encode(), replace=True)
    clear_cache()
    return path


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


def winner_fields(winner) -> dict:
    """A record's ``winner_family`` and ``winner`` for ``winner`` (:data:`TORCH` or a
    configuration): what :func:`_winner` reads back."""
    if winner is TORCH:
        return {"winner_family": TORCH.name, "winner": {}}
    return {"winner_family": family_of(winner).name, "winner": dataclasses.asdict(winner)}


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


def recorded(spec: ProblemSpec, machine: Machine | None):
    """The winner of the valid tuning record of ``spec`` on ``machine`` (:data:`TORCH` or a
    configuration, as the record names it: not yet checked against the families' candidates),
    or None where there is none (or ``machine`` is None)."""
    if machine is None:
        return None
    try:
        path = record_path(spec, machine)
        return _winner(path, path.stat().st_mtime_ns)
    except (OSError, env.ConfigError):  # no record, or no valid cache folder to hold one
        return None


def choose_config(spec: ProblemSpec, names: tuple[str, ...] = NAMES, torch_ok: bool = False,
                  machine: Machine | None = None):
    """The winner of the tuning record of ``spec`` on ``machine`` (None: no record read) if
    its family is named in ``names`` and can compute ``spec``, and the winner is one of that
    family's candidates for ``spec`` (or it is PyTorch, with ``torch_ok``); else the default
    of the first family named in ``names`` (in :func:`family_order`) that can compute
    ``spec``, or, with ``torch_ok``, :data:`TORCH` where that family measured slower than
    PyTorch on the problem's class
    (:meth:`~cutlass_convt.families.base.Family.torch_preferred`). Raises
    :class:`~cutlass_convt.families.base.UnsupportedProblem` when none can."""
    winner = recorded(spec, machine)
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
def choose(spec: ProblemSpec, names: tuple[str, ...] = NAMES, torch_ok: bool = False,
           machine: Machine | None = None):
    """What :func:`choose_config` picks among the families named in ``names`` that can compute
    ``spec`` (with ``torch_ok``, possibly :data:`TORCH`), once per problem per process. Raises
    :class:`~cutlass_convt.families.base.UnsupportedProblem` naming every family's reasons
    when none can."""
    reasons = {name: family(name).unsupported_reasons(spec) for name in names}
    allowed = tuple(name for name in names if not reasons[name])
    if not allowed:
        raise UnsupportedProblem("; ".join(f"{name}: {', '.join(r)}"
                                           for name, r in reasons.items()))
    return choose_config(spec, allowed, torch_ok, machine)


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

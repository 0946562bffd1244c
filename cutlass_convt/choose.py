"""The runtime kernel choice: kernel families, candidate configurations, tuning records.

Four families compute a problem: ``"strip"`` (our own stride-1 TMA + wgmma kernels for 32 ->
32 channels and 3 filter rows on channels_last or NCHW tensors, TF32, and 3xTF32 with 3 x 3
filters, :class:`~cutlass_convt.spec.StripConfig`), ``"direct"`` (our own stride-1
kernel on the caller's layout, :class:`~cutlass_convt.spec.DirectConfig`), ``"fprop_sm90"``
(CUTLASS 3.x SM90 TMA + wgmma fprop on the flipped filter, stride 1, TF32, NHWC,
:class:`~cutlass_convt.spec.FpropSm90Config`) and ``"dgrad"`` (CUTLASS 2.x implicit-GEMM dgrad
on NHWC, :class:`~cutlass_convt.spec.KernelConfig`); the last two pass NCHW tensors through
layout kernels.
``choose_config(spec, families)`` returns the winner of a tuning record for the problem when one
exists under ``<cache>/tuning/`` (written by :func:`cutlass_convt.autotune.tune`, e.g. through
``scripts/generate.py --tune``) and its family is allowed, else the first allowed family's
default (in :func:`family_order`). A record is keyed by the whole problem and the CUTLASS
version, and is reused by later processes without timing again.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path

from . import env
from .launch import UnsupportedProblem
from .spec import (SHARED_MEMORY_LIMIT, DirectConfig, FpropSm90Config, KernelConfig, ProblemSpec,
                   StripConfig, default_config, direct_config, direct_configs, fprop_sm90_configs,
                   from_json_fields, strip_configs)

Config = StripConfig | DirectConfig | FpropSm90Config | KernelConfig

# (threadblock M, N, K), warps (M, N, K), stages. Threadblock N = 32 matches narrow outputs
# (C_out = 32: no half-empty MMA tiles); N = 64 rows are CUTLASS's stock tiles.
CANDIDATE_TILES = {
    "tf32": [((256, 64, 16), (4, 2, 1), 4), ((128, 32, 16), (4, 1, 1), 4),
             ((128, 32, 16), (4, 1, 1), 6), ((128, 32, 32), (4, 1, 1), 3),
             ((256, 32, 16), (4, 1, 1), 4), ((256, 32, 32), (4, 1, 1), 3),
             ((64, 32, 32), (2, 1, 1), 4), ((128, 64, 16), (2, 2, 1), 4),
             ((128, 64, 32), (2, 2, 1), 3)],
    "fp32": [((128, 64, 16), (2, 2, 1), 4), ((128, 32, 16), (4, 1, 1), 4),
             ((128, 32, 32), (4, 1, 1), 3), ((256, 32, 16), (4, 1, 1), 3),
             ((64, 32, 32), (2, 1, 1), 4), ((256, 64, 16), (4, 2, 1), 3)],
}


# Kernel families in order of preference, and their configuration classes.
FAMILIES = ("strip", "direct", "fprop_sm90", "dgrad")
_CONFIG_CLASSES = {"strip": StripConfig, "direct": DirectConfig, "fprop_sm90": FpropSm90Config,
                   "dgrad": KernelConfig}


def family_of(config: Config) -> str:
    return next(f for f, cls in _CONFIG_CLASSES.items() if isinstance(config, cls))


def unsupported_reasons(spec: ProblemSpec, family: str) -> list[str]:
    """Why ``family`` cannot compute ``spec`` (empty if it can): sizes beyond 32-bit ints
    (:meth:`~cutlass_convt.spec.ProblemSpec.int32_reasons`), then the family's own limits."""
    own = {"strip": spec.strip_unsupported_reasons,
           "direct": spec.direct_unsupported_reasons,
           "fprop_sm90": spec.fprop_sm90_unsupported_reasons,
           "dgrad": spec.cutlass_unsupported_reasons}[family]
    return spec.int32_reasons() + own()


def family_order(spec: ProblemSpec) -> tuple[str, ...]:
    """:data:`FAMILIES` in the order the default choice tries them for ``spec``: the direct
    family after CUTLASS's stock families where its default configuration was measured slower
    than them (H200, x 8 x C_in x 256 x 512; ``docs/perf-notes.md``, v0.25): when it splits the
    output channels among CTAs (the filter does not fit whole: at 32 -> 32 channels 7 x 7 in
    TF32, 5 x 5 to 7 x 7 in fp32; 1.03-5.2x the time of fprop_sm90 or dgrad; C_out > 32 in
    TF32: 1.1-2.4x fprop_sm90's on KernelBench 57 and 69), and fp32 on one stage and blocks of
    8 output channels (wgmma N = 8) with more than 16 taps (1.3-1.4x dgrad's time; 16 taps:
    0.74x). Except fp32 with C_out > 32 (blocks of 32) on the 4-row tile: 0.36-0.90x dgrad's
    time in all 24 such cases measured (x 8 x C_in x 128 x 256, C_in 16 to 64, the family's
    fp32 limit, C_out 64 and 128, 1 x 1 to 4 x 4; v0.27), where the 2-row tiles took
    0.99-1.10x."""
    config = direct_config(spec)
    wide_fp32 = (config is not None and config.precision == "fp32" and config.out_channels > 32
                 and config.tile[0] >= 4)
    slower = config is not None and not wide_fp32 and (
        config.out_block < config.out_channels
        or (config.precision == "fp32" and config.out_block == 8 and config.stages == 1
            and config.kernel_size[0] * config.kernel_size[1] > 16))
    if not slower:
        return FAMILIES
    return tuple(f for f in FAMILIES if f != "direct") + ("direct",)


def family_configs(spec: ProblemSpec, family: str) -> list[Config]:
    """The candidate configurations of ``family`` for ``spec``, its default first."""
    return {"strip": strip_configs, "direct": direct_configs, "fprop_sm90": fprop_sm90_configs,
            "dgrad": _dgrad_candidates}[family](spec)


def _dgrad_candidates(spec: ProblemSpec) -> list[KernelConfig]:
    """The dgrad default first, then every candidate tile whose main-loop shared memory
    (stages x (M x K + K x N) floats) fits."""
    base = default_config(spec)
    found = [base]
    for tile, warps, stages in CANDIDATE_TILES[spec.precision]:
        m, n, k = tile
        if stages * (m * k + k * n) * 4 > SHARED_MEMORY_LIMIT:
            continue
        config = dataclasses.replace(base, threadblock_shape=tile, warp_count=warps,
                                     stages=stages)
        if config not in found:
            found.append(config)
    return found


def candidates(spec: ProblemSpec, families=FAMILIES) -> list[Config]:
    """The configurations worth timing for ``spec``, of the ``families`` that can compute it,
    family by family in :data:`FAMILIES` order, each family's default first."""
    return [config for family in FAMILIES
            if family in families and not unsupported_reasons(spec, family)
            for config in family_configs(spec, family)]


def _record_key(spec: ProblemSpec) -> str:
    payload = json.dumps({"spec": dataclasses.asdict(spec), "cutlass": env.cutlass_version()},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def record_path(spec: ProblemSpec) -> Path:
    """Where the tuning record of ``spec`` lives."""
    return env.cache_dir() / "tuning" / f"{_record_key(spec)}.json"


def config_from_dict(family: str, fields: dict) -> Config:
    """A configuration from its ``dataclasses.asdict`` form (lists back to tuples)."""
    return from_json_fields(_CONFIG_CLASSES[family], fields)


@functools.lru_cache(maxsize=512)
def _winner(path: Path, mtime_ns: int) -> Config | None:
    try:
        record = json.loads(path.read_text())
        return config_from_dict(record["winner_family"], record["winner"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # unreadable or malformed
        return None


def choose_config(spec: ProblemSpec, families=FAMILIES) -> Config:
    """The tuned winner for ``spec`` if a valid record exists, its family is one of
    ``families`` and can compute ``spec``, and the winner is one of that family's candidates
    for ``spec``; else the default of the first of ``families`` (in :func:`family_order`)
    that can compute ``spec``. Raises ValueError when none can."""
    path = record_path(spec)
    try:
        winner = _winner(path, path.stat().st_mtime_ns)
    except OSError:
        winner = None
    # a record from another version, or edited, whose winner is no longer a candidate falls
    # back to the default
    family = family_of(winner) if winner is not None else None
    if (family in families and not unsupported_reasons(spec, family)
            and winner in family_configs(spec, family)):
        return winner
    for family in family_order(spec):
        if family in families and not unsupported_reasons(spec, family):
            return family_configs(spec, family)[0]
    raise ValueError(f"none of the families {families} can compute {spec}")


@functools.lru_cache(maxsize=256)
def choose(spec: ProblemSpec, families: tuple[str, ...] = FAMILIES) -> Config:
    """The configuration :func:`choose_config` picks among the ``families`` that can compute
    ``spec``, once per problem per process. Raises
    :class:`~cutlass_convt.launch.UnsupportedProblem` naming every family's reasons when none
    can."""
    reasons = {f: unsupported_reasons(spec, f) for f in families}
    allowed = tuple(f for f in families if not reasons[f])
    if not allowed:
        raise UnsupportedProblem("; ".join(f"{f}: {', '.join(r)}" for f, r in reasons.items()))
    return choose_config(spec, allowed)

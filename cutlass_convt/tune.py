"""Kernel choice: candidate configurations, timing on the real problem, persisted winners.

``choose_config(spec)`` returns the winner of a tuning record for the problem when one exists
under ``<cache>/tuning/`` (written by :func:`tune`, e.g. through
``scripts/generate.py --tune``), else :func:`cutlass_convt.spec.default_config`. A record is
keyed by the problem (all of :class:`ProblemSpec` but the memory format, which changes only the
layout passes) and the CUTLASS version, and is reused by later processes without timing again.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Callable

from . import env
from .spec import KernelConfig, ProblemSpec, default_config

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
SHARED_MEMORY_LIMIT = 227 * 1024  # bytes per block on sm_90 (opt-in maximum)


def candidates(spec: ProblemSpec) -> list[KernelConfig]:
    """The configurations worth timing for ``spec``: the default first, then every candidate
    tile whose main-loop shared memory (stages x (M x K + K x N) floats) fits."""
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


def _record_key(spec: ProblemSpec) -> str:
    fields = {k: v for k, v in dataclasses.asdict(spec).items() if k != "channels_last"}
    payload = json.dumps({"spec": fields, "cutlass": env.cutlass_version()}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def record_path(spec: ProblemSpec) -> Path:
    """Where the tuning record of ``spec`` lives."""
    return env.cache_dir() / "tuning" / f"{_record_key(spec)}.json"


@functools.lru_cache(maxsize=512)
def _winner(path: Path, mtime_ns: int) -> KernelConfig | None:
    try:
        winner = json.loads(path.read_text())["winner"]
        return KernelConfig(**{k: tuple(v) if isinstance(v, list) else v
                               for k, v in winner.items()})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def choose_config(spec: ProblemSpec) -> KernelConfig:
    """The tuned winner for ``spec`` if a valid record exists, else the default."""
    path = record_path(spec)
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return default_config(spec)
    return _winner(path, mtime) or default_config(spec)


def tune(spec: ProblemSpec, *, trials: int = 30,
         progress: Callable[[str], None] | None = None) -> dict:
    """Build every candidate, time it on random tensors of ``spec``'s real sizes on the current
    GPU (kernel launches only, CUDA events, L2 flushed, median of ``trials``), and write the
    record with the fastest as winner. Candidates CUTLASS rejects (``can_implement``) are
    skipped. Returns the record. Needs a CUDA GPU (and nvcc for candidates not yet built).
    """
    import torch

    from . import build, launch
    from .benchmark import cuda_time_ms

    device = torch.cuda.current_device()
    (h, w), (r, s) = spec.in_size, spec.kernel_size
    x = torch.rand(spec.batch, spec.in_channels, h, w, device="cuda").contiguous(
        memory_format=torch.channels_last)
    filt = torch.randn(spec.in_channels, spec.out_channels // spec.groups, r, s,
                       device="cuda").contiguous(memory_format=torch.channels_last)  # KRSC
    bias = torch.randn(spec.out_channels, device="cuda")
    y = torch.empty(spec.out_shape, device="cuda", memory_format=torch.channels_last)
    stream = torch.cuda.current_stream().cuda_stream
    results = []
    for config in candidates(spec):
        if progress:
            progress(config.name)
        kernel = launch.load(build.build(config))
        try:
            launches = [(kernel.plan(item, spec.bias), item.offsets)
                        for item in spec.dgrad_launches()]
        except launch.UnsupportedProblem as e:
            results.append({"config": config.name, "skipped": str(e)})
            continue

        timing = cuda_time_ms(functools.partial(
            kernel.run, launches, device, stream, x.data_ptr(), filt.data_ptr(),
            bias.data_ptr(), y.data_ptr()), warmup=3, trials=trials)
        results.append({"config": config.name, "median_ms": timing["median"],
                        "mean_ms": timing["mean"], "settings": dataclasses.asdict(config)})
    timed = [r for r in results if "median_ms" in r]
    if not timed:
        raise launch.UnsupportedProblem(f"no candidate can implement {spec}")
    best = min(timed, key=lambda r: r["median_ms"])
    record = {
        "spec": dataclasses.asdict(spec), "gpu": torch.cuda.get_device_name(device),
        "cutlass_version": env.cutlass_version(), "nvcc_version": env.nvcc_version(),
        "winner": best["settings"], "winner_name": best["config"],
        "results": [{k: v for k, v in r.items() if k != "settings"} for r in results],
        "tuned_at": time.time(),
    }
    path = record_path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, path)
    return record

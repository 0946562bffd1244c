"""Offline timing: every candidate configuration of a problem timed on this GPU, the winner
stored as a tuning record that :func:`cutlass_convt.choose.choose_config` reads in later
processes. Needs a CUDA GPU (and nvcc for candidates not yet built)."""

from __future__ import annotations

import functools
import time
from typing import Callable

import torch

from . import env, measure, ops
from .benchmark import cuda_time_ms
from .choose import NAMES, TORCH, candidates, family_of, save_record, winner_fields
from .spec import ProblemSpec, UnsupportedProblem


def tune(spec: ProblemSpec, *, families=NAMES, trials: int = 30,
         progress: Callable[[str], None] | None = None) -> dict:
    """Build every candidate of ``families``, time each (and, for all families, PyTorch's own
    implementation) on random tensors of ``spec``'s real sizes, dtype and memory format on the
    current
    GPU (the whole call, layout passes included: CUDA
    events, L2 flushed, median of ``trials``), and write the record with the fastest as
    winner for this GPU (:func:`cutlass_convt.measure.machine`; and clear this process's
    caches, :func:`cutlass_convt.ops.clear_caches`, so that its next call takes it unless
    measuring is off;
    :func:`cutlass_convt.choose.save_record`). Candidates CUTLASS rejects
    (``can_implement``) are skipped. Returns the record.
    Needs a CUDA GPU (and nvcc for candidates not yet built)."""
    device = torch.cuda.current_device()
    memory_format = torch.channels_last if spec.channels_last else torch.contiguous_format
    dtype = getattr(torch, spec.dtype)
    x = torch.rand(spec.in_shape, device="cuda", dtype=dtype).contiguous(
        memory_format=memory_format)
    weight = torch.randn(spec.weight_shape, device="cuda", dtype=dtype)
    bias = torch.randn(spec.out_channels, device="cuda", dtype=dtype) if spec.bias else None
    results, timed_configs = [], {TORCH.name: TORCH}
    for config in candidates(spec, families):
        if progress:
            progress(config.name)
        try:
            prepared = ops.prepare_config(spec, config)
        except UnsupportedProblem as e:
            results.append({"config": config.name, "skipped": str(e)})
            continue
        timing = cuda_time_ms(functools.partial(ops.run_prepared, prepared, x, weight, bias),
                              warmup=3, trials=trials)
        results.append({"config": config.name, "family": family_of(config).name,
                        "median_ms": timing["median"], "mean_ms": timing["mean"]})
        timed_configs[config.name] = config
    if set(families) == set(NAMES):  # the default choice's candidates: PyTorch's too
        route = ops.route(spec, "torch")
        timing = cuda_time_ms(functools.partial(ops.run_torch, route, x, weight, bias),
                              warmup=3, trials=trials)
        results.append({"config": TORCH.name, "family": TORCH.name, "median_ms": timing["median"],
                        "mean_ms": timing["mean"]})
    timed = [r for r in results if "median_ms" in r]
    if not timed:
        raise UnsupportedProblem(f"no candidate can implement {spec}")
    best = min(timed, key=lambda r: r["median_ms"])
    record = {
        "source": "tune", "nvcc_version": env.nvcc_version(),
        **winner_fields(timed_configs[best["config"]]), "winner_name": best["config"],
        "results": results,
        "tuned_at": time.time(),
    }
    save_record(spec, measure.machine(device), record)
    ops.clear_caches()  # the next call of the problem takes the new winner
    return record

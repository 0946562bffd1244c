"""Measuring: CUDA-event timing, host time per call, and error against a reference.

Protocol (after KernelBench and the device notes): warm-up calls first, then ``trials`` timed
calls, each between two CUDA events on the current stream, with the L2 cache flushed before
each trial (outside the timed region); report the median and the mean in milliseconds.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

_L2_FLUSH_BYTES = 256 * 2**20  # > 4x the H200's 60 MB L2


def cuda_time_ms(fn: Callable[[], object], *, warmup: int = 10, trials: int = 100,
                 flush_l2: bool = True) -> dict[str, float]:
    """Device time of ``fn()`` in ms: ``{"median", "mean", "min", "trials"}``."""
    flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda") if flush_l2 else None
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
    for start, end in zip(starts, ends):
        if flush is not None:
            flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return {"median": statistics.median(times), "mean": statistics.fmean(times),
            "min": min(times), "trials": trials}


def host_time_us(fn: Callable[[], object], *, calls: int = 100) -> float:
    """Host time per call in microseconds: ``calls`` calls without synchronization, divided by
    ``calls`` (the GPU queue absorbs the work, so this is the Python + launch cost). Keep
    ``calls`` x launches per call well under the driver's launch queue (about 1000 entries):
    once it fills, the loop waits for the GPU and measures device time instead."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """``{"rel": ||out - ref||_F / ||ref||_F, "max_abs": max |out - ref|}``, computed in float64.
    NaN or inf anywhere in ``out`` gives ``inf`` for both."""
    diff = out.double() - ref.double()
    if not torch.isfinite(diff).all():
        return {"rel": float("inf"), "max_abs": float("inf")}
    return {"rel": (diff.norm() / ref.double().norm()).item(), "max_abs": diff.abs().max().item()}

"""First-use measuring: the default choice checked on the GPU it runs on.

Where ``backend="auto"`` meets a problem that no tuning record covers on this machine, the
first call times, on its own tensors, the candidates
(:func:`cutlass_convt.choose.measured_candidates`) and PyTorch's route,
and the winner is kept as the problem's tuning record, keyed by the problem and by
:func:`machine` (GPU, driver, PyTorch, cuDNN and CUTLASS versions): later calls and processes
on the same machine take it without measuring, a changed GPU or library version measures again.
PyTorch's route wins unless one of ours measured at most :data:`OURS_BY` of its time, so that
the default is never slower than PyTorch beyond the spread of the measurement.

The mode (``$CUTLASS_CONVT_MEASURE``, or :func:`set_mode`, which takes precedence):

- ``"on"`` (default): the rules' family's default configuration (the rules' pick, or the
  family they passed over for PyTorch) against PyTorch's route, for every new problem (the
  rules carry no predicted margin yet, so every problem counts as a close call);
- ``"exhaustive"``: every candidate configuration of every family that can compute it;
- ``"off"``: the rules alone, no record read or written: the same choice on every machine.

A call never measures while a CUDA graph is being captured, while ``torch.compile`` traces, or on
tensors that are not real CUDA tensors (fake, meta, functorch-wrapped): it takes a record or the
rules' pick.
"""

from __future__ import annotations

import functools
import statistics
from typing import Callable

import torch

from . import cuda, env

MODES = env.MEASURE_MODES
# Ours must take at most this fraction of PyTorch's median to be chosen, so that the spread
# of medians of a few trials cannot make the default slower than PyTorch (an assumed spread,
# not yet measured: docs/design/overview.md, "The choice measured on first use").
OURS_BY = 0.98
# GPU time a measurement may spend on all its rounds (one untimed round, which also pays lazy
# initialization, then timed ones): the bound is 50 ms a problem beyond the build; a
# problem whose round takes more than a third of it gets the fewest rounds, and exceeds it.
BUDGET_MS = 50.0
MIN_TIMED, MAX_TIMED = 2, 7
TORCH = "torch"  # the name of PyTorch's route among the timed routes

_override: str | None = None


def mode() -> str:
    """The measuring mode in force: :func:`set_mode`'s, else ``$CUTLASS_CONVT_MEASURE``'s
    (:func:`cutlass_convt.env.measure_mode`; raises its ``ConfigError`` for a bad value)."""
    return _override if _override is not None else env.measure_mode()


def set_mode(new: str | None) -> None:
    """Set the measuring mode for this process (one of :data:`MODES`; None: the environment
    variable's again). Raises ValueError for another value. Callers clear the choices already
    made (:func:`cutlass_convt.set_measuring` does)."""
    global _override
    if new is not None and new not in MODES:
        raise ValueError(f"cutlass_convt: measuring mode {new!r}: one of {', '.join(MODES)}")
    _override = new


@functools.lru_cache(maxsize=None)
def machine(device: int) -> tuple[tuple[str, object], ...]:
    """What a measured choice on CUDA device ``device`` holds for, as ``(field, value)`` pairs:
    :func:`cutlass_convt.cuda.device_identity` (GPU name, SM count, memory clock, driver) and
    the versions of PyTorch, cuDNN (0 without it) and CUTLASS. Raises
    :class:`~cutlass_convt.cuda.CudaError`."""
    return (*cuda.device_identity(device), ("torch", torch.__version__),
            ("cudnn", torch.backends.cudnn.version() or 0), ("cutlass", env.cutlass_version()))


def may_measure(*tensors) -> bool:
    """Whether a call on ``tensors`` (None entries ignored) may time routes now: measuring is
    on, ``torch.compile`` is not tracing, no functorch transform is active, every tensor is a
    plain CUDA tensor (not fake, meta or a subclass) and no CUDA graph is being captured on
    the current stream."""
    if (mode() == "off" or torch.compiler.is_compiling()
            or torch._C._are_functorch_transforms_active()):
        return False
    if not all(t is None or (type(t) in _PLAIN and _on_cuda(t)) for t in tensors):
        return False
    return not torch.cuda.is_current_stream_capturing()


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _on_cuda(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"


def time_routes(routes: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Median device time in ms of each of ``routes`` (name -> a call on the current stream):
    one untimed round, then interleaved rounds timed with CUDA events, as many as fit
    :data:`BUDGET_MS` with the untimed one (between :data:`MIN_TIMED` and :data:`MAX_TIMED`);
    two host synchronizations (after the first timed round, which sizes the rest, and at the
    end)."""
    for fn in routes.values():
        fn()
    rounds = [_round(routes)]
    last = list(routes)[-1]
    rounds[0][last][1].synchronize()  # the last recorded: every event before it is done
    once = sum(max(a.elapsed_time(b), 1e-3) for a, b in rounds[0].values())
    timed = max(MIN_TIMED, min(MAX_TIMED, int(BUDGET_MS / once) - 1))
    rounds += [_round(routes) for _ in range(timed - 1)]
    rounds[-1][last][1].synchronize()
    return {name: statistics.median(r[name][0].elapsed_time(r[name][1]) for r in rounds)
            for name in routes}


def _round(routes: dict[str, Callable[[], object]]) -> dict[str, tuple]:
    """Each of ``routes`` called once between a pair of recorded CUDA events."""
    pairs = {}
    for name, fn in routes.items():
        pairs[name] = _events()
        pairs[name][0].record()
        fn()
        pairs[name][1].record()
    return pairs


def _events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def winner(medians: dict[str, float]) -> str:
    """The route of ``medians`` (name -> ms, PyTorch's under :data:`TORCH`) to keep: the
    fastest of ours where it takes at most :data:`OURS_BY` of PyTorch's time, else PyTorch's
    (also where PyTorch's was not timed: then the fastest)."""
    ours = {name: ms for name, ms in medians.items() if name != TORCH}
    if not ours:
        return TORCH
    best = min(ours, key=ours.__getitem__)
    if TORCH in medians and not ours[best] <= OURS_BY * medians[TORCH]:
        return TORCH
    return best

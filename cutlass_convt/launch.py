"""Launch: a built kernel, loaded once per process, launched through ``cuda.bindings.driver``.

Each cubin is loaded as a context-independent ``CUlibrary`` (one load per process; its kernels
are bound to each device's primary context, the one PyTorch uses, on first launch there). The
host library (``ctypes``) checks a problem with CUTLASS's ``can_implement`` and fills the
kernel's ``Params`` once per problem (:meth:`Kernel.plan`); a launch copies those bytes, writes
the four tensor addresses into them and calls ``cuLaunchKernel`` on the caller's stream, with
no host synchronization.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass

from . import cuda
from .cuda import Library as _Library

from .build import Artifact

KERNEL_SYMBOL = "cutlass_convt_dgrad_kernel"
from .spec import UnsupportedProblem, DgradLaunch

_ABI_VERSION = 2
_STATUS_NAMES = (  # cutlass::Status, cutlass/cutlass.h
    "kSuccess", "kErrorMisalignedOperand", "kErrorInvalidDataType", "kErrorInvalidLayout",
    "kErrorInvalidProblem", "kErrorNotSupported", "kErrorWorkspaceNull", "kErrorInternal",
    "kErrorArchMismatch", "kErrorInsufficientDriver", "kErrorMemoryAllocation", "kInvalid",
)
_POINTER = struct.Struct("<Q")


@dataclass(frozen=True)
class LaunchPlan:
    """Everything one problem needs at launch: ``params`` (the kernel's ``Params`` bytes with
    null tensor addresses), the grid, and the byte offsets of the four addresses in ``params``
    (x, filter, bias, y)."""

    params: bytes
    grid: tuple[int, int, int]
    offsets: tuple[int, int, int, int]


def _resident_ctas(library: _Library, symbol: str, config, device: int) -> int:
    """How many CTAs of ``config``'s kernel fit on ``device`` at once (the grid of a persistent
    kernel). Raises :class:`UnsupportedProblem` when not one fits on an SM."""
    ctas = library.resident_ctas(symbol, config.threads, config.shared_bytes, device)
    if ctas < 1:
        raise UnsupportedProblem(f"{config.name} does not fit on an SM of device {device}")
    return ctas


class Kernel:
    """One built dgrad kernel in this process. Thread-safe; create through :func:`load`."""

    def __init__(self, artifact: Artifact):
        self.artifact = artifact
        self._host = cuda.host_library(artifact.host_lib, _ABI_VERSION)
        info = (ctypes.c_int64 * 7)()
        self._host.cutlass_convt_describe(info)
        self.threads, self.shared_bytes, self.params_bytes = info[0], info[1], info[2]
        self._offsets = tuple(info[3:7])
        self._library = _Library(artifact.cubin.read_bytes())

    def plan(self, launch: DgradLaunch, has_bias: bool) -> LaunchPlan:
        """Check one launch's problem with ``can_implement`` and fill the kernel's ``Params``
        (host only). Raises :class:`UnsupportedProblem` naming the ``cutlass::Status`` when
        CUTLASS rejects it."""
        problem = (ctypes.c_int32 * 15)(*launch.problem.as_tuple())
        x_strides = (ctypes.c_int64 * 3)(*launch.x_strides)
        y_strides = (ctypes.c_int64 * 3)(*launch.y_strides)
        params = ctypes.create_string_buffer(self.params_bytes)
        grid = (ctypes.c_int32 * 3)()
        status = self._host.cutlass_convt_initialize(problem, x_strides, y_strides,
                                                     int(has_bias), params, grid)
        if status != 0:
            name = _STATUS_NAMES[status] if status < len(_STATUS_NAMES) else str(status)
            raise UnsupportedProblem(
                f"CUTLASS kernel {self.artifact.manifest['kernel']} cannot implement "
                f"{launch.problem}: can_implement returned {name}")
        return LaunchPlan(params.raw, tuple(grid), self._offsets)

    def launch(self, plan: LaunchPlan, device: int, stream: int,
               x: int, filter: int, bias: int, y: int) -> None:
        """Launch on ``stream`` (a ``cudaStream_t`` as int) of CUDA device ``device``, whose
        primary context must be current. ``x``, ``filter``, ``bias``, ``y`` are device
        addresses of packed NHWC x, KRSC filter, the bias vector (any address when the plan has
        no bias) and NHWC y."""
        kernel = self._library.kernel(KERNEL_SYMBOL, device, self.shared_bytes)
        params = bytearray(plan.params)
        for offset, address in zip(plan.offsets, (x, filter, bias, y)):
            _POINTER.pack_into(params, offset, address)
        cuda.launch(kernel, plan.grid, self.threads, self.shared_bytes, stream, params)

    def run(self, launches, device: int, stream: int, x: int, filter: int, bias: int,
            y: int) -> None:
        """Launch every ``(plan, offsets)`` of a problem (see
        :meth:`cutlass_convt.spec.ProblemSpec.dgrad_launches`): ``x``, ``filter``, ``bias`` and
        ``y`` are the base addresses, and each launch adds its element offsets (float32)."""
        for plan, (xo, fo, bo, yo) in launches:
            self.launch(plan, device, stream, x + 4 * xo, filter + 4 * fo, bias + 4 * bo,
                        y + 4 * yo)

"""Launch: a built kernel, loaded once per process, launched through ``cuda.bindings.driver``.

The cubin is loaded as a context-independent ``CUlibrary`` (one load per process; its kernel
is bound to each device's primary context, the one PyTorch uses, on first launch there). The
host library (``ctypes``) checks a problem with CUTLASS's ``can_implement`` and fills the
kernel's ``Params`` once per problem (:meth:`Kernel.plan`); a launch copies those bytes, writes
the four tensor addresses into them and calls ``cuLaunchKernel`` on the caller's stream, with
no host synchronization.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from dataclasses import dataclass

from cuda.bindings import driver

from .build import Artifact
from .emit import KERNEL_SYMBOL
from .spec import DgradLaunch

_ABI_VERSION = 2
_STATUS_NAMES = (  # cutlass::Status, cutlass/cutlass.h
    "kSuccess", "kErrorMisalignedOperand", "kErrorInvalidDataType", "kErrorInvalidLayout",
    "kErrorInvalidProblem", "kErrorNotSupported", "kErrorWorkspaceNull", "kErrorInternal",
    "kErrorArchMismatch", "kErrorInsufficientDriver", "kErrorMemoryAllocation", "kInvalid",
)
_SUCCESS = driver.CUresult.CUDA_SUCCESS
_POINTER = struct.Struct("<Q")


class CudaError(RuntimeError):
    """A CUDA driver call failed."""


class UnsupportedProblem(NotImplementedError):
    """CUTLASS's ``can_implement`` rejected the problem for this kernel."""


def _check(result):
    """Unpack a ``cuda.bindings`` return tuple, raising :class:`CudaError` on failure."""
    err, *values = result
    if err != _SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise CudaError(f"CUDA driver error {name.decode() if name else err}")
    return values[0] if len(values) == 1 else values


@dataclass(frozen=True)
class LaunchPlan:
    """Everything one problem needs at launch: ``params`` (the kernel's ``Params`` bytes with
    null tensor addresses), the grid, and the byte offsets of the four addresses in ``params``
    (x, filter, bias, y)."""

    params: bytes
    grid: tuple[int, int, int]
    offsets: tuple[int, int, int, int]


class Kernel:
    """One built kernel in this process. Thread-safe; create through :func:`load`."""

    def __init__(self, artifact: Artifact):
        self.artifact = artifact
        self._host = ctypes.CDLL(str(artifact.host_lib))
        if self._host.cutlass_convt_abi_version() != _ABI_VERSION:
            raise RuntimeError(f"{artifact.host_lib} has another ABI version; rebuild it")
        info = (ctypes.c_int64 * 7)()
        self._host.cutlass_convt_describe(info)
        self.threads, self.shared_bytes, self.params_bytes = info[0], info[1], info[2]
        self._offsets = tuple(info[3:7])
        self._library = None
        self._kernels: dict[int, object] = {}  # device ordinal -> CUkernel with its smem limit
        self._lock = threading.Lock()

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

    def _kernel_for(self, device: int):
        """The CUkernel for ``device``, bound there with its shared-memory limit (once)."""
        with self._lock:
            kernel = self._kernels.get(device)
            if kernel is None:
                if self._library is None:
                    _check(driver.cuInit(0))
                    self._library = _check(driver.cuLibraryLoadData(
                        self.artifact.cubin.read_bytes(), None, None, 0, None, None, 0))
                kernel = _check(driver.cuLibraryGetKernel(self._library, KERNEL_SYMBOL.encode()))
                _check(driver.cuKernelSetAttribute(
                    driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    self.shared_bytes, kernel, _check(driver.cuDeviceGet(device))))
                self._kernels[device] = kernel
        return kernel

    def launch(self, plan: LaunchPlan, device: int, stream: int,
               x: int, filter: int, bias: int, y: int) -> None:
        """Launch on ``stream`` (a ``cudaStream_t`` as int) of CUDA device ``device``, whose
        primary context must be current. ``x``, ``filter``, ``bias``, ``y`` are device
        addresses of packed NHWC x, KRSC filter, the bias vector (any address when the plan has
        no bias) and NHWC y."""
        kernel = self._kernels.get(device)
        if kernel is None:
            kernel = self._kernel_for(device)
        params = bytearray(plan.params)
        for offset, address in zip(plan.offsets, (x, filter, bias, y)):
            _POINTER.pack_into(params, offset, address)
        args = (ctypes.c_void_p * 1)(ctypes.addressof(ctypes.c_char.from_buffer(params)))
        err, = driver.cuLaunchKernel(kernel, *plan.grid, self.threads, 1, 1, self.shared_bytes,
                                     stream, ctypes.addressof(args), 0)
        if err != _SUCCESS:
            _check((err,))


_LOADED: dict[str, Kernel] = {}
_LOADED_LOCK = threading.Lock()


def load(artifact: Artifact) -> Kernel:
    """The process-wide :class:`Kernel` of ``artifact`` (loaded on first request)."""
    key = str(artifact.path)
    with _LOADED_LOCK:
        if key not in _LOADED:
            _LOADED[key] = Kernel(artifact)
        return _LOADED[key]

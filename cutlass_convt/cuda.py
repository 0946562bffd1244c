"""CUDA driver concerns, through ``cuda.bindings.driver``: errors, the primary context and the
device guard, cubins loaded as libraries, host libraries, launches, occupancy and tensor maps.

Every kernel family launches through here; nothing here knows a family. Rules:

- A cubin is loaded once per process as a context-independent ``CUlibrary``
  (:class:`Library`); its kernels bind to each device's primary context, the one PyTorch uses,
  on first use there.
- Our CUDA work runs inside :class:`OnDevice`, which makes the tensors' device PyTorch's current
  one and its primary context current in the calling thread (a thread's first CUDA work may be
  ours).
- A launch is ``cuLaunchKernel`` on the caller's stream with no host synchronization, so that
  CUDA-graph capture works.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import threading
from typing import Callable

import torch
from cuda.bindings import driver

_SUCCESS = driver.CUresult.CUDA_SUCCESS


class CudaError(RuntimeError):
    """A CUDA driver call failed."""


def check(result):
    """Unpack a ``cuda.bindings`` return tuple, raising :class:`CudaError` on failure."""
    err, *values = result
    if err != _SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise CudaError(f"CUDA driver error {name.decode() if name else err}")
    return values[0] if len(values) == 1 else values


_THREAD = threading.local()  # .device: the device whose context this thread has found current
_PRIMARY: dict[int, object] = {}  # device -> its primary context, retained once per process
_PRIMARY_LOCK = threading.Lock()


def make_primary_context_current(device: int) -> None:
    """Make ``device``'s primary context current in the calling thread unless a context of
    ``device`` is. The CUDA runtime makes it current only at a thread's first runtime call that
    needs one, so a thread whose first CUDA work is ours would otherwise meet
    ``CUDA_ERROR_INVALID_CONTEXT`` (or launch on another device). Checked again only when the
    thread's device differs from its last check, or after :func:`forget_current_context`. The
    primary context is retained once per process and never released (PyTorch shares it).
    Raises :class:`CudaError`."""
    if getattr(_THREAD, "device", None) == device:
        return
    check(driver.cuInit(0))
    if not int(check(driver.cuCtxGetCurrent())) or check(driver.cuCtxGetDevice()) != device:
        with _PRIMARY_LOCK:
            if device not in _PRIMARY:
                _PRIMARY[device] = check(driver.cuDevicePrimaryCtxRetain(
                    check(driver.cuDeviceGet(device))))
        check(driver.cuCtxSetCurrent(_PRIMARY[device]))
    _THREAD.device = device


def forget_current_context() -> None:
    """Have the calling thread's next :func:`make_primary_context_current` check its context
    again: for callers that may have made another context current since (switching PyTorch's
    device back does)."""
    _THREAD.device = None


class OnDevice:
    """The guard around our CUDA work for device index ``device``: makes it PyTorch's current
    device and its primary context current in this thread. Where it had to switch devices, on
    leaving (an exception too, or a failure to make the context current) it switches back with
    ``torch.cuda.device``, which restores the previous device only where that device has a
    context (``torch.cuda.set_device`` would create one, hundreds of MB on a GPU the process
    never used), and has the thread's next context check look again. When ``device`` is current
    already (the common case) it changes nothing. Raises what ``torch.cuda.current_device``
    raises without CUDA."""

    __slots__ = ("device", "switch")

    def __init__(self, device: int):
        self.device = device

    def __enter__(self):
        self.switch = None
        if torch.cuda.current_device() != self.device:
            self.switch = torch.cuda.device(self.device)
            self.switch.__enter__()
        try:
            make_primary_context_current(self.device)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        if self.switch is not None:
            forget_current_context()
            self.switch.__exit__(*exc)
        return False


@functools.lru_cache(maxsize=None)
def device_identity(device: int) -> tuple[tuple[str, object], ...]:
    """What a measured time on ``device`` depends on beyond the code: the GPU's name, its SM
    count, its memory clock (kHz) and the driver's CUDA version (12090 for 12.9), as
    ``(field, value)`` pairs. Raises :class:`CudaError`."""
    check(driver.cuInit(0))
    handle = check(driver.cuDeviceGet(device))
    attribute = driver.CUdevice_attribute
    name = check(driver.cuDeviceGetName(256, handle))
    return (("gpu", name.split(b"\0", 1)[0].decode(errors="replace")),
            ("sm_count", check(driver.cuDeviceGetAttribute(
                attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, handle))),
            ("memory_clock_khz", check(driver.cuDeviceGetAttribute(
                attribute.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, handle))),
            ("driver", check(driver.cuDriverGetVersion())))


def current_stream(device: int) -> int:
    """``torch.cuda.current_stream(device).cuda_stream``, through the fast binding that Triton
    and Inductor use when this PyTorch has it (the public call costs several times more)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


@functools.lru_cache(maxsize=None)
def _pointers(count: int):
    """The ctypes type of an array of ``count`` pointers (made once: making one is slow)."""
    return ctypes.c_void_p * count


def launch_values(kernel, grid, block, shared_bytes: int, stream: int, values) -> None:
    """``cuLaunchKernel`` of a kernel whose arguments are ``values``: each the argument's bytes,
    or the host address of its value (a tensor map's ``getPtr()``). ``block``: the x size or an
    (x, y, z) triple."""
    addresses = [ctypes.cast(ctypes.c_char_p(v), ctypes.c_void_p).value
                 if isinstance(v, bytes) else v for v in values]
    args = _pointers(len(addresses))(*addresses)
    block = block if isinstance(block, tuple) else (block, 1, 1)
    err, = driver.cuLaunchKernel(kernel, *grid, *block, shared_bytes, stream,
                                 ctypes.addressof(args), 0)
    if err != _SUCCESS:
        check((err,))


def tensor_map_bytes(tensor_map) -> bytes:
    """The 128 bytes of a ``CUtensorMap``."""
    return ctypes.string_at(tensor_map.getPtr(), 128)


class Library:
    """A cubin loaded once per process as a context-independent ``CUlibrary``; its kernels are
    bound to each device's primary context on first use there."""

    def __init__(self, cubin: bytes):
        self._cubin = cubin
        self._library = None
        self._kernels: dict[tuple[str, int], object] = {}  # (symbol, device) -> CUkernel
        self._lock = threading.Lock()

    def kernel(self, symbol: str, device: int, shared_bytes: int = 0):
        """The CUkernel ``symbol`` for ``device``, allowed ``shared_bytes`` of dynamic shared
        memory there."""
        found = self._kernels.get((symbol, device))
        if found is not None:
            return found
        with self._lock:
            if self._library is None:
                check(driver.cuInit(0))
                self._library = check(driver.cuLibraryLoadData(
                    self._cubin, None, None, 0, None, None, 0))
            kernel = check(driver.cuLibraryGetKernel(self._library, symbol.encode()))
            if shared_bytes:
                check(driver.cuKernelSetAttribute(
                    driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared_bytes, kernel, check(driver.cuDeviceGet(device))))
            self._kernels[(symbol, device)] = kernel
        return kernel

    def resident_ctas(self, symbol: str, threads: int, shared_bytes: int, device: int) -> int:
        """How many CTAs of ``symbol`` (``threads`` threads, ``shared_bytes`` of dynamic shared
        memory) fit on ``device`` at once: the grid of a persistent kernel; 0 when not one fits
        on an SM."""
        kernel = self.kernel(symbol, device, shared_bytes)
        per_sm = check(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            check(driver.cuKernelGetFunction(kernel)), threads, shared_bytes))
        sms = check(driver.cuDeviceGetAttribute(
            driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            check(driver.cuDeviceGet(device))))
        return per_sm * sms


class ParamStruct:
    """A kernel's by-value parameter struct as Python packs it: ``pointers`` (64-bit device
    addresses) then ``ints`` (32-bit), named as the fields of the C++ struct ``name`` in the
    templates, in their order (a test reads both)."""

    def __init__(self, name: str, pointers: str, ints: str):
        self.name = name
        self.pointers, self.ints = tuple(pointers.split()), tuple(ints.split())
        self._pointers = struct.Struct(f"<{len(self.pointers)}Q")
        self._ints = struct.Struct(f"<{len(self.ints)}i")

    @property
    def size(self) -> int:
        """Bytes of the struct (no padding: pointers first)."""
        return self._pointers.size + self._ints.size

    def pack(self, *values: int) -> bytes:
        """The struct's bytes of the pointers' and then the ints' values."""
        return self.pack_pointers(*values[:len(self.pointers)]) + self.pack_ints(
            *values[len(self.pointers):])

    def pack_pointers(self, *addresses: int) -> bytes:
        return self._pointers.pack(*addresses)

    def pack_ints(self, *ints: int) -> bytes:
        return self._ints.pack(*ints)


def host_library(path, abi_version: int) -> ctypes.CDLL:
    """The host library at ``path`` (``ctypes``), checked to export
    ``cutlass_convt_abi_version() == abi_version``; raises RuntimeError for another ABI."""
    library = ctypes.CDLL(str(path))
    if library.cutlass_convt_abi_version() != abi_version:
        raise RuntimeError(f"{path} has another ABI version; rebuild it")
    return library


# A tensor map's shape: dims, byte strides (of dims 1...), box, its swizzle (bytes: 0 for none,
# 64 or 128) and its L2 promotion (bytes: 128 or 256).
MapShape = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int, int]
_SWIZZLES = {0: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
             64: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
             128: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B}
_L2_PROMOTION = {128: driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                 256: driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B}


_DATA_TYPES = {"float32": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
               "float16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
               "bfloat16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16}


class TensorMaps:
    """Tensor maps of ``dtype`` elements (``cuTensorMapEncodeTiled``, zero fill) encoded on the
    host and kept by (address, shape), at most ``size`` of them (the oldest goes first)."""

    def __init__(self, size: int = 64, dtype: str = "float32"):
        self._size = size
        self._data_type = _DATA_TYPES[dtype]
        self._maps: dict[tuple, object] = {}
        self._lock = threading.Lock()

    def get(self, address: int, shape: MapShape):
        """The tensor map of the tensor at ``address`` with ``shape``, encoded on first use."""
        key = (address, shape)
        found = self._maps.get(key)
        if found is not None:
            return found
        dims, strides, box, swizzle, promotion = shape
        wide, narrow = driver.cuuint64_t, driver.cuuint32_t
        tensor_map = check(driver.cuTensorMapEncodeTiled(
            self._data_type, len(dims), address,
            [wide(v) for v in dims], [wide(v) for v in strides], [narrow(v) for v in box],
            [narrow(1)] * len(dims),
            driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            _SWIZZLES[swizzle],
            _L2_PROMOTION[promotion],
            driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
        with self._lock:
            if len(self._maps) >= self._size:
                self._maps.pop(next(iter(self._maps)))
            self._maps[key] = tensor_map
        return tensor_map


_LOADED: dict[str, object] = {}
_LOADED_LOCK = threading.Lock()


def load(artifact, factory: Callable):
    """The process-wide ``factory(artifact)`` of a built kernel (a family's kernel class),
    created on first request; keyed by the artifact's cache folder."""
    key = str(artifact.path)
    with _LOADED_LOCK:
        if key not in _LOADED:
            _LOADED[key] = factory(artifact)
        return _LOADED[key]

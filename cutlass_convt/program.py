"""A call's work on the GPU as data: the steps a family's run takes for one call signature
(operands packed or allocated, addresses checked, kernels launched), so that the C++ per-call
path (``templates/dispatch.cpp``) can replay them without Python.

A family's run is written once, against an :class:`Executor`: :class:`Direct` does each step
at once (the Python path); :class:`Recorder` does it too and records it as a program that
depends only on what the call's signature fixes (sizes, strides, dtypes, device: the steps'
branches read those alone), with every address a reference to a tensor of the program, never
a value. Steps that depend on an address (alignment) are evaluated again at every replay.

Tensor slots: 0 the input (4-D), 1 the weight, 2 the bias (or none); each step that makes a
tensor adds the next slot. A program's result is a slot.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import torch

from . import cuda

__all__ = ["Address", "Direct", "Executor", "OperandError", "Params", "Recorder", "address",
           "params", "patched"]

# step codes (dispatch.cpp's enum Step has the same values)
PACK, NEW, SCRATCH, CHECK, LAUNCH, TRANSFORM, REPEAT, HOST_PARAMS, RESULT = range(9)
# argument kinds of a launch
BYTES, MAP = 0, 1
_FORMATS = {torch.contiguous_format: 0, torch.channels_last: 1}


class OperandError(RuntimeError):
    """An operand about to be handed to a kernel (x, the prepared filter, bias, y, a
    workspace) is not what the kernel reads: another shape, dtype or layout, or a misaligned
    address. Raised before the launch; an internal error of cutlass_convt (a family's
    preparation is wrong), never the caller's."""


def address(name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype,
            alignment_bytes: int, channels_last: bool = False) -> int:
    """The device address of ``t`` once checked to be the operand ``name`` a kernel reads:
    ``shape``, ``dtype``, packed (channels_last, i.e. NHWC, for a 4-D ``channels_last``
    operand; else row-major), at a multiple of ``alignment_bytes``. Raises
    :class:`OperandError`. The kernel boundary's contract: every family's run hands its
    kernels addresses through this (a few C calls: it stays on)."""
    if (t.shape != shape or t.dtype != dtype
            or not (t.is_contiguous(memory_format=torch.channels_last) if channels_last
                    else t.is_contiguous())
            or t.data_ptr() % alignment_bytes):
        raise OperandError(
            f"cutlass_convt internal error: operand {name} is {tuple(t.shape)} {t.dtype} with "
            f"strides {t.stride()} at address {t.data_ptr():#x}; the kernel reads "
            f"{tuple(shape)} {dtype} packed {'NHWC' if channels_last else 'row-major'} at a "
            f"multiple of {alignment_bytes} bytes")
    return t.data_ptr()


class Address(int):
    """A device address that knows where it points: ``slot``'s data pointer plus ``delta``
    bytes (the recorder's; arithmetic with ints keeps the reference)."""

    slot: int
    delta: int

    def __new__(cls, value: int, slot: int, delta: int = 0):
        self = super().__new__(cls, value)
        self.slot, self.delta = slot, delta
        return self

    def __add__(self, other):
        if type(other) is int:
            return Address(int(self) + other, self.slot, self.delta + other)
        return NotImplemented

    __radd__ = __add__


@dataclass
class Params:
    """A kernel argument's bytes and where addresses lie in them: (byte offset, address)."""

    data: bytes
    addresses: list[tuple[int, int]] = field(default_factory=list)


def params(pointers, ints: bytes = b"") -> Params:
    """A by-value struct of 64-bit ``pointers`` then the packed ``ints``."""
    return Params(struct.pack(f"<{len(pointers)}Q", *pointers) + ints,
                  [(8 * i, p) for i, p in enumerate(pointers)])


def patched(template: bytes, offsets, pointers) -> Params:
    """``template`` with the 64-bit ``pointers`` written at byte ``offsets``."""
    data = bytearray(template)
    for offset, pointer in zip(offsets, pointers):
        struct.pack_into("<Q", data, offset, pointer)
    return Params(bytes(data), list(zip(offsets, pointers)))


class Executor:
    """The steps of a family's run (see the module's docstring); ``stream``: the call's."""

    stream: int

    def packed(self, t, alignment: int, memory_format) -> torch.Tensor:
        """``t`` packed in ``memory_format`` at an address that is a multiple of
        ``alignment`` bytes: itself when it is, else a copy."""
        if not t.is_contiguous(memory_format=memory_format):
            t = t.contiguous(memory_format=memory_format)
        if t.data_ptr() % alignment:
            t = t.clone(memory_format=memory_format)
        return t

    def new_packed(self, like, shape, channels_last: bool) -> torch.Tensor:
        """A new (N, C, H, W) tensor of ``like``'s dtype and device, packed NCHW or NHWC."""
        n, c, h, w = shape
        strides = (c * h * w, 1, w * c, c) if channels_last else (c * h * w, h * w, w, 1)
        return like.new_empty_strided(shape, strides)

    def new_empty(self, like, elements: int) -> torch.Tensor:
        """A new flat tensor of ``elements`` of ``like``'s dtype and device (scratch)."""
        return like.new_empty(elements)

    def address(self, name, t, shape, dtype, alignment: int, channels_last=False) -> int:
        """The checked address of operand ``name`` (:func:`address`)."""
        return address(name, t, shape, dtype, alignment, channels_last)

    def transform(self, t, flip, permute, shape) -> torch.Tensor:
        """``t.flip(flip).permute(permute).reshape(shape)``, packed."""
        return t.flip(flip).permute(permute).reshape(shape).contiguous()

    def repeat(self, t, times: int) -> torch.Tensor:
        return t.repeat(times)

    def tensor_map(self, maps: cuda.TensorMaps, address: int, shape):
        """The tensor map of the tensor at ``address`` with ``shape`` (``maps``' cache)."""
        return maps.get(address, shape)

    def host_params(self, function, plan: bytes, params_bytes: int, pointers):
        """``function(plan, *pointers, params, grid) -> status`` of a host library (a
        ctypes function): the kernel's ``Params`` bytes and grid, or the nonzero status."""
        import ctypes

        out = ctypes.create_string_buffer(params_bytes)
        grid = (ctypes.c_int32 * 3)()
        status = function(plan, *(ctypes.c_void_p(int(p)) for p in pointers), out, grid)
        return status, Params(out.raw), tuple(grid)

    def launch(self, kernel, grid, block, shared_bytes: int, *arguments) -> None:
        """``cuLaunchKernel`` on the call's stream; ``arguments``: :class:`Params` (passed by
        value) or tensor maps (passed by value: ``CUtensorMap``)."""
        values = [a.data if isinstance(a, Params) else a.getPtr() for a in arguments]
        cuda.launch_values(kernel, grid, block, shared_bytes, self.stream, values)


class Direct(Executor):
    """Each step at once (the Python path)."""

    def __init__(self, stream: int):
        self.stream = stream


# c10::ScalarType codes of the dtypes a kernel reads (c10/core/ScalarType.h)
SCALAR_TYPES = {torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.bfloat16: 15}


class Recorder(Executor):
    """Each step at once, and recorded (:attr:`steps`, :attr:`blob`) for a replay on another
    call of the same signature: tensors by slot, addresses as :class:`Address`."""

    def __init__(self, stream: int, input, weight, bias):
        self.stream = stream
        self.steps: list[int] = []
        self.blob = bytearray()
        self._slots: dict[int, int] = {}
        self._alive: list[torch.Tensor] = []  # (ids stay unique while recording)
        for t in (input, weight, bias):
            self._slot(t)

    def _slot(self, t) -> int:
        """The slot of ``t``, a new one for a tensor not seen (None: a slot of its own)."""
        key = id(t)
        if key not in self._slots:
            self._slots[key] = len(self._slots)
            self._alive.append(t)
        return self._slots[key]

    def _bytes(self, data: bytes) -> int:
        """Where ``data`` starts in the blob (8-byte aligned)."""
        self.blob += b"\0" * (-len(self.blob) % 8)
        start = len(self.blob)
        self.blob += data
        return start

    def packed(self, t, alignment, memory_format):
        out = super().packed(t, alignment, memory_format)
        src = self._slot(t)
        self.steps += [PACK, self._slot(out), src, _FORMATS[memory_format], alignment]
        return out

    def new_packed(self, like, shape, channels_last):
        out = super().new_packed(like, shape, channels_last)
        self.steps += [NEW, self._slot(out), self._slot(like), *shape, int(channels_last)]
        return out

    def new_empty(self, like, elements):
        out = super().new_empty(like, elements)
        self.steps += [SCRATCH, self._slot(out), self._slot(like), elements]
        return out

    def address(self, name, t, shape, dtype, alignment, channels_last=False):
        value = super().address(name, t, shape, dtype, alignment, channels_last)
        slot = self._slot(t)
        self.steps += [CHECK, slot, len(shape), *shape, SCALAR_TYPES[dtype], alignment,
                       int(channels_last)]
        return Address(value, slot)

    def transform(self, t, flip, permute, shape):
        out = super().transform(t, flip, permute, shape)
        self.steps += [TRANSFORM, self._slot(out), self._slot(t), len(flip), *flip,
                       len(permute), *permute, len(shape), *shape]
        return out

    def repeat(self, t, times):
        out = super().repeat(t, times)
        self.steps += [REPEAT, self._slot(out), self._slot(t), times]
        return out

    def tensor_map(self, maps, address, shape):
        found = super().tensor_map(maps, address, shape)
        return _Map(found, address)

    def host_params(self, function, plan, params_bytes, pointers):
        import ctypes

        status, out, grid = super().host_params(function, plan, params_bytes, pointers)
        return status, _Host(out, ctypes.cast(function, ctypes.c_void_p).value, bytes(plan),
                             params_bytes, list(pointers)), grid

    def launch(self, kernel, grid, block, shared_bytes, *arguments):
        values = [a.found if isinstance(a, _Map) else a.params if isinstance(a, _Host) else a
                  for a in arguments]
        super().launch(kernel, grid, block, shared_bytes, *values)
        block = block if isinstance(block, tuple) else (block, 1, 1)
        steps = [LAUNCH, int(kernel), *grid, *block, shared_bytes, len(arguments)]
        for a in arguments:
            if isinstance(a, _Map):
                raw = cuda.tensor_map_bytes(a.found)
                steps += [MAP, self._bytes(raw), len(raw), *_reference(a.address)]
            elif isinstance(a, _Host):
                steps += [HOST_PARAMS, a.function, self._bytes(a.plan), len(a.plan), a.size,
                          len(a.pointers)]
                for p in a.pointers:
                    steps += _reference(p)
            else:
                steps += [BYTES, self._bytes(a.data), len(a.data), len(a.addresses)]
                for offset, p in a.addresses:
                    steps += [offset, *_reference(p)]
        self.steps += steps

    def result(self, y) -> None:
        self.steps += [RESULT, self._slot(y)]


@dataclass
class _Map:
    """A recorded tensor map: the map and the address it was made for."""

    found: object
    address: int


@dataclass
class _Host:
    """Recorded ``Params`` of a host library: the bytes it wrote, and how a replay makes them
    again (the function's address, the plan, the size, the pointers it was given)."""

    params: Params
    function: int
    plan: bytes
    size: int
    pointers: list


def _reference(address) -> list[int]:
    """(slot, delta) of a recorded address; (-1, value) for an address of no tensor (a
    configuration without bias reads none: 0)."""
    if isinstance(address, Address):
        return [address.slot, address.delta]
    return [-1, int(address)]

"""program.py on the CPU: a family's recording, replayed (by a Python model of dispatch.cpp's
replay) on fresh operands of the same signature, hands every kernel the arguments that the
family's own run on those operands hands it: the same kernels, grids, blocks, shared memory,
and every address pointing at the same operand (or scratch) at the same offset. The kernels,
tensor maps and fprop_sm90's host library are stand-ins (no GPU); the families' run and plan
code is their own (dgrad's plan needs its built host library: the GPU tests cover it)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import struct

import pytest
import torch

from cutlass_convt import cuda, program
from cutlass_convt.families import direct, fprop_sm90, layout, phase, strip
from cutlass_convt.families.base import Prepared

from helpers import INPUT_FORMS, WEIGHT_FORMS, make_bias, make_input, make_weight, spec_of


class _Kernel:
    def __init__(self, symbol: str):
        self.symbol = symbol

    def __int__(self):
        return int.from_bytes(hashlib.sha256(self.symbol.encode()).digest()[:6], "little")


class _Library:
    def kernel(self, symbol, device, shared_bytes=0):
        return _Kernel(symbol)

    def resident_ctas(self, symbol, threads, shared_bytes, device):
        return 132


class _Map:
    """A stand-in tensor map: its first 8 bytes the address, then a digest of the shape."""

    def __init__(self, address, shape):
        raw = struct.pack("<Q", int(address)) + hashlib.sha256(repr(shape).encode()).digest() * 4
        self.buffer = (ctypes.c_char * 128).from_buffer_copy(raw[:128])

    def getPtr(self):
        return ctypes.addressof(self.buffer)


class _Maps:
    def get(self, address, shape):
        return _Map(address, shape)


# cutlass_convt_sm90_params's C signature (fprop_sm90_host.cu)
_HOST_PARAMS = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_void_p)
_PARAMS_BYTES = 64


def _host_params(problem, x, filter, y, bias, params, grid):
    """A stand-in host library: the four addresses then the problem's 44 bytes as Params, the
    grid (2, 1, 1)."""
    ctypes.memmove(params, struct.pack("<4Q", x or 0, filter or 0, y or 0, bias or 0), 32)
    ctypes.memmove(params + 32, problem, 32)
    ctypes.memmove(grid, struct.pack("<3i", 2, 1, 1), 12)
    return 0


_HOST = type("Host", (), {"cutlass_convt_sm90_params": _HOST_PARAMS(_host_params)})()


def _kernel(cls, config):
    kernel = cls.__new__(cls)
    kernel.config, kernel._library, kernel._maps = config, _Library(), _Maps()
    return kernel


def _prepared(family, kernel_class, spec, config, passes):
    """``family``'s Prepared for ``spec`` with a stand-in kernel (and host library)."""
    kernel = _kernel(kernel_class, config)
    if kernel_class is fprop_sm90.FpropSm90Kernel:
        kernel._host, kernel.threads, kernel.shared_bytes = _HOST, 384, 1024
        kernel.params_bytes = _PARAMS_BYTES
        plan = fprop_sm90.FpropSm90Plan(kernel.plan(spec), passes)
    else:
        plan = kernel.plan(spec, 0)
    return Prepared(spec, config, family, kernel, plan, 0)


class _Tracking(program.Direct):
    """program.Direct that lists the tensors it makes, in order."""

    def __init__(self):
        super().__init__(0)
        self.made = []

    def _made(self, t, out, computed: bool):
        if out is not t:
            self.made.append((out, computed))
        return out

    def packed(self, t, alignment, memory_format):
        return self._made(t, super().packed(t, alignment, memory_format), True)

    def new_packed(self, like, shape, channels_last):
        return self._made(None, super().new_packed(like, shape, channels_last), False)

    def new_empty(self, like, elements):
        return self._made(None, super().new_empty(like, elements), False)

    def transform(self, t, flip, permute, shape):
        return self._made(None, super().transform(t, flip, permute, shape), True)

    def repeat(self, t, times):
        return self._made(None, super().repeat(t, times), True)


def _replay(steps, blob, x, w, b):
    """A Python model of dispatch.cpp's replay: the tensors it makes (each with whether its
    values are computed, not left uninitialised), the launches' argument bytes (a tensor
    map's address written into its first 8 bytes, as the stand-in maps keep it) and the
    result."""
    slots, made, launches, result = {0: x, 1: w, 2: b}, [], [], None
    steps, pc = list(steps), 0

    def take(count=1):
        nonlocal pc
        values = steps[pc:pc + count]
        pc += count
        return values if count > 1 else values[0]

    def address(slot, delta):
        return delta if slot < 0 else slots[slot].data_ptr() + delta

    def put(dst, t, computed: bool):
        slots[dst] = t
        made.append((t, computed))

    while pc < len(steps):
        code = take()
        if code == program.PACK:
            dst, src, form, alignment = take(4)
            fmt = torch.channels_last if form else torch.contiguous_format
            t = slots[src]
            if not t.is_contiguous(memory_format=fmt):
                t = t.contiguous(memory_format=fmt)
            if t.data_ptr() % alignment:
                t = t.clone(memory_format=fmt)
            if t is not slots[src]:
                made.append((t, True))
            slots[dst] = t
        elif code == program.NEW:
            dst, like, n, c, h, w_, cl = take(7)
            put(dst, program.Direct(0).new_packed(slots[like], (n, c, h, w_), cl), False)
        elif code == program.SCRATCH:
            dst, like, elements = take(3)
            put(dst, slots[like].new_empty(elements), False)
        elif code == program.CHECK:
            slot, rank = take(2)
            shape = tuple(take(rank)) if rank > 1 else (take(),)
            dtype, alignment, cl = take(3)
            t = slots[slot]
            assert tuple(t.shape) == shape and program.SCALAR_TYPES[t.dtype] == dtype
            assert t.is_contiguous(memory_format=torch.channels_last if cl
                                   else torch.contiguous_format)
            assert t.data_ptr() % alignment == 0
        elif code == program.TRANSFORM:
            dst, src = take(2)
            flip = [take() for _ in range(take())]
            permute = [take() for _ in range(take())]
            shape = [take() for _ in range(take())]
            put(dst, slots[src].flip(flip).permute(permute).reshape(shape).contiguous(), True)
        elif code == program.REPEAT:
            dst, src, times = take(3)
            put(dst, slots[src].repeat(times), True)
        elif code == program.LAUNCH:
            kernel, *rest = take(9)
            grid, block, shared, count = tuple(rest[:3]), tuple(rest[3:6]), rest[6], rest[7]
            values = []
            for _ in range(count):
                kind = take()
                if kind == program.HOST_PARAMS:
                    function, offset, length, size, count_pointers = take(5)
                    pointers = [address(*take(2)) for _ in range(count_pointers)]
                    out = ctypes.create_string_buffer(size)
                    grid_out = (ctypes.c_int32 * 3)()
                    plan = ctypes.create_string_buffer(blob[offset:offset + length], length)
                    status = _HOST_PARAMS(function)(plan, *pointers, out, grid_out)
                    assert status == 0
                    values.append(out.raw)
                    continue
                if kind == program.MAP:
                    offset, length, slot, delta = take(4)
                    raw = bytearray(blob[offset:offset + length])
                    struct.pack_into("<Q", raw, 0, address(slot, delta))
                else:
                    assert kind == program.BYTES
                    offset, length, patches = take(3)
                    raw = bytearray(blob[offset:offset + length])
                    for _ in range(patches):
                        at, slot, delta = take(3)
                        struct.pack_into("<Q", raw, at, address(slot, delta))
                values.append(bytes(raw))
            launches.append((kernel, grid, block, shared, values))
        elif code == program.RESULT:
            result = slots[take()]
        else:
            raise AssertionError(f"step {code}")
    return made, launches, result


def _normalized(launches, named):
    """The launches with every 8-byte word that points into one of ``named``'s tensors
    written as (its name, the offset)."""
    def word(value):
        for name, t in named:
            if t is None:
                continue
            storage = t.untyped_storage()
            if storage.data_ptr() <= value < storage.data_ptr() + max(storage.nbytes(), 1):
                return (name, value - t.data_ptr())
        return value

    out = []
    for kernel, grid, block, shared, values in launches:
        args = [tuple(word(struct.unpack_from("<Q", v, i)[0]) if len(v) - i >= 8
                      else v[i:] for i in range(0, len(v), 8)) for v in values]
        out.append((kernel, tuple(grid), tuple(block), shared, args))
    return out


# (family module, its kernel class, a shape as helpers.spec_of takes it)
CASES = {
    "strip": (strip, strip.StripKernel, (2, 32, 32, 12, 16, (3, 3), 1, 1, 1, 0, 1)),
    "direct": (direct, direct.DirectKernel, (2, 16, 24, 10, 12, (3, 5), 1, (1, 2), 1, 0, 1)),
    "phase": (phase, phase.PhaseKernel, (2, 16, 24, 9, 10, (4, 4), 2, 1, 1, 0, 2)),
    "fprop_sm90": (fprop_sm90, fprop_sm90.FpropSm90Kernel,
                   (2, 32, 32, 9, 12, (3, 3), 1, 1, 1, 0, 1)),
    "fprop_sm90 k=s": (fprop_sm90, fprop_sm90.FpropSm90Kernel,
                       (3, 32, 16, 7, 6, (2, 2), 2, 0, 1, 0, 1)),
}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("weight_form", WEIGHT_FORMS)
@pytest.mark.parametrize("input_form", INPUT_FORMS)
@pytest.mark.parametrize("name", CASES)
def test_a_replay_hands_the_kernels_what_a_run_does(name, input_form, weight_form, bias,
                                                   monkeypatch):
    module, kernel_class, shape = CASES[name]
    launched = []

    def capture(kernel, grid, block, shared, stream, values):
        block = block if isinstance(block, tuple) else (block, 1, 1)
        launched.append((int(kernel), tuple(grid), block, shared,
                         [v if isinstance(v, bytes) else ctypes.string_at(v, 128)
                          for v in values]))

    monkeypatch.setattr(cuda, "launch_values", capture)
    passes = layout.LayoutKernels.__new__(layout.LayoutKernels)
    passes._library = _Library()
    monkeypatch.setattr(layout, "kernels", lambda arch: passes)
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    spec = spec_of((*shape, bias), "tf32",
                   input_form == "channels_last" or weight_form == "channels_last")
    family = module.FAMILY
    config = family.candidates(spec)[0]
    prepared = _prepared(family, kernel_class, spec, config, passes)

    def operands():
        x = make_input(spec.in_shape, input_form, torch.float32, gen)
        w = make_weight(spec.weight_shape, weight_form, torch.float32, gen)
        b = make_bias(spec.out_channels, "contiguous" if bias else "none", torch.float32, gen)
        return x, w, b

    x, w, b = operands()
    recorder = program.Recorder(0, x, w, b)
    recorder.result(family.run(prepared, recorder, x, w, b))
    launched.clear()
    x, w, b = operands()  # the same signature, other tensors
    tracking = _Tracking()
    y = family.run(prepared, tracking, x, w, b)
    expected = _normalized(launched, [("x", x), ("w", w), ("b", b)]
                           + [(f"made{i}", t) for i, (t, _) in enumerate(tracking.made)])
    made, replayed, result = _replay(recorder.steps, bytes(recorder.blob), x, w, b)
    got = _normalized(replayed, [("x", x), ("w", w), ("b", b)]
                      + [(f"made{i}", t) for i, (t, _) in enumerate(made)])
    assert got == expected
    assert len(made) == len(tracking.made)
    for (ours, computed), (theirs, theirs_computed) in zip(made, tracking.made):
        assert computed == theirs_computed and ours.shape == theirs.shape
        assert ours.stride() == theirs.stride()
        if computed:  # a packed copy, the filter's transform, the bias's repeat
            assert torch.equal(ours, theirs)
    assert result.shape == y.shape and result.stride() == y.stride()

"""Shared test helpers: fresh random inputs, poisoned outputs, the float64 check against
the package's error bounds, problem builders, and fake nvcc processes."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from cuda.bindings import driver
from hypothesis import strategies as st

import cutlass_convt
from cutlass_convt import build, choose, env, ops, problems, program
from cutlass_convt.benchmark import bound_failure, errors, sixteen_bound_failure
from cutlass_convt.families import dgrad as dgrad_family
from cutlass_convt.spec import ProblemSpec

CASE = problems.find("kernelbench-71")
TF32 = dgrad_family.default_dgrad_config(CASE.spec("tf32", 90))  # dgrad kernels of problem 71
FP32 = dgrad_family.default_dgrad_config(CASE.spec("fp32", 90))
TF32_SOURCES = dgrad_family.FAMILY.sources(TF32)

def fresh_generator() -> tuple[torch.Generator, int]:
    seed = int.from_bytes(os.urandom(4), "little")
    return torch.Generator("cuda").manual_seed(seed), seed


def poison_allocator(large_bytes: int) -> None:
    """Fill every free block of PyTorch's caching allocator with NaN, after reserving a free
    block of ``large_bytes`` (large pool) and 16 of 1 MB (small pool), so that the op under
    test allocates only NaN-filled memory. Checks that a fresh allocation reads NaN."""
    torch.cuda.synchronize()
    reserve = [torch.empty(large_bytes // 4, device="cuda")]
    reserve += [torch.empty(2**18, device="cuda") for _ in range(16)]
    del reserve
    nan_bits = 0x7FFF7FFF  # NaN as a float32 and as two float16 or bfloat16 halves
    for segment in torch.cuda.memory_snapshot():
        address = segment["address"]
        for block in segment["blocks"]:
            if block["state"] == "inactive":
                err, = driver.cuMemsetD32(block.get("address", address), nan_bits,
                                          block["size"] // 4)
                assert err == driver.CUresult.CUDA_SUCCESS, err
            address += block["size"]
    torch.cuda.synchronize()
    for probe in (torch.empty(large_bytes // 8, device="cuda"), torch.empty(1000, device="cuda")):
        assert probe.isnan().all(), "poisoning failed"


def to_tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 -> nearest TF32 value (10 mantissa bits), as float32."""
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


# Gradients come from PyTorch's own backward (float32 math on float32 operands): their bound
# against float64 autograd, per precision of the forward.
GRAD_REL = {"tf32": 1e-3, "fp32": 1e-5}
# A machine a tuning record holds for (cutlass_convt.measure.machine's form), for CPU tests.
MACHINE = (("gpu", "NVIDIA H100 80GB HBM3"), ("sm_count", 132), ("memory_clock_khz", 2619000),
           ("driver", 13000), ("torch", "2.11.0+cu130"), ("cudnn", 91900),
           ("cutlass", "4.2.0.0"))


def check(out, x, w, b, precision, seed, torch_tf32_max_abs=None, **kwargs):
    """Assert ``out`` matches the float64 reference within ``precision``'s bounds
    (``cutlass_convt.benchmark.bound_failure``; TF32's max abs error against the larger of
    ``torch_tf32_max_abs`` and TF32-rounded operands' own); returns the errors."""
    ref = F.conv_transpose2d(x.double(), w.double(), None if b is None else b.double(), **kwargs)
    assert out.shape == ref.shape
    err = errors(out, ref)
    where = f"seed={seed} precision={precision} shape={tuple(x.shape)} {kwargs}: {err}"
    tf32_max_abs = None
    if precision == "tf32":
        emulated = errors(F.conv_transpose2d(
            to_tf32(x).double(), to_tf32(w).double(), None if b is None else b.double(),
            **kwargs), ref)
        tf32_max_abs = max(emulated["max_abs"], torch_tf32_max_abs or 0.0)
    failure = bound_failure(err, precision, tf32_max_abs)
    assert failure is None, f"{where}: {failure}"
    return err


def random_problem(shape, channels_last: bool):
    """Fresh random x (NCHW or channels_last), weight (C_in, C_out / groups, R, S) and bias
    (None without) of ``shape``, and the seed they were drawn from."""
    n, c_in, c_out, h, w, kernel, stride, padding, dilation, output_padding, groups, bias = shape
    gen, seed = fresh_generator()
    x = torch.randn(n, c_in, h, w, device="cuda", generator=gen)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    wt = torch.randn(c_in, c_out // groups, *kernel, device="cuda", generator=gen)
    b = torch.randn(c_out, device="cuda", generator=gen) if bias else None
    return x, wt, b, seed


def run_shape(shape, precision, backend="auto", channels_last=False):
    n, c_in, c_out, h, w, kernel, stride, padding, dilation, output_padding, groups, bias = shape
    x, wt, b, seed = random_problem(shape, channels_last)
    kwargs = dict(stride=stride, padding=padding, dilation=dilation,
                  output_padding=output_padding, groups=groups)
    poison_allocator(64 * 2**20)
    out = cutlass_convt.conv_transpose2d(x, wt, b, precision=precision, backend=backend, **kwargs)
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last
                             else torch.contiguous_format)
    check(out, x, wt, b, precision, seed, **kwargs)


def run_sixteen(shape, dtype, channels_last, backend="auto", config=None) -> None:
    """``shape`` in ``dtype`` (float16 or bfloat16; fresh random tensors, poisoned output)
    through ``backend``, or on the kernel ``config`` itself: against float64 of the same 16-bit
    inputs, within :func:`cutlass_convt.benchmark.sixteen_bound_failure`'s bounds (twice
    PyTorch's own error in that dtype, and the dtype's rounding model); y in the input's dtype,
    shape and memory format."""
    n, c_in, c_out, h, w, kernel, stride, padding, dilation, output_padding, groups, bias = shape
    name = str(dtype).removeprefix("torch.")
    x, wt, b, seed = random_problem(shape, channels_last)
    x, wt = x.to(dtype), wt.to(dtype)
    b = b.to(dtype) if b is not None else None
    kwargs = dict(stride=stride, padding=padding, output_padding=output_padding, groups=groups,
                  dilation=dilation)
    ref = F.conv_transpose2d(x.double(), wt.double(), None if b is None else b.double(),
                             **kwargs)
    theirs = F.conv_transpose2d(x, wt, b, **kwargs)
    poison_allocator(64 * 2**20)
    if config is None:
        ours = cutlass_convt.conv_transpose2d(x, wt, b, backend=backend, **kwargs)
    else:
        spec = dataclasses.replace(spec_of(shape, "tf32", channels_last), dtype=name)
        ours = ops.run_prepared(ops.prepare_config(spec, config), x, wt, b)
    assert ours.dtype == dtype and ours.shape == ref.shape
    assert ours.is_contiguous(memory_format=torch.channels_last if channels_last
                              else torch.contiguous_format)

    failure = sixteen_bound_failure(errors(ours, ref), name, errors(theirs, ref)["rel"])
    assert failure is None, (shape, seed, failure)


INPUT_FORMS = ("nchw", "channels_last", "slice", "offset")
WEIGHT_FORMS = ("contiguous", "channels_last", "view", "offset")
BIAS_FORMS = ("none", "contiguous", "strided")


def make_input(shape, form: str, dtype: torch.dtype, gen) -> torch.Tensor:
    """A fresh random 4-D tensor of ``shape`` in ``form``: ``nchw`` and ``channels_last``
    packed; ``slice`` a non-contiguous slice with a storage offset; ``offset`` packed NCHW at
    an address one element past a 16-byte boundary."""
    n, c, h, w = shape
    device = gen.device
    if form == "slice":
        big = torch.randn(n, c + 3, h + 2, w + 5, device=device, generator=gen).to(dtype)
        return big[:, 3:, 1:h + 1, 5:]
    if form == "offset":
        flat = torch.randn(n * c * h * w + 1, device=device, generator=gen).to(dtype)
        return flat[1:].view(shape)
    t = torch.randn(shape, device=device, generator=gen).to(dtype)
    return t.contiguous(memory_format=torch.channels_last) if form == "channels_last" else t


def make_weight(shape, form: str, dtype: torch.dtype, gen) -> torch.Tensor:
    """A fresh random (C_in, C_out / groups, R, S) filter in ``form``: ``contiguous``,
    ``channels_last`` (``model.to(memory_format=torch.channels_last)`` makes these), ``view``
    (a permutation of an (R, S, C_in, C_out) tensor: neither layout), ``offset`` (packed at
    an address one element past a 16-byte boundary)."""
    c_in, c_out, r, s = shape
    device = gen.device
    if form == "view":
        return torch.randn(r, s, c_in, c_out, device=device, generator=gen).to(
            dtype).permute(2, 3, 0, 1)
    if form in ("contiguous", "channels_last"):
        return make_input(shape, "nchw" if form == "contiguous" else form, dtype, gen)
    return make_input(shape, form, dtype, gen)


def make_bias(c_out: int, form: str, dtype: torch.dtype, gen) -> torch.Tensor | None:
    """None, a fresh packed (C_out,) bias, or a ``strided`` view (every other element of a
    longer vector, from an odd offset)."""
    if form == "none":
        return None
    if form == "strided":
        return torch.randn(2 * c_out + 1, device=gen.device, generator=gen).to(dtype)[1::2]
    return torch.randn(c_out, device=gen.device, generator=gen).to(dtype)


def spec_of(shape, precision="tf32", channels_last=False) -> ProblemSpec:
    n, c_in, c_out, h, w, kernel, stride, padding, dilation, output_padding, groups, bias = shape
    pair = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
    return ProblemSpec(batch=n, in_channels=c_in, out_channels=c_out, in_size=(h, w),
                       kernel_size=kernel, stride=pair(stride), padding=pair(padding),
                       output_padding=pair(output_padding), dilation=pair(dilation),
                       groups=groups, bias=bias, channels_last=channels_last,
                       precision=precision, arch=90)


def run_config(shape, spec: ProblemSpec, config) -> None:
    """One stride-1, ungrouped ``shape`` in ``spec``'s precision (fresh random tensors in
    ``spec``'s layout, poisoned output) on the kernel ``config`` itself, not the one the choice
    would take."""
    padding = shape[7]  # (stride 1, dilation 1, groups 1 on these kernels)
    x, wt, b, seed = random_problem(shape, spec.channels_last)
    poison_allocator(64 * 2**20)
    out = ops.run_prepared(ops.prepare_config(spec, config), x, wt, b)
    check(out, x, wt, b, spec.precision, seed, padding=padding)


def run_plan(prepared: ops.Prepared, plan, x, wt, b, seed, padding) -> None:
    """``prepared``'s strip kernel launched on ``plan`` (a changed copy of its own), into a
    NaN-poisoned output in the problem's layout, checked against float64."""
    spec = prepared.spec
    y = torch.full(spec.out_shape, float("nan"), device="cuda")
    if spec.channels_last:
        y = y.contiguous(memory_format=torch.channels_last)
    prepared.kernel.run(plan, torch.cuda.current_device(),
                        program.Direct(torch.cuda.current_stream().cuda_stream),
                        x.data_ptr(), wt.data_ptr(), b.data_ptr(), y.data_ptr())
    check(y, x, wt, b, spec.precision, seed, padding=padding)


def problem71(**changes) -> ProblemSpec:
    return ProblemSpec(**{**problems.find("kernelbench-71").spec("tf32", 90).__dict__, **changes})


def sleeping_nvcc(folder: Path) -> Path:
    """An 'nvcc' that answers --version as the real one and otherwise, like nvcc running cicc,
    starts a child that sleeps for a minute and waits for it (a build to interrupt); it
    records its pid and its child's in ``folder``."""
    fake = folder / "nvcc"
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then exec {env.nvcc_path()} "
                    f"--version; fi\nsleep 60 &\necho $$ $! > {folder}/pid.$$\nwait\n")
    fake.chmod(0o755)
    return fake


def recording_nvcc(folder: Path) -> tuple[Path, Path]:
    """An 'nvcc' that answers --version as the real one and otherwise records its arguments
    in a file and fails: (its path, the file, which exists only once it was asked to
    compile)."""
    calls, fake = folder / "nvcc-calls", folder / "nvcc"
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then exec {env.nvcc_path()} "
                    f"--version; fi\necho \"$@\" >> {calls}\nexit 1\n")
    fake.chmod(0o755)
    return fake, calls


def wait_for_pids(folder: Path, count: int) -> list[int]:
    """The pids of ``count`` fake nvcc processes and of their children, once all have started."""
    for _ in range(300):
        pids = [p.read_text().split() for p in folder.glob("pid.*")]
        if len(pids) == count and all(len(pair) == 2 for pair in pids):
            return [int(pid) for pair in pids for pid in pair]
        time.sleep(0.05)
    raise AssertionError(f"{count} nvcc processes did not start")


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie is dead
    except (FileNotFoundError, ProcessLookupError):
        return False


def all_gone(pids: list[int], seconds: float = 5.0) -> bool:
    """Whether every process in ``pids`` has ended within ``seconds`` (a SIGKILL is delivered
    asynchronously: the sender goes on before the process is gone)."""
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def hold_lock(path: Path) -> subprocess.Popen:
    """A child process that holds the file lock ``path`` until killed (returned once it
    does)."""
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from filelock import FileLock
        lock = FileLock({str(path)!r})
        lock.acquire()
        print("locked", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "locked"
    return child


def compile_only_a_cubin(config, sources, folder, nvcc, tick=None):
    """A stand-in for build._compile that writes a minimal cubin (and host library, where the
    build has one) at once: an ELF header only."""
    (folder / build.CUBIN).write_bytes(b"\x7fELF")
    if sources.host:
        (folder / build.HOST_LIB).write_bytes(b"\x7fELF")
    return ""


def build_config(config, cache):
    """``config``'s build (a configuration of any family) into ``cache``."""

    return build.build(config, choose.family_of(config).sources(config), cache)


pairs = st.tuples(st.integers(1, 3), st.integers(1, 3))


# Error parity with PyTorch: over random arguments, ours refuses exactly what torch refuses.
# Batches are non-empty: for an empty batch PyTorch skips its dilation and output_padding
# checks (it returns an empty tensor for dilation=0); we validate empty batches like others.
# Dilation stays positive here: PyTorch's CPU paths accept dilation=0 for some shapes and
# refuse it for others ("dilation should be greater than zero"); we always refuse it (tested
# in test_bad_arguments_raise).
small = st.integers(-1, 3)


def random_shapes(count: int, seed: int = 2026):
    """A fixed sweep of argument combinations (values are drawn fresh in each test)."""
    rng = random.Random(seed)
    shapes = []
    while len(shapes) < count:
        groups = rng.choice([1, 1, 1, 2, 4])
        c_in, c_out = groups * rng.randint(1, 12), groups * rng.randint(1, 12)
        kernel = (rng.randint(1, 5), rng.randint(1, 5))
        stride = (rng.randint(1, 3), rng.randint(1, 3))
        dilation = ((1, 1) if stride != (1, 1) and rng.random() < 0.8
                    else (rng.randint(1, 2), rng.randint(1, 2)))
        padding = (rng.randint(0, 2), rng.randint(0, 2))
        output_padding = tuple(rng.randint(0, max(s, d) - 1) for s, d in zip(stride, dilation))
        h, w = rng.randint(1, 20), rng.randint(1, 20)
        out = [(i - 1) * s - 2 * p + d * (k - 1) + o + 1 for i, s, p, d, k, o in
               zip((h, w), stride, padding, dilation, kernel, output_padding)]
        if min(out) >= 1:
            shapes.append((rng.randint(1, 3), c_in, c_out, h, w, kernel, stride, padding,
                           dilation, output_padding, groups, rng.random() < 0.5))
    return shapes

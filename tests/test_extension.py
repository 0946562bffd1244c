"""The op's per-call path in C++ (``cutlass_convt.extension``, ``templates/dispatch.cpp``): which
kernels it registers, its autograd and autocast against PyTorch's on the CPU (the library
builds without a GPU), its reuse from the cache without nvcc, the Python path where it cannot
be built, and (GPU) the routes it runs from its table without entering Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from cutlass_convt import build, env, extension, ops

from helpers import recording_nvcc

pytestmark = pytest.mark.nvcc


def run_python(code: str, cache, mode: str = "on", **variables) -> str:
    """``code`` run in a fresh process with the extension mode ``mode`` and the kernel cache
    ``cache``; its stdout (raises with its stderr when it fails)."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, env={**os.environ, env.EXTENSION_VARIABLE: mode,
                                         env.CACHE_DIR_VARIABLE: str(cache), **variables})
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout


DUMP = """
    import json, torch, cutlass_convt
    from cutlass_convt import ops
    def kernels(name):
        found = {}
        for line in torch._C._dispatch_dump(name).splitlines():
            key, sep, where = line.partition(": registered at ")
            if sep:
                found[key.split("[")[0]] = where.split(" ")[0]
        return found
    print(json.dumps({"native": ops.NATIVE,
                      "forward": kernels("cutlass_convt::conv_transpose2d"),
                      "backward": kernels("cutlass_convt::conv_transpose2d_backward")}))
"""


def test_the_library_implements_the_op_and_python_the_rest(cache):
    found = json.loads(run_python(DUMP, cache))
    assert found["native"] is True
    for key in ("CUDA", "Autograd", "AutocastCUDA", "AutocastCPU"):
        assert found["forward"][key].startswith("dispatch.cpp"), (key, found)
    assert found["backward"]["CUDA"].startswith("dispatch.cpp"), found
    assert found["forward"]["CPU"].endswith("ops.py:" + found["forward"]["CPU"].split(":")[-1])
    assert "ops.py" in found["backward"]["CPU"]


def test_off_registers_the_python_kernels(cache):
    found = json.loads(run_python(DUMP, cache, mode="off"))
    assert found["native"] is False
    for key in ("CUDA", "AutocastCUDA", "AutocastCPU"):
        assert "ops.py" in found["forward"][key], (key, found)
    assert "dispatch.cpp" not in json.dumps(found)


def test_cpp_autograd_and_autocast_match_pytorch(cache):
    """Through the C++ Autograd kernel (CPU tensors: the CPU kernel is Python's), float64
    values and every gradient against PyTorch's own, batched and unbatched, with and without
    bias, one input not requiring grad; under CPU autocast the C++ kernel casts to bfloat16
    (float64 tensors are not cast)."""
    out = run_python("""
        import json, torch, torch.nn.functional as F, warnings
        from cutlass_convt import ops
        warnings.simplefilter("ignore")
        g = torch.Generator().manual_seed(int.from_bytes(__import__("os").urandom(4), "little"))
        errors = []
        for batched, has_bias, weight_grad in ((True, True, True), (False, True, False),
                                               (True, False, True)):
            shape = (2, 6, 5, 7) if batched else (6, 5, 7)
            x = torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
            w = torch.randn(6, 4, 3, 2, generator=g, dtype=torch.float64,
                            requires_grad=weight_grad)
            b = (torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
                 if has_bias else None)
            seed = torch.randn(1, generator=g, dtype=torch.float64)
            y = ops.OP(x, w, b, [2, 1], [1, 0], [1, 0], 1, [1, 2], None, "auto")
            assert type(y.grad_fn).__name__ == "CppFunction", y.grad_fn
            leaves = [t for t in (x, w, b) if t is not None and t.requires_grad]
            grads = torch.autograd.grad((y * seed).sum(), leaves)
            y_ref = F.conv_transpose2d(x, w, b, (2, 1), (1, 0), (1, 0), 1, (1, 2))
            refs = torch.autograd.grad((y_ref * seed).sum(), leaves)
            errors.append(float((y - y_ref).abs().max()))
            errors += [float((a - r).abs().max()) for a, r in zip(grads, refs)]
        x = torch.randn(2, 6, 5, 7, generator=g)
        w = torch.randn(6, 4, 3, 3, generator=g, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = ops.OP(x, w, None, [1, 1], [0, 0], [0, 0], 1, [1, 1], None, "auto")
            y64 = ops.OP(x.double(), w.detach().double(), None, [1, 1], [0, 0], [0, 0], 1,
                         [1, 1], None, "auto")
        ref = F.conv_transpose2d(x.double(), w.detach().double())
        print(json.dumps({"errors": errors, "dtype": str(y.dtype), "dtype64": str(y64.dtype),
                          "autocast_error": float((y.double() - ref).abs().max()
                                                  / ref.abs().max()),
                          "exact64": float((y64 - ref).abs().max())}))
    """, cache)
    found = json.loads(out)
    assert max(found["errors"]) < 1e-12, found
    assert found["dtype"] == "torch.bfloat16" and found["dtype64"] == "torch.float64"
    assert 0 < found["autocast_error"] < 2e-2, found  # bfloat16 inputs and result, float sums
    assert found["exact64"] < 1e-12, found


def test_a_later_process_loads_the_library_without_nvcc(cache, tmp_path):
    run_python("import cutlass_convt", cache)  # built (or found) in the cache
    fake, calls = recording_nvcc(tmp_path)
    out = run_python("from cutlass_convt import ops; print(ops.NATIVE)", cache,
                     **{env.NVCC_VARIABLE: str(fake)})
    assert out.strip() == "True"
    assert not calls.exists()


def test_without_a_compiler_auto_warns_and_runs_python(monkeypatch, tmp_path):
    """``auto`` on a machine with CUDA whose build fails: one RuntimeWarning naming the
    cause, the Python kernels; ``on``: the BuildError."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(tmp_path))

    def no_nvcc(config, sources, cache_dir=None, **kwargs):
        raise build.BuildError("no nvcc here")

    monkeypatch.setattr(build, "build", no_nvcc)
    monkeypatch.setenv(env.EXTENSION_VARIABLE, "auto")
    with pytest.warns(RuntimeWarning, match="runs in Python.*no nvcc here"):
        assert extension.load.__wrapped__() is False
    monkeypatch.setenv(env.EXTENSION_VARIABLE, "on")
    with pytest.raises(build.BuildError, match="no nvcc here"):
        extension.load.__wrapped__()
    monkeypatch.setenv(env.EXTENSION_VARIABLE, "sometimes")  # at import: warned, not raised
    with pytest.warns(RuntimeWarning, match="runs in Python.*CUTLASS_CONVT_EXTENSION='sometimes'"):
        assert extension.load.__wrapped__() is False


def test_the_key_covers_pytorch():
    """Another PyTorch (version, commit, ABI, folder, CUDA, TF32 API) is another build."""
    import dataclasses

    base = extension.config()
    key = build._fingerprint(base, extension.sources(base), "13.0.88")
    for field, value in (("torch_version", "0.0.1"), ("torch_git", "0" * 40),
                         ("cxx11_abi", not base.cxx11_abi), ("torch_dir", "/elsewhere/torch"),
                         ("torch_cuda", "99.9"), ("fp32_api", (base.fp32_api + 1) % 3)):
        other = dataclasses.replace(base, **{field: value})
        assert build._fingerprint(other, extension.sources(other), "13.0.88") != key, field


# ----------------------------------------------------------------------------------------------
# GPU: the table.

needs_native = pytest.mark.skipif(not ops.NATIVE, reason="the C++ per-call path is not loaded")


def _python_calls(fn) -> list[str]:
    """The Python functions of cutlass_convt that ``fn()`` enters."""
    entered = []

    def profile(frame, event, arg):
        if event == "call" and "cutlass_convt" in frame.f_code.co_filename:
            entered.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return entered


@pytest.mark.gpu
@needs_native
def test_pytorch_routes_run_from_the_table_without_python():
    """A float64 call (PyTorch's route) is remembered at its first call and then runs without
    entering Python, with PyTorch's values and memory format; a call that sets PyTorch's
    TF32 switch (an explicit precision that differs) is never remembered."""
    ops.clear_caches()
    assert torch.ops.cutlass_convt._remembered() == 0
    g = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    x = torch.randn(2, 8, 6, 6, device="cuda", dtype=torch.float64, generator=g).to(
        memory_format=torch.channels_last)
    w = torch.randn(8, 4, 3, 3, device="cuda", dtype=torch.float64, generator=g)
    args = ([2, 2], [1, 1], [1, 1], 1, [1, 1], None, "auto")
    first = ops.OP(x, w, None, *args)
    assert torch.ops.cutlass_convt._remembered() == 1
    y = torch.full_like(first, float("nan"))
    entered = _python_calls(lambda: y.copy_(ops.OP(x, w, None, *args)))
    assert entered == [], entered
    ref = F.conv_transpose2d(x, w, None, 2, 1, 1)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    assert y.is_contiguous(memory_format=torch.channels_last) == ref.is_contiguous(
        memory_format=torch.channels_last)

    x32, w32 = x.float(), w.float()
    other = "fp32" if torch.backends.cudnn.allow_tf32 else "tf32"
    ops.OP(x32, w32, None, *args[:5], other, "torch")
    assert torch.ops.cutlass_convt._remembered() == 1
    ops.clear_caches()
    assert torch.ops.cutlass_convt._remembered() == 0


@pytest.mark.gpu
@needs_native
def test_cpp_autograd_and_autocast_on_the_kernels():
    """The C++ autograd and autocast kernels around a CUTLASS kernel (phase, float32 and
    bfloat16): values and gradients against float64 within the precision's bounds."""
    g = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    x = torch.randn(4, 16, 8, 8, device="cuda", generator=g, requires_grad=True)
    w = torch.randn(16, 8, 4, 4, device="cuda", generator=g, requires_grad=True)
    b = torch.randn(8, device="cuda", generator=g, requires_grad=True)
    seed = torch.randn(4, 8, 16, 16, device="cuda", generator=g, dtype=torch.float64)
    ref_leaves = [t.detach().double().requires_grad_() for t in (x, w, b)]
    ref = F.conv_transpose2d(*ref_leaves, 2, 1)
    ref_grads = torch.autograd.grad((ref * seed).sum(), ref_leaves)
    for autocast, bound in ((False, 2e-3), (True, 2e-2)):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            y = ops.conv_transpose2d(x, w, b, 2, 1, backend="phase")
        assert y.dtype == (torch.bfloat16 if autocast else torch.float32)
        grads = torch.autograd.grad((y.double() * seed).sum(), (x, w, b))
        for got, want in zip((y, *grads), (ref, *ref_grads)):
            error = float((got.double() - want).abs().max() / want.abs().max())
            assert error < bound, (autocast, error)


@pytest.mark.gpu
def test_the_backward_keeps_the_forward_precision():
    """A forward in IEEE float32 (PyTorch's TF32 switch off around it), its backward outside
    with TF32 on: the gradients are fp32-accurate against float64 (a TF32 backward misses
    this bound by orders of magnitude), on whichever path is loaded."""
    from cutlass_convt.args import torch_conv_precision

    g = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    x = torch.randn(2, 64, 12, 12, device="cuda", generator=g, requires_grad=True)
    w = torch.randn(64, 32, 4, 4, device="cuda", generator=g, requires_grad=True)
    seed = torch.randn(2, 32, 24, 24, device="cuda", generator=g)
    with torch_conv_precision("fp32"):
        y = ops.conv_transpose2d(x, w, None, 2, 1)
    with torch_conv_precision("tf32"):
        grads = torch.autograd.grad((y * seed).sum(), (x, w))
    leaves = [t.detach().double().requires_grad_() for t in (x, w)]
    refs = torch.autograd.grad((F.conv_transpose2d(*leaves, None, 2, 1) * seed.double()).sum(),
                               leaves)
    for got, want in zip(grads, refs):
        error = float((got.double() - want).norm() / want.norm())
        assert error < 1e-5, error

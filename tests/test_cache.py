"""The kernel cache and the build: nvcc runs, cache hits without nvcc, atomic and locked
entries, failed, interrupted and killed builds (CPU with nvcc)."""

from __future__ import annotations

import _thread
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from cutlass_convt import build, emit, env
from cutlass_convt.families import dgrad as dgrad_family

from helpers import (
    FP32,
    TF32,
    TF32_SOURCES,
    all_gone,
    compile_only_a_cubin,
    hold_lock,
    recording_nvcc,
    sleeping_nvcc,
    wait_for_pids,
)


@pytest.mark.nvcc
def test_nvcc_builds_cubin_and_host_library(artifact):
    cubin = artifact.cubin.read_bytes()
    assert cubin[:4] == b"\x7fELF" and dgrad_family.DGRAD_SYMBOL.encode() in cubin
    manifest = json.loads((artifact.path / "manifest.json").read_text())
    assert manifest["nvcc_version"] == env.nvcc_version()
    assert manifest["cutlass_version"] == env.cutlass_version()
    assert any("0 bytes spill stores" in line for line in manifest["ptxas"]), manifest["ptxas"]
    assert artifact.path.name.startswith(TF32.name + "-")


@pytest.mark.nvcc
def test_second_build_is_a_cache_hit_without_nvcc(artifact, cache, monkeypatch):
    def no_compile(*args, **kwargs):
        raise AssertionError("nvcc ran on a cache hit")

    monkeypatch.setattr(build, "_compile", no_compile)
    again = build.build(TF32, TF32_SOURCES, cache)
    assert again.path == artifact.path and again.manifest["key"] == artifact.manifest["key"]
    assert artifact.compiled and not again.compiled


@pytest.mark.nvcc
def test_another_process_reuses_the_entry_without_nvcc(artifact, cache, tmp_path):
    """A fresh process whose 'nvcc' records any compile call finds the entry and compiles
    nothing."""
    fake, calls = recording_nvcc(tmp_path)
    code = ("from cutlass_convt import build, problems; from cutlass_convt.families import dgrad;"
            "c = dgrad.default_dgrad_config(problems.find('71').spec('tf32', 90));"
            "a = build.build(c, dgrad.FAMILY.sources(c)); print(a.path)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, env.CACHE_DIR_VARIABLE: str(cache),
                              env.NVCC_VARIABLE: str(fake)})
    assert out.stdout.strip() == str(artifact.path)
    assert not calls.exists()


@pytest.mark.nvcc
def test_key_covers_toolchain(monkeypatch):
    key = build._fingerprint(TF32, TF32_SOURCES, "13.0.88")
    assert build._fingerprint(TF32, TF32_SOURCES, "13.1.0") != key
    assert build._fingerprint(FP32, dgrad_family.FAMILY.sources(FP32), "13.0.88") != key
    monkeypatch.setattr(env, "cutlass_version", lambda: "9.9.9")
    assert build._fingerprint(TF32, TF32_SOURCES, "13.0.88") != key


@pytest.mark.nvcc
def test_without_nvcc_an_entry_of_any_toolchain_is_used(artifact, cache, tmp_path, monkeypatch):
    monkeypatch.setattr(env, "nvcc_path", lambda: None)
    assert build.build(TF32, TF32_SOURCES, cache).path == artifact.path
    with pytest.raises(build.BuildError, match="nvcc was not found"):
        build.build(TF32, TF32_SOURCES, tmp_path)


@pytest.mark.nvcc
def test_interrupted_build_leaves_no_entry(tmp_path, monkeypatch):
    def interrupted(config, sources, folder, nvcc, tick=None):
        (folder / "kernel.cubin").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(build, "_compile", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build.build(TF32, TF32_SOURCES, tmp_path)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".locks")] == []


@pytest.mark.nvcc
def test_folders_of_killed_builds_are_removed_by_the_next_build(tmp_path, monkeypatch):
    """A build killed before its clean-up (SIGKILL) leaves its temporary folder; the next build
    (of any kernel) removes every such folder whose kernel's lock is free, and leaves those of
    builds in progress (lock held) alone."""
    entry = f"{TF32.name}-{build._fingerprint(TF32, TF32_SOURCES, env.nvcc_version())[:16]}"
    stale, other = tmp_path / f".tmp-{entry}-0badc0de", tmp_path / f".tmp-{FP32.name}-0-0badc0de"
    busy = tmp_path / f".tmp-{FP32.name}-1-0badc0de"
    for folder in (stale, other, busy):
        folder.mkdir()
        (folder / build.CUBIN).write_bytes(b"partial")
    (tmp_path / ".locks").mkdir()
    holder = hold_lock(tmp_path / ".locks" / f"{FP32.name}-1.lock")
    try:
        monkeypatch.setattr(build, "_compile", compile_only_a_cubin)
        built = build.build(TF32, TF32_SOURCES, tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert built.path.name == entry and not stale.exists() and not other.exists()
    assert busy.exists()


@pytest.mark.nvcc
def test_failed_nvcc_raises_with_log(tmp_path, monkeypatch):
    template = emit.template
    monkeypatch.setattr(emit, "template", lambda name: "#error planted failure\n"
                        if name == "dgrad_kernel.cu" else template(name))
    with pytest.raises(build.BuildError, match="planted failure"):
        build.build(TF32, TF32_SOURCES, tmp_path)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".locks")] == []


@pytest.mark.nvcc
def test_serialized_wgmma_fails_the_build(tmp_path, monkeypatch):
    """ptxas's "wgmma.mma_async instructions are serialized" (C7514, C7518) is a failed build:
    such a kernel computes the right results far below its rate."""
    run_nvcc = build._run_nvcc

    def serializing(nvcc, commands, folder, tick):
        codes, log = run_nvcc(nvcc, commands, folder, tick)
        return codes, log + ("ptxas info    : (C7518) Potential Performance Loss: wgmma.mma_async "
                            "instructions are serialized due to program dependence\n")

    monkeypatch.setattr(build, "_run_nvcc", serializing)
    with pytest.raises(build.BuildError, match="instructions are serialized"):
        build.build(TF32, TF32_SOURCES, tmp_path)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".locks")] == []


@pytest.mark.nvcc
def test_a_cache_that_cannot_be_locked_raises_a_build_error(tmp_path, monkeypatch):
    """A read-only cache that lacks the kernel (its lock file cannot be created)."""
    def read_only(locks, name):
        raise OSError(30, "Read-only file system", str(locks / f"{name}.lock"))

    monkeypatch.setattr(build, "_open_lock", read_only)
    with pytest.raises(build.BuildError, match="Read-only file system.*writable folder"):
        build.build(TF32, TF32_SOURCES, tmp_path)


@pytest.mark.nvcc
def test_nvcc_without_outputs_leaves_no_entry(tmp_path, monkeypatch):
    """An 'nvcc' that exits 0 without writing its outputs is a failed build, not an entry."""
    fake = tmp_path / "nvcc"
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then exec {env.nvcc_path()} "
                    "--version; fi\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setattr(env, "nvcc_path", lambda: str(fake))
    cache = tmp_path / "cache"
    with pytest.raises(build.BuildError, match="did not write kernel.cubin"):
        build.build(TF32, TF32_SOURCES, cache)
    assert [p.name for p in cache.iterdir()] == [".locks"]


def test_manifests_without_a_cubin_are_not_entries(tmp_path):
    (tmp_path / build.CUBIN).write_bytes(b"\x7fELF")
    for files in ({}, 5, [build.CUBIN], {"other": "0"}):
        (tmp_path / build.MANIFEST).write_text(json.dumps({"files": files}))
        assert build.read_entry(tmp_path) is None, files


@pytest.mark.nvcc
def test_nvcc_that_does_not_run_and_unusable_caches_raise_build_errors(artifact, cache, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setattr(env, "nvcc_path", lambda: str(tmp_path / "missing" / "nvcc"))
    monkeypatch.setattr(env, "nvcc_version", env.nvcc_version.__wrapped__)
    with pytest.raises(build.BuildError, match="not in the cache .* does not run"):
        build.build(TF32, TF32_SOURCES, tmp_path / "cache")
    # a cached kernel still serves
    assert build.build(TF32, TF32_SOURCES, cache).path == artifact.path
    monkeypatch.undo()
    (tmp_path / "file").write_text("")
    with pytest.raises(build.BuildError, match="cannot create the folder .*file"):
        build.build(TF32, TF32_SOURCES, tmp_path / "file")


@pytest.mark.nvcc
def test_entries_follow_the_umask(artifact):
    """Entries are readable by whoever the umask lets read them (a cache built ahead by one
    user serves others), not only by their builder; never writable by group or others."""
    umask = os.umask(0)
    os.umask(umask)
    assert artifact.path.stat().st_mode & 0o777 == 0o755 & ~umask


@pytest.mark.nvcc
def test_damaged_entry_is_rebuilt(artifact, cache):
    artifact.cubin.write_bytes(b"damaged")
    rebuilt = build.build(TF32, TF32_SOURCES, cache)
    assert rebuilt.path == artifact.path
    assert rebuilt.cubin.read_bytes()[:4] == b"\x7fELF"


@pytest.mark.nvcc
def test_a_file_in_place_of_an_entry_is_replaced(tmp_path, monkeypatch):
    key = build._fingerprint(TF32, TF32_SOURCES, env.nvcc_version())
    entry = tmp_path / f"{TF32.name}-{key[:16]}"
    entry.write_text("not a cache entry")

    monkeypatch.setattr(build, "_compile", compile_only_a_cubin)
    assert build.build(TF32, TF32_SOURCES, tmp_path).path == entry
    assert (entry / build.CUBIN).is_file()


@pytest.mark.nvcc
def test_interrupted_build_kills_nvcc_and_leaves_no_entry(tmp_path, monkeypatch):
    """Ctrl-C (KeyboardInterrupt) during a build: nvcc and the program it runs are killed, the
    interrupt propagates, and the cache holds no entry and no temporary folder."""
    fake = str(sleeping_nvcc(tmp_path))
    monkeypatch.setattr(env, "nvcc_path", lambda: fake)
    cache = tmp_path / "cache"
    interrupter = threading.Thread(target=lambda: (wait_for_pids(tmp_path, 2),
                                                   _thread.interrupt_main()))
    # Python's own Ctrl-C handler, as in a foreground process: started as a background job of a
    # non-interactive shell, pytest inherits SIGINT ignored, and interrupt_main then does nothing
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupter.start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            # a dgrad kernel: cubin and host library, two nvcc
            build.build(TF32, TF32_SOURCES, cache)
        interrupter.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - start < 30
    assert all_gone(wait_for_pids(tmp_path, 2))
    assert [p.name for p in cache.iterdir()] == [".locks"]


@pytest.mark.nvcc
def test_a_compile_is_announced(tmp_path, monkeypatch, caplog):
    """A first build logs a WARNING naming the kernel and the cache folder, and shows nvcc's
    running seconds on stderr when asked (by default when stderr is a terminal)."""
    ticks = []

    def slow_compile(config, sources, folder, nvcc, tick):
        tick()
        ticks.append(1)
        return compile_only_a_cubin(config, sources, folder, nvcc)

    monkeypatch.setattr(build, "_compile", slow_compile)
    with caplog.at_level("WARNING", logger="cutlass_convt.build"):
        built = build.build(TF32, TF32_SOURCES, tmp_path, progress=True)
    (record,) = [r for r in caplog.records if "compiling kernel" in r.getMessage()]
    assert record.levelname == "WARNING" and TF32.name in record.getMessage()
    assert str(built.path) in record.getMessage() and ticks
    caplog.clear()
    build.build(TF32, TF32_SOURCES, tmp_path)  # a hit says nothing
    assert not caplog.records


def test_nvcc_is_found_through_cuda_pathfinder(monkeypatch):
    """Without CUTLASS_CONVT_NVCC, CUDA_HOME, CUDA_PATH or nvcc on PATH, cuda-python's
    pathfinder names the nvcc it finds."""
    pathfinder = pytest.importorskip("cuda.pathfinder")
    for variable in (env.NVCC_VARIABLE, "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(env.shutil, "which", lambda name: None)
    monkeypatch.setattr(pathfinder, "find_nvidia_binary_utility",
                        lambda name: f"/found/by/pathfinder/{name}")
    env.nvcc_path.cache_clear()
    try:
        assert env.nvcc_path() == "/found/by/pathfinder/nvcc"
    finally:
        env.nvcc_path.cache_clear()


@pytest.mark.gpu
@pytest.mark.nvcc
def test_a_warm_cache_runs_the_op_without_nvcc(tmp_path):
    """A process whose nvcc does not run (``CUTLASS_CONVT_NVCC`` names a missing file) runs
    the op on the kernel an earlier process built into the cache, through the C++ per-call
    path that process built there too: forced to its family (no fallback to PyTorch), within
    TF32's bound against float64."""
    code = textwrap.dedent("""\
        import sys, torch, cutlass_convt
        from cutlass_convt import env, ops
        x = torch.randn(2, 32, 12, 16, device="cuda")
        w = torch.randn(32, 32, 3, 3, device="cuda")
        y = cutlass_convt.conv_transpose2d(x, w, padding=1, backend="strip")
        ref = torch.nn.functional.conv_transpose2d(x.double(), w.double(), padding=1)
        rel = ((y.double() - ref).norm() / ref.norm()).item()
        print(env.working_nvcc()[0] is None, ops.NATIVE, rel)
        """)
    cache = tmp_path / "cache"
    variables = {**os.environ, env.CACHE_DIR_VARIABLE: str(cache), env.EXTENSION_VARIABLE: "auto"}
    subprocess.run([sys.executable, "-c", code], check=True, env=variables)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**variables, env.NVCC_VARIABLE: str(tmp_path / "missing" / "nvcc")})
    no_nvcc, native, rel = out.stdout.split()
    assert no_nvcc == "True" and native == "True" and float(rel) <= 1e-3, out.stdout

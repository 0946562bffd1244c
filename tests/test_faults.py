"""The kernel cache and the build under faults (CPU): hanging or silent nvcc, build and lock
deadlines, misplaced and incomplete entries, a full disk, killed builders, odd manifests."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cutlass_convt import build, env

from helpers import (
    FP32,
    TF32,
    TF32_SOURCES,
    all_gone,
    compile_only_a_cubin,
    hold_lock,
    sleeping_nvcc,
    wait_for_pids,
)


def fake_nvcc(folder: Path, body: str) -> Path:
    """An executable 'nvcc' in ``folder`` running the shell ``body``."""
    fake = folder / "nvcc"
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(0o755)
    return fake


@pytest.fixture
def use_nvcc(monkeypatch):
    """Point the package at an nvcc path (env caches cleared before and after)."""
    def forget():
        for cached in (env.nvcc_path, env.nvcc_version, env.nvcc_archs):
            cached.cache_clear()
        env._NOT_RUNNING.clear()

    def use(path):
        monkeypatch.setenv(env.NVCC_VARIABLE, str(path))
        forget()
    yield use
    monkeypatch.undo()
    forget()


def test_a_hanging_nvcc_query_times_out_and_counts_as_not_running(tmp_path, monkeypatch,
                                                                   use_nvcc):
    monkeypatch.setattr(env, "QUERY_TIMEOUT_S", 0.5)
    use_nvcc(fake_nvcc(tmp_path, "sleep 60"))
    start = time.monotonic()
    version, why = env.working_nvcc()
    assert version is None and "does not run" in why and "timed out" in why
    assert env.working_nvcc() == (None, why)  # asked once per process
    assert env.nvcc_archs() is None
    assert time.monotonic() - start < 5


@pytest.mark.nvcc
def test_a_warm_cache_serves_without_running_nvcc(tmp_path, monkeypatch):
    """An entry built by the nvcc found now serves without any nvcc subprocess; with a hanging
    nvcc in its place, after one query timeout, as an entry of another toolchain."""
    monkeypatch.setattr(build, "_compile", compile_only_a_cubin)
    built = build.build(TF32, TF32_SOURCES, tmp_path)

    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"ran {args[0]}")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    assert build.build(TF32, TF32_SOURCES, tmp_path).path == built.path
    monkeypatch.undo()


@pytest.mark.nvcc
def test_a_hanging_nvcc_still_serves_a_cached_kernel(tmp_path, monkeypatch, use_nvcc):
    monkeypatch.setattr(build, "_compile", compile_only_a_cubin)
    built = build.build(TF32, TF32_SOURCES, tmp_path / "cache")
    monkeypatch.setattr(env, "QUERY_TIMEOUT_S", 0.5)
    use_nvcc(fake_nvcc(tmp_path, "sleep 60"))
    start = time.monotonic()
    assert build.build(TF32, TF32_SOURCES, tmp_path / "cache").path == built.path
    assert time.monotonic() - start < 5


@pytest.mark.nvcc
def test_the_build_deadline_kills_the_compilers(tmp_path, monkeypatch, use_nvcc):
    folder = tmp_path / "nvcc"
    folder.mkdir()
    use_nvcc(sleeping_nvcc(folder))
    monkeypatch.setenv(env.BUILD_TIMEOUT_VARIABLE, "2")
    with pytest.raises(build.BuildError, match="deadline of 2 s"):
        build.build(TF32, TF32_SOURCES, tmp_path / "cache", progress=False)
    assert all_gone(wait_for_pids(folder, 2))  # nvcc and its 'cicc'
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".locks"]


@pytest.mark.nvcc
def test_a_stuck_builder_s_lock_ends_in_a_clear_error(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    key = build._fingerprint(TF32, TF32_SOURCES, env.nvcc_version())
    locks = cache / ".locks"
    locks.mkdir(parents=True)
    name = f"{TF32.name}-{key[:16]}"
    (locks / f"{name}.owner").write_text("process 4242 on elsewhere (someone)\n")
    holder = hold_lock(locks / f"{name}.lock")
    try:
        monkeypatch.setattr(build, "_compile", compile_only_a_cubin)
        monkeypatch.setenv(env.BUILD_TIMEOUT_VARIABLE, "1")
        with pytest.raises(build.BuildError, match="gave up waiting .* process 4242"):
            build.build(TF32, TF32_SOURCES, cache)
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.nvcc
def test_another_kernel_s_folder_under_this_name_is_not_served(tmp_path, monkeypatch,
                                                              use_nvcc):
    """A copied, synced or renamed folder that holds another kernel is not a hit: rebuilt with
    nvcc, refused (naming the kernel) without."""
    monkeypatch.setattr(build, "_compile", compile_only_a_cubin)
    cache = tmp_path / "cache"
    other = build.build(FP32, build_sources(FP32), cache)
    key = build._fingerprint(TF32, TF32_SOURCES, env.nvcc_version())
    misplaced = cache / f"{TF32.name}-{key[:16]}"
    shutil.copytree(other.path, misplaced)
    rebuilt = build.build(TF32, TF32_SOURCES, cache)
    assert rebuilt.compiled and rebuilt.manifest["kernel"] == TF32.name
    shutil.rmtree(misplaced)
    shutil.copytree(other.path, misplaced)
    use_nvcc(tmp_path / "missing-nvcc")
    with pytest.raises(build.BuildError, match=f"{TF32.name} is not in the cache"):
        build.build(TF32, TF32_SOURCES, cache)


def build_sources(config):
    from cutlass_convt import choose

    return choose.family_of(config).sources(config)


@pytest.mark.nvcc
def test_entries_missing_or_with_empty_outputs_are_damaged(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "_compile", compile_only_a_cubin)
    built = build.build(TF32, TF32_SOURCES, tmp_path)
    manifest = json.loads((built.path / build.MANIFEST).read_text())
    del manifest["files"][build.HOST_LIB]  # the manifest omits the host library
    (built.path / build.MANIFEST).write_text(json.dumps(manifest))
    assert build.read_entry(built.path) is None
    assert build.build(TF32, TF32_SOURCES, tmp_path).compiled
    (built.path / build.CUBIN).write_bytes(b"")
    assert build.read_entry(built.path) is None


@pytest.mark.nvcc
def test_nvcc_that_writes_empty_outputs_fails_the_build(tmp_path, use_nvcc):
    real = env.nvcc_path()
    use_nvcc(fake_nvcc(tmp_path, f'if [ "$1" = --version ]; then exec {real} --version; fi\n'
                                 'for a in "$@"; do [ "$prev" = -o ] && : > "$a"; '
                                 'prev="$a"; done\nexit 0'))
    with pytest.raises(build.BuildError, match="did not write kernel.cubin.*not an ELF"):
        build.build(TF32, TF32_SOURCES, tmp_path / "cache", progress=False)


@pytest.mark.nvcc
def test_a_full_disk_is_a_build_error_naming_the_folder(tmp_path, monkeypatch):
    real = Path.write_text

    def full(self, *args, **kwargs):
        if self.parent.name.startswith(".tmp-"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(build.BuildError, match=r"cannot write the sources into .*\.tmp-.*"
                                               r"No space left on device \(ENOSPC\)"):
        build.build(TF32, TF32_SOURCES, tmp_path, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".locks"]


@pytest.mark.nvcc
def test_a_damaged_entry_that_cannot_be_removed_is_a_build_error(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "_compile", compile_only_a_cubin)
    built = build.build(TF32, TF32_SOURCES, tmp_path)
    (built.path / build.CUBIN).write_bytes(b"\x7fELF garbled")

    removing = shutil.rmtree

    def denied(path, *args, ignore_errors=False, **kwargs):  # another user's entry
        if Path(path) == built.path:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return removing(path, *args, ignore_errors=ignore_errors, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", denied)
    with pytest.raises(build.BuildError, match="cannot replace the damaged entry .*owned by"):
        build.build(TF32, TF32_SOURCES, tmp_path)


@pytest.mark.nvcc
def test_malformed_manifest_dates_do_not_break_the_lookup(tmp_path, monkeypatch, use_nvcc):
    monkeypatch.setattr(build, "_compile", compile_only_a_cubin)
    built = build.build(TF32, TF32_SOURCES, tmp_path / "cache")
    for value in ("yesterday", None, [1]):
        manifest = json.loads((built.path / build.MANIFEST).read_text())
        manifest["built_at"] = value
        (built.path / build.MANIFEST).write_text(json.dumps(manifest))
        use_nvcc(tmp_path / "missing-nvcc")
        assert build.build(TF32, TF32_SOURCES, tmp_path / "cache").path == built.path


@pytest.mark.nvcc
def test_a_killed_builder_leaves_no_compiler_behind(tmp_path):
    """SIGKILL of the building process: its nvcc dies with it (parent-death signal); what nvcc
    started (cicc, ptxas; here a 'sleep') is killed, and the folder removed, by the next
    build."""
    folder = tmp_path / "nvcc"
    folder.mkdir()
    fake = sleeping_nvcc(folder)
    cache = tmp_path / "cache"
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        os.environ[{env.NVCC_VARIABLE!r}] = {str(fake)!r}
        from cutlass_convt import build
        from helpers import TF32, TF32_SOURCES
        build.build(TF32, TF32_SOURCES, {str(cache)!r}, progress=False)
    """)
    builder = subprocess.Popen([sys.executable, "-c", script])
    for _ in range(600):  # the builder imports torch first
        if len(list(folder.glob("pid.*"))) == 2:
            break
        time.sleep(0.1)
    pids = wait_for_pids(folder, 2)  # the cubin's and the host library's nvcc, each a child
    nvccs, children = pids[0::2], pids[1::2]
    builder.send_signal(signal.SIGKILL)
    builder.wait()
    assert all_gone(nvccs)
    assert list(cache.glob(".tmp-*"))  # left behind, with the 'cicc'
    original = build._compile
    build._compile = compile_only_a_cubin
    try:
        build.build(FP32, build_sources(FP32), cache)
    finally:
        build._compile = original
    assert all_gone(children) and not list(cache.glob(".tmp-*"))


@pytest.mark.nvcc
def test_what_the_cache_writes_is_writable_by_its_owner_alone(tmp_path, monkeypatch):
    """In a private cache (0700), the lock folder is private too and lock files are 0600; the
    entry's folder and files are writable by no one else even under umask 0."""
    monkeypatch.setattr(build, "_compile", compile_only_a_cubin)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    old = os.umask(0)
    try:
        built = build.build(TF32, TF32_SOURCES, cache)
    finally:
        os.umask(old)
    assert (cache / ".locks").stat().st_mode & 0o7777 == 0o700
    assert (cache / ".locks" / f"{built.path.name}.lock").stat().st_mode & 0o777 == 0o600
    assert built.path.stat().st_mode & 0o777 == 0o755
    assert {p.stat().st_mode & 0o777 for p in built.path.iterdir()} == {0o644}

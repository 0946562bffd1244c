"""Emission, nvcc and the cache (CPU only: nvcc runs here, nothing is launched)."""

from __future__ import annotations

import dataclasses
import json
import os
import _thread
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import cutlass_convt
from cutlass_convt import build, emit, env, problems
from cutlass_convt.families import dgrad, layout
from cutlass_convt.families import dgrad as dgrad_family
from cutlass_convt.families import direct as direct_family
from cutlass_convt.families import strip as strip_family

CASE = problems.find("kernelbench-71")
TF32 = dgrad_family.default_dgrad_config(CASE.spec("tf32", 90))
FP32 = dgrad_family.default_dgrad_config(CASE.spec("fp32", 90))
TF32_SOURCES = dgrad.FAMILY.sources(TF32)


def _build(config, cache):
    """``config``'s build (a configuration of any family) into ``cache``."""
    from cutlass_convt import choose

    return build.build(config, choose.family_of(config).sources(config), cache)


def test_emitted_source_names_the_dgrad_kernel():
    header = dgrad.operation_h(TF32)
    for expected in ("cutlass::conv::kernel::DefaultConv2dDgrad<",
                     "cutlass::gemm::GemmShape<128, 32, 32>", "cutlass::gemm::GemmShape<32, 32, 32 >",
                     "cutlass::gemm::GemmShape<16, 8, 8>", "cutlass::arch::OpMultiplyAdd,",
                     "cutlass::conv::IteratorAlgorithm::kOptimized",
                     "cutlass::conv::StrideSupport::kUnity", "cutlass::arch::Sm80",
                     "using ConvtKernel = cutlass_tensorop_s1688dgrad_optimized_128x32_32x3_nhwc_unity_stride_align4_base;"):
        assert expected in header, expected
    fp32 = dgrad.operation_h(FP32)
    assert "cutlass::arch::OpMultiplyAddFastF32" in fp32 and "GemmShape<256, 32, 16>" in fp32
    assert TF32_SOURCES.templates == ("dgrad_kernel.cu", "dgrad_host.cu")
    assert TF32_SOURCES.header == "operation.h"
    kernel = emit.template("dgrad_kernel.cu")
    assert 'extern "C" __global__' in kernel and dgrad_family.DGRAD_SYMBOL in kernel


def _compile_only_a_cubin(config, sources, folder, nvcc):
    """A stand-in for build._compile that writes a minimal cubin at once."""
    (folder / build.CUBIN).write_bytes(b"\x7fELF")
    return ""


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def artifact(cache) -> build.Artifact:
    return build.build(TF32, TF32_SOURCES, cache)


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
def test_host_library_plans_problem71_and_rejects_misaligned(artifact):
    kernel = dgrad_family.DgradKernel(artifact)  # host library only: no GPU needed
    assert kernel.threads == 128 and kernel.shared_bytes > 48 * 1024
    (launch_71,) = dgrad_family.dgrad_launches(CASE.spec("tf32", 90))
    plan = kernel.plan(launch_71, has_bias=False)
    assert plan.grid == (-(-8 * 514 * 1026 // 128), 1, 1)
    assert len(plan.params) == kernel.params_bytes and len(set(plan.offsets)) == 4
    misaligned = dataclasses.replace(
        launch_71, problem=dataclasses.replace(launch_71.problem, C=30))
    with pytest.raises(cutlass_convt.UnsupportedProblem, match="kErrorInvalidProblem|kErrorMisalignedOperand"):
        kernel.plan(misaligned, has_bias=False)


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
    """A fresh process whose 'nvcc' records any compile call finds the entry and compiles nothing."""
    calls = tmp_path / "nvcc-calls"
    fake = tmp_path / "nvcc"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "--version" ]; then exec {env.nvcc_path()} --version; fi
        echo "$@" >> {calls}
        exit 1
        """))
    fake.chmod(0o755)
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
    assert build._fingerprint(FP32, dgrad.FAMILY.sources(FP32), "13.0.88") != key
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
    def interrupted(config, sources, folder, nvcc):
        (folder / "kernel.cubin").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(build, "_compile", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build.build(TF32, TF32_SOURCES, tmp_path)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".locks")] == []


@pytest.mark.nvcc
def test_folders_of_killed_builds_are_removed_by_the_next_build(tmp_path, monkeypatch):
    """A build killed before its clean-up (SIGKILL) leaves its temporary folder; the next build
    of the same kernel, holding the kernel's lock, removes it, and leaves other kernels' alone."""
    entry = f"{TF32.name}-{build._fingerprint(TF32, TF32_SOURCES, env.nvcc_version())[:16]}"
    stale, other = tmp_path / f".tmp-{entry}-0badc0de", tmp_path / f".tmp-{FP32.name}-0-0badc0de"
    for folder in (stale, other):
        folder.mkdir()
        (folder / build.CUBIN).write_bytes(b"partial")

    monkeypatch.setattr(build, "_compile", _compile_only_a_cubin)
    built = build.build(TF32, TF32_SOURCES, tmp_path)
    assert built.path.name == entry and not stale.exists() and other.exists()


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

    def serializing(nvcc, commands, folder):
        codes, log = run_nvcc(nvcc, commands, folder)
        return codes, log + ("ptxas info    : (C7518) Potential Performance Loss: wgmma.mma_async "
                            "instructions are serialized due to program dependence\n")

    monkeypatch.setattr(build, "_run_nvcc", serializing)
    with pytest.raises(build.BuildError, match="instructions are serialized"):
        build.build(TF32, TF32_SOURCES, tmp_path)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".locks")] == []


@pytest.mark.nvcc
def test_a_cache_that_cannot_be_locked_raises_a_build_error(tmp_path, monkeypatch):
    """A read-only cache that lacks the kernel (its lock file cannot be created)."""
    def read_only(self, *args, **kwargs):
        raise OSError(30, "Read-only file system", self.lock_file)

    monkeypatch.setattr(build.FileLock, "acquire", read_only)
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
        assert build._read_valid(tmp_path) is None, files


@pytest.mark.nvcc
def test_nvcc_that_does_not_run_and_unusable_caches_raise_build_errors(artifact, cache, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setattr(env, "nvcc_path", lambda: str(tmp_path / "missing" / "nvcc"))
    monkeypatch.setattr(env, "nvcc_version", env.nvcc_version.__wrapped__)
    with pytest.raises(build.BuildError, match="not in the cache .* does not run"):
        build.build(TF32, TF32_SOURCES, tmp_path / "cache")
    assert build.build(TF32, TF32_SOURCES, cache).path == artifact.path  # a cached kernel still serves
    monkeypatch.undo()
    (tmp_path / "file").write_text("")
    with pytest.raises(build.BuildError, match="cannot create the kernel cache"):
        build.build(TF32, TF32_SOURCES, tmp_path / "file")


@pytest.mark.nvcc
def test_entries_follow_the_umask(artifact):
    """Entries are readable by whoever the umask lets read them (a cache built ahead by one
    user serves others), not only by their builder."""
    umask = os.umask(0)
    os.umask(umask)
    assert artifact.path.stat().st_mode & 0o777 == 0o777 & ~umask


@pytest.mark.nvcc
def test_damaged_entry_is_rebuilt(artifact, cache):
    artifact.cubin.write_bytes(b"damaged")
    rebuilt = build.build(TF32, TF32_SOURCES, cache)
    assert rebuilt.path == artifact.path
    assert rebuilt.cubin.read_bytes()[:4] == b"\x7fELF"


@pytest.mark.nvcc
def test_a_file_in_place_of_an_entry_is_replaced(tmp_path, monkeypatch):
    entry = tmp_path / f"{TF32.name}-{build._fingerprint(TF32, TF32_SOURCES, env.nvcc_version())[:16]}"
    entry.write_text("not a cache entry")

    monkeypatch.setattr(build, "_compile", _compile_only_a_cubin)
    assert build.build(TF32, TF32_SOURCES, tmp_path).path == entry and (entry / build.CUBIN).is_file()


@pytest.mark.nvcc
def test_layout_passes_build(tmp_path, monkeypatch):
    """The layout kernels build, here into a cache folder given as a relative path (as
    CUTLASS_CONVT_CACHE_DIR may be), with nothing but the entry's files in it."""
    monkeypatch.chdir(tmp_path)
    config = layout.LayoutConfig(90)
    artifact = build.build(config, layout.LAYOUT.sources(config), Path("cache"))
    cubin = artifact.cubin.read_bytes()
    for symbol in (layout.NCHW_TO_NHWC_SYMBOL, layout.NHWC_TO_NCHW_SYMBOL):
        assert symbol.encode() in cubin
    assert not (artifact.path / build.HOST_LIB).exists()
    assert set(artifact.manifest["files"]) == {build.CUBIN, "layout.cu"}


@pytest.mark.nvcc
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_strip_rs_form_builds_without_spills(tmp_path, precision, channels_last):
    """The strip family's rs form (strip_rs.cu, with strip_common.cuh) builds for sm_90a in
    both precisions and layouts (fp32 NCHW splitting all strips' units, the others each
    strip's), its entry holding the templates it includes, without spills (ptxas -v)."""
    split_all = precision == "fp32" and not channels_last
    config = strip_family.StripConfig((3, 3), channels_last, 128, 6, 1, 0, 90, precision, "rs", split_all)
    artifact = _build(config, tmp_path)
    assert strip_family.STRIP_SYMBOL.encode() in artifact.cubin.read_bytes()
    assert {"strip_rs.cu", "strip_common.cuh", "common.cuh", "config.h"} <= set(
        artifact.manifest["files"])
    ptxas = " ".join(artifact.manifest["ptxas"])
    assert "Used " in ptxas and " 0 bytes spill stores" in ptxas, ptxas


@pytest.mark.nvcc
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("s", [1, 3])
def test_strip_default_builds_without_spills(tmp_path, channels_last, s):
    """The strip family's first configuration for problem 71 and for S = 1 (strip.cu, A
    fragments in registers for the first 16 (NCHW: 18) of 48 steps, and for all 16) builds for
    sm_90a without spills (ptxas -v), in both layouts, with the 168 registers a thread at
    launch that its setmaxnreg counts (88 + 2 x 208) take as the CTA's pool: with fewer, the
    consumers' setmaxnreg.inc would wait forever."""
    spec = dataclasses.replace(problems.find("kernelbench-71").spec("tf32", 90),
                               channels_last=channels_last, kernel_size=(3, s))
    config = strip_family.strip_configs(spec)[0]
    assert config.register_a == min(16 if channels_last else 18, 16 * s)
    assert config.threads == 384
    artifact = _build(config, tmp_path)
    ptxas = " ".join(artifact.manifest["ptxas"])
    assert "Used 168 registers" in ptxas and " 0 bytes spill stores" in ptxas, ptxas


@pytest.mark.nvcc
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_direct_family_blocks_build_without_spills(tmp_path, channels_last):
    """A direct-family kernel with output-channel blocks (blocks of 8 of 32 channels, wgmma)
    builds for sm_90a without spills: direct.cu's static_assert holds its shared-memory layout
    (filter block, staged NCHW rows of the block) to ``direct_family.DirectConfig.shared_bytes``."""
    spec = dataclasses.replace(CASE.spec("tf32", 90), kernel_size=(4, 4),
                               channels_last=channels_last)
    config = next(c for c in direct_family.direct_configs(spec) if c.out_block == 8 and c.math == "wgmma")
    artifact = _build(config, tmp_path)
    assert direct_family.DIRECT_SYMBOL.encode() in artifact.cubin.read_bytes()
    ptxas = " ".join(artifact.manifest["ptxas"])
    assert "Used " in ptxas and " 0 bytes spill stores" in ptxas, ptxas


def test_generate_checks_shape_arguments_before_building():
    """``generate.py --shape`` refuses what ``conv_transpose2d`` refuses, and the script refuses
    options that do not fit the problem's form and SM numbers it cannot target, with a usage
    error (exit status 2) and no build; so does ``python -m cutlass_convt`` without its
    subcommand."""
    root = Path(__file__).parents[1]
    script, shape = root / "scripts" / "generate.py", ["--shape", "1", "8", "8", "10", "12", "3", "3"]
    path = os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))
    for args, message in (
            (shape + ["--stride", "2", "--output-padding", "2"],
             "output_padding must be smaller than either stride or dilation"),
            (shape + ["--dilation", "0"], "stride and dilation must be positive"),
            (shape + ["--groups", "3"], "in_channels (8) must be divisible by groups (3)"),
            (shape + ["--padding", "7"], "too small"),
            (["--shape", "1", "-8", "8", "10", "12", "3", "3"], "must be positive"),
            (["--shape", "1", "8", "8", "-10", "12", "3", "3"], "must be positive"),
            (["--problem", "71", "--stride", "2"], "--stride applies to --shape only"),
            (["--problem", "71", "--bias"], "--bias applies to --shape only"),
            (["--problem", "71", "--arch", "0"], "an SM number from 80 to 199"),
            (["--problem", "71", "--arch", "abc"], "(90 for an H100/H200), got abc")):
        out = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                             text=True, env={**os.environ, "PYTHONPATH": path})
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
    for args, message in (([], "a command is required"), (["benchmark"], "unknown command")):
        out = subprocess.run([sys.executable, "-m", "cutlass_convt", *args], capture_output=True,
                             text=True, env={**os.environ, "PYTHONPATH": path})
        assert out.returncode == 2 and "usage: python -m cutlass_convt bench" in out.stderr, args
        assert f"error: {message}" in out.stderr, (args, out.stderr)


@pytest.mark.nvcc
def test_generate_refuses_sm_numbers_that_nvcc_does_not_compile_for():
    root = Path(__file__).parents[1]
    path = os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))
    assert 90 in env.nvcc_archs() and 81 not in env.nvcc_archs()
    out = subprocess.run([sys.executable, str(root / "scripts" / "generate.py"), "--problem", "71",
                          "--arch", "81"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": path})
    assert out.returncode == 2 and "does not compile for sm_81; it takes 80," in out.stderr, out.stderr


def _sleeping_nvcc(folder: Path) -> Path:
    """An 'nvcc' that answers --version as the real one and otherwise, like nvcc running cicc,
    starts a child that sleeps for a minute and waits for it (a build to interrupt); it
    records its pid and its child's in ``folder``."""
    fake = folder / "nvcc"
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then exec {env.nvcc_path()} "
                    f"--version; fi\nsleep 60 &\necho $$ $! > {folder}/pid.$$\nwait\n")
    fake.chmod(0o755)
    return fake


def _wait_for_pids(folder: Path, count: int) -> list[int]:
    """The pids of ``count`` fake nvcc processes and of their children, once all have started."""
    for _ in range(300):
        pids = [p.read_text().split() for p in folder.glob("pid.*")]
        if len(pids) == count and all(len(pair) == 2 for pair in pids):
            return [int(pid) for pair in pids for pid in pair]
        time.sleep(0.05)
    raise AssertionError(f"{count} nvcc processes did not start")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie is dead
    except (FileNotFoundError, ProcessLookupError):
        return False


def _all_gone(pids: list[int], seconds: float = 5.0) -> bool:
    """Whether every process in ``pids`` has ended within ``seconds`` (a SIGKILL is delivered
    asynchronously: the sender goes on before the process is gone)."""
    deadline = time.monotonic() + seconds
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.nvcc
def test_interrupted_build_kills_nvcc_and_leaves_no_entry(tmp_path, monkeypatch):
    """Ctrl-C (KeyboardInterrupt) during a build: nvcc and the program it runs are killed, the
    interrupt propagates, and the cache holds no entry and no temporary folder."""
    fake = str(_sleeping_nvcc(tmp_path))
    monkeypatch.setattr(env, "nvcc_path", lambda: fake)
    cache = tmp_path / "cache"
    interrupter = threading.Thread(target=lambda: (_wait_for_pids(tmp_path, 2),
                                                   _thread.interrupt_main()))
    # Python's own Ctrl-C handler, as in a foreground process: started as a background job of a
    # non-interactive shell, pytest inherits SIGINT ignored, and interrupt_main then does nothing
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupter.start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            build.build(TF32, TF32_SOURCES, cache)  # a dgrad kernel: cubin and host library, two nvcc
        interrupter.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - start < 30
    assert _all_gone(_wait_for_pids(tmp_path, 2))
    assert [p.name for p in cache.iterdir()] == [".locks"]


@pytest.mark.nvcc
def test_generate_killed_by_sigterm_kills_nvcc(tmp_path):
    """SIGTERM to generate.py (to its pid only): exit status 143, its nvcc processes and the
    programs they run killed, nothing left in the cache but the lock folder."""
    root = Path(__file__).parents[1]
    path = os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))
    cache = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, str(root / "scripts" / "generate.py"), "--problem",
                             "71", "--precision", "tf32", "--layout", "nchw"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": path, env.CACHE_DIR_VARIABLE: str(cache),
                                 env.NVCC_VARIABLE: str(_sleeping_nvcc(tmp_path))})
    pids = _wait_for_pids(tmp_path, 1)
    proc.terminate()
    assert proc.wait(timeout=30) == 143, proc.stderr.read()
    assert _all_gone(pids)
    assert [p.name for p in cache.iterdir()] == [".locks"]


def test_scripts_refuse_unknown_problems():
    """``generate.py``, ``run_kernelbench.py`` and ``bench.py`` name the known ids for an unknown
    ``--problem``, with a usage error (exit status 2, the script named in it) before any build
    or GPU check."""
    root = Path(__file__).parents[1]
    path = os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))
    for script, names in (("generate.py", ["99"]), ("run_kernelbench.py", ["99"]),
                          ("bench.py", ["71", "99"])):
        out = subprocess.run([sys.executable, str(root / "scripts" / script), "--problem", *names],
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path})
        assert out.returncode == 2, (script, out.stderr)
        assert "unknown problem '99'; known: kernelbench-l1-57" in out.stderr, (script, out.stderr)
        assert f"{script}: error:" in out.stderr, (script, out.stderr)
    # trial counts below 1 and a --json path without its folder: usage errors before the run
    for script, args, message in (
            ("bench.py", ["--trials", "0"], "trials must be a positive int, got '0'"),
            ("run_kernelbench.py", ["--trials", "-5"], "trials must be a positive int"),
            ("run_kernelbench.py", ["--json", str(root / "no-such-folder" / "x.json")],
             "--json: no folder")):
        out = subprocess.run([sys.executable, str(root / "scripts" / script), *args],
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path})
        assert out.returncode == 2 and message in out.stderr, (script, args, out.stderr)


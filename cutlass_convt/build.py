"""Build and cache: kernel configuration -> cubin + host library under the cache folder.

One folder per kernel, ``<cache>/<config.name>-<key>/``, holding the emitted sources, the
``kernel.cubin``, the host library ``libhost.so``, nvcc's ``build.log`` and ``manifest.json``.
The key hashes everything that changes the binary: the configuration, the CUTLASS version,
nvcc's version, the flags and our own C++ and emitter sources. Entries are built in a
temporary folder and renamed into place with the manifest written last, under a per-entry file
lock, so an interrupted build leaves nothing that looks valid, and two processes never build
the same kernel twice. An entry whose files do not match their manifest hashes is rebuilt.
A hit needs neither nvcc nor ``cutlass_library``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from filelock import FileLock

from . import emit, env

_LOG = logging.getLogger(__name__)

CUBIN = "kernel.cubin"
HOST_LIB = "libhost.so"
MANIFEST = "manifest.json"
_COMMON_FLAGS = ("-std=c++17", "-DNDEBUG", "--expt-relaxed-constexpr")
# ptxas serializing a kernel's wgmmas (C7510; or C7514 and C7518, "Potential Performance Loss:
# wgmma.mma_async instructions are serialized due to ...") means a kernel right but far below its
# rate: a failed build.
_FATAL_WARNINGS = ("C7510", "wgmma.mma_async instructions are serialized")


class BuildError(RuntimeError):
    """nvcc failed, or no cached kernel exists and nvcc cannot be found."""


@dataclass(frozen=True)
class Artifact:
    """A built kernel: its cache folder and manifest (``manifest["files"]`` maps file -> sha256);
    ``compiled``: this call of :func:`build` ran nvcc for it (not a cache hit, nor a build by
    another process that this call waited for)."""

    path: Path
    manifest: dict
    compiled: bool = False

    @property
    def cubin(self) -> Path:
        return self.path / CUBIN

    @property
    def host_lib(self) -> Path:
        return self.path / HOST_LIB


@dataclass(frozen=True)
class Sources:
    """What one build compiles, as a kernel family describes it for one configuration.

    - ``device``: the template compiled into ``kernel.cubin``, ``symbols`` the entry points
      the launcher looks up there (a build whose cubin lacks one fails); ``includes``: the
      templates it includes; ``host``: the templates compiled into ``libhost.so`` (none: no
      host library).
    - ``header``: the file name of the header the family emits (``config.h``, ``operation.h``),
      ``emit()`` its text (called only when compiling: a cache lookup needs no emitter), and
      ``emitters`` the Python functions whose source text the cache key hashes in its place.
    - ``arch``: the SM the cubin is for, ``"90a"`` where it uses sm_90a's instructions (wgmma,
      setmaxnreg); ``cutlass``: whether the device code needs the CUTLASS include folders.
    - ``host_flags`` / ``host_libs``: further nvcc flags and libraries of the host library.
    """

    device: str
    symbols: tuple[str, ...] = ()
    includes: tuple[str, ...] = ()
    host: tuple[str, ...] = ()
    header: str | None = None
    emit: Callable[[], str] | None = None
    emitters: tuple[Callable, ...] = ()
    arch: str = "90"
    cutlass: bool = True
    host_flags: tuple[str, ...] = ()
    host_libs: tuple[str, ...] = ()

    @property
    def templates(self) -> tuple[str, ...]:
        """Every template file of the build: the device code, its includes, the host code."""
        return (self.device, *self.includes, *self.host)


def gencode(arch: str) -> str:
    """nvcc's ``-gencode`` flag for SM ``arch`` (``"90"``, ``"90a"``, ``"80"``)."""
    return f"-gencode=arch=compute_{arch},code=sm_{arch}"


def nvcc_commands(sources: Sources, include_dirs) -> dict[str, list[str]]:
    """nvcc arguments (without the nvcc path) by output file, run in the entry's folder: the
    cubin and, where ``sources`` has host code, the host library."""
    includes = [f"-I{d}" for d in include_dirs]
    commands = {CUBIN: [*_COMMON_FLAGS, "-O3", gencode(sources.arch), "-Xptxas=-v",
                        *(includes if sources.cutlass else ()),
                        "-cubin", "-o", CUBIN, sources.device]}
    if sources.host:
        commands[HOST_LIB] = [*_COMMON_FLAGS, "-O2", *sources.host_flags, *includes, "-shared",
                              "-Xcompiler=-fPIC", "-o", HOST_LIB, *sources.host,
                              *sources.host_libs]
    return commands


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fingerprint(config, sources: Sources, nvcc_version: str | None) -> str:
    """Hash of everything that changes the binary (include folders are named by version)."""
    ours = "".join(emit.template(name) for name in sources.templates)
    ours += "".join(inspect.getsource(f) for f in sources.emitters)
    payload = {
        "kind": type(config).__name__,
        "config": dataclasses.asdict(config),
        "cutlass": env.cutlass_version(),
        "nvcc": nvcc_version,
        "flags": nvcc_commands(sources, ["<cutlass>/include", "<cutlass>/tools/util/include"]),
        "sources": _sha256(ours.encode()),
    }
    return _sha256(json.dumps(payload, sort_keys=True).encode())


def _read_valid(path: Path) -> Artifact | None:
    """The entry at ``path`` if its manifest exists, lists the cubin, and every listed file
    matches its hash."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
        if CUBIN not in files:
            return None
        for name, digest in files.items():
            if _sha256((path / name).read_bytes()) != digest:
                return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return Artifact(path, manifest)


def _find_any_toolchain(root: Path, config, sources: Sources) -> Artifact | None:
    """Without nvcc: the newest valid entry of this configuration, whichever nvcc built it."""
    config_key = _fingerprint(config, sources, None)
    found = [a for p in root.glob(f"{config.name}-*") if (a := _read_valid(p)) is not None
             and a.manifest.get("config_key") == config_key]
    return max(found, key=lambda a: a.manifest["built_at"], default=None)


def _wait(proc: subprocess.Popen, tick: Callable[[], None]) -> int:
    """``proc``'s exit status. Waits in short polls (``Popen.wait`` with a timeout sleeps at
    most 50 ms between them), so a signal that reaches another thread of this process is
    still handled here within that time (a plain ``wait`` blocks in one system call); calls
    ``tick`` once a second meanwhile."""
    while True:
        try:
            return proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            tick()


@contextlib.contextmanager
def _progress(name: str, show: bool):
    """A line on stderr with the seconds nvcc has run for kernel ``name``, while the block
    runs, when ``show``; yields the function that refreshes it."""
    if not show:
        yield lambda: None
        return
    from tqdm import tqdm

    bar = tqdm(total=None, desc=f"cutlass_convt: nvcc {name}", bar_format="{desc}: {elapsed}",
               leave=False, file=sys.stderr)
    try:
        yield bar.refresh
    finally:
        bar.close()


def _run_nvcc(nvcc: str, commands: dict[str, list[str]], folder: Path,
              tick: Callable[[], None] = lambda: None) -> tuple[dict, str]:
    """Run the nvcc ``commands`` (output file -> arguments) at once in ``folder``; returns
    their exit statuses by output (negative: killed by that signal) and their log. Each writes
    to a file of its own there (no pipe to drain), removed after reading. This thread waits
    for them, so a KeyboardInterrupt (Ctrl-C) or a signal handler's SystemExit ends the wait;
    each nvcc runs in a process group of its own, which is then killed with the programs it
    started (cicc, ptxas: killing nvcc alone leaves them running) before the exception
    propagates."""
    procs = {}
    try:
        for output, args in commands.items():
            with open(folder / f"{output}.nvcc", "wb") as out:
                # TMPDIR: the intermediate files of a killed nvcc go with the folder
                procs[output] = subprocess.Popen([nvcc, *args], cwd=folder, stdout=out,
                                                 stderr=subprocess.STDOUT,
                                                 start_new_session=True,
                                                 env={**os.environ,
                                                      "TMPDIR": str(folder.resolve())})
        codes = {output: _wait(proc, tick) for output, proc in procs.items()}
    except BaseException:
        for proc in procs.values():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # the group has ended
                pass
            proc.wait()
        raise
    log = []
    for output, args in commands.items():
        text = folder / f"{output}.nvcc"
        log.append(f"$ nvcc {' '.join(args)}\n{text.read_text(errors='replace')}")
        text.unlink()
    return codes, "\n".join(log)


def _compile(config, sources: Sources, folder: Path, nvcc: str,
             tick: Callable[[], None] = lambda: None) -> str:
    """Emit the sources into ``folder`` and run nvcc for each output (cubin, host library) in
    parallel (``tick`` once a second). Returns the build log; raises BuildError on failure."""
    for name in sources.templates:
        (folder / name).write_text(emit.template(name))
    if sources.header:
        (folder / sources.header).write_text(sources.emit())
    commands = nvcc_commands(sources, env.cutlass_include_dirs())
    codes, log = _run_nvcc(nvcc, commands, folder, tick)
    (folder / "build.log").write_text(log)
    failed = [f"{output}: {'exit status' if code > 0 else 'signal'} {abs(code)}"
              for output, code in codes.items() if code != 0]
    fatal = [w for w in _FATAL_WARNINGS if w in log]
    if failed or fatal:
        tail = "\n".join(log.splitlines()[-40:])
        raise BuildError(f"nvcc failed for {config.name} ({', '.join(failed + fatal)}):\n{tail}")
    missing = [name for name in commands if not (folder / name).is_file()]
    if missing:
        raise BuildError(f"nvcc exited 0 for {config.name} but did not write {', '.join(missing)}")
    cubin = (folder / CUBIN).read_bytes()
    absent = [symbol for symbol in sources.symbols if symbol.encode() not in cubin]
    if absent:
        raise BuildError(f"the cubin of {config.name} lacks its entry points {', '.join(absent)}")
    return log


def build(config, sources: Sources, cache_dir: Path | None = None, *,
          progress: bool | None = None) -> Artifact:
    """The built kernel(s) for ``config`` (a family's frozen configuration dataclass, with a
    ``name``) from its ``sources``: a cache hit, or emit + nvcc + atomic insert. A compile is
    announced by a logged WARNING naming the kernel and the cache folder, and, with
    ``progress`` (default: when stderr is a terminal), a line counting nvcc's seconds.

    ``cache_dir`` defaults to :func:`cutlass_convt.env.cache_dir`. Without a working nvcc (none
    found, or it does not run), the newest cached entry of ``config`` built by any toolchain
    serves. Raises :class:`BuildError` when nvcc fails (the log tail is in the message),
    serializes the kernel's wgmmas or writes no output, when the kernel is not cached and there
    is no working nvcc, or when the cache folder cannot be created or locked. A cold build of
    one kernel takes about 10 s on 2 CPU cores. Removes the temporary folders of earlier,
    killed builds of the same kernel.
    """
    root = Path(cache_dir) if cache_dir is not None else env.cache_dir()
    version, why = env.working_nvcc()
    if version is None:  # no working nvcc: an entry built by any toolchain serves
        found = _find_any_toolchain(root, config, sources)
        if found is None:
            raise BuildError(f"kernel {config.name} is not in the cache {root} and {why}; set "
                             f"CUDA_HOME or {env.NVCC_VARIABLE} to a working nvcc, or build it "
                             "ahead with scripts/generate.py")
        return found
    nvcc = env.nvcc_path()
    key = _fingerprint(config, sources, version)
    entry = root / f"{config.name}-{key[:16]}"
    if (hit := _read_valid(entry)) is not None:
        return hit

    try:
        (root / ".locks").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BuildError(f"cannot create the kernel cache in {root} ({e}); set "
                         f"{env.CACHE_DIR_VARIABLE} to a writable folder") from None
    lock = FileLock(str(root / ".locks" / f"{entry.name}.lock"))
    try:
        acquired = lock.acquire()
    except OSError as e:  # for example a read-only cache that lacks this kernel
        raise BuildError(f"cannot build {config.name} into the kernel cache {root} ({e}); set "
                         f"{env.CACHE_DIR_VARIABLE} to a writable folder") from None
    with acquired:  # released on the way out
        if (hit := _read_valid(entry)) is not None:  # another process built it meanwhile
            return hit
        # Temporary folders of this entry are stale while we hold its lock: their builders
        # were killed before their clean-up ran.
        for stale in root.glob(f".tmp-{entry.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        _LOG.warning("cutlass_convt: compiling kernel %s with nvcc into %s (its first use; "
                     "later calls and processes reuse it)", config.name, entry)
        start = time.perf_counter()
        # created with the process's umask (tempfile.mkdtemp would make it 0700, and the
        # entry unreadable to other users of a shared cache)
        tmp = root / f".tmp-{entry.name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            show = sys.stderr.isatty() if progress is None else progress
            with _progress(config.name, show) as tick:
                log = _compile(config, sources, tmp, nvcc, tick)
            manifest = {
                "kernel": config.name,
                "config": dataclasses.asdict(config),
                "key": key,
                "config_key": _fingerprint(config, sources, None),
                "cutlass_version": env.cutlass_version(),
                "nvcc_version": version,
                "nvcc_commands": nvcc_commands(sources, env.cutlass_include_dirs()),
                "ptxas": [line.strip() for line in log.splitlines()
                          if line.startswith("ptxas info") or "spill" in line],
                "files": {p.name: _sha256(p.read_bytes()) for p in sorted(tmp.iterdir())
                          if p.name != "build.log"},
                "build_seconds": round(time.perf_counter() - start, 2),
                "built_at": time.time(),
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))  # the commit marker
            if entry.is_dir() and not entry.is_symlink():  # damaged: failed its hash check
                shutil.rmtree(entry)
            elif entry.exists() or entry.is_symlink():  # not a folder at all
                entry.unlink()
            tmp.rename(entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return Artifact(entry, manifest, compiled=True)

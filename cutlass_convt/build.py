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
import ctypes
import dataclasses
import errno
import functools
import hashlib
import inspect
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
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


_ELF = b"\x7fELF"
# Lock files are writable to every user (whatever the umask), so that a lock one user created
# does not keep the others of a shared cache from building that kernel; their folder is as
# writable as the cache folder itself (:func:`_locks_folder`).
LOCK_MODE = 0o666


def _locks_folder(root: Path) -> None:
    """Create ``root/.locks`` with ``root``'s permission bits whatever the umask: a user of a
    shared cache (a group-writable ``root``) creates each new kernel's lock file there, and a
    folder made with another user's umask 022 refused them all (found with two Unix users).
    Another user's folder keeps its bits (only its owner may change them)."""
    locks = root / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    wanted = root.stat().st_mode & 0o7777
    try:
        if locks.stat().st_mode & 0o7777 != wanted:
            locks.chmod(wanted)
    except OSError:
        pass


def read_entry(path: Path) -> Artifact | None:
    """The entry at ``path`` if it is whole and its own: its manifest names the kernel and
    key that the folder's name (``<kernel>-<key[:16]>``) does, lists the cubin (and the host
    library where its build made one), each non-empty and an ELF file, and every listed file
    matches its hash; else None (truncated, edited, or another kernel's folder renamed)."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        if path.name != f"{manifest['kernel']}-{manifest['key'][:16]}":
            return None
        outputs = [CUBIN] + ([HOST_LIB] if HOST_LIB in manifest.get("nvcc_commands", {}) else [])
        files = manifest["files"]
        if any(name not in files for name in outputs):
            return None
        for name, digest in files.items():
            data = (path / name).read_bytes()
            if _sha256(data) != digest or (name in outputs and not data.startswith(_ELF)):
                return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return Artifact(path, manifest)


def _read_valid(path: Path, config, sources: Sources, config_key: str,
                key: str | None = None) -> Artifact | None:
    """The entry at ``path`` (:func:`read_entry`) if it is one of ``config``'s builds from
    ``sources``: its manifest names ``config`` (kernel and configuration), its ``config_key``
    (and, when given, ``key``), and lists the host library where ``sources`` has host code.
    Anything else (a manifest of another kernel in a copied or renamed folder) is not an
    entry of ``config``."""
    found = read_entry(path)
    if found is None:
        return None
    manifest = found.manifest
    wanted = json.loads(json.dumps(dataclasses.asdict(config)))
    if (manifest.get("kernel") != config.name or manifest.get("config") != wanted
            or manifest.get("config_key") != config_key
            or (key is not None and manifest.get("key") != key)
            or (sources.host and HOST_LIB not in manifest["files"])):
        return None
    return found


def _built_at(artifact: Artifact) -> float:
    """When the entry was built (seconds since the epoch; 0 where its manifest says nothing
    usable)."""
    try:
        return float(artifact.manifest.get("built_at"))
    except (TypeError, ValueError):
        return 0.0


def _entries(root: Path, config, sources: Sources, config_key: str) -> list[Artifact]:
    """The valid entries of ``config`` under ``root``, whichever nvcc built them."""
    return [a for p in root.glob(f"{config.name}-*")
            if (a := _read_valid(p, config, sources, config_key)) is not None]


def _os_error(e: OSError) -> str:
    """An OS error in words, its errno's name spelled out (``No space left on device
    (ENOSPC)``)."""
    name = errno.errorcode.get(e.errno or 0)
    return f"{e.strerror or e} ({name})" if name else str(e)


@contextlib.contextmanager
def _filesystem(operation: str, path: Path):
    """Raise an OSError of the block as a BuildError naming ``operation``, ``path`` and the
    error."""
    try:
        yield
    except OSError as e:
        raise BuildError(f"cannot {operation} {path}: {_os_error(e)}") from None


def _wait(proc: subprocess.Popen, tick: Callable[[], None], deadline: float) -> int:
    """``proc``'s exit status. Waits in short polls (``Popen.wait`` with a timeout sleeps at
    most 50 ms between them), so a signal that reaches another thread of this process is
    still handled here within that time (a plain ``wait`` blocks in one system call); calls
    ``tick`` once a second meanwhile. Raises BuildError past ``deadline``
    (``time.monotonic()``)."""
    while True:
        try:
            return proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            if time.monotonic() > deadline:
                raise BuildError(f"nvcc ran past the build deadline of {env.build_timeout():g} "
                                 f"s (${env.BUILD_TIMEOUT_VARIABLE}) and was killed") from None
            tick()


def _die_with_parent():
    """What nvcc's process runs before it starts (Linux): prctl(PR_SET_PDEATHSIG, SIGKILL), a
    SIGKILL when the process that started it dies, so that a killed Python process leaves no
    nvcc behind (its compilers, cicc and ptxas, are killed by the next build that sweeps the
    folder: :func:`_sweep`). The C function is bound here, in the parent, so that the child
    only calls it (no library loading between fork and exec); None where there is no prctl."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None
    return functools.partial(prctl, 1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG


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
    its output to a temporary file of the system's (no pipe to drain; it survives a full
    cache disk). This thread waits for them, so a KeyboardInterrupt (Ctrl-C), a signal
    handler's SystemExit or the build deadline (:func:`env.build_timeout`, a BuildError) ends
    the wait; each nvcc runs in a process group of its own, which is then killed with the
    programs it started (cicc, ptxas: killing nvcc alone leaves them running) before the
    exception propagates. Each group's id is recorded in ``folder`` (``pgid.<output>``) for
    :func:`_sweep`."""
    procs, outs = {}, {}
    deadline = time.monotonic() + env.build_timeout()
    try:
        for output, args in commands.items():
            outs[output] = tempfile.TemporaryFile()
            # TMPDIR: the intermediate files of a killed nvcc go with the folder
            procs[output] = subprocess.Popen([nvcc, *args], cwd=folder, stdout=outs[output],
                                             stderr=subprocess.STDOUT,
                                             start_new_session=True,
                                             preexec_fn=_die_with_parent(),
                                             env={**os.environ,
                                                  "TMPDIR": str(folder.resolve())})
            with _filesystem("write the process group of nvcc into", folder):
                (folder / f"pgid.{output}").write_text(str(procs[output].pid))
        codes = {output: _wait(proc, tick, deadline) for output, proc in procs.items()}
    except BaseException:
        for proc in procs.values():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # the group has ended
                pass
            proc.wait()
        for out in outs.values():
            out.close()
        raise
    log = []
    for output, args in commands.items():
        outs[output].seek(0)
        text = outs[output].read().decode(errors="replace")
        outs[output].close()
        (folder / f"pgid.{output}").unlink(missing_ok=True)
        log.append(f"$ nvcc {' '.join(args)}\n{text}")
    return codes, "\n".join(log)


def _compile(config, sources: Sources, folder: Path, nvcc: str,
             tick: Callable[[], None] = lambda: None) -> str:
    """Emit the sources into ``folder`` and run nvcc for each output (cubin, host library) in
    parallel (``tick`` once a second). Returns the build log; raises BuildError on failure
    (a filesystem error names the folder and the error)."""
    with _filesystem("write the sources into", folder):
        for name in sources.templates:
            (folder / name).write_text(emit.template(name))
        if sources.header:
            (folder / sources.header).write_text(sources.emit())
    commands = nvcc_commands(sources, env.cutlass_include_dirs())
    codes, log = _run_nvcc(nvcc, commands, folder, tick)
    failed = [f"{output}: {'exit status' if code > 0 else 'signal'} {abs(code)}"
              for output, code in codes.items() if code != 0]
    fatal = [w for w in _FATAL_WARNINGS if w in log]
    if failed or fatal:
        tail = "\n".join(log.splitlines()[-40:])
        raise BuildError(f"nvcc failed for {config.name} ({', '.join(failed + fatal)}):\n{tail}")
    with _filesystem("write the build log into", folder):
        (folder / "build.log").write_text(log)
    with _filesystem("read the outputs in", folder):
        bad = [name for name in commands if not (folder / name).is_file()
               or not (folder / name).read_bytes().startswith(_ELF)]
        cubin = (folder / CUBIN).read_bytes() if not bad else b""
    if bad:
        raise BuildError(f"nvcc exited 0 for {config.name} but did not write {', '.join(bad)} "
                         "(missing, empty or not an ELF file)")
    absent = [symbol for symbol in sources.symbols if symbol.encode() not in cubin]
    if absent:
        raise BuildError(f"the cubin of {config.name} lacks its entry points {', '.join(absent)}")
    return log


def _owner(path: Path) -> str:
    """Who owns ``path`` (user name, else uid), for error messages."""
    try:
        import pwd

        uid = path.lstat().st_uid
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return f"uid {uid}"
    except (OSError, ImportError):
        return "an unknown user"


def _sweep(root: Path, held: str) -> None:
    """Remove the temporary folders of builds whose builder is gone (their entry's lock is
    free, or is ``held``'s, the entry whose lock this build holds), after killing what is left
    of their compilers (the process groups recorded in them, when those still run in that
    folder)."""
    for stale in root.glob(".tmp-*"):
        entry = stale.name[len(".tmp-"):].rsplit("-", 1)[0]
        lock = FileLock(str(root / ".locks" / f"{entry}.lock"), mode=LOCK_MODE)
        try:
            if entry != held:
                lock.acquire(timeout=0)
        except Exception:  # held (a build in progress) or not lockable: leave it
            continue
        try:
            groups = set()
            for record in stale.glob("pgid.*"):
                try:
                    groups.add(int(record.read_text()))
                except (OSError, ValueError):
                    pass
            for pgid in _groups_in(groups, stale):
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except OSError:  # ended meanwhile
                    pass
            shutil.rmtree(stale, ignore_errors=True)
        finally:
            if entry != held:
                lock.release()


def _groups_in(groups: set[int], folder: Path) -> set[int]:
    """The process groups among ``groups`` that still have a process working in ``folder``
    (its current directory; Linux's /proc), so that a recycled group id is left alone."""
    found = set()
    if not groups:
        return found
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            pgid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2])
            if pgid in groups and (proc / "cwd").resolve() == folder.resolve():
                found.add(pgid)
        except (OSError, ValueError, IndexError):
            pass
    return found


def _lock(root: Path, entry: Path, config) -> FileLock:
    """The acquired lock of ``entry``, waited for in a loop that logs the holder (its
    ``.owner`` file: pid, host, user) every 10 s and gives up at the build deadline with a
    BuildError naming the lock and the holder; the holder is recorded once acquired."""
    locks = root / ".locks"
    lock = FileLock(str(locks / f"{entry.name}.lock"), mode=LOCK_MODE)
    owner = locks / f"{entry.name}.owner"
    deadline = time.monotonic() + env.build_timeout()
    while True:
        try:
            lock.acquire(timeout=10)
            break
        except TimeoutError:
            try:
                holder = owner.read_text().strip()
            except OSError:
                holder = "an unknown process"
            if time.monotonic() > deadline:
                raise BuildError(f"gave up waiting for {lock.lock_file} after "
                                 f"{env.build_timeout():g} s (${env.BUILD_TIMEOUT_VARIABLE}): "
                                 f"{holder} is building {config.name}") from None
            _LOG.warning("cutlass_convt: waiting for %s, which is building %s",
                         holder, config.name)
        except OSError as e:  # for example a read-only cache that lacks this kernel
            held = Path(lock.lock_file)
            whose = (f"owned by {_owner(held)}" if held.exists()
                     else f"not creatable in {locks}, owned by {_owner(locks)}")
            raise BuildError(f"cannot build {config.name} into the kernel cache {root}: lock "
                             f"{lock.lock_file} ({_os_error(e)}, {whose}); set "
                             f"{env.CACHE_DIR_VARIABLE} to a writable folder") from None
    try:
        owner.write_text(f"process {os.getpid()} on {os.uname().nodename} "
                         f"({_owner(Path(lock.lock_file))})\n")
    except OSError:  # the record is for messages only
        pass
    return lock


def build(config, sources: Sources, cache_dir: Path | None = None, *,
          progress: bool | None = None) -> Artifact:
    """The built kernel(s) for ``config`` (a family's frozen configuration dataclass, with a
    ``name``) from its ``sources``: a cache hit, or emit + nvcc + atomic insert. A compile is
    announced by a logged WARNING naming the kernel and the cache folder, and, with
    ``progress`` (default: when stderr is a terminal), a line counting nvcc's seconds.

    ``cache_dir`` defaults to :func:`cutlass_convt.env.cache_dir`. An entry built by the nvcc
    found now (the same binary: :func:`env.nvcc_identity`) serves without running nvcc at
    all. Else nvcc is asked for its version (bounded by :data:`env.QUERY_TIMEOUT_S`); without
    a working nvcc (none found, it does not run or does not answer), the newest cached entry of
    ``config`` built by any toolchain serves. An entry counts only if it is this
    configuration's build and whole (:func:`_read_valid`); a damaged one is rebuilt. A build
    and the wait for another process's build of the same kernel end at the build deadline
    (:func:`env.build_timeout`), the compilers killed. Raises :class:`BuildError` when nvcc
    fails (the log tail is in the message), serializes the kernel's wgmmas, writes no ELF
    output or runs past the deadline, when the kernel is not cached and there is no working
    nvcc, when the cache folder cannot be created, locked or written (the folder, the
    operation and the OS error named), or the lock is not released by the deadline. A cold
    build of one kernel takes about 10 s on 2 CPU cores. Removes the temporary folders (and
    leftover compilers) of earlier, killed builds.
    """
    root = Path(cache_dir) if cache_dir is not None else env.cache_dir()
    config_key = _fingerprint(config, sources, None)
    identity = env.nvcc_identity()
    if identity is not None:  # built by this very nvcc: no need to run it
        mine = [a for a in _entries(root, config, sources, config_key)
                if a.manifest.get("nvcc_identity") == identity]
        if mine:
            return max(mine, key=_built_at)
    version, why = env.working_nvcc()
    if version is None:  # no working nvcc: an entry built by any toolchain serves
        found = max(_entries(root, config, sources, config_key), key=_built_at, default=None)
        if found is None:
            raise BuildError(f"kernel {config.name} is not in the cache {root} (or only damaged "
                             f"or foreign entries of its name are) and {why}; set CUDA_HOME or "
                             f"{env.NVCC_VARIABLE} to a working nvcc, or build it ahead with "
                             "scripts/generate.py")
        return found
    nvcc = env.nvcc_path()
    key = _fingerprint(config, sources, version)
    entry = root / f"{config.name}-{key[:16]}"
    if (hit := _read_valid(entry, config, sources, config_key, key)) is not None:
        return hit

    try:
        _locks_folder(root)
    except OSError as e:
        raise BuildError(f"cannot create the kernel cache in {root} ({_os_error(e)}); set "
                         f"{env.CACHE_DIR_VARIABLE} to a writable folder") from None
    lock = _lock(root, entry, config)
    try:
        # another process built it meanwhile
        if (hit := _read_valid(entry, config, sources, config_key, key)) is not None:
            return hit
        _sweep(root, entry.name)
        _LOG.warning("cutlass_convt: compiling kernel %s with nvcc into %s (its first use; "
                     "later calls and processes reuse it)", config.name, entry)
        start = time.perf_counter()
        # created with the process's umask (tempfile.mkdtemp would make it 0700, and the
        # entry unreadable to other users of a shared cache)
        tmp = root / f".tmp-{entry.name}-{uuid.uuid4().hex[:8]}"
        with _filesystem("create the build folder", tmp):
            tmp.mkdir()
        try:
            show = sys.stderr.isatty() if progress is None else progress
            with _progress(config.name, show) as tick:
                log = _compile(config, sources, tmp, nvcc, tick)
            with _filesystem("write the manifest into", tmp):
                manifest = {
                    "kernel": config.name,
                    "config": dataclasses.asdict(config),
                    "key": key,
                    "config_key": config_key,
                    "cutlass_version": env.cutlass_version(),
                    "nvcc_version": version,
                    "nvcc_identity": identity,
                    "nvcc_commands": nvcc_commands(sources, env.cutlass_include_dirs()),
                    "ptxas": [line.strip() for line in log.splitlines()
                              if line.startswith("ptxas info") or "spill" in line],
                    "files": {p.name: _sha256(p.read_bytes()) for p in sorted(tmp.iterdir())
                              if p.name != "build.log"},
                    "build_seconds": round(time.perf_counter() - start, 2),
                    "built_at": time.time(),
                }
                (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))  # commit marker
            try:
                if entry.is_dir() and not entry.is_symlink():  # damaged or foreign
                    shutil.rmtree(entry)
                elif entry.exists() or entry.is_symlink():  # not a folder at all
                    entry.unlink()
            except OSError as e:
                raise BuildError(f"cannot replace the damaged entry {entry} (owned by "
                                 f"{_owner(entry)}): {_os_error(e)}") from None
            with _filesystem("move the build into", entry):
                tmp.rename(entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        lock.release()
    return Artifact(entry, manifest, compiled=True)

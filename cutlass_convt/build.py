"""Build and cache: kernel configuration -> cubin + host library under the cache folder.

One folder per kernel, ``<cache>/<config.name>-<key>/``, holding the emitted sources, the
``kernel.cubin``, the host library ``libhost.so``, nvcc's ``build.log`` and ``manifest.json``.
The key hashes everything that changes the binary: the configuration, the CUTLASS version,
nvcc's version, the flags and our own C++ and emitter sources. Entries are built in a
temporary folder and renamed into place with the manifest written last, under a per-entry file
lock, so an interrupted build leaves nothing that looks valid, and two processes never build
the same kernel twice. An entry whose files do not match their manifest hashes is rebuilt.
A hit needs neither nvcc nor ``cutlass_library``.

Loading an entry runs its code (the host library in this process, the cubin on the GPU), so an
entry serves only where no one but its expected owner or root could have written it
(OpenSSH's StrictModes as the model): every folder from ``/`` down to the cache folder
(:func:`path_refusal`), the entry's folder and its files (:func:`inspect_entry`) are owned by
that user or root and writable by no one else, except that a folder above the cache may be a
root-owned sticky folder that every user can write (``/tmp``) where the folder below it is
root's or this process's user's. The expected owner is this process's user for the cache folder
(:func:`cutlass_convt.env.cache_dir`) and the owner of each read-only cache of the search path
(:func:`cutlass_convt.env.cache_path`). Nothing the cache writes follows a symbolic link.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import functools
import grp
import hashlib
import inspect
import json
import logging
import os
import pwd
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import emit, env

_LOG = logging.getLogger(__name__)

CUBIN = "kernel.cubin"
HOST_LIB = "libhost.so"
MANIFEST = "manifest.json"
# The manifest field ``cutlass-convt cache import`` sets (the time of the import): an entry
# that came from an archive, which a lookup serves after any entry built here
IMPORTED = "imported_at"
_COMMON_FLAGS = ("-DNDEBUG", "--expt-relaxed-constexpr")
# ptxas serializing a kernel's wgmmas (C7510; or C7514 and C7518, "Potential Performance Loss:
# wgmma.mma_async instructions are serialized due to ...") means a kernel right but far below its
# rate: a failed build.
_FATAL_WARNINGS = ("C7510", "wgmma.mma_async instructions are serialized")
# Size caps of an entry: any one file it lists, all of them together, and its manifest (the
# largest real entries, a CUTLASS kernel's cubin and host library, take a few MiB).
MAX_FILE_BYTES = 64 * 2**20
MAX_ENTRY_BYTES = 128 * 2**20
MAX_MANIFEST_BYTES = 2**20
# A tuning record's size cap (a real one has a few KiB: its problem, winner and timings).
MAX_RECORD_BYTES = 64 * 2**10
# An entry folder's name: its kernel's name (lowercase letters, digits and ``_``, as the
# configurations' ``name`` spells it) and the first 16 hex digits of its key.
KERNEL_NAME = re.compile(r"[a-z0-9_]+")
ENTRY_NAME = re.compile(r"([a-z0-9_]+)-[0-9a-f]{16}")
# Bits of the folders and files the cache writes: never writable by group or others, whatever
# the umask (the umask may remove more).
_FOLDER_MODE, _FILE_MODE = 0o755, 0o644


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

    - ``device``: the template compiled into ``kernel.cubin`` (None: no cubin, a build of
      host code alone), ``symbols`` the entry points the launcher looks up there (a build whose
      cubin lacks one fails); ``includes``: the templates it includes; ``host``: the templates
      compiled into ``libhost.so`` (none: no host library).
    - ``header``: the file name of the header the family emits (``config.h``, ``operation.h``),
      ``emit()`` its text (called only when compiling: a cache lookup needs no emitter), and
      ``emitters`` the Python functions whose source text the cache key hashes in its place.
    - ``arch``: the SM the cubin is for, ``"90a"`` where it uses sm_90a's instructions (wgmma,
      setmaxnreg); ``cutlass``: whether the device code needs the CUTLASS include folders.
    - ``host_flags`` / ``host_libs``: further nvcc flags and libraries of the host library;
      ``std``: the C++ standard of the build.
    """

    device: str | None
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
    std: str = "c++17"

    @property
    def templates(self) -> tuple[str, ...]:
        """Every template file of the build: the device code, its includes, the host code."""
        return (*((self.device,) if self.device else ()), *self.includes, *self.host)

    @property
    def outputs(self) -> tuple[str, ...]:
        """The files the build makes: the cubin, the host library, or both."""
        return (*((CUBIN,) if self.device else ()), *((HOST_LIB,) if self.host else ()))


def gencode(arch: str) -> str:
    """nvcc's ``-gencode`` flag for SM ``arch`` (``"90"``, ``"90a"``, ``"80"``)."""
    return f"-gencode=arch=compute_{arch},code=sm_{arch}"


def nvcc_commands(sources: Sources, include_dirs) -> dict[str, list[str]]:
    """nvcc arguments (without the nvcc path) by output file, run in the entry's folder: the
    cubin where ``sources`` has device code, the host library where it has host code."""
    includes = [f"-I{d}" for d in include_dirs]
    common = (f"-std={sources.std}", *_COMMON_FLAGS)
    commands = {}
    if sources.device:
        commands[CUBIN] = [*common, "-O3", gencode(sources.arch), "-Xptxas=-v",
                           *(includes if sources.cutlass else ()),
                           "-cubin", "-o", CUBIN, sources.device]
    if sources.host:
        commands[HOST_LIB] = [*common, "-O2", *sources.host_flags,
                              *(includes if sources.cutlass else ()), "-shared",
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
_NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class _Untrusted(Exception):
    """A folder or file that someone other than its expected owner or root could have
    written (the message says why)."""


def user_name(uid: int) -> str:
    """A user's name, else ``uid <n>``."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _private_group(status: os.stat_result) -> bool:
    """Whether the group of the file ``status`` describes is its owner's private group: not
    root's, named as the owner, with no other member and no other user's primary group (a
    umask of 002 makes group-writable files of such a group, which no one else can use:
    Debian's OpenSSH StrictModes rule)."""
    if status.st_gid == 0:
        return False
    try:
        group, user = grp.getgrgid(status.st_gid), pwd.getpwuid(status.st_uid).pw_name
    except KeyError:
        return False
    return (group.gr_name == user and set(group.gr_mem) <= {user}
            and all(p.pw_name == user for p in pwd.getpwall() if p.pw_gid == status.st_gid))


_ACL_ACCESS = "system.posix_acl_access"  # Linux's extended attribute of a POSIX access ACL
_ACL_USER, _ACL_GROUP, _ACL_MASK = 0x02, 0x08, 0x10  # its entry tags: a named user, a named
# group, the mask


def _acl_writers(target: Path | int, owner: int) -> bool:
    """Whether the POSIX access ACL of ``target`` (a path, a link not followed, or an open
    file's descriptor) lets a named user other than ``owner`` and root, or a named group,
    write it, its mask applied (with such an ACL the mode's group bits show the mask, not who
    may write). False where it has no ACL beyond its mode or the system keeps none."""
    try:
        data = (os.getxattr(target, _ACL_ACCESS) if isinstance(target, int)
                else os.getxattr(target, _ACL_ACCESS, follow_symlinks=False))
    except (AttributeError, OSError):  # not Linux, no ACL (ENODATA), not supported
        return False
    entries = [struct.unpack_from("<HHI", data, offset) for offset in range(4, len(data) - 7, 8)]
    mask = next((perm for tag, perm, _ in entries if tag == _ACL_MASK), 0o7)
    return any(perm & mask & 0o2 and (tag == _ACL_GROUP or
                                      (tag == _ACL_USER and who not in (owner, 0)))
               for tag, perm, who in entries)


def _writers(status: os.stat_result, owner: int, target: Path | int) -> str:
    """Who other than ``owner`` (a uid) and root could write the file or folder ``status``
    describes (``target``: its path, or an open descriptor of it), in words (``owned by
    bob``, ``writable by its group (mode 2775)``); empty when no one (its group's write bit
    counts only where the group is not its owner's private group, :func:`_private_group`; a
    POSIX access ACL naming other writers counts, :func:`_acl_writers`)."""
    if status.st_uid not in (owner, 0):
        return f"owned by {user_name(status.st_uid)}"
    if _acl_writers(target, owner):
        return "writable by others through its access control list (ACL)"
    mode = status.st_mode & (0o002 if _private_group(status) else 0o022)
    if mode:
        who = " and ".join(who for bit, who in ((0o020, "its group"), (0o002, "every user"))
                           if mode & bit)
        return f"writable by {who} (mode {status.st_mode & 0o7777:o})"
    return ""


_MAX_LINKS = 40  # symbolic links followed in one path, as Linux's limit


def _walk(path: Path) -> list[tuple[Path, os.stat_result, os.stat_result | None]]:
    """Every folder and symbolic link met on the way from ``/`` to the absolute ``path``, as
    the kernel resolves it (links followed where they are met, ``..`` taken in the folder
    reached): (its path, its ``lstat``, the ``lstat`` of the folder holding it, None for
    ``/``). Raises OSError where a step is missing or more than :data:`_MAX_LINKS` links."""
    root = Path("/")
    steps = [(root, os.lstat(root), None)]
    current, pending, links = root, list(path.parts[1:]), 0
    while pending:
        name = pending.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            current = current.parent
            continue
        step = current / name
        status = os.lstat(step)
        steps.append((step, status, os.lstat(current)))
        if stat.S_ISLNK(status.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise OSError(errno.ELOOP, "too many symbolic links", str(path))
            target = Path(os.readlink(step))
            if target.is_absolute():
                current = root
            pending[:0] = target.parts[1:] if target.is_absolute() else target.parts
            continue
        current = step
    return steps


def path_refusal(folder: Path, owner: int | None = None) -> tuple[int | None, str]:
    """Whether the folder ``folder`` (an absolute path) is a cache that only its expected owner
    or root could have written: ``(owner, "")`` where it is, ``(None, why)`` where not (the
    folder named and why), ``(None, "")`` where it is missing or not a folder. ``owner`` is the
    expected owner (a uid); None: the folder's own owner (a read-only cache of the search path).
    Walks the path as given from ``/`` (:func:`_walk`, so a link in it counts where it is, and
    its target is walked too): every folder on the way owned by root or ``owner`` and writable
    by no one else, except a root-owned sticky folder (``/tmp``), which others may write where
    each folder or link in it on the way is owned by root or this process's user (one someone
    else made there could be anyone's)."""
    try:
        steps = _walk(Path(os.path.abspath(folder)))
    except OSError:
        return None, ""
    final, status, _ = steps[-1]
    if not stat.S_ISDIR(status.st_mode):
        return None, ""
    owner = status.st_uid if owner is None else owner
    for path, status, holder in steps:
        which = "the cache folder" if path == final else f"{path}, a folder above it,"
        sticky = (holder is not None and holder.st_uid == 0 and holder.st_mode & stat.S_ISVTX
                  and holder.st_mode & 0o022)
        if sticky and status.st_uid not in (0, os.geteuid()):
            return None, (f"{path} is owned by {user_name(status.st_uid)} directly under "
                          f"{path.parent}, a "
                          "sticky folder others can write (anyone could have made it)")
        if stat.S_ISLNK(status.st_mode):  # only who may write its folder could have made it
            continue
        last_sticky = (path != final and status.st_uid == 0 and status.st_mode & stat.S_ISVTX)
        if not last_sticky and (why := _writers(status, owner, path)):
            return None, f"{which} is {why}"
    return owner, ""


def _plain_name(name) -> bool:
    """Whether ``name`` is a plain file name (a string naming a file of a folder)."""
    return isinstance(name, str) and name not in ("", ".", "..") and not {"/", "\0"} & set(name)


def _read(folder: int, name, owner: int, limit: int) -> bytes:
    """The bytes of the regular file ``name`` (a plain name) in the open folder ``folder``,
    opened without following a link or waiting on a FIFO. Raises :class:`_Untrusted` where the
    file is another user's than ``owner``'s or root's or others can write it, ValueError where
    ``name`` is not a plain name, the file not a regular file or larger than ``limit`` bytes."""
    if not _plain_name(name):
        raise ValueError(f"{name!r} is not a file name of the entry")
    if not stat.S_ISREG(os.lstat(name, dir_fd=folder).st_mode):
        raise ValueError(f"{name} is not a regular file")
    with os.fdopen(os.open(name, os.O_RDONLY | os.O_NONBLOCK | _NO_FOLLOW, dir_fd=folder),
                   "rb") as f:
        status = os.fstat(f.fileno())
        if not stat.S_ISREG(status.st_mode) or status.st_size > limit:
            raise ValueError(f"{name} is not a regular file of at most {limit} bytes")
        if why := _writers(status, owner, f.fileno()):
            raise _Untrusted(f"{name} is {why}")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{name} has more than {limit} bytes")
    return data


def read_file(root: Path, folder: str, name: str, limit: int) -> bytes:
    """The bytes of the file ``root/folder/name`` of this process's user's cache ``root``,
    read as the entries' files are (the folders not links, owned by this user or root and
    writable by no one else from ``/`` down, :func:`path_refusal`; the file a regular file, not
    followed, never waited on, at most ``limit`` bytes). Raises OSError where it is missing,
    unreadable or ``folder`` is a link (ELOOP), ValueError where any of the rest does not hold
    (the message says why)."""
    owner, why = path_refusal(root, os.geteuid())
    if owner is None:
        raise ValueError(f"{root}: {why or 'not a folder'}")
    fd = os.open(root / folder, os.O_RDONLY | os.O_DIRECTORY | _NO_FOLLOW)
    try:
        if why := _writers(os.fstat(fd), os.geteuid(), fd):
            raise ValueError(f"{root / folder} is {why}")
        return _read(fd, name, os.geteuid(), limit)
    except _Untrusted as e:
        raise ValueError(str(e)) from None
    finally:
        os.close(fd)


def _is_hex(text, digits: int) -> bool:
    return isinstance(text, str) and re.fullmatch(f"[0-9a-f]{{{digits}}}", text) is not None


# The latest ``built_at`` a manifest may name (the end of the year 9999, seconds since the
# epoch): what ``time.localtime`` can show.
_LAST_BUILD_TIME = 253402300799


def parse_manifest(data: bytes) -> dict:
    """The manifest in ``data`` (JSON) with its fields' types checked: ``kernel`` a kernel name
    (:data:`KERNEL_NAME`), ``key`` 64 hex digits, ``files`` an object of plain file names to
    sha256 hex digests, ``nvcc_commands`` an object where present, ``nvcc_version`` a printable
    string or null where present. Raises ValueError (the field named) otherwise, for text that
    is not JSON or nested too deeply too. ``built_at`` (seconds since the epoch) is set to 0,
    an unknown time (the entry still serves, as the oldest), unless it is a number from 0 to
    the end of the year 9999."""
    try:
        manifest = json.loads(data)
    except RecursionError:
        raise ValueError("the manifest is nested too deeply") from None
    if not isinstance(manifest, dict):
        raise ValueError("the manifest is not a JSON object")
    files = manifest.get("files")
    version = manifest.get("nvcc_version")
    wrong = [name for name, bad in (
        ("kernel", not (isinstance(manifest.get("kernel"), str)
                        and KERNEL_NAME.fullmatch(manifest["kernel"]))),
        ("key", not _is_hex(manifest.get("key"), 64)),
        ("files", not isinstance(files, dict) or not all(
            _plain_name(n) and _is_hex(d, 64) for n, d in files.items())),
        ("nvcc_commands", not isinstance(manifest.get("nvcc_commands", {}), dict)),
        ("nvcc_version", version is not None and not (isinstance(version, str)
                                                      and version.isprintable())),
    ) if bad]
    if wrong:
        raise ValueError(f"the manifest's {', '.join(wrong)} not of the expected form")
    built_at = manifest.get("built_at")
    if type(built_at) not in (int, float) or not 0 <= built_at <= _LAST_BUILD_TIME:
        manifest["built_at"] = 0
    return manifest


def inspect_entry(path: Path, owner: int | None = None) -> tuple[Artifact | None, str]:
    """The entry at ``path`` and why it may not serve: ``(artifact, "")`` when it is whole and
    its own (:func:`read_entry`); ``(None, why)`` when someone other than ``owner`` (a uid;
    default: this process's user) or root could have written it (its folder or a listed file
    a link, owned by another user, or writable by its group or others); ``(None, "")`` for
    anything else (missing, truncated, edited, over the size caps :data:`MAX_FILE_BYTES` and
    :data:`MAX_ENTRY_BYTES`, a manifest whose fields are not of their form
    (:func:`parse_manifest`) or that names files outside the entry or that are not regular
    files). Blocks on nothing: a FIFO or a device is not a regular file. The folders above
    the entry are the caller's to check (:func:`caches`)."""
    owner = os.geteuid() if owner is None else owner
    try:
        folder = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NO_FOLLOW)
    except OSError as e:
        return None, ("a symbolic link" if e.errno == errno.ELOOP else "")
    try:
        if why := _writers(os.fstat(folder), owner, folder):
            return None, f"its folder is {why}"
        manifest = parse_manifest(_read(folder, MANIFEST, owner, MAX_MANIFEST_BYTES))
        if path.name != f"{manifest['kernel']}-{manifest['key'][:16]}":
            return None, ""
        commands = manifest.get("nvcc_commands", {})
        outputs = [name for name in (CUBIN, HOST_LIB) if name in commands] or [CUBIN]
        files = manifest["files"]
        if any(name not in files for name in outputs):
            return None, ""
        total = 0
        for name, digest in files.items():
            data = _read(folder, name, owner, MAX_FILE_BYTES)
            total += len(data)
            if (total > MAX_ENTRY_BYTES or _sha256(data) != digest
                    or (name in outputs and not data.startswith(_ELF))):
                return None, ""
    except _Untrusted as e:
        return None, str(e)
    except (OSError, ValueError):
        return None, ""
    finally:
        os.close(folder)
    return Artifact(path, manifest), ""


def read_entry(path: Path, owner: int | None = None) -> Artifact | None:
    """The entry at ``path`` if it is whole and its own: its manifest names the kernel and
    key that the folder's name (``<kernel>-<key[:16]>``) does, lists the cubin (and the host
    library where its build made one), each non-empty and an ELF file, and every listed file
    is a regular file of the folder matching its hash, within the size caps; and no one but
    ``owner`` (default: this process's user) or root could have written it
    (:func:`inspect_entry`); else None."""
    return inspect_entry(path, owner)[0]


_SKIPPED: set[tuple[Path, str]] = set()  # (path, why) warned about in this process


def _skip(path: Path, why: str) -> None:
    """Warn, once per process, that ``path`` is not loaded and why."""
    if (path, why) not in _SKIPPED:
        _SKIPPED.add((path, why))
        _LOG.warning("cutlass_convt: not loading %s: %s (loading an entry runs its code: only "
                     "its owner or root may have been able to write it)", path, why)


def caches(root: Path) -> list[tuple[Path, int]]:
    """The kernel caches a lookup reads, in order, each with the uid whose entries it serves:
    ``root`` (this process's user's), then :func:`env.cache_path`'s read-only folders (each
    its owner's). A folder that is missing or not a folder is passed over; one that someone
    other than its expected owner or root could have written (it or a folder above it:
    :func:`path_refusal`), with a warning (:func:`_skip`). Raises :class:`env.ConfigError` for
    an invalid search path."""
    found = []
    for folder, owner in ((root, os.geteuid()), *((p, None) for p in env.cache_path())):
        owner, why = path_refusal(folder, owner)
        if why:
            _skip(folder, why)
        elif owner is not None:
            found.append((folder, owner))
    return found


def _read_valid(path: Path, config, sources: Sources, config_key: str,
                key: str | None = None, owner: int | None = None) -> Artifact | None:
    """The entry at ``path`` (:func:`inspect_entry`, ``owner`` its expected owner) if it is
    one of ``config``'s builds from ``sources``: its manifest names ``config`` (kernel and
    configuration), its ``config_key`` (and, when given, ``key``), and lists the host library
    where ``sources`` has host code. Anything else (a manifest of another kernel in a copied
    or renamed folder) is not an entry of ``config``; one that someone else could have
    written is skipped with a warning (:func:`_skip`)."""
    found, why = inspect_entry(path, owner)
    if why:
        _skip(path, why)
    if found is None:
        return None
    manifest = found.manifest
    wanted = json.loads(json.dumps(dataclasses.asdict(config)))
    if (manifest.get("kernel") != config.name or manifest.get("config") != wanted
            or manifest.get("config_key") != config_key
            or (key is not None and manifest.get("key") != key)
            or any(name not in manifest["files"] for name in sources.outputs)):
        return None
    return found


def _entries(root: Path, owner: int, config, sources: Sources,
             config_key: str) -> list[Artifact]:
    """The valid entries of ``config`` under the cache ``root`` whose entries ``owner`` (a
    uid) or root wrote, whichever nvcc built them."""
    return [a for p in root.glob(f"{config.name}-*")
            if (a := _read_valid(p, config, sources, config_key, owner=owner)) is not None]


def os_error(e: OSError) -> str:
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
        raise BuildError(f"cannot {operation} {path}: {os_error(e)}") from None


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
        cubin = (folder / CUBIN).read_bytes() if not bad and sources.device else b""
    if bad:
        raise BuildError(f"nvcc exited 0 for {config.name} but did not write {', '.join(bad)} "
                         "(missing, empty or not an ELF file)")
    absent = [symbol for symbol in sources.symbols if symbol.encode() not in cubin]
    if absent:
        raise BuildError(f"the cubin of {config.name} lacks its entry points {', '.join(absent)}")
    return log


def owner_of(path: Path) -> str:
    """Who owns ``path`` (user name, else uid), for error messages."""
    try:
        return user_name(path.lstat().st_uid)
    except OSError:
        return "an unknown user"


def own_folder(path: Path, mode: int = _FOLDER_MODE) -> None:
    """Create the folder ``path`` with permission bits ``mode`` (less the umask's) and its
    missing parents, unless it exists; raises BuildError (naming ``path`` and the reason)
    unless it is then a folder, not a symbolic link, owned by this process's user or root and
    writable by no one else, and so is every folder above it (:func:`path_refusal`)."""
    try:
        for folder in [*reversed(path.parents), path]:  # parents too with ``mode``, not 0o777
            if not os.path.lexists(folder):
                folder.mkdir(mode=mode, exist_ok=True)
        status = path.lstat()
    except OSError as e:
        raise BuildError(f"cannot create the folder {path} ({os_error(e)}); set "
                         f"{env.CACHE_DIR_VARIABLE} to a writable folder") from None
    why = ("a symbolic link" if stat.S_ISLNK(status.st_mode)
           else _writers(status, os.geteuid(), path))
    if why:
        why = f"{path} is {why}"
    elif why := path_refusal(path, os.geteuid())[1]:
        why = f"{path}: {why}"
    if why:
        raise BuildError(f"{why}: a kernel written there could be replaced by another "
                         f"user, so nothing is built there; make it writable by its owner alone "
                         f"(chmod go-w), or set {env.CACHE_DIR_VARIABLE} to a folder of your own "
                         f"(prebuilt kernels are shared through {env.CACHE_PATH_VARIABLE})")


def write_file(path: Path, data: bytes, *, replace: bool) -> bool:
    """Write ``data`` into the file ``path`` atomically: a new temporary file of its folder
    (:data:`_FILE_MODE`) renamed into place where ``replace`` (a link in its place is replaced,
    never followed), else linked into place unless something (a link included) is there.
    Returns False where ``replace`` is false and ``path`` exists. Raises OSError where the
    folder cannot be written."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _FILE_MODE)
            f.write(data)
        if replace:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _write_no_follow(path: Path, text: str) -> None:
    """Write ``text`` into the file ``path`` (created with :data:`_FILE_MODE`, or truncated),
    refusing a symbolic link in its place (OSError ELOOP)."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NO_FOLLOW,
                           _FILE_MODE), "w") as f:
        f.write(text)


def _open_lock(locks: Path, name: str) -> int:
    """A descriptor of the lock file ``locks/<name>.lock`` (created private to this user),
    opened without following a link; OSError for a link (ELOOP) or anything but a regular
    file."""
    fd = os.open(locks / f"{name}.lock", os.O_RDWR | os.O_CREAT | _NO_FOLLOW, 0o600)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(locks / f"{name}.lock"))
    return fd


def _try_lock(fd: int) -> bool:
    """Take the exclusive lock (``flock``) of the open file ``fd`` if no one holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


# A build's temporary folder, ``.tmp-<entry>-<8 hex>`` (an import stages in
# ``.tmp-import-<random>``, which no build removes)
_BUILD_STAGING = re.compile(r"\.tmp-(?!import-)(.+)-[0-9a-f]{8}")


def _sweep(root: Path, held: str) -> None:
    """Remove the temporary folders of builds whose builder is gone (their entry's lock is
    free, or is ``held``'s, the entry whose lock this build holds), after killing what is left
    of their compilers (the process groups recorded in them, when those still run in that
    folder). Links and imports' staging folders are left alone."""
    for stale in root.glob(".tmp-*"):
        match = _BUILD_STAGING.fullmatch(stale.name)
        if match is None or not stat.S_ISDIR(stale.lstat().st_mode):
            continue
        entry, fd = match.group(1), None
        if entry != held:
            try:
                fd = _open_lock(root / ".locks", entry)
            except OSError:  # not lockable: leave it
                continue
            if not _try_lock(fd):  # a build in progress
                os.close(fd)
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
            if fd is not None:
                os.close(fd)


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


def lock_entry(root: Path, name: str, what: str) -> int:
    """The lock of entry ``name`` of the cache ``root`` (a descriptor holding ``flock`` on
    ``root/.locks/<name>.lock``; closing it releases the lock), waited for in a loop that logs
    the holder (its ``.owner`` note: pid, host, user) every 10 s and gives up at the build
    deadline with a BuildError naming the lock and the holder; the holder is recorded once
    acquired. ``what`` names the work in messages (``building <kernel>``). The lock folder is
    created with ``root``'s permission bits (private where the cache is); it, the lock file and
    the note are refused where they are links (and the folder where someone else could write
    it: :func:`own_folder`)."""
    locks = root / ".locks"
    own_folder(locks, root.stat().st_mode & _FOLDER_MODE)
    path, owner = locks / f"{name}.lock", locks / f"{name}.owner"
    try:
        fd = _open_lock(locks, name)
    except OSError as e:  # for example a read-only cache that lacks this kernel
        whose = (f"owned by {owner_of(path)}" if os.path.lexists(path)
                 else f"not creatable in {locks}, owned by {owner_of(locks)}")
        raise BuildError(f"cannot lock {path} for {what} in the kernel cache {root} "
                         f"({os_error(e)}, {whose}); set {env.CACHE_DIR_VARIABLE} to a writable "
                         "folder") from None
    deadline = time.monotonic() + env.build_timeout()
    note = time.monotonic() + 10
    while not _try_lock(fd):
        if time.monotonic() > deadline:
            os.close(fd)
            raise BuildError(f"gave up waiting for {path} after {env.build_timeout():g} s "
                             f"(${env.BUILD_TIMEOUT_VARIABLE}): {_holder(owner)} is {what}")
        if time.monotonic() > note:
            _LOG.warning("cutlass_convt: waiting for %s, which is %s", _holder(owner), what)
            note = time.monotonic() + 10
        time.sleep(0.1)
    try:
        _write_no_follow(owner, f"process {os.getpid()} on {os.uname().nodename} "
                                f"({user_name(os.geteuid())})\n")
    except OSError:  # the record is for messages only (a link in its place is not followed)
        pass
    return fd


def _holder(owner: Path) -> str:
    """The process that holds a lock, from its ``.owner`` note (not followed if a link)."""
    try:
        with os.fdopen(os.open(owner, os.O_RDONLY | os.O_NONBLOCK | _NO_FOLLOW), "rb") as f:
            return f.read(4096).decode(errors="replace").strip()
    except OSError:
        return "an unknown process"


def build(config, sources: Sources, cache_dir: Path | None = None, *,
          progress: bool | None = None) -> Artifact:
    """The built kernel(s) for ``config`` (a family's frozen configuration dataclass, with a
    ``name``) from its ``sources``: a cache hit, or emit + nvcc + atomic insert. A compile is
    announced by a logged WARNING naming the kernel and the cache folder, and, with
    ``progress`` (default: when stderr is a terminal), a line counting nvcc's seconds.

    ``cache_dir`` defaults to :func:`cutlass_convt.env.cache_dir`; it is read first, then
    the read-only caches of :func:`env.cache_path` (:func:`caches`), and only ``cache_dir`` is
    written. An entry built by the nvcc found now (the same binary: :func:`env.nvcc_identity`)
    serves without running nvcc at all. Else nvcc is asked for its version (bounded by
    :data:`env.QUERY_TIMEOUT_S`); without a working nvcc (none found, it does not run or does
    not answer), the newest cached entry of ``config`` built by any toolchain serves. An entry
    counts only if it is this configuration's build, whole, and written by no one but its
    cache's owner or root (:func:`_read_valid`; one that others could have written is skipped
    with a warning); a damaged one is rebuilt. A build and the wait for another process's
    build of the same kernel end at the build deadline (:func:`env.build_timeout`), the
    compilers killed. Raises :class:`BuildError` when nvcc fails (the log tail is in the
    message), serializes the kernel's wgmmas, writes no ELF output, writes more than the size
    caps or runs past the deadline, when the kernel is not cached and there is no working
    nvcc, when the cache folder cannot be created, locked or written (the folder, the
    operation and the OS error named) or someone else could write it, when the lock is not
    released by the deadline, and when an environment variable it reads is invalid (named).
    A cold build of one kernel takes about 10 s on 2 CPU cores. Removes the temporary folders
    (and leftover compilers) of earlier, killed builds.
    """
    with _configuration():
        root = Path(cache_dir) if cache_dir is not None else env.cache_dir()
        readable = caches(root)
    config_key = _fingerprint(config, sources, None)

    def newest(wanted: Callable[[Artifact], bool] = lambda artifact: True) -> Artifact | None:
        """The newest entry of ``config`` that is ``wanted``, from the first cache with one;
        an entry built here before any imported one (:data:`IMPORTED`: an import made while
        this kernel was being built, whatever ``built_at`` its manifest names, never shadows
        the build)."""
        for folder, owner in readable:
            found = [a for a in _entries(folder, owner, config, sources, config_key) if wanted(a)]
            if found:
                return max(found, key=lambda a: (IMPORTED not in a.manifest,
                                                  a.manifest["built_at"]))
        return None

    identity = env.nvcc_identity()
    if identity is not None:  # built by this very nvcc: no need to run it
        if (hit := newest(lambda a: a.manifest.get("nvcc_identity") == identity)) is not None:
            return hit
    version, why = env.working_nvcc()
    if version is None:  # no working nvcc: an entry built by any toolchain serves
        if (found := newest()) is None:
            raise BuildError(f"kernel {config.name} is not in the cache {root} (or only damaged "
                             f"or foreign entries of its name are) and {why}; set CUDA_HOME or "
                             f"{env.NVCC_VARIABLE} to a working nvcc, or build it ahead with "
                             "scripts/generate.py")
        return found
    nvcc = env.nvcc_path()
    key = _fingerprint(config, sources, version)
    entry = root / f"{config.name}-{key[:16]}"
    for folder, owner in readable:
        hit = _read_valid(folder / entry.name, config, sources, config_key, key, owner)
        if hit is not None:
            return hit

    with _configuration():
        env.build_timeout()
    own_folder(root)
    lock = lock_entry(root, entry.name, f"building {config.name}")
    try:
        # another process built it meanwhile
        if (hit := _read_valid(entry, config, sources, config_key, key)) is not None:
            return hit
        _sweep(root, entry.name)
        _LOG.warning("cutlass_convt: compiling kernel %s with nvcc into %s (once: "
                     "later calls and processes reuse it)", config.name, entry)
        start = time.perf_counter()
        # readable as the umask allows (tempfile.mkdtemp would make it 0700, and the entry
        # unreadable to the users of a cache built ahead), writable by this user alone
        tmp = root / f".tmp-{entry.name}-{uuid.uuid4().hex[:8]}"
        with _filesystem("create the build folder", tmp):
            tmp.mkdir(mode=_FOLDER_MODE)
        try:
            show = sys.stderr.isatty() if progress is None else progress
            with _progress(config.name, show) as tick:
                log = _compile(config, sources, tmp, nvcc, tick)
            with _filesystem("write the manifest into", tmp):
                contents = {p.name: p.read_bytes() for p in sorted(tmp.iterdir())
                            if p.name != "build.log"}
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
                    "files": {name: _sha256(data) for name, data in contents.items()},
                    "build_seconds": round(time.perf_counter() - start, 2),
                    "built_at": time.time(),
                }
                (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))  # commit marker
                for p in tmp.iterdir():
                    p.chmod(p.stat().st_mode & _FOLDER_MODE)
            if (max(map(len, contents.values())) > MAX_FILE_BYTES
                    or sum(map(len, contents.values())) > MAX_ENTRY_BYTES):
                raise BuildError(f"the build of {config.name} is larger than the cache's caps "
                                 f"({MAX_FILE_BYTES} bytes a file, {MAX_ENTRY_BYTES} an entry)")
            try:
                if entry.is_dir() and not entry.is_symlink():  # damaged, foreign or untrusted
                    shutil.rmtree(entry)
                elif entry.exists() or entry.is_symlink():  # not a folder at all
                    entry.unlink()
            except OSError as e:
                raise BuildError(f"cannot replace the damaged entry {entry} (owned by "
                                 f"{owner_of(entry)}): {os_error(e)}") from None
            with _filesystem("move the build into", entry):
                tmp.rename(entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        os.close(lock)
    return Artifact(entry, manifest, compiled=True)


@contextlib.contextmanager
def _configuration():
    """Raise an invalid environment variable of the block (:class:`env.ConfigError`, which
    names it) as a BuildError."""
    try:
        yield
    except env.ConfigError as e:
        raise BuildError(str(e)) from None

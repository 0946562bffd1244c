"""Kernel cache archives: ``cutlass-convt cache export FILE`` and ``cache import FILE``.

An archive's kernels run as your code: import only archives you trust. An import adds what the
destination cache lacks and checks what it can: an archive holds kernel entries
(``<kernel>-<16 hex>/``, the kernel's name in lowercase letters, digits and ``_``; flat folders
of regular files) and tuning records (``tuning/<24 hex>.json``), nothing else; an entry must be
whole by its own manifest, within the cache's size caps (:data:`cutlass_convt.build.
MAX_FILE_BYTES`, :data:`~cutlass_convt.build.MAX_ENTRY_BYTES`), and never replaces or shadows a
kernel the destination has (any entry of the same kernel name); only the files its manifest
lists are imported. A record is data, checked against its schema (it names a family's
configuration, each field exactly of its type, or PyTorch, never a file; at most
:data:`~cutlass_convt.build.MAX_RECORD_BYTES`) and never replaces one. An archive over the
caps of an import (:data:`MAX_MEMBERS` members, :data:`MAX_RECORDS` tuning records,
:data:`MAX_IMPORT_BYTES` bytes of files in all, a file over MAX_FILE_BYTES; by its members'
headers, read one at a time: the first member over a cap stops the reading, so no more than
the caps are decompressed) is refused whole, before anything is written; so is a FILE that is
not a regular file (a FIFO or a device never ends). Entries are staged in a private folder
(``tempfile.mkdtemp``, 0700) that no build removes, written by this module (no
``extractall``), and moved into place under the entry's lock.
"""

from __future__ import annotations

import json
import lzma
import os
import re
import secrets
import shutil
import stat
import tarfile
import tempfile
import time
import zlib
from pathlib import Path

from . import build

# Caps of one import: members of the archive, tuning records, bytes of all its files (a real
# entry has about 8 files of a few MiB; a cache of a few hundred kernels fits).
MAX_MEMBERS = 10_000
MAX_RECORDS = 2_000
MAX_IMPORT_BYTES = 4 * 2**30
TUNING = "tuning"
_RECORD_NAME = re.compile(r"[0-9a-f]{24}\.json")
_STAGING_PREFIX = ".tmp-import-"


class ArchiveError(Exception):
    """The archive cannot be read at all (the message names it and the error)."""


def records(root: Path) -> list[Path]:
    """The tuning record files of the cache ``root`` (regular files with a record's name)."""
    folder = root / TUNING
    if not folder.is_dir() or folder.is_symlink():
        return []
    return sorted(p for p in folder.iterdir()
                  if _RECORD_NAME.fullmatch(p.name) and p.is_file() and not p.is_symlink())


# The archive's compression, by the file's name (tarfile's write modes); import reads any.
WRITE_MODES = {".tar": "w", ".tar.gz": "w:gz", ".tgz": "w:gz", ".tar.bz2": "w:bz2",
               ".tar.xz": "w:xz", ".txz": "w:xz"}


def write_mode(file: Path) -> str | None:
    """tarfile's write mode for the archive name ``file`` (by its suffix, any case; None where
    the name is none of :data:`WRITE_MODES`)."""
    name = file.name.lower()
    return next((mode for suffix, mode in WRITE_MODES.items() if name.endswith(suffix)
                 and len(name) > len(suffix)), None)


def export(entries: list[Path], root: Path, file: Path) -> int:
    """Write the entry folders ``entries`` of the cache ``root`` and its tuning records into
    the archive ``file``, compressed as its name says (:func:`write_mode`); returns the number
    of records written. The archive is written beside ``file`` and renamed onto it when whole,
    so a failed export leaves no partial archive (and an existing ``file`` as it was). Raises
    ValueError for a name :func:`write_mode` does not know, OSError where ``file`` cannot be
    written."""
    mode = write_mode(file)
    if mode is None:
        raise ValueError(f"{file}: name the archive {', '.join(WRITE_MODES)}")
    found = records(root)
    staged = file.with_name(f".{file.name}.{os.getpid()}-{secrets.token_hex(4)}")
    handle = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # (umask applies)
    try:
        with os.fdopen(handle, "wb") as raw, tarfile.open(fileobj=raw, mode=mode) as archive:
            for folder in entries:
                archive.add(folder, arcname=folder.name)
            for record in found:
                archive.add(record, arcname=f"{TUNING}/{record.name}")
        os.replace(staged, file)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return len(found)


def _refusal(top: str, members: list[tarfile.TarInfo]) -> str:
    """Why the members of the archive's top-level folder ``top`` are not an entry or the
    tuning records in the archive's form (empty: they are): a flat folder of regular files
    with plain names, each within its cap, the entry's within its cap."""
    record = top == TUNING
    if not record and not build.ENTRY_NAME.fullmatch(top):
        return ("neither a kernel entry (<kernel>-<16 hex digits>, the kernel's name in "
                "lowercase letters, digits and _) nor the tuning records")
    cap = build.MAX_RECORD_BYTES if record else build.MAX_FILE_BYTES
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        return "a member appears twice"
    for m in members:
        parts = m.name.split("/")
        if m.name == top:
            if not m.isdir():
                return f"{_shown(m.name)} is not a folder"
        elif len(parts) != 2 or parts[1] in ("", ".", ".."):
            return f"{_shown(m.name)}: not a plain file name inside {top}/"
        elif not m.isreg():
            return f"{_shown(m.name)} is not a regular file (links and devices are never imported)"
        elif m.size > cap:
            return f"{_shown(m.name)} has {m.size} bytes, over the cap of {cap}"
        elif record and not _RECORD_NAME.fullmatch(parts[1]):
            return f"{_shown(m.name)} is not a tuning record's name (<24 hex digits>.json)"
    if not record and sum(m.size for m in members) > build.MAX_ENTRY_BYTES:
        return f"{sum(m.size for m in members)} bytes, over an entry's cap of " \
               f"{build.MAX_ENTRY_BYTES}"
    return ""


def _record_refusal(name: str, data: bytes) -> str:
    """Why ``data`` is not the tuning record ``name`` (empty: it is): a JSON object whose
    ``spec`` is a problem and ``machine`` a machine (:func:`cutlass_convt.choose.machine_fields`)
    whose record has this name, and whose winner is PyTorch or a configuration of the family
    it names."""
    from . import choose
    from .spec import ProblemSpec, exact_fields

    try:
        record = json.loads(data)
        spec = exact_fields(ProblemSpec, record["spec"])
        if record["winner_family"] != choose.TORCH.name:
            choose.config_from_record(record["winner_family"], record["winner"])
        if choose.record_path(spec, choose.machine_fields(record["machine"])).name != name:
            return "not the record of the problem and machine it names"
    except RecursionError:
        return "not a tuning record (nested too deeply)"
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return f"not a tuning record ({e.__class__.__name__}: {e})"
    return ""


def _stage(archive: tarfile.TarFile, members: list[tarfile.TarInfo], folder: Path) -> None:
    """Write the manifest among the regular-file ``members`` (``<top>/<name>``) and the files
    it lists into the new folder ``folder`` (0755; files 0644, created exclusively, never
    through a link); others are left out. Raises ValueError where the manifest is missing, over
    its cap or its fields not of their form (:func:`cutlass_convt.build.parse_manifest`)."""
    folder.mkdir(mode=0o755)
    files = {m.name.split("/")[1]: m for m in members if m.isreg()}
    manifest = files.get(build.MANIFEST)
    if manifest is None or manifest.size > build.MAX_MANIFEST_BYTES:
        raise ValueError(f"no {build.MANIFEST} of at most {build.MAX_MANIFEST_BYTES} bytes")
    with archive.extractfile(manifest) as source:
        listed = build.parse_manifest(source.read())["files"]
    for name in (build.MANIFEST, *(name for name in listed if name in files)):
        target = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         0o644)
        with archive.extractfile(files[name]) as source, os.fdopen(target, "wb") as f:
            shutil.copyfileobj(source, f)


def _import_entry(archive: tarfile.TarFile, top: str, members: list[tarfile.TarInfo],
                  dest: Path, staging: Path) -> str:
    """Import the entry ``top`` into the cache ``dest`` through ``staging``; returns why not
    (empty: imported)."""
    _stage(archive, members, staging / top)
    artifact, why = build.inspect_entry(staging / top)
    if artifact is None:
        return why or ("not a whole entry: its manifest does not name this folder, its files "
                       "or their hashes, or names files outside it")
    kernel = artifact.manifest["kernel"]
    (staging / top / build.MANIFEST).write_text(json.dumps(  # (not among its hashed files)
        {**artifact.manifest, build.IMPORTED: time.time()}, indent=1))
    lock = build.lock_entry(dest, top, f"importing {top}")
    try:
        present = [p.name for p in dest.glob(f"{kernel}-*")
                   if (match := build.ENTRY_NAME.fullmatch(p.name)) and match[1] == kernel]
        if present:
            return (f"the cache has kernel {kernel} already ({present[0]}); an import never "
                    "replaces or shadows a kernel")
        (staging / top).rename(dest / top)
    finally:
        os.close(lock)
    return ""


# What reading a damaged archive raises: tarfile's errors, and its decompressors' (gzip's and
# bzip2's are OSErrors; xz's and a damaged deflate stream's are not)
_READ_ERRORS = (OSError, tarfile.TarError, EOFError, lzma.LZMAError, zlib.error)


def _shown(name: str) -> str:
    """A member's name for a line of output: as it is where printable, else its Python
    literal (a name with a newline forges no line)."""
    return name if name.isprintable() else repr(name)


def _headers(archive: tarfile.TarFile, file: Path) -> list[tarfile.TarInfo]:
    """The archive's members, their headers read one at a time; the first member that takes
    the archive over a cap of an import stops the reading, before its data is skipped (a
    compressed member is decompressed to reach the next header): at most MAX_IMPORT_BYTES
    are decompressed. Raises :class:`ArchiveError` over a cap (:data:`MAX_MEMBERS`,
    :data:`MAX_RECORDS`, :data:`MAX_IMPORT_BYTES`, or a file over
    :data:`~cutlass_convt.build.MAX_FILE_BYTES`, more than any entry may hold) or where the
    archive cannot be read."""
    members: list[tarfile.TarInfo] = []
    records = size = 0
    try:
        for member in archive:
            members.append(member)
            records += member.name.startswith(f"{TUNING}/")
            size += member.size if member.isreg() else 0
            over = [f"{what} over the cap of {cap}" for count, cap, what in (
                (len(members), MAX_MEMBERS, "members"), (records, MAX_RECORDS, "tuning records"),
                (size, MAX_IMPORT_BYTES, "bytes of files")) if count > cap]
            if member.isreg() and member.size > build.MAX_FILE_BYTES:
                over.insert(0, f"{_shown(member.name)} of {member.size} bytes, over the cap of "
                               f"{build.MAX_FILE_BYTES} a file")
            if over:
                raise ArchiveError(f"the archive {file} has {over[0]}: refused whole")
    except _READ_ERRORS as e:
        raise ArchiveError(f"cannot read the archive {file}: {e}") from None
    return members


def _open(file: Path) -> tuple[tarfile.TarFile, object]:
    """The tar archive in the regular file ``file`` (plain, gzip, bzip2 or xz), and the open
    file under it (closing the archive leaves it open). Raises
    :class:`ArchiveError` for anything else: a FIFO or a device (which never end), a folder,
    a file that cannot be read or is not such an archive."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)  # (a FIFO opens without a writer)
    except OSError as e:
        raise ArchiveError(f"cannot read the archive {file}: {build.os_error(e)}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ArchiveError(f"cannot read the archive {file}: not a regular file")
    stream = os.fdopen(fd, "rb")
    try:
        return tarfile.open(fileobj=stream), stream
    except tarfile.ReadError:
        stream.close()
        raise ArchiveError(f"cannot read the archive {file}: not a tar archive (plain, gzip, "
                           "bzip2 or xz), or truncated") from None
    except _READ_ERRORS as e:
        stream.close()
        raise ArchiveError(f"cannot read the archive {file}: {e}") from None


def import_archive(file: Path, dest: Path) -> tuple[list[str], list[str], int]:
    """Add the entries and tuning records of the archive ``file`` that the cache ``dest``
    lacks. Returns the names imported, one line per refused entry or record (its name and
    why), and the number of top-level folders the archive has. Raises :class:`ArchiveError`
    when ``file`` is not a regular file holding a readable tar archive or is over an import's
    caps (:func:`_headers`), :class:`~cutlass_convt.build.BuildError`
    when ``dest`` cannot be created or others could write it."""
    archive, stream = _open(file)
    with stream, archive:
        members = _headers(archive, file)
        build.own_folder(dest)
        tops: dict[str, list[tarfile.TarInfo]] = {}
        for m in members:
            tops.setdefault(m.name.split("/", 1)[0], []).append(m)
        imported, refused = [], []
        for top, group in sorted(tops.items()):
            why = _refusal(top, group)
            if not why and top == TUNING:
                _import_records(archive, group, dest, imported, refused)
                continue
            if not why:
                staging = Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=dest))
                try:
                    why = _import_entry(archive, top, group, dest, staging)
                except (*_READ_ERRORS, ValueError, build.BuildError) as e:
                    why = str(e)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
            if why:
                refused.append(f"{_shown(top or '/')}: {why}")
            else:
                imported.append(top)
    return imported, refused, len(tops)


def _import_records(archive: tarfile.TarFile, members: list[tarfile.TarInfo], dest: Path,
                    imported: list[str], refused: list[str]) -> None:
    """Add the tuning records among ``members`` that ``dest`` lacks (to ``imported`` by name;
    each refused one to ``refused`` with why)."""
    folder = dest / TUNING
    for m in members:
        if not m.isreg():
            continue
        name = m.name.split("/")[1]
        try:
            with archive.extractfile(m) as source:
                data = source.read(build.MAX_RECORD_BYTES + 1)
            why = _record_refusal(name, data)
            if not why:
                build.own_folder(folder)
                if not build.write_file(folder / name, data, replace=False):
                    why = "the cache has a record of this problem already"
        except (*_READ_ERRORS, build.BuildError) as e:
            why = str(e)
        if why:
            refused.append(f"{_shown(m.name)}: {why}")
        else:
            imported.append(m.name)

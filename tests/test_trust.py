"""The kernel cache as a trust boundary (CPU): the attacks of a co-user of a shared cache, of a
planted or crafted archive, of manifests that reach outside their entry and of symbolic links in
the cache's own folders, each refused; the search path of read-only caches; clean errors."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pwd
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import threading
import uuid
from pathlib import Path

import pytest

from cutlass_convt import build, cli, env

from helpers import FP32, MACHINE, TF32, TF32_SOURCES, build_config, compile_only_a_cubin

CACHE_PATH = "CUTLASS_CONVT_CACHE_PATH"


@pytest.fixture
def other_user():
    """A second Unix user (created for the test, removed after): its passwd entry."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second Unix user")
    if shutil.which("useradd") is None:
        pytest.skip("needs useradd to create a second Unix user")
    name = f"cc49{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture
def fake_build(monkeypatch):
    """Builds write stand-in ELF outputs at once (no nvcc run)."""
    monkeypatch.setattr(build, "_compile", compile_only_a_cubin)


@pytest.fixture
def open_folder():
    """A fresh folder every user may enter (0755, under the system's temporary folder)."""
    folder = Path(tempfile.mkdtemp())
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def chown_tree(path: Path, uid: int) -> None:
    for p in [path, *path.rglob("*")]:
        os.chown(p, uid, -1, follow_symlinks=False)


def rewrite_manifest(entry: Path, **changes) -> Path:
    """Change ``entry``'s manifest fields and rename its folder after its (new) key: an entry
    that is whole by its own manifest."""
    manifest = json.loads((entry / build.MANIFEST).read_text())
    manifest.update(changes)
    (entry / build.MANIFEST).write_text(json.dumps(manifest))
    renamed = entry.with_name(f"{manifest['kernel']}-{manifest['key'][:16]}")
    entry.rename(renamed)
    return renamed


def forged(folder: Path, config=TF32, key: str = "f" * 64) -> Path:
    """A stand-in build of ``config`` in a cache of its own under ``folder``, renamed to another
    key, built later and its nvcc identity the local one: the entry a lookup prefers."""
    source = build.build(config, build_sources(config), folder / f"forge-{uuid.uuid4().hex[:6]}")
    return rewrite_manifest(source.path, key=key, built_at=4e9,
                            nvcc_identity=env.nvcc_identity())


def build_sources(config):
    from cutlass_convt import choose

    return choose.family_of(config).sources(config)


def run_cli(*args: str, **environment) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cutlass_convt", *args], capture_output=True,
                          text=True, env={**os.environ, **environment})


# 1. Planted code in a shared cache


@pytest.mark.nvcc
@pytest.mark.parametrize("mode", [0o2775, 0o777])
def test_a_cache_others_can_write_is_neither_loaded_nor_built_into(open_folder, mode,
                                                                     other_user, fake_build,
                                                                     caplog):
    """The README's former recipe (a group-writable, setgid cache) or a mode-777 cache: a
    second user writes an entry for the kernel the first needs next; it is not loaded (one
    warning naming the folder and why), and no kernel is built where others could replace it."""
    shared = open_folder / "shared"
    shared.mkdir()
    shared.chmod(mode)
    plant = forged(open_folder)
    chown_tree(plant.parent, other_user.pw_uid)
    subprocess.run(["cp", "-r", str(plant), str(shared)], user=other_user.pw_uid, check=True)
    assert (shared / plant.name).stat().st_uid == other_user.pw_uid
    with pytest.raises(build.BuildError, match=f"{shared} is writable by .*chmod go-w"):
        build.build(TF32, TF32_SOURCES, shared)
    warnings = [r.getMessage() for r in caplog.records if "not loading" in r.getMessage()]
    who = "its group and every user" if mode & 0o002 else "its group"
    assert warnings == [f"cutlass_convt: not loading {shared}: the cache folder is writable by "
                        f"{who} (mode {mode:o}) "
                        "(loading an entry runs its code: only its owner or root may have been "
                        "able to write it)"]


@pytest.mark.nvcc
def test_another_user_s_entry_in_one_s_own_cache_is_skipped(tmp_path, other_user, fake_build,
                                                            caplog):
    """An entry another user owns (or one whose file others can write) in the user's own
    cache is not loaded: one warning naming it and why; the kernel is built anew."""
    cache = tmp_path / "cache"
    cache.mkdir()
    plant = cache / forged(tmp_path).name
    shutil.copytree(forged(tmp_path), plant)
    chown_tree(plant, other_user.pw_uid)
    built = build.build(TF32, TF32_SOURCES, cache)
    assert built.compiled and built.path != plant
    assert [r.getMessage().split(" (loading")[0] for r in caplog.records
            if "not loading" in r.getMessage()] == [
        f"cutlass_convt: not loading {plant}: its folder is owned by {other_user.pw_name}"]
    chown_tree(plant, 0)
    (plant / build.CUBIN).chmod(0o666)
    assert build.inspect_entry(plant) == (None, "kernel.cubin is writable by its group and "
                                                "every user (mode 666)")


# The search path of read-only caches


def snapshot(folder: Path) -> dict:
    return {str(p): (p.lstat().st_mode, p.lstat().st_mtime_ns, p.lstat().st_size)
            for p in [folder, *folder.rglob("*")]}


@pytest.mark.nvcc
def test_a_read_only_cache_on_the_search_path_serves_and_is_never_written(
        tmp_path, other_user, fake_build, monkeypatch, caplog, capsys):
    """An administrator's prebuilt cache (its owner another user, read-only) on
    CUTLASS_CONVT_CACHE_PATH serves its entries, after the user's own cache, and is never
    written; its entries owned by a third user, or writable by others, are skipped;
    ``cache list`` lists what it serves and names what it skips."""
    shared = tmp_path / "prebuilt"
    shared.mkdir()
    served = shared / forged(tmp_path).name
    shutil.copytree(forged(tmp_path), served)
    fp32 = forged(tmp_path, FP32)
    shutil.copytree(fp32, shared / fp32.name)
    chown_tree(shared, other_user.pw_uid)
    os.chown(shared / fp32.name, 4242, -1)  # a third user's entry
    for p in [shared, *shared.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    before = snapshot(shared)
    monkeypatch.setenv(CACHE_PATH, f"{tmp_path / 'missing'}{os.pathsep}{shared}")
    own = tmp_path / "own"
    assert build.build(TF32, TF32_SOURCES, own).path == served
    assert not own.exists()
    rebuilt = build.build(FP32, build_sources(FP32), own)
    assert rebuilt.compiled and rebuilt.path.parent == own
    assert any(f"not loading {shared / fp32.name}: its folder is owned by uid 4242" in
               r.getMessage() for r in caplog.records)
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(own))
    capsys.readouterr()
    assert cli.main(["cache", "list"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == (f"1 entry in {shared} (read-only, owner "
                                    f"{other_user.pw_name})") and served.name in out, out
    assert f"1 entry in {own}\n" in out and fp32.name not in out, out
    assert f"{fp32.name}: not served: its folder is owned by uid 4242" in err, err
    assert snapshot(shared) == before
    mine = own / served.name  # the user's own cache comes first
    shutil.copytree(served, mine)
    assert build.build(TF32, TF32_SOURCES, own).path == mine
    monkeypatch.setenv(CACHE_PATH, "relative/cache")
    with pytest.raises(build.BuildError, match=f"{CACHE_PATH}: 'relative/cache' "
                                               "is not an absolute path"):
        build.build(TF32, TF32_SOURCES, tmp_path / "empty")


# 2. cache import serves planted and wrong kernels


@pytest.mark.nvcc
def test_an_import_never_replaces_or_shadows_a_kernel_the_cache_has(tmp_path, fake_build,
                                                                     monkeypatch, capsys):
    """An archive's entry of a kernel the cache has, under another key with a later built_at
    and the local nvcc identity (it would be served first), and one that names the float32
    kernel's files under the TF32 kernel's name: both skipped with the reason, exit 1; the
    cache's own entry still serves."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(cache))
    mine = build.build(TF32, TF32_SOURCES, cache)
    later = forged(tmp_path)
    wrong = rewrite_manifest(forged(tmp_path, FP32, key="d" * 64), kernel=TF32.name,
                             config=json.loads((mine.path / build.MANIFEST).read_text())["config"],
                             config_key=mine.manifest["config_key"])
    assert build.read_entry(later) is not None and build.read_entry(wrong) is not None
    for entry in (later, wrong):
        bundle = tmp_path / f"{entry.name}.tar.gz"
        with tarfile.open(bundle, "w:gz") as tar:
            tar.add(entry, arcname=entry.name)
        capsys.readouterr()
        assert cli.main(["cache", "import", str(bundle)]) == 1
        out, err = capsys.readouterr()
        assert err == (f"skipped {entry.name}: the cache has kernel {TF32.name} already "
                       f"({mine.path.name}); an import never replaces or shadows a kernel\n")
        assert not (cache / entry.name).exists()
    assert build.build(TF32, TF32_SOURCES, cache).path == mine.path


@pytest.mark.nvcc
def test_an_import_made_while_the_kernel_builds_never_shadows_the_build(tmp_path, fake_build,
                                                                        monkeypatch, capsys):
    """The race a check under the new entry's own lock cannot see: an archive's entry of a
    kernel imported while that kernel is being built (so the cache has none yet: imported),
    its manifest naming a later built_at and the local nvcc identity; once the build lands
    beside it, the build serves, whatever the import's built_at."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(cache))
    later = forged(tmp_path)
    bundle = tmp_path / "race.tar.gz"
    with tarfile.open(bundle, "w:gz") as tar:
        tar.add(later, arcname=later.name)
    assert cli.main(["cache", "import", str(bundle)]) == 0
    imported = json.loads((cache / later.name / build.MANIFEST).read_text())
    assert imported[build.IMPORTED] > 0 and imported["built_at"] == 4e9
    assert build.build(TF32, TF32_SOURCES, cache).path == cache / later.name  # none other yet
    landed = build.build(TF32, TF32_SOURCES, tmp_path / "elsewhere")  # the build, landing now
    shutil.copytree(landed.path, cache / landed.path.name)
    assert build.build(TF32, TF32_SOURCES, cache).path == cache / landed.path.name


def grant_write_by_acl(path: Path, uid: int) -> None:
    """A POSIX access ACL on ``path`` that lets user ``uid`` write it (the mode's group bits
    then show the mask, here rwx); skips the test where the file system keeps none."""
    mode = path.stat().st_mode
    entries = [(0x01, (mode >> 6) & 7, 0xFFFFFFFF), (0x02, 7, uid),
               (0x04, (mode >> 3) & 7, 0xFFFFFFFF), (0x10, 7, 0xFFFFFFFF),
               (0x20, mode & 7, 0xFFFFFFFF)]
    data = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
    try:
        os.setxattr(path, "system.posix_acl_access", data)
    except (AttributeError, OSError) as e:
        pytest.skip(f"no POSIX ACLs here ({e})")


@pytest.mark.nvcc
@pytest.mark.parametrize("where", ["file", "folder", "cache"])
def test_an_acl_letting_another_user_write_counts_as_mode_bits_do(tmp_path, fake_build, where,
                                                                  monkeypatch):
    """An entry's file, its folder or the cache folder with an access ACL naming another
    user as a writer (the mode shows only the mask, 775 in the owner's private group, which
    the mode rule alone tolerates): not served, the reason named."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(cache))
    mine = build.build(TF32, TF32_SOURCES, cache)
    target = {"file": mine.path / build.MANIFEST, "folder": mine.path, "cache": cache}[where]
    mode = target.stat().st_mode
    grant_write_by_acl(target, 54321)
    if where == "cache":
        assert "access control list" in build.path_refusal(cache, os.geteuid())[1]
        with pytest.raises(build.BuildError, match="access control list"):
            build.build(TF32, TF32_SOURCES, cache)
    else:
        artifact, why = build.inspect_entry(mine.path)
        assert artifact is None and "access control list" in why
    os.removexattr(target, "system.posix_acl_access")
    target.chmod(mode)  # (the ACL's mask had set the group bits)
    assert build.build(TF32, TF32_SOURCES, cache).path.name == mine.path.name


# 3. Unchecked folders ride along


@pytest.mark.nvcc
def test_an_archive_s_tuning_folder_is_records_only(tmp_path, fake_build, monkeypatch, capsys):
    """Into a cache with no tuning/ folder, an archive whose tuning/ reaches a valid entry
    through '..' and carries a shared object: tuning/ refused (one line, why), the valid entry
    imported, nothing else written."""
    entry = forged(tmp_path)
    bundle = tmp_path / "bundle.tar.gz"
    with tarfile.open(bundle, "w:gz") as tar:
        tar.add(entry, arcname=f"tuning/../{entry.name}")
        tar.add(entry, arcname=entry.name)
        library = tarfile.TarInfo("tuning/libplanted.so")
        library.size = 4
        tar.addfile(library, io.BytesIO(b"\x7fELF"))
    cache = tmp_path / "cache"
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(cache))
    assert cli.main(["cache", "import", str(bundle)]) == 0
    out, err = capsys.readouterr()
    assert "imported 1 entry and 0 tuning records" in out
    assert err == (f"skipped tuning: tuning/../{entry.name}: not a plain file name inside "
                   "tuning/\n")
    assert sorted(p.name for p in cache.iterdir()) == [".locks", entry.name]
    assert build.read_entry(cache / entry.name) is not None


def test_tuning_records_import_as_validated_data(tmp_path, monkeypatch, capsys):
    """A valid record is added (never replacing one); a record under another problem's name,
    one naming an unknown family and a file in tuning/ that is not a record are refused."""
    from cutlass_convt import choose, problems

    spec = problems.find("kernelbench-71").spec("tf32", 90)
    config = choose.choose_config(spec)
    record = {"spec": dataclasses.asdict(spec), "machine": [list(p) for p in MACHINE],
              "winner_family": choose.family_of(config).name,
              "winner": dataclasses.asdict(config)}
    name = choose.record_path(spec, MACHINE).name
    bundle = tmp_path / "records.tar.gz"
    with tarfile.open(bundle, "w:gz") as tar:
        for member, data in ((name, record), ("0" * 24 + ".json", record),
                             ("1" * 24 + ".json", {**record, "winner_family": "../evil"}),
                             ("notes.txt", "x")):
            text = json.dumps(data).encode()
            info = tarfile.TarInfo(f"tuning/{member}")
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    cache = tmp_path / "cache"
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(cache))
    assert cli.main(["cache", "import", str(bundle)]) == 1  # tuning/notes.txt: all refused
    assert "not a tuning record's name" in capsys.readouterr().err
    with tarfile.open(bundle) as tar:
        members = [m for m in tar.getmembers() if not m.name.endswith(".txt")]
        kept = tmp_path / "kept.tar.gz"
        with tarfile.open(kept, "w:gz") as out:
            for m in members:
                out.addfile(m, tar.extractfile(m))
    assert cli.main(["cache", "import", str(kept)]) == 0
    out, err = capsys.readouterr()
    assert "imported 0 entries and 1 tuning record" in out
    assert err.splitlines() == [
        f"skipped tuning/{'0' * 24}.json: not the record of the problem and machine it names",
        f"skipped tuning/{'1' * 24}.json: not a tuning record (KeyError: '../evil')"]
    assert json.loads((cache / "tuning" / name).read_text()) == json.loads(json.dumps(record))
    assert cli.main(["cache", "import", str(kept)]) == 1
    assert "the cache has a record of this problem already" in capsys.readouterr().err


# 4. Manifests reach outside their entry


@pytest.mark.nvcc
def test_manifests_name_plain_regular_files_of_their_entry_within_the_caps(tmp_path,
                                                                           fake_build):
    """A manifest naming an absolute path, a '..' path, a FIFO, /dev/zero or a file over the
    size cap is no entry: each refused at once (a fresh process with a memory limit and a
    deadline, so that a hang or an unbounded read fails the test rather than the machine)."""
    built = build.build(TF32, TF32_SOURCES, tmp_path / "cache")
    outside = tmp_path / "outside"
    outside.write_bytes(b"secret")
    digest = build._sha256(b"secret")
    with open(built.path / "large", "wb") as f:
        f.truncate(64 * 2**20 + 1)  # one byte over the cap (sparse)
    large = build._sha256(b"\0" * (64 * 2**20 + 1))
    cases = {"absolute": {str(outside): digest}, "parent": {"../../outside": digest},
             "fifo": {"fifo": build._sha256(b"")}, "device": {"/dev/zero": digest},
             "large": {"large": large}}
    entries = []
    for name, files in cases.items():
        entry = tmp_path / name / built.path.name
        shutil.copytree(built.path, entry)
        if name == "fifo":
            os.mkfifo(entry / "fifo")
        manifest = json.loads((entry / build.MANIFEST).read_text())
        manifest["files"].update(files)
        (entry / build.MANIFEST).write_text(json.dumps(manifest))
        entries.append(str(entry))
    # The address-space cap: 1 GiB over what the process maps once imported (a CUDA build of
    # PyTorch maps GiBs of libraries at import, a CPU build under one).
    script = textwrap.dedent(f"""
        import re, resource
        from cutlass_convt import build
        mapped = int(re.search(r"VmSize:\\s+(\\d+) kB", open("/proc/self/status").read())[1])
        resource.setrlimit(resource.RLIMIT_AS, ((mapped + 2**20) * 1024,) * 2)
        for entry in {entries!r}:
            print(build.read_entry(__import__("pathlib").Path(entry)))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["None"] * len(cases), out.stdout + out.stderr


# 5. Symbolic links are followed


@pytest.mark.nvcc
def test_nothing_the_cache_writes_follows_a_symbolic_link(tmp_path, fake_build):
    """The lock folder, a lock file and an owner note planted as links: the lock folder and
    the lock file refused (a BuildError naming them), the note not written; their targets
    untouched."""
    cache = tmp_path / "cache"
    cache.mkdir()
    entry = f"{TF32.name}-{build._fingerprint(TF32, TF32_SOURCES, env.nvcc_version())[:16]}"
    victim = tmp_path / "ssh"
    victim.mkdir(mode=0o700)
    (cache / ".locks").symlink_to(victim)
    with pytest.raises(build.BuildError, match=r"\.locks is a symbolic link"):
        build.build(TF32, TF32_SOURCES, cache)
    assert victim.stat().st_mode & 0o777 == 0o700
    (cache / ".locks").unlink()
    (cache / ".locks").mkdir()
    bashrc = tmp_path / "bashrc"
    bashrc.write_text("mine\n")
    bashrc.chmod(0o600)
    (cache / ".locks" / f"{entry}.lock").symlink_to(bashrc)
    with pytest.raises(build.BuildError, match=r"cannot lock .*\.lock .*\(ELOOP\)"):
        build.build(TF32, TF32_SOURCES, cache)
    (cache / ".locks" / f"{entry}.lock").unlink()
    (cache / ".locks" / f"{entry}.owner").symlink_to(bashrc)
    assert build.build(TF32, TF32_SOURCES, cache).compiled
    assert bashrc.read_text() == "mine\n" and bashrc.stat().st_mode & 0o777 == 0o600


@pytest.mark.nvcc
def test_an_import_stages_in_a_private_folder_of_its_own(tmp_path, fake_build, monkeypatch):
    """Planted ``.tmp-import-<name>`` links to another folder receive nothing (of a valid
    entry, imported, nor of a damaged one, refused); the staging folder is private (0700) and
    a build's sweep meanwhile leaves it alone."""
    entry = forged(tmp_path)
    damaged = forged(tmp_path, key="c" * 64)
    (damaged / build.CUBIN).write_bytes(b"\x7fELF damaged")
    bundle = tmp_path / "bundle.tar.gz"
    with tarfile.open(bundle, "w:gz") as tar:
        for folder in (entry, damaged):
            tar.add(folder, arcname=folder.name)
    cache = tmp_path / "cache"
    cache.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for folder in (entry, damaged):
        (cache / f".tmp-import-{folder.name}").symlink_to(elsewhere)
    stagings = []
    mkdtemp = tempfile.mkdtemp

    def staging(*args, **kwargs):  # a concurrent build sweeps the cache meanwhile
        folder = Path(mkdtemp(*args, **kwargs))
        stagings.append((folder.name, folder.stat().st_mode & 0o777))
        build._sweep(cache, "another-entry")
        return str(folder)

    monkeypatch.setattr(tempfile, "mkdtemp", staging)
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(cache))
    assert cli.main(["cache", "import", str(bundle)]) == 0
    assert list(elsewhere.iterdir()) == [] and build.read_entry(cache / entry.name) is not None
    assert not (cache / damaged.name).exists()
    name, mode = stagings[0]
    assert name.startswith(".tmp-import-") and mode == 0o700


# 6. Tracebacks and a Python-version break


@pytest.mark.nvcc
def test_import_needs_no_extraction_filter(tmp_path, fake_build, monkeypatch, capsys):
    """Python 3.10.0-3.10.11 and 3.11.0-3.11.3 have no ``filter`` argument of
    ``TarFile.extractall``: an import works there."""
    entry = forged(tmp_path)
    bundle = tmp_path / "bundle.tar.gz"
    with tarfile.open(bundle, "w:gz") as tar:
        tar.add(entry, arcname=entry.name)
    extractall = tarfile.TarFile.extractall

    def without_filter(self, path=".", members=None, *, numeric_owner=False):
        return extractall(self, path, members, numeric_owner=numeric_owner)

    monkeypatch.setattr(tarfile.TarFile, "extractall", without_filter)
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(tmp_path / "cache"))
    assert cli.main(["cache", "import", str(bundle)]) == 0
    assert build.read_entry(tmp_path / "cache" / entry.name) is not None


def test_cli_errors_are_one_line(tmp_path):
    """A missing or non-tar archive, an unwritable ``bench --out``, a cache path that is a
    file, an invalid environment variable: one line on stderr naming the problem, a nonzero
    exit, no traceback."""
    text = tmp_path / "notes.txt"
    text.write_text("not an archive")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    home = {env.CACHE_DIR_VARIABLE: str(tmp_path / "cache")}
    cases = [(("cache", "import", str(tmp_path / "missing.tar.gz")), home,
              "cannot read the archive"),
             (("cache", "import", str(text)), home, "cannot read the archive"),
             (("bench", "--out", str(text / "out")), home, "--out .* is not a writable folder"),
             (("cache", "list"), {env.CACHE_DIR_VARIABLE: str(text)}, "is not a folder"),
             (("cache", "list"), {env.CACHE_DIR_VARIABLE: str(text / "sub")},
              f"cannot be made: {re.escape(str(text))} is not a folder"),
             (("cache", "list"), {env.CACHE_DIR_VARIABLE: str(dangling)},
              f"cannot be made: {re.escape(str(dangling))} is a link to nothing"),
             (("cache", "list"), {**home, CACHE_PATH: "relative"},
              CACHE_PATH),
             (("generate", "--problem", "71", "--precision", "tf32", "--layout", "nchw"),
              {env.CACHE_DIR_VARIABLE: str(tmp_path / "c"), env.BUILD_TIMEOUT_VARIABLE: "abc"},
              f"{env.BUILD_TIMEOUT_VARIABLE}='abc': seconds, a positive number"),
             (("cache", "import", str(damaged_xz(tmp_path))), home, "cannot read the archive")]
    for args, variables, expected in cases:
        out = run_cli(*args, **variables)
        lines = out.stderr.splitlines()
        assert out.returncode != 0 and len(lines) == 1, (args, out.stderr)
        assert re.search(expected, lines[0]), (args, out.stderr)


def test_info_names_a_search_path_folder_that_is_missing(tmp_path):
    """A folder of ``CUTLASS_CONVT_CACHE_PATH`` that does not exist (a typo) is named by
    ``info``, not passed over in silence."""
    missing = tmp_path / "prebuilt-typo"
    out = run_cli("info", **{env.CACHE_DIR_VARIABLE: str(tmp_path / "cache"),
                             CACHE_PATH: str(missing)})
    assert out.returncode == 0, out.stderr
    assert f"read-only cache: {missing} (missing or not a folder: not searched)" in out.stdout


def test_info_with_a_bad_cache_variable_still_prints_the_versions(tmp_path):
    """A relative ``CUTLASS_CONVT_CACHE_DIR`` makes ``info`` exit 1 with one line naming the
    variable on stderr, after the lines on versions and GPUs (what a user needs to see)."""
    out = run_cli("info", **{env.CACHE_DIR_VARIABLE: "relative/cache"})
    assert out.returncode == 1
    assert out.stdout.startswith("cutlass_convt ") and "torch " in out.stdout
    assert "kernel cache" not in out.stdout
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and "relative/cache" in lines[0], out.stderr


@pytest.mark.nvcc
def test_list_and_export_read_no_cache_a_build_refuses(tmp_path, fake_build, monkeypatch, capsys):
    """``cache list`` and ``export`` of a cache folder that others can write (its own
    entries inside): no entries listed, the folder and why on stderr, and no archive (exit 1),
    as a build reads none there."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(cache))
    build.build(TF32, TF32_SOURCES, cache)
    cache.chmod(0o777)
    capsys.readouterr()
    assert cli.main(["cache", "list"]) == 0
    out, err = capsys.readouterr()
    assert out.endswith(f"0 entries in {cache}\n")
    assert err.startswith(f"{cache}: not served: the cache folder is writable by")
    assert cli.main(["cache", "export", str(tmp_path / "out.tar.gz")]) == 1
    assert capsys.readouterr().err.startswith(f"cutlass-convt: {cache} is not exported: the "
                                              "cache folder is writable by")
    assert not (tmp_path / "out.tar.gz").exists()


def damaged_xz(folder: Path) -> Path:
    """An xz-compressed tar archive with its compressed bytes damaged in the middle (xz's
    decompressor raises its own error, not an OSError)."""
    member = folder / "payload"
    member.write_bytes(os.urandom(1 << 16))
    archive = folder / "damaged.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(member, arcname="entry-0123456789abcdef/payload")
    data = bytearray(archive.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 100):
        data[i] ^= 0x33
    archive.write_bytes(bytes(data))
    return archive


def test_an_invalid_extension_variable_warns_and_commands_run(tmp_path):
    """``CUTLASS_CONVT_EXTENSION`` with a value of none of its modes: a warning naming it at
    import (the Python per-call path); a command that does not read it runs, and
    ``generate``, which builds the C++ library where the variable says so, ends in one line
    naming it. No traceback."""
    variables = {env.CACHE_DIR_VARIABLE: str(tmp_path / "cache"), env.EXTENSION_VARIABLE: "bogus"}
    named = f"{env.EXTENSION_VARIABLE}='bogus': one of auto, on, off"
    out = run_cli("cache", "list", **variables)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert named in out.stderr and "RuntimeWarning" in out.stderr
    out = run_cli("generate", "--problem", "71", "--precision", "tf32", "--layout", "nchw",
                  **variables)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.splitlines()[-1].endswith(named), out.stderr


def test_cache_clear_of_other_users_entries_says_which_it_kept(tmp_path, monkeypatch, capsys):
    """``cache clear`` where another user's entries cannot be removed (PermissionError, as a
    user who is not root meets them): one line per folder kept, exit status 1."""
    names = ("dgrad_k3-0123456789abcdef", "strip_k3-0123456789abcdef")
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / build.MANIFEST).write_text("{}")
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(tmp_path))

    def denied(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(Path(path) / build.MANIFEST))

    monkeypatch.setattr(shutil, "rmtree", denied)
    assert cli.main(["cache", "clear"]) == 1
    out, err = capsys.readouterr()
    assert out == f"removed 0 entries from {tmp_path}\n"
    assert err.splitlines() == [f"cannot remove {tmp_path / name} (owned by root): Permission "
                                "denied (EACCES)" for name in names]


@pytest.mark.nvcc
def test_an_invalid_build_variable_names_itself_and_auto_falls_back(tmp_path, monkeypatch,
                                                                    fresh_plans, fake_cuda):
    """CUTLASS_CONVT_BUILD_TIMEOUT=abc: a ConfigError naming it; a build raises it as a
    BuildError, so ``backend="auto"`` runs PyTorch's route with a warning that says so (the
    kernel's load, which needs a GPU, replaced by its build alone)."""
    from cutlass_convt import ops, problems

    monkeypatch.setenv(env.BUILD_TIMEOUT_VARIABLE, "abc")
    with pytest.raises(ValueError, match=f"{env.BUILD_TIMEOUT_VARIABLE}='abc'"):
        env.build_timeout()
    monkeypatch.setattr(ops, "prepare_config",
                        lambda spec, config, device=None: build_config(config, None))
    spec = problems.find("kernelbench-71").spec("tf32", 90)
    with pytest.warns(RuntimeWarning, match=f"could not be built .*{env.BUILD_TIMEOUT_VARIABLE}"):
        assert isinstance(ops.route(spec, "auto", 0), ops.TorchRoute)
    with pytest.raises(build.BuildError, match=env.BUILD_TIMEOUT_VARIABLE):
        ops.route(spec, "cutlass", 0)


# 5. The folders above a cache (StrictModes)


def planted_cache(folder: Path, uid: int, work: Path) -> Path:
    """A read-only cache ``folder`` (created) holding a stand-in TF32 entry (built under
    ``work``), all of it owned by ``uid``."""
    folder.mkdir()
    entry = forged(work)
    shutil.copytree(entry, folder / entry.name)
    chown_tree(folder, uid)
    return folder / entry.name


@pytest.mark.nvcc
def test_a_cache_folder_anyone_could_have_made_or_renamed_is_refused(open_folder, other_user,
                                                                     fake_build, monkeypatch,
                                                                     caplog, capsys):
    """A search-path folder squatted in a sticky folder every user can write (``/tmp/prebuilt``
    missing, another user makes it) and one under a group-writable folder (whose members could
    rename it and plant their own): neither serves, one warning each naming the folder and why;
    no kernel is built into a cache below such a folder. The same third user's cache under
    folders only root can write serves, and ``info`` names its owner."""
    sticky = open_folder / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    proj = open_folder / "proj"
    proj.mkdir()
    proj.chmod(0o2775)
    squatted = planted_cache(sticky / "prebuilt", other_user.pw_uid, open_folder)
    renamed = planted_cache(proj / "prebuilt", other_user.pw_uid, open_folder)
    for cache, why in (
            (squatted.parent, f"{squatted.parent} is owned by {other_user.pw_name} directly "
                              f"under {sticky}, a sticky folder others can write"),
            (renamed.parent, f"{proj}, a folder above it, is writable by its group (mode 2775)")):
        monkeypatch.setenv(CACHE_PATH, str(cache))
        caplog.clear()
        built = build.build(TF32, TF32_SOURCES, open_folder / "own")
        assert built.compiled and built.path.parent == open_folder / "own"
        shutil.rmtree(open_folder / "own")
        assert [r.getMessage().split(" (anyone")[0].split(" (loading")[0] for r in caplog.records
                if "not loading" in r.getMessage()] == [f"cutlass_convt: not loading {cache}: "
                                                        f"{why}"]
    with pytest.raises(build.BuildError, match=f"{proj}, a folder above it, is writable"):
        build.build(TF32, TF32_SOURCES, proj / "own")
    proj.chmod(0o755)
    monkeypatch.setenv(CACHE_PATH, str(renamed.parent))
    assert build.build(TF32, TF32_SOURCES, open_folder / "own").path == renamed
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(open_folder / "own"))
    capsys.readouterr()
    assert cli.main(["info"]) == 0
    assert (f"read-only cache: {renamed.parent} (owner {other_user.pw_name}, 1 entry)"
            in capsys.readouterr().out)



@pytest.mark.nvcc
def test_a_link_on_the_way_to_a_cache_counts_where_it_is(open_folder, other_user, fake_build,
                                                         monkeypatch, caplog):
    """A symbolic link on the path to a cache is judged where it is, its target walked too: a
    link in a folder every user can write (anyone could replace it) and another user's link
    in a sticky folder (anyone could have made it) refuse a search-path cache whose target is
    safe; the same link in a folder only root can write serves it."""
    (open_folder / "safe").mkdir()
    target = planted_cache(open_folder / "safe" / "prebuilt", other_user.pw_uid, open_folder)
    shared = open_folder / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "link").symlink_to(target.parent)
    sticky = open_folder / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "link").symlink_to(target.parent)
    os.chown(sticky / "link", other_user.pw_uid, -1, follow_symlinks=False)
    (open_folder / "link").symlink_to(target.parent)
    for cache, why in ((shared / "link", f"{shared}, a folder above it, is writable by its "
                                         "group and every user (mode 777)"),
                       (sticky / "link", f"{sticky / 'link'} is owned by {other_user.pw_name} "
                                         f"directly under {sticky}")):
        owner, refusal = build.path_refusal(cache)
        assert owner is None and why in refusal, refusal
        monkeypatch.setenv(CACHE_PATH, str(cache))
        caplog.clear()
        built = build.build(TF32, TF32_SOURCES, open_folder / "own")
        assert built.compiled
        shutil.rmtree(open_folder / "own")
    monkeypatch.setenv(CACHE_PATH, str(open_folder / "link"))
    assert build.build(TF32, TF32_SOURCES, open_folder / "own").path.name == target.name


def test_a_umask_of_002_makes_caches_that_serve(tmp_path, monkeypatch):
    """Under a umask of 002 the cache's missing parents are made 0755 (not group-writable), and
    a group-writable folder whose group is its owner's private group serves (Debian's
    StrictModes rule); root's group never counts as private."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to make a user with a private group")
    old = os.umask(0o002)
    try:
        cache = tmp_path / "a" / "b" / "cache"
        build.own_folder(cache)
        assert [(p.stat().st_mode & 0o777) for p in (tmp_path / "a", tmp_path / "a" / "b",
                                                     cache)] == [0o755] * 3
    finally:
        os.umask(old)
    name = f"cc49{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--user-group", "--no-create-home", "--shell",
                    "/usr/sbin/nologin", name], check=True, capture_output=True)
    try:
        user = pwd.getpwnam(name)
        private = tmp_path / "private"
        private.mkdir()
        os.chown(private, user.pw_uid, user.pw_gid)
        private.chmod(0o775)
        assert build.path_refusal(private) == (user.pw_uid, "")
        os.chown(private, user.pw_uid, 0)  # root's group: others in it could write
        assert "writable by its group" in build.path_refusal(private)[1]
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)


# 6. Tuning records


def kernelbench_71():
    from cutlass_convt import choose, problems

    spec = problems.find("kernelbench-71").spec("tf32", 90)
    return spec, choose.choose_config(spec)


def test_tuning_records_are_read_as_entries_are(tmp_path, monkeypatch, other_user):
    """A FIFO in a record's place (a blocking read would hang every call of the problem) and a
    valid record another user owns: the default choice, at once; a record written through a
    ``tuning`` link is refused."""
    from cutlass_convt import choose

    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(tmp_path / "cache"))
    spec, default = kernelbench_71()
    path = choose.record_path(spec, MACHINE)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    chosen = []
    worker = threading.Thread(target=lambda: chosen.append(choose.choose_config(
        spec, machine=MACHINE)),
                              daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # the old blocking read: release it, then fail
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    assert chosen == [default]
    path.unlink()
    torch_record = {"spec": dataclasses.asdict(spec), "winner_family": "torch", "winner": {}}
    path.write_text(json.dumps(torch_record))
    choose.clear_cache()
    assert choose.choose_config(spec, torch_ok=True, machine=MACHINE) is choose.TORCH
    os.chown(path, other_user.pw_uid, -1)
    choose.clear_cache()
    assert choose.choose_config(spec, torch_ok=True, machine=MACHINE) == default
    shutil.rmtree(path.parent)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path.parent.symlink_to(elsewhere)
    with pytest.raises(build.BuildError, match="tuning is a symbolic link"):
        choose.save_record(spec, MACHINE, torch_record)
    assert list(elsewhere.iterdir()) == []


def test_a_record_s_values_are_exactly_of_their_types(tmp_path, monkeypatch, capsys):
    """A record whose winner is the default with 64.0 for 64 (equal in Python, but a float in
    kernel names and nvcc flags): the choice is our own candidate (ints), and an import refuses
    the record."""
    from cutlass_convt import choose

    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(tmp_path / "cache"))
    spec, default = kernelbench_71()
    fields = dataclasses.asdict(default)
    name = next(k for k, v in fields.items() if type(v) is int and v > 1)
    for value in (float(fields[name]),):
        record = {"spec": dataclasses.asdict(spec), "machine": [list(p) for p in MACHINE],
                  "winner_family": choose.family_of(default).name,
                  "winner": {**fields, name: value}}
        path = choose.record_path(spec, MACHINE)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))
        choose.clear_cache()
        chosen = choose.choose_config(spec, machine=MACHINE)
        assert chosen == default and type(getattr(chosen, name)) is int
        path.unlink()
        bundle = tmp_path / "float.tar.gz"
        with tarfile.open(bundle, "w:gz") as tar:
            add_bytes(tar, f"tuning/{path.name}", json.dumps(record).encode())
        assert cli.main(["cache", "import", str(bundle)]) == 1
        assert f"{name} = {value!r} is not of type int" in capsys.readouterr().err


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


# 7. Malformed JSON and variables: errors, not tracebacks


DEEP = ("[" * 30000 + "]" * 30000).encode()  # nested past the recursion limit, within the caps


@pytest.mark.nvcc
def test_malformed_manifests_records_and_variables_give_no_traceback(tmp_path, fake_build,
                                                                     monkeypatch, capsys):
    """A deeply nested manifest or record, ``"kernel": 123``, a ``built_at`` of "yesterday" or
    Infinity, an unknown user's ``~user`` or a relative path in the cache variables: each is
    refused or reported (the variable named), never a traceback."""
    from cutlass_convt import choose

    built = build.build(TF32, TF32_SOURCES, tmp_path / "src")
    deep = tmp_path / "deep" / built.path.name
    shutil.copytree(built.path, deep)
    (deep / build.MANIFEST).write_bytes(DEEP)
    assert build.inspect_entry(deep) == (None, "")
    cache = tmp_path / "cache"
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(cache))
    spec, default = kernelbench_71()
    bundle = tmp_path / "bad.tar.gz"
    number = rewrite_manifest(forged(tmp_path, FP32), kernel=123)
    with tarfile.open(bundle, "w:gz") as tar:
        tar.add(number, arcname=number.name)
        add_bytes(tar, f"tuning/{choose.record_path(spec, MACHINE).name}", DEEP)
    assert cli.main(["cache", "import", str(bundle)]) == 1
    err = capsys.readouterr().err
    assert "kernel" in err and "not a tuning record (nested too deeply)" in err
    choose.record_path(spec, MACHINE).parent.mkdir(parents=True)
    choose.record_path(spec, MACHINE).write_bytes(DEEP)
    assert choose.choose(spec, machine=MACHINE) == default
    for when in ("yesterday", float("inf")):
        dated = forged(tmp_path / str(when))
        manifest = json.loads((dated / build.MANIFEST).read_text())
        (dated / build.MANIFEST).write_text(json.dumps({**manifest, "built_at": when}))
        with tarfile.open(bundle, "w:gz") as tar:
            tar.add(dated, arcname=dated.name)
        assert cli.main(["cache", "import", str(bundle)]) == 0
        assert cli.main(["cache", "list"]) == 0
        assert f"{dated.name} " in capsys.readouterr().out
        shutil.rmtree(cache / dated.name)
    for variable, value in ((env.CACHE_DIR_VARIABLE, "~nosuchuser49/x"),
                            (CACHE_PATH, "~nosuchuser49/x"),
                            (env.CACHE_DIR_VARIABLE, "relative/cache")):
        out = run_cli("cache", "list", **{variable: value})
        assert out.returncode == 1 and f": {variable}: {value!r}" in out.stderr, out.stderr


# 8. Archive names and caps


@pytest.mark.nvcc
def test_an_import_reads_only_regular_files_and_stops_at_the_first_member_over_a_cap(
        tmp_path, monkeypatch, capsys):
    """``cache import`` of a FIFO, a device (``/dev/zero``) or a folder: one line, exit 1, at
    once (a FIFO blocked and ``/dev/zero`` spun until killed). An archive whose first member
    is over a file's cap, its compressed data cut short after the header: refused whole by that
    header, before its data is decompressed to reach the next header (a small bzip2 bomb took
    minutes before; here the cut would end the read in 'cannot read the archive')."""
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(tmp_path / "cache"))
    fifo = tmp_path / "pipe.tar"
    os.mkfifo(fifo)
    for file in (fifo, Path("/dev/zero"), tmp_path):
        assert cli.main(["cache", "import", str(file)]) == 1
        assert capsys.readouterr().err == (f"cutlass-convt: cannot read the archive {file}: not a "
                                           "regular file\n")
    monkeypatch.setattr(build, "MAX_FILE_BYTES", 2**20)
    bomb = tmp_path / "bomb.tar.gz"
    with tarfile.open(bomb, "w:gz") as tar:
        add_bytes(tar, "dgrad_k3-0123456789abcdef/cubin", bytes(8 * 2**20))
    data = bomb.read_bytes()
    bomb.write_bytes(data[:len(data) // 3])
    assert cli.main(["cache", "import", str(bomb)]) == 1
    assert capsys.readouterr().err == (
        f"cutlass-convt: the archive {bomb} has dgrad_k3-0123456789abcdef/cubin of "
        f"{8 * 2**20} bytes, over the cap of {2**20} a file: refused whole\n")
    assert not (tmp_path / "cache").exists()


def test_cache_clear_follows_no_link_another_user_could_have_planted(open_folder, other_user,
                                                                     monkeypatch, capsys):
    """A cache folder named through another user's link in a sticky folder (``/tmp``), which
    leads to one's own cache: ``cache clear`` refuses it in one line (exit 1) and one's own
    cache keeps its entries (clear removed them before; list, export and builds refused it)."""
    own = open_folder / "own"
    own.mkdir()
    entry = own / "dgrad_k3-0123456789abcdef"
    entry.mkdir()
    (entry / build.MANIFEST).write_text("{}")
    sticky = open_folder / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    link = sticky / "cache"
    link.symlink_to(own)
    os.chown(link, other_user.pw_uid, -1, follow_symlinks=False)
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(link))
    assert cli.main(["cache", "clear"]) == 1
    assert capsys.readouterr().err == (f"cutlass-convt: {link} is not cleared: {link} is owned "
                                       f"by {other_user.pw_name} directly under {sticky}, a sticky "
                                       "folder others can write (anyone could have made it)\n")
    assert entry.is_dir()


def test_an_import_has_caps_and_takes_only_listed_files_and_plain_names(tmp_path, fake_build,
                                                                         monkeypatch, capsys):
    """An entry name with a newline (which would forge an output line) is refused on one line;
    an entry's files its manifest does not list are left out; an archive over a cap of members,
    records or bytes is refused whole, nothing written."""
    from cutlass_convt import archive

    entry = forged(tmp_path)
    cache = tmp_path / "cache"
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(cache))
    bundle = tmp_path / "bundle.tar.gz"
    forged_line = f"x\nimported {entry.name}-{'0' * 16}"
    with tarfile.open(bundle, "w:gz") as tar:
        tar.add(entry, arcname=entry.name)
        add_bytes(tar, f"{entry.name}/unlisted.so", b"\x7fELF")
        add_bytes(tar, f"{forged_line}/{build.MANIFEST}", b"{}")
    assert cli.main(["cache", "import", str(bundle)]) == 0
    assert len(capsys.readouterr().err.splitlines()) == 1
    assert not (cache / entry.name / "unlisted.so").exists()
    assert build.read_entry(cache / entry.name) is not None
    shutil.rmtree(cache)
    for cap, value in (("MAX_MEMBERS", 3), ("MAX_RECORDS", 0), ("MAX_IMPORT_BYTES", 100)):
        with monkeypatch.context() as patch:
            patch.setattr(archive, cap, value)
            with tarfile.open(bundle, "w:gz") as tar:
                tar.add(entry, arcname=entry.name)
                add_bytes(tar, f"tuning/{'0' * 24}.json", b"{}")
            assert cli.main(["cache", "import", str(bundle)]) == 1
            assert "over the cap of" in capsys.readouterr().err
            assert not cache.exists()

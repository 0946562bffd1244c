"""The kernel cache as a trust boundary (CPU): the attacks of a co-user of a shared cache, of a
planted or crafted archive, of manifests that reach outside their entry and of symbolic links in
the cache's own folders, each refused; the search path of read-only caches; clean errors."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pwd
import shutil
import subprocess
import sys
import tarfile
import tempfile
import uuid
from pathlib import Path

import pytest

from cutlass_convt import build, cli, env

from helpers import FP32, TF32, TF32_SOURCES, compile_only_a_cubin


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
        tmp_path, other_user, fake_build, monkeypatch, caplog):
    """An administrator's prebuilt cache (its owner another user, read-only) on
    CUTLASS_CONVT_CACHE_PATH serves its entries, after the user's own cache, and is never
    written; its entries owned by a third user, or writable by others, are skipped."""
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
    monkeypatch.setenv(env.CACHE_PATH_VARIABLE, f"{tmp_path / 'missing'}{os.pathsep}{shared}")
    own = tmp_path / "own"
    assert build.build(TF32, TF32_SOURCES, own).path == served
    assert not own.exists()
    rebuilt = build.build(FP32, build_sources(FP32), own)
    assert rebuilt.compiled and rebuilt.path.parent == own
    assert any(f"not loading {shared / fp32.name}: its folder is owned by uid 4242" in
               r.getMessage() for r in caplog.records)
    assert snapshot(shared) == before
    mine = own / served.name  # the user's own cache comes first
    shutil.copytree(served, mine)
    assert build.build(TF32, TF32_SOURCES, own).path == mine
    monkeypatch.setenv(env.CACHE_PATH_VARIABLE, "relative/cache")
    with pytest.raises(build.BuildError, match=f"{env.CACHE_PATH_VARIABLE}: 'relative/cache' "
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
    assert "imported 1 entries and 0 tuning records" in out
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
    record = {"spec": dataclasses.asdict(spec),
              "winner_family": choose.family_of(config).name,
              "winner": dataclasses.asdict(config)}
    name = choose.record_path(spec).name
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
    assert "imported 0 entries and 1 tuning records" in out
    assert err.splitlines() == [
        f"skipped tuning/{'0' * 24}.json: not the record of the problem it names (or of "
        "another CUTLASS version)",
        f"skipped tuning/{'1' * 24}.json: not a tuning record (KeyError: '../evil')"]
    assert json.loads((cache / "tuning" / name).read_text()) == json.loads(json.dumps(record))
    assert cli.main(["cache", "import", str(kept)]) == 1
    assert "the cache has a record of this problem already" in capsys.readouterr().err

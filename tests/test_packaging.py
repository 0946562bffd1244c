"""The package as pip installs it (not only the editable checkout): the wheel holds every
module, template and case file the code reads, and the license."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_the_wheel_holds_every_module_and_data_file(tmp_path):
    """Built from a copy of the sources (a stale ``build/`` folder could hide a gap). Its
    metadata names the license (BSD-3-Clause) and it carries the LICENSE file."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", "build", "generated", ".venv", ".whl", "*.egg-info", "__pycache__", "results"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path), str(source)], check=True,
                   capture_output=True)
    (wheel,) = tmp_path.glob("cutlass_convt-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    package = ROOT / "cutlass_convt"
    expected = {str(p.relative_to(ROOT)) for pattern in ("*.py", "templates/*.c*", "cases/*.json")
                for p in package.rglob(pattern) if "__pycache__" not in p.parts}
    assert expected and expected <= names, sorted(expected - names)
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info/"
    metadata = zipfile.ZipFile(wheel).read(dist_info + "METADATA").decode().splitlines()
    assert "License: BSD-3-Clause" in metadata and "License-File: LICENSE" in metadata
    (license,) = [n for n in names if n.startswith(dist_info) and n.endswith("/LICENSE")]
    assert zipfile.ZipFile(wheel).read(license) == (ROOT / "LICENSE").read_bytes()

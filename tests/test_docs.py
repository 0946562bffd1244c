"""The documentation against the code: the README's "what runs where" table is the registry's,
and every file the README, the design pages and the code name exists."""

from __future__ import annotations

import re
from pathlib import Path

from cutlass_convt import choose

ROOT = Path(__file__).parents[1]


def test_readme_table_is_the_registry_s():
    readme = (ROOT / "README.md").read_text()
    table = re.search(r"<!-- what-runs-where[^>]*-->\n(.*?)<!-- end what-runs-where -->",
                      readme, re.S)
    assert table, "the README's what-runs-where markers are missing"
    assert table.group(1) == choose.what_runs_where(), (
        "README.md's table differs from cutlass_convt.choose.what_runs_where(): paste its output")


def test_named_files_exist():
    """Paths like ``docs/design/strip.md``, ``templates/strip.cu`` or ``scripts/bench.py`` in
    the README, the design pages and the package's sources name files of this tree."""
    texts = [ROOT / "README.md", *sorted((ROOT / "docs" / "design").glob("*.md")),
             *sorted((ROOT / "cutlass_convt").rglob("*.py")),
             *sorted((ROOT / "cutlass_convt" / "templates").glob("*.cu*")),
             *sorted((ROOT / "scripts").glob("*.py"))]
    pattern = re.compile(r"\b((?:docs|scripts|templates|cutlass_convt|results|tests)/"
                         r"[\w./-]*\w\.(?:md|py|cu|cuh|json|png))\b")
    missing = set()
    for path in texts:
        for name in pattern.findall(path.read_text()):
            candidates = [ROOT / name, ROOT / "cutlass_convt" / name]
            if not any(c.exists() for c in candidates):
                missing.add(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, sorted(missing)

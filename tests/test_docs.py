"""The documentation against the code: the README's "what runs where" table is the registry's,
every file the README, the design pages and the code name exists, the README lists every
design page, generated/README.md every family, and the README's CPU usage line runs."""

from __future__ import annotations

import re
import subprocess
import sys
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


def _section(text: str, title: str) -> str:
    """The body of the README section ``## title``, up to the next ``## `` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"no section '## {title}'"
    return match.group(1)


def test_readme_names_every_design_page():
    """"Code and design" names each page of ``docs/design/`` (the overview by its path), and
    every family of the registry has its page."""
    section = _section((ROOT / "README.md").read_text(), "Code and design")
    pages = sorted((ROOT / "docs" / "design").glob("*.md"))
    missing = [p.name for p in pages if f"`{p.name}`" not in section
               and f"`docs/design/{p.name}`" not in section]
    assert not missing, f"README.md's 'Code and design' does not name {missing}"
    without = [f.name for f in choose.FAMILIES if f"{f.name}.md" not in {p.name for p in pages}]
    assert not without, f"families without a page in docs/design/: {without}"


def test_generated_readme_names_every_family():
    """generated/README.md spells every family's kernel names (``phase_...``) and lists the
    files of each family's builds in its table; the layout passes are built beside them."""
    text = (ROOT / "generated" / "README.md").read_text()
    in_table = {name for row in re.findall(r"^\|[^|]*\|([^|]*)\|", text, re.M)
                for name in row.strip().split(", ")}
    for name in [f.name for f in choose.FAMILIES] + ["layout"]:
        assert f"`{name}_...`" in text, f"generated/README.md does not name {name}'s kernels"
        assert name in in_table, f"generated/README.md's table has no row for {name}"


def test_readme_cpu_usage_line_runs():
    """The CPU-only set-up's ``python -c`` line runs on PyTorch's route and prints what the
    README says, with the RuntimeWarning that says why."""
    section = _section((ROOT / "README.md").read_text(), "Set up and test: a CPU-only machine")
    (code,) = re.findall(r'^python -c "(.*)"$', section, re.M)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "`torch.Size([1, 2, 11, 11])`" in section
    assert out.stdout == "torch.Size([1, 2, 11, 11])\n"
    assert "RuntimeWarning" in out.stderr and "tensors on cpu" in out.stderr, out.stderr

"""The interface between Python and our C++: every struct Python packs, every ABI number and
every constant both sides use, read from the templates and held against the family modules
(one source each: a change on one side fails here until the other follows)."""

from __future__ import annotations

import re

import pytest

from cutlass_convt import choose, emit
from cutlass_convt.families import dgrad, direct, fprop_sm90, layout, strip


def _struct_fields(text: str, name: str) -> list[tuple[str, bool]]:
    """The fields of ``struct name { ... };`` in C++ ``text`` as (name, is a pointer), in order
    (comments dropped; ``int a, b;`` gives two ints)."""
    body = re.search(rf"struct {name} \{{(.*?)\n\}};", text, re.S)
    assert body, f"struct {name} not found"
    code = re.sub(r"//[^\n]*", "", body.group(1))
    fields = []
    for declaration in filter(None, (d.strip() for d in code.split(";"))):
        pointer = "*" in declaration
        names = declaration.replace("*", " ").split(None, 1)[1] if not pointer else \
            declaration.split("*", 1)[1]
        for field in names.split(","):
            fields.append((field.strip().split()[-1], pointer))
    return fields


def _constant(text: str, name: str) -> int:
    """The value of ``constexpr int name = N;`` in ``text``."""
    found = re.search(rf"constexpr int {name} = (\d+);", text)
    assert found, f"{name} not found"
    return int(found.group(1))


@pytest.mark.parametrize("params, template", [(strip.STRIP_PARAMS, "strip_common.cuh"),
                                              (direct.DIRECT_PARAMS, "direct.cu")],
                         ids=["StripParams", "DirectParams"])
def test_param_structs_match_their_cpp_struct(params, template):
    """Field names and kinds in the same order, and the C++ ``static_assert`` on the size."""
    text = emit.template(template)
    fields = _struct_fields(text, params.name)
    assert fields == [(f, True) for f in params.pointers] + [(f, False) for f in params.ints]
    size = re.search(rf"static_assert\(sizeof\({params.name}\) == (\d+)", text)
    assert size and int(size.group(1)) == params.size


@pytest.mark.parametrize("module, template", [(dgrad, "dgrad_host.cu"),
                                              (fprop_sm90, "fprop_sm90_host.cu")],
                         ids=["dgrad", "fprop_sm90"])
def test_abi_versions_match_the_host_libraries(module, template):
    version = re.search(r"int cutlass_convt_abi_version\(\) \{ return (\d+); \}",
                        emit.template(template))
    assert version and int(version.group(1)) == module.ABI_VERSION


def test_constants_shared_with_the_templates():
    """The host-library return codes, the edge kernel's block and the layout passes' tile."""
    host = emit.template("fprop_sm90_host.cu")
    assert _constant(host, "kDriverMissing") == fprop_sm90.DRIVER_MISSING
    assert _constant(host, "kEncodeFailed") == fprop_sm90.ENCODE_FAILED
    rs = emit.template("strip_rs.cu")
    assert (_constant(rs, "kEdgeThreads"), _constant(rs, "kEdgePixels")) == (
        strip.EDGE_THREADS, strip.EDGE_PIXELS)
    passes = emit.template("layout.cu")
    assert (_constant(passes, "kTileC"), _constant(passes, "kTilePixels"),
            _constant(passes, "kRows")) == (layout.LayoutKernels.TILE_C,
                                            layout.LayoutKernels.TILE_PIXELS,
                                            layout.LayoutKernels.ROWS)


def test_every_entry_point_is_a_kernel_of_its_device_template():
    """Each symbol a family's sources name is an ``extern "C" __global__`` function of the
    template compiled into the cubin (the launcher looks it up by that name)."""
    from helpers import CASE

    specs = [CASE.spec(p, arch) for p in ("tf32", "fp32") for arch in (80, 90)]
    seen = set()
    for family in choose.FAMILIES:
        for spec in specs:
            if family.unsupported_reasons(spec):
                continue
            for config in family.candidates(spec):
                for built, sources in family.builds(config):
                    text = emit.template(sources.device)
                    for symbol in sources.symbols:
                        assert re.search(rf'extern "C" __global__[^;{{]*?\b{symbol}\(', text,
                                         re.S), (sources.device, symbol)
                        seen.add(symbol)
    assert seen >= {strip.STRIP_SYMBOL, strip.STRIP_EDGE_SYMBOL, direct.DIRECT_SYMBOL,
                    fprop_sm90.FPROP_SM90_SYMBOL, dgrad.DGRAD_SYMBOL}
    passes = layout.LAYOUT.sources(layout.LayoutConfig(90))
    assert passes.symbols == layout.SYMBOLS and len(set(layout.SYMBOLS)) == 4

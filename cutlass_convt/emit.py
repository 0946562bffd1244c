"""C++ text from Python: our templates by name, and the ``config.h`` that configures our own
kernels. Pure: data in, text out.

The templates (``cutlass_convt/templates/``) are read as they are; what changes per
configuration is the emitted header each build writes beside them (``config.h`` of our own
kernels, from :func:`config_header`; ``operation.h`` of CUTLASS's kernels, from
``cutlass_library`` in the CUTLASS families' modules).
"""

from __future__ import annotations

import functools
from importlib import resources


@functools.lru_cache(maxsize=None)
def template(name: str) -> str:
    """The text of one of our C++ files in ``templates/`` (``strip.cu``, ``common.cuh``, ...)."""
    return (resources.files(__package__) / "templates" / name).read_text()


def config_header(name: str, constants: dict[str, int], flags: dict[str, bool]) -> str:
    """A ``config.h`` of our own kernels: ``constexpr`` ints and bools, under a comment naming
    the kernel ``name``."""
    return "\n".join([
        f"// cutlass_convt kernel {name}",
        "#pragma once",
        *(f"constexpr int {k} = {v};" for k, v in constants.items()),
        *(f"constexpr bool {k} = {str(v).lower()};" for k, v in flags.items()),
        "",
    ])

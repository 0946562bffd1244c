"""The op's per-call path in C++ (``templates/dispatch.cpp``): the CUDA, Autograd, AutocastCUDA
and AutocastCPU kernels of ``cutlass_convt::conv_transpose2d`` and the CUDA kernel of its
backward, with the table of remembered routes (``docs/design/overview.md``, "The op").

Built like the kernels: emitted and compiled by nvcc at first use against the installed
PyTorch's headers and libraries, cached in the kernel cache (:func:`cutlass_convt.build.build`)
under a key of PyTorch's version, build, C++ ABI and folder and of the compiler, and reused by
later processes; the first build is announced by the cache's logged warning. Loading it runs
its code in this process, so it serves under the kernels' trust rules (an entry that someone
else could have written is not loaded). ``pip install`` stays pure Python: where the library
cannot be built or loaded, the op's Python kernels run instead, with one warning.

:func:`load` is called once, by :mod:`cutlass_convt.ops` at import, after the op's schemas are
defined and before any Python kernel is registered for a key the library implements.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from . import build, env
from .args import user_stacklevel
from .build import Sources


@dataclass(frozen=True)
class DispatchConfig:
    """The build of the C++ per-call path for one PyTorch: its version and git commit, its
    C++ ABI (``_GLIBCXX_USE_CXX11_ABI``), its package folder (headers, libraries; the
    library's run path), its CUDA version (None: a CPU build) and which TF32 API its
    ``ATen/Context.h`` has (2: the (backend, op) enums, 1: strings, 0: ``allowTF32CuDNN``)."""

    torch_version: str
    torch_git: str
    cxx11_abi: bool
    torch_dir: str
    torch_cuda: str | None
    fp32_api: int
    name: str = "dispatch"


def _fp32_api(include: Path) -> int:
    """Which TF32 getter the headers under ``include`` declare (see :class:`DispatchConfig`)."""
    try:
        text = (include / "ATen" / "Context.h").read_text(errors="replace")
    except OSError:
        return 0
    if "float32Precision(Float32Backend" in text:
        return 2
    if "float32Precision(const std::string" in text or "float32Precision(\n" in text:
        return 1
    return 0


def config() -> DispatchConfig:
    """The build for the PyTorch this process imported."""
    root = Path(torch.__file__).resolve().parent
    return DispatchConfig(torch.__version__, str(torch.version.git_version),
                          bool(torch._C._GLIBCXX_USE_CXX11_ABI), str(root), torch.version.cuda,
                          _fp32_api(root / "include"))


def sources(config: DispatchConfig) -> Sources:
    """The host library alone (no device code), against the headers and libraries of
    ``config``'s PyTorch (C++20, as PyTorch's own extensions are built)."""
    root = Path(config.torch_dir)
    include, lib = root / "include", root / "lib"
    cuda = config.torch_cuda is not None  # (replays programs: c10's CUDA streams, the driver)
    return Sources(None, host=("dispatch.cpp",), cutlass=False, std="c++20",
                   host_flags=(f"-I{include}", f"-I{include / 'torch/csrc/api/include'}",
                               f"-D_GLIBCXX_USE_CXX11_ABI={int(config.cxx11_abi)}",
                               f"-DCUTLASS_CONVT_FP32_API={config.fp32_api}",
                               f"-DCUTLASS_CONVT_WITH_CUDA={int(cuda)}",
                               "-Xlinker", "--no-undefined", "-Xlinker", f"-rpath={lib}"),
                   host_libs=(f"-L{lib}", "-lc10", *(("-lc10_cuda",) if cuda else ()),
                              "-ltorch_cpu", "-ltorch", "-ldl"))


@functools.lru_cache(maxsize=None)
def load() -> bool:
    """Build (cached) and load the library where :func:`cutlass_convt.env.extension_mode`
    says so; whether it is loaded. With ``"auto"``, a build or load failure is a
    ``RuntimeWarning`` and the Python kernels run; with ``"on"`` it raises
    :class:`~cutlass_convt.BuildError` (or what loading raises). An invalid value of the
    variable is a ``RuntimeWarning`` naming it, and the Python kernels run."""
    try:
        mode = env.extension_mode()
    except env.ConfigError as e:  # at import: every command and program would stop on it
        warnings.warn(f"cutlass_convt: the op's per-call path runs in Python: {e}",
                      RuntimeWarning, stacklevel=user_stacklevel())
        return False
    if mode == "off" or (mode == "auto" and not torch.cuda.is_available()):
        return False
    try:
        wanted = config()
        artifact = build.build(wanted, sources(wanted))
        torch.ops.load_library(str(artifact.host_lib))
    except (build.BuildError, OSError, RuntimeError) as e:
        if mode == "on":
            raise
        warnings.warn(f"cutlass_convt: the op's per-call path runs in Python (more host time a "
                      f"call): its C++ library could not be built or loaded: {e}",
                      RuntimeWarning, stacklevel=user_stacklevel())
        return False
    return True

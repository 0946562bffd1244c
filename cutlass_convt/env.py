"""The environment: the only module that reads environment variables or looks for tools.

Everything here is read once per process and cached: the cache folder, nvcc and its
version, the CUTLASS sources shipped by ``nvidia-cutlass``, and a device's SM architecture.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import shutil
import subprocess
from pathlib import Path

CACHE_DIR_VARIABLE = "CUTLASS_CONVT_CACHE_DIR"
CACHE_PATH_VARIABLE = "CUTLASS_CONVT_CACHE_PATH"
NVCC_VARIABLE = "CUTLASS_CONVT_NVCC"
BUILD_TIMEOUT_VARIABLE = "CUTLASS_CONVT_BUILD_TIMEOUT"
EXTENSION_VARIABLE = "CUTLASS_CONVT_EXTENSION"
EXTENSION_MODES = ("auto", "on", "off")
MEASURE_VARIABLE = "CUTLASS_CONVT_MEASURE"
MEASURE_MODES = ("on", "exhaustive", "off")
# Seconds an nvcc query (--version, --list-gpu-arch) may take before nvcc counts as not
# running; seconds a build (nvcc, or the wait for another process's build of the same kernel)
# may take by default: the slowest kernel builds in about a minute on 2 cores.
QUERY_TIMEOUT_S = 30.0
BUILD_TIMEOUT_S = 900.0

_PACKAGE_DIR = Path(__file__).resolve().parent
_CHECKOUT_GENERATED = _PACKAGE_DIR.parent / "generated"


class ConfigError(ValueError):
    """An environment variable's value is not one the package can use; the message names
    the variable."""


def cache_dir() -> Path:
    """Folder that holds the built kernels (not created here).

    ``$CUTLASS_CONVT_CACHE_DIR`` if set (an absolute path, ``~`` and ``~user`` expanded); else
    the checkout's ``generated/`` when the package runs from a source checkout (editable
    install); else ``$XDG_CACHE_HOME/cutlass_convt`` (``~/.cache/cutlass_convt``). Read on every
    call, so tests may change the variable. Raises :class:`ConfigError` for a relative path or
    an unknown user's ``~user``.
    """
    override = os.environ.get(CACHE_DIR_VARIABLE)
    if override:
        return _absolute(CACHE_DIR_VARIABLE, override)
    if (_PACKAGE_DIR.parent / "pyproject.toml").is_file() and _CHECKOUT_GENERATED.is_dir():
        return _CHECKOUT_GENERATED
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "cutlass_convt"


def cache_path() -> tuple[Path, ...]:
    """The read-only caches searched after :func:`cache_dir`, in order:
    ``$CUTLASS_CONVT_CACHE_PATH``, folders separated by ``os.pathsep`` (empty items ignored;
    none when unset). Never written; each serves the entries its own owner (or root) wrote
    (:func:`cutlass_convt.build.build`). Read on every call. Raises :class:`ConfigError` for a
    relative folder or an unknown user's ``~user``."""
    return tuple(_absolute(CACHE_PATH_VARIABLE, item)
                 for item in os.environ.get(CACHE_PATH_VARIABLE, "").split(os.pathsep) if item)


def _absolute(variable: str, text: str) -> Path:
    """The folder ``text`` of the environment variable ``variable``, ``~`` and ``~user``
    expanded; raises :class:`ConfigError` (naming the variable) where that fails or the path is
    not absolute."""
    try:
        path = Path(text).expanduser()
    except RuntimeError as e:  # no home folder for ~ or ~user
        raise ConfigError(f"{variable}: {text!r}: {e}") from None
    if not path.is_absolute():
        raise ConfigError(f"{variable}: {text!r} is not an absolute path")
    return path


@functools.lru_cache(maxsize=None)
def nvcc_path() -> str | None:
    """Path of nvcc: ``$CUTLASS_CONVT_NVCC``, else ``$CUDA_HOME/bin/nvcc``, else ``nvcc`` on PATH,
    else what ``cuda.pathfinder`` (shipped with cuda-python) finds (a CUDA toolkit's usual
    folders, NVIDIA's nvcc wheels); None when there is none."""
    explicit = os.environ.get(NVCC_VARIABLE)
    if explicit:
        return explicit
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    try:
        from cuda import pathfinder

        return pathfinder.find_nvidia_binary_utility("nvcc")
    except Exception:  # an older cuda-python without it, or nothing found
        return None


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str | None:
    """nvcc's release and build, for example ``"13.0.88 cuda_13.0.r13.0/compiler.36424714_0"``;
    None when nvcc is not found. Runs ``nvcc --version`` once per process (about 20 ms)."""
    nvcc = nvcc_path()
    if nvcc is None:
        return None
    text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True,
                          timeout=QUERY_TIMEOUT_S).stdout
    release = re.search(r"V(\d+\.\d+\.\d+)", text)
    build = re.search(r"Build (\S+)", text)
    return " ".join(m.group(1) for m in (release, build) if m) or text.strip()


_NOT_RUNNING: dict[str, str] = {}  # nvcc identity -> why it did not run (asked once)


def working_nvcc() -> tuple[str | None, str]:
    """``(version, "")`` when nvcc runs (:func:`nvcc_version`), else ``(None, why not)``: it
    was not found, or it was found and does not run, or did not answer within
    :data:`QUERY_TIMEOUT_S` (the error in the text; remembered per nvcc binary, so that a
    hanging nvcc costs one timeout per process)."""
    nvcc = nvcc_path()
    if nvcc is None:
        return None, "nvcc was not found"
    identity = nvcc_identity() or nvcc
    if identity in _NOT_RUNNING:
        return None, _NOT_RUNNING[identity]
    try:
        return nvcc_version(), ""
    except (OSError, subprocess.SubprocessError) as e:  # a timeout too: it does not run
        _NOT_RUNNING[identity] = f"nvcc at {nvcc} does not run ({e})"
        return None, _NOT_RUNNING[identity]


def nvcc_identity() -> str | None:
    """The nvcc binary's identity without running it: its resolved path, size and
    modification time (None without nvcc). An entry that records the identity of the nvcc
    found now was built by it, so that a lookup needs no ``nvcc --version``."""
    nvcc = nvcc_path()
    if nvcc is None:
        return None
    try:
        path = Path(shutil.which(nvcc) or nvcc).resolve()
        stat = path.stat()
    except OSError:
        return None
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


def build_timeout() -> float:
    """Seconds a build may take (nvcc, or waiting for another process's build of the same
    kernel): ``$CUTLASS_CONVT_BUILD_TIMEOUT``, else :data:`BUILD_TIMEOUT_S`. Read on every
    call. Raises :class:`ConfigError` for a value that is not a positive, finite number."""
    text = os.environ.get(BUILD_TIMEOUT_VARIABLE)
    if not text:
        return BUILD_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ConfigError(f"{BUILD_TIMEOUT_VARIABLE}={text!r}: seconds, a positive number")
    return value


def extension_mode() -> str:
    """Whether the op's per-call path runs in C++ (:mod:`cutlass_convt.extension`):
    ``$CUTLASS_CONVT_EXTENSION``, ``"auto"`` (the default: built and loaded where PyTorch has
    a CUDA device; the Python path, with a warning, where it cannot be), ``"on"`` (built and
    loaded on any machine; a failure raises) or ``"off"`` (the Python path). Raises
    :class:`ConfigError` for another value."""
    text = os.environ.get(EXTENSION_VARIABLE) or "auto"
    if text not in EXTENSION_MODES:
        raise ConfigError(f"{EXTENSION_VARIABLE}={text!r}: one of {', '.join(EXTENSION_MODES)}")
    return text


def measure_mode() -> str:
    """Whether the default choice measures a new problem on its first call
    (:mod:`cutlass_convt.measure`): ``$CUTLASS_CONVT_MEASURE``, ``"on"`` (the default),
    ``"exhaustive"`` or ``"off"``. Raises :class:`ConfigError` for another value."""
    text = os.environ.get(MEASURE_VARIABLE) or "on"
    if text not in MEASURE_MODES:
        raise ConfigError(f"{MEASURE_VARIABLE}={text!r}: one of {', '.join(MEASURE_MODES)}")
    return text


@functools.lru_cache(maxsize=None)
def nvcc_archs() -> frozenset[int] | None:
    """The SM numbers nvcc compiles for (``nvcc --list-gpu-arch``: 75, 80, ..., 90, 100, ...);
    None without a working nvcc."""
    nvcc = nvcc_path()
    if nvcc is None:
        return None
    try:
        text = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True,
                              check=True, timeout=QUERY_TIMEOUT_S).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return frozenset(int(n) for n in re.findall(r"compute_(\d+)", text)) or None


@functools.lru_cache(maxsize=None)
def cutlass_version() -> str:
    """Version of the installed ``nvidia-cutlass`` distribution (from its metadata, no import)."""
    return importlib.metadata.version("nvidia-cutlass")


@functools.lru_cache(maxsize=None)
def cutlass_include_dirs() -> tuple[Path, ...]:
    """Include folders of the CUTLASS/CuTe sources that ``nvidia-cutlass`` ships."""
    import cutlass_library  # imported lazily: only a build needs it

    root = Path(cutlass_library.source_path)
    return (root / "include", root / "tools" / "util" / "include")


def device_arch(device_index: int) -> int:
    """SM architecture of a CUDA device as an integer: 90 for an H200 (compute capability 9.0)."""
    import torch

    major, minor = torch.cuda.get_device_capability(device_index)
    return 10 * major + minor

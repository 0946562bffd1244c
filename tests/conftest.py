"""Shared fixtures and capability markers: ``gpu`` tests need a CUDA device, ``nvcc`` tests
need nvcc; both are skipped cleanly when the capability is missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import cutlass_convt
from cutlass_convt import build, env

HAS_GPU = torch.cuda.is_available()
HAS_NVCC = env.nvcc_path() is not None


@pytest.fixture(autouse=True)
def python_path_in_children(monkeypatch):
    """The processes a test starts run the op's Python path unless the test names the mode
    (each with a cache of its own would build the C++ library again); the test processes
    themselves (pytest-xdist's workers too) run as the session was started."""
    if env.EXTENSION_VARIABLE not in os.environ:
        monkeypatch.setenv(env.EXTENSION_VARIABLE, "off")


@pytest.fixture(autouse=True)
def rules_only(monkeypatch):
    """Tests see the rules' choice (deterministic: a test's expected route and error bounds
    follow it) unless they measure on purpose (tests/test_measure.py) or the session was
    started with ``CUTLASS_CONVT_MEASURE`` set."""
    if env.MEASURE_VARIABLE not in os.environ:
        monkeypatch.setenv(env.MEASURE_VARIABLE, "off")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_nvcc = pytest.mark.skip(reason="needs nvcc")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
        if "nvcc" in item.keywords and not HAS_NVCC:
            item.add_marker(skip_nvcc)


@pytest.fixture(scope="session")
def cache(tmp_path_factory) -> Path:
    """A kernel cache folder shared by the tests of one session."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def artifact(cache) -> build.Artifact:
    """Problem 71's TF32 dgrad kernel, built into :func:`cache` (nvcc, once per session)."""
    from helpers import TF32, TF32_SOURCES

    return build.build(TF32, TF32_SOURCES, cache)


@pytest.fixture
def fake_cuda(monkeypatch):
    """Fake CUDA tensors (no GPU, no kernels run) on an SM90 device, with an empty call cache."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(env, "device_arch", lambda index: 90)
    cutlass_convt.clear_caches()
    with FakeTensorMode():
        yield
    cutlass_convt.clear_caches()


@pytest.fixture
def fresh_plans(tmp_path, monkeypatch):
    """Empty per-process choice and plan caches before and after (fake plans never reach other
    tests), and an empty kernel cache (no tuning record picks the configuration)."""
    monkeypatch.setenv("CUTLASS_CONVT_CACHE_DIR", str(tmp_path))
    cutlass_convt.clear_caches()
    yield
    cutlass_convt.clear_caches()

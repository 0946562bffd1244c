"""Shared fixtures and capability markers: ``gpu`` tests need a CUDA device, ``nvcc`` tests
need nvcc; both are skipped cleanly when the capability is missing."""

from __future__ import annotations

import pytest
import torch

from cutlass_convt import env

HAS_GPU = torch.cuda.is_available()
HAS_NVCC = env.nvcc_path() is not None


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_nvcc = pytest.mark.skip(reason="needs nvcc")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
        if "nvcc" in item.keywords and not HAS_NVCC:
            item.add_marker(skip_nvcc)

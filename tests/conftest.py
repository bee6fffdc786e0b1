"""Test-suite wiring: tests marked `gpu` or `perf` skip with the reason on a machine without CUDA; without CUDA
the Triton kernels run on the CPU interpreter (TRITON_INTERPRET=1, set before any kernel module is imported)."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    for item in items:
        if "gpu" in item.keywords or "perf" in item.keywords:
            item.add_marker(skip)

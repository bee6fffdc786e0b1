"""Test-suite wiring: without CUDA the Triton kernels run on the CPU interpreter (TRITON_INTERPRET=1, set before any
kernel module is imported); hotloop's pytest plugin (guards/pytest_plugin.py, loaded by
its pytest11 entry point once hotloop is installed) registers the gpu/perf/smoke markers,
skips gpu and perf tests with the reason on a machine without CUDA, and gives the `guard` / `assert_criteria`
fixtures."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

"""Where a measurement came from: the commit id written next to every result under profiles/ (bench rows, kernel
bench rows) and the device's name (bench rows, baselines), so that a number can be traced to the code and the
hardware that produced it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import torch


def commit_id() -> str:
    """The HOTLOOP_COMMIT environment variable when set (a device copy of the working tree may carry a stale
    .git), else `git rev-parse --short HEAD` of this repository, else "unknown"."""
    if os.environ.get("HOTLOOP_COMMIT"):
        return os.environ["HOTLOOP_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parents[1])
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def device_name(device: torch.device) -> str:
    """The GPU's name (torch.cuda.get_device_name, e.g. "NVIDIA H200") for a CUDA device, "cpu" otherwise."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"

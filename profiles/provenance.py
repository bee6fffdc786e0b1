"""Where a measurement came from: the commit id written next to every result under profiles/ (bench rows, kernel
bench rows) and the device's name (bench rows, baselines), so that a number can be traced to the code and the
hardware that produced it."""

from __future__ import annotations

import os
import subprocess
from importlib import metadata
from pathlib import Path

import torch

CHECKOUT = Path(__file__).resolve().parents[1]
"""The folder above hotloop.profiles: a hotloop checkout when running from one (editable install), else the
installed `hotloop/` package folder."""


def commit_id() -> str:
    """The HOTLOOP_COMMIT environment variable when set (a device copy of the working tree may carry a stale
    .git); else, when hotloop runs from a git checkout of itself (CHECKOUT is that repository's top folder and holds
    hotloop's pyproject.toml), `git rev-parse --short HEAD` there; else "hotloop <version>" of the installed
    distribution (importlib.metadata), or "unknown". An installed copy never reports the commit of some unrelated
    repository that happens to contain its site-packages."""
    if os.environ.get("HOTLOOP_COMMIT"):
        return os.environ["HOTLOOP_COMMIT"]
    if (CHECKOUT / "pyproject.toml").is_file() and (CHECKOUT / ".git").exists():
        try:
            out = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10, cwd=CHECKOUT
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        return f"hotloop {metadata.version('hotloop')}"
    except metadata.PackageNotFoundError:
        return "unknown"


def device_name(device: torch.device) -> str:
    """The GPU's name (torch.cuda.get_device_name, e.g. "NVIDIA H200") for a CUDA device, "cpu" otherwise."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"

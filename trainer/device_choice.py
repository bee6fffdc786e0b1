"""Where a run trains and with which learner: the device a config names (`auto` resolved) and the learner a
Trainer builds on it. Below both the loop (hotloop.trainer.loop, which builds the Trainer) and the resume
(hotloop.trainer.resume, which checks a checkpoint against the trainer a config would build)."""

from __future__ import annotations

import torch

from hotloop.trainer.config import Config


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda if available else cpu; raises ValueError for an unusable device string."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"device {name!r} is not a torch device: {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but CUDA is not available on this machine")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name!r}: hotloop runs on cpu or cuda")
    return device


def learner_kind(cfg: Config, device: torch.device) -> str:
    """The learner a Trainer builds: cfg.learner, or for `auto` hotloop on cuda and reference elsewhere."""
    if cfg.learner != "auto":
        return cfg.learner
    return "hotloop" if device.type == "cuda" else "reference"

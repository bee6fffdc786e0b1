"""The run's best policy: the greedy-evaluated parameters of its best epoch, kept beside the last checkpoint.

A late collapse of DQN (the return falling after the policy solved the task) must not lose the solved policy, so
`run_training` (hotloop.guards.run) writes <run folder>/best.pt (BEST_FILE) after every epoch whose greedy
evaluation (Trainer.evaluate, `eval_return`) beats every earlier epoch's, with
hotloop.trainer.checkpoint.save_checkpoint (atomic: temp file + rename, SHA-256 per tensor), and the per-epoch table's
`best_epoch` column says which epoch best.pt holds. Without evaluation (eval_episodes = 0) no best.pt is written.

Tensors: reference learner: online.<key> for the online net's state_dict (with the spectral norms' parametrization
and power-iteration vectors); hotloop learner: params, the flat online parameter buffer (HotLearner.params).
Meta: format (POLICY_FORMAT), epoch, eval_return, learner (kind), config (cfg.to_dict()).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hotloop.trainer.checkpoint import load_checkpoint, save_checkpoint
from hotloop.trainer.resume import STATE_FIELDS
from hotloop.trainer.step import HotLearner

if TYPE_CHECKING:
    from hotloop.trainer.loop import Trainer

BEST_FILE = "best.pt"
"""The best policy's name in a run folder."""
POLICY_FORMAT = "hotloop-policy"
"""meta["format"] of a best-policy file."""


def improves(eval_return: float, best: float | None) -> bool:
    """True when `eval_return` (an epoch's greedy evaluation) is a number and beats `best` (None: no best yet);
    a NaN evaluation (evaluation off) never does."""
    return not math.isnan(eval_return) and (best is None or eval_return > best)


def _policy_tensors(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The live tensors of the trainer's online network, named as in the module docstring (params or online.*)."""
    learner = trainer.learner
    if isinstance(learner, HotLearner):
        return {"params": learner.params}
    return {f"online.{k}": v for k, v in learner.online.state_dict().items()}


def _policy_meta(path: str | Path, meta: dict) -> dict:
    """`meta` if it is a best-policy file's; else ValueError naming `path`."""
    if meta.get("format") != POLICY_FORMAT:
        raise ValueError(f"{path}: not a best-policy file (meta format {meta.get('format')!r})")
    return meta


def save_best(path: str | Path, trainer: Trainer, epoch: int, eval_return: float) -> Path:
    """Write the trainer's online parameters (the policy `Trainer.evaluate` just scored `eval_return`, in epoch
    `epoch`) to `path` atomically (save_checkpoint: an existing file stays whole on any error); returns the path.
    Raises ValueError as save_checkpoint does (e.g. a missing folder)."""
    tensors = _policy_tensors(trainer)
    meta = {
        "format": POLICY_FORMAT,
        "epoch": int(epoch),
        "eval_return": float(eval_return),
        "learner": trainer.learner_kind,
        "config": trainer.cfg.to_dict(),
    }
    return save_checkpoint(path, tensors, meta)


def read_best(path: str | Path) -> dict | None:
    """The meta of the best-policy file at `path` ({"epoch", "eval_return", ...}), None when there is none.
    Raises ValueError (naming the path) for a file that is not a readable best-policy file."""
    if not Path(path).is_file():
        return None
    return _policy_meta(path, load_checkpoint(path)[1])


def load_best(trainer: Trainer, path: str | Path) -> dict:
    """Copy the policy in `path` into `trainer`'s online network in place (the target net, optimizer and replay are
    left alone: this is for evaluating or acting with the best policy); returns its meta.
    Raises ValueError naming the path, before anything changes, for a file that is not a best-policy file, one of
    another learner kind, or one whose config differs in a field the parameters' shapes depend on
    (hotloop.trainer.resume.STATE_FIELDS) or whose tensors do not match the learner's names and shapes."""
    tensors, meta = load_checkpoint(path, trainer.device)
    _policy_meta(path, meta)
    if meta.get("learner") != trainer.learner_kind:
        raise ValueError(
            f"{path}: a policy of the {meta.get('learner')!r} learner; this trainer has a {trainer.learner_kind!r} one"
        )
    saved, now = meta.get("config") or {}, trainer.cfg.to_dict()
    diff = [f for f in STATE_FIELDS if saved.get(f) != now[f]]
    if diff:
        raise ValueError(
            f"{path}: measured with other {diff} ({[saved.get(f) for f in diff]} vs {[now[f] for f in diff]})"
        )
    targets = _policy_tensors(trainer)
    wrong = sorted(set(targets) ^ set(tensors)) + [
        k for k in targets if k in tensors and tensors[k].shape != targets[k].shape
    ]
    if wrong:
        raise ValueError(f"{path}: tensors do not match this learner's (names or shapes differ: {wrong[:5]})")
    with torch.no_grad():
        for key, t in targets.items():
            t.copy_(tensors[key])
    return meta

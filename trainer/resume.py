"""Checkpoint / resume of a Trainer: what its checkpoint holds, restoring it in place, and reading a run folder's.

`run_training` writes <run folder>/checkpoint.pt (CHECKPOINT_FILE) every cfg.checkpoint_interval epochs and after the
last one, in the background (hotloop.trainer.async_checkpoint: a snapshot on the main thread, written by a thread with
hotloop.trainer.checkpoint.write_host_checkpoint, save_checkpoint's format: atomic, temp file + rename; loaded with
torch.load(weights_only=True), so loading never unpickles arbitrary objects; each tensor's SHA-256 is stored and
verified on load). Killing the process (kill -9 included, also during a background write) loses the epochs after the
last complete checkpoint: `read_resume_point` drops their rows from the table and the resumed run trains them again,
so each epoch is in the table once. `read_resume_point` refuses a torn epochs.csv (`check_table_complete`) and a
checkpoint whose tensor bytes changed; the run folder's single writer is ensured by its lock
(hotloop.profiles.run_lock, taken by run_training).

Tensors (name: what):
  learner.*        reference learner: learner.online.<key> and learner.target.<key> (the nets' state_dicts, with the
                   spectral norms' power-iteration vectors), learner.opt.state.<i>.<key> (Adam's state of parameter i;
                   its param_groups go to meta["optimizer"]); hotloop learner: learner.<key> for every key of
                   HotLearner.state_dict() (flat nets, Adam, spectral-norm vectors)
  replay.*         PrioritizedReplay.state_dict()'s tensors: storage, tree.nodes, tree.max_value,
                   tree.bad_priority_count
  returns.ring, returns.finished   EpisodeReturns' finished-episode ring and count
  rng.cpu, rng.cuda (CUDA only), generator   the global RNG states and the trainer's generator
Meta: format, epoch (epochs finished), env_steps, learner_steps, learner_updates (the learner's own step count; the
hotloop learner's includes its capture warm-up steps), learner (kind), device_type, replay {pos, size, alpha, eps},
optimizer {param_groups, scalars} (reference learner), config (cfg.to_dict(), checked by `check_compatible`),
config_sha256 (`config_hash` of config: SHA-256 of its canonical JSON, every field but RESUME_FIELDS).

Provenance: a run folder's epochs are trained under one config unless a change was allowed and recorded.
`read_resume_point` compares the config a resume would run with the checkpoint's (config_sha256, then field by
field: `config_changes`) and refuses any difference but in RESUME_FIELDS (epochs: a resume may extend the run),
naming the fields, unless `allow_config_change`; an allowed change is written by `record_config_change` to the run
folder's CONFIG_CHANGES_FILE (old and new values, the checkpoint's epoch, the time, both hashes) before the run goes
on, and the next checkpoint records the new config. A checkpoint written before config_sha256 existed resumes as
before, its config unchecked: the ResumePoint's `notes` say so.

Not in it: the env, whose episodes in progress are lost: `restore_trainer` resets it with seed
cfg.seed + ENV_RESEED * epoch and the running returns restart at 0 (an uninterrupted run and a resumed one therefore
differ from the resumed epoch on); the eval env (reset with a fixed seed every epoch anyway); the metric readback.
The epsilon and PER-beta schedules are functions of the restored counters (and of cfg.epochs, which a resume may
extend).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pandas as pd
import torch

from hotloop.profiles.epoch_table import check_epoch_rows
from hotloop.profiles.input_files import MAX_TABLE_BYTES, read_input_bytes
from hotloop.trainer.checkpoint import generator_state, load_checkpoint, rng_state, set_generator_state, set_rng_state
from hotloop.trainer.config import Config, env_shape_fields
from hotloop.trainer.device_choice import learner_kind, resolve_device
from hotloop.trainer.step import HotLearner

if TYPE_CHECKING:
    from hotloop.trainer.loop import Trainer

CHECKPOINT_FILE = "checkpoint.pt"
"""The checkpoint's name in a run folder."""
STATE_FORMAT = "hotloop-trainer"
"""meta["format"] of a trainer checkpoint."""
ENV_RESEED = 7919
"""After a restore the env is reset with seed cfg.seed + ENV_RESEED * (epochs finished)."""
STATE_FIELDS = (
    "env",
    "num_envs",
    "trunk_hidden",
    "head_hidden",
    "spectral_norm",
    "replay_capacity",
    "per_alpha",
    "per_eps",
)
"""Config fields the saved state's shapes (or the replay's priorities) depend on; a restore needs them equal.
`synthetic` env: obs_dim and action_nvec too."""
CONFIG_CHANGES_FILE = "config_changes.json"
"""A run folder's record of the config changes allowed at resume (`record_config_change`): a JSON list, oldest first."""
RESUME_FIELDS = ("epochs", "checkpoint_interval")
"""Config fields a resume may change without it being a config change (they change no trained value): `train
--resume --epochs N` extends a run; checkpoint_interval only says how often its state is saved. Left out of
config_hash, so checkpoints written before checkpoint_interval existed keep their hash."""
MAX_CHANGES_BYTES = 1 << 20
"""CONFIG_CHANGES_FILE larger than this (1 MiB) is refused as damaged rather than read."""
_META_TYPES = {
    "epoch": int,
    "env_steps": int,
    "learner_steps": int,
    "learner_updates": int,
    "learner": str,
    "device_type": str,
    "replay": dict,
    "config": dict,
}


class ResumePoint(NamedTuple):
    """A run folder's checkpoint, read by `read_resume_point`: tensors and meta as load_checkpoint returns them,
    the per-epoch table's rows of the epochs it holds (1..epoch), and `source`, the checkpoint file's identity when
    it was read (`checkpoint_identity`; None when not read from a file), so that a user of the point can tell
    whether another run has written the checkpoint since. `config_changes`: {field: {"old", "new"}} of the config
    the resume runs with against the checkpoint's (`config_changes`; empty when equal, None when the checkpoint
    predates config_sha256 and was not checked); non-empty only when allowed. `notes`: lines to show the user."""

    tensors: dict[str, torch.Tensor]
    meta: dict
    rows: list[dict]
    source: tuple[int, int, int, int] | None = None
    config_changes: dict | None = None
    notes: tuple[str, ...] = ()

    @property
    def epoch(self) -> int:
        """Epochs finished at the checkpoint."""
        return self.meta["epoch"]


def trainer_state(trainer: Trainer) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, meta) of `trainer` as described in the module docstring, for save_checkpoint. The tensors are the
    live ones where the owners hand those out (replay storage, nets, returns): save or clone them before the
    trainer runs again."""
    learner_tensors, learner_meta = _learner_state(trainer.learner)
    replay = trainer.replay.state_dict()
    tensors = {f"learner.{k}": v for k, v in learner_tensors.items()}
    tensors.update({f"replay.{k}": v for k, v in replay.items() if isinstance(v, torch.Tensor)})
    tensors.update({"returns.ring": trainer.returns.ring, "returns.finished": trainer.returns.finished})
    tensors.update({f"rng.{k}": v for k, v in rng_state(trainer.device).items()})
    tensors["generator"] = generator_state(trainer.generator)
    meta = {
        "format": STATE_FORMAT,
        "epoch": trainer.epochs_done,
        "env_steps": trainer.env_steps,
        "learner_steps": trainer.learner_steps,
        "learner_updates": trainer.learner.steps,
        "learner": trainer.learner_kind,
        "device_type": trainer.device.type,
        "replay": {k: v for k, v in replay.items() if not isinstance(v, torch.Tensor)},
        **learner_meta,
        "config": trainer.cfg.to_dict(),
        "config_sha256": config_hash(trainer.cfg.to_dict()),
    }
    return tensors, meta


def _learner_state(learner) -> tuple[dict[str, torch.Tensor], dict]:
    if isinstance(learner, HotLearner):
        return learner.state_dict(), {}
    tensors = {f"online.{k}": v for k, v in learner.online.state_dict().items()}
    tensors.update({f"target.{k}": v for k, v in learner.target.state_dict().items()})
    opt, scalars = learner.optimizer.state_dict(), {}
    for i, state in opt["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"opt.state.{i}.{key}"] = value
            else:
                scalars[f"{i}.{key}"] = value
    return tensors, {"optimizer": {"param_groups": opt["param_groups"], "scalars": scalars}}


def check_compatible(meta: dict, cfg: Config, device_type: str, learner_kind: str) -> None:
    """Raise ValueError naming what does not match between a checkpoint's meta and a trainer built from `cfg` on a
    `device_type` device with a `learner_kind` learner: not a trainer checkpoint, missing or mistyped meta, the
    learner kind, the device type, or any STATE_FIELDS config field. Other fields (epochs, lr, ...) may differ."""
    if meta.get("format") != STATE_FORMAT:
        raise ValueError(f"not a trainer checkpoint (meta format {meta.get('format')!r}, expected {STATE_FORMAT!r})")
    bad = [
        k
        for k, t in _META_TYPES.items()
        if not isinstance(meta.get(k), t) or (t is int and isinstance(meta.get(k), bool))
    ]
    if bad:
        raise ValueError(f"checkpoint meta lacks or mistypes {bad}")
    if meta["learner"] != learner_kind:
        raise ValueError(
            f"checkpoint is of a {meta['learner']!r} learner, this run builds a {learner_kind!r} one "
            f"(config.learner {cfg.learner!r} on {device_type})"
        )
    if meta["device_type"] != device_type:
        raise ValueError(f"checkpoint was taken on {meta['device_type']}, this run is on {device_type}")
    saved, now = meta["config"], cfg.to_dict()
    fields = STATE_FIELDS + env_shape_fields(cfg.env)
    diff = [f"{f} (checkpoint {saved.get(f)!r}, config {now[f]!r})" for f in fields if saved.get(f) != now[f]]
    if diff:
        raise ValueError(f"checkpoint does not match this config: {'; '.join(diff)}")


def restore_trainer(trainer: Trainer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """Load a `trainer_state` into `trainer` (tensors on any device). Everything is copied in place (tensor addresses
    kept, so a captured CUDA graph stays valid), except the reference learner's Adam state, which
    torch.optim.Adam.load_state_dict installs (its hyperparameters stay the config's). The counters are set, the
    env is reset with seed cfg.seed + ENV_RESEED * epoch (into trainer.obs, in place), the actor's step counter is
    set from env_steps, and the running returns restart at 0.
    On CUDA, a hotloop learner's graph not yet captured is captured here, then the state is loaded again, so that
    capture's warm-up steps (real updates) leave no trace. Raises ValueError naming what does not match
    (`check_compatible`; missing, unexpected or misshapen tensors; replay pos/size) before anything is changed."""
    check_compatible(meta, trainer.cfg, trainer.device.type, trainer.learner_kind)
    own, _ = trainer_state(trainer)
    is_opt = lambda name: name.startswith("learner.opt.state.")  # noqa: E731 (reference Adam: absent before step 1)
    missing = sorted(k for k in own if not is_opt(k) and k not in tensors)
    unexpected = sorted(k for k in tensors if not is_opt(k) and k not in own)
    if missing or unexpected:
        raise ValueError(f"checkpoint tensors do not match this trainer: missing {missing}, unexpected {unexpected}")
    for name, t in own.items():
        if not is_opt(name) and (tensors[name].shape != t.shape or tensors[name].dtype != t.dtype):
            raise ValueError(
                f"checkpoint tensor {name!r} is {tensors[name].dtype} {tuple(tensors[name].shape)}, "
                f"this trainer's is {t.dtype} {tuple(t.shape)}"
            )
    opt_state = None if isinstance(trainer.learner, HotLearner) else _optimizer_state(trainer.learner, tensors, meta)
    replay = {k[len("replay.") :]: v for k, v in tensors.items() if k.startswith("replay.")}
    replay.update(meta["replay"])
    try:
        trainer.replay.load_state_dict(replay)  # validates everything before it changes anything
    except ValueError as exc:
        raise ValueError(f"checkpoint replay: {exc}") from exc
    _load_learner(trainer, tensors, meta, opt_state)
    learner = trainer.learner
    if isinstance(learner, HotLearner) and learner.graph is None and learner.use_graph and trainer.replay.size > 0:
        with trainer.phase("capture"):
            learner.capture()
        trainer.replay.load_state_dict(replay)  # the warm-up steps re-prioritized the tree
        _load_learner(trainer, tensors, meta, opt_state)
    trainer.returns.ring.copy_(tensors["returns.ring"])
    trainer.returns.finished.copy_(tensors["returns.finished"])
    trainer.returns.running.zero_()
    trainer.epochs_done, trainer.env_steps = meta["epoch"], meta["env_steps"]
    trainer.learner_steps = meta["learner_steps"]
    trainer.obs.copy_(trainer.env.reset(seed=trainer.cfg.seed + ENV_RESEED * meta["epoch"]))
    if trainer.actor is not None:
        trainer.actor.t.fill_(meta["env_steps"] // trainer.cfg.num_envs)
    set_rng_state({k[len("rng.") :]: v for k, v in tensors.items() if k.startswith("rng.")}, trainer.device)
    set_generator_state(trainer.generator, tensors["generator"])


def _optimizer_state(learner, tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    """The reference learner's Adam state_dict from the checkpoint (cloned tensors, the optimizer's own
    param_groups); ValueError for a different parameter layout, a bad key or a misshapen moment."""
    params = list(learner.online.parameters())
    groups = learner.optimizer.state_dict()["param_groups"]
    saved_groups = meta.get("optimizer", {}).get("param_groups")
    if not isinstance(saved_groups, list) or [g.get("params") for g in saved_groups] != [g["params"] for g in groups]:
        raise ValueError("checkpoint optimizer param_groups do not match this learner's parameters")
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        if not name.startswith("learner.opt.state."):
            continue
        index, _, key = name[len("learner.opt.state.") :].partition(".")
        if not index.isdigit() or int(index) >= len(params) or not key:
            raise ValueError(f"checkpoint tensor {name!r} names no parameter of this learner")
        if key != "step" and value.shape != params[int(index)].shape:
            raise ValueError(
                f"checkpoint tensor {name!r} has shape {tuple(value.shape)}, the parameter "
                f"{tuple(params[int(index)].shape)}"
            )
        state.setdefault(int(index), {})[key] = value.clone()
    for name, value in meta["optimizer"].get("scalars", {}).items():
        index, _, key = name.partition(".")
        state.setdefault(int(index), {})[key] = value
    return {"state": state, "param_groups": groups}


def _load_learner(trainer: Trainer, tensors: dict[str, torch.Tensor], meta: dict, opt_state: dict | None) -> None:
    learner = trainer.learner
    if isinstance(learner, HotLearner):
        learner.load_state_dict({k[len("learner.") :]: v for k, v in tensors.items() if k.startswith("learner.")})
    else:
        for prefix, net in (("learner.online.", learner.online), ("learner.target.", learner.target)):
            net.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
        learner.optimizer.load_state_dict(opt_state)
    learner.steps = meta["learner_updates"]


def checkpoint_identity(path: str | Path) -> tuple[int, int, int, int] | None:
    """(st_dev, st_ino, st_size, st_mtime_ns) of the file at `path`, None if there is none. save_checkpoint renames
    a new file over the old one, so every save changes it (a new inode)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def check_table_complete(table: str | Path) -> None:
    """Raise ValueError naming `table` (a per-epoch CSV) and the row when a row is torn: fewer or more fields than
    the header, a quoted field left open, or a last row without its line end (to_csv ends every row with one), the
    marks of a write that stopped part-way (the table of a run killed while writing it before writes were atomic,
    or a damaged file). Resuming from it would keep the torn row's missing values as NaN. An empty file passes
    (pandas' reader refuses it). Read through hotloop.profiles.input_files.read_input_bytes: a path that is not a
    regular file (a FIFO, a device) or a file larger than MAX_TABLE_BYTES (128 MiB, stated in the message) raises
    its InputFileError (a ValueError naming the file); UnicodeDecodeError passes through."""
    table = Path(table)
    text = read_input_bytes(table, "per-epoch table", MAX_TABLE_BYTES).decode("utf-8")
    if not text:
        return
    reader = csv.reader(io.StringIO(text, newline=""))
    header, row_no, line = None, 0, 0
    try:
        for row in reader:
            if header is None:
                header = row
                continue
            row_no, line = row_no + 1, reader.line_num
            if len(row) != len(header):
                raise ValueError(
                    f"{table}: row {row_no} (line {line}) is torn: {len(row)} fields where the header "
                    f"has {len(header)}; the table was cut off by a write that did not finish (or "
                    f"damaged): restore it or start a new run"
                )
    except csv.Error as exc:
        raise ValueError(
            f"{table}: row {row_no + 1} (line {reader.line_num}) is torn ({exc}); the table was cut off "
            f"by a write that did not finish (or damaged): restore it or start a new run"
        ) from exc
    if not text.endswith(("\n", "\r")):
        where = f"row {row_no} (line {line}, the last)" if row_no else "the header (line 1)"
        raise ValueError(
            f"{table}: {where} is torn: it has no line end; the table was cut off by a write that did "
            f"not finish (or damaged): restore it or start a new run"
        )


def config_hash(config: Mapping) -> str:
    """SHA-256 (hex) of a config dict's canonical JSON (keys sorted, no spaces; cfg.to_dict() or a checkpoint's
    meta["config"]) without RESUME_FIELDS. Raises TypeError / ValueError for a dict json cannot write."""
    plain = {k: v for k, v in config.items() if k not in RESUME_FIELDS}
    return hashlib.sha256(json.dumps(plain, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def config_changes(saved: Mapping, cfg: Config) -> dict[str, dict]:
    """{field: {"old": `saved`'s value, "new": `cfg`'s}} for every field of `cfg` but RESUME_FIELDS whose value
    differs from `saved` (a checkpoint's meta["config"]), in Config's field order; a field `saved` lacks (one Config
    gained after the checkpoint was written) counts only when `cfg` does not hold its default (old: None). Raises
    nothing of its own."""
    defaults, out = Config().to_dict(), {}
    for name, new in cfg.to_dict().items():
        if name in RESUME_FIELDS:
            continue
        if name not in saved:
            if new != defaults[name]:
                out[name] = {"old": None, "new": new}
        elif saved[name] != new:
            out[name] = {"old": saved[name], "new": new}
    return out


def _check_config(run_dir: Path, meta: dict, cfg: Config, allow: bool) -> tuple[dict | None, tuple[str, ...]]:
    """(config_changes, notes) of a resume of `cfg` from a checkpoint's `meta` (`read_resume_point`)."""
    path = run_dir / CHECKPOINT_FILE
    saved_hash = meta.get("config_sha256")
    if saved_hash is None:
        return None, (
            f"{path} was written before checkpoints recorded their config's hash (config_sha256): "
            f"the config is taken as it is, not checked against the one the run was trained with",
        )
    if not isinstance(saved_hash, str) or config_hash(meta["config"]) != saved_hash:
        raise ValueError(
            f"{path}: its meta's config does not match its config_sha256: the record of the config "
            f"the run was trained with was changed after it was written"
        )
    changes = {} if config_hash(cfg.to_dict()) == saved_hash else config_changes(meta["config"], cfg)
    if changes and not allow:
        fields = "; ".join(f"{k} (checkpoint {v['old']!r}, now {v['new']!r})" for k, v in changes.items())
        raise ValueError(
            f"the config differs from the one the run was trained with (its checkpoint {path}, epoch "
            f"{meta['epoch']}) in {', '.join(changes)}: {fields}; restore {run_dir / 'config.json'}, or "
            f"resume with --allow-config-change to train on with the change, recorded in "
            f"{run_dir / CONFIG_CHANGES_FILE}"
        )
    if changes:
        read_config_changes(run_dir)  # a damaged record is refused now, before the run starts
    return changes, ()


def read_config_changes(run_dir: str | Path) -> list[dict]:
    """The records of run_dir's CONFIG_CHANGES_FILE (`record_config_change`), [] when there is none. Raises
    ValueError naming the file when it is not a regular file or is larger than MAX_CHANGES_BYTES
    (hotloop.profiles.input_files.read_input_bytes), or is not UTF-8 JSON holding a list of objects."""
    path = Path(run_dir) / CONFIG_CHANGES_FILE
    if not path.exists() and not path.is_symlink():
        return []
    try:
        records = json.loads(read_input_bytes(path, "config change record", MAX_CHANGES_BYTES).decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # InputFileError, JSONDecodeError and UnicodeDecodeError included
        raise ValueError(f"{path} cannot be read ({exc}): move it away to resume") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError(f"{path} is not a JSON list of records: move it away to resume")
    return records


def record_config_change(run_dir: str | Path, point: ResumePoint, cfg: Config) -> Path | None:
    """Append the config change a resume was allowed (point.config_changes, from `read_resume_point` with
    allow_config_change) to run_dir's CONFIG_CHANGES_FILE: {"epoch": the checkpoint's (the change applies from the
    next one), "time": UTC ISO 8601, "config_sha256": {"old", "new"}, "changes": {field: {"old", "new"}}}; a last
    record of the same epoch is replaced (that resume kept no epoch). Written atomically (temp file + fsync +
    rename). Returns the file, or None when there was no change to record. Raises ValueError as
    `read_config_changes`; OSError from the file system."""
    if not point.config_changes:
        return None
    run_dir = Path(run_dir)
    records = read_config_changes(run_dir)
    record = {
        "epoch": point.epoch,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config_sha256": {"old": point.meta.get("config_sha256"), "new": config_hash(cfg.to_dict())},
        "changes": point.config_changes,
    }
    if records and records[-1].get("epoch") == point.epoch:
        records[-1] = record
    else:
        records.append(record)
    path = run_dir / CONFIG_CHANGES_FILE
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=run_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(records, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def read_resume_point(run_dir: str | Path, cfg: Config, allow_config_change: bool = False) -> ResumePoint:
    """Read run_dir's checkpoint (on the CPU; its tensor checksums verified by load_checkpoint) and the rows of its
    epochs.csv up to the checkpoint's epoch (rows of a later epoch, written before the process died ahead of that
    epoch's checkpoint, are dropped: that epoch runs again), and `check_compatible` the checkpoint with a trainer
    built from `cfg` (device resolved as Trainer does). Writes nothing and takes no lock: a caller that goes on to
    run takes the folder's lock first (hotloop.profiles.run_lock.acquire) or compares `source` after taking it.
    Raises ValueError naming the file for a missing or unreadable checkpoint or table, a checkpoint whose tensor
    bytes do not match their checksums (naming the tensor), a torn table (`check_table_complete`, naming the row),
    a table that is not a regular file or is too large (hotloop.profiles.input_files), a cell that is not what a run
    writes (hotloop.profiles.epoch_table.check_epoch_rows, naming the row and the field),
    a table without the checkpoint's epochs 1..epoch, or a mismatch; and, unless `allow_config_change`, a config
    that differs from the checkpoint's in any field but RESUME_FIELDS (naming the fields, old and new values; module
    docstring: Provenance), or a checkpoint whose recorded config does not match its config_sha256. An allowed
    change is in the point's `config_changes` (a damaged CONFIG_CHANGES_FILE is refused then); a checkpoint without
    config_sha256 is not checked, its `notes` saying so."""
    run_dir = Path(run_dir)
    source = checkpoint_identity(run_dir / CHECKPOINT_FILE)
    tensors, meta = load_checkpoint(run_dir / CHECKPOINT_FILE)
    device = resolve_device(cfg.device)
    try:
        check_compatible(meta, cfg, device.type, learner_kind(cfg, device))
    except ValueError as exc:
        raise ValueError(f"{run_dir / CHECKPOINT_FILE}: {exc}") from exc
    changes, notes = _check_config(run_dir, meta, cfg, allow_config_change)
    table = run_dir / "epochs.csv"
    try:
        check_table_complete(table)  # its own ValueError names the file and the torn row
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{table} cannot be read ({exc}); resuming needs the run's per-epoch table") from exc
    try:
        frame = pd.read_csv(table, dtype={"clocks_event_reasons": object})
    except (OSError, ValueError, UnicodeDecodeError) as exc:  # pandas' parser and empty-file errors are ValueErrors
        raise ValueError(f"{table} cannot be read ({exc}); resuming needs the run's per-epoch table") from exc
    epoch = meta["epoch"]
    if "epoch" not in frame.columns:
        raise ValueError(f"{table} has no 'epoch' column")
    frame = check_epoch_rows(frame, table)  # names the file, row and field of a cell that is not a run's
    frame = frame[frame["epoch"] <= epoch]
    if frame["epoch"].tolist() != list(range(1, epoch + 1)):
        raise ValueError(f"{table} holds epochs {frame['epoch'].tolist()}, the checkpoint 1..{epoch}")
    if "clocks_event_reasons" in frame.columns:  # a text column: "" (no reason) reads back as NaN
        frame["clocks_event_reasons"] = frame["clocks_event_reasons"].fillna("")
    return ResumePoint(tensors, meta, frame.to_dict("records"), source, changes, notes)

"""The checks `hotloop train`, `gate` and `bench` share before anything is trained or written (`check_run`: the
device, the env, the learner, the memory), the checks of the paths they will write (`check_folder_writable`,
`check_writable`), the new run folder of train and gate under its lock (`new_run_folder`) and what a command's
`prepare` hands to its `execute` (`RunPlan`). Every check raises ValueError (bad input, exit 2) naming what is
wrong."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from hotloop.trainer.config import Config

if TYPE_CHECKING:
    import torch

    from hotloop.profiles.run_lock import RunLock
    from hotloop.trainer.distributed import RankInfo

Options = TypeVar("Options")


@dataclass(frozen=True)
class RunPlan(Generic[Options]):
    """A validated train / gate / bench invocation: its `cfg`, its run folder `run_dir` (made), the folder's `lock`
    (train and gate: hotloop.profiles.run_lock, held until hotloop.guards.commands.main.main releases it; bench:
    None) and the command's typed `options`."""

    cfg: Config
    run_dir: Path
    lock: RunLock | None
    options: Options


def check_env(cfg: Config) -> tuple[int, tuple[int, ...]]:
    """Build one copy of the configured env on the CPU and close it; returns its (obs_dim, action_nvec).
    ValueError naming `env` if that fails (an unknown name, a Gymnasium id that does not exist or has unsupported
    spaces), before any run folder exists."""
    from hotloop.trainer.envs import make_env

    try:
        env = make_env(cfg.env, 1, "cpu", cfg.seed, **cfg.env_shape())
    except Exception as exc:  # third-party env constructors raise their own types (gymnasium.error.*)
        raise ValueError(f"config.env {cfg.env!r} cannot be used: {exc}") from exc
    shape = int(env.obs_dim), tuple(int(n) for n in env.action_nvec)
    getattr(env, "close", lambda: None)()
    return shape


def check_learner(cfg: Config, device, action_nvec: tuple[int, ...]) -> None:
    """The learner a run builds (hotloop.trainer.device_choice.learner_kind) must be able to run on `device` (a resolved
    torch.device): the hotloop learner's Triton kernels need CUDA, or the Triton CPU interpreter (TRITON_INTERPRET=1,
    tests), and its fused loss equal branch sizes and no diversity term (hotloop.trainer.step.check_supported).
    ValueError naming config.learner."""
    from hotloop.kernels._common import interpreting
    from hotloop.trainer.device_choice import learner_kind
    from hotloop.trainer.step import check_supported

    if learner_kind(cfg, device) != "hotloop":
        return
    if device.type != "cuda" and not interpreting():
        raise ValueError(
            f"config.learner 'hotloop' needs a CUDA device (its Triton kernels run on the GPU), this "
            f"run is on {device}: set learner=reference (or auto) or --device cuda"
        )
    try:
        check_supported(cfg, action_nvec)
    except ValueError as exc:
        raise ValueError(f"config.learner: {exc}") from None


def check_fits(cfg: Config, device, obs_dim: int, action_nvec: tuple[int, ...]) -> None:
    """ValueError when the run's estimated memory (hotloop.trainer.memory_estimate.check_memory: replay, networks,
    learner buffers, envs) exceeds what `device` has available, naming the fields, the estimate and the available
    bytes."""
    from hotloop.trainer.memory_estimate import check_memory

    check_memory(cfg, device, obs_dim, action_nvec)


def check_run(cfg: Config, trains: bool) -> tuple[torch.device, int, tuple[int, ...]]:
    """Check, in this order, that `cfg`'s device exists (hotloop.trainer.device_choice.resolve_device) and can run
    its switches (hotloop.trainer.step.check_device_supports: dependent_launch needs sm_90+), that
    learning_starts fits the replay (hotloop.trainer.config.validate_run; when `trains`: train and gate, not bench),
    that the env can be built (`check_env`), that the learner can run on the device (`check_learner`; when `trains`)
    and that the run fits in the device's free memory (`check_fits`; a synthetic env's shapes are the config's, so
    it is estimated before even one copy is built). Returns (device, obs_dim, action_nvec); ValueError naming the
    problem."""
    from hotloop.trainer.config import validate_run
    from hotloop.trainer.device_choice import resolve_device
    from hotloop.trainer.step import check_device_supports

    device = resolve_device(cfg.device)
    check_device_supports(cfg, device)
    if trains:
        validate_run(cfg)
    if cfg.env == "synthetic":
        check_fits(cfg, device, cfg.obs_dim, cfg.action_nvec)
    obs_dim, action_nvec = check_env(cfg)
    if trains:
        check_learner(cfg, device, action_nvec)
    if cfg.env != "synthetic":
        check_fits(cfg, device, obs_dim, action_nvec)
    return device, obs_dim, action_nvec


def check_out_writable(out: Path | None) -> None:
    """--out: ValueError unless a file can be created in the first existing folder of `out` and its parents (None:
    the default run folder, not checked here)."""
    if out:
        check_folder_writable(next((p for p in (out, *out.parents) if p.exists()), Path(".")), "--out")


def check_folder_writable(folder: Path, option: str) -> None:
    """ValueError naming `option` unless a file can be created in `folder` (tried with a temporary file, removed at
    once; a path that is not a folder is left to the caller's own message)."""
    if folder.is_dir() and (problem := file_creation_error(folder)) is not None:
        raise ValueError(f"{option}: no file can be created in {folder} ({problem}; a read-only folder?)")


def file_creation_error(folder: Path) -> str | None:
    """Why no file can be created in the existing folder `folder` (tried with a temporary file, removed at once;
    also catches read-only file systems and root, whom os.access never refuses), or None when one can."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".hotloop-write-check-"):
            return None
    except OSError as exc:
        return str(exc.strerror or exc)


def new_run_folder(out: Path | None) -> tuple[Path, RunLock]:
    """The run folder of a new train / gate run, made and locked: `out` (which must be new or empty, and whose first
    existing folder must take a file) or runs/<UTC timestamp>/. The lock (hotloop.profiles.run_lock: one writer
    per folder, a second run on it is refused naming the holder's pid) is the caller's to release. ValueError
    naming the problem."""
    from hotloop.profiles.epoch_table import new_run_dir
    from hotloop.profiles.run_lock import acquire

    check_out_writable(out)
    try:
        run_dir = out or new_run_dir()
    except OSError as exc:
        raise ValueError(f"cannot create the run folder runs/: {exc.strerror or exc}") from exc
    return run_dir, acquire(run_dir, create=True, must_be_empty=True)


def check_writable(path: Path, option: str) -> None:
    """ValueError naming `option` unless the file `path` can be written later: an existing file must open for
    writing (append mode, so nothing in it changes), else its first existing parent must be a folder in which a
    file can be created (tried with a temporary file, removed at once). Catches read-only files and folders and
    read-only file systems, also for root (whom os.access never refuses)."""
    if path.is_dir():
        raise ValueError(f"{option} {path} cannot be written: it is a folder")
    if path.exists():
        try:
            with open(path, "ab"):
                pass
        except OSError as exc:
            raise ValueError(f"{option} {path} cannot be written: {exc.strerror or exc} (a read-only file?)") from None
        return
    parent = next((p for p in path.parents if p.exists()), Path("."))
    if not parent.is_dir():
        raise ValueError(f"{option} {path} cannot be written: {parent} is not a folder")
    if (problem := file_creation_error(parent)) is not None:
        raise ValueError(
            f"{option} {path} cannot be written: no file can be created in {parent} ({problem}; a read-only folder?)"
        )


def open_rank_folder(out: Path | None, info: RankInfo):
    """The folder a rank of a data-parallel run (`hotloop train --nproc N`, `hotloop gate --nproc N`) writes (hotloop.guards.data_parallel.rank_folder), made and
    locked: rank 0 makes the run folder (--out, or runs/<UTC timestamp>/: `new_run_folder`'s rules) and tells the
    others its path, or its error (every rank then raises it as ValueError); rank R > 0 makes RUN_DIR/rank<R>/.
    Collective: every rank calls it. Returns (folder, its hotloop.profiles.run_lock lock)."""
    import torch.distributed as dist

    from hotloop.guards.data_parallel import rank_folder
    from hotloop.profiles.run_lock import acquire

    outcome: list[object] = [None, None]  # [run folder, error]: rank 0's
    lock = None
    if info.rank == 0:
        try:
            run_dir, lock = new_run_folder(out)
            outcome = [str(run_dir), None]
        except ValueError as exc:
            outcome = [None, str(exc)]
    dist.broadcast_object_list(outcome, src=0)
    if outcome[1] is not None:
        raise ValueError(outcome[1] if info.rank == 0 else f"rank 0: {outcome[1]}")
    folder = rank_folder(Path(outcome[0]), info.rank)
    if lock is None:
        lock = acquire(folder, create=True, must_be_empty=True)
    return folder, lock

"""One training run as the CLI does it: epochs under the hang watchdog, a progress display, the per-epoch table."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hotloop.guards.loop_syncs import LoopSyncCensus
from hotloop.guards.watchdog import HangWatchdog, check_limit_s
from hotloop.profiles.disk_full import DiskFullError, disk_full_cause
from hotloop.profiles.epoch_table import epoch_frame, write_table
from hotloop.profiles.epoch_timer import EpochTimer
from hotloop.profiles.plots import plot_epochs
from hotloop.profiles.ranges import phase_range
from hotloop.profiles.run_lock import acquire, remove_temp_files
from hotloop.profiles.run_timeline import RunTimeline
from hotloop.profiles.telemetry import NvmlTelemetry
from hotloop.trainer.async_checkpoint import AsyncCheckpointer
from hotloop.trainer.best_policy import BEST_FILE, improves, read_best, save_best
from hotloop.trainer.config import Config
from hotloop.trainer.loop import Trainer, resolve_device
from hotloop.trainer.resume import (
    CHECKPOINT_FILE,
    ResumePoint,
    checkpoint_identity,
    read_resume_point,
    record_config_change,
)

SETUP_LIMIT_S = 300.0
"""Seconds the setup (imports, CUDA context, env/replay/network allocation) may take at least."""


def run_training(
    cfg: Config,
    run_dir: Path,
    epoch_limit_s: float,
    show_progress: bool = True,
    after_epochs: Callable[[Trainer], object] | None = None,
    resume: bool | ResumePoint = False,
    loop_census: LoopSyncCensus | None = None,
    watched: dict[str, bool] | None = None,
    timeline: RunTimeline | None = None,
    hang_record: Path | None = None,
) -> tuple[pd.DataFrame, object]:
    """Train `cfg.epochs` epochs; each epoch must finish within `epoch_limit_s` seconds (the setup within
    max(epoch_limit_s, SETUP_LIMIT_S)) or the process exits 3 with every thread's stack. If the watchdog's thread
    fails, the process exits 70 (hotloop.guards.watchdog: the run never goes on unguarded; the traceback in
    run_dir/error.log).

    First takes run_dir's lock (hotloop.profiles.run_lock.acquire; re-entrant, so a caller that already holds it,
    as the CLI does from where it creates or opens the folder, keeps it past this call) and removes the temp files a
    killed writer left (run_lock.remove_temp_files: `.checkpoint.pt.*.tmp`, `.epochs.csv.*.tmp`, ...), both before
    anything else is read or written; the lock is released (one hold) on return or on any error.
    Writes run_dir/config.json next, run_dir/epochs.csv + epochs.md after every epoch (so a killed
    run keeps its finished epochs; each file replaced atomically, hotloop.profiles.epoch_table.write_table), then
    the epoch's checkpoint work (hotloop.trainer.async_checkpoint.AsyncCheckpointer, outside the timed epoch, under
    the watchdog armed as "checkpoint N"): every cfg.checkpoint_interval epochs (and after the last) a snapshot of
    the trainer (on CUDA: a D2D copy on a side stream the main stream waits for, then a D2H copy into pinned memory
    beside the next epoch's loop; no host sync) handed to a background thread that writes run_dir/checkpoint.pt
    atomically (hotloop.trainer.resume's state; temp file, fsync, rename); one in flight at most, a checkpoint due
    while one is in flight is skipped and said (taken at the next epoch's end); the last epoch's is never skipped,
    and its write is waited for after the epochs (watchdog armed as "checkpoint writer") before `after_epochs` runs;
    a one-line summary (files, bytes, skips, seconds) is printed;
    after an epoch whose greedy evaluation beats every earlier one,
    run_dir/best.pt with its online parameters (hotloop.trainer.best_policy; atomic, written before that epoch's
    row, whose `best_epoch` column names the epoch best.pt holds; NaN before any evaluation; a resumed run keeps
    the folder's best.pt, a new one replaces it), and run_dir/epochs.png (hotloop.profiles.plots.plot_epochs) at the end.
    A one-line summary per epoch and a progress bar go to stderr. Each epoch runs inside a `phase_range("epoch")`.
    resume: True reads run_dir's checkpoint and table (hotloop.trainer.resume.read_resume_point, checked against `cfg`;
    ValueError before anything is written), a ResumePoint is used as read (the CLI reads it to validate the
    invocation) after checking that the checkpoint is still the file it was read from (ResumePoint.source; else
    ValueError: another run wrote it since; a config change it allows is recorded in run_dir/config_changes.json,
    hotloop.trainer.resume.record_config_change, and its notes are shown; True allows no config change, as
    read_resume_point); the trainer is restored (its env reset) and runs the epochs after the
    checkpoint's up to cfg.epochs, the table keeping the earlier rows (those after the checkpoint's epoch are dropped
    and trained again: each epoch is in the table once). Killing the process (kill -9 included, during a background
    write too) loses at most the epochs after the last complete checkpoint. So does a full disk: config.json, the
    table and the checkpoints are each replaced whole or not at all, and a write that finds the disk full raises
    hotloop.profiles.disk_full.DiskFullError naming the file (the CLI: exit 70, "disk full"; a background write's
    failure is raised at the next epoch's checkpoint work or at the last, any other as
    hotloop.trainer.async_checkpoint.CheckpointWriteError naming the file), the folder resumable from its last
    complete checkpoint. A write still running when the run ends on an error is waited for (watchdog: "checkpoint
    writer") before the folder's lock is released.
    Returns the per-epoch DataFrame: hotloop.profiles.epoch_table.EPOCH_COLUMNS first, then gpu_ms_per_step (CUDA events
    from the epoch's start to the loop's "readback" phase; NaN off CUDA), kernels_per_step and syncs_per_step
    (NaN: no guard counts them here), the NVML telemetry sampled after the epoch (NaN without NVML / on CPU);
    and what `after_epochs(trainer)` returned (None without it), called after the last epoch under the same
    watchdog (armed as "after epochs", `epoch_limit_s` long): the gate guards steady-state steps there.
    loop_census: a hotloop.guards.loop_syncs.LoopSyncCensus that watches each epoch's loop, from the epoch's start
    to its "readback" phase (`begin(epoch)` / `end()`); the gate reads it after the run.
    hang_record: where the hang watchdog writes its JSON record when it stops the process (HangWatchdog's
    hang_record; None: no record).
    watched: a dict filled, when the run ends normally, with HangWatchdog.watched: {period label ("epoch 1",
    "checkpoint 1", "after epochs", ...): True when the watchdog's thread was alive from its start to its end}.
    Raises ValueError for an epoch_limit_s outside (0, hotloop.guards.watchdog.MAX_LIMIT_S], before anything is
    read or written; RuntimeError when the watchdog is not running at the start or end of a period (the CLI: exit
    70); hotloop.profiles.run_lock.RunFolderLocked (a ValueError; exit 2 in the CLI) naming the holder's pid when
    another live process holds run_dir, before anything is written; ValueError for a folder that is missing.
    """
    check_limit_s(epoch_limit_s, "epoch_limit_s")
    console = Console(stderr=True, soft_wrap=True)
    run_dir = Path(run_dir)
    with acquire(run_dir) as lock:
        if lock.stale_pid is not None:
            console.print(f"hotloop: {run_dir}: took over the lock left by pid {lock.stale_pid} (no longer running)")
        for path in remove_temp_files(run_dir):
            console.print(f"hotloop: removed {path.name}, a temp file left by a killed write")
        return _run_locked(
            console,
            cfg,
            run_dir,
            epoch_limit_s,
            show_progress,
            after_epochs,
            resume,
            loop_census,
            watched,
            timeline if timeline is not None else _started_timeline(),
            hang_record,
        )


def _started_timeline() -> RunTimeline:
    """A timeline whose first span, "startup", runs from the process start to now (interpreter, imports, argument
    and config checks, the run folder's lock)."""
    tl = RunTimeline()
    tl.add_startup(time.perf_counter())
    return tl


def _write_epochs(rows: list[dict], run_dir: Path, tl: RunTimeline, epoch: int, what: str) -> None:
    """Replace run_dir/epochs.csv + epochs.md with `rows` (hotloop.profiles.epoch_table.write_table: atomic), timed
    as the timeline's "table" span of `epoch`; a full disk raises DiskFullError naming the file and `what` the write
    held (the table as it was and the last checkpoint are kept), any other OSError passes through."""
    try:
        with tl.span("table", epoch):
            write_table(epoch_frame(rows), run_dir, "epochs")
    except OSError as exc:  # the old table stays whole (atomic); so does the last checkpoint
        if (full := disk_full_cause(exc)) is None:
            raise
        raise DiskFullError(
            f"disk full: {run_dir / 'epochs.csv'} could not be written with {what} "
            f"({full.strerror or full}); the table as it was and the last checkpoint are kept",
            full.errno,
        ) from exc


def _run_locked(
    console: Console,
    cfg: Config,
    run_dir: Path,
    epoch_limit_s: float,
    show_progress: bool,
    after_epochs: Callable[[Trainer], object] | None,
    resume: bool | ResumePoint,
    census: LoopSyncCensus | None,
    watched: dict[str, bool] | None,
    tl: RunTimeline,
    hang_record: Path | None = None,
) -> tuple[pd.DataFrame, object]:
    """run_training's work, with run_dir's lock held."""
    if isinstance(resume, ResumePoint):
        point = resume
        if point.source is not None and checkpoint_identity(run_dir / CHECKPOINT_FILE) != point.source:
            raise ValueError(
                f"{run_dir / CHECKPOINT_FILE} changed since it was read for this resume (another run "
                f"wrote it): resume again to continue from the checkpoint as it is now"
            )
    else:
        point = read_resume_point(run_dir, cfg) if resume else None
    if point is not None:
        for note in point.notes:
            console.print(f"hotloop: note: {note}")
        recorded = record_config_change(run_dir, point, cfg)  # before config.json takes the new config
        if recorded is not None:
            console.print(
                f"hotloop: config changed at resume after epoch {point.epoch} (allowed): "
                + "; ".join(f"{k} {v['old']!r} -> {v['new']!r}" for k, v in point.config_changes.items())
                + f"; recorded in {recorded}"
            )
    cfg.save(run_dir / "config.json")
    rows: list[dict] = list(point.rows) if point is not None else []
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not show_progress or not sys.stderr.isatty(),
    )
    with (
        HangWatchdog(epoch_limit_s, error_log=run_dir / "error.log", hang_record=hang_record) as watchdog,
        progress,
        AsyncCheckpointer(
            run_dir / CHECKPOINT_FILE,
            cfg.checkpoint_interval,
            cfg.epochs,
            watchdog,
            note=lambda line: console.print(f"hotloop: {line}"),
        ) as checkpointer,
    ):
        task = progress.add_task("setup", total=cfg.learner_steps_per_epoch)
        watchdog.arm("setup", max(epoch_limit_s, SETUP_LIMIT_S))

        def on_phase(name: str) -> None:
            watchdog.phase(name)
            if name == "readback":  # the learner loop's last launch is queued: end of the timed GPU work
                timer.stop()
                if census is not None:
                    census.end()

        device = resolve_device(cfg.device)
        if device.type == "cuda":
            with tl.span("cuda_context"):
                torch.cuda.init()
                torch.empty(1, device=device)  # the primary context is made by the first allocation
        with tl.span("build"):
            trainer = Trainer(
                cfg, on_phase=on_phase, on_progress=lambda done, total: progress.update(task, completed=done)
            )
            if point is not None:
                trainer.restore(point.tensors, point.meta)
        if trainer.epochs_done < cfg.epochs:  # the snapshot buffers now, not in the epoch of the first checkpoint
            with tl.span("checkpoint_buffers"):
                checkpointer.reserve(trainer.checkpoint_state()[0])
        timer, telemetry = EpochTimer(trainer.device), NvmlTelemetry(trainer.device)
        console.print(
            f"hotloop: env={cfg.env} device={trainer.device} epochs={cfg.epochs} "
            f"learner_steps_per_epoch={cfg.learner_steps_per_epoch} run_dir={run_dir}"
            + (f" (resumed after epoch {trainer.epochs_done})" if point is not None else "")
        )
        best = read_best(run_dir / BEST_FILE) if point is not None else None  # a new run starts with no best
        if best is not None and best["epoch"] > trainer.epochs_done:  # from an epoch after the checkpoint: re-run
            console.print(
                f"hotloop: note: {run_dir / BEST_FILE} holds epoch {best['epoch']}, after the checkpoint's "
                f"epoch {trainer.epochs_done}: that epoch is trained again, so the file is not counted as "
                f"the best (it is replaced at the next improvement)"
            )
            best = None
        best_epoch, best_return = (best["epoch"], best["eval_return"]) if best else (None, None)
        for epoch in range(trainer.epochs_done + 1, cfg.epochs + 1):
            watchdog.arm(f"epoch {epoch}")
            progress.update(task, description=f"epoch {epoch}/{cfg.epochs}", completed=0)
            epoch_start, warm_before = tl.now_s(), trainer.warmup_s
            with phase_range("epoch"):
                timer.start()
                if census is not None:
                    census.begin(epoch)
                try:
                    stats = trainer.run_epoch(epoch)
                finally:
                    if census is not None:
                        census.end()
            elapsed_ms = timer.elapsed_ms()  # raises RuntimeError if the loop never entered "readback"
            gpu_ms = elapsed_ms / stats.learner_steps if timer.uses_cuda_events else math.nan  # host time != GPU
            watchdog.disarm()
            tl.add("loop", stats.wall_s, epoch, start_s=epoch_start)
            if trainer.warmup_s > warm_before:
                tl.add("warmup", trainer.warmup_s - warm_before, epoch, start_s=epoch_start)
            tl.add("evaluate", stats.evaluate_s, epoch)
            if improves(stats.eval_return, best_return):  # written before the row that names it
                watchdog.arm(f"best policy {epoch}")
                with tl.span("best_policy", epoch):
                    save_best(run_dir / BEST_FILE, trainer, epoch, stats.eval_return)
                watchdog.disarm()
                best_epoch, best_return = epoch, stats.eval_return
            rows.append(
                {
                    **stats.as_row(),
                    "gpu_ms_per_step": gpu_ms,
                    "kernels_per_step": math.nan,
                    "syncs_per_step": math.nan,
                    **telemetry.sample(),
                    "best_epoch": math.nan if best_epoch is None else best_epoch,
                    **tl.epoch_columns(epoch),
                }
            )
            _write_epochs(rows, run_dir, tl, epoch, f"epoch {epoch}'s row")
            watchdog.arm(f"checkpoint {epoch}")  # a snapshot handed to the background writer (the last: written)
            with tl.span("checkpoint", epoch):
                checkpointer.checkpoint_epoch(epoch, trainer.checkpoint_state)
            watchdog.disarm()
            rows[-1].update(tl.epoch_columns(epoch))  # with the checkpoint's share: on disk with the next table
            warm = trainer.warmup_s - warm_before
            console.print(
                f"epoch {epoch}: {stats.wall_s:.1f} s"
                + (f" (of which {warm:.1f} s compiling kernels and capturing graphs)" if warm else "")
                + f", {stats.learner_steps_per_s:.0f} learner steps/s, "
                f"loss {stats.loss:.4g}, mean_return_100 {stats.mean_return_100:.1f}, "
                f"eval_return {stats.eval_return:.1f}, "
                f"epsilon {stats.epsilon:.3f}"
            )
        with tl.span("checkpoint_wait"):
            checkpointer.close()  # waits for the last epoch's write (watchdog: "checkpoint writer"); frees the buffers
        for rec in checkpointer.records:
            if rec.written and rec.write_start is not None:
                tl.add("checkpoint_write", rec.write_s, rec.epoch, start_s=rec.write_start - tl.origin, overlapped=True)
        if checkpointer.records:
            console.print(f"hotloop: {checkpointer.summary()}")
        if rows:
            for row in rows:  # the final per-epoch times (the checkpoint's share, its background write)
                if row["epoch"] > (point.epoch if point is not None else 0):
                    row.update(tl.epoch_columns(int(row["epoch"])))
            _write_epochs(rows, run_dir, tl, 0, "the epochs' final times")
        extra = None
        if after_epochs is not None:
            watchdog.arm("after epochs")
            with tl.span("after_epochs", nvtx=False):  # the gate's window keeps its own ranges
                extra = after_epochs(trainer)
            watchdog.disarm()
    if watched is not None:
        watched.update(watchdog.watched)
    table = epoch_frame(rows)
    with tl.span("plot"):
        plot_epochs(table, run_dir / "epochs.png")
    tl.write(run_dir)
    for line in tl.summary():
        console.print(f"hotloop: {line}")
    return table, extra

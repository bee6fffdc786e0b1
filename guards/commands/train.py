"""`hotloop train`: train a preset and write its per-epoch table (hotloop.guards.run.run_training), or continue a run
from its last checkpoint (--resume)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from hotloop.guards.commands.checks import RunPlan, check_folder_writable, check_run, new_run_folder
from hotloop.guards.commands.config_args import ConfigChoice, add_run_args, config_epilog
from hotloop.trainer.config import Config

if TYPE_CHECKING:
    from hotloop.trainer.resume import ResumePoint


@dataclass(frozen=True)
class TrainOptions:
    """`hotloop train`'s options: the `config` chosen, the run folder `out` (None: runs/<UTC timestamp>/), the hang
    watchdog's `epoch_timeout` (seconds), `progress` (the progress bar), the run folder to `resume` (None: a new
    run), `allow_config_change` (resume with a changed config.json) and `resume_point` (the checkpoint read from
    `resume`, set by `prepare`; None for a new run)."""

    config: ConfigChoice
    out: Path | None
    epoch_timeout: float
    progress: bool
    resume: Path | None
    allow_config_change: bool
    resume_point: ResumePoint | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TrainOptions:
        """The options of parsed `args`."""
        return cls(ConfigChoice.from_args(args), args.out, args.epoch_timeout, not args.no_progress, args.resume,
                   args.allow_config_change)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `train` subcommand to the `hotloop` parser's subparsers; returns its parser."""
    train = sub.add_parser("train", help="train a preset and write its per-epoch table", epilog=config_epilog(),
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           description="Train a preset; print and write the per-epoch table.")
    add_run_args(train)
    train.add_argument("--resume", type=Path, metavar="RUN_DIR",
                       help="continue the run in RUN_DIR from its last checkpoint (RUN_DIR/checkpoint.pt, written "
                            "after every epoch), with its config.json; --epochs N extends it to N epochs; "
                            "--preset, --config, --set, --seed, --device and --out cannot be given with it; a "
                            "config.json changed since the run started is refused (exit 2, naming the fields) "
                            "unless --allow-config-change")
    train.add_argument("--allow-config-change", action="store_true",
                       help="with --resume: train on with a config.json that differs from the one the checkpoint "
                            "was trained with (any field but epochs); the change (old and new values, the epoch) is "
                            "recorded in RUN_DIR/config_changes.json")
    return train


def prepare(args: argparse.Namespace) -> RunPlan[TrainOptions]:
    """Validate a parsed `hotloop train` before anything is trained or written, then make and lock its run folder
    (--out, new or empty; or, with --resume, RUN_DIR with its checkpoint read into the options' resume_point).
    Checked in this order: --allow-config-change only with --resume, --resume's options (`check_resume_args`), the
    config, --epoch-timeout, the device, env, learner and memory (hotloop.guards.commands.checks.check_run), that
    the run folder can be written and, when resuming, the run's checkpoint (`read_resume`). Raises ValueError (exit
    2) naming what is wrong; the folder's lock is released on any error after it was taken."""
    from hotloop.guards.watchdog import check_limit_s
    from hotloop.profiles.run_lock import acquire

    options = TrainOptions.from_args(args)
    if options.allow_config_change and options.resume is None:
        raise ValueError("--allow-config-change is for --resume RUN_DIR (a new run has no earlier config)")
    if options.resume is not None:
        options = check_resume_args(options)
    cfg = options.config.build()
    check_limit_s(options.epoch_timeout, "--epoch-timeout")  # a longer wait would kill the watchdog's thread
    check_run(cfg, trains=True)
    if options.resume is None:
        run_dir, lock = new_run_folder(options.out)
        return RunPlan(cfg, run_dir, lock, options)
    check_folder_writable(options.resume, "--resume")
    lock = acquire(options.resume)  # before the checkpoint is read: no other run may write it meanwhile
    try:
        return RunPlan(cfg, options.resume, lock, replace(options, resume_point=read_resume(options, cfg)))
    except BaseException:
        lock.release()
        raise


def check_resume_args(options: TrainOptions) -> TrainOptions:
    """`train --resume RUN_DIR`: no option that changes the config or the folder may come with it; returns the
    options with their config file pointed at RUN_DIR/config.json. ValueError naming the conflicting options or a
    missing folder."""
    choice = options.config
    given = [name for name, value in (("--preset", choice.preset), ("--config", choice.config),
                                      ("--set", choice.overrides), ("--seed", choice.seed),
                                      ("--device", choice.device), ("--out", options.out)) if value not in (None, ())]
    if given:
        raise ValueError(f"--resume continues the run with its own config.json and folder: {', '.join(given)} "
                         f"cannot be given with it (--epochs N extends the run)")
    if not options.resume.is_dir():
        raise ValueError(f"--resume {options.resume}: no such run folder")
    return replace(options, config=replace(choice, config=options.resume / "config.json"))


def read_resume(options: TrainOptions, cfg: Config) -> ResumePoint:
    """Read the checkpoint and per-epoch table of the run folder options.resume and check them against `cfg`
    (hotloop.trainer.resume.read_resume_point: also that config.json is the config the run was trained with, unless
    allow_config_change) and that epochs are left to run; writes nothing. ValueError naming the problem."""
    from hotloop.trainer.resume import read_resume_point

    try:
        point = read_resume_point(options.resume, cfg, allow_config_change=options.allow_config_change)
    except ValueError as exc:
        raise ValueError(f"--resume {options.resume}: {exc}") from exc
    if cfg.epochs <= point.epoch:
        raise ValueError(f"--resume {options.resume}: the run has finished {point.epoch} of its {cfg.epochs} "
                         f"epochs; pass --epochs N (N > {point.epoch}) to extend it")
    return point


def execute(plan: RunPlan[TrainOptions]) -> int:
    """Train the validated `plan` in its run folder (hotloop.guards.run.run_training) and print the per-epoch table
    and the folder; returns 0 (exceptions: hotloop.guards.commands.main.main)."""
    from hotloop.guards.run import run_training
    from hotloop.profiles.epoch_table import format_table

    options = plan.options
    table, _ = run_training(plan.cfg, plan.run_dir, options.epoch_timeout, options.progress,
                            resume=False if options.resume_point is None else options.resume_point)
    print("\nPer-epoch table\n" + format_table(table) + f"\n\nrun folder: {plan.run_dir}")
    return 0

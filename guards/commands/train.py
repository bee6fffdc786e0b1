"""`hotloop train`: train a preset and write its per-epoch table (hotloop.guards.run.run_training), or continue a run
from its last checkpoint (--resume); with --nproc N, data-parallel on N ranks launched by torchrun
(hotloop.guards.data_parallel), each such rank process being a `hotloop train` started by torchrun."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from hotloop.guards.commands.checks import RunPlan, check_folder_writable, check_run, new_run_folder, open_rank_folder
from hotloop.guards.commands.config_args import ConfigChoice, add_run_args, config_epilog
from hotloop.trainer.config import Config

if TYPE_CHECKING:
    from hotloop.trainer.distributed import RankInfo
    from hotloop.trainer.resume import ResumePoint

TRACE_STEPS = 20
"""Loop iterations each rank of a data-parallel run profiles after the epochs for its trace (--trace-steps)."""


@dataclass(frozen=True)
class TrainOptions:
    """`hotloop train`'s options: the `config` chosen, the run folder `out` (None: runs/<UTC timestamp>/), the hang
    watchdog's `epoch_timeout` (seconds), `progress` (the progress bar), the run folder to `resume` (None: a new
    run), `allow_config_change` (resume with a changed config.json), `nproc` (--nproc: launch that many ranks; None:
    no launch), `trace_steps` (each rank's profiled iterations), `resume_point` (the checkpoint read from `resume`,
    set by `prepare`; None for a new run) and `rank` (this process's RankInfo when it is a rank started by torchrun,
    set by `prepare`; None otherwise)."""

    config: ConfigChoice
    out: Path | None
    epoch_timeout: float
    progress: bool
    resume: Path | None
    allow_config_change: bool
    nproc: int | None = None
    trace_steps: int = 0
    resume_point: ResumePoint | None = None
    rank: RankInfo | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TrainOptions:
        """The options of parsed `args`."""
        return cls(
            ConfigChoice.from_args(args),
            args.out,
            args.epoch_timeout,
            not args.no_progress,
            args.resume,
            args.allow_config_change,
            args.nproc,
            args.trace_steps,
        )

    def rank_args(self, run_dir: Path) -> list[str]:
        """The `hotloop train` arguments every rank of a --nproc run gets: these options' config choice, the
        launcher's run folder `run_dir` as --out, --epoch-timeout, --trace-steps and --no-progress; no --nproc."""
        c = self.config
        args = [
            *(["--config", str(c.config)] if c.config else []),
            *(["--preset", c.preset] if c.preset else []),
            *(a for o in c.overrides for a in ("--set", o)),
            *(["--epochs", str(c.epochs)] if c.epochs is not None else []),
            *(["--device", c.device] if c.device else []),
            *(["--seed", str(c.seed)] if c.seed is not None else []),
            "--out",
            str(run_dir),
            "--epoch-timeout",
            repr(self.epoch_timeout),
            "--trace-steps",
            str(self.trace_steps),
        ]
        return args + ([] if self.progress else ["--no-progress"])


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `train` subcommand to the `hotloop` parser's subparsers; returns its parser."""
    train = sub.add_parser(
        "train",
        help="train a preset and write its per-epoch table",
        epilog=config_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a preset; print and write the per-epoch table.",
    )
    add_run_args(train)
    train.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its last checkpoint (RUN_DIR/checkpoint.pt, written "
        "after every epoch), with its config.json; --epochs N extends it to N epochs; "
        "--preset, --config, --set, --seed, --device and --out cannot be given with it; a "
        "config.json changed since the run started is refused (exit 2, naming the fields) "
        "unless --allow-config-change",
    )
    train.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="data-parallel on N ranks of this host (one GPU each on cuda, N <= the GPUs; gloo on the "
        "CPU), launched by torchrun: each rank runs its own actors and replay (seeded by rank) and "
        "the same learner step, the gradient averaged over the ranks (global batch = batch_size "
        "x N); rank 0 writes the run folder, rank R > 0 RUN_DIR/rank<R>/; not with --resume",
    )
    train.add_argument(
        "--trace-steps",
        type=int,
        default=None,
        metavar="K",
        help="data-parallel runs: after the epochs each rank profiles K loop iterations and writes "
        "trace_rank<R>.json.gz into its folder (`hotloop inspect RUN_DIR` compares the ranks); "
        f"default {TRACE_STEPS}, 0 for none",
    )
    train.add_argument(
        "--allow-config-change",
        action="store_true",
        help="with --resume: train on with a config.json that differs from the one the checkpoint "
        "was trained with (any field but epochs); the change (old and new values, the epoch) is "
        "recorded in RUN_DIR/config_changes.json",
    )
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
    from hotloop.trainer.distributed import launched_by_torchrun

    options = TrainOptions.from_args(args)
    if options.trace_steps is not None and options.trace_steps < 0:
        raise ValueError(f"--trace-steps must be >= 0, got {options.trace_steps}")
    options = replace(options, trace_steps=TRACE_STEPS if options.trace_steps is None else options.trace_steps)
    if launched_by_torchrun() or options.nproc is not None:
        return prepare_data_parallel(options)
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


def prepare_data_parallel(options: TrainOptions) -> RunPlan[TrainOptions]:
    """`prepare` for a data-parallel run (hotloop.guards.data_parallel). The launcher (--nproc N, outside torchrun):
    the config and device checks of a one-process run, --nproc (`check_nproc`), then the run folder made (new or
    empty) and locked; `execute` hands it to the ranks. A rank (started by torchrun): the same checks, then it
    joins the process group (its device becomes cuda:LOCAL_RANK on cuda); rank 0 makes and locks the run folder
    (--out, or runs/<UTC timestamp>/) and tells the others its path (or its error: every rank then raises it),
    rank R > 0 makes and locks RUN_DIR/rank<R>/. ValueError naming the problem: --resume (not supported for
    data-parallel runs), --nproc given to a rank, any check's."""
    from hotloop.guards.commands.checks import check_run
    from hotloop.guards.data_parallel import check_nproc, join
    from hotloop.guards.watchdog import check_limit_s
    from hotloop.trainer.device_choice import resolve_device
    from hotloop.trainer.distributed import launched_by_torchrun

    if options.resume is not None:
        raise ValueError("--resume is for one-process runs: a data-parallel run (--nproc, torchrun) cannot resume")
    if options.nproc is not None and launched_by_torchrun():
        raise ValueError(
            "--nproc launches torchrun itself: under torchrun, leave it out (torchrun's "
            "--nproc-per-node sets the ranks)"
        )
    cfg = options.config.build()
    check_limit_s(options.epoch_timeout, "--epoch-timeout")
    if launched_by_torchrun() and resolve_device(cfg.device).type == "cuda":  # this rank's GPU is checked
        cfg = replace(cfg, device=f"cuda:{os.environ['LOCAL_RANK']}")
    device, obs_dim, action_nvec = check_run(cfg, trains=True)
    if options.nproc is not None:
        from hotloop.trainer.memory_estimate import host_run_bytes

        check_nproc(options.nproc, device, host_run_bytes(cfg, device, obs_dim, action_nvec))
        run_dir, lock = new_run_folder(options.out)
        return RunPlan(cfg, run_dir, lock, options)

    info = join(resolve_device(cfg.device))[1]
    folder, lock = open_rank_folder(options.out, info)
    return RunPlan(cfg, folder, lock, replace(options, rank=info))


def check_resume_args(options: TrainOptions) -> TrainOptions:
    """`train --resume RUN_DIR`: no option that changes the config or the folder may come with it; returns the
    options with their config file pointed at RUN_DIR/config.json. ValueError naming the conflicting options or a
    missing folder."""
    choice = options.config
    given = [
        name
        for name, value in (
            ("--preset", choice.preset),
            ("--config", choice.config),
            ("--set", choice.overrides),
            ("--seed", choice.seed),
            ("--device", choice.device),
            ("--out", options.out),
        )
        if value not in (None, ())
    ]
    if given:
        raise ValueError(
            f"--resume continues the run with its own config.json and folder: {', '.join(given)} "
            f"cannot be given with it (--epochs N extends the run)"
        )
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
        raise ValueError(
            f"--resume {options.resume}: the run has finished {point.epoch} of its {cfg.epochs} "
            f"epochs; pass --epochs N (N > {point.epoch}) to extend it"
        )
    return point


def execute(plan: RunPlan[TrainOptions]) -> int:
    """Train the validated `plan` in its run folder (hotloop.guards.run.run_training) and print the per-epoch table
    and the folder; returns 0 (exceptions: hotloop.guards.commands.main.main)."""
    from hotloop.guards.run import run_training
    from hotloop.profiles.epoch_table import format_table

    options = plan.options
    if options.nproc is not None:  # the launcher: the ranks write the folder
        from hotloop.guards.data_parallel import launch

        plan.lock.release()
        code = launch(options.nproc, options.rank_args(plan.run_dir))
        if code != 0:
            print(
                f"hotloop train: torchrun exited {code} (a rank failed; its error.log is in {plan.run_dir} or "
                f"its rank<R>/)",
                file=sys.stderr,
            )
        return code
    if options.rank is not None:
        return execute_rank(plan)
    table, _ = run_training(
        plan.cfg,
        plan.run_dir,
        options.epoch_timeout,
        options.progress,
        resume=False if options.resume_point is None else options.resume_point,
    )
    print("\nPer-epoch table\n" + format_table(table) + f"\n\nrun folder: {plan.run_dir}")
    return 0


def execute_rank(plan: RunPlan[TrainOptions]) -> int:
    """One rank of a data-parallel run: train in its folder (hotloop.guards.run.run_training; the progress bar on
    rank 0 only), write its trace (hotloop.guards.data_parallel.rank_trace_hook), then leave the process group
    (hotloop.trainer.distributed.teardown: the learner's and actor's CUDA graphs first). Rank 0 prints the table
    and the run folder; returns 0."""
    from hotloop.guards.data_parallel import rank_trace_hook
    from hotloop.guards.run import run_training
    from hotloop.profiles.epoch_table import format_table
    from hotloop.trainer.distributed import teardown

    options, trainers = plan.options, []
    hook = rank_trace_hook(plan.run_dir, options.trace_steps, options.rank)

    def after_epochs(trainer):
        trainers.append(trainer)
        return hook(trainer)

    table, _ = run_training(
        plan.cfg,
        plan.run_dir,
        options.epoch_timeout,
        options.progress and options.rank.rank == 0,
        after_epochs=after_epochs,
    )
    teardown(*(owner for t in trainers for owner in (t.learner, t.actor) if owner is not None))
    if options.rank.rank == 0:
        print(
            "\nPer-epoch table (rank 0)\n" + format_table(table) + f"\n\nrun folder: {plan.run_dir} "
            f"({options.rank.world_size} ranks, {options.rank.backend})"
        )
    return 0

"""`hotloop gate`: run a preset under the guards (hotloop.guards.gate.run_gate); print the per-epoch and criteria
tables and exit 1 when a criterion or a baseline comparison fails. With --nproc N, the gate per rank of a
data-parallel run (hotloop.guards.data_parallel): the launching process runs `hotloop gate ...` on N ranks under
torchrun, each rank gates its own trainer (rank 0 in the run folder, rank R in rank<R>/), and the launcher, once
torchrun has returned, reads every rank's results and judges each criterion on the worst rank (`execute_ranks`)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from hotloop.guards.commands.checks import RunPlan, check_run, check_writable, new_run_folder, open_rank_folder
from hotloop.guards.commands.config_args import ConfigChoice, add_run_args, config_epilog
from hotloop.guards.fault_list import inject_help
from hotloop.trainer.config import Config

if TYPE_CHECKING:
    import torch

    from hotloop.guards.gate import GateOptions
    from hotloop.trainer.distributed import RankInfo


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `gate` subcommand to the `hotloop` parser's subparsers; returns its parser."""
    fmt = argparse.RawDescriptionHelpFormatter
    gate = sub.add_parser(
        "gate",
        help="run a preset under the guards; print per-epoch and criteria tables",
        epilog=config_epilog(),
        formatter_class=fmt,
        description="Run a preset under the per-epoch timer and hang watchdog; print the "
        "per-epoch table and the criteria table; exit 1 if a criterion fails.",
    )
    add_run_args(gate)
    gate.add_argument(
        "--guard-steps",
        type=int,
        default=None,
        metavar="K",
        help="consecutive training-loop iterations (Trainer.iterate: env steps, learner step, the "
        "periodic work) profiled and hooked after the epochs (default: max(20, the longest "
        "period of the loop's periodic phases: readback every log_interval, target update every "
        "target_update_interval, progress), so every periodic phase runs in the window; a "
        "smaller K may leave a phase out: the coverage table flags it and the criteria that "
        "apply to it are not measured); a window whose estimated memory (the profiler's "
        "events: K x --repeats x a per-step bound, hotloop.trainer.memory_estimate) exceeds the "
        "host's available memory is refused (exit 2)",
    )
    gate.add_argument(
        "--guard-warmup",
        type=int,
        default=3,
        metavar="W",
        help="unprofiled loop iterations before the window (default 3)",
    )
    gate.add_argument(
        "--repeats",
        type=int,
        default=1,
        metavar="R",
        help="repeats of the guarded window; the baseline compares their medians (default 1)",
    )
    gate.add_argument(
        "--baseline",
        type=Path,
        metavar="JSON",
        help="baseline to compare with (default on CUDA: <baseline dir>/<gpu-name-slug>.json, "
        "<gpu-name-slug>--<preset>.json for a preset other than cartpole, "
        "when it exists and was measured with this configuration)",
    )
    gate.add_argument(
        "--baseline-dir",
        type=Path,
        metavar="DIR",
        help="folder of per-GPU baselines (<gpu-name-slug>[--<preset>].json) the default baseline is looked up in "
        "(default: the ones installed with hotloop, hotloop.guards/baseline_files/)",
    )
    gate.add_argument("--no-baseline", action="store_true", help="compare with no baseline (the criteria alone decide)")
    gate.add_argument(
        "--update-baseline", action="store_true", help="write this run's repeats as the baseline instead of comparing"
    )
    gate.add_argument(
        "--no-loop-census",
        action="store_true",
        help="turn off the census of the training loop's host syncs over every epoch after the first, "
        "outside the guarded window (on by default, CUDA only): criterion \"no sync in the epochs' "
        'loop" is then not measured',
    )
    gate.add_argument(
        "--no-structure-census",
        action="store_true",
        help="turn off the census of the training loop's D2D copies, memsets / fills and grid (1,1,1) "
        "launches over every epoch after the first, outside the guarded window (on by default, "
        "CUDA only; hotloop.guards.loop_structure): work of those kinds that runs less often than "
        "the window, e.g. a clone every 200 iterations, then passes; the rows' census column says "
        "off",
    )
    gate.add_argument(
        "--census-overhead",
        type=int,
        nargs="?",
        const=5,
        default=0,
        metavar="PAIRS",
        help="after the epochs, time K loop iterations with no census, with the structure census and "
        "with both censuses, PAIRS times each (default 5; device-synchronized), and print the "
        "censuses' overhead per iteration (the window then starts 3 x (1 + PAIRS) x K iterations "
        "later)",
    )
    gate.add_argument(
        "--inject",
        metavar="FAULT",
        help="inject a fault before the guarded steps (a mutation test of the gate: it must then "
        f"fail that fault's criterion, by id: hotloop criteria): {inject_help()} "
        "(guards/fault_list.py; extra_collective, rank_sync and rank_hang act on rank 1 of a --nproc gate)",
    )
    gate.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="the gate per rank of a data-parallel run on N ranks of this host (as `hotloop train --nproc N`: "
        "torchrun, one GPU per rank on cuda, gloo on the CPU): every rank runs the epochs, the guarded window "
        "and the censuses on its own trainer (rank 0 in the run folder, rank R in rank<R>/), then the ranks' "
        "results are judged together: a per-rank table, each criterion on the worst rank (a FAIL names the "
        "ranks), one all-reduce per learner step (any other collective FAILs), a straggler row; a hang on any "
        "rank ends every rank with exit 3 (each rank's watchdog). No baseline is compared (not with "
        "--baseline, --baseline-dir or --update-baseline)",
    )
    return gate


@dataclass(frozen=True)
class RankGate:
    """The options of a data-parallel gate (--nproc N): the ranks' `gate` options (hotloop.guards.gate.GateOptions)
    and either, in the launcher, `nproc` and the `rank_args` every rank gets (`gate_rank_args`), or, in a rank
    started by torchrun, its `rank` (RankInfo); `cpu`: the ranks run on the CPU."""

    gate: GateOptions
    nproc: int | None = None
    rank_args: tuple[str, ...] = ()
    rank: RankInfo | None = None
    cpu: bool = True


def prepare(args: argparse.Namespace) -> RunPlan[GateOptions]:
    """Validate a parsed `hotloop gate` before anything is trained or written, then make and lock its run folder
    (--out, new or empty). Checked in this order: the config, --epoch-timeout, the gate's options and baseline
    (`check_gate_args`), the device, env, learner and memory (hotloop.guards.commands.checks.check_run), that the
    guarded window fits in the host's memory (`check_window_fits`) and that the run folder can be written. Raises
    ValueError (exit 2) naming what is wrong."""
    from hotloop.guards.watchdog import check_limit_s
    from hotloop.trainer.distributed import launched_by_torchrun

    if args.nproc is not None or launched_by_torchrun():
        return prepare_ranks(args)
    cfg = ConfigChoice.from_args(args).build()
    check_limit_s(args.epoch_timeout, "--epoch-timeout")  # a longer wait would kill the watchdog's thread
    options = check_gate_args(args, cfg)
    device, obs_dim, action_nvec = check_run(cfg, trains=True)
    check_window_fits(options, cfg, device, obs_dim, action_nvec)
    run_dir, lock = new_run_folder(args.out)
    return RunPlan(cfg, run_dir, lock, options)


def prepare_ranks(args: argparse.Namespace) -> RunPlan[RankGate]:
    """`prepare` for a data-parallel gate. The launcher (--nproc N, outside torchrun): the checks of a one-process
    gate with the ranks' world size (a one-rank fault needs N >= 2), --nproc (hotloop.guards.data_parallel.
    check_nproc), then the run folder made (new or empty) and locked; `execute_ranks` hands it to the ranks. A rank
    (started by torchrun): the same checks (its device cuda:LOCAL_RANK on cuda), then it joins the process group
    and makes and locks its folder (`open_rank_folder`). ValueError naming the problem: --nproc under torchrun,
    --nproc with a baseline option, any check's."""
    from hotloop.guards.data_parallel import HANG_RECORD, check_nproc, join
    from hotloop.guards.watchdog import check_limit_s
    from hotloop.trainer.device_choice import resolve_device
    from hotloop.trainer.distributed import launched_by_torchrun

    if args.nproc is not None and launched_by_torchrun():
        raise ValueError(
            "--nproc launches torchrun itself: under torchrun, leave it out (torchrun's --nproc-per-node sets the "
            "ranks)"
        )
    if args.update_baseline or args.baseline is not None or args.baseline_dir is not None:
        raise ValueError(
            "--nproc: the data-parallel gate compares no baseline (each rank is judged by the criteria and the "
            "straggler row): leave out --baseline, --baseline-dir and --update-baseline"
        )
    if args.nproc is not None and (isinstance(args.nproc, bool) or args.nproc < 1):
        raise ValueError(f"--nproc must be an int >= 1, got {args.nproc!r}")
    if getattr(args, "repeats", 1) != 1:
        raise ValueError(
            f"--nproc: one guarded window per rank (its collectives are counted in it); leave out --repeats "
            f"(got {args.repeats})"
        )
    cfg = ConfigChoice.from_args(args).build()
    check_limit_s(args.epoch_timeout, "--epoch-timeout")
    if launched_by_torchrun() and resolve_device(cfg.device).type == "cuda":  # this rank's GPU is checked
        cfg = replace(cfg, device=f"cuda:{os.environ['LOCAL_RANK']}")
    world = args.nproc if args.nproc is not None else int(os.environ["WORLD_SIZE"])
    options = check_gate_args(argparse.Namespace(**{**vars(args), "no_baseline": True}), cfg, world_size=world)
    device, obs_dim, action_nvec = check_run(cfg, trains=True)
    rank_bytes = check_window_fits(options, cfg, device, obs_dim, action_nvec)
    cpu = device.type == "cpu"
    if args.nproc is not None:
        check_nproc(args.nproc, device, rank_bytes)
        run_dir, lock = new_run_folder(args.out)
        return RunPlan(cfg, run_dir, lock, RankGate(options, args.nproc, tuple(gate_rank_args(args, run_dir)), cpu=cpu))
    info = join(resolve_device(cfg.device))[1]
    folder, lock = open_rank_folder(args.out, info)
    options = replace(options, hang_record=folder / HANG_RECORD, show_progress=options.show_progress and info.rank == 0)
    return RunPlan(cfg, folder, lock, RankGate(options, rank=info, cpu=cpu))


def gate_rank_args(args: argparse.Namespace, run_dir: Path) -> list[str]:
    """The `hotloop gate` arguments every rank of a --nproc gate gets: the config choice, the launcher's run folder
    `run_dir` as --out, --epoch-timeout, the window's and the censuses' options, --inject, --no-baseline and
    --no-progress as given; no --nproc."""
    c = ConfigChoice.from_args(args)
    return [
        *(["--config", str(c.config)] if c.config else []),
        *(["--preset", c.preset] if c.preset else []),
        *(a for o in c.overrides for a in ("--set", o)),
        *(["--epochs", str(c.epochs)] if c.epochs is not None else []),
        *(["--device", c.device] if c.device else []),
        *(["--seed", str(c.seed)] if c.seed is not None else []),
        "--out",
        str(run_dir),
        "--epoch-timeout",
        repr(args.epoch_timeout),
        *(["--guard-steps", str(args.guard_steps)] if args.guard_steps is not None else []),
        "--guard-warmup",
        str(args.guard_warmup),
        "--repeats",
        str(args.repeats),
        *(["--no-loop-census"] if args.no_loop_census else []),
        *(["--no-structure-census"] if args.no_structure_census else []),
        *(["--census-overhead", str(args.census_overhead)] if args.census_overhead else []),
        *(["--inject", args.inject] if args.inject else []),
        "--no-baseline",
        *(["--no-progress"] if args.no_progress else []),
    ]


def execute(plan: RunPlan[GateOptions] | RunPlan[RankGate]) -> int:
    """Run the validated gate `plan` in its run folder; returns its exit code (0 pass, 1 a criterion or a baseline
    comparison failed; a data-parallel gate: `execute_ranks`; exceptions: hotloop.guards.commands.main.main)."""
    from hotloop.guards.gate import run_gate

    if isinstance(plan.options, RankGate):
        return execute_ranks(plan)
    return run_gate(plan.cfg, plan.run_dir, plan.options)


def _sigterm_when_back_in_python(signum: int, frame: object) -> None:
    """A rank's SIGTERM handler: exit 128 + SIGTERM, run only once the main thread is back in Python code."""
    raise SystemExit(128 + signum)


def execute_ranks(plan: RunPlan[RankGate]) -> int:
    """A data-parallel gate. The launcher: release the run folder to the ranks, run `hotloop gate` on them under
    torchrun (hotloop.guards.data_parallel.launch), then print the ranks' verdict (hotloop.guards.data_parallel.
    ranks_report: the per-rank table, each criterion on the worst rank, the straggler row) and return its exit code
    (0 every rank passed, 1 a criterion or the straggler row failed, 3 a hang on any rank, 2 / 70 a rank ended on
    bad input / an error).

    A rank: its SIGTERM handled in Python (`_sigterm_when_back_in_python`), so that a rank blocked inside a
    collective when torchrun stops the ranks (after another ended first) is not killed before its own hang
    watchdog reports (torchrun sends SIGKILL 30 s after SIGTERM); the one-process gate on its trainer
    (hotloop.guards.gate.run_gate; its hang watchdog writes HANG_RECORD), its collectives per step
    (write_rank_collectives), its exit record (RANK_EXIT; 70 on an exception, which propagates), then it leaves the
    process group under a watchdog of --epoch-timeout (hotloop.trainer.distributed.teardown; a rank that cannot
    leave ends with exit 3 and a hang record). teardown's barrier comes after the record: no rank exits before every
    rank has recorded its verdict, so torchrun stopping the others once one exits (with 1, a failed criterion)
    cannot lose one."""
    from hotloop.guards.data_parallel import launch, ranks_report, write_rank_collectives, write_rank_exit
    from hotloop.guards.gate import TRACE_FILE, run_gate
    from hotloop.guards.watchdog import HangWatchdog
    from hotloop.trainer.distributed import teardown

    options = plan.options
    if options.nproc is not None:
        plan.lock.release()
        launch(options.nproc, list(options.rank_args), "gate")
        text, code = ranks_report(plan.run_dir, options.nproc, options.cpu)
        print(text, flush=True)
        return code
    signal.signal(signal.SIGTERM, _sigterm_when_back_in_python)
    rank = options.rank.rank
    try:
        code = run_gate(plan.cfg, plan.run_dir, options.gate)
        write_rank_collectives(plan.run_dir, plan.run_dir / TRACE_FILE)
    except BaseException as exc:
        stopped = isinstance(exc, SystemExit) and exc.code == 128 + signal.SIGTERM  # torchrun's (or a user's) SIGTERM
        code = 130 if isinstance(exc, KeyboardInterrupt) else exc.code if stopped else 70
        write_rank_exit(plan.run_dir, rank, code, "terminated (SIGTERM)" if stopped else repr(exc)[:300])
        raise
    write_rank_exit(plan.run_dir, rank, code)
    with HangWatchdog(options.gate.epoch_limit_s, hang_record=options.gate.hang_record) as watchdog:
        watchdog.arm("leaving the process group")
        teardown()
        watchdog.disarm()
    return code


def check_window_fits(
    options: GateOptions, cfg: Config, device: torch.device, obs_dim: int, action_nvec: tuple[int, ...]
) -> int:
    """ValueError naming --guard-steps (and --repeats) when the guarded windows' estimated host memory
    (hotloop.trainer.memory_estimate.check_window_memory: K steps x R repeats x the per-step bound of the profiler's
    trace events; on a CPU device plus the run's own estimate) exceeds the host's available memory, with the
    estimate and how many steps fit. K is hotloop.guards.gate.window_size's (options.guard_steps, else the
    default). Returns the estimate (bytes: the windows plus the run's host bytes), which is also what one rank of
    a --nproc gate holds beyond its process (hotloop.guards.data_parallel.check_nproc)."""
    from hotloop.guards.gate import window_size
    from hotloop.trainer.device_choice import learner_kind
    from hotloop.trainer.memory_estimate import check_window_memory, host_run_bytes

    kind = learner_kind(cfg, device)
    k, _, _ = window_size(cfg, kind, options.guard_steps)
    run_bytes = host_run_bytes(cfg, device, obs_dim, action_nvec)
    try:
        return check_window_memory(k, options.repeats, device, kind, run_bytes) + run_bytes
    except ValueError as exc:
        given = f"--guard-steps {k}" if options.guard_steps is not None else f"--guard-steps (default {k})"
        raise ValueError(f"{given} with --repeats {options.repeats}: {exc}") from None


def check_gate_args(args: argparse.Namespace, cfg: Config, world_size: int = 1) -> GateOptions:
    """Check the gate-only options of parsed `args` and return the gate's options (hotloop.guards.gate.GateOptions)
    with the baseline resolved: --no-baseline -> none; an explicit --baseline must have been measured with `cfg`'s
    step on this GPU (hotloop.guards.gate.baseline_mismatch); the default one (guards/baseline_files/<gpu>.json)
    is dropped with a note on stderr when it was not; --inject needs a CUDA device (and, for a learner fault, the
    hotloop learner; a one-rank fault runs on any device and needs `world_size` >= 2: the ranks of --nproc);
    --update-baseline needs a baseline path that can be written (`check_writable`) and whose file, if there is
    one, is a baseline outside any live run's folder (hotloop.guards.baselines.check_baseline_target). ValueError
    (naming the option) before any training."""
    from hotloop.guards.baselines import check_baseline_target, load_baseline
    from hotloop.guards.faults import check_request
    from hotloop.guards.gate import GateOptions, baseline_mismatch, default_baseline
    from hotloop.trainer.device_choice import learner_kind, resolve_device

    check_request(args.inject, args.update_baseline)
    if args.inject is not None:
        device = resolve_device(cfg.device)
        check_request(
            args.inject,
            device=device,
            learner=learner_kind(cfg, device),
            spectral_norm=cfg.spectral_norm,
            world_size=world_size,
            grouped_forward=cfg.grouped_forward,
        )
    if (args.guard_steps is not None and args.guard_steps < 1) or args.guard_warmup < 0 or args.repeats < 1:
        raise ValueError(
            f"--guard-steps and --repeats must be >= 1 and --guard-warmup >= 0, got "
            f"{args.guard_steps}, {args.repeats}, {args.guard_warmup}"
        )
    if args.census_overhead < 0:
        raise ValueError(f"--census-overhead PAIRS must be >= 1 (or 0: off), got {args.census_overhead}")
    options = GateOptions(
        epoch_limit_s=args.epoch_timeout,
        show_progress=not args.no_progress,
        guard_steps=args.guard_steps,
        guard_warmup=args.guard_warmup,
        repeats=args.repeats,
        baseline=args.baseline,
        update_baseline=args.update_baseline,
        inject=args.inject,
        loop_census=not args.no_loop_census,
        structure_census=not args.no_structure_census,
        census_overhead_pairs=args.census_overhead,
    )
    explicit = args.baseline is not None
    if args.no_baseline:
        if explicit or args.update_baseline or args.baseline_dir is not None:
            raise ValueError("--no-baseline cannot be given with --baseline, --baseline-dir or --update-baseline")
        return options
    if explicit and args.baseline_dir is not None:
        raise ValueError(
            "--baseline-dir cannot be given with --baseline (it names the folder the default one is looked up in)"
        )
    baseline = args.baseline
    found = None if explicit else default_baseline(args.baseline_dir, preset=args.preset)
    if found is not None and (found.exists() or args.update_baseline):
        baseline = found
    if args.update_baseline:
        if baseline is None:
            raise ValueError("--update-baseline needs --baseline PATH on a machine without CUDA")
        try:  # before check_writable, whose open for appending would wait on a FIFO
            check_baseline_target(baseline)  # not a baseline, or in a live run's folder: refused
        except ValueError as exc:
            raise ValueError(f"--baseline {exc}") from None
        check_writable(baseline, "--baseline")
    elif baseline is not None:
        loaded = load_baseline(baseline)  # a missing or broken baseline is bad input: fail before training
        try:
            differ = baseline_mismatch(loaded, cfg)
        except (RuntimeError, TypeError, AttributeError) as exc:  # e.g. "device": "tpu" in the file's config
            raise ValueError(
                f'--baseline {baseline}: its "config" cannot be compared with this run: {type(exc).__name__}: {exc}'
            ) from None
        if differ is None:
            print(
                f"hotloop gate: note: the baseline {baseline} records no configuration: compared as it is "
                f"(rewrite it with --update-baseline to record one)",
                file=sys.stderr,
            )
        elif differ and not explicit:
            print(
                f"hotloop gate: note: not comparing with the default baseline {baseline}: it was measured "
                f"with another configuration ({'; '.join(differ)})",
                file=sys.stderr,
            )
            baseline = None
        elif differ:
            raise ValueError(
                f"--baseline {baseline} was measured with another configuration ("
                f"{'; '.join(differ)}): run the gate with the baseline's preset and settings, pass "
                f"another --baseline, or rewrite this one with --update-baseline"
            )
    return replace(options, baseline=baseline)

"""`hotloop bench`: time the loop iteration and the learner-step variants side by side in one process
(hotloop.guards.probes.bench.run_bench, imported only when it runs, as it needs torch); print and write bench.csv/.md."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from hotloop.guards.commands.checks import RunPlan, check_out_writable, check_run
from hotloop.guards.commands.config_args import ConfigChoice, config_epilog
from hotloop.trainer.config import PRESETS


@dataclass(frozen=True)
class BenchOptions:
    """`hotloop bench`'s options past the config: the `variants` to time (names of hotloop.guards.probes.bench.VARIANTS,
    expanded, in order), the timed `steps` and the untimed `warmup` steps per variant."""

    variants: tuple[str, ...]
    steps: int
    warmup: int


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `bench` subcommand to the `hotloop` parser's subparsers; returns its parser."""
    bench = sub.add_parser(
        "bench",
        help="time the loop iteration and learner-step variants side by side in one process; print and "
        "write bench.csv/.md",
        epilog=config_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Time the whole training-loop iteration (Trainer.iterate(1): env step, learner step, periodic "
        "readback; the table's first row) and one learner step (PER sample + Double-DQN update + "
        "priority update) built several ways (eager, one CUDA graph, torch.compile + graph, hotloop's "
        "own), one after the other in this process on one device; print the table with a roofline "
        "floor and write bench.csv and bench.md. Variants that need CUDA are skipped (a row saying "
        "so) on a CPU device.",
    )
    bench.add_argument(
        "--preset",
        default="seed-scale",
        choices=sorted(PRESETS),
        help="named configuration (default seed-scale, the shape perf numbers are quoted at)",
    )
    bench.add_argument("--config", type=Path, help="start from a config JSON instead of a preset")
    bench.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config field (repeatable); keys below",
    )
    bench.add_argument("--seed", type=int, help="override the preset's seed")
    bench.add_argument("--device", help="cpu, cuda, cuda:N or auto (default: the preset's, auto)")
    bench.add_argument(
        "--variants",
        default="all",
        metavar="NAMES",
        help="comma-separated variants (hotloop.guards.probes.bench.VARIANTS): iteration (the whole loop "
        "iteration, always the first row), eager, graph-fp32, graph-tf32, compiled-split, "
        "compiled-tf32, hotloop; or all, graph (= graph-fp32,graph-tf32), "
        "compiled (= compiled-split,compiled-tf32) (default all); and lever variants hotloop:<lever>[+<lever>...], "
        "the hotloop step with those Config switches on (levers: hotloop.guards.probes.bench.LEVERS, e.g. "
        "hotloop:dependent_launch)",
    )
    bench.add_argument(
        "--steps",
        type=int,
        default=200,
        help="timed learner steps per variant (default 200; the "
        "iteration's rounded up to whole periods of its periodic phases, e.g. log_interval)",
    )
    bench.add_argument("--warmup", type=int, default=20, help="untimed steps per variant before them (default 20)")
    bench.add_argument(
        "--out",
        type=Path,
        help="folder for bench.csv and bench.md, and the kernel-gap tables kernel_gaps_<variant>.csv of the "
        "iteration and hotloop rows (default: runs/<UTC timestamp>/ under the working directory); refused if it "
        "already holds any of them",
    )
    bench.set_defaults(epochs=None)
    return bench


def prepare(args: argparse.Namespace) -> RunPlan[BenchOptions]:
    """Validate a parsed `hotloop bench` before anything is timed or written, then make its folder (--out, which
    may exist unless it holds bench.csv or bench.md; default runs/<UTC timestamp>/). Checked in this order: the
    config, the bench options (`check_bench_args`), the device, env and memory
    (hotloop.guards.commands.checks.check_run), --out. Raises ValueError (exit 2) naming what is wrong."""
    from hotloop.guards.probes.bench import check_out_dir
    from hotloop.profiles.epoch_table import new_run_dir

    cfg = ConfigChoice.from_args(args).build()
    options = check_bench_args(args)
    check_run(cfg, trains=False)
    if args.out:
        check_out_dir(args.out)
    check_out_writable(args.out)
    try:
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
        return RunPlan(cfg, args.out or new_run_dir(), None, options)
    except OSError as exc:
        raise ValueError(f"cannot create the run folder {args.out or 'runs/'}: {exc.strerror or exc}") from exc


def check_bench_args(args: argparse.Namespace) -> BenchOptions:
    """The bench options of parsed `args`: --variants (expanded: hotloop.guards.probes.bench.expand_variants), --steps >= 1,
    --warmup >= 0; ValueError naming the option (and, for a bad variant, the valid ones)."""
    from hotloop.guards.probes.bench import expand_variants

    try:
        variants = expand_variants(args.variants)
    except ValueError as exc:
        raise ValueError(f"--variants: {exc}") from None
    if args.steps < 1 or args.warmup < 0:
        raise ValueError(f"--steps must be >= 1 and --warmup >= 0, got {args.steps} and {args.warmup}")
    return BenchOptions(tuple(variants), args.steps, args.warmup)


def execute(plan: RunPlan[BenchOptions]) -> int:
    """Time the validated bench `plan`'s variants and write their table into its folder; returns 0 (exceptions:
    hotloop.guards.commands.main.main)."""
    from hotloop.guards.probes.bench import run_bench
    from hotloop.trainer.device_choice import resolve_device

    options = plan.options
    run_bench(
        plan.cfg, resolve_device(plan.cfg.device), list(options.variants), options.steps, options.warmup, plan.run_dir
    )
    print(f"\nbench folder: {plan.run_dir}")
    return 0

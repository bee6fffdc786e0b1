"""The `hotloop` command line: `hotloop train`, `hotloop gate`, `hotloop bench`, `hotloop inspect`,
`hotloop report` and `hotloop nsys`.

Exit codes (`main`; ci/gate.sh and ci/README.md act on them):
  0   success / pass
  1   a criterion or a baseline regression failed (`hotloop gate`)
  2   bad usage or input: a bad option, config value, config or baseline file, device, or a run that cannot fit in
      the device's memory (or a gate whose guarded window cannot fit in the host's: --guard-steps, --repeats);
      found before anything is trained or written
  3   hang: the watchdog stopped an epoch (guards/watchdog.py)
  70  internal error (EX_SOFTWARE of sysexits.h): an unexpected exception; one line on stderr names its type,
      message and where it was raised, and the full traceback is saved as <run folder>/error.log (or, when no run
      folder exists yet, a temporary file the line names); also when the hang watchdog's thread fails: the run
      stops rather than go on unguarded (guards/watchdog.py)
      A full disk is exit 70 too, its line saying "disk full" (not "internal error") and what the run folder
      keeps: its last complete checkpoint, resumable with `hotloop train --resume` (hotloop.profiles.disk_full)
  130 interrupted (Ctrl-C); the finished epochs stay in the run folder
  141 stdout was closed early (e.g. piped into `head`), as 128 + SIGPIPE; nothing more is printed
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
import traceback
from pathlib import Path

from hotloop.guards.learning_report import add_learning_parser, run_learning
from hotloop.guards.mutate import add_mutate_parser, run_mutate
from hotloop.profiles.disk_full import DiskFullError, disk_full_cause
from hotloop.profiles.inspect_cmd import add_inspect_parser, run_inspect, stdout_to_devnull
from hotloop.profiles.nsys_cmd import add_nsys_parser, run_nsys
from hotloop.profiles.report import add_report_parser, run_report
from hotloop.trainer.config import PRESETS, Config, field_docs, parse_override, preset

USAGE_ERROR = 2
INTERNAL_ERROR = 70
"""Exit code of an unexpected exception (EX_SOFTWARE, sysexits.h): never 1, which means "a criterion failed"."""
INTERRUPTED = 130
BROKEN_PIPE = 141
ERROR_LOG = "error.log"
"""The traceback of an internal error, in the run folder."""


def _config_epilog() -> str:
    lines = ["config keys for --set KEY=VALUE (defaults are the cartpole preset):"]
    defaults = Config()
    for name, doc in field_docs().items():
        lines.append(f"  {name} = {getattr(defaults, name)!r}")
        lines.extend(textwrap.wrap(doc, 90, initial_indent="      ", subsequent_indent="      "))
    return "\n".join(lines)


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", choices=sorted(PRESETS), help="named configuration (default cartpole)")
    p.add_argument("--epochs", type=int, help="override the preset's number of epochs")
    p.add_argument("--device", help="cpu, cuda, cuda:N or auto (default: the preset's, auto)")
    p.add_argument("--seed", type=int, help="override the preset's seed")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config field (repeatable); keys below")
    p.add_argument("--config", type=Path, help="start from a config JSON (as written to a run folder) "
                   "instead of a preset")
    p.add_argument("--out", type=Path,
                   help="run folder (default: runs/<UTC timestamp>/ under the working directory)")
    p.add_argument("--epoch-timeout", type=float, default=900.0, metavar="SECONDS",
                   help="hang watchdog: an epoch longer than this dumps all stacks and exits 3 (default 900; at "
                        "most threading.TIMEOUT_MAX, about 292 years on Linux)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hotloop", description="GPU-resident DQN trainer and the guards that keep its hot loop fast.",
        epilog="exit codes: 0 ok, 1 a criterion or regression failed, 2 bad usage or input, 3 hang, "
               "70 internal error (traceback in <run folder>/error.log), 130 interrupted, 141 stdout closed")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fmt = argparse.RawDescriptionHelpFormatter
    train = sub.add_parser("train", help="train a preset and write its per-epoch table", epilog=_config_epilog(),
                           formatter_class=fmt, description="Train a preset; print and write the per-epoch table.")
    _add_run_args(train)
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
    gate = sub.add_parser("gate", help="run a preset under the guards; print per-epoch and criteria tables",
                          epilog=_config_epilog(), formatter_class=fmt,
                          description="Run a preset under the per-epoch timer and hang watchdog; print the "
                                      "per-epoch table and the criteria table; exit 1 if a criterion fails.")
    _add_run_args(gate)
    gate.add_argument("--guard-steps", type=int, default=None, metavar="K",
                      help="consecutive training-loop iterations (Trainer.iterate: env steps, learner step, the "
                           "periodic work) profiled and hooked after the epochs (default: max(20, the longest "
                           "period of the loop's periodic phases: readback every log_interval, target update every "
                           "target_update_interval, progress), so every periodic phase runs in the window; a "
                           "smaller K may leave a phase out: the coverage table flags it and the criteria that "
                           "apply to it are not measured); a window whose estimated memory (the profiler's "
                           "events: K x --repeats x a per-step bound, hotloop.trainer.memory_estimate) exceeds the "
                           "host's available memory is refused (exit 2)")
    gate.add_argument("--guard-warmup", type=int, default=3, metavar="W",
                      help="unprofiled loop iterations before the window (default 3)")
    gate.add_argument("--repeats", type=int, default=1, metavar="R",
                      help="repeats of the guarded window; the baseline compares their medians (default 1)")
    gate.add_argument("--baseline", type=Path, metavar="JSON",
                      help="baseline to compare with (default on CUDA: <baseline dir>/<gpu-name-slug>.json, "
                           "<gpu-name-slug>--<preset>.json for a preset other than cartpole, "
                           "when it exists and was measured with this configuration)")
    gate.add_argument("--baseline-dir", type=Path, metavar="DIR",
                      help="folder of per-GPU baselines (<gpu-name-slug>[--<preset>].json) the default baseline is looked up in "
                           "(default: the ones installed with hotloop, hotloop.guards/baseline_files/)")
    gate.add_argument("--no-baseline", action="store_true",
                      help="compare with no baseline (the criteria alone decide)")
    gate.add_argument("--update-baseline", action="store_true",
                      help="write this run's repeats as the baseline instead of comparing")
    gate.add_argument("--no-loop-census", action="store_true",
                      help="turn off the census of the training loop's host syncs over every epoch after the first, "
                           "outside the guarded window (on by default, CUDA only): criterion \"no sync in the epochs' "
                           "loop\" is then not measured")
    gate.add_argument("--no-structure-census", action="store_true",
                      help="turn off the census of the training loop's D2D copies, memsets / fills and grid (1,1,1) "
                           "launches over every epoch after the first, outside the guarded window (on by default, "
                           "CUDA only; hotloop.guards.loop_structure): work of those kinds that runs less often than "
                           "the window, e.g. a clone every 200 iterations, then passes; the rows' census column says "
                           "off")
    gate.add_argument("--census-overhead", type=int, nargs="?", const=5, default=0, metavar="PAIRS",
                      help="after the epochs, time K loop iterations with no census, with the structure census and "
                           "with both censuses, PAIRS times each (default 5; device-synchronized), and print the "
                           "censuses' overhead per iteration (the window then starts 3 x (1 + PAIRS) x K iterations "
                           "later)")
    gate.add_argument("--inject", metavar="FAULT",
                      help="inject a fault before the guarded steps (a mutation test of the gate: it must then "
                           "fail that fault's criterion): item, event_sync, device_sync, pageable_copy, d2d_copy, "
                           "grid1, sn_split, ddqn_serial, fwd_fp32, bwd_tf32 (guards/faults.py)")
    _add_bench_parser(sub, fmt)
    add_inspect_parser(sub)
    add_report_parser(sub)
    add_nsys_parser(sub)
    add_mutate_parser(sub)
    add_learning_parser(sub)
    return parser


def _add_bench_parser(sub: argparse._SubParsersAction, fmt: type[argparse.HelpFormatter]) -> None:
    """The `hotloop bench` subcommand (guards/bench.py; imported only when it runs, as it needs torch)."""
    bench = sub.add_parser(
        "bench", help="time the loop iteration and learner-step variants side by side in one process; print and "
                      "write bench.csv/.md",
        epilog=_config_epilog(), formatter_class=fmt,
        description="Time the whole training-loop iteration (Trainer.iterate(1): env step, learner step, periodic "
                    "readback; the table's first row) and one learner step (PER sample + Double-DQN update + "
                    "priority update) built several ways (eager, one CUDA graph, torch.compile + graph, hotloop's "
                    "own), one after the other in this process on one device; print the table with a roofline "
                    "floor and write bench.csv and bench.md. Variants that need CUDA are skipped (a row saying "
                    "so) on a CPU device.")
    bench.add_argument("--preset", default="seed-scale", choices=sorted(PRESETS),
                       help="named configuration (default seed-scale, the shape perf numbers are quoted at)")
    bench.add_argument("--config", type=Path, help="start from a config JSON instead of a preset")
    bench.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override any config field (repeatable); keys below")
    bench.add_argument("--seed", type=int, help="override the preset's seed")
    bench.add_argument("--device", help="cpu, cuda, cuda:N or auto (default: the preset's, auto)")
    bench.add_argument("--variants", default="all", metavar="NAMES",
                       help="comma-separated variants (hotloop.guards.bench.VARIANTS): iteration (the whole loop "
                            "iteration, always the first row), eager, graph-fp32, graph-tf32, compiled-split, "
                            "compiled-tf32, hotloop; or all, graph (= graph-fp32,graph-tf32), "
                            "compiled (= compiled-split,compiled-tf32) (default all)")
    bench.add_argument("--steps", type=int, default=200, help="timed learner steps per variant (default 200; the "
                       "iteration's rounded up to whole periods of its periodic phases, e.g. log_interval)")
    bench.add_argument("--warmup", type=int, default=20, help="untimed steps per variant before them (default 20)")
    bench.add_argument("--out", type=Path, help="folder for bench.csv and bench.md (default: runs/<UTC timestamp>/ "
                       "under the working directory); refused if it already holds either")
    bench.set_defaults(epochs=None)


def config_from_args(args: argparse.Namespace) -> Config:
    """The Config an invocation asks for; raises ValueError on any bad value."""
    base = Config.load(args.config).to_dict() if args.config else preset(args.preset or "cartpole").to_dict()
    for text in args.overrides:
        key, value = parse_override(text)
        base[key] = value
    for key in ("epochs", "device", "seed"):
        if getattr(args, key) is not None:
            base[key] = getattr(args, key)
    return Config.from_dict(base)


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
        raise ValueError(f"config.learner 'hotloop' needs a CUDA device (its Triton kernels run on the GPU), this "
                         f"run is on {device}: set learner=reference (or auto) or --device cuda")
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


def check_window_fits(args: argparse.Namespace, cfg: Config, device, obs_dim: int,
                      action_nvec: tuple[int, ...]) -> None:
    """`hotloop gate`: ValueError naming --guard-steps (and --repeats) when the guarded windows' estimated host
    memory (hotloop.trainer.memory_estimate.check_window_memory: K steps x R repeats x the per-step bound of the
    profiler's trace events; on a CPU device plus the run's own estimate) exceeds the host's available memory, with
    the estimate and how many steps fit. K is hotloop.guards.gate.window_size's (--guard-steps, else the default)."""
    from hotloop.guards.gate import window_size
    from hotloop.trainer.device_choice import learner_kind
    from hotloop.trainer.memory_estimate import check_window_memory, estimate_memory

    kind = learner_kind(cfg, device)
    k, _, _ = window_size(cfg, kind, args.guard_steps)
    run_bytes = estimate_memory(cfg, obs_dim, action_nvec).total if device.type == "cpu" else 0
    try:
        check_window_memory(k, args.repeats, device, kind, run_bytes)
    except ValueError as exc:
        given = f"--guard-steps {k}" if args.guard_steps is not None else f"--guard-steps (default {k})"
        raise ValueError(f"{given} with --repeats {args.repeats}: {exc}") from None


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
            raise ValueError(f"{option} {path} cannot be written: {exc.strerror or exc} (a read-only file?)") \
                from None
        return
    parent = next((p for p in path.parents if p.exists()), Path("."))
    if not parent.is_dir():
        raise ValueError(f"{option} {path} cannot be written: {parent} is not a folder")
    if (problem := _file_creation_error(parent)) is not None:
        raise ValueError(f"{option} {path} cannot be written: no file can be created in {parent} "
                         f"({problem}; a read-only folder?)")


def check_gate_args(args: argparse.Namespace, cfg: Config) -> None:
    """Gate-only options; resolves the baseline: --no-baseline -> none; an explicit --baseline must have been
    measured with `cfg`'s step on this GPU (hotloop.guards.gate.baseline_mismatch); the default one
    (guards/baseline_files/<gpu>.json) is dropped with a note on stderr when it was not; --inject needs a CUDA device
    (and, for a learner fault, the hotloop learner); --update-baseline needs a baseline path that can be written
    (`check_writable`) and whose file, if there is one, is a baseline outside any live run's folder
    (hotloop.guards.baselines.check_baseline_target). ValueError (naming the option) before any training."""
    from hotloop.guards.baselines import check_baseline_target, load_baseline
    from hotloop.guards.gate import baseline_mismatch, default_baseline
    from hotloop.trainer.device_choice import learner_kind, resolve_device

    from hotloop.guards.faults import check_request

    check_request(args.inject, args.update_baseline)
    if args.inject is not None:
        device = resolve_device(cfg.device)
        check_request(args.inject, device=device, learner=learner_kind(cfg, device),
                      spectral_norm=cfg.spectral_norm)
    if (args.guard_steps is not None and args.guard_steps < 1) or args.guard_warmup < 0 or args.repeats < 1:
        raise ValueError(f"--guard-steps and --repeats must be >= 1 and --guard-warmup >= 0, got "
                         f"{args.guard_steps}, {args.repeats}, {args.guard_warmup}")
    if args.census_overhead < 0:
        raise ValueError(f"--census-overhead PAIRS must be >= 1 (or 0: off), got {args.census_overhead}")
    explicit = args.baseline is not None
    if args.no_baseline:
        if explicit or args.update_baseline or args.baseline_dir is not None:
            raise ValueError("--no-baseline cannot be given with --baseline, --baseline-dir or --update-baseline")
        return
    if explicit and args.baseline_dir is not None:
        raise ValueError("--baseline-dir cannot be given with --baseline (it names the folder the default one is "
                         "looked up in)")
    found = None if explicit else default_baseline(args.baseline_dir, preset=args.preset)
    if found is not None and (found.exists() or args.update_baseline):
        args.baseline = found
    if args.update_baseline:
        if args.baseline is None:
            raise ValueError("--update-baseline needs --baseline PATH on a machine without CUDA")
        try:  # before check_writable, whose open for appending would wait on a FIFO
            check_baseline_target(args.baseline)  # not a baseline, or in a live run's folder: refused
        except ValueError as exc:
            raise ValueError(f"--baseline {exc}") from None
        check_writable(args.baseline, "--baseline")
    elif args.baseline is not None:
        baseline = load_baseline(args.baseline)  # a missing or broken baseline is bad input: fail before training
        try:
            differ = baseline_mismatch(baseline, cfg)
        except (RuntimeError, TypeError, AttributeError) as exc:  # e.g. "device": "tpu" in the file's config
            raise ValueError(f"--baseline {args.baseline}: its \"config\" cannot be compared with this run: "
                             f"{type(exc).__name__}: {exc}") from None
        if differ is None:
            print(f"hotloop gate: note: the baseline {args.baseline} records no configuration: compared as it is "
                  f"(rewrite it with --update-baseline to record one)", file=sys.stderr)
        elif differ and not explicit:
            print(f"hotloop gate: note: not comparing with the default baseline {args.baseline}: it was measured "
                  f"with another configuration ({'; '.join(differ)})", file=sys.stderr)
            args.baseline = None
        elif differ:
            raise ValueError(f"--baseline {args.baseline} was measured with another configuration ("
                             f"{'; '.join(differ)}): run the gate with the baseline's preset and settings, pass "
                             f"another --baseline, or rewrite this one with --update-baseline")


def check_bench_args(args: argparse.Namespace) -> None:
    """Bench-only options: --variants (expanded into args.variant_names), --steps >= 1, --warmup >= 0; ValueError
    naming the option (and, for a bad variant, the valid ones)."""
    from hotloop.guards.bench import expand_variants

    try:
        args.variant_names = expand_variants(args.variants)
    except ValueError as exc:
        raise ValueError(f"--variants: {exc}") from None
    if args.steps < 1 or args.warmup < 0:
        raise ValueError(f"--steps must be >= 1 and --warmup >= 0, got {args.steps} and {args.warmup}")


def check_resume_args(args: argparse.Namespace) -> None:
    """`train --resume RUN_DIR`: no option that changes the config or the folder may come with it; points
    args.config at RUN_DIR/config.json. ValueError naming the conflicting options or a missing folder."""
    given = [name for name, value in (("--preset", args.preset), ("--config", args.config),
                                      ("--set", args.overrides), ("--seed", args.seed), ("--device", args.device),
                                      ("--out", args.out)) if value not in (None, [])]
    if given:
        raise ValueError(f"--resume continues the run with its own config.json and folder: {', '.join(given)} "
                         f"cannot be given with it (--epochs N extends the run)")
    if not args.resume.is_dir():
        raise ValueError(f"--resume {args.resume}: no such run folder")
    args.config = args.resume / "config.json"


def prepare_resume(args: argparse.Namespace, cfg: Config) -> Path:
    """Read RUN_DIR's checkpoint and per-epoch table into args.resume_point and check them against `cfg`
    (hotloop.trainer.resume.read_resume_point: also that config.json is the config the run was trained with, unless
    --allow-config-change) and that epochs are left to run; writes nothing. ValueError naming the problem."""
    from hotloop.trainer.resume import read_resume_point

    try:
        point = read_resume_point(args.resume, cfg, allow_config_change=args.allow_config_change)
    except ValueError as exc:
        raise ValueError(f"--resume {args.resume}: {exc}") from exc
    if cfg.epochs <= point.epoch:
        raise ValueError(f"--resume {args.resume}: the run has finished {point.epoch} of its {cfg.epochs} epochs; "
                         f"pass --epochs N (N > {point.epoch}) to extend it")
    args.resume_point = point
    return args.resume


def prepare_run(args: argparse.Namespace) -> tuple[Config, Path]:
    """Validate everything an invocation of train/gate/bench asks for, then create its run folder (bench: --out
    may exist unless it holds bench.csv/bench.md; train/gate: it must be new or empty; train --resume: the run
    folder, with its checkpoint read into args.resume_point).

    Checked, in this order, before anything is trained or written: the options and the config (values, types,
    config file), the gate's options (baseline, --inject, --update-baseline's path), the device, the env, that
    learning_starts fits the replay (hotloop.trainer.config.validate_run; train/gate), that the learner can run on
    the device (`check_learner`; train/gate), that the run fits in the device's free memory (`check_fits`) and the
    gate's guarded window in the host's (`check_window_fits`), the
    checkpoint of a resumed run, and that the run folder can be created and written.
    Raises ValueError (bad input, exit 2) naming what was wrong; nothing is written before every check passed."""
    from hotloop.profiles.epoch_table import new_run_dir
    from hotloop.profiles.run_lock import acquire
    from hotloop.trainer.config import validate_run
    from hotloop.trainer.device_choice import resolve_device

    resume = getattr(args, "resume", None)
    if getattr(args, "allow_config_change", False) and resume is None:
        raise ValueError("--allow-config-change is for --resume RUN_DIR (a new run has no earlier config)")
    if resume is not None:
        check_resume_args(args)
    cfg = config_from_args(args)
    if args.command == "bench":
        check_bench_args(args)
    else:  # > 0 and <= threading.TIMEOUT_MAX: a longer wait would kill the watchdog's thread
        from hotloop.guards.watchdog import check_limit_s

        check_limit_s(args.epoch_timeout, "--epoch-timeout")
    if args.command == "gate":
        check_gate_args(args, cfg)
    device = resolve_device(cfg.device)
    if args.command != "bench":
        validate_run(cfg)
    if cfg.env == "synthetic":  # its shapes are the config's: estimate before building even one copy of it
        check_fits(cfg, device, cfg.obs_dim, cfg.action_nvec)
    obs_dim, action_nvec = check_env(cfg)
    if args.command != "bench":
        check_learner(cfg, device, action_nvec)
    if cfg.env != "synthetic":
        check_fits(cfg, device, obs_dim, action_nvec)
    if args.command == "gate":
        check_window_fits(args, cfg, device, obs_dim, action_nvec)
    if resume is not None:
        _check_folder_writable(args.resume, "--resume")
        args.run_lock = acquire(args.resume)  # before the checkpoint is read: no other run may write it meanwhile
        return cfg, prepare_resume(args, cfg)
    if args.command == "bench":
        if args.out:
            from hotloop.guards.bench import check_out_dir

            check_out_dir(args.out)
    if args.out:
        _check_folder_writable(next((p for p in (args.out, *args.out.parents) if p.exists()), Path(".")), "--out")
    if args.command == "bench":
        try:
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
            return cfg, args.out or new_run_dir()
        except OSError as exc:
            raise ValueError(f"cannot create the run folder {args.out or 'runs/'}: "
                             f"{exc.strerror or exc}") from exc
    # train / gate: the run folder's lock is held from here to the end of main (one writer per folder: a second
    # run on it is refused naming the holder's pid; hotloop.profiles.run_lock); --out must be new or empty
    try:
        run_dir = args.out or new_run_dir()
    except OSError as exc:
        raise ValueError(f"cannot create the run folder runs/: {exc.strerror or exc}") from exc
    args.run_lock = acquire(run_dir, create=True, must_be_empty=True)
    return cfg, run_dir


def _check_folder_writable(folder: Path, option: str) -> None:
    """ValueError naming `option` unless a file can be created in `folder` (tried with a temporary file, removed at
    once; a path that is not a folder is left to the caller's own message)."""
    if folder.is_dir() and (problem := _file_creation_error(folder)) is not None:
        raise ValueError(f"{option}: no file can be created in {folder} ({problem}; a read-only folder?)")


def _file_creation_error(folder: Path) -> str | None:
    """Why no file can be created in the existing folder `folder` (tried with a temporary file, removed at once;
    also catches read-only file systems and root, whom os.access never refuses), or None when one can."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".hotloop-write-check-"):
            return None
    except OSError as exc:
        return str(exc.strerror or exc)


def report_internal_error(command: str, exc: BaseException, run_dir: Path | None) -> int:
    """Report an unexpected exception `exc` of `hotloop <command>` and return INTERNAL_ERROR (70).

    The full traceback goes to <run_dir>/error.log when the run folder exists, else (or when that cannot be
    written) to a new temporary file (tempfile.mkstemp, prefix hotloop-<command>-error-); one line on stderr names
    the exception's type and message, where it was raised (file:line in function) and the traceback's file. If no
    file can be written, the traceback follows that line on stderr. A full disk (an OSError ENOSPC / EDQUOT in the
    exception's chain, hotloop.profiles.disk_full.disk_full_cause; torch.save reports it as a RuntimeError) is
    reported as "disk full" instead of "internal error", and a second line says what the run folder keeps: its
    last complete checkpoint (`train`: with the `--resume` command that continues it), or none. Raises nothing."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    log = None
    if run_dir is not None and run_dir.is_dir():
        try:
            (run_dir / ERROR_LOG).write_text(text)
            log = run_dir / ERROR_LOG
        except OSError:
            log = None
    if log is None:
        try:
            fd, name = tempfile.mkstemp(prefix=f"hotloop-{command}-error-", suffix=".log")
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            log = Path(name)
        except OSError:
            log = None
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"raised at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}; " if frames else ""
    message = " ".join(str(exc).split())
    message = message if len(message) <= 300 else message[:297] + "..."
    head = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    tail = f"full traceback in {log}" if log is not None else "the traceback could not be saved; it follows"
    full = disk_full_cause(exc)
    if isinstance(exc, DiskFullError):
        head = message.removeprefix("disk full: ")
    elif full is not None and full is not exc:  # e.g. torch.save's RuntimeError ("unexpected pos ...")
        head = f"{head} (caused by: [Errno {full.errno}] {full.strerror or full})"
    print(f"hotloop {command}: {'disk full' if full is not None else 'internal error'}: {head} ({where}{tail})",
          file=sys.stderr)
    if log is None:
        print(text, file=sys.stderr, end="")
    if full is not None and run_dir is not None:
        from hotloop.trainer.resume import CHECKPOINT_FILE

        if not (run_dir / CHECKPOINT_FILE).is_file():
            print(f"hotloop {command}: {run_dir} holds no checkpoint yet: free space on its disk and start the run "
                  f"again", file=sys.stderr)
        elif command == "train":
            print(f"hotloop {command}: {run_dir} keeps its last complete checkpoint ({CHECKPOINT_FILE} is only ever "
                  f"replaced by a whole new one): free space on its disk, then continue with: hotloop train --resume "
                  f"{run_dir}", file=sys.stderr)
        else:
            print(f"hotloop {command}: {run_dir} keeps its last complete checkpoint ({CHECKPOINT_FILE}): free space "
                  f"on its disk and run it again", file=sys.stderr)
    return INTERNAL_ERROR


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `hotloop` console script; returns the exit code (module docstring: 0 ok, 1 a criterion
    or regression failed, 2 bad usage or input, 3 hang, 70 internal error, 130 interrupted, 141 stdout closed).
    argparse's own usage errors exit 2 through SystemExit; a ValueError from the checks before the run is bad input
    (2); any other exception, and any exception once the run has started, is reported by `report_internal_error`
    and gives 70."""
    args = build_parser().parse_args(argv)
    run_dir: Path | None = None
    try:
        return _main(args, run_dir)
    finally:
        lock = getattr(args, "run_lock", None)  # taken by prepare_run (train / gate); released on every path
        if lock is not None:
            lock.release()


def _main(args: argparse.Namespace, run_dir: Path | None) -> int:
    """`main` after parsing; returns the exit code."""
    try:
        if args.command == "inspect":
            return run_inspect(args)
        if args.command == "report":
            return run_report(args)
        if args.command == "nsys":
            return run_nsys(args)
        if args.command == "mutate":
            return run_mutate(args)
        if args.command == "learning":
            return run_learning(args)
        try:
            cfg, run_dir = prepare_run(args)
        except ValueError as exc:
            print(f"hotloop {args.command}: error: {exc}", file=sys.stderr)
            return USAGE_ERROR
        return _execute(args, cfg, run_dir)
    except KeyboardInterrupt:
        if run_dir is None:
            print(f"\nhotloop {args.command}: interrupted", file=sys.stderr)
            return INTERRUPTED
        from hotloop.trainer.resume import CHECKPOINT_FILE

        hint = (f"; continue with: hotloop train --resume {run_dir}"
                if args.command == "train" and (run_dir / CHECKPOINT_FILE).exists() else "")
        print(f"\nhotloop {args.command}: interrupted; the finished epochs are in {run_dir}{hint}", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # stdout closed by its reader: not a crash; keep the exit flush from raising again
        stdout_to_devnull()
        return BROKEN_PIPE
    except Exception as exc:  # the contract: an unexpected exception is exit 70 (never 1, "a criterion failed")
        return report_internal_error(args.command, exc, run_dir)


def _execute(args: argparse.Namespace, cfg: Config, run_dir: Path) -> int:
    """Run the validated train/gate/bench invocation in `run_dir`; returns its exit code (exceptions: `main`)."""
    if args.command == "bench":
        from hotloop.guards.bench import run_bench
        from hotloop.trainer.device_choice import resolve_device

        run_bench(cfg, resolve_device(cfg.device), args.variant_names, args.steps, args.warmup, run_dir)
        print(f"\nbench folder: {run_dir}")
        return 0
    if args.command == "gate":
        from hotloop.guards.gate import GateOptions, run_gate

        return run_gate(cfg, run_dir, GateOptions(
            epoch_limit_s=args.epoch_timeout, show_progress=not args.no_progress, guard_steps=args.guard_steps,
            guard_warmup=args.guard_warmup, repeats=args.repeats, baseline=args.baseline,
            update_baseline=args.update_baseline, inject=args.inject, loop_census=not args.no_loop_census,
            structure_census=not args.no_structure_census, census_overhead_pairs=args.census_overhead))
    from hotloop.profiles.epoch_table import format_table
    from hotloop.guards.run import run_training

    table, _ = run_training(cfg, run_dir, args.epoch_timeout, not args.no_progress,
                            resume=args.resume_point if args.resume is not None else False)
    print("\nPer-epoch table\n" + format_table(table) + f"\n\nrun folder: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

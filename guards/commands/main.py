"""The `hotloop` command line: `hotloop train`, `gate`, `bench`, `inspect`, `report`, `nsys`, `mutate`, `learning`
and `criteria`, one module of this package each (`SUBCOMMANDS`); `main` parses, runs the subcommand and turns what
ended it into the exit code.

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
import sys

from hotloop.guards.commands import bench, criteria, gate, inspect, learning, mutate, nsys, report, train
from hotloop.guards.commands.errors import BROKEN_PIPE, USAGE_ERROR, report_internal_error, report_interrupt
from hotloop.profiles.inspect_cmd import stdout_to_devnull

SUBCOMMANDS = {
    "train": train,
    "gate": gate,
    "bench": bench,
    "inspect": inspect,
    "report": report,
    "nsys": nsys,
    "mutate": mutate,
    "learning": learning,
    "criteria": criteria,
}
"""Subcommand -> its module, in the order of the help. Each module has `add_parser(subparsers)`; the run commands
(RUN_COMMANDS) have `prepare(args) -> RunPlan` (checks only: ValueError is bad input) and `execute(plan) -> int`,
the others `run(args) -> int`."""
RUN_COMMANDS = ("train", "gate", "bench")
"""The subcommands that make a run folder: their errors are reported with it (`main`)."""


def build_parser() -> argparse.ArgumentParser:
    """The `hotloop` parser, with every subcommand of SUBCOMMANDS."""
    parser = argparse.ArgumentParser(
        prog="hotloop",
        description="GPU-resident DQN trainer and the guards that keep its hot loop fast.",
        epilog="exit codes: 0 ok, 1 a criterion or regression failed, 2 bad usage or input, 3 hang, "
        "70 internal error (traceback in <run folder>/error.log), 130 interrupted, 141 stdout closed",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `hotloop` console script; returns the exit code (module docstring: 0 ok, 1 a criterion
    or regression failed, 2 bad usage or input, 3 hang, 70 internal error, 130 interrupted, 141 stdout closed).
    argparse's own usage errors exit 2 through SystemExit; a ValueError from a run command's `prepare` is bad input
    (2); any other exception, and any exception once the run has started, is reported by
    hotloop.guards.commands.errors.report_internal_error and gives 70. The run folder's lock (train, gate) is
    released on every path, after the error is reported."""
    args = build_parser().parse_args(argv)
    module = SUBCOMMANDS[args.command]
    plan = None
    try:
        if args.command not in RUN_COMMANDS:
            return module.run(args)
        try:
            plan = module.prepare(args)
        except ValueError as exc:
            print(f"hotloop {args.command}: error: {exc}", file=sys.stderr)
            return USAGE_ERROR
        return module.execute(plan)
    except KeyboardInterrupt:
        return report_interrupt(args.command, None if plan is None else plan.run_dir)
    except BrokenPipeError:  # stdout closed by its reader: not a crash; keep the exit flush from raising again
        stdout_to_devnull()
        return BROKEN_PIPE
    except Exception as exc:  # the contract: an unexpected exception is exit 70 (never 1, "a criterion failed")
        return report_internal_error(args.command, exc, None if plan is None else plan.run_dir)
    finally:
        if plan is not None and plan.lock is not None:
            plan.lock.release()


if __name__ == "__main__":
    sys.exit(main())

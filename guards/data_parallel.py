"""`hotloop train --nproc N`: a data-parallel run over torch.distributed (hotloop.trainer.distributed), launched by
torchrun, one process per rank.

The launching process (`launch`) checks --nproc (`check_nproc`), then runs
`python -m torch.distributed.run --standalone --nproc-per-node N --local-ranks-filter 0 -m hotloop.guards.cli train
... --out RUN_DIR` (torchrun's own module; only rank 0's console output is shown) and returns torchrun's exit code.
Every rank joins the process group from torchrun's environment (`join`: gloo on the CPU, NCCL on cuda:LOCAL_RANK)
and trains the same epochs: rank 0 in RUN_DIR (the run's tables, checkpoints and config.json, as a one-process run
writes them), rank R > 0 in RUN_DIR/rank<R>/ (`rank_folder`: its own table, of its own actors' episodes, and its
error.log if it fails). After the epochs each rank profiles `trace_steps` loop iterations and writes its Kineto trace
trace_rank<R>.json.gz into its folder (`rank_trace_hook`; `hotloop inspect RUN_DIR` compares the ranks).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from hotloop.profiles.rank_traces import rank_trace_name, write_rank_trace
from hotloop.trainer.distributed import RankInfo, init_from_env, rank_info
from hotloop.trainer.loop import Trainer
from hotloop.trainer.memory_estimate import available_memory, format_bytes

RANK_PROCESS_BYTES = 280 * 10**6
"""Host memory of one rank's process beyond its run's own estimate (Python, torch, gloo, the profiler): 64 CPU ranks
of the default preset's `hotloop gate --nproc 64` took 18.1 GB, 283 MB each (the CPU dev machine, 2026-12-06)."""


def check_nproc(
    nproc: object, device: torch.device, rank_bytes: int = 0, available: tuple[int | None, str] | None = None
) -> int:
    """--nproc: an int >= 1; on a CUDA device at most the GPUs this host has (one GPU per process); and N ranks of
    RANK_PROCESS_BYTES + `rank_bytes` each (the run's own host bytes per rank: its memory estimate on a CPU device,
    the gate's guarded window) within the host's available memory (hotloop.trainer.memory_estimate.available_memory,
    or `available` as (bytes, source); unreadable: not checked). Returns it; ValueError naming --nproc otherwise,
    with how many ranks fit."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"--nproc must be an int >= 1, got {nproc!r}")
    if device.type == "cuda" and nproc > torch.cuda.device_count():
        raise ValueError(f"--nproc {nproc}: one GPU per process, and this host has {torch.cuda.device_count()}")
    free, source = available if available is not None else available_memory(torch.device("cpu"))
    per_rank = RANK_PROCESS_BYTES + rank_bytes
    if free is not None and nproc * per_rank > free:
        raise ValueError(
            f"--nproc {nproc}: {nproc} ranks need an estimated {format_bytes(nproc * per_rank)} of host memory "
            f"({format_bytes(per_rank)} each), {format_bytes(free)} is available ({source}): at most "
            f"{free // per_rank} ranks fit"
        )
    return nproc


def torchrun_command(nproc: int, train_args: list[str], command: str = "train") -> list[str]:
    """The torchrun command line that runs `hotloop <command> <train_args>` (command "train" or "gate") on `nproc`
    ranks of this host (standalone rendezvous on a free port; only rank 0's console output shown)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--local-ranks-filter=0",
        "-m",
        "hotloop.guards.cli",
        command,
        *train_args,
    ]


def launch(nproc: int, train_args: list[str], command: str = "train") -> int:
    """Run `torchrun_command(nproc, train_args, command)` and return its exit code (0 when every rank ended with 0;
    torchrun gives 1 when a rank failed, after naming it)."""
    return subprocess.run(torchrun_command(nproc, train_args, command), check=False).returncode


def join(device: torch.device) -> tuple[torch.device, RankInfo]:
    """Join the run's process group (hotloop.trainer.distributed.init_from_env); returns this rank's device
    (cuda:LOCAL_RANK, or the CPU) and its RankInfo. ValueError outside torchrun."""
    device = init_from_env(device)
    return device, rank_info()


def rank_folder(run_dir: Path, rank: int) -> Path:
    """Where rank `rank` writes: the run folder for rank 0, run_dir/rank<R>/ for the others."""
    return run_dir if rank == 0 else run_dir / f"rank{rank}"


def rank_trace_hook(folder: Path, steps: int, info: RankInfo) -> Callable[[Trainer], Path | None]:
    """An `after_epochs` callback for hotloop.guards.run.run_training: profile `steps` loop iterations
    (Trainer.iterate, CPU and CUDA activity) and write them as folder/trace_rank<R>.json.gz with this rank in the
    trace's metadata (hotloop.profiles.rank_traces.write_rank_trace); returns the file, or None when steps is 0.
    Every rank must run it with the same `steps` (each iteration holds the gradient all-reduce)."""

    def hook(trainer: Trainer) -> Path | None:
        if steps == 0:
            return None
        activities = [torch.profiler.ProfilerActivity.CPU]
        if trainer.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            trainer.iterate(steps)
            if trainer.device.type == "cuda":
                torch.cuda.synchronize(trainer.device)
        return write_rank_trace(prof, folder / rank_trace_name(info.rank), info.rank, info.world_size, info.backend)

    return hook


# ------------------------------------------------------------------------------------ hotloop gate --nproc N

HANG_RECORD = "hang.json"
"""In each rank's folder: the hang watchdog's record when it stopped that rank (hotloop.guards.watchdog,
hang_record): torchrun names only the ranks it saw fail before it stopped the others, so the launcher reads these."""
TERMINATED_EXIT = 128 + 15
"""A rank's exit when a SIGTERM stopped it (128 + SIGTERM, as a shell reports it): torchrun sends it to the other
ranks once one has failed, and a user or a scheduler may send it to all."""
RANK_EXIT = "rank_exit.json"
"""In each rank's folder: {"rank", "exit_code", "why"}, written by the rank as it ends without a hang."""
COLLECTIVES = "collectives"
"""In each rank's folder: collectives.csv/.md, the collectives, wait and busy time and host reads per step of its
guarded window (hotloop.profiles.rank_traces.step_collectives of its trace.json.gz)."""
STRAGGLER_LIMIT = 2.5
"""A rank whose busy time per step (its step's wall time minus the time it spent inside the backend's collective
spans: its own work; median over the window's steps) exceeds this many times the median over the OTHER ranks FAILs
the straggler row (against the median of all ranks, a straggler of 2 ranks pulls the median halfway to itself).
Why 2.5: the ranks run the same step on equal shards, so their busy times differ by noise only, and the noise of a
shared host is large: 2 CPU ranks on a 2-core host read at most ~1.15 x the other at the default preset (5 gates),
but up to 1.63 x with no fault at the tests' tiny config (busy 6-12 ms per step; 1.03, 1.33, 1.37 and 1.63 in four
gates on 2026-12-06), so 1.5 raised false alarms; a rank 2.5 x slower than the others makes each of them wait
60% of its step in the all-reduce, every step. Calibrated on the CPU only; on GPUs the busy time is the host's side
of the step."""
RANK_READS = "host reads of the trace (CPU rank)"
"""The source of a CPU rank's `no_stream_sync` row: its host reads per step (hotloop.profiles.rank_traces.HOST_READ_OP
outside CPU_READ_ALLOWANCE): on a CUDA tensor each such read is a stream sync; the CPU has no device to sync with,
so the rows the one-process gate leaves "not applicable" are judged on the reads themselves."""


def write_rank_exit(folder: Path, rank: int, code: int, why: str = "") -> None:
    """Write RANK_EXIT into `folder`: this rank ends with exit `code` (`why`: a line on a code other than 0 and 1)."""
    (Path(folder) / RANK_EXIT).write_text(json.dumps({"rank": rank, "exit_code": code, "why": why}) + "\n")


def write_rank_collectives(folder: Path, trace: Path) -> pd.DataFrame:
    """Read a rank's guarded-window trace (its gate's trace.json.gz), count its collectives per step
    (hotloop.profiles.rank_traces.step_collectives) and write them as COLLECTIVES .csv/.md into `folder`; returns
    the table."""
    from hotloop.profiles.epoch_table import write_table
    from hotloop.profiles.kineto_reader import read_kineto
    from hotloop.profiles.rank_traces import step_collectives

    table = step_collectives(read_kineto(trace, kinds=("cpu_op", "user_annotation", "kernel", "runtime", "driver")))
    write_table(table, Path(folder), COLLECTIVES)
    return table


@dataclass
class RankOutcome:
    """What one rank of a data-parallel gate left in its folder: `exit_code` (None: no record: it was killed, by
    torchrun after another rank failed, or died without a word), `why`, `hang` (its HANG_RECORD, or None),
    `verdicts` (its criteria.csv, or None) and `collectives` (its COLLECTIVES table, or None)."""

    rank: int
    folder: Path
    exit_code: int | None
    why: str
    hang: dict | None
    verdicts: pd.DataFrame | None
    collectives: pd.DataFrame | None


def read_rank(run_dir: Path, rank: int) -> RankOutcome:
    """The RankOutcome of rank `rank` of the data-parallel gate in `run_dir` (its folder: `rank_folder`). A hang
    record wins over an exit record (the watchdog ends the process with HANG_EXIT_CODE)."""
    folder = rank_folder(Path(run_dir), rank)

    def load(name: str) -> dict | None:
        try:
            return json.loads((folder / name).read_text())
        except (OSError, ValueError):
            return None

    def table(name: str) -> pd.DataFrame | None:
        try:
            return pd.read_csv(folder / name, keep_default_na=False)
        except (OSError, ValueError):
            return None

    hang, done = load(HANG_RECORD), load(RANK_EXIT)
    code = int(hang["exit_code"]) if hang else int(done["exit_code"]) if done else None
    why = (
        f"hang: {hang.get('period')} did not finish within {hang.get('limit_s'):g} s, last phase "
        f"{hang.get('last_phase')}"
        if hang
        else (done or {}).get("why", "")
        if done
        else "no exit record: killed (torchrun stops the other ranks when one fails) or died without a word"
    )
    return RankOutcome(rank, folder, code, why, hang, table("criteria.csv"), table(f"{COLLECTIVES}.csv"))


def _step_verdict(row: pd.Series) -> bool:
    """Whether one step of a COLLECTIVES table holds exactly one all-reduce and nothing else."""
    return int(row["allreduce"]) == 1 and int(row["collectives"]) == 1


def collective_row(table: pd.DataFrame | None) -> dict:
    """A rank's `one_all_reduce_per_step` cells from its COLLECTIVES table: measured (the collectives of its worst
    step: the first step that is not exactly one all-reduce, else 1), verdict, status, worst_step and evidence."""
    if table is None or table.empty:
        return dict(measured="", verdict="-", status="not measured (no guarded window)", worst_step="", evidence="")
    bad = table[~table.apply(_step_verdict, axis=1)]
    if bad.empty:
        return dict(
            measured=1,
            verdict="PASS",
            status="measured",
            worst_step="",
            evidence=f"{len(table)} steps, each 1 all-reduce",
        )
    worst = bad.iloc[0]
    other = str(worst["other"]) or "none"
    return dict(
        measured=int(worst["collectives"]),
        verdict="FAIL",
        status="measured",
        worst_step=str(int(worst["step"])),
        evidence=f"{len(bad)} of {len(table)} steps; step {int(worst['step'])}: allreduce x{int(worst['allreduce'])}, "
        f"other: {other}",
    )


def _rank_rows(outcome: RankOutcome, cpu: bool) -> pd.DataFrame | None:
    """The rank's criteria rows (id, criterion, limit, measured, verdict, status, source, worst_step, evidence): its
    gate's, with `one_all_reduce_per_step` from its collectives and, on a CPU rank, `no_stream_sync` from its host
    reads (RANK_READS)."""
    from hotloop.guards.criteria import RANKS, judged_by

    if outcome.verdicts is None:
        return None
    cols = ["id", "criterion", "limit", "measured", "verdict", "status", "source", "worst_step", "evidence"]
    rows = outcome.verdicts.reindex(columns=cols).fillna("").astype(object)
    cells = collective_row(outcome.collectives)
    for c in judged_by(RANKS):
        rows.loc[rows["id"].eq(c.id), list(cells) + ["source"]] = [*cells.values(), "trace"]
    t = outcome.collectives
    if cpu and t is not None and not t.empty:
        reads = t["host_reads"].astype(int)
        worst = int(reads.idxmax())
        n = int(reads.max())
        rows.loc[
            rows["id"].eq("no_stream_sync"), ["measured", "verdict", "status", "source", "worst_step", "evidence"]
        ] = [
            n,
            "PASS" if n == 0 else "FAIL",
            "measured",
            RANK_READS,
            str(int(t.loc[worst, "step"])) if n else "",
            f"host reads in {int((reads > 0).sum())} of {len(t)} steps, {int(reads.sum())} in all; step "
            f"{int(t.loc[worst, 'step'])}: in {t.loc[worst, 'read_in']}"
            if n
            else "",
        ]
    return rows


def judge_ranks(outcomes: list[RankOutcome], cpu: bool) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Judge a data-parallel gate's ranks: (per-rank table, criteria table, straggler).

    Per-rank table, one row per rank: rank, exit, steps (guarded), step_ms, busy_ms, wait_ms (medians over its
    steps: the step's wall time, the rank's own work, its time in the backend's collective spans), busy_vs_others
    (busy_ms / the median of the other ranks' busy_ms), allreduce (per step, "min-max"), other (its other collectives),
    host_reads (its worst step's), failed (the ids of its failing rows).
    Criteria table, one row per criterion: id, limit, rank<R> ("measured verdict") per rank, worst_rank, measured
    (the worst rank's), verdict (FAIL when any rank FAILs, naming them in `ranks_failing`; PASS when every rank
    that measured it passed; "-" when none measured it), ranks_failing, evidence (the failing ranks' evidence).
    Straggler: {"busy_ms": {rank: ms}, "worst_rank", "others_ms" (the median of the other ranks' busy_ms),
    "ratio" (the worst rank's busy_ms / others_ms), "limit" (STRAGGLER_LIMIT), "verdict" (FAIL above the limit,
    PASS, or "-" when fewer than 2 ranks measured)}."""
    per_rank, rows = [], {}
    for o in outcomes:
        t = o.collectives
        has = t is not None and not t.empty
        ranked = _rank_rows(o, cpu)
        if ranked is not None:
            rows[o.rank] = ranked
        per_rank.append(
            dict(
                rank=o.rank,
                exit="" if o.exit_code is None else o.exit_code,
                steps=len(t) if has else 0,
                step_ms=float(t["step_us"].median()) / 1e3 if has else float("nan"),
                busy_ms=float(t["busy_us"].median()) / 1e3 if has else float("nan"),
                wait_ms=float(t["wait_us"].median()) / 1e3 if has else float("nan"),
                allreduce=f"{int(t['allreduce'].min())}-{int(t['allreduce'].max())}" if has else "",
                other=", ".join(sorted({x for x in t["other"].astype(str) if x})) if has else "",
                host_reads=int(t["host_reads"].max()) if has else "",
                failed=" ".join(ranked.loc[ranked["verdict"].eq("FAIL"), "id"]) if ranked is not None else "",
            )
        )
    table = pd.DataFrame(per_rank)
    busy = table.set_index("rank")["busy_ms"].dropna()
    others = {r: float(busy.drop(r).median()) if len(busy) >= 2 else float("nan") for r in busy.index}
    table.insert(
        6, "busy_vs_others", [b / others.get(r, float("nan")) for r, b in zip(table["rank"], table["busy_ms"])]
    )
    straggler: dict = {"busy_ms": busy.round(3).to_dict(), "limit": STRAGGLER_LIMIT}
    ratios = {r: float(busy[r] / others[r]) for r in busy.index if others[r] > 0}
    if len(busy) >= 2 and ratios:
        worst = max(ratios, key=ratios.get)
        ratio = ratios[worst]
        straggler |= {
            "worst_rank": int(worst),
            "others_ms": others[worst],
            "ratio": ratio,
            "verdict": "FAIL" if ratio > STRAGGLER_LIMIT else "PASS",
        }
    else:
        straggler |= {"worst_rank": None, "others_ms": float("nan"), "ratio": float("nan"), "verdict": "-"}
    criteria = []
    if rows:
        ids = next(iter(rows.values()))[["id", "limit"]]
        for cid, limit in zip(ids["id"], ids["limit"]):
            cells = {r: t[t["id"].eq(cid)].iloc[0] for r, t in rows.items() if t["id"].eq(cid).any()}
            failing = [r for r, c in cells.items() if c["verdict"] == "FAIL"]
            passing = [r for r, c in cells.items() if c["verdict"] == "PASS"]
            worst = failing[0] if failing else _worst(cells, passing)
            verdict = "FAIL" if failing else "PASS" if passing else "-"
            criteria.append(
                dict(
                    id=cid,
                    limit=limit,
                    **{f"rank{r}": _cell(c) for r, c in cells.items()},
                    worst_rank="" if worst is None else worst,
                    measured="" if worst is None else cells[worst]["measured"],
                    verdict=verdict,
                    ranks_failing=" ".join(f"rank {r}" for r in failing),
                    evidence="; ".join(f"rank {r}: {cells[r]['evidence']}" for r in failing),
                )
            )
    return table, pd.DataFrame(criteria), straggler


def _cell(row: pd.Series) -> str:
    """A rank's cell of the criteria table: "measured verdict", or its status when it has no verdict."""
    if row["verdict"] in ("PASS", "FAIL"):
        return f"{row['measured']} {row['verdict']}".strip()
    return "-"


def _worst(cells: dict, passing: list[int]) -> int | None:
    """Of the passing ranks, the one with the largest numeric measured value (the first when none is numeric)."""
    if not passing:
        return None

    def key(r: int) -> float:
        try:
            return float(cells[r]["measured"])
        except (TypeError, ValueError):
            return float("-inf")

    return max(passing, key=key)


def _hang_line(outcome: RankOutcome) -> str:
    """One hung rank's line of the launcher's report: its period, limit and last phase (its hang record), and its
    stack file (hotloop.guards.watchdog.HANG_STACKS) where the watchdog wrote one."""
    h = outcome.hang or {}
    stacks = outcome.folder / str(h.get("stacks", ""))
    return (
        f"  rank {outcome.rank}: {h.get('period')} did not finish within {h.get('limit_s')} s, last phase "
        f"{h.get('last_phase')}; stacks: {stacks if h.get('stacks') and stacks.is_file() else 'not written'}"
    )


def ranks_report(run_dir: Path, nproc: int, cpu: bool) -> tuple[str, int]:
    """The launcher's verdict on a data-parallel gate in `run_dir` after torchrun returned: (text, exit code).

    Reads every rank's outcome (`read_rank`); the text lists each rank's exit and why, then, in this order: a rank
    that ended on an error (exit 2: bad input, else 70, naming it: the ranks waiting for it in a collective hang or
    are killed by torchrun, so its error is the cause); a hang on any rank: exit 3
    (hotloop.guards.watchdog.HANG_EXIT_CODE); a rank with no record (killed, or died without a word): 70. Otherwise the per-rank table, the criteria table judged on the
    worst rank and the straggler row (`judge_ranks`), exit 1 when a criterion FAILs on any rank or the straggler
    row FAILs, else 0."""
    from hotloop.guards.watchdog import HANG_EXIT_CODE
    from hotloop.profiles.epoch_table import format_table

    outcomes = [read_rank(run_dir, r) for r in range(nproc)]
    exits = "\n".join(
        f"  rank {o.rank}: exit {'?' if o.exit_code is None else o.exit_code}" + (f" ({o.why})" if o.why else "")
        for o in outcomes
    )
    head = f"\n== hotloop gate --nproc {nproc}: the ranks ({run_dir}; rank R > 0 in rank<R>/)"
    ended = [o for o in outcomes if o.hang is None and o.exit_code is not None and o.exit_code not in (0, 1)]
    # a SIGTERM that torchrun sent the other ranks after one rank's error is not the cause: that error is
    errors = [o for o in ended if o.exit_code != TERMINATED_EXIT]
    if ended and not errors and len(ended) == nproc:  # every rank stopped by a SIGTERM (a user's, a scheduler's)
        return f"{head}\n{exits}\nTERMINATED: every rank stopped by SIGTERM: no verdict", TERMINATED_EXIT
    errors = errors or ended
    if errors:  # first: the ranks left waiting for a failed one hang or are killed, the root cause is its error
        code = 2 if all(o.exit_code == 2 for o in errors) else 70
        names = ", ".join(f"rank {o.rank}" for o in errors)
        return f"{head}\n{exits}\nERROR on {names}: no verdict (each rank's error.log is in its folder)", code
    hung = [o for o in outcomes if o.hang is not None]
    if hung:
        every = len(hung) == nproc
        where = "\n".join(_hang_line(o) for o in hung)
        return (
            f"{head}\n{exits}\n{where}\nHANG on "
            f"{'every rank' if every else 'rank(s) ' + ', '.join(str(o.rank) for o in hung)}: "
            f"each rank's hang watchdog stopped it (exit {HANG_EXIT_CODE}); the stacks of ranks other than 0 are only "
            "in their folders (torchrun shows rank 0's console)",
            HANG_EXIT_CODE,
        )
    missing = [o for o in outcomes if o.exit_code is None]
    if missing:
        names = ", ".join(f"rank {o.rank}" for o in missing)
        return f"{head}\n{exits}\nERROR on {names}: no verdict (each rank's error.log is in its folder)", 70
    table, criteria, straggler = judge_ranks(outcomes, cpu)
    shown = criteria[criteria["verdict"].ne("-")] if len(criteria) else criteria
    lines = [
        head,
        "Per-rank table (medians over the guarded steps; busy = step - time in the backend's collectives)",
        format_table(table),
        "",
        f"Criteria judged on the worst rank ({len(criteria) - len(shown)} rows measured on no rank left out: "
        "each rank's criteria.csv has them)",
        format_table(shown.drop(columns="evidence")) if len(shown) else "(none measured)",
    ]
    ratio = straggler["ratio"]
    busy = ", ".join(f"rank {r} {ms:.2f} ms" for r, ms in straggler["busy_ms"].items())
    lines.append(
        f"\nstraggler: busy time per step {busy}; worst rank {straggler['worst_rank']} at {ratio:.2f} x the median "
        f"of the others ({straggler['others_ms']:.2f} ms; limit {STRAGGLER_LIMIT:g} x): {straggler['verdict']}"
        if straggler["verdict"] != "-"
        else f"\nstraggler: busy time per step {busy or 'not measured'}; one rank measured: no straggler row"
    )
    failed = criteria[criteria["verdict"].eq("FAIL")] if len(criteria) else criteria
    for _, row in failed.iterrows():
        lines.append(f"FAIL {row['id']} on {row['ranks_failing']}: {row['evidence']}")
    if straggler["verdict"] == "FAIL":
        lines.append(
            f"FAIL straggler on rank {straggler['worst_rank']}: busy {ratio:.2f} x the median of the others (limit "
            f"{STRAGGLER_LIMIT:g} x)"
        )
    code = 1 if len(failed) or straggler["verdict"] == "FAIL" else 0
    if code == 0:
        lines.append(f"PASS on every rank ({nproc} ranks)")
    return "\n".join(lines), code

"""`hotloop gate --nproc N` (issue 39 part 2, the gate per rank; hotloop.guards.data_parallel,
hotloop.guards.commands.gate): 2 gloo ranks on the CPU through torchrun. A clean gate prints the per-rank table and
PASSes; the one-rank faults FAIL naming rank 1 (an extra collective: `one_all_reduce_per_step`; a host read in the
loop body: `no_stream_sync`, judged on a CPU rank by its host reads); a hang on rank 1 ends every rank with exit 3
within the epoch timeout. Below them, the pieces on synthetic data: the collectives per step of a trace, the
judgement over ranks and the straggler row, the hang record, and the bad invocations refused before any work."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pandas as pd
import pytest

from hotloop.guards.cli import main
from hotloop.guards.commands.main import build_parser
from hotloop.guards.data_parallel import (
    COLLECTIVES,
    HANG_RECORD,
    RANK_EXIT,
    STRAGGLER_LIMIT,
    RankOutcome,
    collective_row,
    judge_ranks,
    ranks_report,
    torchrun_command,
)
from hotloop.guards.watchdog import HANG_STACKS, HangWatchdog
from hotloop.profiles.rank_traces import collective_kind, step_collectives

TINY = [
    "--device",
    "cpu",
    "--preset",
    "cartpole",
    "--epochs",
    "1",
    "--set",
    "learner_steps_per_epoch=20",
    "--set",
    "learning_starts=64",
    "--set",
    "batch_size=32",
    "--set",
    "trunk_hidden=[16]",
    "--set",
    "head_hidden=8",
    "--set",
    "eval_episodes=0",
    "--set",
    "log_interval=10",
    "--no-progress",
]
"""A 2-rank gate of a few seconds: one epoch of 20 learner steps of a tiny net, no evaluation; the window's K is 20."""


def _gate(out, *extra, timeout_s: float = 60.0) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "hotloop.guards.cli", "gate", "--nproc", "2", *TINY, "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=240,
    )
    return proc, time.monotonic() - start


def _ranks_section(stdout: str) -> str:
    return stdout[stdout.index("== hotloop gate --nproc 2: the ranks") :]


@pytest.mark.slow
def test_a_clean_two_rank_gate_prints_the_per_rank_table_and_passes(tmp_path):
    out = tmp_path / "run"
    proc, _ = _gate(out, "--epoch-timeout", "60")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = _ranks_section(proc.stdout)
    assert "Per-rank table" in text and "Criteria judged on the worst rank" in text
    table = text.split("Per-rank table", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [line.split()[0] for line in table[2:]] == ["0", "1"]  # one row per rank, after the header
    assert "straggler: busy time per step rank 0" in text and text.rstrip().endswith("PASS on every rank (2 ranks)")
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.strip().startswith("one_all_reduce")}
    assert rows["one_all_reduce_per_step"][-1] == "PASS"
    for folder in (out, out / "rank1"):
        per_step = pd.read_csv(folder / f"{COLLECTIVES}.csv")
        assert len(per_step) == 20 and per_step["allreduce"].eq(1).all() and per_step["collectives"].eq(1).all()
        assert json.loads((folder / RANK_EXIT).read_text())["exit_code"] == 0
        assert (folder / "criteria.csv").is_file() and not (folder / HANG_RECORD).exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault, criterion, evidence",
    [
        ("extra_collective", "one_all_reduce_per_step", "allreduce x2"),
        ("rank_sync", "no_stream_sync", "in step x1"),
    ],
)
def test_a_fault_on_rank_1_fails_its_criterion_naming_rank_1(fault, criterion, evidence, tmp_path):
    out = tmp_path / "run"
    proc, _ = _gate(out, "--epoch-timeout", "60", "--inject", fault)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = _ranks_section(proc.stdout)
    fails = [line for line in text.splitlines() if line.startswith("FAIL ")]
    assert len(fails) == 1 and fails[0].startswith(f"FAIL {criterion} on rank 1: rank 1: "), fails
    assert evidence in fails[0]
    row = next(line.split() for line in text.splitlines() if line.strip().startswith(criterion + " "))
    assert row[-3:] == ["FAIL", "rank", "1"]  # verdict, ranks_failing
    assert json.loads((out / RANK_EXIT).read_text())["exit_code"] == 0  # rank 0 ran the loop as it is


@pytest.mark.slow
def test_a_hang_on_rank_1_ends_every_rank_with_exit_3_within_the_epoch_timeout(tmp_path):
    """Rank 1 blocks forever in its learner step; rank 0 then blocks inside gloo's all-reduce (in C++). Each rank's
    own hang watchdog ends it with exit 3 once "after epochs" has run for the epoch timeout: the two expiries are
    apart by the skew of the two ranks' arming only (they leave the last epoch's all-reduce together), well within
    the slack asserted here, and long before torchrun's 30 s SIGKILL after SIGTERM."""
    out = tmp_path / "run"
    limit = 10.0
    proc, wall = _gate(out, "--epoch-timeout", repr(limit), "--inject", "rank_hang")
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads((folder / HANG_RECORD).read_text()) for folder in (out, out / "rank1")]
    assert [r["exit_code"] for r in records] == [3, 3]
    assert {r["period"] for r in records} == {"after epochs"} and {r["limit_s"] for r in records} == {limit}
    assert abs(records[0]["time"] - records[1]["time"]) < 3.0  # every rank within the timeout, + 3 s of skew
    assert wall < limit + 50.0  # the setup and one tiny epoch take ~10 s on 2 idle cores
    text = _ranks_section(proc.stdout)
    assert "rank 0: exit 3 (hang: after epochs did not finish within 10 s" in text
    assert "rank 1: exit 3 (hang: after epochs" in text and "HANG on every rank" in text
    # the hung rank's stacks, which torchrun's console (rank 0's only) never shows, are in its folder, named
    stacks = out / "rank1" / HANG_STACKS
    assert "rank 1: after epochs did not finish within 10.0 s, last phase" in text and f"stacks: {stacks}" in text
    assert "Stacks of all threads" in stacks.read_text() and "faulty_step" in stacks.read_text()


@pytest.mark.gpu
def test_a_one_rank_gate_over_nccl_counts_the_all_reduce_captured_in_the_graph_on_the_gpu(tmp_path):
    """World size 1 over NCCL: the learner's all-reduce is replayed inside its CUDA graph (no CPU-side c10d op), so
    only the NCCL kernel under the step's graph launch shows it (NCCL's one-rank reduce: ONE_RANK_KERNEL): exactly
    one per learner step, and the gate PASSes. The default preset's net, 2 epochs (the single-block and memset rows
    are judged from the second): TINY's 16-wide net makes a fill kernel of the step and the one-rank reduce one block each,
    which no_single_block_kernels rightly fails (the H100 run of 2026-12-06)."""
    out = tmp_path / "run"
    gpu = ["--preset", "cartpole", "--device", "cuda", "--epochs", "2", "--set", "learner_steps_per_epoch=200"]
    proc = subprocess.run(
        [sys.executable, "-m", "hotloop.guards.cli", "gate", "--nproc", "1", *gpu, "--no-progress", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = pd.read_csv(out / "collectives.csv")
    assert len(steps) > 0 and steps["allreduce"].eq(1).all(), steps.to_string()
    text = proc.stdout[proc.stdout.index("== hotloop gate --nproc 1: the ranks") :]
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.strip().startswith("one_all_reduce")}
    assert rows["one_all_reduce_per_step"][-1] == "PASS" and text.rstrip().endswith("PASS on every rank (1 ranks)")


# ------------------------------------------------------------------------------------ the pieces, synthetic


def _events(rows: list[dict]) -> pd.DataFrame:
    base = {"name": "", "kind": "cpu_op", "start_us": 0.0, "dur_us": 0.0, "correlation": pd.NA, "tid": "1"}
    return pd.DataFrame([{**base, **r} for r in rows])


ONE_RANK_KERNEL = (
    "__nv_static_32__b4148644_10_onerank_cu_fdf47990__ZN43_GLOBAL__N__b4148644_10_onerank_cu_fdf4799013"
    "oneRankReduceI13FuncPreMulSumIfEEEvPvS3_mmb"
)
"""NCCL's all-reduce (ReduceOp.AVG) on a one-rank communicator, as the H100's Kineto trace of `gate --nproc 1` named
it (torch 2.11, 2026-12-06): no ncclDevKernel_* at all."""


def test_collective_kinds_read_the_same_across_ops_and_kernels():
    assert [
        collective_kind(n)
        for n in (
            "c10d::allreduce_",
            "_c10d_functional::all_reduce",
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            ONE_RANK_KERNEL,
            "c10d::_allgather_base_",
            "c10d::broadcast_",
            "c10d::barrier",
            "aten::add",
            "gloo:all_reduce",
        )
    ] == ["allreduce", "allreduce", "allreduce", "allreduce", "allgather", "broadcast", "barrier", None, None]


def test_step_collectives_counts_calls_waits_and_unexpected_host_reads():
    ua = "user_annotation"
    ev = _events(
        [
            {"name": "step", "kind": ua, "start_us": 0, "dur_us": 100},
            {"name": "c10d::allreduce_", "start_us": 10, "dur_us": 1},
            {"name": "gloo:all_reduce", "kind": ua, "start_us": 10, "dur_us": 30, "tid": "2"},
            {"name": "Optimizer.step#Adam.step", "kind": ua, "start_us": 50, "dur_us": 10},
            {"name": "aten::_local_scalar_dense", "start_us": 52, "dur_us": 1},  # torch.optim's: allowed
            {"name": "step", "kind": ua, "start_us": 200, "dur_us": 100},
            {"name": "c10d::allreduce_", "start_us": 210, "dur_us": 1},
            {"name": "c10d::broadcast_", "start_us": 220, "dur_us": 1},
            {"name": "aten::_local_scalar_dense", "start_us": 290, "dur_us": 1},  # in the loop body: counted
            # a third step: no CPU op, one NCCL all-reduce replayed in a graph (placed by its launch)
            {"name": "step", "kind": ua, "start_us": 400, "dur_us": 100},
            {"name": "cudaGraphLaunch", "kind": "runtime", "start_us": 410, "dur_us": 5, "correlation": 7},
            {"name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kind": "kernel", "start_us": 900, "correlation": 7},
            # a fourth: world size 1 over NCCL, whose AVG all-reduce is NCCL's one-rank reduce kernel
            {"name": "step", "kind": ua, "start_us": 1000, "dur_us": 100},
            {"name": "cudaGraphLaunch", "kind": "runtime", "start_us": 1010, "dur_us": 5, "correlation": 8},
            {"name": ONE_RANK_KERNEL, "kind": "kernel", "start_us": 1500, "correlation": 8},
        ]
    )
    t = step_collectives(ev)
    assert t["collectives"].tolist() == [1, 2, 1, 1] and t["allreduce"].tolist() == [1, 1, 1, 1]
    assert t["other"].tolist() == ["", "broadcast x1", "", ""]
    assert t["host_reads"].tolist() == [0, 1, 0, 0] and t.loc[1, "read_in"] == "step x1"
    assert t.loc[0, "wait_us"] == 30 and t.loc[0, "busy_us"] == 70
    assert step_collectives(_events([{"name": "aten::add"}])).empty


def _outcome(rank: int, busy_us: float, allreduce: int = 1, reads: int = 0) -> RankOutcome:
    steps = pd.DataFrame(
        {
            "step": range(4),
            "step_us": 1000.0,
            "wait_us": 1000.0 - busy_us,
            "busy_us": busy_us,
            "collectives": allreduce,
            "allreduce": allreduce,
            "other": "",
            "host_reads": reads,
            "read_in": "step x1" if reads else "",
        }
    )
    verdicts = pd.DataFrame(
        {
            "id": ["no_stream_sync", "one_all_reduce_per_step", "no_hang"],
            "criterion": ["a", "b", "c"],
            "limit": ["== 0", "== 1", "== yes"],
            "measured": ["", "", "yes"],
            "verdict": ["-", "-", "PASS"],
            "status": ["not applicable (no CUDA)", "not measured here", "measured"],
            "source": ["", "", "watchdog"],
            "worst_step": "",
            "evidence": "",
        }
    )
    return RankOutcome(rank, None, 0, "", None, verdicts, steps)


def test_each_criterion_is_judged_on_the_worst_rank_and_names_the_failing_ones():
    table, criteria, straggler = judge_ranks([_outcome(0, 500), _outcome(1, 520, allreduce=2, reads=1)], cpu=True)
    rows = criteria.set_index("id")
    assert rows.loc["one_all_reduce_per_step", ["rank0", "rank1", "verdict", "ranks_failing"]].tolist() == [
        "1 PASS",
        "2 FAIL",
        "FAIL",
        "rank 1",
    ]
    assert rows.loc["no_stream_sync", "verdict"] == "FAIL" and "in step x1" in rows.loc["no_stream_sync", "evidence"]
    assert rows.loc["no_hang", "verdict"] == "PASS"
    assert table["failed"].tolist() == ["", "no_stream_sync one_all_reduce_per_step"]
    assert straggler["verdict"] == "PASS" and straggler["worst_rank"] == 1
    # a GPU rank keeps its gate's own sync rows: the host reads judge CPU ranks only
    _, gpu, _ = judge_ranks([_outcome(0, 500), _outcome(1, 520, reads=1)], cpu=False)
    assert gpu.set_index("id").loc["no_stream_sync", "verdict"] == "-"


def test_the_straggler_row_fails_beyond_its_limit_only():
    slow = 500 * STRAGGLER_LIMIT * 1.1
    _, _, straggler = judge_ranks([_outcome(0, 500), _outcome(1, 500), _outcome(2, slow)], cpu=True)
    assert straggler["verdict"] == "FAIL" and straggler["worst_rank"] == 2
    assert straggler["ratio"] == pytest.approx(slow / 500)
    _, _, within = judge_ranks([_outcome(0, 500), _outcome(1, 500 * STRAGGLER_LIMIT * 0.9)], cpu=True)
    assert within["verdict"] == "PASS"
    # two ranks: judged against the other rank, not a median the straggler pulls halfway to itself
    _, _, pair = judge_ranks([_outcome(0, 500), _outcome(1, 500 * 2.75)], cpu=True)
    assert pair["verdict"] == "FAIL" and pair["worst_rank"] == 1 and pair["ratio"] == pytest.approx(2.75)
    _, _, noisy = judge_ranks([_outcome(0, 6053), _outcome(1, 9870)], cpu=True)  # 1.63 x: a clean tiny gate's
    assert noisy["verdict"] == "PASS"
    _, _, alone = judge_ranks([_outcome(0, 500)], cpu=True)
    assert alone["verdict"] == "-" and alone["worst_rank"] is None
    assert collective_row(None)["verdict"] == "-"


def test_the_launchers_report_exits_3_on_a_hang_and_70_without_a_record(tmp_path):
    (tmp_path / "rank1").mkdir()
    for folder in (tmp_path, tmp_path / "rank1"):
        (folder / HANG_RECORD).write_text(
            json.dumps({"exit_code": 3, "period": "after epochs", "limit_s": 5.0, "last_phase": "update"})
        )
    text, code = ranks_report(tmp_path, 2, cpu=True)
    assert code == 3 and "HANG on every rank" in text and "rank 1: exit 3 (hang: after epochs" in text
    (tmp_path / HANG_RECORD).unlink()
    (tmp_path / "rank1" / HANG_RECORD).unlink()
    (tmp_path / RANK_EXIT).write_text(json.dumps({"rank": 0, "exit_code": 0, "why": ""}))
    text, code = ranks_report(tmp_path, 2, cpu=True)
    assert code == 70 and "rank 1: exit ? (no exit record" in text and "ERROR on rank 1" in text
    # a rank that failed is the cause, though the rank left waiting for it in a collective then hung
    (tmp_path / "rank1" / RANK_EXIT).write_text(json.dumps({"rank": 1, "exit_code": 70, "why": "RuntimeError()"}))
    (tmp_path / RANK_EXIT).unlink()
    (tmp_path / HANG_RECORD).write_text(json.dumps({"exit_code": 3, "period": "epoch 1", "limit_s": 5.0}))
    text, code = ranks_report(tmp_path, 2, cpu=True)
    assert code == 70 and "ERROR on rank 1:" in text and "rank 0: exit 3 (hang: epoch 1" in text
    # torchrun's SIGTERM to the other ranks after one failed: the failed one is named, not the terminated
    (tmp_path / HANG_RECORD).unlink()
    (tmp_path / RANK_EXIT).write_text(json.dumps({"rank": 0, "exit_code": 143, "why": "terminated (SIGTERM)"}))
    text, code = ranks_report(tmp_path, 2, cpu=True)
    assert code == 70 and "ERROR on rank 1:" in text and "rank 0: exit 143 (terminated (SIGTERM))" in text
    # every rank stopped by a SIGTERM: no verdict and no error, exit 143
    (tmp_path / "rank1" / RANK_EXIT).write_text(json.dumps({"rank": 1, "exit_code": 143, "why": "x"}))
    text, code = ranks_report(tmp_path, 2, cpu=True)
    assert code == 143 and "TERMINATED: every rank stopped by SIGTERM" in text


def test_the_watchdog_writes_its_hang_record_before_it_ends_the_process(tmp_path):
    record = tmp_path / "hang.json"
    exits: list[int] = []
    with open(tmp_path / "report.txt", "w") as stream:
        wd = HangWatchdog(0.05, stream=stream, hang_record=record)
        wd._exit = exits.append
        with wd:
            wd.phase("update")
            wd.arm("after epochs")
            deadline = time.monotonic() + 5
            while not exits and time.monotonic() < deadline:
                time.sleep(0.01)
    assert exits == [3]
    got = json.loads(record.read_text())
    assert (got["exit_code"], got["period"], got["last_phase"], got["limit_s"]) == (3, "after epochs", "update", 0.05)
    assert got["stacks"] == HANG_STACKS and "test_the_watchdog_writes" in (tmp_path / HANG_STACKS).read_text()


# ------------------------------------------------------------------------------------ bad input, before any work


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--nproc", "0"], "--nproc must be an int >= 1"),
        (["--nproc", "2", "--update-baseline", "--baseline", "b.json"], "compares no baseline"),
        (["--nproc", "2", "--baseline", "b.json"], "compares no baseline"),
        (["--nproc", "2", "--guard-steps", "0"], "--guard-steps and --repeats must be >= 1"),
        (["--inject", "rank_hang"], "pass --nproc N with N >= 2"),
        (["--nproc", "1", "--inject", "extra_collective"], "pass --nproc N with N >= 2"),
        (["--nproc", "2", "--repeats", "2"], "one guarded window per rank"),
        (["--nproc", "100000"], "at most"),  # 100,000 ranks of ~0.3 GB each fit no host
    ],
)
def test_bad_nproc_gates_exit_2_before_anything_is_written(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["gate", *TINY, *argv]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_nproc_under_torchrun_is_refused(monkeypatch, tmp_path, capsys):
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    assert main(["gate", *TINY, "--nproc", "2"]) == 2
    assert "under torchrun, leave it out" in capsys.readouterr().err


def test_each_rank_gets_the_gates_options_without_nproc(tmp_path):
    from hotloop.guards.commands.gate import gate_rank_args

    args = build_parser().parse_args(["gate", "--nproc", "2", *TINY, "--guard-steps", "5", "--inject", "rank_sync"])
    rank_args = gate_rank_args(args, tmp_path)
    assert "--nproc" not in rank_args and rank_args[-2:] == ["--no-baseline", "--no-progress"]
    assert rank_args[rank_args.index("--out") + 1] == str(tmp_path)
    again = build_parser().parse_args(["gate", *rank_args])
    assert (again.guard_steps, again.inject, again.nproc, again.no_baseline) == (5, "rank_sync", None, True)
    assert again.overrides == args.overrides and again.device == "cpu"
    cmd = torchrun_command(2, rank_args, "gate")
    assert cmd[-len(rank_args) - 2 :] == ["hotloop.guards.cli", "gate", *rank_args]

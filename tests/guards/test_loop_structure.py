"""guards/loop_structure.py: the census of the loop's D2D copies, memsets / fills and grid (1,1,1) launches over the
epochs after the first, its rules for what the guarded window never held, and the gate rows it fills.

This machine has no GPU: the census counts CPU tensors here (`device_type="cpu"`, `cuda=True`), the hooks being the
same (a dispatch mode sees the ATen op whatever the device). The faults sit in a loop of the trainer's own phase
ranges (hotloop.profiles.ranges.phase_range), or in the trainer's loop for the gate tests; the mutants
ci/mutants/loop_params_clone_every_200, progress_zeros_every_300 and learner_grads_zeroed_every_250 are the same
faults on a GPU.
"""

from __future__ import annotations

import json
import os
import re
import sys

import pandas as pd
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hotloop.guards import loop_structure as ls
from hotloop.guards.criteria import verdict_table
from hotloop.guards.gate import (
    CENSUS_COLUMN,
    STRUCTURE_CENSUS_OFF,
    STRUCTURE_FILE,
    census_overhead,
    judge_loop_structure,
)
from hotloop.guards.loop_structure import (
    D2D,
    GRID1,
    MEMSET,
    CensusGroup,
    LoopStructureCensus,
    classify_op,
    classify_triton,
    new_work,
)
from hotloop.profiles.ranges import phase_range

D2D_ROW, MEMSET_ROW, GRID1_ROW = "no_d2d_weight_sync", "memsets_only_where_needed", "no_single_block_kernels"
LEARNER = ("update", "sample")


class _Ops(TorchDispatchMode):
    """Records (func, args, kwargs, out) of every ATen op."""

    @classmethod
    def _should_skip_dynamo(cls):
        return False

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.calls.append((func, args, kwargs or {}, out))
        return out


def _kinds(fn) -> list[tuple[str, str]]:
    """classify_op of every op `fn` runs, on CPU tensors."""
    with _Ops() as ops:
        fn()
    return [k for func, a, kw, out in ops.calls for k, _ in classify_op(func, a, kw, out, "cpu")]


@pytest.mark.parametrize(
    "fn,expected",
    [
        (lambda x, s: x.clone(), [D2D]),  # a memcpy: dense, same dtype
        (lambda x, s: s.copy_(x), [D2D]),
        (lambda x, s: x.t().contiguous(), []),  # a copy kernel (transposed), 4096 elements
        (lambda x, s: x[:2, :2].t().contiguous(), [GRID1]),  # a copy kernel of 4 elements: one block
        (lambda x, s: x.to(torch.float64), []),  # a cast: a kernel, not a memcpy
        (lambda x, s: torch.zeros(3), [MEMSET, GRID1]),
        (lambda x, s: torch.zeros(4096), [MEMSET]),
        (lambda x, s: x.zero_(), [MEMSET]),
        (lambda x, s: x.masked_fill_(x > 0, 0.0), [MEMSET]),  # the comparison: 4096 elements, no event
        (lambda x, s: x.view(-1)[:5], []),  # views launch nothing
        (lambda x, s: torch.empty(7), []),
        (lambda x, s: x.sum(), []),  # reads 4096 elements
        (lambda x, s: x[0, :8].sum(), [GRID1]),  # 8 elements in, 1 out: one block
        (lambda x, s: x.to("meta"), []),  # to another device: not this device's work
    ],
)
def test_classify_op(fn, expected):
    x, s = torch.randn(64, 64), torch.empty(64, 64)
    assert _kinds(lambda: fn(x, s)) == expected


def test_classify_triton_grid_one_only():
    assert classify_triton("_k", (1,)) == [(GRID1, "_k (Triton, grid (1, 1, 1))")]
    assert classify_triton("_k", (1, 1, 1)) and not classify_triton("_k", (2,)) and not classify_triton("_k", (1, 3))


def _loop(
    n: int,
    *,
    clone_every: int = 0,
    zeros_every: int = 0,
    first_iteration_fill: bool = False,
    readback_every: int = 0,
    params: torch.Tensor | None = None,
) -> None:
    """A loop shaped as Trainer.iterate: a setup op, then per iteration a "step" range holding env_step, update
    (the learner's phase), readback_publish every `readback_every` and progress every 10."""
    params = torch.randn(1000) if params is None else params
    torch.zeros(3)  # the iterate call's own setup (the reference learner's sums): before the first iteration
    for i in range(n):
        with phase_range("step"):
            with phase_range("env_step"):
                params[:8].mul_(1.0)  # a small op every iteration: a one-block kernel in the window too
            with phase_range("update"):
                params.mul_(0.999)
                if first_iteration_fill and i == 0:
                    params[:4].fill_(0.5)  # a first-iteration-of-epoch effect
                if clone_every and i % clone_every == clone_every - 1:
                    snapshot = params.clone()  # the fault: a D2D copy of the flat parameters  # noqa: F841
            if readback_every and (i + 1) % readback_every == 0:
                with phase_range("readback_publish"):
                    params[:5] * 2.0  # a one-block kernel every 100 (= K): held
            if (i + 1) % 10 == 0:
                with phase_range("progress"):
                    if zeros_every and (i + 1) % zeros_every == 0:
                        torch.zeros(4)  # the fault: a one-block fill in the progress callback


def _census(epochs: int = 3, iterations: int = 1000, **fault) -> LoopStructureCensus:
    census = LoopStructureCensus(cuda=True, device_type="cpu")
    for epoch in range(1, epochs + 1):
        census.begin(epoch)
        try:
            _loop(iterations, **fault)
        finally:
            census.end()
    return census


def test_a_clone_every_200_iterations_is_found_with_its_period_and_site():
    census = _census(clone_every=200)
    assert census.skipped == 1 and census.epochs == [2, 3] and census.iterations == {2: 1000, 3: 1000}
    streams = census.new_work(100, LEARNER)
    new = streams[streams["new"]]
    assert len(new) == 1, new
    row = new.iloc[0]
    assert (row.criterion, row.kind, row.phase, row.period, row.occurrences) == (D2D_ROW, D2D, "update", 200, 10)
    assert row.first == "epoch 2 iteration 199" and row.what == "aten.clone (4000 bytes)"
    # relative to the checkout when hotloop is installed from it (editable), else the absolute path
    assert re.search(r"(^|/)tests/guards/test_loop_structure\.py:\d+ in _loop$", row.site), row.site
    verdicts = census.judge(100, LEARNER)
    added, text = verdicts[D2D_ROW]
    assert added == 1 and "every 200 iterations" in text and "in update" in text and "test_loop_structure.py" in text
    assert verdicts[MEMSET_ROW][0] == 0 and verdicts[GRID1_ROW][0] == 0


def test_a_clean_loop_is_not_flagged():
    """Per-iteration one-block ops, a readback clone every 100 (= K), a first-iteration fill and the iterate call's
    setup fill all happen in the window at the same rate (or are per-epoch setup): nothing is new."""
    census = _census(first_iteration_fill=True, readback_every=100)
    streams = census.new_work(100, LEARNER)
    assert not streams["new"].any(), streams[streams["new"]]
    assert len(streams) > 0 and streams["held"].any()  # it did see the work, and held it by rule
    for name, (added, text) in census.judge(100, LEARNER).items():
        assert added == 0 and text == "none new in the loop of epochs 2-3 (2000 iterations)", name
    readback = streams[streams["phase"].eq("readback_publish")]
    assert len(readback) == 1 and readback["kind"].iloc[0] == GRID1 and readback["period"].iloc[0] == 100
    assert "every 100 consecutive iterations hold it" in readback["why"].iloc[0]
    first = streams[streams["what"].str.startswith("aten.fill_")].iloc[0]
    assert first.held and "at iteration 0 of every epoch, within the first 100" in first.why
    setup = streams[streams["first"].str.endswith("before its first iteration")]
    assert len(setup) and not setup["judged"].any()


def test_a_one_block_fill_every_300_in_the_progress_callback_fails_the_single_block_row_only():
    census = _census(epochs=2, zeros_every=300)
    verdicts = census.judge(100, LEARNER)
    added, text = verdicts[GRID1_ROW]
    assert added == 1 and "every 300 iterations" in text and "in progress" in text
    assert verdicts[MEMSET_ROW][0] == 0  # progress is not a learner phase: the window's memset row does not judge it
    streams = census.new_work(100, LEARNER)
    fills = streams[streams["kind"].eq(MEMSET) & streams["phase"].eq("progress")]
    assert len(fills) == 1 and not fills["judged"].iloc[0] and "not the learner's" in fills["why"].iloc[0]


def test_the_window_size_decides():
    """The same clone every 200 iterations is held by a window of 200 (every 200 consecutive iterations hold one)."""
    census = _census(epochs=2, clone_every=200)
    assert census.judge(199, LEARNER)[D2D_ROW][0] == 1
    assert census.judge(200, LEARNER)[D2D_ROW][0] == 0


def _events(rows: list[tuple]) -> pd.DataFrame:
    """EVENT_COLUMNS from (epoch, iteration, path, kind, site), in_step when iteration >= 0."""
    return pd.DataFrame(
        [
            (e, i, i >= 0 and path != ("(out)",), () if path == ("(out)",) else path, kind, "op", site)
            for e, i, path, kind, site in rows
        ],
        columns=ls.EVENT_COLUMNS,
    )


def test_new_work_rules_on_synthetic_events():
    iterations = {2: 1000, 3: 1000}
    rows = []
    for e in (2, 3):
        for i in range(1000):
            rows.append((e, i, ("update",), D2D, "every-iteration"))
            if i % 2 == 0:
                rows.append((e, i, ("update",), D2D, "every-iteration"))  # x2 every 2: level 2, held
            if i % 50 == 49:
                rows.append((e, i, ("update",), MEMSET, "every-50"))
            if i % 250 == 248:
                rows.append((e, i, ("update",), D2D, "every-iteration"))  # x3 every 250: level 3, new
            if i == 150:
                rows.append((e, i, ("update",), GRID1, "epoch-aligned-late"))
            if i == 0:
                rows.append((e, i, ("update",), GRID1, "epoch-aligned-first"))
            if i % 200 == 0:
                rows.append((e, i, ("env_step",), D2D, "actor-copy"))  # not the learner's: not judged
    rows += [(3, 500, (), GRID1, "once"), (2, -1, (), MEMSET, "setup"), (2, 10, ("(out)",), GRID1, "between")]
    streams = new_work(_events(rows), iterations, 100, LEARNER).set_index(["site", "level"])
    assert streams.loc[("every-iteration", 1), "held"] and streams.loc[("every-iteration", 2), "held"]
    late = streams.loc[("every-iteration", 3)]
    assert late.new and late.period == 250 and late.occurrences == 8
    assert streams.loc[("every-50", 1), "held"] and streams.loc[("epoch-aligned-first", 1), "held"]
    aligned = streams.loc[("epoch-aligned-late", 1)]
    assert aligned.new and aligned.period == 1000 and aligned.epochs == "2:1 3:1"
    once = streams.loc[("once", 1)]
    assert once.new and pd.isna(once.period) and once.first == "epoch 3 iteration 500"
    assert not streams.loc[("actor-copy", 1), "judged"] and not streams.loc[("setup", 1), "judged"]
    between = streams.loc[("between", 1)]  # a one-block launch between steps: the window judges those too
    assert between.judged and between.phase == ls.OUTSIDE and between.new
    with pytest.raises(ValueError, match="window_steps"):
        new_work(_events(rows), iterations, 0, LEARNER)


def test_the_census_costs_nothing_without_cuda_and_leaves_no_hook_behind():
    enter = phase_range.__dict__["__enter__"]
    from triton.runtime.jit import JITFunction

    run = JITFunction.__dict__["run"]
    off = LoopStructureCensus(cuda=False, device_type="cpu")
    off.begin(1)
    off.begin(2)  # nothing opened: no error
    _loop(5, clone_every=1)
    off.end()
    assert off.epochs == [] and off.events == [] and off.ops == 0
    assert all(a is None for a, _ in off.judge(100, LEARNER).values())
    assert off.judge(100, LEARNER)[D2D_ROW][1] == "not applicable (no CUDA)"
    census = LoopStructureCensus(cuda=True, device_type="cpu")
    census.begin(1)
    census.end()
    assert census.judge(100, LEARNER)[D2D_ROW] == (
        None,
        "not measured (no epoch after the first: the first compiles and captures; run --epochs 2 or more)",
    )
    census.begin(2)
    assert phase_range.__dict__["__enter__"] is not enter and JITFunction.__dict__["run"] is not run
    with pytest.raises(RuntimeError, match="already open"):
        census.begin(3)
    census.end()
    census.end()  # idempotent
    assert phase_range.__dict__["__enter__"] is enter and JITFunction.__dict__["run"] is run
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    assert _get_current_dispatch_mode() is None
    torch.randn(4).clone()  # after end: not counted
    assert census.events == []


def test_a_grid_one_triton_launch_is_counted_with_its_kernel_name():
    triton = pytest.importorskip("triton")
    import triton.language as tl

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("launches on CPU tensors: needs the Triton interpreter (TRITON_INTERPRET=1, tests/conftest.py)")

    @triton.jit
    def _census_probe_kernel(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1.0, mask=offs < n)

    x = torch.zeros(64)
    census = LoopStructureCensus(cuda=True, device_type="cpu")
    census.begin(1)
    census.end()
    census.begin(2)
    try:
        for i in range(3):
            with phase_range("step"), phase_range("update"):
                _census_probe_kernel[(2,)](x, 64, BLOCK=32)
                _census_probe_kernel[lambda meta: (triton.cdiv(64, meta["BLOCK"]),)](x, 64, BLOCK=64)
    finally:
        census.end()
    assert census.launches == 6 and torch.equal(x, torch.full((64,), 6.0))
    frame = census.frame()
    frame = frame[frame["what"].str.contains("Triton")]  # the interpreter's own copies of the buffers are ops too
    assert frame["what"].tolist() == ["_census_probe_kernel (Triton, grid (1, 1, 1))"] * 3
    assert frame["iteration"].tolist() == [0, 1, 2] and frame["path"].tolist() == [("update",)] * 3


@pytest.mark.gpu
def test_real_cuda_work_is_classed_and_captured_work_is_not():
    """On a GPU: a clone of a CUDA tensor is a D2D copy, torch.zeros(3) a fill and a one-block kernel, a copy to the
    host nothing, a Triton launch of grid (1,) a one-block kernel; ops captured into a CUDA graph during the span
    are not launches (their replays are, and the window holds the loop's graphs)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _census_gpu_probe_kernel(x_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) + 1.0)

    x = torch.randn(4096, device="cuda")
    _census_gpu_probe_kernel[(1,)](x, BLOCK=32)  # compiled before the census
    static = torch.zeros(8, device="cuda")
    census = LoopStructureCensus(cuda=True)
    census.begin(1)
    census.end()
    census.begin(2)
    try:
        with phase_range("step"), phase_range("update"):
            x.clone()
            torch.zeros(3, device="cuda")
            x.cpu()
            _census_gpu_probe_kernel[(1,)](x, BLOCK=32)
            graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.cuda.graph(graph):
                static.zero_()
            torch.cuda.current_stream().wait_stream(side)
    finally:
        census.end()
    frame = census.frame()
    assert frame["kind"].tolist()[:4] == [D2D, MEMSET, GRID1, GRID1], frame.to_string()
    assert frame["what"].iloc[0] == "aten.clone (16384 bytes)" and frame["what"].iloc[1].startswith("aten.zero")
    assert frame["what"].iloc[3] == "_census_gpu_probe_kernel (Triton, grid (1, 1, 1))"
    assert frame["path"].map(("update",).__eq__).all() and frame["site"].str.contains("test_loop_structure.py").all()
    # the capture itself launches real work before capturing: one-element fills (the graph's registered generator
    # state; the H100 run of 2026-12-05 showed two, each a fill and a one-block kernel) at the `torch.cuda.graph`
    # line; the captured zero_ of `static` (8 elements) is not among the rows
    rest = frame.iloc[4:]
    assert set(rest["what"]) <= {"aten.fill_ (1 elements)", "aten.fill_ (1 elements: one block)"}, frame.to_string()
    assert rest["site"].str.contains(f"test_loop_structure.py:{_line_of('torch.cuda.graph(graph)')} ").all()
    assert not frame["what"].str.contains("8 elements").any()


def _line_of(text: str) -> int:
    """The line of this file that holds `text` (first occurrence after its definition's own line)."""
    lines = open(__file__).read().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if text in line and "_line_of" not in line)


def test_census_group_begins_in_order_and_ends_every_one():
    calls = []

    class Fake:
        def __init__(self, name, fail_end=False):
            self.name, self.fail_end = name, fail_end

        def begin(self, epoch):
            calls.append(f"begin {self.name} {epoch}")

        def end(self):
            calls.append(f"end {self.name}")
            if self.fail_end:
                raise RuntimeError(self.name)

    group = CensusGroup([Fake("sync", fail_end=True), None, Fake("structure")])
    group.begin(2)
    with pytest.raises(RuntimeError, match="sync"):
        group.end()
    group.end()  # nothing open: nothing ended twice
    assert calls == ["begin sync 2", "begin structure 2", "end structure", "end sync"]


# --- the gate's rows ------------------------------------------------------------------------------------------------


def _verdicts(measured: dict) -> pd.DataFrame:
    table = verdict_table(measured)
    for col in ("source", "evidence", "worst_step"):
        table[col] = ""
    return table


class _Judged:
    """A census whose judge() is given."""

    def __init__(self, result, epochs=(2, 3)):
        self.result, self.epochs = result, list(epochs)

    def judge(self, window_steps, learner):
        return self.result

    def span_text(self):
        return "epochs 2-3"

    def new_work(self, window_steps, learner):
        return pd.DataFrame(columns=ls.STREAM_COLUMNS)


def test_judge_loop_structure_fails_the_windows_own_rows():
    verdicts = _verdicts({D2D_ROW: 0, MEMSET_ROW: 1, GRID1_ROW: 0, "no_stream_sync": 0})
    census = _Judged(
        {
            D2D_ROW: (
                1,
                "aten.clone (4000 bytes) at trainer/loop.py:250 in learner_step in update: every "
                "200 iterations (x10 ...)",
            ),
            MEMSET_ROW: (1, "aten.zero_ ... every 250 iterations"),
            GRID1_ROW: (0, "none new in the loop of epochs 2-3 (2000 iterations)"),
        }
    )
    judge_loop_structure(verdicts, census, 100, LEARNER)
    rows = verdicts.set_index("id")
    assert rows.loc[D2D_ROW, "verdict"] == "FAIL" and rows.loc[D2D_ROW, "measured"] == 1
    assert rows.loc[D2D_ROW, "source"] == "census" and "every 200 iterations" in rows.loc[D2D_ROW, "evidence"]
    assert rows.loc[D2D_ROW, "evidence"].startswith("census of epochs 2-3, not in the 100-iteration window: ")
    assert rows.loc[MEMSET_ROW, "verdict"] == "FAIL" and rows.loc[MEMSET_ROW, "measured"] == 2  # 1 in the window + 1
    assert rows.loc[GRID1_ROW, "verdict"] == "PASS" and rows.loc[GRID1_ROW, CENSUS_COLUMN].startswith("PASS: none new")
    assert rows.loc["no_stream_sync", CENSUS_COLUMN] == "" and rows.loc["no_stream_sync", "verdict"] == "PASS"


def test_judge_loop_structure_room_under_a_limit_and_the_other_states():
    verdicts = _verdicts({D2D_ROW: 0, MEMSET_ROW: 0, GRID1_ROW: 0})
    judge_loop_structure(
        verdicts,
        _Judged({D2D_ROW: (0, "none"), MEMSET_ROW: (1, "aten.fill_ ..."), GRID1_ROW: (0, "none")}),
        100,
        LEARNER,
    )
    memset = verdicts.set_index("id").loc[MEMSET_ROW]
    assert memset.verdict == "PASS" and memset[CENSUS_COLUMN].startswith("within the limit (0 in the window's worst")
    verdicts = _verdicts({})
    judge_loop_structure(verdicts, None, 100, LEARNER)
    assert (verdicts.set_index("id").loc[[D2D_ROW, MEMSET_ROW, GRID1_ROW], CENSUS_COLUMN] == STRUCTURE_CENSUS_OFF).all()
    verdicts = _verdicts({})
    judge_loop_structure(verdicts, LoopStructureCensus(cuda=False), 100, LEARNER)
    assert (verdicts.set_index("id").loc[[D2D_ROW, GRID1_ROW], CENSUS_COLUMN] == "not applicable (no CUDA)").all()
    assert verdicts.set_index("id").loc[D2D_ROW, "verdict"] == "-"


TINY = [
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
    "eval_episodes=2",
    "--no-progress",
    "--set",
    "target_update_interval=2",
]


@pytest.fixture
def census_counts_cpu(monkeypatch):
    """The gate's structure census counts the CPU run's tensors as a GPU run's."""
    import hotloop.guards.gate as gate

    class CountsCpu(LoopStructureCensus):
        def __init__(self, cuda=None, device_type="cuda", step_range="step"):
            super().__init__(cuda=True, device_type="cpu", step_range=step_range)

    monkeypatch.setattr(gate, "LoopStructureCensus", CountsCpu)


def test_a_cpu_gate_counting_cpu_tensors_passes_clean_and_fails_a_clone_every_10(
    tmp_path, capsys, monkeypatch, census_counts_cpu
):
    from hotloop.guards.cli import main
    from hotloop.trainer.loop import Trainer

    clean = tmp_path / "clean"
    assert main(["gate", "--epochs", "3", "--device", "cpu", "--out", str(clean), "--guard-steps", "4", *TINY]) == 0
    printed = capsys.readouterr().out
    rows = {v["id"]: v for v in json.loads((clean / "criteria.json").read_text())}
    for name in (D2D_ROW, MEMSET_ROW, GRID1_ROW):  # the reference learner's every-iteration ops are held
        assert rows[name][CENSUS_COLUMN] == "PASS: none new in the loop of epochs 2-3 (40 iterations)", name
    assert "Structure census" in printed and "cost: " in printed
    streams = pd.read_csv(clean / f"{STRUCTURE_FILE}.csv")
    assert len(streams) and not streams["new"].any()

    step = Trainer.train_step

    def snapshot_every_10(self):
        out = step(self)
        if self.learner_steps % 10 == 0:
            self.snapshot = next(self.learner.online.parameters()).detach().clone()  # a D2D copy on a GPU
        return out

    monkeypatch.setattr(Trainer, "train_step", snapshot_every_10)
    faulty = tmp_path / "faulty"
    assert main(["gate", "--epochs", "3", "--device", "cpu", "--out", str(faulty), "--guard-steps", "4", *TINY]) == 1
    printed = capsys.readouterr().out
    rows = {v["id"]: v for v in json.loads((faulty / "criteria.json").read_text())}
    assert rows[D2D_ROW]["verdict"] == "FAIL" and rows[D2D_ROW]["source"] == "census"
    assert "every 10 iterations" in rows[D2D_ROW]["evidence"] and "test_loop_structure.py" in rows[D2D_ROW]["evidence"]
    assert f"FAIL no D2D weight sync [{D2D_ROW}]: measured 1" in printed


def test_census_overhead_times_the_three_modes(monkeypatch):
    from hotloop.trainer.config import preset
    from hotloop.trainer.loop import Trainer

    cfg = preset(
        "cartpole",
        device="cpu",
        num_envs=8,
        learner_steps_per_epoch=12,
        learning_starts=64,
        batch_size=16,
        trunk_hidden=(16,),
        head_hidden=8,
        eval_episodes=0,
        epochs=2,
    )
    trainer = Trainer(cfg)
    trainer.prefill()
    before = trainer.learner_steps
    out = census_overhead(trainer, 3, pairs=2)
    assert trainer.learner_steps - before == 3 * 3 * (1 + 2)
    assert set(out["us_per_iteration"]) == {"none", "structure", "both"} and set(out["overhead_ratio"]) == {
        "structure",
        "both",
    }
    assert all(v > 0 for v in out["us_per_iteration"].values())
    with pytest.raises(ValueError, match="pairs"):
        census_overhead(trainer, 3, pairs=0)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

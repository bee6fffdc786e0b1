"""Polling waits in the guarded window: a host that queries an event or a stream until the GPU is done waits as a sync
does, with no sync call. The hooks count the completion queries of each step apart from the syncs; those beyond
the loop's allowance (the readback's one query per publication) FAIL "no_event_sync" with their call site, the
readback's own pass.

On the CPU there is no CUDA event: `FakeEvent` / `FakeStream` stand in, their `query` the hooked torch.cuda API
itself (a stub that answers "not ready" `lag` times after each record), so the hooks see the caller's line. The
readback runs in the reference learner's loop through `with_readback` (the real AsyncReadback in a
"readback_publish" phase every log_interval learner steps, as the hotloop learner publishes); the mutant
ci/mutants/readback_spin_until_copied.patch is applied to a copy of trainer/readback.py and run the same way.

`FakeEvent`, `FakeStream`, `fake_queries`, `with_readback` and `load_patched` are imported by test_loop_syncs.py."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from hotloop.guards.criteria import READBACK_QUERIES_PER_PUBLISH
from hotloop.guards.gate import guard_loop
from hotloop.guards.mutate import apply_patch
from hotloop.trainer.config import preset
from hotloop.trainer.loop import Trainer
from hotloop.trainer.readback import AsyncReadback

ROOT = Path(__file__).parents[2]
MUTANTS = ROOT / "ci" / "mutants"
SMALL = dict(
    device="cpu",
    epochs=1,
    learner_steps_per_epoch=12,
    learning_starts=64,
    batch_size=32,
    trunk_hidden=(16,),
    head_hidden=8,
    eval_episodes=0,
    replay_capacity=4096,
    target_update_interval=1,
    log_interval=4,
)


class FakeEvent:
    """A CUDA event on the CPU: record() makes it answer "not ready" to its next `lag` queries; `query` is the hooked
    torch.cuda.Event.query (stubbed by `fake_queries`) bound to it."""

    lag = 2

    def __init__(self, *args, **kwargs) -> None:
        self.left = 0
        self.records = 0

    def record(self, stream=None) -> None:
        self.left, self.records = self.lag, self.records + 1

    def synchronize(self) -> None:
        self.left = 0

    def answer(self) -> bool:
        if self.left:
            self.left -= 1
            return False
        return True

    query = property(lambda self: functools.partial(torch.cuda.Event.query, self))


class FakeStream(FakeEvent):
    """A CUDA stream on the CPU: not ready for `lag` queries after each `busy()`; `query` the hooked
    torch.cuda.Stream.query."""

    def busy(self) -> FakeStream:
        self.record()
        return self

    query = property(lambda self: functools.partial(torch.cuda.Stream.query, self))


@pytest.fixture
def fake_queries(monkeypatch):
    """torch.cuda.Event.query / Stream.query answer for a FakeEvent / FakeStream (the hooks wrap these stubs)."""
    monkeypatch.setattr(torch.cuda.Event, "query", lambda self: self.answer())
    monkeypatch.setattr(torch.cuda.Stream, "query", lambda self: self.answer())


def with_readback(monkeypatch, readback_class=AsyncReadback) -> list:
    """Make the reference learner's loop publish through `readback_class` (FakeEvent events) every log_interval learner
    steps, in a "readback_publish" phase, as the hotloop learner does (Trainer.learner_step); returns the list the
    trainers' readbacks are appended to."""
    made, step = [], Trainer.learner_step

    def learner_step(self):
        out = step(self)
        if self.learner_steps % self.cfg.log_interval == 0:
            if not hasattr(self, "test_readback"):
                self.test_readback = readback_class(["x"], "cpu", event_factory=FakeEvent)
                made.append(self.test_readback)
            with self.phase("readback_publish"):
                self.test_readback.publish([torch.ones(1)], self.learner_steps)
        return out

    monkeypatch.setattr(Trainer, "learner_step", learner_step)
    return made


def load_patched(mutant: str, rel: str, tmp_path: Path, name: str):
    """The module `rel` of this checkout with ci/mutants/<mutant>.patch applied to a copy under tmp_path, imported
    as `name` (its functions' code names the copy's file and lines)."""
    tree = tmp_path / mutant
    (tree / rel).parent.mkdir(parents=True)
    shutil.copy2(ROOT / rel, tree / rel)
    assert apply_patch(MUTANTS / f"{mutant}.patch", tree) is None
    spec = importlib.util.spec_from_file_location(name, tree / rel)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module, tree / rel


def _row(report, name="no_event_sync") -> pd.Series:
    return report.verdicts.set_index("id").loc[name]


def _trainer(**over) -> Trainer:
    trainer = Trainer(preset("cartpole", **{**SMALL, **over}))
    trainer.run_epoch(1)
    return trainer


def test_the_readbacks_own_queries_are_allowed(fake_queries, monkeypatch):
    """One query per publication, in readback_publish: counted, placed, allowed; the sync row stays "not
    applicable (no CUDA)" on the CPU, as with no query at all."""
    made = with_readback(monkeypatch)
    trainer = _trainer()
    report = guard_loop(trainer, steps=8, warmup=0)
    q = report.queries
    assert len(q) == 2 and set(q["phase"]) == {"readback_publish"} and not q["polling"].any()
    readback = inspect.getsourcefile(AsyncReadback)
    assert all(site.startswith(f"{readback}:") for site in q["site"]) and set(q["api"]) == {"torch.cuda.Event.query"}
    row = _row(report)
    assert (row["verdict"], row["status"]) == ("-", "not applicable (no CUDA)")
    assert list(report.per_step["completion_query_hook_hits"]) == [0, 0, 0, 1, 0, 0, 0, 1]  # learner steps 16, 20
    assert report.per_step["polling_query_hook_hits"].sum() == 0
    summary = report.window["queries"]
    assert (summary["hook"], summary["allowed"], summary["polling_hook"]) == (2, 2, 0)
    assert summary["allowance"] == {"readback_publish": READBACK_QUERIES_PER_PUBLISH} and summary["trace"] is None
    cov = report.coverage.set_index("phase")
    assert cov.loc["readback_publish", "query_hook_hits"] == 2 and cov.loc["update", "query_hook_hits"] == 0
    assert "completion_query_hook_hits" not in report.medians and "query_wait_us" not in report.medians
    assert len(made) == 1 and made[0]._published >= 2


def test_the_readback_spin_mutant_fails_no_event_sync_naming_its_line(fake_queries, monkeypatch, tmp_path):
    """ci/mutants/readback_spin_until_copied.patch: publish spins on event.query() until the copy lands. Each
    publication then makes 1 + lag + 1 queries: the first (the buffer it writes, `_completed`) is the allowance,
    the spin's are polling."""
    module, path = load_patched("readback_spin_until_copied", "trainer/readback.py", tmp_path, "readback_spin")
    with_readback(monkeypatch, module.AsyncReadback)
    trainer = _trainer()
    report = guard_loop(trainer, steps=8, warmup=0)
    row = _row(report)
    spin = FakeEvent.lag + 1
    assert (row["verdict"], row["measured"], row["source"], row["worst_step"]) == ("FAIL", spin, "hook", "3")
    assert row["total"] == 2 * spin
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "while not event.query()" in text)
    assert (
        f"hook: torch.cuda.Event.query at {path}:{line} in readback_publish x{2 * spin} polling, "
        f"{2 * FakeEvent.lag} not ready" in row["evidence"]
    ), row["evidence"]
    assert " in readback_publish x2 allowed" in row["evidence"]
    assert list(report.per_step["polling_query_hook_hits"]) == [0, 0, 0, spin, 0, 0, 0, spin]
    assert report.per_step["query_wait_us"].gt(0).sum() >= 2 and report.window["queries"]["polling_hook"] == 2 * spin


def test_a_stream_spin_in_the_progress_callback_fails_with_its_call_site(fake_queries, monkeypatch):
    stream = FakeStream()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)

    def spin(done, total):
        stream.busy()
        while not torch.cuda.current_stream().query():
            pass

    site = f"{__file__}:{inspect.getsourcelines(spin)[1] + 2}"
    trainer = Trainer(preset("cartpole", **SMALL), on_progress=spin)  # progress every max(1, 12 // 100) = 1 step
    trainer.run_epoch(1)
    report = guard_loop(trainer, steps=4, warmup=0)
    row = _row(report)
    per = FakeStream.lag + 1
    assert (row["verdict"], row["measured"], row["total"], row["source"]) == ("FAIL", per, 4 * per, "hook")
    assert (
        f"hook: torch.cuda.Stream.query at {site} in progress x{4 * per} polling, {4 * FakeStream.lag} not "
        f"ready" in row["evidence"]
    ), row["evidence"]
    assert report.coverage.set_index("phase").loc["progress", "query_hook_hits"] == 4 * per


def test_a_single_query_outside_every_phase_is_polling(fake_queries, monkeypatch):
    """The allowance is per run of its phase: a query in no phase range (loop code of the step) is polling even
    when it finds the work done at once."""
    event = FakeEvent()
    step = Trainer.train_step

    def train_step(self):
        out = step(self)
        event.query()  # answers True: nothing to wait for, but no query belongs here
        return out

    monkeypatch.setattr(Trainer, "train_step", train_step)
    report = guard_loop(_trainer(), steps=3, warmup=0)
    row = _row(report)
    assert (row["verdict"], row["measured"], row["total"]) == ("FAIL", 1, 3)
    assert "x3 polling, 0 not ready" in row["evidence"] and "allowed 0" in row["evidence"]


def test_the_trace_side_fails_no_event_sync_on_polling_queries():
    """On CUDA the trace's cudaEventQuery / cudaStreamQuery calls are judged too (test_step_metrics.polling_trace:
    a spin of 3 beyond the readback's own query in step 1, a stream query in "progress" in step 2, one between
    the steps), and a window without them passes."""
    from test_step_metrics import learner_trace, polling_trace

    from hotloop.guards.guard import evaluate
    from hotloop.guards.step_metrics import step_metrics
    from hotloop.guards.sync_hooks import SyncHooks

    periods = {"readback_publish": 2}
    table = evaluate(step_metrics(polling_trace()), SyncHooks().frame(), True, periods=periods).set_index("id")
    row = table.loc["no_event_sync"]
    assert (row["verdict"], row["measured"], row["worst_step"], row["total"], row["source"]) == (
        "FAIL",
        3,
        "1",
        5,
        "trace",
    )
    assert "trace: cudaEventQuery in readback_publish x5 (polling x3)" in row["evidence"]
    assert (
        "completion queries 7 (trace) / 0 (hooks), allowed 2 (1 per readback_publish x 2 runs, every 2 steps), "
        "polling 5 / 0; host time in queries 1.167 us per step (trace)" in row["evidence"]
    ), row["evidence"]
    assert table.loc["no_stream_sync", "verdict"] == "PASS"  # a query is no sync: only the polling ones count
    clean = evaluate(step_metrics(learner_trace()), SyncHooks().frame(), True).set_index("id")
    assert (
        clean.loc["no_event_sync", "verdict"] == "PASS"
        and "completion queries" not in clean.loc["no_event_sync", "evidence"]
    )


@pytest.mark.gpu
def test_a_real_event_spin_is_seen_by_the_hooks_and_the_trace():
    """On a GPU: a spin on a real event's query() after a matmul is one cudaEventQuery per hooked call; both sides
    count it, and "no_event_sync" FAILs with source "both" (no sync call anywhere)."""
    from torch.profiler import record_function

    from hotloop.guards.guard import guard_steps

    x = torch.randn(2048, 2048, device="cuda")

    def step():
        with record_function("work"):
            y = x @ x
        done = torch.cuda.Event()
        done.record()
        while not done.query():
            pass
        return y

    report = guard_steps(step, steps=3, warmup=1)
    row = _row(report)
    ps = report.per_step
    assert (row["verdict"], row["source"]) == ("FAIL", "both"), row
    assert ps["completion_query_hook_hits"].ge(1).all() and ps["event_sync_calls"].eq(0).all()
    assert (ps["completion_queries"] == ps["completion_query_hook_hits"]).all(), ps  # one runtime call per query
    assert (ps["polling_queries"] == ps["completion_queries"]).all() and ps["query_host_us"].gt(0).all()


@pytest.mark.gpu
def test_the_hotloop_learners_loop_makes_only_its_allowed_queries():
    """On a GPU, the real loop (hotloop learner, readback every 5 iterations): the window's completion queries, trace
    and hooks, are the readback's own, one per publication at most, and "no_event_sync" PASSes: no C++ query of the
    loop's thread (the caching allocator's stay inside torch ops) is taken for polling."""
    cfg = preset(
        "cartpole",
        device="cuda",
        learner="hotloop",
        epochs=1,
        learner_steps_per_epoch=40,
        learning_starts=256,
        batch_size=64,
        trunk_hidden=(32,),
        head_hidden=16,
        eval_episodes=0,
        replay_capacity=4096,
        log_interval=5,
    )
    trainer = Trainer(cfg)
    trainer.run_epoch(1)
    report = guard_loop(trainer, steps=20, warmup=3)
    row = _row(report)
    summary = report.window["queries"]
    assert row["verdict"] == "PASS", row["evidence"]
    assert summary["polling_trace"] == summary["polling_hook"] == 0 and summary["allowed"] == 4, summary
    assert summary["trace"] == summary["hook"] <= 4, summary

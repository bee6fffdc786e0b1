"""guards/loop_syncs.py: the census of the loop's host syncs over the epochs after the first, and the gate row it fills.

On the CPU no tensor syncs with a device, so the tests that count hits make the hooks count CPU tensors too
(`sync_hooks.is_device_sync` patched) and raise the sync debug warning's text themselves; the faults sit in the
training loop's source path (Trainer.train_step, run by run_training's epochs). The mutants
ci/mutants/loop_nan_check_every_250, loop_mask_index_every_500 and loop_pageable_copy_every_300 are the same faults
on a GPU.
"""

from __future__ import annotations

import types
import warnings
from collections import Counter

import pandas as pd
import pytest
import torch
from test_guard_polling import FakeEvent, FakeStream, fake_queries, load_patched, with_readback  # noqa: F401

from hotloop.guards import sync_hooks
from hotloop.guards.criteria import CRITERIA, verdict_table
from hotloop.guards.gate import LOOP_CENSUS_OFF, judge_loop_syncs
from hotloop.guards.loop_syncs import SYNC_WARNING, LoopSyncCensus, period_text
from hotloop.guards.run import run_training
from hotloop.profiles import ranges
from hotloop.trainer import loop as loop_module
from hotloop.trainer.config import preset
from hotloop.trainer.episodes import EpisodeReturns
from hotloop.trainer.loop import Trainer

TINY = dict(
    device="cpu",
    num_envs=8,
    epochs=3,
    learner_steps_per_epoch=12,
    learning_starts=64,
    batch_size=16,
    trunk_hidden=(16,),
    head_hidden=8,
    eval_episodes=2,
    spectral_norm=False,
)


@pytest.fixture
def cpu_tensors_sync(monkeypatch):
    """The hooks count read-backs of CPU tensors as if they were CUDA ones."""
    monkeypatch.setattr(sync_hooks, "is_device_sync", lambda t: isinstance(t, torch.Tensor))


def _read_back(t: torch.Tensor) -> float:
    return t.sum().item()


def _by_kind(census: LoopSyncCensus) -> dict[str, int]:
    """The census's counts summed per kind (the api, or "sync debug warning"), over all its call sites."""
    kinds = Counter()
    for site, n in census.sites.items():
        kinds[site.split(" at ")[0]] += n
    return dict(kinds)


def _past_first(census: LoopSyncCensus, first: int = 1) -> LoopSyncCensus:
    """The census after the run's first epoch (`first`), which it never watches."""
    census.begin(first)
    census.end()
    return census


def test_counts_only_epochs_after_the_first_and_only_while_open(cpu_tensors_sync):
    census = LoopSyncCensus(cuda=True, loop=loop_module)
    t = torch.randn(5)
    census.begin(1)  # the first epoch compiles and captures: not watched
    _read_back(t)
    census.end()
    census.begin(2)
    for _ in range(3):
        _read_back(t)
    census.end()
    census.end()  # idempotent
    _read_back(t)  # after the epoch's loop: not counted
    assert census.epochs == [2] and census.total == 3
    measured, text = census.verdict()
    ((site, n),) = census.sites.items()
    assert measured == 3 and n == 3 and site.startswith("torch.Tensor.item at ") and __file__ in site
    assert text.startswith("in the loop of epoch 2: ") and "x3" in text
    assert torch.Tensor.item is not None and "hooked" not in repr(torch.Tensor.item)  # the hooks are gone


def test_sync_debug_warnings_are_counted_once_and_other_warnings_pass(cpu_tensors_sync, monkeypatch):
    """A warning outside any hooked call is a C++ sync of its own (counted at the line that made it); one raised
    inside a hooked call is that call's (counted once); any other warning reaches the caller's filters."""

    def tolist_that_syncs(self):  # stands in for torch's C++ read-back, which warns in sync debug mode
        warnings.warn(SYNC_WARNING, UserWarning)
        return []

    monkeypatch.setattr(torch.Tensor, "tolist", tolist_that_syncs)
    census = _past_first(LoopSyncCensus(cuda=True, loop=loop_module), first=2)
    census.begin(3)
    warnings.warn(SYNC_WARNING, UserWarning)  # an implicit sync (nonzero, a mask index, ...)
    torch.ones(2).tolist()
    with pytest.warns(RuntimeWarning, match="unrelated"):
        warnings.warn("unrelated", RuntimeWarning)
    census.end()
    kinds = _by_kind(census)
    assert kinds == {"sync debug warning": 1, "torch.Tensor.tolist": 1}, census.sites
    assert all(__file__ in site for site in census.sites)


def test_a_sync_warning_inside_a_hooked_call_that_is_no_sync_is_counted(monkeypatch):
    """A hooked API whose call is no sync by its rule (here a blocking copy_, whose C++ sync only warns) leaves the
    warning to count as the C++ sync it is: only a call the hooks recorded owns the warnings raised inside it."""
    original = torch.Tensor.copy_

    def copy_that_syncs(self, src, non_blocking=False):  # stands in for a blocking device copy's debug warning
        warnings.warn(SYNC_WARNING, UserWarning)
        return original(self, src, non_blocking)

    monkeypatch.setattr(torch.Tensor, "copy_", copy_that_syncs)
    census = _past_first(LoopSyncCensus(cuda=True, loop=loop_module))
    census.begin(2)
    torch.zeros(2).copy_(torch.ones(2))
    census.end()
    ((site, n),) = census.sites.items()
    assert site.startswith("sync debug warning at ") and __file__ in site and n == 1, census.sites


def test_not_measured_without_cuda_or_a_second_epoch():
    census = LoopSyncCensus(cuda=False, loop=loop_module)
    census.begin(2)
    census.end()
    assert census.verdict() == (None, "not applicable (no CUDA)") and census.epochs == []  # no device to sync with
    one = LoopSyncCensus(cuda=True, loop=loop_module)
    one.begin(1)
    one.end()
    measured, text = one.verdict()
    assert measured is None and text.startswith("not measured (no epoch after the first")


def test_a_resumed_runs_first_epoch_is_skipped_whatever_its_number(cpu_tensors_sync):
    census = LoopSyncCensus(cuda=True, loop=loop_module)
    census.begin(5)  # a resumed run captures its graphs again in its first epoch
    _read_back(torch.ones(1))
    census.end()
    census.begin(6)
    _read_back(torch.ones(1))
    census.end()
    assert (census.skipped, census.epochs, census.total) == (5, [6], 1)


def test_begin_twice_raises(cpu_tensors_sync):
    census = _past_first(LoopSyncCensus(cuda=True, loop=loop_module))
    census.begin(2)
    try:
        with pytest.raises(RuntimeError, match="already open"):
            census.begin(3)
    finally:
        census.end()


def test_a_periodic_read_back_in_the_loop_is_counted_over_the_run(monkeypatch, tmp_path):
    """The fault in the loop: every 5th train_step reads a value back (as a NaN check would). run_training's epochs
    2 and 3 (12 iterations each) hold 2 + 3 of them (calls 15, 20 / 25, 30, 35 of 36); epoch 1's (5, 10) are not
    counted, nor the epoch's own read in its readback phase (EpisodeReturns.mean). Only the tensors these two
    read count as device tensors here (the CPU loop's other read-backs wait for no device)."""

    def marked() -> torch.Tensor:
        t = torch.zeros(1)
        t.counts_as_device = True
        return t

    monkeypatch.setattr(sync_hooks, "is_device_sync", lambda t: getattr(t, "counts_as_device", False))
    calls = {"n": 0}
    train_step, mean = Trainer.train_step, EpisodeReturns.mean

    def faulty_train_step(self):
        out = train_step(self)
        calls["n"] += 1
        if calls["n"] % 5 == 0:
            marked().item()  # the fault
        return out

    def mean_with_its_read(self):
        marked().item()  # the epoch's one host read: allowed
        return mean(self)

    monkeypatch.setattr(Trainer, "train_step", faulty_train_step)
    monkeypatch.setattr(EpisodeReturns, "mean", mean_with_its_read)
    census = LoopSyncCensus(cuda=True, loop=loop_module)
    run_training(preset("cartpole", **TINY), tmp_path, epoch_limit_s=120, show_progress=False, loop_census=census)
    assert census.epochs == [2, 3] and calls["n"] == 36
    ((site, n),) = census.sites.items()
    assert n == 5 and site.startswith("torch.Tensor.item at ") and __file__ in site, census.sites


def test_the_gate_row_takes_the_census_verdict(cpu_tensors_sync):
    def row_after(census: LoopSyncCensus | None) -> pd.Series:
        v = verdict_table({})
        v["source"], v["evidence"] = "", ""
        judge_loop_syncs(v, census)
        return v.set_index("id").loc["no_loop_sync"]

    found, clean = (
        _past_first(LoopSyncCensus(cuda=True, loop=loop_module)),
        _past_first(LoopSyncCensus(cuda=True, loop=loop_module)),
    )
    found.begin(2)
    _read_back(torch.ones(1))
    found.end()
    clean.begin(2)
    clean.end()
    row = row_after(found)
    assert (row.verdict, row.measured, row.source) == ("FAIL", 1, "census") and "x1" in row.evidence, row
    row = row_after(clean)
    assert (row.verdict, row.measured, row.evidence) == ("PASS", 0, "none in the loop of epoch 2"), row
    row = row_after(LoopSyncCensus(cuda=False, loop=loop_module))
    assert (row.verdict, row.status) == ("-", "not applicable (no CUDA)"), row
    row = row_after(None)  # the gate with --no-loop-census
    assert (row.verdict, row.status) == ("-", LOOP_CENSUS_OFF), row
    assert "no_loop_sync" in {c.id for c in CRITERIA}


@pytest.mark.gpu
def test_real_cuda_syncs_are_counted_by_their_hook_and_by_the_sync_debug_warning():
    """On a GPU: an .item() is counted once (its hook; its C++ warning is the same call's), a boolean-mask index (an
    implicit nonzero that no Python hook sees) by torch's sync debug warning; the debug mode is restored after."""
    before = torch.cuda.get_sync_debug_mode()
    census = _past_first(LoopSyncCensus(cuda=True, loop=loop_module))
    x = torch.randn(64, device="cuda")
    census.begin(2)
    x.sum().item()
    positive = x[x > 0]
    census.end()
    kinds = _by_kind(census)
    assert kinds == {"torch.Tensor.item": 1, "sync debug warning": 1}, census.sites
    assert all(__file__ in site for site in census.sites) and positive.numel() > 0
    assert torch.cuda.get_sync_debug_mode() == before


@pytest.mark.gpu
def test_real_pageable_non_blocking_copies_are_counted_and_pinned_ones_are_not():
    """On a GPU: non_blocking copies with pageable host memory (copy_ to the host, .to / .cuda from it) are counted
    by their hooks; into pinned memory, or a non_blocking .to(cpu) (torch pins its output), they are not."""
    x = torch.randn(1024, device="cuda")
    pageable, pinned = torch.empty(1024), torch.empty(1024, pin_memory=True)
    census = _past_first(LoopSyncCensus(cuda=True, loop=loop_module))
    census.begin(2)
    pageable.copy_(x, non_blocking=True)
    on_device = pageable.to("cuda", non_blocking=True)
    on_device2 = pageable.cuda(non_blocking=True)
    pinned.copy_(x, non_blocking=True)
    x.to("cpu", non_blocking=True)
    census.end()
    torch.cuda.synchronize()
    kinds = _by_kind(census)
    assert kinds == {"torch.Tensor.copy_": 1, "torch.Tensor.to": 1, "torch.Tensor.cuda": 1}, census.sites
    assert all(__file__ in site for site in census.sites)
    assert torch.equal(on_device, x) and torch.equal(on_device2, x) and torch.equal(pinned.cuda(), x)


# ------------------------------------------------------------------------------------------ polling waits (queries)
# The census counts the hooked completion queries per loop iteration and phase; beyond the allowance (the readback's
# one query per readback_publish) they are polling waits, counted in the row with their call site and period. The
# fakes (FakeEvent / FakeStream, the stubbed query APIs, the readback in the reference loop, the patched copies of
# ci/mutants/*.patch) are test_guard_polling.py's.

LONG = {**TINY, "epochs": 2, "learner_steps_per_epoch": 600, "eval_episodes": 0, "log_interval": 100}


def test_period_text_names_the_gap_and_the_iterations():
    assert (
        period_text({2: [300, 600, 900], 3: [300, 600, 900]})
        == "every 300 iterations (iterations 300, 600, 900 of epochs 2-3)"
    )
    assert period_text({2: [5, 6, 7]}) == "every iteration (iterations 5, 6, 7 of epoch 2)"
    assert period_text({2: [40], 3: [40]}) == "once per epoch (iteration 40 of epochs 2-3)"
    assert (
        period_text({2: [3, 8], 3: [1, 6, 11]})
        == "every 5 iterations (epoch 2: iterations 3, 8; epoch 3: iterations 1, 6, 11)"
    )
    assert period_text({2: [1, 2, 9]}) == "irregular (iterations 1, 2, 9 of epoch 2)"
    assert period_text({}) == ""


@pytest.mark.usefixtures("fake_queries")
def test_the_readbacks_own_queries_pass_the_census(monkeypatch, tmp_path):
    """The readback queries one event per publication (every log_interval = 100 of 600 iterations): allowed."""
    made = with_readback(monkeypatch)
    census = LoopSyncCensus(cuda=True, loop=loop_module)
    run_training(preset("cartpole", **LONG), tmp_path, epoch_limit_s=120, show_progress=False, loop_census=census)
    measured, text = census.verdict()
    assert census.epochs == [2] and census.queries == census.allowed == 6
    assert made[0]._published + made[0].dropped == 12  # a publication in flight is dropped, never waited for
    assert (measured, text) == (
        0,
        "none in the loop of epoch 2 (completion queries 6, 6 allowed: 1 per readback_publish)",
    )
    assert loop_module.phase_range is ranges.phase_range  # the census's tracker is gone after the run


@pytest.mark.usefixtures("fake_queries")
def test_the_loop_spin_mutant_fails_the_census_with_its_period(monkeypatch, tmp_path):
    """ci/mutants/loop_stream_spin_every_300.patch: Trainer.iterate spins on the current stream every 300
    iterations, never inside the guarded window's first 100; the census names its line and period. The patched
    iterate runs in the real loop module's namespace (its ranges are the ones the census tracks)."""
    module, path = load_patched("loop_stream_spin_every_300", "trainer/loop.py", tmp_path, "loop_spin")
    patched = module.Trainer.iterate
    monkeypatch.setattr(
        Trainer,
        "iterate",
        types.FunctionType(patched.__code__, vars(loop_module), "iterate", patched.__defaults__, patched.__closure__),
    )
    stream, step = FakeStream(), Trainer.train_step

    def busy_step(self):  # the GPU has work queued after each iteration's launches
        stream.busy()
        return step(self)

    monkeypatch.setattr(Trainer, "train_step", busy_step)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    with_readback(monkeypatch)
    census = LoopSyncCensus(cuda=True, loop=loop_module)
    (tmp_path / "run").mkdir()
    run_training(
        preset("cartpole", **LONG), tmp_path / "run", epoch_limit_s=120, show_progress=False, loop_census=census
    )
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "current_stream(self.device).query" in t)
    spin = 2 * (FakeStream.lag + 1)  # iterations 300 and 600 of epoch 2, lag + 1 queries each
    measured, text = census.verdict()
    assert (measured, census.queries, census.allowed) == (spin, spin + 6, 6)
    assert text.startswith(
        f"in the loop of epoch 2: polling: torch.cuda.Stream.query at {path}:{line} x{spin}, "
        f"every 300 iterations (iterations 300, 600 of epoch 2) (completion queries {spin + 6}, "
        f"6 allowed: 1 per readback_publish; {spin} polling, "
    ), text
    assert census.poll_wait_s > 0


@pytest.mark.usefixtures("fake_queries")
def test_the_progress_spin_mutant_fails_the_census_in_the_progress_phase(monkeypatch, tmp_path):
    """ci/mutants/progress_event_spin_every_200.patch: the CLI's progress callback records an event and spins on it
    every 200 iterations (guards/run.py). Its run_training runs here from the patched copy, with a stand-in for the
    torch its lines call (CUDA "available", torch.cuda.Event a FakeEvent)."""
    module, path = load_patched("progress_event_spin_every_200", "guards/run.py", tmp_path, "run_spin")
    module.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: True, Event=FakeEvent))
    census = LoopSyncCensus(cuda=True, loop=loop_module)
    (tmp_path / "run").mkdir()
    module.run_training(
        preset("cartpole", **{**LONG, "learner_steps_per_epoch": 400}),
        tmp_path / "run",
        epoch_limit_s=120,
        show_progress=False,
        loop_census=census,
    )
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "while not finished.query()" in t)
    spin = 2 * (FakeEvent.lag + 1)
    measured, text = census.verdict()
    assert measured == spin and census.allowed == 0
    assert text.startswith(
        f"in the loop of epoch 2: polling: torch.cuda.Event.query at {path}:{line} in progress "
        f"x{spin}, every 200 iterations (iterations 200, 400 of epoch 2)"
    ), text


@pytest.mark.usefixtures("fake_queries")
def test_a_query_outside_every_iteration_is_polling():
    census = _past_first(LoopSyncCensus(cuda=True, loop=loop_module))
    census.begin(2)
    FakeEvent().query()
    census.end()
    measured, text = census.verdict()
    ((key, n),) = census.polls.items()
    assert measured == 1 and n == 1 and key == f"torch.cuda.Event.query at {__file__}:{_line_of('FakeEvent().query()')}"
    assert census.sites == Counter() and "polling: " in text


def _line_of(snippet: str) -> int:
    import inspect

    return next(
        i
        for i, t in enumerate(inspect.getsource(inspect.getmodule(_line_of)).splitlines(), 1)
        if snippet in t and "_line_of" not in t
    )

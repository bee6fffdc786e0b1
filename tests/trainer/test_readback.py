"""Unit tests of `hotloop.trainer.readback.AsyncReadback` (CPU, with a fake event for the in-flight paths; one GPU test)."""

from __future__ import annotations

import time

import pytest
import torch

from hotloop.trainer.readback import AsyncReadback, Reading

NAMES = ("loss", "q_mean", "grad_norm", "lr")


class FakeEvent:
    """Stands in for torch.cuda.Event: query() returns `done`; synchronize() raises unless `allow_sync`."""

    def __init__(self) -> None:
        self.done = False
        self.allow_sync = False
        self.queries = 0
        self.recorded = False

    def record(self, stream=None) -> None:
        self.recorded = True

    def query(self) -> bool:
        self.queries += 1
        return self.done

    def synchronize(self) -> None:
        if not self.allow_sync:
            raise AssertionError("FakeEvent.synchronize called: a blocking wait")
        self.done = True


class FakeEvents:
    """Event factory that keeps every event it made, in order."""

    def __init__(self) -> None:
        self.made: list[FakeEvent] = []

    def __call__(self) -> FakeEvent:
        self.made.append(FakeEvent())
        return self.made[-1]


def _sources(base: float) -> list[torch.Tensor]:
    """Four float32 values base+1..base+4 split over a 0-dim, a (2,) and a (1, 1) tensor."""
    return [torch.tensor(base + 1.0), torch.tensor([base + 2.0, base + 3.0]), torch.tensor([[base + 4.0]])]


def _expected(base: float) -> dict[str, float]:
    return {name: base + 1.0 + i for i, name in enumerate(NAMES)}


@pytest.mark.smoke
def test_values_and_step_round_trip():
    rb = AsyncReadback(NAMES, torch.device("cpu"))
    assert rb.poll() is None and rb.latest is None
    assert rb.publish(_sources(10.0), step=7) is True
    reading = rb.poll()
    assert reading == Reading(7, _expected(10.0))
    assert list(reading.values) == list(NAMES)
    assert all(type(v) is float for v in reading.values.values())
    assert rb.latest == reading
    assert rb.poll() is None and rb.latest == reading  # nothing new: None, latest kept
    assert rb.dropped == 0


def test_values_are_float32_rounded_and_source_unchanged():
    rb = AsyncReadback(["x"], "cpu")
    src = torch.tensor([0.1])
    rb.publish([src], step=0)
    assert rb.poll().values["x"] == float(torch.tensor(0.1, dtype=torch.float32))
    assert src.item() == pytest.approx(0.1)


def test_two_publications_before_poll_gives_newest():
    rb = AsyncReadback(NAMES, "cpu")
    assert rb.publish(_sources(0.0), step=1)
    assert rb.publish(_sources(100.0), step=2)
    assert rb.poll() == Reading(2, _expected(100.0))
    assert rb.poll() is None  # the older one is never returned after the newer
    assert rb.publish(_sources(200.0), step=3)
    assert rb.poll() == Reading(3, _expected(200.0))


def test_many_publications_alternate_buffers():
    rb = AsyncReadback(NAMES, "cpu")
    for step in range(11):
        assert rb.publish(_sources(float(step)), step)
        if step % 3 == 0:
            assert rb.poll() == Reading(step, _expected(float(step)))
    assert rb.poll() == Reading(10, _expected(10.0))


def test_in_flight_buffer_is_not_overwritten():
    events = FakeEvents()
    rb = AsyncReadback(NAMES, "cpu", event_factory=events)
    assert rb.publish(_sources(0.0), step=1) and rb.publish(_sources(100.0), step=2)
    assert [e.recorded for e in events.made] == [True, True]
    assert rb.poll() is None  # both in flight
    assert rb.publish(_sources(200.0), step=3) is False  # buffer of step 1 still in flight
    assert rb.dropped == 1 and len(events.made) == 2
    assert rb.poll() is None
    events.made[0].done = True  # step 1's copy lands, step 2's not yet
    assert rb.poll() == Reading(1, _expected(0.0))
    assert rb.poll() is None
    events.made[1].done = True
    assert rb.poll() == Reading(2, _expected(100.0))  # not the refused step 3's values
    assert rb.publish(_sources(300.0), step=4) is True and rb.dropped == 1
    events.made[2].done = True
    assert rb.poll() == Reading(4, _expected(300.0))


def test_newest_completed_wins_over_older_in_flight():
    events = FakeEvents()
    rb = AsyncReadback(NAMES, "cpu", event_factory=events)
    rb.publish(_sources(0.0), step=1)
    rb.publish(_sources(100.0), step=2)
    events.made[1].done = True  # e.g. different streams: the newer one lands first
    assert rb.poll() == Reading(2, _expected(100.0))
    events.made[0].done = True
    assert rb.poll() is None  # older than one already returned


def test_reading_is_consistent_one_publication():
    """Every Reading's values all come from the publication of its step (base = 10 * step), never mixed."""
    events = FakeEvents()
    rb = AsyncReadback(NAMES, "cpu", event_factory=events)
    readings = []
    for step in range(1, 40):
        rb.publish(_sources(10.0 * step), step)
        if step % 3 == 0:  # complete some of the copies, at varying lags
            for e in events.made[:-1]:
                e.done = True
        if (r := rb.poll()) is not None:
            readings.append(r)
    for e in events.made:
        e.done = True
    readings.append(rb.poll())
    assert rb.dropped > 0 and len(readings) > 5
    for r in readings:
        assert r.values == _expected(10.0 * r.step)
    steps = [r.step for r in readings]
    assert steps == sorted(set(steps))  # strictly newer each time


def test_poll_never_blocks(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("blocking call in the non-blocking path")

    monkeypatch.setattr(torch.cuda, "synchronize", boom)
    monkeypatch.setattr(torch.cuda.Event, "synchronize", boom)
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", boom)
    events = FakeEvents()  # FakeEvent.synchronize raises too
    rb = AsyncReadback(NAMES, "cpu", event_factory=events)
    rb.publish(_sources(5.0), step=3)
    for _ in range(50):
        assert rb.poll() is None
    assert events.made[0].queries == 50
    events.made[0].done = True
    assert rb.poll() == Reading(3, _expected(5.0))


def test_wait_blocks_on_pending_then_polls():
    events = FakeEvents()
    rb = AsyncReadback(NAMES, "cpu", event_factory=events)
    rb.publish(_sources(0.0), step=1)
    rb.publish(_sources(100.0), step=2)
    for e in events.made:
        e.allow_sync = True
    assert rb.wait() == Reading(2, _expected(100.0))
    assert all(e.done for e in events.made)
    assert rb.wait() is None and rb.latest.step == 2


@pytest.mark.parametrize(
    "names, match",
    [
        ((), "at least one"),
        (("a", "b", "a"), "duplicates"),
        (("a", ""), "non-empty strings"),
        (("a", 3), "non-empty strings"),
    ],
)
def test_bad_names_raise(names, match):
    with pytest.raises(ValueError, match=match):
        AsyncReadback(names, "cpu")


def test_bad_device_raises():
    with pytest.raises(ValueError, match="cpu or cuda"):
        AsyncReadback(NAMES, "meta")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            AsyncReadback(NAMES, "cuda")


@pytest.mark.parametrize(
    "sources, match",
    [
        ([torch.ones(3)], "3 values in all, but there are 4 names"),
        ([torch.ones(2), torch.ones(3)], "5 values in all"),
        ([], "0 values in all"),
        ([torch.ones(4, dtype=torch.float64)], r"sources\[0\] must be float32"),
        ([torch.ones(2), torch.ones(2, dtype=torch.float16)], r"sources\[1\] must be float32"),
        ([torch.ones(2), [1.0, 2.0]], r"sources\[1\] must be a tensor"),
        (torch.ones(4), "sequence of tensors"),
        ([torch.ones(4, device="meta")], "must be on cpu"),
    ],
)
def test_bad_sources_raise(sources, match):
    rb = AsyncReadback(NAMES, "cpu")
    with pytest.raises(ValueError, match=match):
        rb.publish(sources, step=0)
    assert rb.poll() is None and rb.dropped == 0


@pytest.mark.parametrize("step", [1.0, "3", True, None])
def test_bad_step_raises(step):
    rb = AsyncReadback(NAMES, "cpu")
    with pytest.raises(ValueError, match="step must be a host int"):
        rb.publish(_sources(0.0), step=step)


def test_requires_grad_source_links_no_graph():
    rb = AsyncReadback(["w"], "cpu")
    w = torch.ones(1, requires_grad=True)
    assert rb.publish([w * 2], step=0)
    assert rb.poll().values == {"w": 2.0}
    assert not any(b.requires_grad for b in rb._buffers)


@pytest.mark.gpu
def test_poll_does_not_wait_for_slow_kernel_gpu():
    from hotloop.guards.sync_hooks import SyncHooks

    device = torch.device("cuda")
    rb = AsyncReadback(NAMES, device)
    assert all(b.is_pinned() for b in rb._buffers)
    sources = [s.to(device) for s in _sources(1000.0)]
    torch.cuda.synchronize()
    with SyncHooks() as hooks:
        torch.cuda._sleep(50_000_000)  # ~tens of ms of GPU spin before the copy
        start = time.perf_counter()
        assert rb.publish(sources, step=42)
        first = rb.poll()
        elapsed = time.perf_counter() - start
    assert first is None, "poll returned before the slow kernel and the copy could have finished"
    assert elapsed < 0.1
    assert hooks.hits == []
    assert rb.wait() == Reading(42, _expected(1000.0))


def test_hotloop_epoch_row_carries_the_published_head_norms():
    import math

    from hotloop.trainer.config import preset
    from hotloop.trainer.loop import Trainer

    # On CUDA when present, else the Triton interpreter on CPU: the tiniest sizes; a readback after every step.
    cfg = preset(
        "cartpole",
        learner="hotloop",
        spectral_norm=True,
        trunk_hidden=(16,),
        head_hidden=16,
        batch_size=16,
        learner_steps_per_epoch=3,
        learning_starts=32,
        num_envs=4,
        eval_episodes=0,
        replay_capacity=128,
        log_interval=1,
        device="cuda" if torch.cuda.is_available() else "cpu",
    )
    trainer = Trainer(cfg)
    row = trainer.run_epoch(1).as_row()
    assert "head_norms" not in row and {"head_norm_value", "head_norm_b0"} <= set(row)
    assert all(math.isfinite(row[k]) and row[k] > 0 for k in ("head_norm_value", "head_norm_b0"))
    trainer.readback.wait()  # test only: the newest publication, finished
    newest = trainer.readback.latest
    assert newest.step == trainer.learner.steps
    lay, params = trainer.learner.layout, trainer.learner.params
    gains = (lay.layers[-1].views(params)[2].double() * lay.out_views(params)[2].double()).tolist()
    norms = trainer.learner.head_norms(newest.values)
    assert [norms["head_norm_value"], norms["head_norm_b0"]] == pytest.approx(gains, rel=1e-6)
    if row["metrics_step"] == newest.step:  # always on the CPU (synchronous copies); on a GPU when it had landed
        assert [row["head_norm_value"], row["head_norm_b0"]] == pytest.approx(gains, rel=1e-6)

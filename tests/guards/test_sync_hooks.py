"""SyncHooks on CPU: the CUDA sync functions are replaced by monkeypatched stubs, a CUDA tensor by a Tensor
subclass whose is_cuda is True; every hooked attribute must be back after exit, also after an exception."""

import inspect

import pandas as pd
import pytest
import torch

from hotloop.guards.sync_hooks import (
    EVENT_SYNC,
    HIT_COLUMNS,
    HOOKED_APIS,
    QUERY_APIS,
    QUERY_HIT_COLUMNS,
    STREAM_SYNC,
    SyncHooks,
    counts_as_sync,
    is_device_sync,
    is_pageable_async_copy,
    spin_spans,
)

OWNERS = {
    "torch.cuda": torch.cuda,
    "torch.accelerator": torch.accelerator,
    "torch.cuda.Stream": torch.cuda.Stream,
    "torch.cuda.Event": torch.cuda.Event,
    "torch.Tensor": torch.Tensor,
}
MISSING = object()


class FakeCudaTensor(torch.Tensor):
    """A CPU tensor that says it is on CUDA: the hooks' tensor rule reads only `is_cuda`."""

    is_cuda = property(lambda self: True)


def fake_cuda(value=1.0):
    return torch.Tensor._make_subclass(FakeCudaTensor, torch.tensor(value))


def snapshot():
    """Each hooked attribute (syncs and completion queries) as its owner's own __dict__ holds it (MISSING when
    inherited)."""
    out = {}
    for api in (*HOOKED_APIS, *QUERY_APIS):
        owner, attr = api.rsplit(".", 1)
        out[api] = vars(OWNERS[owner]).get(attr, MISSING)
    return out


@pytest.fixture
def stubs(monkeypatch):
    """Stub torch.cuda.synchronize, torch.accelerator.synchronize, Stream.synchronize and Event.synchronize;
    returns the list of stub calls."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("device"))
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: calls.append("accelerator"))
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", lambda self: calls.append("stream"))
    monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda self: calls.append("event"))
    return calls


@pytest.mark.smoke
def test_sync_calls_are_recorded_with_call_site_and_step(stubs):
    before = snapshot()
    with SyncHooks() as hooks:
        hooks.step = 4
        line = inspect.currentframe().f_lineno + 1
        torch.cuda.synchronize()
        torch.cuda.Stream.synchronize(object())
        hooks.step = 5
        torch.cuda.Event.synchronize(object())
        torch.accelerator.synchronize()
    assert stubs == ["device", "stream", "event", "accelerator"]  # the originals still ran
    hits = hooks.frame()
    assert list(hits.columns) == list(HIT_COLUMNS)
    assert list(hits["api"]) == [
        "torch.cuda.synchronize",
        "torch.cuda.Stream.synchronize",
        "torch.cuda.Event.synchronize",
        "torch.accelerator.synchronize",
    ]
    assert list(hits["criterion"]) == [EVENT_SYNC, STREAM_SYNC, EVENT_SYNC, EVENT_SYNC]
    assert list(hits["step"]) == [4, 4, 5, 5]
    assert hits["site"].iloc[0] == f"{__file__}:{line}"
    assert set(hits["function"]) == {"test_sync_calls_are_recorded_with_call_site_and_step"}
    assert snapshot() == before
    torch.cuda.synchronize()
    assert len(hooks.hits) == 4  # nothing recorded after exit


def test_call_site_skips_torch_internals(stubs):
    def user_helper():
        torch.cuda.synchronize()  # the site is this line, not the caller's

    with SyncHooks() as hooks:
        user_helper()
    line = inspect.getsourcelines(user_helper)[1] + 1
    assert hooks.hits[0].site == f"{__file__}:{line}" and hooks.hits[0].function == "user_helper"


def test_cpu_tensor_read_backs_are_not_syncs():
    t = torch.arange(3.0)
    with SyncHooks() as hooks:
        t[0].item(), t.cpu(), t.tolist(), t.numpy(), bool(t[1])
    assert hooks.hits == []


def test_cuda_tensor_read_backs_count_once_each():
    t = fake_cuda(2.0)
    with SyncHooks() as hooks:
        assert t.item() == 2.0  # FakeCudaTensor's __torch_function__ re-enters the hook: still one hit
        t.cpu(), t.tolist(), t.numpy()
        if t:
            pass
    assert [h.api for h in hooks.hits] == [f"torch.Tensor.{m}" for m in ("item", "cpu", "tolist", "numpy", "__bool__")]
    assert {h.criterion for h in hooks.hits} == {STREAM_SYNC}
    assert all(h.site.startswith(__file__) for h in hooks.hits)


def test_non_blocking_copies_with_pageable_host_memory_are_event_syncs():
    """copy_ with non_blocking=True between a CUDA tensor and pageable host memory, either way, is recorded (the
    driver makes it synchronous); a blocking copy (torch's own sync, its debug warning) and a host-to-host one are
    not."""
    host, dev = torch.zeros(2), fake_cuda([1.0, 2.0])
    with SyncHooks() as hooks:
        line = inspect.currentframe().f_lineno + 1
        host.copy_(dev, non_blocking=True)
        dev.copy_(host, non_blocking=True)
        host.copy_(dev)
        host.copy_(torch.ones(2), non_blocking=True)
    assert [(h.api, h.criterion) for h in hooks.hits] == [("torch.Tensor.copy_", EVENT_SYNC)] * 2
    assert [h.site for h in hooks.hits] == [f"{__file__}:{line}", f"{__file__}:{line + 1}"]
    assert host.tolist() == [1.0, 1.0]  # the originals ran


def test_copy_rules_read_every_form_of_to_and_cuda():
    host, dev = torch.zeros(2), fake_cuda([1.0, 2.0])
    assert is_pageable_async_copy(host, dev, True) and is_pageable_async_copy(dev, host, True)
    assert not is_pageable_async_copy(host, dev, False) and not is_pageable_async_copy(host, host, True)
    assert not is_pageable_async_copy(dev, dev, True) and not is_pageable_async_copy(host, 3.0, True)
    to = "torch.Tensor.to"
    assert counts_as_sync(to, (host, "cuda"), {"non_blocking": True})
    assert counts_as_sync(to, (host, "cuda:1", torch.float16, True), {})
    assert counts_as_sync(to, (host,), {"device": 0, "non_blocking": True})
    assert counts_as_sync(to, (host, dev, True), {})  # to(other, non_blocking)
    assert not counts_as_sync(to, (host, "cuda"), {})  # blocking: torch's own sync warning
    assert not counts_as_sync(to, (dev, "cpu", True), {})  # to the host: torch pins the output
    assert not counts_as_sync(to, (host, torch.float64, True), {})  # no device at all
    assert not counts_as_sync(to, (host, "no-such-device", True), {})  # unreadable: the call raises its own error
    assert counts_as_sync("torch.Tensor.cuda", (host,), {"non_blocking": True})
    assert counts_as_sync("torch.Tensor.cuda", (host, 0, True), {})
    assert not counts_as_sync("torch.Tensor.cuda", (host,), {})
    assert not counts_as_sync("torch.Tensor.cuda", (dev, None, True), {})
    assert counts_as_sync("torch.cuda.synchronize", (), {})


def test_copy_rules_read_torchs_keyword_names_and_only_the_bool_true():
    """copy_'s source is the keyword `other` and to()'s tensor target `tensor` (torch's names); non_blocking counts
    only as the bool True, which is all torch accepts there; an empty copy copies nothing."""
    host, dev = torch.zeros(2), fake_cuda([1.0, 2.0])
    copy_, to, cuda = "torch.Tensor.copy_", "torch.Tensor.to", "torch.Tensor.cuda"
    assert counts_as_sync(copy_, (host,), {"other": dev, "non_blocking": True})
    assert counts_as_sync(to, (host,), {"tensor": dev, "non_blocking": True})
    for not_the_bool in (1, "yes", torch.tensor(True)):
        assert not counts_as_sync(copy_, (host, dev), {"non_blocking": not_the_bool})
        assert not counts_as_sync(copy_, (host, dev, not_the_bool), {})
        assert not counts_as_sync(cuda, (host,), {"non_blocking": not_the_bool})
    empty = torch.zeros(0)
    assert not counts_as_sync(copy_, (empty, fake_cuda([])), {"non_blocking": True})
    assert not counts_as_sync(cuda, (empty,), {"non_blocking": True})
    assert not counts_as_sync(to, (empty, "cuda", True), {})


def test_a_non_blocking_value_that_cannot_be_read_changes_nothing_in_the_call():
    """The rule never calls bool() on the argument (a CUDA tensor there would be a read-back of its own, an object
    whose __bool__ raises would raise from the hook): the call raises torch's own TypeError and nothing is hit."""

    class Unreadable:
        def __bool__(self):
            raise ZeroDivisionError("read")

    host, dev = torch.zeros(2), fake_cuda([1.0, 2.0])
    with SyncHooks() as hooks:
        for value in (Unreadable(), fake_cuda(1.0)):
            with pytest.raises(TypeError):
                host.copy_(dev, non_blocking=value)
    assert hooks.hits == []


def test_is_device_sync_rule():
    assert is_device_sync(fake_cuda())
    assert not is_device_sync(torch.ones(2))
    assert not is_device_sync(torch.empty(2, device="meta"))
    assert not is_device_sync(3.0) and not is_device_sync(None)


def test_everything_restored_after_an_exception(stubs):
    before = snapshot()
    assert before["torch.Tensor.item"] is MISSING  # inherited from TensorBase: must be deleted again, not set
    with pytest.raises(KeyError):
        with SyncHooks():
            assert snapshot() != before
            raise KeyError("boom")
    assert snapshot() == before
    assert torch.Tensor.item is torch._C.TensorBase.item


def test_sync_debug_mode_set_only_with_cuda_and_restored(monkeypatch, stubs):
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with SyncHooks():
        pass
    assert modes == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="inside"):
        with SyncHooks():
            assert modes == ["warn"]
            raise RuntimeError("inside")
    assert modes == ["warn", 2]


def test_failed_enter_restores_what_was_wrapped(monkeypatch, stubs):
    before = snapshot()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: (_ for _ in ()).throw(AssertionError("no CUDA")))
    with pytest.raises(AssertionError, match="no CUDA"):
        SyncHooks().__enter__()
    assert snapshot() == before


def test_reentering_an_active_hook_is_an_error(stubs):
    before, hooks = snapshot(), SyncHooks()
    with hooks:
        with pytest.raises(RuntimeError, match="already active"):
            hooks.__enter__()
    assert snapshot() == before


@pytest.fixture
def query_stubs(monkeypatch):
    """torch.cuda.Event.query / Stream.query stubs answering from a list (True = done), the list of answers."""
    answers = []
    monkeypatch.setattr(torch.cuda.Event, "query", lambda self: answers.pop(0))
    monkeypatch.setattr(torch.cuda.Stream, "query", lambda self: answers.pop(0))
    return answers


def test_completion_queries_are_recorded_apart_from_the_syncs(query_stubs, stubs):
    """A query is no sync: it goes to `queries` (never `hits`) with its call site, step, answer, timing and the
    phases a tracker set; the originals still answer; everything is restored after exit."""
    before = snapshot()
    query_stubs += [False, False, True, True]
    with SyncHooks() as hooks:
        hooks.step, hooks.phases = 7, ("readback_publish",)
        line = inspect.currentframe().f_lineno + 1
        while not torch.cuda.Event.query(object()):
            pass
        hooks.step, hooks.phases = None, ()
        assert torch.cuda.Stream.query(object()) is True
        torch.cuda.synchronize()
    assert hooks.hits and [h.api for h in hooks.hits] == ["torch.cuda.synchronize"]
    q = hooks.query_frame()
    assert list(q.columns) == list(QUERY_HIT_COLUMNS) and len(q) == 4
    assert list(q["api"]) == ["torch.cuda.Event.query"] * 3 + ["torch.cuda.Stream.query"]
    assert list(q["ready"]) == [False, False, True, True] and list(q["step"]) == [7, 7, 7, pd.NA]
    assert list(q["site"][:3]) == [f"{__file__}:{line}"] * 3
    assert list(q["phases"]) == [("readback_publish",)] * 3 + [()]
    assert q["dur_s"].ge(0).all() and q["start_s"].is_monotonic_increasing
    assert snapshot() == before
    query_stubs.append(True)
    torch.cuda.Event.query(object())
    assert len(hooks.queries) == 4  # nothing recorded after exit


def test_spin_spans_join_the_not_ready_queries_of_one_site_and_step():
    """A polling run: the queries of one thread at one site in one step, each but the last not ready; its span runs
    from the first one's start to the last one's end. A ready query, another site or another step starts anew."""
    rows = [  # site, step, ready, start_s, dur_s
        ("a:1", 0, False, 10.0, 1.0),
        ("a:1", 0, False, 12.0, 1.0),
        ("a:1", 0, True, 14.0, 1.0),  # 10 .. 15
        ("a:1", 0, True, 20.0, 0.5),  # alone
        ("b:2", 1, False, 30.0, 1.0),
        ("a:1", 1, True, 31.0, 1.0),  # another site
        ("a:1", 1, False, 40.0, 1.0),
        ("a:1", 2, True, 50.0, 1.0),  # another step
    ]
    q = pd.DataFrame(rows, columns=["site", "step", "ready", "start_s", "dur_s"]).assign(thread="MainThread")
    q["step"] = q["step"].astype("Int64")
    assert spin_spans(q).tolist() == [5.0, 0.0, 0.0, 0.5, 1.0, 1.0, 1.0, 1.0]

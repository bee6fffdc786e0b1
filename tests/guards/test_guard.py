"""guard_steps around user step functions on CPU (GPU rows "not measured (no CUDA)", the sync rows "not applicable
(no CUDA)" unless the hooks catch a sync), the module docstring's example run as written, and the verdicts on
synthetic learner traces: clean passes every measured row; each injected fault fails exactly the criterion it
breaks."""

import json
import textwrap

import pytest
import torch
from test_step_metrics import learner_trace

import hotloop.guards.guard as guard_module
from hotloop.guards.criteria import CRITERIA
from hotloop.guards.guard import NO_CUDA, NOT_APPLICABLE, VERDICT_COLUMNS, evaluate, guard_steps
from hotloop.guards.step_metrics import step_metrics
from hotloop.guards.sync_hooks import SyncHooks

GPU_ROWS = [
    "no_d2d_weight_sync",
    "spectral_norm_fused",
    "no_single_block_kernels",
    "memsets_only_where_needed",
    "tf32_forward_only",
    "ddqn_overlapped",
    "env_kernels_per_env_step",
]
NO_HITS = SyncHooks().frame()


def tiny_step():
    w = torch.ones(4, 4, requires_grad=True)
    (w @ w).sum().backward()
    return w.grad.sum().item()  # a CPU tensor read: no device sync


def test_docstring_example_runs_and_shows_the_verdict_table(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = guard_module.__doc__.split("test_guard.py)::\n")[1].split("\nOn a machine without CUDA")[0]
    scope = {}
    exec(compile(textwrap.dedent(code), "guard_docstring_example", "exec"), scope)
    report = scope["report"]
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split() == ["criterion", "id", "measured", "limit", "verdict", "status", "source"]
    doc = json.loads((tmp_path / "verdicts.json").read_text())
    assert [v["id"] for v in doc["verdicts"]] == [c.id for c in CRITERIA]
    assert len(doc["per_step"]) == 5 and doc["cuda"] is torch.cuda.is_available()
    if not torch.cuda.is_available():
        v = report.verdicts.set_index("id")
        assert list(v.loc[["no_stream_sync", "no_event_sync"], "verdict"]) == ["-", "-"]
        assert set(v.loc[["no_stream_sync", "no_event_sync"], "status"]) == {NOT_APPLICABLE}
        assert set(v.loc[GPU_ROWS, "status"]) == {NO_CUDA} and set(v.loc[GPU_ROWS, "verdict"]) == {"-"}
        assert report.failed == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only table")
def test_guard_steps_on_cpu_says_the_sync_rows_are_not_applicable():
    """Issue 41 item 9: a step calling .item() on CPU tensors is no verdict on syncs that cannot exist there: the
    sync rows say "not applicable (no CUDA)" (verdict "-"), where they said "0 PASS measured" before; the hooks
    still watch (test_guarded_step_calling_synchronize_fails_no_event_sync)."""
    report = guard_steps(tiny_step, steps=3, warmup=1)
    v = report.verdicts.set_index("id")
    assert list(report.verdicts.columns) == VERDICT_COLUMNS
    sync = v.loc[["no_stream_sync", "no_event_sync"]]
    assert list(sync["status"]) == [NOT_APPLICABLE] * 2 == ["not applicable (no CUDA)"] * 2
    assert list(sync["verdict"]) == ["-", "-"] and list(sync["measured"]) == ["", ""]
    assert list(sync["source"]) == ["", ""] and report.failed == []
    assert v.loc["no_hang", "status"].startswith("not measured here")
    assert list(report.per_step["range_name"]) == ["step"] * 3 and report.per_step["kernels"].eq(0).all()
    assert report.hits.empty and not report.cuda


def test_guarded_step_calling_synchronize_fails_no_event_sync(monkeypatch):
    """Mutation: a step that calls torch.cuda.synchronize() (stubbed on CPU) must fail, caught by the hook."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)

    def step():
        tiny_step()
        torch.cuda.synchronize()

    report = guard_steps(step, steps=3, warmup=1)
    assert report.failed == ["no_event_sync"]
    row = report.verdicts.set_index("id").loc["no_event_sync"]
    assert row["measured"] == 1 and row["source"] == "hook"
    assert f"hook: torch.cuda.synchronize at {__file__}:" in row["evidence"] and row["evidence"].endswith(" x3")
    assert list(report.per_step["event_sync_hook_hits"]) == [1, 1, 1]
    assert torch.cuda.synchronize.__name__ == "<lambda>"  # the stub is back, unwrapped


def test_guarded_step_reading_a_cuda_tensor_fails_no_stream_sync():
    """Mutation: `.item()` of a (fake) CUDA tensor in the loop fails "no_stream_sync" with its call site."""

    class FakeCudaTensor(torch.Tensor):
        is_cuda = property(lambda self: True)

    t = torch.Tensor._make_subclass(FakeCudaTensor, torch.tensor(1.0))
    report = guard_steps(lambda: t.item(), steps=2, warmup=0)
    assert report.failed == ["no_stream_sync"]
    assert list(report.hits["step"]) == [0, 1] and set(report.hits["api"]) == {"torch.Tensor.item"}


def test_guard_steps_errors(monkeypatch):
    with pytest.raises(ValueError, match="steps >= 1"):
        guard_steps(tiny_step, steps=0)

    def own_step_ranges():
        with torch.profiler.record_function("step"):
            tiny_step()

    with pytest.raises(RuntimeError, match="own 'step' ranges"):
        guard_steps(own_step_ranges, steps=2, warmup=0)
    before = torch.cuda.synchronize

    def raising():
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        guard_steps(raising, steps=2, warmup=0)
    assert torch.cuda.synchronize is before and "item" not in vars(torch.Tensor)


def test_clean_synthetic_learner_trace_passes_every_measured_row():
    verdicts = evaluate(step_metrics(learner_trace()), NO_HITS, cuda=True).set_index("id")
    measured = verdicts[verdicts["status"].eq("measured")]
    assert list(measured.index) == [c.id for c in CRITERIA if not c.measured_by and c.phases != "env"]  # no env
    assert set(measured["verdict"]) == {"PASS"}
    assert measured.loc["ddqn_overlapped", "measured"] == 0.75
    assert measured.loc["tf32_forward_only", "measured"] == "yes"
    assert list(measured.loc[["no_stream_sync", "memsets_only_where_needed"], "source"]) == ["both", "trace"]


@pytest.mark.parametrize(
    "fault, criterion",
    [
        ("stream sync", "no_stream_sync"),
        ("event sync", "no_event_sync"),
        ("device sync (driver)", "no_event_sync"),
        ("blocking cudaMemcpy", "no_event_sync"),
        ("pageable non_blocking copy", "no_event_sync"),
        ("D2D copy", "no_d2d_weight_sync"),
        ("D2D copy in a graph", "no_d2d_weight_sync"),
        ("spectral norm split", "spectral_norm_fused"),
        ("grid (1,1,1) kernel", "no_single_block_kernels"),
        ("memset", "memsets_only_where_needed"),
        ("forward FP32", "tf32_forward_only"),
        ("backward TF32", "tf32_forward_only"),
        ("DDQN serialized", "ddqn_overlapped"),
    ],
)
def test_each_injected_fault_fails_exactly_its_criterion(fault, criterion):
    verdicts = evaluate(step_metrics(learner_trace(fault=fault)), NO_HITS, cuda=True)
    failed = verdicts[verdicts["verdict"].eq("FAIL")]
    assert list(failed["id"]) == [criterion]
    assert failed["evidence"].iloc[0] != "" and failed["source"].iloc[0] == "trace"


def test_sync_seen_by_hook_and_trace_counts_once_with_source_both():
    hits = SyncHooks().frame()
    hits.loc[0] = [1, "torch.cuda.Stream.synchronize", "no_stream_sync", "user.py:7", "step", "MainThread"]
    hits = hits.astype({"step": "Int64"})
    verdicts = evaluate(step_metrics(learner_trace(fault="stream sync")), hits, cuda=True).set_index("id")
    row = verdicts.loc["no_stream_sync"]
    assert (row["measured"], row["verdict"], row["source"]) == (1, "FAIL", "both")
    assert row["evidence"] == ("hook: torch.cuda.Stream.synchronize at user.py:7 x1; trace: cudaStreamSynchronize x3")
    hook_only = evaluate(step_metrics(learner_trace()), hits, cuda=True).set_index("id")
    assert hook_only.loc["no_stream_sync", "source"] == "hook"


def test_missing_phases_are_not_measured_rather_than_passed():
    b = learner_trace()
    b = b[~b["kind"].eq("annotation")]  # a user's step without phase ranges
    verdicts = evaluate(step_metrics(b), NO_HITS, cuda=True).set_index("id")
    for name in ("spectral_norm_fused", "tf32_forward_only", "ddqn_overlapped"):
        assert verdicts.loc[name, "status"].startswith("not measured (") and verdicts.loc[name, "verdict"] == "-"
    assert verdicts.loc["no_single_block_kernels", "verdict"] == "PASS"

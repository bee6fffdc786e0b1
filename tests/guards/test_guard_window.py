"""The guarded window over a whole loop: verdicts on synthetic loop traces (a sync in a phase outside the learner,
between steps, a periodic phase missing from the window, a single-block kernel in the env's phase, the env's
kernels per env step, the actor graph's kernels), and the loop form of the guard (`guard_window`) on CPU loops,
with hook hits faked as tests/guards/test_sync_hooks.py does and placed in their step and phase by their trace
markers."""

from __future__ import annotations

import inspect
import textwrap

import pandas as pd
import pytest
import torch
from test_step_metrics import TF32_H200, TraceBuilder
from torch.profiler import record_function

import hotloop.guards.guard as guard_module
from hotloop.guards.criteria import CRITERIA, Criterion
from hotloop.guards.guard import default_window_steps, evaluate, guard_steps, guard_window
from hotloop.guards.step_metrics import OUTSIDE_LABEL, WINDOW_RANGE, PhaseRoles, kernel_phases, step_metrics
from hotloop.guards.sync_hooks import SyncHooks
from hotloop.trainer.loop import learner_phases
from hotloop.trainer.step import PHASE_RULES

HOT = learner_phases("hotloop")
HOT_ROLES = PhaseRoles(learner=HOT)
HOT_PERIODS = {"env_step": 1, "update": 1, "readback_publish": 100}
NO_HITS = SyncHooks().frame()
SYNC_ROWS = ["no_stream_sync", "no_event_sync"]


class FakeCudaTensor(torch.Tensor):
    """A CPU tensor that says it is on CUDA: the hooks' tensor rule reads only `is_cuda` (test_sync_hooks.py)."""

    is_cuda = property(lambda self: True)


def fake_cuda(value=1.0):
    return torch.Tensor._make_subclass(FakeCudaTensor, torch.tensor(value))


ACTOR_KERNELS = ("_actor_step_kernel", "_tree_insert_kernel", "_actor_commit_kernel")
"""The fused actor's launches per vectorized env step (each of >= 2 programs)."""


def loop_trace(
    steps=3,
    *,
    sync_in=None,
    between=False,
    readback_every=None,
    env_grid1=False,
    window=True,
    after_learner=False,
    env_kernels=None,
):
    """A synthetic hotloop loop: per step an env_step range launching the actor graph (a `_fwd_online_` kernel:
    the learner's name), an update range replaying the learner graph (kernels named by PHASE_RULES), and every
    `readback_every` steps a readback_publish range (a pinned DtoH copy). `sync_in`: a cudaStreamSynchronize
    inside that phase range every step; `between`: one after every step, outside it; `env_grid1`: a grid (1,1,1)
    kernel in env_step every step; `window`: the WINDOW_RANGE around it all; `after_learner`: a D2D copy and a
    one-element add after the update range, in no phase (how hotloop.guards.faults wraps the learner step);
    `env_kernels`: the env_step range launches that many kernels of grid (2,1,1) (the fused actor's names in
    turn, ACTOR_KERNELS) in place of the actor graph's one kernel."""
    b = TraceBuilder()

    def body():
        for k in range(steps):
            g = 1000.0 * (k + 1)
            with b.step():
                with b.step("env_step"):
                    if env_kernels is None:
                        b.gpu("_fwd_online_actor", g, 5, launch="cudaGraphLaunch")
                    for i in range(env_kernels or 0):
                        b.gpu(ACTOR_KERNELS[i % 3], g + i * 0.5, 0.25, grid=(2, 1, 1))
                    if env_grid1:
                        b.gpu("cartpole_reset", g + 6, 1, grid=(1, 1, 1))
                    if sync_in == "env_step":
                        b.call("cudaStreamSynchronize")
                with b.step("update"):
                    b.gpu("_fwd_online_layer0", g + 20, 20, launch="cudaGraphLaunch")
                    b.gpu("_bwd_layer0", g + 50, 20, launch="cudaGraphLaunch")
                    if sync_in == "update":
                        b.call("cudaStreamSynchronize")
                if after_learner:
                    b.gpu(
                        "Memcpy DtoD (Device -> Device)",
                        g + 75,
                        1,
                        "memcpy",
                        launch="cudaMemcpyAsync",
                        copy_kind="DtoD",
                    )
                    b.gpu("vectorized_elementwise_kernel<add>", g + 80, 1, grid=(1, 1, 1))
                if readback_every and (k + 1) % readback_every == 0:
                    with b.step("readback_publish"):
                        b.gpu(
                            "Memcpy DtoH (Device -> Pinned)",
                            g + 90,
                            1,
                            "memcpy",
                            launch="cudaMemcpyAsync",
                            copy_kind="DtoH",
                        )
                        if sync_in == "readback_publish":
                            b.call("cudaStreamSynchronize")
            if between:
                b.call("cudaStreamSynchronize")

    if window:
        with b.step(WINDOW_RANGE):
            body()
    else:
        body()
    return b.frame()


def verdicts(frame, hits=NO_HITS, periods=None, criteria=CRITERIA, roles=HOT_ROLES):
    m = step_metrics(frame, phases=PHASE_RULES, rule_phases=HOT, roles=roles)
    return evaluate(m, hits, cuda=True, roles=roles, periods=periods, criteria=criteria).set_index("id")


def test_a_stream_sync_in_env_step_fails_no_stream_sync_naming_the_phase():
    clean = verdicts(loop_trace())
    assert clean.loc["no_stream_sync", "verdict"] == "PASS"
    v = verdicts(loop_trace(sync_in="env_step"))
    row = v.loc["no_stream_sync"]
    assert (row["verdict"], row["measured"], row["worst_step"], row["total"]) == ("FAIL", 1, "0", 3)
    assert row["evidence"] == "trace: cudaStreamSynchronize in env_step x3" and row["source"] == "trace"
    assert row["phases"] == "every phase + outside steps"
    assert v.loc["no_single_block_kernels", "verdict"] == "PASS"  # the env's kernels there are of >= 2 blocks


def test_a_sync_between_steps_inside_the_window_fails():
    v = verdicts(loop_trace(between=True))
    row = v.loc["no_stream_sync"]
    assert (row["verdict"], row["worst_step"], row["total"]) == ("FAIL", OUTSIDE_LABEL, 3)
    assert row["evidence"] == f"trace: cudaStreamSynchronize {OUTSIDE_LABEL} x3"
    # without the window range the window runs from the first step's start to the last one's end: 2 gaps
    assert verdicts(loop_trace(between=True, window=False)).loc["no_stream_sync", "total"] == 2


def test_a_hook_hit_outside_steps_fails_the_sync_criterion():
    hits = SyncHooks().frame()
    hits.loc[0] = [pd.NA, "torch.Tensor.item", "no_stream_sync", "loop.py:9", "run", "MainThread"]
    hits = hits.astype({"step": "Int64"})
    row = verdicts(loop_trace(), hits).loc["no_stream_sync"]
    assert (row["verdict"], row["source"], row["worst_step"]) == ("FAIL", "hook", OUTSIDE_LABEL)
    assert row["evidence"] == f"hook: torch.Tensor.item at loop.py:9 {OUTSIDE_LABEL} x1"


def test_a_periodic_phase_missing_from_the_window_leaves_its_criteria_not_measured():
    """The config says readback_publish runs every 100 iterations; a 3-step window never saw it: a sync there
    could not have been seen, so the sync criteria and the single-block one (every phase) are not measured rather
    than PASS. The learner's criteria and the env's do not apply to readback_publish: they are still measured."""
    v = verdicts(loop_trace(), periods=HOT_PERIODS)
    for name in [*SYNC_ROWS, "no_single_block_kernels"]:
        assert v.loc[name, "status"] == "not measured (phase readback_publish not in window)", name
        assert v.loc[name, "verdict"] == "-"
    for name in ("no_d2d_weight_sync", "env_kernels_per_env_step"):
        assert (v.loc[name, "status"], v.loc[name, "verdict"]) == ("measured", "PASS"), name
    present = verdicts(loop_trace(readback_every=2), periods={"env_step": 1, "update": 1, "readback_publish": 2})
    assert list(present.loc[SYNC_ROWS, "verdict"]) == ["PASS", "PASS"]
    only_readback = (
        Criterion(
            "no_readback_sync",
            "no sync in readback",
            "stream_sync_calls",
            "==",
            0,
            "test",
            phases=("readback_publish",),
        ),
    )
    row = verdicts(loop_trace(), periods=HOT_PERIODS, criteria=only_readback).loc["no_readback_sync"]
    assert (row["status"], row["verdict"]) == ("not measured (phase readback_publish not in window)", "-")
    no_periods = verdicts(loop_trace(), criteria=only_readback).loc["no_readback_sync"]  # nothing ran in it
    assert no_periods["status"] == "not measured (phase readback_publish not in window)"


def test_a_failure_stays_a_failure_when_a_phase_is_missing():
    row = verdicts(loop_trace(sync_in="update"), periods=HOT_PERIODS).loc["no_stream_sync"]
    assert row["verdict"] == "FAIL"
    assert row["evidence"].endswith("also phase readback_publish not in window")


def test_a_single_block_kernel_in_env_step_fails_no_single_block_kernels():
    """Every phase is judged: a grid (1,1,1) kernel in the env's phase FAILs as one in the learner's does; the env
    row shows the env's grid (1,1,1) count in its evidence."""
    assert verdicts(loop_trace()).loc["no_single_block_kernels", "verdict"] == "PASS"
    v = verdicts(loop_trace(env_grid1=True))
    row = v.loc["no_single_block_kernels"]
    assert (row["verdict"], row["measured"], row["worst_step"], row["total"]) == ("FAIL", 1, "0", 3)
    assert row["evidence"] == "cartpole_reset in env_step x3" and row["phases"] == "every phase + outside steps"
    assert row["limit"] == "== 0" and row["metric"] == "kernels_grid1"
    env = v.loc["env_kernels_per_env_step"]
    assert (env["verdict"], env["measured"], env["total"]) == ("PASS", 2, 6)  # the actor's kernel + cartpole_reset
    assert env["evidence"].endswith("env_steps_per_update 1; env_kernels_grid1 3 over the window")
    # the same kernel in the learner's update, or in a phase neither the learner's nor the env's, fails it too
    for phase in ("update", "readback_publish"):
        b = TraceBuilder()
        with b.step():
            with b.step(phase):
                b.gpu("reduce_kernel", 100, grid=(1, 1, 1))
        m = step_metrics(b.frame(), phases=PHASE_RULES, rule_phases=HOT, roles=HOT_ROLES)
        row = evaluate(m, NO_HITS, cuda=True, roles=HOT_ROLES).set_index("id").loc["no_single_block_kernels"]
        assert (row["verdict"], row["evidence"]) == ("FAIL", f"reduce_kernel in {phase} x1"), phase


def test_a_single_block_kernel_between_steps_fails_no_single_block_kernels():
    b = TraceBuilder()
    with b.step(WINDOW_RANGE):
        for k in range(2):
            with b.step():
                with b.step("env_step"):
                    b.gpu("_actor_step_kernel", 100.0 * (k + 1), grid=(4, 1, 1))
            b.gpu("between_steps_add", 100.0 * (k + 1) + 50, grid=(1, 1, 1))  # the loop's code between steps
    row = verdicts(b.frame()).loc["no_single_block_kernels"]
    assert (row["verdict"], row["worst_step"], row["total"]) == ("FAIL", OUTSIDE_LABEL, 2)
    assert row["evidence"] == f"between_steps_add {OUTSIDE_LABEL} x2"


@pytest.mark.parametrize(
    "env_steps, kernels, verdict, measured",
    [
        (1, 3, "PASS", 3),
        (1, 4, "FAIL", 4),
        (2, 6, "PASS", 3),
        (2, 7, "FAIL", 3.5),
        (2, 8, "FAIL", 4),
        (3, 9, "PASS", 3),
    ],
)
def test_env_kernels_per_env_step_are_limited_to_three(env_steps, kernels, verdict, measured):
    """The fused actor launches at most 3 kernels per vectorized env step; a step of `env_steps` env steps may hold
    3 x env_steps of them (PhaseRoles.env_steps_per_update, the gate's cfg.env_steps_per_update)."""
    roles = PhaseRoles(learner=HOT, env_steps_per_update=env_steps)
    v = verdicts(loop_trace(env_kernels=kernels), roles=roles)
    row = v.loc["env_kernels_per_env_step"]
    assert (row["verdict"], row["measured"], row["status"]) == (verdict, measured, "measured")
    assert (row["limit"], row["metric"], row["phases"], row["total"]) == (
        "<= 3",
        "env_kernels_per_env_step",
        "env_step",
        3 * kernels,
    )
    assert row["worst_step"] == "0" and row["evidence"].endswith(
        f"env_steps_per_update {env_steps}; env_kernels_grid1 0 over the window"
    )
    assert "_actor_step_kernel in env_step x" in row["evidence"]
    failed = set(v.index[v["verdict"].eq("FAIL")])
    assert failed == ({"env_kernels_per_env_step"} if verdict == "FAIL" else set())


def test_one_step_over_the_limit_fails_the_env_row_on_that_step():
    """Worst step: two clean steps and one with a fourth env kernel FAIL, the worst step named."""
    b = TraceBuilder()
    for k, n in enumerate((3, 4, 3)):
        with b.step():
            with b.step("env_step"):
                for i in range(n):
                    b.gpu(f"env_kernel_{i}", 1000.0 * (k + 1) + i, 0.5)
    row = verdicts(b.frame()).loc["env_kernels_per_env_step"]
    assert (row["verdict"], row["measured"], row["worst_step"], row["total"]) == ("FAIL", 4, "1", 10)
    assert row["evidence"].startswith("env_kernel_0 in env_step x3; env_kernel_1 in env_step x3; ")


def test_env_steps_per_update_must_be_a_positive_int():
    assert PhaseRoles().env_steps_per_update == 1
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="env_steps_per_update must be an int >= 1"):
            PhaseRoles(env_steps_per_update=bad)


def test_an_op_added_after_the_learner_step_fails_the_learners_rows():
    """hotloop.guards.faults wraps Trainer.learner_step: the injected copy and one-block add run in the step range
    but in no phase range; the learner's rows judge them (else `--inject d2d_copy` / `grid1` would pass)."""
    v = verdicts(loop_trace(after_learner=True))
    assert list(v.loc[["no_d2d_weight_sync", "no_single_block_kernels"], "verdict"]) == ["FAIL", "FAIL"]
    assert v.loc["no_d2d_weight_sync", "evidence"] == "Memcpy DtoD (Device -> Device) x3"  # in no phase
    assert v.loc["env_kernels_per_env_step", "measured"] == 1  # the actor's kernel only: the add is not the env's


def test_the_actor_graphs_kernels_belong_to_env_step_and_the_learners_to_their_phases():
    df = loop_trace(steps=1)
    phase = dict(zip(df["name"], kernel_phases(df, PHASE_RULES, rule_phases=HOT)))
    assert phase["_fwd_online_actor"] == "env_step"  # launched by the cudaGraphLaunch inside env_step
    assert (phase["_fwd_online_layer0"], phase["_bwd_layer0"]) == ("forward", "backward")


def test_reference_learner_rows_need_target_update():
    ref = PhaseRoles(learner=learner_phases("reference"))
    b = TraceBuilder()
    with b.step():
        with b.step("update"):
            b.gpu(TF32_H200, 100, 20)
    m = step_metrics(b.frame(), roles=ref)
    v = evaluate(m, NO_HITS, cuda=True, roles=ref, periods={"update": 1, "target_update": 100}).set_index("id")
    assert v.loc["no_d2d_weight_sync", "status"] == "not measured (phase target_update not in window)"
    assert v.loc["env_kernels_per_env_step", "status"] == "not measured (phase env_step not in window)"


def test_default_window_holds_every_period():
    assert default_window_steps({"readback_publish": 100, "progress": 10}) == 100
    assert default_window_steps({"env_step": 1}) == 20 and default_window_steps() == 20
    assert default_window_steps({"target_update": 1000}, minimum=5) == 1000
    with pytest.raises(ValueError, match="ints >= 1"):
        default_window_steps({"x": 0})


# --- the loop form on CPU loops ------------------------------------------------------------------------------------


def tiny():
    w = torch.ones(4, 4, requires_grad=True)
    (w @ w).sum().backward()


def test_loop_opening_its_own_step_ranges_places_each_hit_in_its_step_and_phase():
    fake = fake_cuda()
    with guard_window(steps=3, cuda=False, periods={"env_step": 1, "update": 2}) as window:
        for k in range(3):
            with record_function("step"):
                with record_function("env_step"):
                    tiny()
                if k == 1:
                    with record_function("update"):
                        line = inspect.currentframe().f_lineno + 1
                        fake.item()
    report = window.report
    assert report.window["form"] == "own step ranges" and report.window["steps"] == 3
    hits = report.hits
    assert list(hits["step"]) == [1] and list(hits["phase"]) == ["update"] and not hits["outside"].any()
    row = report.verdicts.set_index("id").loc["no_stream_sync"]
    assert (row["verdict"], row["measured"], row["worst_step"], row["source"]) == ("FAIL", 1, "1", "hook")
    assert row["evidence"] == f"hook: torch.Tensor.item at {__file__}:{line} in update x1"
    cov = report.coverage.set_index("phase")
    assert list(cov.loc[["env_step", "update"], "steps"]) == [3, 1]
    assert cov.loc["update", "sync_hook_hits"] == 1 and cov.loc["update", "status"] == "ran"
    assert list(report.per_step["stream_sync_hook_hits"]) == [0, 1, 0]


def test_window_step_form_guards_steps_w_to_w_plus_k_and_counts_hits_between_them_outside():
    fake = fake_cuda()
    calls = []
    with guard_window(steps=2, warmup=1, cuda=False) as window:
        for i in range(5):
            with window.step():
                calls.append(i)
                tiny()
            fake.item()  # after every step: only the one between the two guarded steps is in the window
    report = window.report
    assert calls == [0, 1, 2, 3, 4] and len(report.per_step) == 2 and report.window["form"] == "window.step()"
    assert len(report.hits) == 1 and report.hits["outside"].all() and report.hits["step"].isna().all()
    row = report.verdicts.set_index("id").loc["no_stream_sync"]
    assert (row["verdict"], row["worst_step"]) == ("FAIL", OUTSIDE_LABEL)
    assert report.outside["stream_sync_hook_hits"] == 1
    assert report.coverage.set_index("phase").loc[OUTSIDE_LABEL, "sync_hook_hits"] == 1


def test_guard_window_errors():
    with pytest.raises(RuntimeError, match="never started"):
        with guard_window(steps=2, warmup=1, cuda=False):
            tiny()  # warm-up needs window.step()
    with pytest.raises(RuntimeError, match="1 of 3 guarded steps ran"):
        with guard_window(steps=3, cuda=False) as w:
            with w.step():
                tiny()
    with pytest.raises(RuntimeError, match="holds 1 'step' ranges for 2 guarded steps"):
        with guard_window(steps=2, cuda=False):
            with record_function("step"):
                tiny()
    w = guard_window(steps=1, cuda=False)
    with pytest.raises(RuntimeError, match="once the `with"):
        w.report
    with pytest.raises(RuntimeError, match="inside `with guard_window"):
        with w.step():
            pass
    with pytest.raises(ValueError, match="steps >= 1"):
        guard_window(steps=0)
    before = torch.cuda.synchronize
    with pytest.raises(ZeroDivisionError):
        with guard_window(steps=2, cuda=False) as w:
            with w.step():
                raise ZeroDivisionError
    assert torch.cuda.synchronize is before and "item" not in vars(torch.Tensor)  # hooks restored


def test_guard_steps_is_the_window_step_form():
    report = guard_steps(tiny, steps=3, warmup=1, cuda=False)
    assert report.window["form"] == "window.step()" and len(report.per_step) == 3
    assert report.failed == [] and report.window["window_s"] > 0 and report.window["analysis_s"] > 0


def test_docstring_loop_example_runs(monkeypatch):
    code = guard_module.__doc__.split("(tests/guards/test_guard_window.py runs it)::\n")[1]
    scope = {"my_step": tiny}
    exec(compile(textwrap.dedent(code), "guard_window_docstring_example", "exec"), scope)
    assert len(scope["window"].report.per_step) == 5

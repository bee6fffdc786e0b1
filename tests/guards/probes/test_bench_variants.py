"""Learner-step variants of `hotloop bench` (guards/probes/bench_variants.py): the eager step on the CPU, the fresh step's
math against `DQNLearner.update`, the TF32 switch, the loop-iteration variant on the CPU; capture and compile on the
GPU (marked gpu)."""

from __future__ import annotations

import copy

import pytest
import torch

from hotloop.guards.probes.bench_variants import (
    BenchState,
    Variant,
    build_compiled,
    build_eager,
    build_graph,
    build_iteration,
    env_shapes,
    iteration_periods,
    tf32_matmuls,
)
from hotloop.trainer.config import preset

CPU = torch.device("cpu")


def _cfg(**kw):
    """A tiny cartpole config: obs 4, one branch of 2 actions, a 16-wide trunk; the target updated every 100 steps
    (a bench step leaves the target update out, so the comparisons with DQNLearner.update run without one)."""
    return preset(
        "cartpole",
        **{
            "batch_size": 16,
            "replay_capacity": 256,
            "trunk_hidden": (16,),
            "head_hidden": 8,
            "target_update_interval": 100,
            **kw,
        },
    )


def _snapshot(state: BenchState) -> list[torch.Tensor]:
    return [t.detach().clone() for t in state.state_tensors()]


def test_eager_step_changes_the_parameters_and_reads_the_loss_every_step(monkeypatch):
    v = build_eager(_cfg(), CPU)
    assert isinstance(v, Variant) and (v.name, v.setup_kind, v.precision) == ("eager", "none", "fp32")
    before = [p.detach().clone() for p in v.step.state.online.parameters()]
    calls = []
    real_item = torch.Tensor.item

    def spy(t):
        calls.append(tuple(t.shape))
        return real_item(t)

    monkeypatch.setattr(torch.Tensor, "item", spy)
    for _ in range(3):
        v.step()
    assert calls.count(()) >= 3  # loss.item() once per step
    after = list(v.step.state.online.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    assert isinstance(v.step.last_loss, float) and v.step.last_loss == v.step.last_loss  # a finite float, not NaN


@pytest.mark.parametrize("extra", [{}, {"cql_weight": 0.3, "diversity_weight": 0.2, "loss": "mse"}])
def test_fresh_update_matches_dqn_learner_update_on_the_same_batch(extra):
    cfg = _cfg(**extra)
    state = BenchState(cfg, CPU)
    ref = copy.deepcopy(state.learner)  # same weights, spectral-norm vectors and (empty) Adam state
    for _ in range(2):  # twice: the second step runs with Adam state and advanced power iterations
        b = state.replay.sample(cfg.batch_size, state.beta)
        got = state.update(b)
        want = ref.update(b.obs, b.action, b.reward, b.next_obs, b.terminated, b.weights)
        for name in ("loss", "q_mean", "grad_norm", "cql", "diversity", "td_abs"):
            torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-6, atol=1e-7, msg=name)
        for a, r in zip(
            [*state.online.parameters(), *state.online.buffers()], [*ref.online.parameters(), *ref.online.buffers()]
        ):
            torch.testing.assert_close(a, r, rtol=1e-6, atol=1e-7)


def test_step_updates_the_sampled_priorities_and_keeps_the_target_fixed():
    state = BenchState(_cfg(), CPU)
    tree_before = state.replay.tree.nodes.clone()
    target_before = [p.clone() for p in state.target.parameters()]
    state.step()
    assert not torch.equal(tree_before, state.replay.tree.nodes)
    assert all(torch.equal(a, b) for a, b in zip(target_before, state.target.parameters()))


def test_bench_state_fills_the_replay_with_the_env_shapes():
    cfg = _cfg()
    state = BenchState(cfg, CPU)
    assert env_shapes(cfg) == (4, (2,)) == (state.obs_dim, state.action_nvec)
    assert len(state.replay) == min(cfg.replay_capacity, 4 * cfg.batch_size)
    assert env_shapes(_cfg(env="synthetic", obs_dim=5, action_nvec=(3, 4))) == (5, (3, 4))


def test_the_iteration_variant_runs_one_loop_iteration_of_a_trainer_on_the_bench_device():
    cfg = _cfg(num_envs=4, learning_starts=32, eval_episodes=0, target_update_interval=3, device="cuda:7")
    v = build_iteration(cfg, CPU)
    trainer = v.step.trainer
    assert isinstance(v, Variant) and (v.name, v.setup_kind, v.precision) == ("iteration", "trainer", "fp32")
    assert trainer.device == CPU and trainer.learner_kind == "reference"  # auto on the CPU
    assert v.setup_s > 0 and v.step_multiple == 3 and "reference learner step" in v.note
    assert trainer.learner_steps == 3 and trainer.env_steps == 32 + 3 * 4  # prefill + ITERATION_WARMUP iterations
    v.step()
    assert trainer.learner_steps == 4 and trainer.env_steps == 48 and trainer.learner.steps == 4


def test_iteration_periods_leave_out_progress():
    cfg = _cfg(log_interval=7, target_update_interval=5, learner_steps_per_epoch=300)
    assert iteration_periods(cfg, "hotloop") == {"env_step": 1, "update": 1, "readback_publish": 7}
    assert iteration_periods(cfg, "reference") == {
        "env_step": 1,
        "sample": 1,
        "update": 1,
        "priority_update": 1,
        "target_update": 5,
    }
    with pytest.raises(ValueError, match="learner kind"):
        iteration_periods(cfg, "auto")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
@pytest.mark.parametrize(
    "build,precision",
    [(build_graph, "fp32"), (build_graph, "tf32"), (build_compiled, "split"), (build_compiled, "tf32")],
)
def test_captured_variants_need_cuda(build, precision):
    with pytest.raises(RuntimeError, match="needs CUDA"):
        build(_cfg(), CPU, precision)


@pytest.mark.parametrize("build,precision", [(build_graph, "split"), (build_compiled, "fp32"), (build_graph, "bf16")])
def test_unknown_precision_is_a_value_error(build, precision):
    with pytest.raises(ValueError, match="precision must be one of"):
        build(_cfg(), CPU, precision)


def test_tf32_switch_sets_and_restores_the_flags():
    matmul = torch.backends.cuda.matmul
    start = matmul.allow_tf32
    with tf32_matmuls(True):
        assert matmul.allow_tf32 and torch.backends.cudnn.allow_tf32 and matmul.fp32_precision == "tf32"
        with tf32_matmuls(False):
            assert not matmul.allow_tf32 and matmul.fp32_precision == "ieee"
        assert matmul.allow_tf32
        with tf32_matmuls(None):
            assert matmul.allow_tf32
    assert matmul.allow_tf32 == start
    with pytest.raises(KeyError), tf32_matmuls(not start):
        raise KeyError("restored on an exception too")
    assert matmul.allow_tf32 == start


# ---------------------------------------------------------------------------------------------------------- GPU


def _replay_vs_uncaptured(v: Variant, **step_kw) -> tuple[list, list, list, list]:
    """Replay the variant's graph once, then restore the state and RNG and run the same step uncaptured; returns
    (graph metrics, uncaptured metrics, graph state, uncaptured state)."""
    state = v.step.state
    snap, rng = _snapshot(state), torch.cuda.get_rng_state()
    v.step()
    torch.cuda.synchronize()
    g_metrics, g_state = [m.clone() for m in v.step.metrics], _snapshot(state)
    with torch.no_grad():  # the state holds leaf parameters that require grad
        for t, s in zip(state.state_tensors(), snap):
            t.copy_(s)
    torch.cuda.set_rng_state(rng)
    e_metrics = list(state.step(**step_kw))
    torch.cuda.synchronize()
    return g_metrics, e_metrics, g_state, _snapshot(state)


@pytest.mark.gpu
def test_graph_replay_equals_the_uncaptured_step():
    v = build_graph(_cfg(batch_size=64, replay_capacity=4096), torch.device("cuda"), "fp32")
    assert (v.name, v.setup_kind, v.precision) == ("graph-fp32", "capture", "fp32") and v.setup_s > 0
    with tf32_matmuls(False):
        g_m, e_m, g_s, e_s = _replay_vs_uncaptured(v)
    for a, b in zip(g_m, e_m):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(g_s, e_s):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for _ in range(5):
        v.step()
    torch.cuda.synchronize()
    assert all(torch.isfinite(m).all() for m in v.step.metrics)


@pytest.mark.gpu
def test_graph_tf32_runs_and_restores_the_process_flag():
    start = torch.backends.cuda.matmul.allow_tf32
    v = build_graph(_cfg(batch_size=64, replay_capacity=4096), torch.device("cuda"), "tf32")
    assert torch.backends.cuda.matmul.allow_tf32 == start
    with tf32_matmuls(True):
        g_m, e_m, _, _ = _replay_vs_uncaptured(v)
    torch.testing.assert_close(g_m[0], e_m[0], rtol=1e-4, atol=1e-5)  # same TF32 kernels, same batch


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("precision", ["split", "tf32"])
def test_compiled_variant_captures_and_matches_the_eager_math(precision):
    v = build_compiled(_cfg(batch_size=64, replay_capacity=4096), torch.device("cuda"), precision)
    assert v.setup_kind == "compile+capture" and v.precision == precision and v.setup_s > 0
    g_m, e_m, _, _ = _replay_vs_uncaptured(v, tf32_forward=True, tf32_backward=precision == "tf32")
    torch.testing.assert_close(g_m[0], e_m[0], rtol=2e-2, atol=1e-3)  # compiled vs eager kernels, TF32 forward
    for _ in range(5):
        v.step()
    torch.cuda.synchronize()
    assert all(torch.isfinite(m).all() for m in v.step.metrics)

"""guards/faults.py: each learner fault keeps the step's math (CUDA, else the Triton interpreter), bad requests are refused,
and on a GPU each injected fault fails exactly the criterion it names while the clean step passes."""

from __future__ import annotations

import pytest
import torch

from hotloop.guards.fault_list import ONE_PROCESS_FAULTS
from hotloop.guards.faults import _LEARNER_FAULTS, FAULTS, inject
from hotloop.trainer.config import preset
from hotloop.trainer.replay import PrioritizedReplay
from hotloop.trainer.step import HotLearner

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _learner(device=DEVICE, spectral_norm=True):
    cfg = preset(
        "seed-scale",
        batch_size=32,
        trunk_hidden=(24, 16),
        head_hidden=16,
        obs_dim=12,
        action_nvec=(3, 3),
        replay_capacity=300,
        seed=4,
        spectral_norm=spectral_norm,
    )
    rp = PrioritizedReplay(
        cfg.replay_capacity, cfg.obs_dim, 2, alpha=cfg.per_alpha, eps=cfg.per_eps, device=device, use_kernels=True
    )
    g = torch.Generator().manual_seed(4)
    n = 200
    rp.add(
        torch.randn(n, 12, generator=g).to(device),
        torch.randint(0, 3, (n, 2), generator=g).to(device),
        torch.randn(n, generator=g).to(device),
        torch.randn(n, 12, generator=g).to(device),
        (torch.rand(n, generator=g) < 0.1).to(device),
    )
    return HotLearner(cfg, 12, (3, 3), torch.device(device), rp)


@pytest.mark.parametrize(
    "name,spectral_norm",
    [("sn_split", True), ("fwd_fp32", True), ("bwd_tf32", True), ("ddqn_serial", True), ("bwd_tf32", False)],
)
def test_learner_faults_keep_the_math(name, spectral_norm):
    """spectral_norm=False: the gains are fixed and the step passes no gain gradient buffer (dg None); the
    stand-in kernels of a fault must take that as the Triton ones do."""
    clean, faulty = _learner(spectral_norm=spectral_norm), _learner(spectral_norm=spectral_norm)
    _LEARNER_FAULTS[name](faulty)
    if name in ("fwd_fp32", "bwd_tf32"):
        assert faulty.use_graph is False
    for _ in range(2):
        clean.step()
        faulty.step()
    # The precision faults change the GEMMs' precision on a GPU (TF32 <-> FP32: ~1e-3 relative); on the CPU
    # interpreter every dot is FP32, so all four faults must give the clean math there.
    tol = (
        dict(rtol=2e-2, atol=1e-3)
        if DEVICE == "cuda" and name in ("fwd_fp32", "bwd_tf32")
        else dict(rtol=1e-4, atol=1e-5)
    )
    torch.testing.assert_close(faulty.nets, clean.nets, **tol)
    torch.testing.assert_close(faulty.grads, clean.grads, **tol)


class _FakeTrainer:
    def __init__(self, kind="hotloop", device="cpu", spectral_norm=True, grouped_forward=False):
        self.learner_kind, self.device = kind, torch.device(device)
        self.cfg = preset("seed-scale", spectral_norm=spectral_norm, grouped_forward=grouped_forward)


@pytest.mark.smoke
def test_bad_requests_are_refused():
    with pytest.raises(ValueError, match="unknown fault 'nope'.*item"):
        inject(_FakeTrainer(), "nope")
    with pytest.raises(ValueError, match="reference"):
        inject(_FakeTrainer("reference"), "sn_split")
    with pytest.raises(ValueError, match="needs a CUDA trainer"):
        inject(_FakeTrainer(), "item")
    with pytest.raises(ValueError, match="sn_split: this run has spectral norm off"):
        inject(_FakeTrainer(device="cuda", spectral_norm=False), "sn_split")
    for name in ("fwd_fp32", "ddqn_serial"):  # the grouped forward calls neither linear_forward nor a DDQN stream
        with pytest.raises(ValueError, match=f"--inject {name}: this run has grouped_forward on"):
            inject(_FakeTrainer(device="cuda", grouped_forward=True), name)
    assert {f.criterion for f in FAULTS.values()} >= {
        "no_stream_sync",
        "no_event_sync",
        "no_d2d_weight_sync",
        "spectral_norm_fused",
        "no_single_block_kernels",
        "tf32_forward_only",
        "ddqn_overlapped",
    }


@pytest.mark.gpu
@pytest.mark.parametrize("name", [None, *ONE_PROCESS_FAULTS])
def test_each_fault_fails_its_criterion_on_the_gpu(name):
    from hotloop.guards.guard import guard_steps
    from hotloop.trainer.loop import Trainer
    from hotloop.trainer.step import PHASE_RULES

    cfg = preset(
        "seed-scale",
        batch_size=2048,
        replay_capacity=8192,
        num_envs=256,
        learning_starts=2048,
        learner_steps_per_epoch=5,
        eval_episodes=0,
        device="cuda",
    )
    trainer = Trainer(cfg)
    for _ in range(3):
        trainer.train_step()
    if name is not None:
        inject(trainer, name)
    report = guard_steps(trainer.learner_step, steps=5, warmup=3, step_range="guard_step", phases=PHASE_RULES)
    failed = set(report.failed)
    if name is None:
        assert not failed, report
    else:
        assert FAULTS[name].criterion in failed, report


def test_gate_cli_refuses_bad_fault_requests_before_training(tmp_path, capsys):
    from hotloop.guards.cli import main

    out = tmp_path / "run"
    assert main(["gate", "--inject", "nope", "--device", "cpu", "--out", str(out)]) == 2
    assert "unknown fault 'nope'" in capsys.readouterr().err
    assert (
        main(
            [
                "gate",
                "--inject",
                "item",
                "--update-baseline",
                "--baseline",
                str(tmp_path / "b.json"),
                "--device",
                "cpu",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    assert "update-baseline" in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.smoke
def test_check_request_refuses_what_inject_would_refuse_before_any_training():
    from hotloop.guards.faults import check_request

    with pytest.raises(ValueError, match="--inject item: the faults are GPU regressions and need a CUDA device"):
        check_request("item", device="cpu", learner="reference")
    with pytest.raises(ValueError, match="--inject sn_split: the fault changes the hotloop learner"):
        check_request("sn_split", device="cuda", learner="reference")
    check_request("item", device="cuda", learner="reference")  # a wrapper fault works with either learner
    check_request("sn_split", device=torch.device("cuda:0"), learner="hotloop")
    with pytest.raises(ValueError, match="spectral norm off.*--set spectral_norm=true"):
        check_request("sn_split", device="cuda", learner="hotloop", spectral_norm=False)
    check_request(None, device="cpu", learner="reference")
    check_request("item")  # without device and learner: only the name (inject checks the trainer itself)


def test_gate_cli_refuses_a_fault_on_the_cpu_before_training(tmp_path, capsys):
    from hotloop.guards.cli import main

    out = tmp_path / "run"
    assert (
        main(
            [
                "gate",
                "--inject",
                "item",
                "--device",
                "cpu",
                "--epochs",
                "1",
                "--no-progress",
                "--set",
                "learner_steps_per_epoch=20",
                "--set",
                "learning_starts=64",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    assert "need a CUDA device" in capsys.readouterr().err and not out.exists()


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ONE_PROCESS_FAULTS))
def test_the_gate_cli_catches_each_fault_with_exit_1_not_a_crash(name, tmp_path, capsys):
    """A mutation run counts a fault as caught only when the gate exits 1 with that fault's criterion FAIL: exit 70
    (an internal error, traceback in the run folder's error.log) is a crash, never a caught fault."""
    import json

    from hotloop.guards.cli import main
    from hotloop.guards.commands.errors import ERROR_LOG, INTERNAL_ERROR

    out = tmp_path / "run"
    sn = ["--set", "spectral_norm=true"] if name == "sn_split" else []  # whatever the preset says
    rc = main(
        [
            "gate",
            "--preset",
            "cartpole",
            "--device",
            "cuda",
            "--epochs",
            "1",
            "--guard-steps",
            "5",
            "--no-progress",
            "--no-baseline",
            "--set",
            "learner_steps_per_epoch=200",
            *sn,
            "--inject",
            name,
            "--out",
            str(out),
        ]
    )
    assert rc != INTERNAL_ERROR, f"the gate crashed: {(out / ERROR_LOG).read_text()}"
    assert rc == 1, capsys.readouterr().out[-2000:]
    verdicts = {v["id"]: v["verdict"] for v in json.loads((out / "criteria.json").read_text())}
    assert verdicts[FAULTS[name].criterion] == "FAIL"

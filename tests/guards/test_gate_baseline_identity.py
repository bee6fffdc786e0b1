"""guards/gate.py's step identity: a run is compared with a baseline only when both measured the same step on the
same kind of device, learner and GPU; spellings that launch the same step (auto, cuda:0, unused env shapes) agree."""

from __future__ import annotations

import pytest
import torch

from hotloop.guards.baselines import Baseline
from hotloop.guards.gate import BASELINES_DIR, baseline_mismatch, default_baseline, run_config, step_identity
from hotloop.trainer.config import preset

H200_CONFIG = preset("cartpole", device="cuda", epochs=2).to_dict()  # learner "auto", as the committed baseline


def test_spellings_of_the_same_step_have_one_identity():
    a = step_identity(H200_CONFIG, "NVIDIA H200")
    b = step_identity({**H200_CONFIG, "device": "cuda:0", "learner": "hotloop", "action_nvec": [2, 2]}, "NVIDIA H200")
    assert a == b and a["device"] == "cuda" and a["learner"] == "hotloop" and "action_nvec" not in a
    seed = step_identity(preset("seed-scale", device="cpu").to_dict(), "cpu")
    assert seed["action_nvec"] == [4, 4, 4] and seed["learner"] == "reference"  # the synthetic env's own shapes


def test_a_cpu_run_is_not_compared_with_the_gpu_baseline():
    differ = baseline_mismatch(Baseline("NVIDIA H200", {}, H200_CONFIG), preset("cartpole", device="cpu"))
    assert "device: baseline 'cuda', run 'cpu'" in differ and "gpu: baseline 'NVIDIA H200', run 'cpu'" in differ
    assert "learner: baseline 'hotloop', run 'reference'" in differ
    cpu_base = Baseline("cpu", {}, run_config(preset("cartpole", device="cpu")))
    assert cpu_base.config["learner"] == "reference" and cpu_base.config["device"] == "cpu"  # resolved when written
    assert baseline_mismatch(cpu_base, preset("cartpole", device="cpu", learner="reference", seed=3)) == []
    assert baseline_mismatch(cpu_base, preset("cartpole", device="cpu", batch_size=64)) == [
        "batch_size: baseline 128, run 64"
    ]
    assert baseline_mismatch(Baseline("cpu", {}), preset("cartpole", device="cpu")) is None  # no config recorded


def test_the_default_baseline_lives_in_the_checkout_not_the_working_directory(monkeypatch, tmp_path):
    assert BASELINES_DIR.is_dir() and (BASELINES_DIR / "nvidia-h200.json").is_file()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    assert default_baseline() == BASELINES_DIR / "nvidia-h200.json" and default_baseline().is_file()


@pytest.mark.gpu
def test_this_gpu_run_matches_the_committed_h200_baseline_identity():
    if torch.cuda.get_device_name(0) != "NVIDIA H200":
        pytest.skip("the committed baseline is the H200's")
    from hotloop.guards.baselines import load_baseline

    base = load_baseline(BASELINES_DIR / "nvidia-h200.json")
    assert baseline_mismatch(base, preset("cartpole", device="cuda", epochs=1)) == []


def test_a_baseline_measured_over_the_old_window_mismatches_and_a_new_one_records_the_loop_window():
    """A baseline written before baselines recorded their window (its counts were measured over 20 calls of
    learner_step, without the env step or the periodic work) is not comparable with a loop-window run: it differs
    in guard_window, so the default baseline is skipped with a note and an explicit one is refused (exit 2)."""
    from hotloop.guards.gate import GUARD_WINDOW, LEGACY_WINDOW

    cfg = preset("cartpole", device="cpu")
    new = run_config(cfg)
    assert new["guard_window"] == GUARD_WINDOW
    assert baseline_mismatch(Baseline("cpu", {}, new), cfg) == []
    old = {k: v for k, v in new.items() if k != "guard_window"}
    assert baseline_mismatch(Baseline("cpu", {}, old), cfg) == [
        f"guard_window: baseline {LEGACY_WINDOW!r}, run {GUARD_WINDOW!r}"
    ]

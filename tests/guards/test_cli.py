"""The `hotloop` CLI: --help everywhere, exit codes, tables written, the hang watchdog's exit 3."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from hotloop.profiles.epoch_table import EPOCH_COLUMNS
from hotloop.guards.cli import main

TINY = ["--set", "learner_steps_per_epoch=20", "--set", "learning_starts=64", "--set", "batch_size=32",
        "--set", "trunk_hidden=[16]", "--set", "head_hidden=8", "--set", "eval_episodes=4", "--no-progress"]


def _hotloop(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "hotloop.guards.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.smoke
@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["gate", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage: hotloop" in out
    if argv != ["--help"]:
        assert "learner_steps_per_epoch" in out and "--epoch-timeout" in out


@pytest.mark.parametrize("argv,match", [
    (["gate", "--set", "nope=1"], "unknown config key 'nope'"),
    (["gate", "--set", "batch_size=-3"], "batch_size must be a positive int"),
    (["train", "--epochs", "0"], "epochs must be a positive int"),
    (["train", "--device", "cuda:0"] if not __import__("torch").cuda.is_available() else ["train", "--device", "tpu"],
     "device"),
    (["gate", "--epoch-timeout", "0"], "--epoch-timeout must be > 0"),
    (["gate", "--config", "/nonexistent/config.json"], "config file /nonexistent/config.json"),
    (["train", "--set", "env=gym:Pendulum-v1"], "config.env 'gym:Pendulum-v1' cannot be used"),
    (["train", "--set", "env=gym:NoSuchEnv-v0"], "config.env 'gym:NoSuchEnv-v0' cannot be used"),
    (["train", "--set", "env=foo"], "config.env 'foo' cannot be used"),
    (["train", "--set", "per_eps=0"], "per_eps must be > 0"),
    (["train", "--epoch-timeout", "nan"], "--epoch-timeout must be > 0"),
])
def test_bad_input_exits_2_with_a_named_error(argv, match, capsys, tmp_path):
    assert main(argv + ["--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert match in err


def test_bad_input_found_late_still_exits_2_before_writing(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    cfg = tmp_path / "config.json"
    cfg.write_text('{"lr": "x"}')
    cases = [(["train", "--config", str(cfg)], "config.lr must be a finite float, got 'x'"),
             (["train", "--out", str(tmp_path / "afile" / "sub")], "cannot create the run folder"),
             (["gate", "--baseline", str(tmp_path), "--update-baseline"], "cannot be written"),
             (["gate", "--baseline", str(tmp_path / "afile" / "b.json"), "--update-baseline"], "cannot be written")]
    for argv, match in cases:
        out = [] if "--out" in argv else ["--out", str(tmp_path / "never")]
        assert main([*argv, *out, *TINY]) == 2, argv
        assert match in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_an_existing_run_folder_is_never_overwritten(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "epochs.csv").write_text("precious\n")
    assert main(["train", "--out", str(out), *TINY]) == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert (out / "epochs.csv").read_text() == "precious\n"


@pytest.mark.parametrize("argv", [[], ["bogus"], ["gate", "--preset", "nope"], ["train", "--epochs", "x"]])
def test_bad_usage_exits_2(argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


@pytest.mark.smoke
def test_gate_runs_and_writes_its_tables(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["gate", "--epochs", "2", "--device", "cpu", "--out", str(out), "--guard-steps", "4", *TINY]) == 0
    printed = capsys.readouterr().out
    assert "Per-epoch table" in printed and "epoch 1 without hang" in printed and "4 guarded steps" in printed
    table = pd.read_csv(out / "epochs.csv")
    assert list(table.columns[:len(EPOCH_COLUMNS)]) == EPOCH_COLUMNS
    assert table.epoch.tolist() == [1, 2] and (table.learner_steps == 20).all()
    verdicts = {v["criterion"]: v for v in json.loads((out / "criteria.json").read_text())}
    assert set(verdicts) >= {"no stream sync", "no single-block kernels", "smoke suite"}
    measured = {c for c, v in verdicts.items() if v["status"] == "measured"}
    assert measured == {"no stream sync", "no event sync", "epoch 1 without hang"}  # CPU: hooks + watchdog only
    assert all(verdicts[c]["verdict"] == "PASS" for c in measured)
    assert verdicts["no D2D weight sync"]["status"] == "not measured (no CUDA)"
    assert len(json.loads((out / "guard.json").read_text())["per_step"]) == 4
    from hotloop.profiles.trace_counts import step_ranges
    from hotloop.profiles.kineto_reader import read_kineto
    assert len(step_ranges(read_kineto(out / "trace.json.gz"), "guard_step")) == 4  # the kept trace, one repeat
    assert (out / "epochs.md").read_text().startswith("|")
    assert json.loads((out / "config.json").read_text())["learner_steps_per_epoch"] == 20


def test_gate_fails_naming_the_criterion_when_a_step_syncs(tmp_path, capsys, monkeypatch):
    # Inject the fault: every learner step calls torch.cuda.synchronize() (stubbed, as this machine has no CUDA).
    import torch

    from hotloop.trainer.loop import Trainer

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    clean_step = Trainer.train_step
    monkeypatch.setattr(Trainer, "train_step", lambda self: (clean_step(self), torch.cuda.synchronize())[0])
    out = tmp_path / "run"
    assert main(["gate", "--epochs", "1", "--device", "cpu", "--out", str(out), "--guard-steps", "3", *TINY]) == 1
    printed = capsys.readouterr().out
    assert "FAIL no event sync: measured 1" in printed and "test_cli.py" in printed
    verdicts = {v["criterion"]: v["verdict"] for v in json.loads((out / "criteria.json").read_text())}
    assert verdicts["no event sync"] == "FAIL" and verdicts["no stream sync"] == "PASS"


def test_train_resumable_config_file(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--epochs", "1", "--device", "cpu", "--out", str(out), *TINY]) == 0
    again = tmp_path / "again"
    assert main(["train", "--config", str(out / "config.json"), "--out", str(again), "--no-progress"]) == 0
    a, b = pd.read_csv(out / "epochs.csv"), pd.read_csv(again / "epochs.csv")
    assert a.loss.tolist() == b.loss.tolist()  # seeded: the same config gives the same run on CPU


def test_hang_exits_3_with_stacks_and_phase(tmp_path):
    # Inject the fault: an epoch far longer than its limit.
    res = _hotloop("gate", "--device", "cpu", "--epoch-timeout", "1", "--out", str(tmp_path / "run"),
                   *TINY[:-1], "--set", "learner_steps_per_epoch=100000", "--no-progress")
    assert res.returncode == 3, res.stderr
    assert "HANG: epoch 1 did not finish within 1 s" in res.stderr
    assert "last phase entered:" in res.stderr and "Thread" in res.stderr and "loop.py" in res.stderr


def test_gate_writes_then_compares_a_baseline(tmp_path, capsys):
    base = tmp_path / "baselines" / "cpu.json"
    args = ["gate", "--epochs", "1", "--device", "cpu", "--guard-steps", "2", "--repeats", "2", *TINY]
    assert main([*args, "--out", str(tmp_path / "a"), "--baseline", str(base), "--update-baseline"]) == 0
    assert "baseline written" in capsys.readouterr().out and base.exists()
    doc = json.loads(base.read_text())
    assert doc["metrics"]["dur_us"]["kind"] == "timing" and len(doc["metrics"]["dur_us"]["values"]) == 2
    # Keep the structural counts only: host timings on a shared CPU are too noisy for an exact test.
    doc["metrics"] = {m: e for m, e in doc["metrics"].items() if e["kind"] == "count"}
    base.write_text(json.dumps(doc))
    assert main([*args, "--out", str(tmp_path / "b"), "--baseline", str(base)]) == 0
    assert "Baseline comparison" in capsys.readouterr().out
    table = pd.read_csv(tmp_path / "b" / "baseline.csv")
    assert "stream_sync_hook_hits" in set(table.metric) and not table.verdict.eq("FAIL").any()
    # Inject a regression into the baseline: it claims one hook hit per step fewer than any run can have.
    doc = json.loads(base.read_text())
    doc["metrics"]["event_sync_hook_hits"]["values"] = [-1.0, -1.0]
    base.write_text(json.dumps(doc))
    assert main([*args, "--out", str(tmp_path / "c"), "--baseline", str(base)]) == 1
    assert "FAIL regression event_sync_hook_hits" in capsys.readouterr().out


def test_gate_refuses_a_baseline_of_another_configuration_before_training(tmp_path, capsys):
    base = tmp_path / "cpu.json"
    args = ["gate", "--epochs", "1", "--device", "cpu", "--guard-steps", "2", *TINY]
    assert main([*args, "--out", str(tmp_path / "a"), "--baseline", str(base), "--update-baseline"]) == 0
    capsys.readouterr()
    out = tmp_path / "b"
    assert main([*args, "--set", "batch_size=64", "--out", str(out), "--baseline", str(base)]) == 2
    err = capsys.readouterr().err
    assert "was measured with another configuration (batch_size: baseline" in err and "run 64" in err
    assert not out.exists()
    assert main([*args, "--no-baseline", "--baseline", str(base), "--out", str(out)]) == 2
    assert "--no-baseline cannot be given with --baseline" in capsys.readouterr().err


def test_the_default_baseline_of_another_configuration_is_skipped_with_a_note(tmp_path, capsys, monkeypatch):
    import hotloop.guards.gate

    base = tmp_path / "gpu.json"
    monkeypatch.setattr(hotloop.guards.gate, "default_baseline", lambda folder=None: base)
    args = ["gate", "--epochs", "1", "--device", "cpu", "--guard-steps", "2", *TINY]
    assert main([*args, "--out", str(tmp_path / "a"), "--update-baseline"]) == 0 and base.exists()
    capsys.readouterr()
    assert main([*args, "--set", "batch_size=64", "--out", str(tmp_path / "b")]) == 0
    captured = capsys.readouterr()
    assert f"not comparing with the default baseline {base}" in captured.err and "batch_size" in captured.err
    assert "Baseline comparison" not in captured.out and not (tmp_path / "b" / "baseline.csv").exists()
    # The same configuration is compared (exit 0 or 1: this CPU's host timings are noisy against a 1-repeat baseline).
    assert main([*args, "--out", str(tmp_path / "c")]) in (0, 1)
    assert "Baseline comparison" in capsys.readouterr().out and (tmp_path / "c" / "baseline.csv").exists()


def test_gate_rejects_a_missing_baseline_before_training(tmp_path, capsys):
    assert main(["gate", "--out", str(tmp_path / "r"), "--baseline", str(tmp_path / "none.json"), *TINY]) == 2
    assert "no such baseline file" in capsys.readouterr().err and not (tmp_path / "r").exists()

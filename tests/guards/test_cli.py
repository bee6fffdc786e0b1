"""The `hotloop` CLI: --help everywhere, exit codes, tables written, the hang watchdog's exit 3."""

import json
import re
import subprocess
import sys

import pandas as pd
import pytest

from hotloop.guards.cli import main
from hotloop.guards.criteria import CRITERIA, LOOP_CENSUS
from hotloop.guards.gate import CENSUS_COLUMN, LOOP_CENSUS_OFF, ONE_REPEAT_NOTE, STRUCTURE_CENSUS_OFF
from hotloop.profiles.epoch_table import EPOCH_COLUMNS

TINY = [
    "--set",
    "learner_steps_per_epoch=20",
    "--set",
    "learning_starts=64",
    "--set",
    "batch_size=32",
    "--set",
    "trunk_hidden=[16]",
    "--set",
    "head_hidden=8",
    "--set",
    "eval_episodes=4",
    "--no-progress",
]


def _hotloop(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "hotloop.guards.cli", *args], capture_output=True, text=True, timeout=timeout
    )


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


@pytest.mark.parametrize(
    "argv,match",
    [
        (["gate", "--set", "nope=1"], "unknown config key 'nope'"),
        (["gate", "--set", "batch_size=-3"], "batch_size must be a positive int"),
        (["train", "--epochs", "0"], "epochs must be a positive int"),
        (
            ["train", "--device", "cuda:0"]
            if not __import__("torch").cuda.is_available()
            else ["train", "--device", "tpu"],
            "device",
        ),
        (["gate", "--epoch-timeout", "0"], "--epoch-timeout must be > 0"),
        (["gate", "--config", "/nonexistent/config.json"], "config file /nonexistent/config.json"),
        (["train", "--set", "env=gym:Pendulum-v1"], "config.env 'gym:Pendulum-v1' cannot be used"),
        (["train", "--set", "env=gym:NoSuchEnv-v0"], "config.env 'gym:NoSuchEnv-v0' cannot be used"),
        (["train", "--set", "env=foo"], "config.env 'foo' cannot be used"),
        (["train", "--set", "per_eps=0"], "per_eps must be > 0"),
        (["train", "--epoch-timeout", "nan"], "--epoch-timeout must be > 0"),
    ],
)
def test_bad_input_exits_2_with_a_named_error(argv, match, capsys, tmp_path):
    assert main(argv + ["--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert match in err


def test_bad_input_found_late_still_exits_2_before_writing(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    cfg = tmp_path / "config.json"
    cfg.write_text('{"lr": "x"}')
    cases = [
        (["train", "--config", str(cfg)], "config.lr must be a finite float, got 'x'"),
        (["train", "--out", str(tmp_path / "afile" / "sub")], "cannot create the run folder"),
        (["gate", "--baseline", str(tmp_path), "--update-baseline"], "cannot be written"),
        (["gate", "--baseline", str(tmp_path / "afile" / "b.json"), "--update-baseline"], "cannot be written"),
    ]
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


def test_without_out_the_run_folder_is_runs_timestamp_under_the_working_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--epochs", "1", "--device", "cpu", *TINY]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    assert re.fullmatch(r"\d{8}T\d{6}Z", run.name) and (run / "epochs.csv").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


@pytest.mark.parametrize("argv", [[], ["bogus"], ["gate", "--preset", "nope"], ["train", "--epochs", "x"]])
def test_bad_usage_exits_2(argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


@pytest.mark.smoke
def test_gate_runs_and_writes_its_tables(tmp_path, capsys):
    out = tmp_path / "run"
    # a 4-iteration window holds the target update only if it runs every 4 iterations or more often
    assert (
        main(
            [
                "gate",
                "--epochs",
                "2",
                "--device",
                "cpu",
                "--out",
                str(out),
                "--guard-steps",
                "4",
                *TINY,
                "--set",
                "target_update_interval=2",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "Per-epoch table" in printed and "4 guarded steps" in printed
    assert re.search(r"epoch 1 without hang +no_hang +yes +== yes +PASS", printed)  # the title, its id alongside
    table = pd.read_csv(out / "epochs.csv")
    assert list(table.columns[: len(EPOCH_COLUMNS)]) == EPOCH_COLUMNS
    assert table.epoch.tolist() == [1, 2] and (table.learner_steps == 20).all()
    verdicts = {v["id"]: v for v in json.loads((out / "criteria.json").read_text())}
    assert set(verdicts) >= {"no_stream_sync", "no_single_block_kernels", "smoke_suite"}
    measured = {c for c, v in verdicts.items() if v["status"] == "measured"}
    assert measured == {"no_hang"}  # CPU: the watchdog only (no device: no sync to find)
    assert all(verdicts[c]["verdict"] == "PASS" for c in measured)
    assert verdicts["no_d2d_weight_sync"]["status"] == "not measured (no CUDA)"
    for name in ("no_stream_sync", "no_event_sync", "no_loop_sync"):  # the census: on by default
        assert (verdicts[name]["status"], verdicts[name]["verdict"]) == ("not applicable (no CUDA)", "-"), name
    na = sum(1 for c in CRITERIA if c.hook_column or c.judge == LOOP_CENSUS)  # the sync rows: 3
    assert printed.rstrip().endswith(
        f"PASS (1 measured, 0 reported, {len(CRITERIA) - 1 - na} not measured, {na} not applicable (no CUDA))"
    )
    # the structure census (on by default) has no device work to count on a CPU: its column says so, the rows stay
    # the window's; only its three rows carry the column
    census = {c: v[CENSUS_COLUMN] for c, v in verdicts.items() if v[CENSUS_COLUMN]}
    assert census == dict.fromkeys(
        ["no_d2d_weight_sync", "no_single_block_kernels", "memsets_only_where_needed"], "not applicable (no CUDA)"
    )
    assert "Structure census" in printed and "no D2D weight sync: not applicable (no CUDA)" in printed
    assert not (out / "structure_census.csv").exists()
    # the gate hands the TF32 row to the precision probe (hotloop.guards.gate.judge_precision), never to names
    assert (
        verdicts["tf32_forward_only"]["status"]
        == "not measured (the precision probe covers the hotloop learner's kernels)"
    )
    assert len(json.loads((out / "guard.json").read_text())["per_step"]) == 4
    from hotloop.profiles.kineto_reader import read_kineto
    from hotloop.profiles.trace_counts import step_ranges

    assert len(step_ranges(read_kineto(out / "trace.json.gz"), "step")) == 4  # the loop's own ranges, one repeat
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
    assert (
        main(
            [
                "gate",
                "--epochs",
                "1",
                "--device",
                "cpu",
                "--out",
                str(out),
                "--guard-steps",
                "3",
                *TINY,
                "--set",
                "target_update_interval=100",
            ]
        )
        == 1
    )
    printed = capsys.readouterr().out
    assert "FAIL no event sync [no_event_sync]: measured 1" in printed and "test_cli.py" in printed
    verdicts = {v["id"]: v for v in json.loads((out / "criteria.json").read_text())}
    assert verdicts["no_event_sync"]["verdict"] == "FAIL"
    # the 3-iteration window lacks the target update (every 100): the clean sync row is not measured, not PASS
    assert verdicts["no_stream_sync"]["status"] == "not measured (phase target_update not in window)"


def test_gate_no_loop_census_flag_reaches_the_gate(tmp_path):
    """--no-loop-census turns the census off: the row then says so, where by default the census is on and on a CPU
    says why it measures nothing (no CUDA; test_gate_runs_and_writes_its_tables)."""
    out = tmp_path / "run"
    assert (
        main(
            [
                "gate",
                "--epochs",
                "2",
                "--device",
                "cpu",
                "--out",
                str(out),
                "--guard-steps",
                "4",
                *TINY,
                "--set",
                "target_update_interval=2",
                "--no-loop-census",
            ]
        )
        == 0
    )
    verdicts = {v["id"]: v for v in json.loads((out / "criteria.json").read_text())}
    assert verdicts["no_loop_sync"]["status"] == LOOP_CENSUS_OFF


def test_gate_structure_census_flags_reach_the_gate(tmp_path, capsys):
    """--no-structure-census turns the census off (its column says so); --census-overhead times the loop with and
    without the censuses after the epochs and prints it; a negative count is refused before training."""
    out = tmp_path / "run"
    assert (
        main(
            [
                "gate",
                "--epochs",
                "2",
                "--device",
                "cpu",
                "--out",
                str(out),
                "--guard-steps",
                "4",
                *TINY,
                "--set",
                "target_update_interval=2",
                "--no-structure-census",
                "--census-overhead",
                "1",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    verdicts = {v["id"]: v for v in json.loads((out / "criteria.json").read_text())}
    assert verdicts["no_d2d_weight_sync"][CENSUS_COLUMN] == STRUCTURE_CENSUS_OFF
    assert f"Structure census: {STRUCTURE_CENSUS_OFF}" in printed
    assert "Census overhead (hotloop gate --census-overhead: 1 x 4 iterations per mode" in printed
    overhead = json.loads((out / "guard.json").read_text())["structure_census"]["census_overhead"]
    assert set(overhead["us_per_iteration"]) == {"none", "structure", "both"}
    assert main(["gate", "--device", "cpu", "--out", str(tmp_path / "never"), "--census-overhead", "-1", *TINY]) == 2
    assert "--census-overhead PAIRS must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_train_resumable_config_file(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--epochs", "1", "--device", "cpu", "--out", str(out), *TINY]) == 0
    again = tmp_path / "again"
    assert main(["train", "--config", str(out / "config.json"), "--out", str(again), "--no-progress"]) == 0
    a, b = pd.read_csv(out / "epochs.csv"), pd.read_csv(again / "epochs.csv")
    assert a.loss.tolist() == b.loss.tolist()  # seeded: the same config gives the same run on CPU


def test_hang_exits_3_with_stacks_and_phase(tmp_path):
    # Inject the fault: an epoch far longer than its limit.
    res = _hotloop(
        "gate",
        "--device",
        "cpu",
        "--epoch-timeout",
        "1",
        "--out",
        str(tmp_path / "run"),
        *TINY[:-1],
        "--set",
        "learner_steps_per_epoch=100000",
        "--no-progress",
    )
    assert res.returncode == 3, res.stderr
    assert "HANG: epoch 1 did not finish within 1 s" in res.stderr
    assert "last phase entered:" in res.stderr and "Thread" in res.stderr and "loop.py" in res.stderr


def test_gate_writes_then_compares_a_baseline(tmp_path, capsys):
    base = tmp_path / "baselines" / "cpu.json"
    args = ["gate", "--epochs", "1", "--device", "cpu", "--guard-steps", "2", "--repeats", "2", *TINY]
    assert main([*args, "--out", str(tmp_path / "a"), "--baseline", str(base), "--update-baseline"]) == 0
    written = capsys.readouterr().out
    assert "baseline written" in written and base.exists() and ONE_REPEAT_NOTE not in written
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
    assert f"note: {ONE_REPEAT_NOTE}" in capsys.readouterr().out  # one repeat: the spread is unknown
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
    monkeypatch.setattr(hotloop.guards.gate, "default_baseline", lambda folder=None, preset=None: base)
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


# --- checks before training (issue 22): each case used to train (or make the run folder) and then crash ----------

_RUN = ["--epochs", "1", "--device", "cpu", *TINY]


def _fast(command: str) -> list[str]:
    """One tiny epoch on the CPU (and two guarded steps for the gate)."""
    return [*_RUN, "--guard-steps", "2"] if command == "gate" else _RUN


_ROOT = hasattr(__import__("os"), "geteuid") and __import__("os").geteuid() == 0


@pytest.mark.parametrize(
    "argv,match",
    [
        (["gate", "--inject", "item"], "--inject item: the faults are GPU regressions and need a CUDA device"),
        (["gate", "--inject", "sn_split"], "need a CUDA device"),
        (["train", "--set", "replay_capacity=1e12"], "replay 56.8 TB (replay_capacity=1000000000000"),
        (["gate", "--set", "replay_capacity=1000000000000"], "does not fit in cpu's memory"),
        (["train", "--set", "trunk_hidden=[1e6,1e6]"], "networks 36 TB (trunk_hidden=[1000000, 1000000]"),
        (["gate", "--set", "trunk_hidden=[1000000,1000000]"], "is available"),
        (["train", "--set", "num_envs=10000000000000"], "envs 2.76 PB (num_envs=10000000000000"),
        (
            ["gate", "--set", "learning_starts=2000", "--set", "replay_capacity=1000"],
            "config.learning_starts (2000) exceeds config.replay_capacity (1000)",
        ),
    ],
)
def test_what_can_be_checked_before_training_exits_2_and_writes_nothing(argv, match, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([argv[0], *_fast(argv[0]), *argv[1:], "--out", str(out)])  # argv's --set after TINY's == 2
    err = capsys.readouterr().err
    assert match in err and f"hotloop {argv[0]}: error: " in err
    assert not out.exists()


def test_the_hotloop_learner_without_cuda_is_refused_before_the_run_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the tests' CPU interpreter would run it
    out = tmp_path / "run"
    assert main(["gate", "--set", "learner=hotloop", *_fast("gate"), "--out", str(out)]) == 2
    assert "config.learner 'hotloop' needs a CUDA device" in capsys.readouterr().err
    assert not out.exists()
    assert main(["train", "--set", "learner=hotloop", "--set", "diversity_weight=0.1", *_RUN, "--out", str(out)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err and not out.exists()


def test_the_memory_check_compares_with_the_devices_free_memory(tmp_path, capsys, monkeypatch):
    import hotloop.trainer.memory_estimate as mem

    monkeypatch.setattr(mem, "available_memory", lambda device: (1000, "a stub"))
    out = tmp_path / "run"
    assert main(["train", *_RUN, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "1 kB is available (a stub)" in err and "replay_capacity=100000" in err and not out.exists()


_READ_ONLY_BASELINES = [
    pytest.param(p, id=p)
    for p in ("/sys/hotloop-test-baseline.json", "/proc/version", "/proc/hotloop-test/nvidia-h200.json")
]


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="needs Linux /proc and /sys")
@pytest.mark.parametrize("baseline", _READ_ONLY_BASELINES)
def test_update_baseline_to_a_path_that_cannot_be_written_exits_2_before_training(baseline, tmp_path, capsys):
    # /sys refuses new files and /proc/version writes even for root (whom a chmod never stops)
    out = tmp_path / "run"
    assert main(["gate", "--update-baseline", "--baseline", baseline, *_fast("gate"), "--out", str(out)]) == 2
    assert f"--baseline {baseline} cannot be written" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.skipif(_ROOT, reason="root writes read-only files and folders; the /proc, /sys cases cover it")
def test_update_baseline_into_a_read_only_folder_or_file_exits_2_before_training(tmp_path, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "old.json").write_text("{}")
    (folder / "old.json").chmod(0o444)
    folder.chmod(0o555)
    try:
        for baseline in (folder / "new.json", folder / "sub" / "new.json", folder / "old.json"):
            out = tmp_path / "run"
            argv = ["gate", "--update-baseline", "--baseline", str(baseline), *_fast("gate"), "--out", str(out)]
            assert main(argv) == 2
            assert f"--baseline {baseline} cannot be written" in capsys.readouterr().err
            assert not out.exists()
    finally:
        folder.chmod(0o755)
    assert (folder / "old.json").read_text() == "{}"


def _nested(depth: int) -> str:
    return '{"lr": ' + "[" * depth + "]" * depth + "}"


def test_a_config_or_baseline_nested_100000_deep_exits_2_naming_the_file(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text(_nested(100_000))
    out = tmp_path / "run"
    assert main(["train", "--config", str(deep), "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"config file {deep}: nested too deep" in err and "Traceback" not in err
    deep.write_text('{"schema": 1, "metrics": {"dur_us": {"values": ' + "[" * 100_000 + "]" * 100_000 + "}}}")
    assert main(["gate", "--baseline", str(deep), *_fast("gate"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{deep}: nested too deep" in err and "Traceback" not in err
    assert not out.exists()


# --- crashes: exit 70, one line on stderr, the traceback in the run folder's error.log ---------------------------


def test_a_crash_during_the_run_exits_70_with_the_traceback_in_error_log(tmp_path, capsys, monkeypatch):
    from hotloop.guards.commands.errors import ERROR_LOG, INTERNAL_ERROR
    from hotloop.trainer.loop import Trainer

    def crash(self, epoch):
        raise RuntimeError("injected crash\nwith a second line")

    monkeypatch.setattr(Trainer, "run_epoch", crash)
    for command in ("gate", "train"):
        out = tmp_path / command
        assert main([command, *_fast(command), "--out", str(out)]) == INTERNAL_ERROR == 70
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if "internal error" in line]
        assert lines == [
            f"hotloop {command}: internal error: RuntimeError: injected crash with a second line "
            f"(raised at {__file__}:{crash.__code__.co_firstlineno + 1} in crash; "
            f"full traceback in {out / ERROR_LOG})"
        ], err
        assert "Traceback" not in err and "a criterion" not in err
        log = (out / ERROR_LOG).read_text()
        assert log.startswith("Traceback (most recent call last):") and "in run_epoch" not in log
        assert "RuntimeError: injected crash\nwith a second line" in log and "run_training" in log
        assert (out / "config.json").exists()  # what the run wrote before the crash is kept


def test_a_late_write_failure_is_a_crash_not_a_failed_criterion(tmp_path, capsys, monkeypatch):
    import hotloop.guards.gate

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hotloop.guards.gate, "write_baseline", full_disk)
    out = tmp_path / "run"
    assert (
        main(["gate", *_fast("gate"), "--update-baseline", "--baseline", str(tmp_path / "b.json"), "--out", str(out)])
        == 70
    )
    err = capsys.readouterr().err  # a full disk is still exit 70, said as such (issue 41 item 3)
    assert "hotloop gate: disk full: OSError: [Errno 28] No space left on device" in err and "internal error" not in err
    assert f"{out} keeps its last complete checkpoint (checkpoint.pt): free space on its disk and run it again" in err
    assert "OSError" in (out / "error.log").read_text() and (out / "criteria.csv").exists()


def test_a_crash_before_the_run_folder_exists_saves_the_traceback_in_a_temp_file(tmp_path, capsys, monkeypatch):
    import re
    from pathlib import Path

    import hotloop.guards.commands.checks as checks
    import hotloop.guards.commands.errors as errors

    def broken_env(cfg):
        raise KeyError("a bug in the checks")

    monkeypatch.setattr(checks, "check_env", broken_env)
    monkeypatch.setattr(errors.tempfile, "tempdir", str(tmp_path))
    out = tmp_path / "run"
    assert main(["train", *_RUN, "--out", str(out)]) == 70
    err = capsys.readouterr().err
    m = re.search(
        r"hotloop train: internal error: KeyError: 'a bug in the checks' \(raised at .*test_cli\.py:\d+ "
        r"in broken_env; full traceback in (\S+)\)$",
        err.strip(),
    )
    assert m, err
    log = Path(m[1])
    assert log.parent == tmp_path and log.name.startswith("hotloop-train-error-")
    assert "KeyError: 'a bug in the checks'" in log.read_text()
    assert not out.exists()


def test_ctrl_c_stays_130(tmp_path, capsys, monkeypatch):
    from hotloop.trainer.loop import Trainer

    def interrupt(self, epoch):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "run_epoch", interrupt)
    out = tmp_path / "run"
    assert main(["train", *_RUN, "--out", str(out)]) == 130
    assert f"interrupted; the finished epochs are in {out}" in capsys.readouterr().err
    assert not (out / "error.log").exists()


def test_the_exit_codes_are_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "70 internal error" in out and "1 a criterion or regression failed" in out


def test_a_closed_stdout_is_141_not_a_crash(tmp_path, capsys, monkeypatch):
    import hotloop.guards.commands.train as train

    def closed(*args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(train, "execute", closed)
    assert main(["train", *_RUN, "--out", str(tmp_path / "run")]) == 141
    assert "internal error" not in capsys.readouterr().err and not (tmp_path / "run" / "error.log").exists()


HOLD_LOCK = """
import sys
from hotloop.profiles.run_lock import acquire
lock = acquire(sys.argv[1], create=True)
print("locked", flush=True)
sys.stdin.read()
lock.release()
"""


@pytest.mark.parametrize("command", ["train", "gate", "resume"])
def test_a_second_run_on_a_held_run_folder_exits_2_naming_the_holder(tmp_path, capsys, command):
    run = tmp_path / "run"
    if command == "resume":  # a finished run to resume, then another process takes its folder
        assert main(["train", "--epochs", "1", "--device", "cpu", *TINY, "--out", str(run), "--no-progress"]) == 0
        capsys.readouterr()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = sorted(p.name for p in run.iterdir())
        argv = (
            ["train", "--resume", str(run), "--epochs", "2"]
            if command == "resume"
            else [command, "--epochs", "1", "--device", "cpu", *TINY, "--out", str(run), "--no-progress"]
        )
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"in use by another hotloop run (pid {holder.pid}" in err
        assert sorted(p.name for p in run.iterdir()) == before  # nothing written by the refused run
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)

"""`hotloop gate --update-baseline --baseline FILE` loses no one's file (issue 41 item 2): a file that is not a
baseline (a config JSON, another run's epochs.csv), a FIFO or device, and any path inside a run folder that a live
run holds are refused with exit 2 before anything is trained, naming the file and why; a baseline is replaced
atomically (a new file renamed over the old one, never rewritten in place)."""

import os
import re
from pathlib import Path

import pytest

from hotloop.guards.baselines import load_baseline, write_baseline
from hotloop.guards.cli import main
from hotloop.trainer.config import preset

GATE = [
    "--epochs",
    "1",
    "--device",
    "cpu",
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
    "--guard-steps",
    "2",
]
METRICS = {"gpu_span_us": [10.0, 11.0], "kernels_per_step": [7.0, 7.0]}


def _gate_update(baseline: Path, out: Path) -> int:
    return main(["gate", "--update-baseline", "--baseline", str(baseline), *GATE, "--out", str(out)])


def test_update_baseline_refuses_a_file_that_is_not_a_baseline_before_training(tmp_path, capsys):
    config = tmp_path / "my-config.json"
    preset("cartpole").save(config)
    table = tmp_path / "epochs.csv"
    table.write_text("epoch,learner_steps\n1,20\n")
    for victim in (config, table):
        before = victim.read_bytes()
        out = tmp_path / f"run-{victim.stem}"
        assert _gate_update(victim, out) == 2
        err = capsys.readouterr().err
        assert f"--baseline {victim} cannot be written: it exists and is not a hotloop baseline" in err, err
        assert "Traceback" not in err
        assert victim.read_bytes() == before and not out.exists()  # nothing trained, nothing written


def test_update_baseline_refuses_a_path_in_a_live_runs_folder(tmp_path, capsys, lock_holder):
    live = tmp_path / "live-run"
    live.mkdir()
    (live / "epochs.csv").write_text("epoch,learner_steps\n1,20\n")
    write_baseline(live / "baseline.json", METRICS)  # even a baseline file: the folder is another run's
    before = {p.name: p.read_bytes() for p in live.iterdir()}
    with lock_holder.hold(live) as holder:
        for victim in (live / "epochs.csv", live / "baseline.json", live / "new.json"):
            out = tmp_path / "run"
            assert _gate_update(victim, out) == 2
            err = capsys.readouterr().err
            assert (
                f"--baseline {victim} cannot be written: it lies in the run folder {live}, which another hotloop "
                f"run holds (pid {holder.pid})"
            ) in err, err
            assert not out.exists()
    after = {p.name: p.read_bytes() for p in live.iterdir() if p.name != ".hotloop.lock"}
    assert after == before
    write_baseline(live / "baseline.json", METRICS)  # the holder has ended: a baseline there may be rewritten


def test_check_baseline_target(tmp_path):
    from hotloop.guards.baselines import check_baseline_target

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path, why in (
        (fifo, "it is a FIFO (named pipe), not a baseline file"),
        (tmp_path, "it is a folder"),
        (Path("/dev/null"), "it is a character device"),
    ):
        with pytest.raises(ValueError, match=re.escape(f"{path} cannot be written: {why}")):
            check_baseline_target(path)
    (tmp_path / "empty.json").write_text("")
    for fine in (
        tmp_path / "new.json",
        tmp_path / "sub" / "new.json",
        tmp_path / "empty.json",
        write_baseline(tmp_path / "old.json", METRICS),
    ):
        check_baseline_target(fine)  # nothing to lose, or a baseline: --update-baseline's purpose
    (tmp_path / "cfg.json").write_text('{"lr": 0.001}\n')
    with pytest.raises(ValueError, match="cfg.json cannot be written: it exists and is not a hotloop baseline"):
        write_baseline(tmp_path / "cfg.json", METRICS)  # write_baseline checks again before it writes
    assert (tmp_path / "cfg.json").read_text() == '{"lr": 0.001}\n'


def test_a_baseline_is_replaced_atomically_not_rewritten_in_place(tmp_path):
    path = write_baseline(tmp_path / "b.json", METRICS)
    old = path.read_text()
    os.chmod(path, 0o640)
    os.link(path, tmp_path / "reader.json")  # a reader holding the old file sees it whole, never a mix
    write_baseline(path, {"gpu_span_us": [20.0, 21.0]})
    assert (tmp_path / "reader.json").read_text() == old
    assert load_baseline(path).metrics == {"gpu_span_us": [20.0, 21.0]}
    assert os.stat(path).st_mode & 0o777 == 0o640  # the replaced file's mode kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "reader.json"]  # no temp file left
    link = tmp_path / "link.json"
    link.symlink_to(path)
    write_baseline(link, METRICS)  # a symlink's target is replaced, the link kept
    assert link.is_symlink() and load_baseline(path).metrics == METRICS

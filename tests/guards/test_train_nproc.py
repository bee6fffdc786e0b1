"""`hotloop train --nproc N` (hotloop.guards.data_parallel): a 2-rank gloo run on the CPU through torchrun (rank 0
writes the run folder, rank 1 rank1/, both their traces; the ranks' learned parameters are identical), the
arguments each rank gets, and --nproc's checks (exit 2 before anything is launched or written)."""

import subprocess
import sys

import pytest
import torch

from hotloop.guards.commands.main import build_parser, main
from hotloop.guards.commands.train import TrainOptions
from hotloop.guards.data_parallel import check_nproc, rank_folder, torchrun_command
from hotloop.trainer.checkpoint import load_checkpoint


@pytest.mark.slow
def test_two_ranks_on_the_cpu_write_their_folders_and_agree(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hotloop.guards.cli",
            "train",
            "--nproc",
            "2",
            "--device",
            "cpu",
            "--preset",
            "cartpole",
            "--epochs",
            "1",
            "--set",
            "learner_steps_per_epoch=20",
            "--set",
            "learning_starts=100",
            "--set",
            "log_interval=10",
            "--trace-steps",
            "3",
            "--no-progress",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"run folder: {out} (2 ranks, gloo)" in proc.stdout
    assert (out / "epochs.csv").is_file() and (out / "trace_rank0.json.gz").is_file()
    assert (out / "rank1" / "trace_rank1.json.gz").is_file() and not (out / "rank1" / "rank1").exists()
    best0, best1 = (load_checkpoint(f)[0] for f in (out / "best.pt", out / "rank1" / "best.pt"))
    assert best0.keys() == best1.keys() and all(torch.equal(best0[k], best1[k]) for k in best0)
    inspected = subprocess.run(
        [sys.executable, "-m", "hotloop.guards.cli", "inspect", str(out)], capture_output=True, text=True, timeout=120
    )
    assert inspected.returncode == 0 and f"== ranks of {out} (2 of 2 rank traces read" in inspected.stdout


def test_each_rank_gets_the_config_choice_and_the_launchers_folder(tmp_path):
    args = build_parser().parse_args(
        [
            "train",
            "--nproc",
            "2",
            "--preset",
            "cartpole",
            "--set",
            "lr=0.001",
            "--seed",
            "3",
            "--device",
            "cpu",
            "--no-progress",
            "--trace-steps",
            "4",
        ]
    )
    options = TrainOptions.from_args(args)
    rank_args = options.rank_args(tmp_path)
    assert rank_args == [
        "--preset",
        "cartpole",
        "--set",
        "lr=0.001",
        "--device",
        "cpu",
        "--seed",
        "3",
        "--out",
        str(tmp_path),
        "--epoch-timeout",
        "900.0",
        "--trace-steps",
        "4",
        "--no-progress",
    ]
    again = TrainOptions.from_args(build_parser().parse_args(["train", *rank_args]))
    assert again.config == options.config and again.nproc is None
    cmd = torchrun_command(2, rank_args)
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert cmd[-len(rank_args) - 2 :] == ["hotloop.guards.cli", "train", *rank_args]
    assert rank_folder(tmp_path, 0) == tmp_path and rank_folder(tmp_path, 3) == tmp_path / "rank3"


@pytest.mark.parametrize("nproc", [0, -1, True, 2.0])
def test_check_nproc_refuses_what_is_not_an_int_from_1(nproc):
    with pytest.raises(ValueError, match="--nproc must be an int >= 1"):
        check_nproc(nproc, torch.device("cpu"))


def test_check_nproc_refuses_more_ranks_than_the_host_memory_holds():
    gb = (10**9, "a test's 1 GB")
    assert check_nproc(3, torch.device("cpu"), available=gb) == 3  # 3 x 280 MB
    with pytest.raises(ValueError, match=r"--nproc 4: 4 ranks need .* at most 3 ranks fit"):
        check_nproc(4, torch.device("cpu"), available=gb)
    with pytest.raises(ValueError, match="at most 1 ranks fit"):  # the run's own bytes count per rank
        check_nproc(2, torch.device("cpu"), rank_bytes=400 * 10**6, available=gb)
    assert check_nproc(64, torch.device("cpu"), available=(None, "unreadable")) == 64


def test_check_nproc_on_cuda_counts_the_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_nproc(2, torch.device("cuda")) == 2
    with pytest.raises(ValueError, match="this host has 2"):
        check_nproc(3, torch.device("cuda"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--nproc", "0"], "--nproc must be an int >= 1"),
        (["--nproc", "2", "--trace-steps", "-1"], "--trace-steps must be >= 0"),
        (["--nproc", "2", "--resume", "somewhere"], "cannot resume"),
        (["--nproc", "100000"], "at most"),
    ],
)
def test_bad_nproc_invocations_exit_2_before_anything_is_written(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--device", "cpu", *argv]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_nproc_under_torchrun_is_refused(monkeypatch, tmp_path, capsys):
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--device", "cpu", "--nproc", "2"]) == 2
    assert "under torchrun, leave it out" in capsys.readouterr().err

"""A tiny CPU `hotloop train` run carries the optional columns (NaN on CPU), writes epochs.png, and reports."""

import pandas as pd

from hotloop.profiles.epoch_table import EPOCH_COLUMNS, OPTIONAL_COLUMNS
from hotloop.guards.cli import main

TINY = ["--set", "learner_steps_per_epoch=10", "--set", "learning_starts=32", "--set", "batch_size=16",
        "--set", "trunk_hidden=[8]", "--set", "head_hidden=4", "--set", "eval_episodes=0", "--no-progress"]


def test_train_writes_optional_columns_and_plot_then_report_reads_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--epochs", "2", "--device", "cpu", "--out", str(out), *TINY]) == 0
    table = pd.read_csv(out / "epochs.csv")
    assert list(table.columns[:len(EPOCH_COLUMNS) + len(OPTIONAL_COLUMNS)]) == EPOCH_COLUMNS + OPTIONAL_COLUMNS
    assert table[OPTIONAL_COLUMNS].isna().all().all()  # no GPU, no NVML, no guard counts on a CPU run
    assert (out / "epochs.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    assert main(["report", str(out), str(out)]) == 0
    cmp = capsys.readouterr().out
    assert "wall_s" in cmp and "run2_run1_ratio" in cmp

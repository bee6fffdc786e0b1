"""A tiny CPU `hotloop train` run carries the optional columns (NaN on CPU), writes epochs.png, and reports; the
per-epoch table is replaced atomically (a write killed part-way leaves the old table whole)."""

import pandas as pd
import pytest

from hotloop.guards.cli import main
from hotloop.profiles.epoch_table import EPOCH_COLUMNS, OPTIONAL_COLUMNS

TINY = [
    "--set",
    "learner_steps_per_epoch=10",
    "--set",
    "learning_starts=32",
    "--set",
    "batch_size=16",
    "--set",
    "trunk_hidden=[8]",
    "--set",
    "head_hidden=4",
    "--set",
    "eval_episodes=0",
    "--no-progress",
]


def test_train_writes_optional_columns_and_plot_then_report_reads_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--epochs", "2", "--device", "cpu", "--out", str(out), *TINY]) == 0
    table = pd.read_csv(out / "epochs.csv")
    assert list(table.columns[: len(EPOCH_COLUMNS) + len(OPTIONAL_COLUMNS)]) == EPOCH_COLUMNS + OPTIONAL_COLUMNS
    assert table[OPTIONAL_COLUMNS].isna().all().all()  # no GPU, no NVML, no guard counts on a CPU run
    assert (out / "epochs.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    assert main(["report", str(out), str(out)]) == 0
    cmp = capsys.readouterr().out
    assert "wall_s" in cmp and "run2_run1_ratio" in cmp


def _frame(n: int) -> pd.DataFrame:
    from hotloop.profiles.epoch_table import epoch_frame

    return epoch_frame(
        [{c: float(e) for c in EPOCH_COLUMNS} | {"epoch": e, "clocks_event_reasons": "none"} for e in range(1, n + 1)]
    )


@pytest.mark.parametrize("fail_at", ["write", "os.replace"])
def test_write_table_killed_part_way_leaves_the_old_table_whole(tmp_path, monkeypatch, fail_at):
    import os

    from hotloop.profiles.epoch_table import write_table

    write_table(_frame(2), tmp_path, "epochs")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert sorted(before) == ["epochs.csv", "epochs.md"]
    real_fsync = os.fsync

    def dies_after_half_the_bytes(fd):  # the temp file holds part of the new table when the "kill" comes
        os.ftruncate(fd, os.fstat(fd).st_size // 2)
        real_fsync(fd)
        raise KeyboardInterrupt("killed while writing")

    def dies_at_rename(src, dst):
        raise KeyboardInterrupt("killed at the rename")

    if fail_at == "write":
        monkeypatch.setattr(os, "fsync", dies_after_half_the_bytes)
    else:
        monkeypatch.setattr(os, "replace", dies_at_rename)
    with pytest.raises(KeyboardInterrupt, match="killed"):
        write_table(_frame(3), tmp_path, "epochs")
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # old files intact, no temp file left
    assert pd.read_csv(tmp_path / "epochs.csv").epoch.tolist() == [1, 2]
    write_table(_frame(3), tmp_path, "epochs")
    assert pd.read_csv(tmp_path / "epochs.csv").epoch.tolist() == [1, 2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epochs.csv", "epochs.md"]
    assert len((tmp_path / "epochs.md").read_text().splitlines()) == 2 + 3  # header, rule, three rows


def test_write_table_files_get_the_usual_mode(tmp_path):
    import os
    import stat

    from hotloop.profiles.epoch_table import write_table

    mask = os.umask(0o022)
    try:
        paths = write_table(_frame(1), tmp_path, "epochs")
    finally:
        os.umask(mask)
    assert paths == [tmp_path / "epochs.csv", tmp_path / "epochs.md"]
    assert [stat.S_IMODE(p.stat().st_mode) for p in paths] == [0o644, 0o644]  # as a plain open makes them

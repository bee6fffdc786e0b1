"""The data-parallel scaling table (lab.dp_scaling): the first epoch left out, iteration time and efficiency from
each run's epochs.csv, bad folders and arguments refused by name."""

import pandas as pd
import pytest

from lab.dp_scaling import COLUMNS, main, scaling


def _run(folder, steps_per_s: list[float], steps: int = 1000):
    folder.mkdir(parents=True)
    wall = [steps / s for s in steps_per_s]
    pd.DataFrame(
        {"epoch": range(1, len(wall) + 1), "learner_steps": steps, "wall_s": wall, "learner_steps_per_s": steps_per_s}
    ).to_csv(folder / "epochs.csv", index=False)
    return folder


def test_the_first_epoch_is_left_out_and_efficiency_is_total_steps_over_one_process(tmp_path):
    one = _run(tmp_path / "one", [100.0, 5000.0, 4000.0, 5000.0])  # the first epoch compiles: left out
    two = _run(tmp_path / "two", [90.0, 4500.0, 4500.0, 4400.0])
    four = _run(tmp_path / "four", [80.0, 2500.0, 2500.0, 2500.0])
    t = scaling(one, {4: four, 2: two})
    assert list(t.columns) == COLUMNS and t["world_size"].tolist() == [1, 2, 4]
    assert t["epochs"].tolist() == [3, 3, 3]
    assert t["learner_steps_per_s"].tolist() == [5000.0, 4500.0, 2500.0]
    assert t["total_steps_per_s"].tolist() == [5000.0, 9000.0, 10000.0]
    assert t["efficiency"].tolist() == [1.0, 1.8, 2.0]
    assert t.loc[0, "iteration_ms"] == pytest.approx(0.2)  # median of 1000 steps in 0.2, 0.25, 0.2 s


def test_main_writes_the_csv(tmp_path, capsys):
    one = _run(tmp_path / "one", [1.0, 10.0])
    two = _run(tmp_path / "two", [1.0, 8.0])
    out = tmp_path / "scaling.csv"
    assert main([str(one), f"2={two}", "--csv", str(out)]) == 0
    assert pd.read_csv(out)["efficiency"].tolist() == [1.0, 1.6]
    assert "efficiency" in capsys.readouterr().out


def test_bad_folders_and_arguments_are_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit, match=f"{tmp_path}: no epochs.csv"):
        main([str(tmp_path)])
    one = _run(tmp_path / "one", [10.0])
    with pytest.raises(SystemExit, match="1 epoch\\(s\\); the scaling needs 2 or more"):
        main([str(one)])
    with pytest.raises(SystemExit):
        main([str(one), "two"])
    assert "expected N=DIR with N an int >= 1, got 'two'" in capsys.readouterr().err

"""The evaluation-paths bench (lab.eval_paths_bench): bad input refused by name before any work; on a GPU, end to
end on a short trained run: one row per path, every path's returns equal to the graph's."""

import csv

import pytest

from hotloop.kernels.greedy_eval import EVAL_TILES
from lab.eval_paths_bench import CANDIDATES, COLUMNS, main


def test_a_folder_without_a_best_policy_is_refused_by_name(tmp_path):
    with pytest.raises(SystemExit, match=f"{tmp_path}: no best.pt"):
        main([str(tmp_path)])


def test_repeats_below_one_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--repeats", "0"])
    assert "--repeats must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.gpu
def test_every_path_times_and_equals_the_graph_on_the_gpu(tmp_path):
    from hotloop.guards.run import run_training
    from hotloop.trainer.config import preset

    cfg = preset("cartpole-fast", device="cuda", epochs=2, learner_steps_per_epoch=200, seed=1)
    (tmp_path / "run").mkdir()  # run_training trains into an existing folder (the CLI creates it)
    run_training(cfg, tmp_path / "run", 300.0, show_progress=False)
    out = tmp_path / "bench.csv"
    assert main([str(tmp_path / "run"), "--repeats", "2", "--csv", str(out)]) == 0
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == COLUMNS and [r["path"] for r in rows] == ["graph"] + ["fused"] * len(CANDIDATES)
    timed = [r for r in rows if not r["note"]]  # a tiling too big for this GPU's shared memory has a note instead
    default = "x".join(map(str, EVAL_TILES))
    assert rows[0] in timed and any(r["tiles"] == default for r in timed), rows
    assert all(r["note"].startswith("out of resource") for r in rows if r not in timed), rows
    assert all(r["equal"] == "True" and float(r["median_ms"]) > 0 for r in timed), rows

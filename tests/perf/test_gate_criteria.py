"""`pytest -m perf`: the gate's criteria (guards/criteria.py) as tests, on the hotloop learner's real step on a GPU.

One module-scoped run: the configuration of this GPU's baseline (guards/baseline_files/<gpu-name-slug>.json, written by
`hotloop gate --update-baseline`) for one epoch, else the cartpole preset; then the gate's guarded window: K
consecutive iterations of the training loop (`Trainer.iterate`: actor graph, learner graph, the periodic readback,
the progress callback; K = max(20, the longest period), hotloop.guards.gate.guard_loop), as `hotloop gate` guards
them; a criterion on a phase that configuration leaves out (spectral norm: PHASE_SETTINGS) is judged on a second
run with it put back. Each criterion the guard measures is one test (the reported-only rows have no limit); the
structural counts (syncs, kernels, grid (1,1,1), D2D copies, memsets, spectral-norm launches, GEMM precision) must
equal the baseline's exactly. Timings are never asserted here: `hotloop gate` compares them with the
baseline's noise-aware rule (guards/baselines.py).
"""

from __future__ import annotations

import dataclasses

import pytest

from hotloop.guards.baselines import compare, is_count, load_baseline
from hotloop.guards.criteria import CRITERIA, REPORT
from hotloop.guards.gate import GUARD_WINDOW, LEGACY_WINDOW, default_baseline, guard_loop
from hotloop.trainer.config import Config, preset
from hotloop.trainer.loop import Trainer

GUARDED = [c.id for c in CRITERIA if c.measured_by is None and c.comparison != REPORT]
"""Ids of the criteria a guarded window judges (the others are the watchdog's and pytest's own, or reported only)."""
BY_ID = {c.id: c for c in CRITERIA}


def _baseline():
    path = default_baseline()
    return (path, load_baseline(path)) if path.exists() else (path, None)


PHASE_SETTINGS = {"spectral_norm": {"spectral_norm": True}}
"""Phases a configuration may leave out (the cartpole preset trains without spectral norm), with the settings that
put each back: a criterion on such a phase is tested on the baseline's configuration with them."""


def _config() -> Config:
    path, base = _baseline()
    if base is not None and base.config:  # its fields this Config still has, on this GPU
        known = {f.name for f in dataclasses.fields(Config)}
        return Config.from_dict({**{k: v for k, v in base.config.items() if k in known}, "epochs": 1, "device": "cuda"})
    return preset("cartpole", device="cuda", epochs=1)


def _guarded(cfg: Config):
    trainer = Trainer(cfg)
    trainer.run_epoch(1)
    assert trainer.learner_kind == "hotloop" and trainer.learner.graph is not None
    report = guard_loop(trainer, warmup=3)
    assert report.window["missing"] == [], report.coverage  # every periodic phase ran in the window
    return report


@pytest.fixture(scope="module")
def hot_report():
    return _guarded(_config())


@pytest.fixture(scope="module")
def reports(hot_report):
    """The guarded report for a criterion: hot_report, or one with the criterion's phase put back."""
    cfg, made = _config(), {}

    def for_criterion(name: str):
        wanted = PHASE_SETTINGS.get(BY_ID[name].phases, {})
        missing = {k: v for k, v in wanted.items() if getattr(cfg, k) != v}
        if not missing:
            return hot_report
        key = tuple(sorted(missing.items()))
        if key not in made:
            made[key] = _guarded(dataclasses.replace(cfg, **missing))
        return made[key]

    return for_criterion


@pytest.mark.perf
@pytest.mark.parametrize("criterion", GUARDED)
def test_gate_criterion_holds_on_the_hot_step(reports, assert_criteria, criterion):
    report = reports(criterion)
    row = report.verdicts.set_index("id").loc[criterion]
    assert row.status == "measured", f"{criterion}: {row.status}"  # a row not measured would pass vacuously
    assert_criteria(report, only=[criterion])


@pytest.mark.perf
def test_structural_counts_equal_this_gpus_baseline(hot_report):
    path, base = _baseline()
    if base is None:
        pytest.skip(f"no baseline for this GPU at {path}: write one with `hotloop gate --update-baseline`")
    window = (base.config or {}).get("guard_window", LEGACY_WINDOW)
    if window != GUARD_WINDOW:
        pytest.skip(
            f"the baseline {path} was measured over another window ({window!r}, not {GUARD_WINDOW!r}): "
            f"re-record it with `hotloop gate --repeats 5 --update-baseline`"
        )
    counts = {m: [v] for m, v in hot_report.medians.items() if is_count(m)}
    table = compare(counts, base)
    table = table[table.kind.eq("count")]
    assert len(table) >= 10 and not table.verdict.eq("FAIL").any(), table[table.verdict.eq("FAIL")].to_string(
        index=False
    )

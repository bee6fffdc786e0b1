"""`hotloop bench` (guards/probes/bench.py, the CLI subcommand): the roofline floor by hand, the table on the CPU (eager
and the loop iteration measured, captured variants skipped, the iteration row first), files written and never
overwritten, bad input exits 2."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import pandas as pd
import pytest
import torch

from hotloop.guards.cli import main
from hotloop.guards.guard import guard_steps
from hotloop.guards.probes.bench import (
    BENCH_COLUMNS,
    GUARD_STEP_RANGE,
    LEVERS,
    VARIANTS,
    expand_variants,
    gap_file,
    guard_summary,
    guard_variant,
    kernel_gaps_note,
    lever_switches,
    roofline_counts,
    roofline_floor_us,
    run_bench,
)
from hotloop.guards.probes.bench_variants import build_eager
from hotloop.profiles.kernel_gaps import GAP_COLUMNS, SUMMARY_NAME
from hotloop.trainer.config import preset
from hotloop.trainer.network import BranchingDuelingQNet

CPU = torch.device("cpu")


def _cfg(**kw):
    return preset(
        "cartpole", **{"batch_size": 16, "replay_capacity": 256, "trunk_hidden": (16,), "head_hidden": 8, **kw}
    )


@pytest.mark.smoke
def test_roofline_by_hand_on_a_tiny_config():
    # obs 3, trunk (4,), head 2, one branch of 2 actions, B = 5.
    # Layers (in, out): trunk 3x4, value 4x2 and 2x1, branch 4x2 and 2x2 -> S = 12 + 8 + 2 + 8 + 4 = 34.
    cfg = preset("cartpole", batch_size=5, replay_capacity=8, trunk_hidden=(4,), head_hidden=2, spectral_norm=True)
    c = roofline_counts(cfg, 3, (2,))
    assert c["weights"] == 34
    # P = weights 34 + biases (4 + 2 + 1 + 2 + 2 = 11) + one spectral-norm gain per matrix (5) = 50
    assert c["params"] == 50 == sum(p.numel() for p in BranchingDuelingQNet(3, (2,), (4,), 2).parameters())
    assert c["flops_fwd"] == 3 * 2 * 5 * 34 == 1020  # three forwards
    assert c["flops_bwd"] == 2 * 5 * (2 * 34 - 12) == 560  # dX and dW per layer, no dX for the 3x4 input layer
    # bytes: batch 2*5*3*4 + 5*1*8 + 3*5*4 = 220; activations 2*5*11*4 = 440; params (3 + 1 + 7)*50*4 = 2200;
    # spectral norm 34*4 = 136
    assert c["bytes"] == 220 + 440 + 2200 + 136 == 2996
    # 1e-6 TFLOP/s = 1 FLOP/us, 1e-3 GB/s = 1 byte/us
    assert roofline_floor_us(cfg, 3, (2,), 1e-6, 1e-6, 1e-3) == pytest.approx(2996.0)  # byte-bound
    assert roofline_floor_us(cfg, 3, (2,), 1e-6, 0.5e-6, 1.0) == pytest.approx(1020 + 1120)  # FLOP-bound
    no_sn = roofline_counts(dataclasses.replace(cfg, spectral_norm=False), 3, (2,))
    assert no_sn["params"] == 45 and no_sn["bytes"] == 220 + 440 + 11 * 45 * 4


def test_roofline_at_seed_scale_is_flop_bound_near_70_us():
    cfg = preset("seed-scale")
    floor = roofline_floor_us(cfg, 64, (4, 4, 4))
    assert 60 < floor < 80
    assert roofline_counts(cfg, 64, (4, 4, 4))["weights"] == 246_800


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"peak_gbs": 0}, "peak_gbs"),
        ({"peak_tflops_fwd": float("nan")}, "peak_tflops_fwd"),
        ({"peak_tflops_bwd": -1.0}, "peak_tflops_bwd"),
    ],
)
def test_roofline_bad_peaks(kw, match):
    with pytest.raises(ValueError, match=match):
        roofline_floor_us(_cfg(), 4, (2,), **kw)


def test_run_bench_on_cpu_measures_eager_and_skips_the_graph(tmp_path, capsys):
    out = tmp_path / "bench"
    df = run_bench(_cfg(), CPU, ["eager", "graph-fp32"], steps=5, warmup=1, out_dir=out)
    assert list(df.columns) == BENCH_COLUMNS and list(df["variant"]) == ["eager", "graph-fp32"]
    eager, graph = df.iloc[0], df.iloc[1]
    assert math.isfinite(eager["us_per_step_p50"]) and eager["us_per_step_p50"] > 0
    assert eager["us_per_step_p20"] <= eager["us_per_step_p50"] <= eager["us_per_step_p80"]
    assert eager["steps"] == 5 and eager["setup_kind"] == "none" and eager["precision"] == "fp32"
    assert math.isnan(eager["kernels_per_step"]) and math.isnan(eager["ratio_to_hotloop"])
    assert math.isnan(eager["kernels_grid1_per_step"])
    assert graph[["us_per_step_p20", "us_per_step_p50", "us_per_step_p80", "setup_s"]].isna().all()
    assert "needs CUDA" in graph["note"] and graph["steps"] == 0 and graph["precision"] == "fp32"
    assert (df["gpu"] == "cpu").all() and (df["roofline_floor_us"] > 0).all() and df["commit"].str.len().gt(0).all()
    csv = pd.read_csv(out / "bench.csv")
    assert list(csv.columns) == BENCH_COLUMNS and len(csv) == 2
    md = (out / "bench.md").read_text()
    assert all(c in md.splitlines()[0] for c in BENCH_COLUMNS)
    assert "eager" in capsys.readouterr().out
    with pytest.raises(ValueError, match="already holds bench.csv"):
        run_bench(_cfg(), CPU, ["eager"], steps=1, out_dir=out)


def test_a_failing_variant_is_a_row_and_ratio_to_hotloop_uses_the_hotloop_row(monkeypatch):
    def broken(cfg, device):
        raise KeyError("boom")

    def fake_hotloop(cfg, device):
        return build_eager(cfg, device)._replace(name="hotloop", precision="split")

    def slow_eager(cfg, device):
        v = build_eager(cfg, device)
        return v._replace(step=lambda: (v.step(), v.step()))

    df = run_bench(
        _cfg(),
        CPU,
        ["broken", "slow", "hotloop"],
        steps=3,
        warmup=0,
        extra_variants={"broken": broken, "hotloop": fake_hotloop, "slow": slow_eager},
    )
    broken_row, slow, hot = (df.set_index("variant").loc[n] for n in ("broken", "slow", "hotloop"))
    assert "KeyError" in broken_row["note"] and "boom" in broken_row["note"] and math.isnan(broken_row["setup_s"])
    assert hot["ratio_to_hotloop"] == 1.0 and hot["precision"] == "split"
    assert slow["ratio_to_hotloop"] == pytest.approx(slow["us_per_step_p50"] / hot["us_per_step_p50"])


def _tiny_loop(**kw):
    """`_cfg` with a loop small enough for the CPU: 4 envs, 32 prefill transitions, no evaluation env, and the
    reference learner's target update every 3 steps (the iteration's periodic phase)."""
    return _cfg(**{"num_envs": 4, "learning_starts": 32, "eval_episodes": 0, "target_update_interval": 3, **kw})


def test_the_iteration_row_leads_and_times_whole_periods_on_the_cpu():
    df = run_bench(_tiny_loop(), CPU, ["eager", "iteration"], steps=4, warmup=1)
    assert list(df["variant"]) == ["iteration", "eager"] and list(df.columns) == BENCH_COLUMNS
    it = df.iloc[0]
    q = it[["us_per_step_p20", "us_per_step_p50", "us_per_step_p80"]].astype(float)
    assert q.map(math.isfinite).all() and 0 < q.iloc[0] <= q.iloc[1] <= q.iloc[2]
    assert it["steps"] == 6  # 4 rounded up to whole periods of the target update (every 3 steps)
    assert "6 timed steps (2 x 3), mean" in it["note"] and "Trainer.iterate(1)" in it["note"]
    assert it["setup_kind"] == "trainer" and it["setup_s"] > 0 and it["precision"] == "fp32"  # reference on CPU
    assert math.isnan(it["kernels_per_step"]) and math.isnan(it["kernels_grid1_per_step"])  # no CUDA
    assert math.isnan(it["ratio_to_hotloop"]) and it["roofline_floor_us"] == df.iloc[1]["roofline_floor_us"]
    assert df.iloc[1]["steps"] == 4  # the learner-step rows time exactly --steps


def test_a_failing_iteration_build_is_a_nan_row_that_still_leads(monkeypatch):
    def broken_trainer(cfg):
        raise OSError(f"no env on {cfg.device}")

    monkeypatch.setattr("hotloop.trainer.loop.Trainer", broken_trainer)
    df = run_bench(_tiny_loop(), CPU, ["eager", "iteration"], steps=2, warmup=0)
    it, eager = df.iloc[0], df.iloc[1]
    assert it["variant"] == "iteration" and it["steps"] == 0 and it["setup_kind"] == "trainer+captures"
    assert it["note"] == "OSError: no env on cpu"
    assert it[["us_per_step_p50", "kernels_per_step", "kernels_grid1_per_step", "setup_s"]].isna().all()
    assert eager["steps"] == 2 and math.isfinite(eager["us_per_step_p50"])


def test_expand_variants():
    assert expand_variants("all") == list(VARIANTS) and list(VARIANTS)[0] == "iteration"
    assert expand_variants("graph,eager,graph-fp32") == ["graph-fp32", "graph-tf32", "eager"]
    assert expand_variants(["compiled"]) == ["compiled-split", "compiled-tf32"]
    assert expand_variants("mine,eager", {"mine": build_eager}) == ["mine", "eager"]
    for bad in ("eagr", "", "eager,,graph"):
        with pytest.raises(ValueError, match="valid variants: .*eager, graph-fp32"):
            expand_variants(bad)
    with pytest.raises(ValueError, match="valid variants: iteration, eager, graph-fp32"):
        expand_variants("eagr")


@pytest.mark.parametrize(
    "kw,match", [({"steps": 0}, "steps"), ({"warmup": -1}, "warmup"), ({"variants": ["nope"]}, "unknown variant")]
)
def test_run_bench_bad_input(kw, match):
    args = {"variants": ["eager"], "steps": 1, "warmup": 0, **kw}
    with pytest.raises(ValueError, match=match):
        run_bench(_cfg(), CPU, **args)


def test_guard_summary_reads_the_kernels_column():
    x = torch.randn(8, 8)
    report = guard_steps(lambda: x @ x, steps=2, warmup=0, step_range="bench_step")
    kernels, grid1, note = guard_summary(report, steps=2)
    if not report.cuda:
        assert math.isnan(kernels) and math.isnan(grid1) and note == ""
        report = dataclasses.replace(
            report,
            cuda=True,
            medians={**report.medians, "kernels_grid1": 3.0},
            gemms=pd.DataFrame(
                {
                    "phase": ["", "", ""],
                    "precision": ["tf32", "fp32", "gemm"],
                    "name": ["a", "b", "c"],
                    "kernels": [6, 4, 2],
                }
            ),
        )
        kernels, grid1, note = guard_summary(report, steps=2)
        assert grid1 == 3.0
        no_grid1 = {k: v for k, v in report.medians.items() if k != "kernels_grid1"}
        assert math.isnan(guard_summary(dataclasses.replace(report, medians=no_grid1), steps=2)[1])
    assert kernels == report.medians["kernels"] and grid1 == report.medians["kernels_grid1"]
    if not torch.cuda.is_available():
        assert note == "gemms/step tf32=3 fp32=2 other=1"


def _gap_trace(path, gaps, range_name=GUARD_STEP_RANGE):
    """A Kineto trace of len(gaps) guarded steps (`range_name` ranges), each launching two kernels on stream 7:
    "a" (64 programs: under one wave of 132 SMs) then "b" (200 programs) `gaps[i]` us after "a" ends."""
    base, events, corr = 1_790_857_026_000.0, [], 10
    for i, gap in enumerate(gaps):
        cpu = base + 1000.0 * i
        events.append(dict(ph="X", cat="user_annotation", name=range_name, pid=1, tid=1, ts=cpu, dur=800.25))
        start = cpu + 30.5
        for name, grid, dur in (("a", [64, 1, 1], 7.25), ("b", [200, 1, 1], 3.5)):
            corr += 1
            events.append(
                dict(
                    ph="X",
                    cat="cuda_runtime",
                    name="cudaLaunchKernel",
                    pid=1,
                    tid=1,
                    ts=cpu + corr % 7 + 1,
                    dur=2.5,
                    args={"correlation": corr},
                )
            )
            events.append(
                dict(
                    ph="X",
                    cat="kernel",
                    name=name,
                    pid=0,
                    tid=7,
                    ts=start,
                    dur=dur,
                    args={"correlation": corr, "stream": 7, "device": 0, "grid": grid},
                )
            )
            start += dur + gap
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_kernel_gaps_note_writes_the_table_beside_the_bench(tmp_path, capsys):
    gaps = sorted(random.uniform(0.5, 9.5) for _ in range(3))
    trace = _gap_trace(tmp_path / "trace.json", [gaps[2], gaps[0], gaps[1]])
    note = kernel_gaps_note("hotloop", trace, tmp_path / "out", 132)
    assert note == f"kernel gaps: idle {gaps[1]:.1f} us/step, 1 kernels under one wave"
    table = pd.read_csv(tmp_path / "out" / "kernel_gaps_hotloop.csv")
    assert list(table.columns) == list(GAP_COLUMNS) and list(table["name"]) == ["a", "b", SUMMARY_NAME]
    assert table["idle_gap_us"].iloc[1] == pytest.approx(gaps[1], abs=1e-3)
    assert "hotloop bench: hotloop: kernel gaps: 2 kernels/step, idle " in capsys.readouterr().err
    other = _gap_trace(tmp_path / "other.json", [1.5], range_name="step")  # no guarded-step range: said, no file
    note = kernel_gaps_note("iteration", other, tmp_path / "out", 132)
    assert note.startswith("kernel gaps not measured: KernelGapError: no step ranges named 'bench_step'")
    assert not (tmp_path / "out" / "kernel_gaps_iteration.csv").exists()


def test_lever_variants_are_the_hotloop_row_with_config_switches_on():
    assert lever_switches("hotloop") is None and lever_switches("eager") is None
    assert lever_switches("hotloop:dependent_launch") == ("dependent_launch",)
    assert expand_variants("hotloop,hotloop:dependent_launch") == ["hotloop", "hotloop:dependent_launch"]
    assert gap_file("hotloop:dependent_launch") == "kernel_gaps_hotloop-dependent_launch.csv"
    assert set(LEVERS) <= {f.name for f in dataclasses.fields(_cfg())}  # each lever is a Config switch
    for bad in ("hotloop:nope", "hotloop:", "hotloop:dependent_launch+dependent_launch"):
        with pytest.raises(ValueError, match="levers must be distinct names of dependent_launch, grouped_forward"):
            expand_variants(bad)
    # one canonical name per set of switches: order and spaces do not make another variant
    assert expand_variants("hotloop:grouped_forward+dependent_launch,hotloop: dependent_launch + grouped_forward") == [
        "hotloop:dependent_launch+grouped_forward"
    ]
    # timed against a hotloop row with every lever off: a config with one on is refused before any work
    with pytest.raises(ValueError, match="the config has dependent_launch on: leave it off"):
        run_bench(_cfg(dependent_launch=True), CPU, ["hotloop", "hotloop:grouped_forward"], steps=1)
    # built as the hotloop row with the switch on: on the CPU that build says it needs CUDA, naming the variant
    df = run_bench(_cfg(), CPU, ["hotloop:dependent_launch"], steps=1, warmup=0)
    assert df["note"].tolist() == ["skipped: hotloop:dependent_launch: needs CUDA (the step is a captured CUDA graph)"]


@pytest.mark.parametrize(
    "name,kept", [("hotloop", True), ("iteration", True), ("hotloop:dependent_launch", True), ("eager", False)]
)
def test_guard_variant_keeps_the_trace_of_the_gap_variants_only(tmp_path, monkeypatch, name, kept):
    """The guard's trace is kept (and tabulated) for the "hotloop" and "iteration" rows alone: `guard_steps` is
    replaced by one that writes a guarded-step trace where it is asked to keep one."""
    import hotloop.guards.guard as guard

    seen = {}
    real = guard_steps(lambda: None, steps=1, warmup=0, step_range=GUARD_STEP_RANGE)

    def fake_guard_steps(step, steps, warmup, step_range, trace_path=None, **kw):
        seen.update(steps=steps, warmup=warmup, step_range=step_range, trace_path=trace_path)
        if trace_path is not None:
            _gap_trace(Path(trace_path), [2.5, 3.5, 4.5])
        return dataclasses.replace(real, cuda=True, medians={"kernels": 2.0, "kernels_grid1": 0.0})

    monkeypatch.setattr(guard, "guard_steps", fake_guard_steps)
    kernels, grid1, note = guard_variant(name, lambda: None, CPU, tmp_path)
    assert (kernels, grid1) == (2.0, 0.0) and seen["step_range"] == GUARD_STEP_RANGE
    assert (seen["trace_path"] is not None) == kept and (tmp_path / gap_file(name)).exists() == kept
    assert note == (
        "gemms/step none; kernel gaps: idle 3.5 us/step, 1 kernels under one wave" if kept else "gemms/step none"
    )
    if kept:
        assert not Path(seen["trace_path"]).exists()  # the trace was a temporary file
        with pytest.raises(ValueError, match=f"already holds {gap_file(name)}"):
            run_bench(_cfg(), CPU, ["eager"], steps=1, out_dir=tmp_path)


def test_cli_bench_writes_once_and_never_overwrites(tmp_path, capsys):
    out = tmp_path / "b"
    argv = [
        "bench",
        "--preset",
        "cartpole",
        "--set",
        "batch_size=32",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--variants",
        "eager",
        "--out",
        str(out),
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    first = (out / "bench.csv").read_text()
    assert list(pd.read_csv(out / "bench.csv").columns) == BENCH_COLUMNS and (out / "bench.md").exists()
    assert "bench folder" in capsys.readouterr().out
    assert main(argv) == 2
    assert "already holds bench.csv" in capsys.readouterr().err
    assert (out / "bench.csv").read_text() == first


def test_cli_bench_bad_input_exits_2_naming_the_valid_variants(tmp_path, capsys):
    assert (
        main(
            [
                "bench",
                "--preset",
                "cartpole",
                "--variants",
                "eager,warp",
                "--out",
                str(tmp_path / "x"),
                "--device",
                "cpu",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "'warp'" in err and all(name in err for name in VARIANTS)
    assert main(["bench", "--preset", "cartpole", "--steps", "0", "--device", "cpu"]) == 2
    assert "--steps must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_cli_bench_help_lists_every_variant(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert all(name in out for name in VARIANTS) and "--variants" in out and "seed-scale" in out
    assert "iteration (the whole loop iteration" in out


@pytest.mark.gpu
def test_run_bench_on_the_gpu_measures_every_captured_variant(tmp_path):
    df = run_bench(
        _cfg(batch_size=64, replay_capacity=4096),
        torch.device("cuda"),
        ["eager", "graph-fp32", "graph-tf32"],
        steps=10,
        warmup=2,
        out_dir=tmp_path,
    )
    assert df[["us_per_step_p50", "kernels_per_step", "setup_s"]].notna().all().all(), df["note"].tolist()
    assert (df["kernels_per_step"] > 10).all() and df["note"].str.contains("gemms/step").all()
    assert "gemms/step tf32=0 " in df.set_index("variant").loc["graph-fp32", "note"]  # no TF32 GEMM under FP32


@pytest.mark.gpu
def test_run_bench_on_the_gpu_times_each_lever_beside_the_hotloop_row(tmp_path):
    levers = [f"hotloop:{lever}" for lever in LEVERS]
    df = run_bench(
        _cfg(batch_size=256, replay_capacity=4096),
        torch.device("cuda"),
        ["hotloop", *levers],
        steps=10,
        warmup=2,
        out_dir=tmp_path,
    ).set_index("variant")
    assert df[["us_per_step_p50", "kernels_per_step"]].notna().all().all(), df["note"].tolist()
    for name in levers:
        assert (tmp_path / gap_file(name)).exists() and df.loc[name, "note"].startswith("switches on: ")
    assert df.loc["hotloop:dependent_launch", "kernels_per_step"] == df.loc["hotloop", "kernels_per_step"]


@pytest.mark.gpu
def test_run_bench_on_the_gpu_leads_with_the_captured_loop_iteration():
    cfg = _cfg(
        env="synthetic",
        obs_dim=8,
        action_nvec=(3, 3),
        batch_size=64,
        replay_capacity=4096,
        num_envs=16,
        learning_starts=256,
        eval_episodes=0,
        log_interval=4,
    )
    df = run_bench(cfg, torch.device("cuda"), ["hotloop", "iteration"], steps=6, warmup=2)
    it, hot = df.iloc[0], df.iloc[1]
    assert list(df["variant"]) == ["iteration", "hotloop"], df["note"].tolist()
    assert it[["us_per_step_p50", "kernels_per_step", "kernels_grid1_per_step", "setup_s"]].notna().all(), it["note"]
    assert (it["setup_kind"], it["precision"], it["steps"]) == ("trainer+captures", "split", 8)  # 2 x log_interval
    assert it["kernels_per_step"] >= hot["kernels_per_step"] > 0 and it["kernels_grid1_per_step"] >= 0
    assert it["ratio_to_hotloop"] == pytest.approx(it["us_per_step_p50"] / hot["us_per_step_p50"])
    assert df["note"].str.contains("kernel gaps: idle ").all(), df["note"].tolist()  # issue 38's gap table


def test_commit_id_prefers_the_environment(monkeypatch):
    from hotloop.guards.probes.bench import commit_id

    monkeypatch.setenv("HOTLOOP_COMMIT", "abc1234")
    assert commit_id() == "abc1234"
    monkeypatch.delenv("HOTLOOP_COMMIT")
    assert commit_id() != "abc1234"

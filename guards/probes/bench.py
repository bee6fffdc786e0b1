"""`hotloop bench`: the training-loop iteration and learner-step variants timed side by side in ONE process on one
device, plus a roofline floor.

The headline row, "iteration", is the whole loop iteration, `Trainer.iterate(1)` of hotloop.trainer.loop (env
step(s), replay insert, learner step, periodic readback publication / target update), built from the same Config
on the same device (`hotloop.guards.probes.bench_variants.build_iteration`); it leads the table whenever it is asked for
(it is in the default "all"). The learner-step variants (guards/probes/bench_variants.py: eager, graph-fp32, graph-tf32,
compiled-split, compiled-tf32; and "hotloop", hotloop's own step, built by
`hotloop.guards.probes.bench_variants.build_hotloop_variant`) follow. Each is built, warmed up, and timed step by step
(iteration by iteration) with CUDA events (host perf_counter on CPU); then 5 more steps run under
`hotloop.guards.guard.guard_steps` for the kernels per step. One row per variant; a variant that raises gets a row of
NaN numbers with the error in `note`, and the others still run. docs/h200_facts.md asks for exactly this: "hotloop's
bench must measure its baselines itself, in the same run as its own step".

Table columns (BENCH_COLUMNS): variant, precision, us_per_step_p20/p50/p80 (microseconds per learner step, per
loop iteration in the iteration row; quantiles over the timed steps), kernels_per_step (median over the guarded steps
of GPU kernels launched, those of a replayed graph included; NaN off CUDA), kernels_grid1_per_step (the same median
of the kernels launched with grid (1,1,1), the guard's "kernels_grid1" count; NaN off CUDA), setup_kind, setup_s
(one-time setup seconds: capture / compile + capture; for the iteration build + prefill + captures),
ratio_to_hotloop (us_per_step_p50 / the "hotloop" row's; NaN without one), roofline_floor_us (`roofline_floor_us`
at the config's shapes: the learner step's floor, the same value in every row; for the iteration row a floor too,
as the iteration holds one learner step, but not a tight one: env steps and periodic work are not counted), steps
(timed steps; 0 for a failed row), gpu, commit, date (UTC), note.

Kernel gaps (issue 38): for the "iteration" and "hotloop" rows (GAP_VARIANTS) the guarded steps' Kineto trace also
gives the kernel-gap table of hotloop.profiles.kernel_gaps (per position in the step: kernel, stream, programs / SMs,
median duration, GPU idle gap and same-stream gap before it; a summary row per kernel sequence), written as
kernel_gaps_<variant>.csv beside bench.csv, summarized on stderr, and in the row's note as "kernel gaps: idle <x>
us/step, <u> kernels under one wave". SMs: the device's own count. The same table of any trace (the gate's
trace.json.gz): `hotloop inspect --gaps --step-range NAME TRACE`.
Output style after results/lab/kernel_bench.py, Triton's tutorial benchmarks (`python/tutorials/05-layer-norm.py`) and
Liger-Kernel's `benchmark/scripts/utils.py`.
"""

from __future__ import annotations

import functools
import gc
import math
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import torch

from hotloop.guards.probes.bench_variants import (
    Variant,
    build_compiled,
    build_eager,
    build_graph,
    build_hotloop_variant,
    build_iteration,
    env_shapes,
)
from hotloop.profiles.kernel_gaps import sm_count
from hotloop.profiles.provenance import commit_id, device_name
from hotloop.trainer.config import Config

BENCH_COLUMNS = [
    "variant",
    "precision",
    "us_per_step_p20",
    "us_per_step_p50",
    "us_per_step_p80",
    "kernels_per_step",
    "kernels_grid1_per_step",
    "setup_kind",
    "setup_s",
    "ratio_to_hotloop",
    "roofline_floor_us",
    "steps",
    "gpu",
    "commit",
    "date",
    "note",
]
GUARD_STEPS, GUARD_WARMUP = 5, 2
"""Steps profiled by hotloop.guards.guard.guard_steps for kernels_per_step, and its unprofiled warm-up steps."""
GUARD_STEP_RANGE = "bench_step"
GAP_VARIANTS = ("iteration", "hotloop")
"""The variants whose guarded steps also give the kernel-gap table (hotloop.profiles.kernel_gaps, issue 38), as do
the lever variants (`lever_switches`): written as `gap_file(variant)` beside bench.csv, summarized on stderr and in
the row's note."""
HEADLINE = "iteration"
"""The variant that leads the table when asked for: the whole loop iteration."""
TF32_TFLOPS = 494.7
"""Dense TF32 tensor-core peak of an H100/H200 SXM, TFLOP/s (NVIDIA H100 datasheet: 989 with sparsity)."""
COPY_GBS = 4250.0
"""Copy bandwidth measured on the H200, GB/s (docs/h200_facts.md, "Copy bandwidth ~4.25 TB/s")."""


class VariantSpec(NamedTuple):
    """A named variant: its builder (cfg, device) -> Variant, and the precision / setup kind shown for it when
    the build fails (the built Variant's own fields win otherwise)."""

    builder: Callable[[Config, torch.device], Variant]
    precision: str
    setup_kind: str


VARIANTS: dict[str, VariantSpec] = {
    "iteration": VariantSpec(build_iteration, "", "trainer+captures"),
    "eager": VariantSpec(build_eager, "fp32", "none"),
    "graph-fp32": VariantSpec(functools.partial(build_graph, precision="fp32"), "fp32", "capture"),
    "graph-tf32": VariantSpec(functools.partial(build_graph, precision="tf32"), "tf32", "capture"),
    "compiled-split": VariantSpec(functools.partial(build_compiled, precision="split"), "split", "compile+capture"),
    "compiled-tf32": VariantSpec(functools.partial(build_compiled, precision="tf32"), "tf32", "compile+capture"),
    "hotloop": VariantSpec(build_hotloop_variant, "", ""),
}
"""The variants `hotloop bench` knows, in the default (table) order: the loop iteration first, then the learner
steps."""
ALIASES: dict[str, tuple[str, ...]] = {
    "all": tuple(VARIANTS),
    "graph": ("graph-fp32", "graph-tf32"),
    "compiled": ("compiled-split", "compiled-tf32"),
}
"""Shorthands accepted by `expand_variants`."""


LEVERS = ("dependent_launch", "grouped_forward")
"""The learner step's levers (issue 38), each a bool Config switch: the variant "hotloop:<lever>[+<lever>...]" is
the "hotloop" row built with those switches on, timed beside the plain row in the same run (`lever_switches`)."""
LEVER_PREFIX = "hotloop:"
"""The prefix of a lever variant's name (`lever_switches`)."""


def lever_switches(name: str) -> tuple[str, ...] | None:
    """The switches of a lever variant name, in LEVERS' order ("hotloop:dependent_launch" -> ("dependent_launch",));
    None for a name without the LEVER_PREFIX. ValueError naming an unknown or repeated lever (LEVERS lists the
    known)."""
    if not name.startswith(LEVER_PREFIX):
        return None
    switches = tuple(s.strip() for s in name[len(LEVER_PREFIX) :].split("+"))
    bad = [s for s in switches if s not in LEVERS]
    if bad or len(set(switches)) != len(switches):
        raise ValueError(f"variant {name!r}: levers must be distinct names of {', '.join(LEVERS)}, got {switches}")
    return tuple(s for s in LEVERS if s in switches)


def lever_name(switches: tuple[str, ...]) -> str:
    """The variant name of `switches`, given in LEVERS' order (as `lever_switches` returns them): LEVER_PREFIX, then
    the switches joined by '+', one name per set of switches."""
    return LEVER_PREFIX + "+".join(switches)


def expand_variants(names: str | list[str], extra: Mapping[str, object] = {}) -> list[str]:
    """Variant names from a comma-separated string or a list: aliases (ALIASES) expanded, duplicates dropped, order
    kept. Names may be those of VARIANTS, of `extra`, or lever variants (`lever_switches`). Raises ValueError naming
    the unknown ones and the valid ones (also for an empty selection)."""
    if isinstance(names, str):
        names = names.split(",")
    known = [*VARIANTS, *(k for k in extra if k not in VARIANTS)]
    out: list[str] = []
    bad = []
    for raw in names:
        name = raw.strip()
        for n in ALIASES.get(name, (name,)):
            switches = None if n in known else lever_switches(n)
            if n not in known and switches is None:
                bad.append(name)
                continue
            n = n if switches is None else lever_name(switches)  # hotloop:b+a and hotloop: a+b are hotloop:a+b
            if n not in out:
                out.append(n)
    if bad or not out:
        raise ValueError(
            f"unknown variant(s) {bad or names!r}; valid variants: {', '.join(known)} (or {', '.join(ALIASES)}, "
            f"or {LEVER_PREFIX}<lever>[+<lever>...] with levers {', '.join(LEVERS)})"
        )
    return out


def gap_file(name: str) -> str:
    """The kernel-gap table's file name of variant `name`: kernel_gaps_<name>.csv, a lever variant's ':' and '+'
    written as '-' (kernel_gaps_hotloop-dependent_launch.csv)."""
    return f"kernel_gaps_{name.replace(':', '-').replace('+', '-')}.csv"


def _spec(name: str, specs: Mapping[str, VariantSpec]) -> VariantSpec:
    """The VariantSpec of `name`: from `specs`, else a lever variant's (the hotloop row with its switches on)."""
    if name in specs:
        return specs[name]
    switches = lever_switches(name)
    return VariantSpec(functools.partial(build_hotloop_variant, switches=switches), "", "")


def roofline_counts(cfg: Config, obs_dim: int, action_nvec: tuple[int, ...]) -> dict[str, int]:
    """FLOPs and bytes one learner step cannot avoid, counted from the layer shapes (see `roofline_floor_us`).

    Returns {"flops_fwd", "flops_bwd", "bytes", "params", "weights"}: ints (FLOPs, bytes, parameter and weight-matrix
    element counts). Raises ValueError for a non-positive obs_dim or an empty/non-positive action_nvec.
    """
    if isinstance(obs_dim, bool) or not isinstance(obs_dim, int) or obs_dim < 1:
        raise ValueError(f"obs_dim must be an int >= 1, got {obs_dim!r}")
    if not action_nvec or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in action_nvec):
        raise ValueError(f"action_nvec must be non-empty positive ints, got {action_nvec!r}")
    b, h = cfg.batch_size, cfg.head_hidden
    widths = (obs_dim, *cfg.trunk_hidden)
    feat = widths[-1]
    layers = [*zip(widths, widths[1:]), (feat, h), (h, 1)]
    for n in action_nvec:
        layers += [(feat, h), (h, n)]
    weights = sum(i * o for i, o in layers)
    params = weights + sum(o for _, o in layers) + (len(layers) if cfg.spectral_norm else 0)
    first_in, first_out = layers[0]
    flops_fwd = 3 * 2 * b * weights
    flops_bwd = 2 * 2 * b * weights - 2 * b * first_in * first_out
    batch = 2 * b * obs_dim * 4 + b * len(action_nvec) * 8 + 3 * b * 4
    activations = 2 * b * sum(o for _, o in layers) * 4
    param_bytes = (3 + 1 + 7) * params * 4
    sn = weights * 4 if cfg.spectral_norm else 0
    return {
        "flops_fwd": flops_fwd,
        "flops_bwd": flops_bwd,
        "bytes": batch + activations + param_bytes + sn,
        "params": params,
        "weights": weights,
    }


def roofline_floor_us(
    cfg: Config,
    obs_dim: int,
    action_nvec: tuple[int, ...],
    peak_tflops_fwd: float = TF32_TFLOPS,
    peak_tflops_bwd: float = TF32_TFLOPS / 3,
    peak_gbs: float = COPY_GBS,
) -> float:
    """Lower bound of one learner step's GPU time, microseconds: max(FLOP time, byte time).

    Layers (in, out) of `BranchingDuelingQNet`: the trunk (obs_dim -> trunk_hidden...), the value head
    (feat -> head_hidden -> 1), and per action branch (feat -> head_hidden -> n_d); S = sum(in * out), B = batch.
      - FLOPs, forward: three forwards (online on s; online and target on s' for the Double-DQN target),
        2 * B * S each. Run at `peak_tflops_fwd` (default: H100/H200 dense TF32, 494.7 TFLOP/s).
      - FLOPs, backward: two GEMMs per layer, dX and dW, 2 * B * in * out each; the first layer has no dX (its input
        is the observation): 2 * B * (2 S - in_0 * out_0). Run at `peak_tflops_bwd` (default 494.7 / 3: FP32
        accuracy from TF32 tensor cores with the 3xTF32 split).
      - Bytes (each moved once at `peak_gbs`, default 4250 GB/s, the H200 copy bandwidth of docs/h200_facts.md):
        the gathered batch (obs and next_obs B * obs_dim float32, action B * D int64, reward, terminated, weights
        B float32); activations of the differentiated forward written once and read once in the backward
        (2 * B * sum(out) float32; the no-grad forwards on s' are assumed fused); parameters (P = weights + biases +
        one gain per matrix with spectral norm) read 3x (three forwards), grads written once, Adam reading params,
        exp_avg, exp_avg_sq, grad and writing params, exp_avg, exp_avg_sq (4 reads + 3 writes): 11 P float32;
        spectral norm one pass over the weights (S float32; 0 without spectral norm).
    Not counted: the replay's sum tree (sampling and priority update), the loss reductions, launch latency.
    FLOP time = flops_fwd / peak_fwd + flops_bwd / peak_bwd (they do not overlap in a step); the floor is
    max(FLOP time, byte time). At the seed-scale preset it is ~70 us, FLOP-bound.

    Args: cfg (batch_size, trunk_hidden, head_hidden, spectral_norm), obs_dim, action_nvec; peaks > 0 and finite.
    Raises ValueError naming a bad peak, obs_dim or action_nvec.
    """
    for name, value in (
        ("peak_tflops_fwd", peak_tflops_fwd),
        ("peak_tflops_bwd", peak_tflops_bwd),
        ("peak_gbs", peak_gbs),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    c = roofline_counts(cfg, obs_dim, tuple(action_nvec))
    flop_us = c["flops_fwd"] / (peak_tflops_fwd * 1e6) + c["flops_bwd"] / (peak_tflops_bwd * 1e6)
    byte_us = c["bytes"] / (peak_gbs * 1e3)
    return max(flop_us, byte_us)


def time_steps(step: Callable[[], object], steps: int, device: torch.device) -> list[float]:
    """Microseconds of each of `steps` consecutive calls of `step`.

    CUDA: one (start, end) event pair recorded on the current stream around each call, no synchronization inside
    the loop, one `torch.cuda.synchronize` after it; each value is the GPU time between the pair (us). CPU: host
    `time.perf_counter` around each call. Raises ValueError for steps < 1.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if device.type != "cuda":
        out = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            out.append((time.perf_counter() - t0) * 1e6)
        return out
    with torch.cuda.device(device):
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
        torch.cuda.synchronize()
        for s, e in zip(starts, ends):
            s.record()
            step()
            e.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]


def guard_summary(report, steps: int = GUARD_STEPS) -> tuple[float, float, str]:
    """(kernels_per_step, kernels_grid1_per_step, gemm note) from a `hotloop.guards.guard.GuardReport`: the medians
    of its per-step "kernels" and "kernels_grid1" columns (NaN when the report has no CUDA side, or no such
    median), and "gemms/step tf32=.. fp32=.. other=.." from its GEMM table (kernel
    counts over `steps` guarded steps; "other" = GEMMs whose name does not tell the precision, e.g. Inductor Triton
    templates; "" without CUDA)."""
    if not report.cuda:
        return math.nan, math.nan, ""
    kernels = float(report.medians["kernels"])
    grid1 = float(report.medians.get("kernels_grid1", math.nan))
    g = report.gemms
    if g.empty:
        return kernels, grid1, "gemms/step none"
    per = g.groupby("precision")["kernels"].sum() / steps
    return (
        kernels,
        grid1,
        (
            f"gemms/step tf32={per.get('tf32', 0):g} fp32={per.get('fp32', 0):g} "
            f"other={per.drop(['tf32', 'fp32'], errors='ignore').sum():g}"
        ),
    )


def _free(device: torch.device, compiled: bool) -> None:
    gc.collect()
    if compiled:
        torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def guard_variant(
    name: str, step: Callable[[], object], device: torch.device, gaps_dir: Path | None = None
) -> tuple[float, float, str]:
    """(kernels_per_step, kernels_grid1_per_step, note) of a variant's `step` guarded on CUDA `device`:
    `hotloop.guards.guard.guard_steps(step, steps=GUARD_STEPS, warmup=GUARD_WARMUP, step_range=GUARD_STEP_RANGE)`
    and `guard_summary` of its report (the note: its GEMM counts). For the variants of GAP_VARIANTS the guard keeps
    its Kineto trace (in a temporary folder, deleted after) and the note gets `kernel_gaps_note` of it (the
    kernel-gap table, written as gaps_dir/kernel_gaps_<name>.csv when `gaps_dir` is given). A failure of the guard
    or of the gap table leaves NaN or no gap note and says why in the note: the timing stands."""
    from hotloop.guards.guard import guard_steps

    kernels = grid1 = math.nan
    notes = []
    with tempfile.TemporaryDirectory(prefix="hotloop-bench-") as tmp:
        trace = Path(tmp) / "trace.json" if name in GAP_VARIANTS or lever_switches(name) else None
        try:
            report = guard_steps(
                step, steps=GUARD_STEPS, warmup=GUARD_WARMUP, step_range=GUARD_STEP_RANGE, trace_path=trace
            )
            kernels, grid1, gemm_note = guard_summary(report)
            notes += [gemm_note] if gemm_note else []
        except Exception as exc:  # the timing stands; say why the kernel count is missing
            return kernels, grid1, f"kernels_per_step not measured: {type(exc).__name__}: {exc}"
        if trace is not None:
            notes.append(kernel_gaps_note(name, trace, gaps_dir, sm_count(device)))
    return kernels, grid1, "; ".join(notes)


def kernel_gaps_note(name: str, trace: Path, gaps_dir: Path | None, sms: int) -> str:
    """The kernel-gap table (hotloop.profiles.kernel_gaps, issue 38) of the guarded steps (GUARD_STEP_RANGE ranges)
    of Kineto `trace`, occupancy over `sms` SMs: written as gaps_dir/kernel_gaps_<name>.csv when `gaps_dir` is
    given, its summary printed to stderr ("hotloop bench: NAME: kernel gaps: ...") and returned for the row's note
    as "kernel gaps: idle <x> us/step, <u> kernels under one wave[, <n> kernel sequences]"; "kernel gaps not
    measured: <Type>: <message>" when the table cannot be made or written."""
    from hotloop.profiles.inspect_cmd import read_trace
    from hotloop.profiles.kernel_gaps import SUMMARY_NAME, kernel_gap_table, summary_line

    try:
        table = kernel_gap_table(read_trace(trace), GUARD_STEP_RANGE, sms=sms, fallback=False)
        if gaps_dir is not None:
            gaps_dir.mkdir(parents=True, exist_ok=True)
            table.to_csv(gaps_dir / gap_file(name), index=False)
    except Exception as exc:  # the timing and the kernel counts stand
        return f"kernel gaps not measured: {type(exc).__name__}: {exc}"
    print(f"hotloop bench: {name}: kernel gaps: {summary_line(table)}", file=sys.stderr, flush=True)
    total = table[table["sequence"].eq(0) & table["name"].eq(SUMMARY_NAME)].iloc[0]
    sequences = table.attrs.get("sequences", 1)
    return (
        f"kernel gaps: idle {total['idle_gap_us']:.1f} us/step, {int(total['under_one_wave'])} kernels under one "
        f"wave" + (f", {sequences} kernel sequences" if sequences > 1 else "")
    )


def _measure(
    name: str,
    spec: VariantSpec,
    cfg: Config,
    device: torch.device,
    steps: int,
    warmup: int,
    base: dict,
    gaps_dir: Path | None = None,
) -> dict:
    """Build, warm up, time and guard one variant (`guard_variant` on CUDA: kernel counts, and for GAP_VARIANTS the
    kernel-gap table into `gaps_dir`); returns its row (raises what the build or the steps raise).
    Timed steps: `steps` rounded up to a multiple of the variant's step_multiple; when that is > 1 the note gets the
    mean us per step over them (the periodic phases amortized)."""
    variant = spec.builder(cfg, device)
    if not isinstance(variant, Variant):
        raise TypeError(
            f"the builder of {name!r} returned {type(variant).__name__}, expected "
            f"hotloop.guards.probes.bench_variants.Variant"
        )
    try:
        for _ in range(warmup):
            variant.step()
        multiple = max(1, int(variant.step_multiple))
        steps = -(-steps // multiple) * multiple
        us = pd.Series(time_steps(variant.step, steps, device))
        note = variant.note
        if multiple > 1:
            note = f"{note}; {steps} timed steps ({steps // multiple} x {multiple}), mean {us.mean():.1f} us"
        kernels = grid1 = math.nan
        if device.type == "cuda":
            kernels, grid1, guard_note = guard_variant(name, variant.step, device, gaps_dir)
            note = f"{note}; {guard_note}" if guard_note else note
        q = us.quantile([0.2, 0.5, 0.8]).tolist()
        return {
            **base,
            "variant": name,
            "precision": variant.precision,
            "us_per_step_p20": q[0],
            "us_per_step_p50": q[1],
            "us_per_step_p80": q[2],
            "kernels_per_step": kernels,
            "kernels_grid1_per_step": grid1,
            "setup_kind": variant.setup_kind,
            "setup_s": float(variant.setup_s),
            "steps": steps,
            "note": note,
        }
    finally:
        compiled = "compile" in variant.setup_kind
        del variant
        _free(device, compiled)


def run_bench(
    cfg: Config,
    device: torch.device | str,
    variants: list[str],
    steps: int = 200,
    warmup: int = 20,
    out_dir: str | Path | None = None,
    extra_variants: Mapping[str, Callable[[Config, torch.device], Variant]] = {},
) -> pd.DataFrame:
    """Time each named variant's step on `device`, one after the other in this process; print the table, write it
    as out_dir/bench.csv and out_dir/bench.md (hotloop.profiles.epoch_table.write_table) when `out_dir` is given,
    and return it (columns BENCH_COLUMNS, one row per variant in the order asked, except that the "iteration" row,
    when asked for, is run first and leads the table).

    Args:
        cfg: the Config (its shapes; the seed-scale preset is what numbers are quoted at).
        device: torch.device or string ("cpu", "cuda", "cuda:N").
        variants: names of VARIANTS or `extra_variants` (aliases of `expand_variants` allowed).
        steps: timed steps per variant (>= 1), rounded up to a multiple of the variant's step_multiple (the
            iteration: its longest periodic phase's period, e.g. log_interval with the hotloop learner, so the timed
            iterations hold every periodic phase, whole periods of it); warmup: untimed steps before them (>= 0),
            after the build's own.
        out_dir: folder for bench.csv / bench.md and the kernel-gap tables (created); must not hold any of them
            already (nothing is overwritten).
        extra_variants: {name: builder(cfg, device) -> Variant}, added to (or replacing) VARIANTS' builders.
    Per variant: build; `warmup` steps; `time_steps` (CUDA events per step, or perf_counter on CPU) -> p20/p50/p80
    us per step; on CUDA `hotloop.guards.guard.guard_steps(step, steps=5, warmup=2, step_range="bench_step")` ->
    kernels and grid-(1,1,1) kernels per step (medians of its "kernels" / "kernels_grid1" columns) and GEMM kernels
    per step by precision (appended to the note); for GAP_VARIANTS also the kernel-gap table of those guarded
    steps (`guard_variant`: out_dir/kernel_gaps_<variant>.csv, its summary in the note); then the
    variant is deleted and the CUDA cache emptied (Dynamo reset after compiled ones) before the next is built.
    Compiled kernels stay cached in the process: a row built after another that compiled the same Triton kernels
    (the "hotloop" row after the iteration, whose HotLearner compiles them cold) shows a warm setup_s.
    An exception while building or running a variant gives its row NaN numbers, steps 0 and note "<Type>: <msg>"
    ("skipped: ..." for a variant that needs CUDA on a CPU device). ratio_to_hotloop = p50 / the "hotloop" row's p50.

    Raises ValueError (before running anything) for unknown variants, lever variants with a lever already on in
    `cfg`, steps < 1, warmup < 0, a bad device string, or an out_dir that already holds bench.csv / bench.md or is
    not a folder.
    """
    names = expand_variants(variants, extra_variants)
    on = [lever for lever in LEVERS if getattr(cfg, lever)]
    if on and any(lever_switches(n) for n in names):
        raise ValueError(
            f"lever variants are timed against the hotloop row with every lever off, but the config has "
            f"{', '.join(on)} on: leave it off and ask for {lever_name(tuple(on))}"
        )
    names.sort(key=lambda n: n != HEADLINE)  # stable: the iteration first, the others in the order asked
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {device!r} is not a torch device: {exc}") from exc
    if out_dir is not None:
        out_dir = Path(out_dir)
        check_out_dir(out_dir)
    specs = {**VARIANTS, **{k: VariantSpec(b, "", "") for k, b in extra_variants.items()}}
    obs_dim, nvec = env_shapes(cfg)
    base = {
        "roofline_floor_us": roofline_floor_us(cfg, obs_dim, nvec),
        "gpu": device_name(device),
        "commit": commit_id(),
        "date": datetime.now(timezone.utc).date().isoformat(),
    }
    rows = []
    for name in names:
        spec = _spec(name, specs)
        print(f"hotloop bench: {name} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            rows.append(_measure(name, spec, cfg, device, steps, warmup, base, out_dir))
            print(
                f"hotloop bench: {name}: p50 {rows[-1]['us_per_step_p50']:.1f} us/step "
                f"({time.perf_counter() - start:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
            continue
        except Exception as exc:
            msg = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, RuntimeError) and "needs CUDA" in str(exc):
                msg = f"skipped: {exc}"
            rows.append(
                {
                    **base,
                    "variant": name,
                    "precision": spec.precision,
                    "setup_kind": spec.setup_kind,
                    "steps": 0,
                    "note": msg,
                }
            )
        _free(device, "compile" in spec.setup_kind)  # after the except block: its traceback no longer holds the state
    df = pd.DataFrame(rows).reindex(columns=BENCH_COLUMNS)
    for col in (
        "us_per_step_p20",
        "us_per_step_p50",
        "us_per_step_p80",
        "kernels_per_step",
        "kernels_grid1_per_step",
        "setup_s",
        "ratio_to_hotloop",
        "roofline_floor_us",
    ):
        df[col] = df[col].astype("float64")
    df["steps"] = df["steps"].astype("int64")
    hot = df.loc[df["variant"].eq("hotloop"), "us_per_step_p50"]
    df["ratio_to_hotloop"] = df["us_per_step_p50"] / hot.iloc[0] if len(hot) else math.nan
    from hotloop.profiles.epoch_table import format_table, write_table

    print(
        f"hotloop bench: {len(df)} variants, {steps} timed steps each (the iteration: whole periods), "
        f"device {device} ({base['gpu']}), "
        f"batch {cfg.batch_size}, roofline floor {base['roofline_floor_us']:.1f} us"
    )
    print(format_table(df))
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_table(df, out_dir, "bench")
    return df


def check_out_dir(out_dir: Path) -> None:
    """ValueError unless `out_dir` is a folder (or does not exist yet) that holds none of bench.csv, bench.md and
    any kernel-gap table (kernel_gaps_*.csv: `gap_file`): a bench never overwrites an earlier table."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir} exists and is not a folder")
    taken = [n for n in ("bench.csv", "bench.md") if (out_dir / n).exists()]
    taken += sorted(p.name for p in out_dir.glob("kernel_gaps_*.csv")) if out_dir.is_dir() else []
    if taken:
        raise ValueError(
            f"--out {out_dir} already holds {', '.join(taken)}; choose another folder (an earlier bench "
            f"table is never overwritten)"
        )

"""The precision probe's bounds, measured: the normwise error of every GEMM of the learner step, of an IEEE forward
and of a 1xTF32 backward on one trained learner, side by side (hotloop.guards.probes.precision_probe's bounds FP32_BOUND,
TF32_MIN, TF32_MAX must be re-justified from these numbers on the GPU).

Lab code (results/lab/, not shipped in the wheel; run from the checkout root): `PYTHONPATH=results python -m lab.precision_bounds --preset
seed-scale`. The variants are results/lab/precision_variants.py's drop-in launchers in a chosen `tl.dot` precision; the
probe itself (hotloop.guards.probes.precision_probe) is product code: the gate's "TF32 forward only" verdict.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace

import torch

from hotloop.guards.probes.precision_probe import (
    FP32_BOUND,
    TF32_MAX,
    TF32_MIN,
    Launchers,
    precision_verdict,
    probe_precision,
    replay_batch,
)
from lab.precision_variants import (
    _variant_tf32_gemm_kernel,
    variant_linear_backward_input,
    variant_linear_backward_weight,
    variant_linear_forward,
)


def variant_launchers(learner, name: str) -> Launchers:
    """The Launchers of a CLI configuration: "step" (the learner's own), "ieee_forward" (the forward's products as
    FP32 FMAs: lab.precision_variants), "tf32_backward" (every input- and weight-gradient product as
    ONE TF32 dot), "tf32x3_backward" (Triton's own tf32x3 split, one dot). The heads' forward and backward stay
    the step's in every configuration (flat_forward and the step call hotloop.kernels.heads directly).
    Raises ValueError for another name."""
    own = Launchers.of(learner)
    if name == "step":
        return own
    if name == "ieee_forward":  # on the parameters as they are (the step's forward reads them rounded to TF32)
        return replace(own, forward=variant_linear_forward("ieee"), weights_copy=lambda src, dst: dst.copy_(src))
    if name in ("tf32_backward", "tf32x3_backward"):
        p = name.split("_")[0]
        return replace(
            own, backward_input=variant_linear_backward_input(p), backward_weight=variant_linear_backward_weight(p)
        )
    raise ValueError(f"unknown configuration {name!r}; choose one of {CONFIGS}")


CONFIGS = ("step", "ieee_forward", "tf32_backward", "tf32x3_backward")
"""The CLI's configurations (`variant_launchers`)."""


def main(argv: Sequence[str] | None = None) -> int:
    """`PYTHONPATH=results python -m lab.precision_bounds [--preset seed-scale] [--set key=value ...] [--steps 20]
    [--device cuda] [--configs step,ieee_forward,tf32_backward] [--csv PATH]`: builds a HotLearner over a replay of
    random transitions (hotloop.guards.probes.bench_variants.fill_random), runs --steps learner steps (eager), samples one
    batch of cfg.batch_size from the replay, and prints for each configuration every product's normwise error and
    class, the verdicts, and the instruction counts; --csv writes all rows. Returns 0."""
    from hotloop.guards.probes.bench_variants import env_shapes, fill_random
    from hotloop.trainer.config import parse_override, preset
    from hotloop.trainer.replay import PrioritizedReplay
    from hotloop.trainer.step import HotLearner

    ap = argparse.ArgumentParser(
        prog="PYTHONPATH=results python -m lab.precision_bounds", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--preset", default="seed-scale")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    ap.add_argument("--steps", type=int, default=20, help="learner steps before the probe (trained parameters)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--configs", default="step,ieee_forward,tf32_backward")
    ap.add_argument("--csv", default=None)
    args = ap.parse_args(argv)
    cfg = preset(args.preset, **dict(parse_override(s) for s in args.set))
    device = torch.device(args.device)
    obs_dim, nvec = env_shapes(cfg)
    replay = PrioritizedReplay(
        cfg.replay_capacity, obs_dim, len(nvec), alpha=cfg.per_alpha, eps=cfg.per_eps, device=device, use_kernels=True
    )
    torch.manual_seed(cfg.seed)
    fill_random(replay, cfg, nvec)
    learner = HotLearner(cfg, obs_dim, nvec, device, replay)
    for _ in range(args.steps):
        learner.step()
    batch = replay_batch(learner)
    tables = []
    for name in args.configs.split(","):
        result = probe_precision(learner, batch, launchers=variant_launchers(learner, name), label=name)
        verdict, evidence = precision_verdict(result)
        table = result.table().assign(config=name)
        tables.append(table)
        print(f"== {name}: {verdict}")
        print(
            table[["name", "m", "n", "k", "error", "cls", "launcher"]].to_string(
                index=False, float_format="{:.3e}".format
            )
        )
        print("\n".join(evidence))
        print()
    from hotloop.profiles.kernel_evidence import kernel_summary, summary_lines

    print("variant kernel (one tl.dot per step, 64 x 64 x 32 tiles; PRECISION in constexprs):")
    print(
        "\n".join(
            f"  {x}" for x in summary_lines(kernel_summary({"_variant_tf32_gemm_kernel": _variant_tf32_gemm_kernel}))
        )
    )
    print(f"bounds: FP32_BOUND {FP32_BOUND:.0e}, TF32 band [{TF32_MIN:.0e}, {TF32_MAX:.0e}] (normwise)")
    if args.csv:
        import pandas as pd

        pd.concat(tables).to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

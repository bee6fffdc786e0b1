"""The two learners side by side on the same batches: where the hotloop learner parts from the reference one.

The learning issue asks for this: the same seed, the same initial parameters, the same sampled indices and
importance weights, then follow the TD loss, gradient norm, priorities, parameters and target net step by step.
`compare_learners` builds a Trainer with the hotloop learner (CUDA, or the Triton interpreter on the CPU), fills
its replay with `learning_starts` transitions of the exploration policy, copies the hotloop learner's parameters
into a DQNLearner (hotloop.trainer.learner: the plain-torch reference), then runs `steps` learner steps:

1. the hotloop step (HotLearner.step: it samples its own batch, hotloop.kernels.segment_tree.tree_sample);
2. the reference's `update` on exactly that batch: the rows HotLearner.idx of the replay and the weights
   HotLearner.weights;
3. one row of differences (`COMPARE_COLUMNS`), all relative to the reference's magnitude: loss, pre-clip grad
   norm, the new priorities the hotloop step wrote (against (|td| + per_eps)^alpha from the reference's TD errors),
   the online and the target parameters (max |hot - ref| / max |ref|, the hotloop net's gains folded into its
   matrices), and how far the hotloop net's gains are from 1 (max |g - 1|).
With `resync` the reference takes the hotloop parameters and target again before every step (its Adam keeps its own
moments), so the loss, gradient-norm and priority columns are one step's discrepancy from the same parameters;
without it the two run free and the rows show how the difference grows.

Spectral norm must be off (the reference's parametrization and the hotloop projection have no common parameter
set), and the branches of equal size (the hotloop learner's limit). The hotloop net has a gain slot per weight
matrix (trainer/flat_net.py) but learns it only with spectral norm on; the reference net without spectral norm has
none, so `gain_dev` above 0 would itself be a difference of the two algorithms (it was, until the backward stopped
writing gain gradients with spectral norm off: results/cpu/learning_causes/README.md, H1).

Run it: `PYTHONPATH=results python -m lab.learner_compare --preset cartpole-fast --steps 20 [--resync] [--csv FILE]`
(on a CPU machine, under TRITON_INTERPRET=1: about 3 s per step at cartpole-fast sizes, trunk 256-256).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import pandas as pd
import torch

from hotloop.trainer.config import Config, preset
from hotloop.trainer.learner import DQNLearner
from hotloop.trainer.network import BranchingDuelingQNet
from hotloop.trainer.step import HotLearner

COMPARE_COLUMNS = [
    "step",
    "loss_hot",
    "loss_ref",
    "loss_rel",
    "grad_norm_hot",
    "grad_norm_ref",
    "grad_norm_rel",
    "priority_rel",
    "params_rel",
    "target_rel",
    "gain_dev",
]


def reference_weights(learner: HotLearner, buf: torch.Tensor) -> dict[str, torch.Tensor]:
    """The hotloop net whose flat parameters are `buf` (learner.params or learner.target) as the state_dict of a
    BranchingDuelingQNet without spectral norm: each matrix times its gain (W_ref = g W), biases as they are.
    Layout: trunk layers, then the stacked hidden layer (rows [0, H) the value head's, [(1 + d) H, (2 + d) H)
    branch d's), then the output layer (row 0 the value's, rows 1 + d A .. branch d's); trainer/flat_net.py."""
    lay, h, a = learner.layout, learner.layout.head_hidden, learner.layout.actions
    out: dict[str, torch.Tensor] = {}
    for i, slots in enumerate(lay.layers[:-1]):
        w, b, g = slots.views(buf)
        out[f"trunk.{2 * i}.weight"], out[f"trunk.{2 * i}.bias"] = w * g, b.clone()
    w, b, g = lay.layers[-1].views(buf)
    wo, bo, go = lay.out_views(buf)
    out["value.0.weight"], out["value.0.bias"] = w[:h] * g[0], b[:h].clone()
    out["value.2.weight"], out["value.2.bias"] = wo[:1] * go[0], bo[:1].clone()
    for d in range(lay.branches):
        rows, outs = slice((1 + d) * h, (2 + d) * h), slice(1 + d * a, 1 + (d + 1) * a)
        out[f"branch_hidden.{d}.0.weight"] = w[rows] * g[1 + d]
        out[f"branch_hidden.{d}.0.bias"] = b[rows].clone()
        out[f"branch_out.{d}.weight"], out[f"branch_out.{d}.bias"] = wo[outs] * go[1 + d], bo[outs].clone()
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max(max |b|, 1e-30) over float64 copies."""
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _net_rel(hot: dict[str, torch.Tensor], net: BranchingDuelingQNet) -> float:
    ref = net.state_dict()
    return max(_rel(hot[k], ref[k]) for k in ref)


def _sync(ref: DQNLearner, hot: HotLearner) -> None:
    """Copy the hotloop learner's online and target parameters (gains folded in) into the reference's nets, in
    place (its Adam keeps its own moments: a gain has no counterpart in the reference net)."""
    with torch.no_grad():
        for net, buf in ((ref.online, hot.params), (ref.target, hot.target)):
            net.load_state_dict(reference_weights(hot, buf))


def compare_learners(cfg: Config, steps: int, resync: bool = False) -> pd.DataFrame:
    """`steps` rows of COMPARE_COLUMNS for `cfg` (module docstring). Raises ValueError for steps < 1, spectral
    norm on, or a config the hotloop learner cannot run (hotloop.trainer.step.check_supported)."""
    from hotloop.trainer.loop import Trainer

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if cfg.spectral_norm:
        raise ValueError(
            "compare_learners needs spectral_norm=False: the reference's spectral-norm "
            "parametrization and the hotloop projection share no parameters"
        )
    cfg = dataclasses.replace(cfg, learner="hotloop")
    trainer = Trainer(cfg)
    trainer.prefill()
    hot, rp = trainer.learner, trainer.replay
    ref = DQNLearner(cfg, trainer.env.obs_dim, trainer.env.action_nvec, trainer.device)
    _sync(ref, hot)
    rows = []
    for k in range(1, steps + 1):
        if resync and k > 1:
            _sync(ref, hot)
            ref.steps = hot.steps
        hot.step()
        idx = hot.idx.clone()
        m = ref.update(
            rp.obs[idx], rp.action[idx], rp.reward[idx], rp.next_obs[idx], rp.terminated[idx], hot.weights.clone()
        )
        expected = (m.td_abs.double() + cfg.per_eps) ** cfg.per_alpha
        loss_hot, loss_ref = float(hot.td.metrics[1]), float(m.loss)
        gn_hot, gn_ref = float(hot.adam.grad_norm), float(m.grad_norm)
        gains = torch.cat([s.views(hot.params)[2] for s in hot.layout.layers] + [hot.layout.out_views(hot.params)[2]])
        rows.append(
            dict(
                step=k,
                loss_hot=loss_hot,
                loss_ref=loss_ref,
                loss_rel=abs(loss_hot - loss_ref) / max(abs(loss_ref), 1e-30),
                grad_norm_hot=gn_hot,
                grad_norm_ref=gn_ref,
                grad_norm_rel=abs(gn_hot - gn_ref) / max(abs(gn_ref), 1e-30),
                priority_rel=_rel(hot.td.priorities, expected),
                params_rel=_net_rel(reference_weights(hot, hot.params), ref.online),
                target_rel=_net_rel(reference_weights(hot, hot.target), ref.target),
                gain_dev=float((gains - 1).abs().max()),
            )
        )
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)


def main(argv: list[str] | None = None) -> int:
    """`PYTHONPATH=results python -m lab.learner_compare`: print the table (and write --csv); exit 2 on bad input."""
    p = argparse.ArgumentParser(
        prog="PYTHONPATH=results python -m lab.learner_compare", description=__doc__.split("\n")[0]
    )
    p.add_argument("--preset", default="cartpole-fast")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int)
    p.add_argument("--device", default="auto")
    p.add_argument("--resync", action="store_true", help="re-sync the reference before every step")
    p.add_argument("--csv", help="also write the table to this CSV file")
    args = p.parse_args(argv)
    try:
        cfg = preset(args.preset, device=args.device, **({} if args.seed is None else {"seed": args.seed}))
        table = compare_learners(cfg, args.steps, args.resync)
    except ValueError as exc:
        print(f"learner_compare: error: {exc}", file=sys.stderr)
        return 2
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

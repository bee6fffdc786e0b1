"""Experiment (H200): where the fused actor step's time goes, per launch and per part, at both presets.

For each preset: a Trainer on CUDA (prefilled), then the median time per launch (triton.testing.do_bench_cudagraph over a graph of 20 launches: no host launch
overhead) of
  - `actor_step` (the main launch), `tree_insert`, `actor_commit` alone;
  - `actor_step` with an empty layer table (no hidden layers: the heads read the observation), i.e. without most of
    the acting forward;
and the main kernel's compile report (registers, spills, shared memory) and its MMA instructions in the PTX
(`mma` / `wgmma` counts). Usage: python3 results/h200/experiments/actor_kernel_parts.py [OUT_CSV]
"""

from __future__ import annotations

import dataclasses
import sys

import pandas as pd
import torch
import triton

from hotloop.kernels import actor_step as ak
from hotloop.kernels.segment_tree import tree_insert
from hotloop.trainer.config import preset
from hotloop.trainer.loop import Trainer


TILES = {"cartpole": [(16, 64, 64, 4), (16, 32, 32, 2), (16, 64, 32, 2)],
         "seed-scale": [(64, 64, 32, 4), (32, 64, 32, 4), (32, 64, 64, 4), (16, 64, 32, 4), (64, 64, 32, 8),
                        (32, 128, 32, 4), (32, 64, 32, 2)]}
"""(BLOCK_N, BLOCK_R, BLOCK_K, num_warps) tried beside the defaults (kernels/actor_step.py `_blocks`)."""


def main(out: str | None) -> None:
    rows = []
    for name in ("cartpole", "seed-scale"):
        tr = Trainer(preset(name, device="cuda", eval_episodes=0))
        tr.prefill()
        a = tr.actor
        rp = tr.replay

        def main_launch(net=a.net, tiles=None):
            ak.actor_step(net, a.acting_weights, a.fused, a.seed, a.eps_start, a.eps_end, a.eps_decay_steps,
                          a._env_kind, a._time_limit, tiles)

        no_layers = dataclasses.replace(a.net, table=a.net.table[:0])
        parts = {"actor_step": main_launch, "actor_step_no_hidden": lambda: main_launch(no_layers),
                 "tree_insert": lambda: tree_insert(rp.tree.nodes, rp.pos_t, a.env.num_envs, rp.capacity,
                                                    rp.tree.max_value),
                 "actor_commit": lambda: ak.actor_commit(a.fused)}
        for tiles in TILES[name]:
            parts[f"actor_step tiles {tiles}"] = lambda tiles=tiles: main_launch(tiles=tiles)
        for part, fn in parts.items():
            us = triton.testing.do_bench_cudagraph(lambda fn=fn: [fn() for _ in range(20)], rep=300,
                                                   return_mode="median") * 1e3 / 20
            rows.append(dict(preset=name, part=part, us_p50=us))
        for kernel in (ak._actor_step_kernel,):
            for cache in kernel.device_caches.values():
                for compiled in cache[0].values():
                    ptx = compiled.asm.get("ptx", "")
                    rows.append(dict(preset=name, part="compile", us_p50=float("nan"),
                                     note=f"regs {compiled.n_regs} spills {compiled.n_spills} shared "
                                          f"{compiled.metadata.shared} wgmma {ptx.count('wgmma.mma_async')} "
                                          f"mma {ptx.count('mma.sync')} ld.local {ptx.count('ld.local')}"))
        del tr
        torch.cuda.empty_cache()
    df = pd.DataFrame(rows)
    print(df.to_string(index=False))
    if out:
        df.to_csv(out, index=False)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)

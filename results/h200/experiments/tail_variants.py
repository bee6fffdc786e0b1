"""Last run at b6da543 (2026-11-30; first run at 2abfe9e); it reaches into private members (HotLearner._on_side; hotloop.kernels.fused_adam._BLOCK_ADAM; it rebinds module globals of hotloop.trainer.step): a record tied to that commit, not kept working against later code.

The step's tail schedule, seed scale: the clip + Adam launch's elements per program (hotloop.kernels.fused_adam
_BLOCK_ADAM: 1024 as committed, 256 the fastest of tail_sweep.csv) x where the sum-tree update runs on the side
stream (`end`: after the backward, as committed; `loss`: after the loss, beside the whole backward; `last`: before
the backward's last kernel, dX2 with dW1). Each variant is the learner's own step body (HotLearner._body, as
`hotloop bench` builds it) captured as its own CUDA graph over the same buffers, the tree update moved by wrapping
the functions the body calls. Timed interleaved: 8 rounds x 60 replays per variant, one event pair per replay
(hotloop.guards.probes.bench.time_steps), each graph from HotLearner.capture (the run of 2abfe9e had the same timing loop
and one warm-up step plus capture inline).
Usage: python tail_variants.py OUT.csv (on a CUDA machine, hotloop importable)."""
import itertools
import sys

import pandas as pd
import torch

import hotloop.kernels.fused_adam as FA
import hotloop.trainer.step as S
from hotloop.guards.probes.bench_variants import build_hotloop_variant
from hotloop.guards.probes.bench import time_steps
from hotloop.trainer.config import preset

dev = torch.device("cuda")
L = build_hotloop_variant(preset("seed-scale"), dev).step.__self__
rp = L.replay
real = dict(tree_update=S.tree_update, td_loss_forward=S.td_loss_forward, bwd_input=L.linear_backward_input)


def side_tree():
    with L._on_side():
        real["tree_update"](rp.tree.nodes, L.idx, L.td.priorities, rp.capacity, rp.tree.max_value,
                            rp.tree.bad_priority_count)


def loss_then_tree(*args, **kwargs):
    real["td_loss_forward"](*args, **kwargs)
    side_tree()


def tree_then_input(*args, weight_grad_below=None, **kwargs):
    if weight_grad_below is not None:  # the last backward kernel: dX2 with dW1 fused
        side_tree()
    return real["bwd_input"](*args, weight_grad_below=weight_grad_below, **kwargs)


def capture(block_adam, place):
    FA._BLOCK_ADAM = block_adam
    S.tree_update = real["tree_update"] if place == "end" else (lambda *a, **k: None)
    S.td_loss_forward = loss_then_tree if place == "loss" else real["td_loss_forward"]
    L.linear_backward_input = tree_then_input if place == "last" else real["bwd_input"]
    L.capture()  # the learner's own warm-up steps and capture of its patched body
    return L.graph


committed = FA._BLOCK_ADAM
variants = {(b, p): capture(b, p) for b, p in itertools.product((committed, 256), ("end", "loss", "last"))}
FA._BLOCK_ADAM, S.tree_update, S.td_loss_forward = committed, real["tree_update"], real["td_loss_forward"]
L.linear_backward_input = real["bwd_input"]
for g in variants.values():
    for _ in range(20):
        g.replay()
torch.cuda.synchronize()
times = {k: [] for k in variants}
for _ in range(8):
    for k, g in variants.items():
        times[k] += time_steps(g.replay, 60, dev)
rows = [dict(block_adam=b, tree=p, committed=(b, p) == (committed, "end"), p20=pd.Series(t).quantile(0.2),
             p50=pd.Series(t).median(), p80=pd.Series(t).quantile(0.8)) for (b, p), t in times.items()]
table = pd.DataFrame(rows)
print(table.to_string(index=False))
table.to_csv(sys.argv[1], index=False)

"""Last run at 1e3d901 (2026-11-30); it reaches into private members (the launch constants hotloop.kernels.td_loss._BLOCK_B, fused_adam._BLOCK_NORM and _BLOCK_ADAM): a record tied to that commit, not kept working against later code.

The launch shapes of the step's small kernels that were never swept, at seed scale, isolated: the fused TD loss
(hotloop.kernels.td_loss _BLOCK_B, samples per program) and the grad-norm + clip + Adam pair (hotloop.kernels.fused_adam
_BLOCK_NORM / _BLOCK_ADAM, elements per program). Each config's launch replayed 20 times in a CUDA graph, median of
7 replays (lab.kernel_bench.time_graph); outputs checked against the committed config's. Usage:
python tail_sweep.py OUT.csv (on a CUDA machine, hotloop importable)."""
import statistics
import sys

import pandas as pd
import torch

import hotloop.kernels.fused_adam as FA
import hotloop.kernels.td_loss as TD
from lab.kernel_bench import time_graph
from hotloop.trainer.flat_net import FlatLayout

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)
b, d, a = 8192, 3, 4  # seed-scale batch, branches, actions
numel = FlatLayout(64, (a,) * d, (512, 256), 80).numel  # the seed-scale flat parameter buffer
q, qno, qnt = (torch.randn(b, d, a, device=dev, generator=g) for _ in range(3))
action = torch.randint(0, a, (b, d), device=dev, generator=g)
reward, weights = torch.randn(b, device=dev, generator=g), torch.rand(b, device=dev, generator=g)
terminated = (torch.rand(b, device=dev, generator=g) < 0.05).float()
params0 = torch.randn(numel, device=dev, generator=g) * 0.05
grads = torch.randn(numel, device=dev, generator=g) * 1e-3
rows = []


def td_run(block_b):
    TD._BLOCK_B = block_b
    out, ws = TD.TDLossOutputs.empty(b, d, a, dev), TD.TDLossWorkspace.create(b, dev)
    launch = lambda: TD.td_loss_forward(q, qno, qnt, action, reward, terminated, weights, 0.99, out=out,  # noqa: E731
                                        workspace=ws)
    launch()
    torch.cuda.synchronize()
    return out.grad.clone(), statistics.median(time_graph(launch, 20, 7))


def adam_run(block_norm, block_adam):
    FA._BLOCK_NORM, FA._BLOCK_ADAM = block_norm, block_adam
    opt = FA.FusedAdam(numel, dev, lr=1e-3, max_grad_norm=1.0)
    params, target = params0.clone(), params0.clone()
    opt.step(params, grads, target, tau=0.05)
    torch.cuda.synchronize()
    first = params.clone()
    return first, statistics.median(time_graph(lambda: opt.step(params, grads, target, tau=0.05), 20, 7))


committed_b = TD._BLOCK_B
want, _ = td_run(committed_b)
for block_b in (16, 32, 64, 128):
    got, us = td_run(block_b)
    rows.append(dict(kernel="td_loss", config=f"BLOCK_B={block_b}", programs=max(2, -(-b // block_b)), us=us,
                     max_abs_diff=float((got - want).abs().max()), committed=block_b == committed_b))
TD._BLOCK_B = committed_b
committed_a = (FA._BLOCK_NORM, FA._BLOCK_ADAM)
want, _ = adam_run(*committed_a)
for block_norm in (512, 1024, 2048, 4096):
    for block_adam in (256, 512, 1024, 2048):
        got, us = adam_run(block_norm, block_adam)
        rows.append(dict(kernel="grad_norm+adam", config=f"BLOCK_NORM={block_norm} BLOCK_ADAM={block_adam}",
                         programs=-(-numel // block_adam), us=us, max_abs_diff=float((got - want).abs().max()),
                         committed=(block_norm, block_adam) == committed_a))
table = pd.DataFrame(rows).sort_values(["kernel", "us"])
print(table.to_string(index=False))
table.to_csv(sys.argv[1], index=False)

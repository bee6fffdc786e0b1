"""The greedy evaluation of N CartPole-v1 envs in ONE launch: every env's first-episode return under the flat net's
greedy policy (epsilon 0), each program running its block of envs to the end inside the kernel.

`greedy_eval` (`_greedy_eval_kernel`, max(2, ceil(N / BLOCK_N)) programs: never a single block) reads the N reset
states and loops over the time steps: the flat dueling branching net's forward on this program's observations
(kernels/acting.py's `hidden_layers`: TF32 dots on operands rounded to TF32, as the learner's forward kernels
kernels/linear.py and kernels/heads.py compute them, the activations staged through the program's rows of a
scratch buffer), the greedy action (`greedy_actions`: the dueling heads, argmax with torch.argmax's first maximum),
the CartPole step (`cartpole_dynamics`: Gymnasium's operations in Gymnasium's order, each rounded as the eager
torch op on a GPU), and each env's return += 1 while its first episode runs (reward 1 on every step, the ending one
included). An episode ends when it terminates (|x| > 2.4, |theta| > 12 degrees) or after `steps` steps (the time
limit, or a shorter max_steps); an ended env is frozen, and a program stops once every episode of its block has
ended. The returns are written as float64, once, at the end; nothing is read on the host.

The plain-torch reference is the eager evaluation it replaces, `hotloop.trainer.evaluation.evaluate_reference`
(the learner's greedy forward, `CartPoleVec.step`, the masked float64 sums: the same arithmetic), which
tests/kernels/test_greedy_eval.py checks it against on fresh random weights; on a GPU bit for bit (the gpu-marked
test), on the CPU interpreter (dot sums in numpy's order, numpy's cos and sin) wherever no action was a near tie
and no state came near a termination threshold along the reference's trajectory.
Source: issue 37 item 2 ("Evaluation on the device"); the env: Gymnasium's CartPole-v1 (trainer/envs/cartpole.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotloop.kernels._common import check_tensor, interpreting, rounds_tf32_operands
from hotloop.kernels.acting import ActingNet, cartpole_dynamics, greedy_actions, hidden_layers

EVAL_BLOCK_N = 64
"""Envs per program: 64 rows, the row tile of kernels/heads.py's forward (4 warps, one warpgroup's MMA)."""
EVAL_TILES = (128, 128, 64, 1)
"""(BLOCK_R, BLOCK_K, HEADS_BLOCK_K, num_stages): the hidden layers' output-row and reduction tiles, the heads'
reduction tile and the software-pipeline depth. A program's time step is a chain of dependent (load, round, dot)
iterations, each about one memory round trip, so the fewest iterations and no pipeline win: at these tiles the
cartpole-fast net (trunk 256-256, heads 64) takes 10 per step. Measured on the H100 at c6522ec (2026-12-06,
results/h200/whole_run/eval_tilings/; results/lab/eval_paths_bench.py on a trained cartpole-fast policy, 300 envs,
500 steps): 37.9 ms per evaluation, against the captured graph's 40.8 ms and the first tiles (64, 32, 16) at
Triton's default 3 stages 108.7 ms (60 iterations per step); the same tiles at 2 stages took 93.0 ms, and at 3 they
ask for 256 KiB of shared memory, over the H100's 227 KiB per block. The sums are the same at every tiling on a GPU:
a dot over 128 columns accumulates its 8-column MMA steps in the order that chained dots over 32 or 16 do."""
_WARPS = 4
"""Warps per program (one warpgroup's MMA)."""


@triton.jit
def _greedy_eval_kernel(
    w_ptr,
    table_ptr,
    num_layers,
    out_w,
    out_b,
    out_g,
    H,
    scratch_ptr,
    MAXW,
    obs_ptr,
    total_ptr,
    N,
    steps,
    D: tl.constexpr,
    A: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HEADS_BLOCK_K: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROUND: tl.constexpr,
    TORCH_CUDA: tl.constexpr,
):
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = n < N
    x = tl.load(obs_ptr + n * 4, mask=mask_n, other=0.0)
    x_dot = tl.load(obs_ptr + n * 4 + 1, mask=mask_n, other=0.0)
    theta = tl.load(obs_ptr + n * 4 + 2, mask=mask_n, other=0.0)
    theta_dot = tl.load(obs_ptr + n * 4 + 3, mask=mask_n, other=0.0)
    running = mask_n
    total = tl.zeros((BLOCK_N,), dtype=tl.float64)
    dcol = tl.arange(0, BLOCK_D)
    inputs = scratch_ptr + N * MAXW + n * MAXW  # the forward's input rows: scratch[1]
    t = tl.full((), 0, tl.int32)
    alive = tl.max(running.to(tl.int32), axis=0)
    while (t < steps) & (alive > 0):
        tl.debug_barrier()  # every thread has read the last step's activations before they are overwritten
        tl.store(inputs, x, mask=mask_n)
        tl.store(inputs + 1, x_dot, mask=mask_n)
        tl.store(inputs + 2, theta, mask=mask_n)
        tl.store(inputs + 3, theta_dot, mask=mask_n)
        tl.debug_barrier()
        last = hidden_layers(
            w_ptr, table_ptr, num_layers, scratch_ptr, n, mask_n, N, MAXW, BLOCK_N, BLOCK_R, BLOCK_K, ROUND
        )
        greedy = greedy_actions(
            w_ptr,
            out_w,
            out_b,
            out_g,
            scratch_ptr + last * N * MAXW,
            n,
            mask_n,
            MAXW,
            H,
            D,
            A,
            BLOCK_N,
            BLOCK_J,
            HEADS_BLOCK_K,
            BLOCK_D,
            ROUND,
        )
        a0 = tl.sum(tl.where((dcol == 0)[None, :], greedy, 0), axis=1)
        nxt, terminated = cartpole_dynamics(x, x_dot, theta, theta_dot, a0, TORCH_CUDA)
        total += running.to(tl.float64)  # reward 1 while the first episode runs, its last step included
        x = tl.where(running, nxt[0], x)
        x_dot = tl.where(running, nxt[1], x_dot)
        theta = tl.where(running, nxt[2], theta)
        theta_dot = tl.where(running, nxt[3], theta_dot)
        running = running & ~terminated
        t += 1
        alive = tl.max(running.to(tl.int32), axis=0)
    tl.store(total_ptr + n, total, mask=mask_n)


def greedy_eval(
    net: ActingNet,
    weights: torch.Tensor,
    obs: torch.Tensor,
    steps: int,
    total: torch.Tensor,
    scratch: torch.Tensor,
    block_n: int = EVAL_BLOCK_N,
    tiles: tuple[int, int, int, int] = EVAL_TILES,
) -> torch.Tensor:
    """Each of N CartPole envs' first-episode return under the flat net's greedy policy, in one launch
    (`_greedy_eval_kernel`, max(2, ceil(N / block_n)) programs; module docstring).

    Args:
        net: the flat net's offsets (`ActingNet.from_layout`): 4 inputs, one branch of 2 actions.
        weights: (P,) float32 parameters, unrounded (the learner's `params`: the kernel rounds the weights it reads
            to TF32, as the learner's forward reads its rounded copy; `FlatForward`).
        obs: (N, 4) float32, the envs' reset states (x, x_dot, theta, theta_dot); read only.
        steps: the most steps an episode runs (int >= 0): the env's time limit, or a shorter max_steps.
        total: (N,) float64 output, overwritten with each env's return (steps taken up to and including the one
            that ended its episode; `steps` for one still running).
        scratch: (2, N, net.max_width) float32 workspace (overwritten).
        block_n: envs per program, a power of two >= 16.
        tiles: (BLOCK_R, BLOCK_K, HEADS_BLOCK_K, num_stages): three powers of two >= 16 and the software-pipeline
            depth, an int in 1..4 (EVAL_TILES). A tiling whose shared memory exceeds the GPU's raises
            triton's OutOfResources at the launch.
    All tensors on one device: CUDA, or the CPU under TRITON_INTERPRET=1. Returns total; no host read.
    Raises ValueError (naming the argument) for a wrong dtype, shape, device or contiguity, a net that is not
    CartPole's (4 inputs, one branch of 2 actions), steps not an int >= 0 or a bad block_n or tiles; nothing is
    launched then.
    """
    check_tensor("weights", weights, dtype=torch.float32, shape=(net.numel,))
    dev = weights.device
    check_tensor("table", net.table, dtype=torch.int64, ndim=2, device=dev)
    n = check_tensor("obs", obs, dtype=torch.float32, shape=(None, 4), device=dev).shape[0]
    if n < 1:
        raise ValueError("obs must hold at least one env, got 0 rows")
    if (net.branches, net.actions) != (1, 2):
        raise ValueError(f"net must be CartPole's: one branch of 2 actions, got {net.branches} x {net.actions}")
    check_tensor("total", total, dtype=torch.float64, shape=(n,), device=dev)
    check_tensor("scratch", scratch, dtype=torch.float32, shape=(2, n, net.max_width), device=dev)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps < 2**31:
        raise ValueError(f"steps must be an int in [0, 2**31), got {steps!r}")
    if not _pow2_at_least_16(block_n):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n!r}")
    if (
        not isinstance(tiles, tuple)
        or len(tiles) != 4
        or not all(_pow2_at_least_16(t) for t in tiles[:3])
        or tiles[3] not in (1, 2, 3, 4)
    ):
        raise ValueError(
            "tiles must be three powers of two >= 16 and num_stages in 1..4 (BLOCK_R, BLOCK_K, HEADS_BLOCK_K, "
            f"num_stages), got {tiles!r}"
        )
    block_r, block_k, heads_block_k, stages = tiles
    _greedy_eval_kernel[(max(2, triton.cdiv(n, block_n)),)](
        weights,
        net.table,
        net.table.shape[0],
        net.out_w,
        net.out_b,
        net.out_g,
        net.head_hidden,
        scratch,
        net.max_width,
        obs,
        total,
        n,
        steps,
        D=1,
        A=2,
        BLOCK_N=block_n,
        BLOCK_R=block_r,
        BLOCK_K=block_k,
        HEADS_BLOCK_K=heads_block_k,
        BLOCK_J=16,
        BLOCK_D=1,
        ROUND=rounds_tf32_operands(),
        TORCH_CUDA=not interpreting(),
        num_warps=_WARPS,
        num_stages=stages,
    )
    return total


def _pow2_at_least_16(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 16 and not v & (v - 1)

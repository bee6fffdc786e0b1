"""The pieces of acting with the flat net that the fused kernels share (kernels/actor_step.py, one env step of the
trainer's actor; kernels/greedy_eval.py, a whole greedy evaluation): the net's forward on its flat parameters, the
greedy argmax, and CartPole-v1's dynamics.

- `hidden_layers`: every hidden layer of the flat dueling branching net (trainer/flat_net.py's layout) in turn,
  relu(g * (x W^T) + b), as TF32 dots on operands rounded to TF32 (the learner's forward placement,
  kernels/linear.py), the activations staged per program through a scratch buffer (rows of one program only: a
  barrier orders them). The same expressions as kernels/linear.py's forward, so that a compiler that contracts
  `acc * g + b` into one FMA there does it here too.
- `greedy_actions`: the dueling heads Q_d = V + A_d - mean A_d (Wang et al. 2016, Tavakoli et al. 2018; the
  expressions of kernels/heads.py's forward) and argmax_a Q_d per branch, the first maximum (torch.argmax's ties).
- `cartpole_dynamics`: one CartPole-v1 step of a block of envs with Gymnasium's operations in Gymnasium's order
  (trainer/envs/cartpole.py). With TORCH_CUDA each operation rounds as the eager torch op of CartPoleVec.step does
  on a GPU, so the two agree bit for bit: products, sums and quotients correctly rounded and never contracted into
  FMAs (libdevice's __nv_fmul_rn, __nv_fadd_rn, __nv_fsub_rn, __nv_fdiv_rn: every torch op is its own kernel),
  a division by a constant as the product with its float32 reciprocal (torch's CUDA `div_true_kernel_cuda` divides
  by a CPU scalar that way), cos and sin as CUDA's cosf and sinf (__nv_cosf, __nv_sinf). Without it (the CPU
  interpreter, where libdevice is absent) plain operations (numpy: each rounded, none contracted), true division
  (torch's CPU kernel), and numpy's cos and sin, which may differ from torch's CPU ones in the last bit.
- `ActingNet`: where the flat net's parameters sit (the table the forward reads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from hotloop.kernels.tf32_split import tf32_rna

# CartPole-v1's constants (Gymnasium's; trainer/envs/cartpole.py holds the same, a test checks: kernels import no
# trainer module)
CARTPOLE_CONSTANTS = (9.8, 0.1, 0.1 + 1.0, 0.5, 0.1 * 0.5, 10.0, 0.02, 12 * 2 * math.pi / 360, 2.4, 2 * 0.05, 0.05)
"""gravity, pole mass, total mass, half length, pole mass x half length, force, tau, theta and x thresholds, the
reset span and bound; as constexpr globals below (a Triton kernel reads no other module global)."""
(
    _GRAVITY,
    _MASSPOLE,
    _TOTAL_MASS,
    _LENGTH,
    _POLEMASS_LENGTH,
    _FORCE_MAG,
    _TAU,
    _THETA_THRESHOLD,
    _X_THRESHOLD,
    RESET_SPAN,
    RESET_BOUND,
) = (tl.constexpr(c) for c in CARTPOLE_CONSTANTS)
_INV_TOTAL_MASS = tl.constexpr(float(np.float32(1.0) / np.float32(CARTPOLE_CONSTANTS[2])))
"""1 / total mass as torch's CUDA division by a scalar computes it: in float32, on the host."""


@triton.jit
def _mul(a, b, TORCH_CUDA: tl.constexpr):
    """a * b rounded once, never contracted with a neighbouring sum (see the module docstring)."""
    if TORCH_CUDA:
        return libdevice.mul_rn(a, b)
    else:
        return a * b


@triton.jit
def _add(a, b, TORCH_CUDA: tl.constexpr):
    """a + b rounded once, never contracted with a neighbouring product."""
    if TORCH_CUDA:
        return libdevice.add_rn(a, b)
    else:
        return a + b


@triton.jit
def _sub(a, b, TORCH_CUDA: tl.constexpr):
    """a - b rounded once, never contracted with a neighbouring product."""
    if TORCH_CUDA:
        return libdevice.sub_rn(a, b)
    else:
        return a - b


@triton.jit
def _div_total_mass(a, TORCH_CUDA: tl.constexpr):
    """a / total mass as torch divides by the python scalar: times its float32 reciprocal on CUDA, else divided."""
    if TORCH_CUDA:
        return libdevice.mul_rn(a, _INV_TOTAL_MASS)
    else:
        return a / _TOTAL_MASS


@triton.jit
def _cos(a, TORCH_CUDA: tl.constexpr):
    """cos(a) as CUDA's cosf on a GPU (torch.cos), numpy's on the interpreter."""
    if TORCH_CUDA:
        return libdevice.cos(a)
    else:
        return tl.cos(a)


@triton.jit
def _sin(a, TORCH_CUDA: tl.constexpr):
    """sin(a) as CUDA's sinf on a GPU (torch.sin), numpy's on the interpreter."""
    if TORCH_CUDA:
        return libdevice.sin(a)
    else:
        return tl.sin(a)


@triton.jit
def cartpole_dynamics(x, x_dot, theta, theta_dot, a0, TORCH_CUDA: tl.constexpr):
    """One CartPole-v1 step of the state columns (x, x_dot, theta, theta_dot: (BLOCK_N,) float32) under actions a0
    (1 pushes right, anything else left): trainer/envs/cartpole.py's `CartPoleVec.step` op for op, each rounded as
    the torch op (module docstring). Returns ((x', x_dot', theta', theta_dot'), terminated (BLOCK_N,) int1)."""
    force = tl.where(a0 == 1, _FORCE_MAG, -_FORCE_MAG)
    costheta = _cos(theta, TORCH_CUDA)
    sintheta = _sin(theta, TORCH_CUDA)
    # temp = (force + POLEMASS_LENGTH * (theta_dot * theta_dot) * sintheta) / TOTAL_MASS
    temp = _mul(_mul(_mul(theta_dot, theta_dot, TORCH_CUDA), _POLEMASS_LENGTH, TORCH_CUDA), sintheta, TORCH_CUDA)
    temp = _div_total_mass(_add(force, temp, TORCH_CUDA), TORCH_CUDA)
    # thetaacc = (GRAVITY * sintheta - costheta * temp) / (LENGTH * (4/3 - MASSPOLE * (costheta^2) / TOTAL_MASS))
    num = _sub(_mul(sintheta, _GRAVITY, TORCH_CUDA), _mul(costheta, temp, TORCH_CUDA), TORCH_CUDA)
    den = _div_total_mass(_mul(_mul(costheta, costheta, TORCH_CUDA), _MASSPOLE, TORCH_CUDA), TORCH_CUDA)
    den = _mul(_sub(4.0 / 3.0, den, TORCH_CUDA), _LENGTH, TORCH_CUDA)
    thetaacc = tl.math.div_rn(num, den)
    # xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
    xacc = _mul(_mul(thetaacc, _POLEMASS_LENGTH, TORCH_CUDA), costheta, TORCH_CUDA)
    xacc = _sub(temp, _div_total_mass(xacc, TORCH_CUDA), TORCH_CUDA)
    nx = _add(x, _mul(x_dot, _TAU, TORCH_CUDA), TORCH_CUDA)
    ntheta = _add(theta, _mul(theta_dot, _TAU, TORCH_CUDA), TORCH_CUDA)
    terminated = (nx < -_X_THRESHOLD) | (nx > _X_THRESHOLD) | (ntheta < -_THETA_THRESHOLD) | (ntheta > _THETA_THRESHOLD)
    nxt = (
        nx,
        _add(x_dot, _mul(xacc, _TAU, TORCH_CUDA), TORCH_CUDA),
        ntheta,
        _add(theta_dot, _mul(thetaacc, _TAU, TORCH_CUDA), TORCH_CUDA),
    )
    return nxt, terminated


@triton.jit
def hidden_layers(
    w_ptr,
    table_ptr,
    num_layers,
    scratch_ptr,
    n,
    mask_n,
    N,
    MAXW,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ROUND: tl.constexpr,
):
    """The hidden layers of the table in turn: scratch[l % 2] = relu(g * (scratch[(l + 1) % 2] W^T) + b) for this
    program's rows (the input of layer 0 is in scratch[1]), as TF32 dots on operands rounded to TF32 first where
    ROUND (kernels/linear.py's forward; `rounds_tf32_operands`). Returns the index of the buffer holding the last."""
    for layer in range(num_layers):
        w_off = tl.load(table_ptr + layer * 6)
        b_off = tl.load(table_ptr + layer * 6 + 1)
        g_off = tl.load(table_ptr + layer * 6 + 2)
        rows = tl.load(table_ptr + layer * 6 + 3)
        cols = tl.load(table_ptr + layer * 6 + 4)
        group = tl.load(table_ptr + layer * 6 + 5)
        src = scratch_ptr + ((layer + 1) % 2) * N * MAXW
        dst = scratch_ptr + (layer % 2) * N * MAXW
        for r0 in range(0, rows, BLOCK_R):
            r = r0 + tl.arange(0, BLOCK_R)
            mask_r = r < rows
            acc = tl.zeros((BLOCK_N, BLOCK_R), dtype=tl.float32)
            for k0 in range(0, cols, BLOCK_K):
                k = k0 + tl.arange(0, BLOCK_K)
                mask_k = k < cols
                x = tl.load(src + n[:, None] * MAXW + k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
                w = tl.load(
                    w_ptr + w_off + r[None, :] * cols + k[:, None], mask=mask_k[:, None] & mask_r[None, :], other=0.0
                )
                if ROUND:
                    x = tf32_rna(x)
                    w = tf32_rna(w)
                acc = tl.dot(x, w, acc, input_precision="tf32")
            g = tl.load(w_ptr + g_off + r // group, mask=mask_r, other=0.0)
            b = tl.load(w_ptr + b_off + r, mask=mask_r, other=0.0)
            y = tl.maximum(acc * g[None, :] + b[None, :], 0.0)
            tl.store(dst + n[:, None] * MAXW + r[None, :], y, mask=mask_n[:, None] & mask_r[None, :])
        tl.debug_barrier()  # the next layer reads what other threads of this program wrote
    return (num_layers + 1) % 2


@triton.jit
def greedy_actions(
    w_ptr,
    out_w,
    out_b,
    out_g,
    h_ptr,
    n,
    mask_n,
    MAXW,
    H,
    D: tl.constexpr,
    A: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROUND: tl.constexpr,
):
    """argmax_a Q_d(s, a) per branch, (BLOCK_N, BLOCK_D) int64 (the first maximum, as torch.argmax), from the stacked
    hidden output h (rows n, stride MAXW) through the dueling heads (kernels/heads.py's `heads_reference`)."""
    j = tl.arange(0, BLOCK_J)
    mask_j = j < 1 + D * A
    grp = tl.where(j == 0, 0, (j - 1) // A + 1)
    acc = tl.zeros((BLOCK_N, BLOCK_J), dtype=tl.float32)
    for blk in tl.static_range(1 + D):
        for k0 in range(0, H, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            mask_k = k < H
            x = tl.load(
                h_ptr + n[:, None] * MAXW + blk * H + k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0
            )
            w = tl.load(
                w_ptr + out_w + j[None, :] * H + k[:, None],
                mask=mask_k[:, None] & (mask_j & (grp == blk))[None, :],
                other=0.0,
            )
            if ROUND:
                x = tf32_rna(x)
                w = tf32_rna(w)
            acc = tl.dot(x, w, acc, input_precision="tf32")
    g = tl.load(w_ptr + out_g + grp, mask=mask_j, other=0.0)
    b = tl.load(w_ptr + out_b + j, mask=mask_j, other=0.0)
    out = acc * g[None, :] + b[None, :]
    value = tl.sum(tl.where((j == 0)[None, :], out, 0.0), axis=1)
    dcol = tl.arange(0, BLOCK_D)
    greedy = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.int64)
    for d in tl.static_range(D):
        sel = ((grp == d + 1) & mask_j)[None, :]
        mean_d = tl.sum(tl.where(sel, out, 0.0), axis=1) / A
        q = tl.where(sel, value[:, None] + out - mean_d[:, None], -float("inf"))
        best = tl.max(q, axis=1)
        first = tl.min(tl.where(sel & (q == best[:, None]), j[None, :], BLOCK_J), axis=1) - (1 + d * A)
        first = tl.where((first >= 0) & (first < A), first, 0)  # all-NaN Q: action 0
        greedy += tl.where((dcol == d)[None, :], first.to(tl.int64)[:, None], 0)
    return greedy


@dataclass(frozen=True)
class ActingNet:
    """Where the flat net's parameters sit, for the fused kernels' forward (trainer/flat_net.py's `FlatLayout`).

    table: (L, 6) int64 device tensor, one row per hidden layer (the trunk's, then the stacked head-hidden layer):
        w_offset, b_offset, g_offset, rows, cols, gain_group; every one followed by a ReLU.
    out_w, out_b, out_g: offsets of the output layer's W_out (1 + D A, H), b_out, g_out (1 + D,).
    head_hidden: H; branches: D; actions: A; numel: P (the buffer's length); max_width: the widest layer input or
    output (the scratch row length).
    """

    table: torch.Tensor
    out_w: int
    out_b: int
    out_g: int
    head_hidden: int
    branches: int
    actions: int
    numel: int
    max_width: int

    @classmethod
    def from_layout(cls, layout, device: torch.device) -> "ActingNet":
        """From a `hotloop.trainer.flat_net.FlatLayout` (duck-typed: layers, out, head_hidden, branches, actions,
        numel, obs_dim); the table goes to `device`."""
        rows = [(x.w_offset, x.b_offset, x.g_offset, x.rows, x.cols, x.gain_group) for x in layout.layers]
        widths = [layout.obs_dim, *(x.rows for x in layout.layers)]
        return cls(
            torch.tensor(rows, dtype=torch.int64, device=device),
            layout.out.w_offset,
            layout.out.b_offset,
            layout.out.g_offset,
            layout.head_hidden,
            layout.branches,
            layout.actions,
            layout.numel,
            max(widths),
        )

"""The two small launches around `tree_sample` in the captured learner step: counter-based uniforms (+ the annealed
importance-sampling exponent beta) before it, and the gather of the sampled transitions' actions, rewards and
terminal flags after it.

- `batch_uniforms`: u_i = Philox(seed + t, i) in [0, 1) (Salmon et al. 2011, "Parallel random numbers: as easy as
  1, 2, 3"; Triton's `tl.rand`), where t is a device-side step counter (the optimizer's step count), so eager runs
  and CUDA-graph replays draw the same numbers and nothing is read on the host. Program 0 also writes
  beta = beta_start + (beta_end - beta_start) * min(1, t / anneal_steps) (linear annealing, Schaul et al. 2016,
  Sec. 3.4) into a 0-dim device tensor that `tree_sample` reads. The actor (trainer/actor.py) uses the same launch
  for its acting and env uniforms and its linearly decayed epsilon (Mnih et al. 2015).
- `gather_transitions`: action[b] = action_src[idx[b]], reward, terminated likewise, and the observations
  transposed and split into TF32 parts, obs_t[:, :, b] = split_tf32(obs_src[idx[b]]) (what the first layer's
  weight-gradient GEMM reads, batch axis contiguous: kernels/linear.py), in one launch (the first forward layer
  reads the observations from replay storage by index).
References: `uniforms_reference` (the beta formula; the Philox stream itself is Triton's) and `gather_reference`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hotloop.kernels._common import check_tensor
from hotloop.kernels.dependent_launch import gdc_prologue, pdl_kwargs
from hotloop.kernels.tf32_split import split_tf32, tf32_hi_lo

_BLOCK = 1024


@triton.jit
def counter_uniforms(counter_ptr, seed, offs):
    """u_i = Philox(seed + t, i) for i in offs, t the int64 step counter at counter_ptr: the one place this stream
    is drawn (`batch_uniforms` and `CounterUniforms` consumers call it, so they agree bit for bit)."""
    return tl.rand(seed + tl.load(counter_ptr), offs)


@triton.jit
def annealed_beta(counter_ptr, beta_start, beta_end, anneal_steps):
    """beta_start + (beta_end - beta_start) * min(1, t / anneal_steps), t the step counter at counter_ptr: the one
    place the annealing formula is computed (`batch_uniforms` and `AnnealedBeta` consumers)."""
    frac = tl.minimum(tl.load(counter_ptr).to(tl.float32) / anneal_steps, 1.0)
    return beta_start + (beta_end - beta_start) * frac


@triton.jit
def _batch_uniforms_kernel(
    counter_ptr, out_ptr, beta_ptr, seed, n, beta_start, beta_end, anneal_steps, BLOCK: tl.constexpr
):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, counter_uniforms(counter_ptr, seed, offs), mask=offs < n)
    if pid == 0:
        tl.store(beta_ptr, annealed_beta(counter_ptr, beta_start, beta_end, anneal_steps))


@triton.jit
def _gather_transitions_kernel(
    idx_ptr,
    action_src,
    reward_src,
    term_src,
    obs_src,
    action_out,
    reward_out,
    term_out,
    obs_t_out,
    n,
    obs_dim,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_O: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    rows = tl.load(idx_ptr + offs, mask=mask, other=0)
    tl.store(reward_out + offs, tl.load(reward_src + rows, mask=mask, other=0.0), mask=mask)
    tl.store(term_out + offs, tl.load(term_src + rows, mask=mask, other=0.0), mask=mask)
    d = tl.arange(0, BLOCK_D)
    m2 = mask[:, None] & (d < D)[None, :]
    a = tl.load(action_src + rows[:, None] * D + d[None, :], mask=m2, other=0)
    tl.store(action_out + offs[:, None] * D + d[None, :], a, mask=m2)
    for o0 in range(0, obs_dim, BLOCK_O):
        o = o0 + tl.arange(0, BLOCK_O)
        mo = mask[:, None] & (o < obs_dim)[None, :]
        x = tl.load(obs_src + rows[:, None] * obs_dim + o[None, :], mask=mo, other=0.0)
        hi, lo = tf32_hi_lo(x)
        tl.store(obs_t_out + o[None, :] * n + offs[:, None], hi, mask=mo)
        tl.store(obs_t_out + obs_dim * n + o[None, :] * n + offs[:, None], lo, mask=mo)


def batch_uniforms(
    counter: torch.Tensor,
    out: torch.Tensor,
    beta: torch.Tensor,
    seed: int,
    beta_start: float,
    beta_end: float,
    anneal_steps: int,
) -> None:
    """Fill out (B,) float32 with Philox uniforms in [0, 1) keyed by (seed + counter, i), and beta (0-dim float32)
    with beta_start + (beta_end - beta_start) * min(1, counter / anneal_steps); one launch of max(2, ceil(B / 1024))
    programs.

    counter: 0-dim int64 device tensor (read only). seed: python int >= 0. anneal_steps: a number > 0 (int or
    float: the actor's epsilon decays over a fractional count of vector steps).
    Raises ValueError for wrong dtype/shape/device or bad scalars.
    """
    check_tensor("counter", counter, dtype=torch.int64, shape=())
    dev = counter.device
    check_tensor("out", out, dtype=torch.float32, ndim=1, device=dev)
    check_tensor("beta", beta, dtype=torch.float32, shape=(), device=dev)
    _check_seed(seed)
    _check_anneal_steps(anneal_steps)
    n = out.shape[0]
    _batch_uniforms_kernel[(max(2, triton.cdiv(n, _BLOCK)),)](
        counter, out, beta, seed, n, float(beta_start), float(beta_end), float(anneal_steps), BLOCK=_BLOCK
    )


def _check_seed(seed) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")


def _check_anneal_steps(anneal_steps) -> None:
    if isinstance(anneal_steps, bool) or not isinstance(anneal_steps, (int, float)) or not anneal_steps > 0:
        raise ValueError(f"anneal_steps must be a number > 0, got {anneal_steps!r}")


@dataclass(frozen=True)
class CounterUniforms:
    """Uniforms a consumer kernel draws itself instead of reading them from memory (one launch fewer): u_i =
    Philox(seed + counter, i), bit for bit the stream `batch_uniforms` writes. Used by
    `hotloop.kernels.segment_tree.tree_sample`.

    counter: 0-dim int64 device tensor (read on the device only); seed: python int >= 0.
    Raises ValueError (from `check`) for a wrong counter or seed.
    """

    counter: torch.Tensor
    seed: int

    def check(self, device: torch.device) -> None:
        """Raise ValueError unless counter is a 0-dim int64 tensor on `device` and seed an int >= 0."""
        check_tensor("uniforms.counter", self.counter, dtype=torch.int64, shape=(), device=device)
        _check_seed(self.seed)


@dataclass(frozen=True)
class AnnealedBeta:
    """The importance-sampling exponent a consumer kernel computes itself: beta = start + (end - start) *
    min(1, counter / anneal_steps) (linear annealing, Schaul et al. 2016, Sec. 3.4), bit for bit the beta
    `batch_uniforms` writes. Used by `hotloop.kernels.segment_tree.tree_sample`.

    counter: 0-dim int64 device tensor; start, end: python floats; anneal_steps: a number > 0.
    Raises ValueError (from `check`) for a wrong counter or anneal_steps.
    """

    counter: torch.Tensor
    start: float
    end: float
    anneal_steps: float

    def check(self, device: torch.device) -> None:
        """Raise ValueError unless counter is a 0-dim int64 tensor on `device` and anneal_steps a number > 0."""
        check_tensor("beta.counter", self.counter, dtype=torch.int64, shape=(), device=device)
        _check_anneal_steps(self.anneal_steps)


def gather_transitions(
    idx: torch.Tensor,
    action_src: torch.Tensor,
    reward_src: torch.Tensor,
    term_src: torch.Tensor,
    obs_src: torch.Tensor,
    action_out: torch.Tensor,
    reward_out: torch.Tensor,
    term_out: torch.Tensor,
    obs_t_out: torch.Tensor,
) -> None:
    """action_out[b] = action_src[idx[b]] (B, D) int64; reward_out, term_out (B,) float32 likewise; obs_t_out[:, :, b]
    = split_tf32(obs_src[idx[b]]) ((2, obs_dim, B) float32: the observations transposed and split into TF32 parts
    [hi, lo], kernels/tf32_split.py); one launch of max(2, ceil(B / 64)) programs.

    idx: (B,) int64 slots in [0, C) (not bounds-checked on the device); *_src: replay storage (C, D) / (C,) /
    (C, obs_dim).
    Raises ValueError for wrong dtype/shape/device/contiguity.
    """
    check_tensor("idx", idx, dtype=torch.int64, ndim=1)
    dev, n = idx.device, idx.shape[0]
    check_tensor("action_src", action_src, dtype=torch.int64, ndim=2, device=dev)
    cap, branches = action_src.shape
    obs_dim = check_tensor("obs_src", obs_src, dtype=torch.float32, ndim=2, device=dev).shape[1]
    for name, t, dtype, shape in (
        ("reward_src", reward_src, torch.float32, (cap,)),
        ("term_src", term_src, torch.float32, (cap,)),
        ("obs_src", obs_src, torch.float32, (cap, None)),
        ("action_out", action_out, torch.int64, (n, branches)),
        ("reward_out", reward_out, torch.float32, (n,)),
        ("term_out", term_out, torch.float32, (n,)),
        ("obs_t_out", obs_t_out, torch.float32, (2, obs_dim, n)),
    ):
        check_tensor(name, t, dtype=dtype, shape=shape, device=dev)
    block = 64  # 128 programs for a batch of 8192: the observations are most of the bytes
    _gather_transitions_kernel[(max(2, triton.cdiv(n, block)),)](
        idx,
        action_src,
        reward_src,
        term_src,
        obs_src,
        action_out,
        reward_out,
        term_out,
        obs_t_out,
        n,
        obs_dim,
        D=branches,
        BLOCK=block,
        BLOCK_D=triton.next_power_of_2(branches),
        BLOCK_O=min(32, max(16, triton.next_power_of_2(obs_dim))),
        **pdl_kwargs(),
    )


def uniforms_reference(step: int, beta_start: float, beta_end: float, anneal_steps: int) -> float:
    """The beta `batch_uniforms` writes at step counter `step` (python float)."""
    return beta_start + (beta_end - beta_start) * min(1.0, step / anneal_steps)


def gather_reference(idx, action_src, reward_src, term_src, obs_src):
    """Plain-torch (action_src[idx], reward_src[idx], term_src[idx], split_tf32(obs_src[idx].T))."""
    return action_src[idx], reward_src[idx], term_src[idx], split_tf32(obs_src[idx].T)

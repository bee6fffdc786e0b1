"""Fused global grad-norm + clip + Adam (+ Polyak target update) over flat fp32 buffers, in two launches.

Semantics are those of `torch.nn.utils.clip_grad_norm_` (torch/nn/utils/clip_grad.py: total L2 norm, coefficient
min(1, max_norm / (norm + 1e-6))) followed by `torch.optim.Adam` (torch/optim/adam.py `_single_tensor_adam`,
non-amsgrad, L2 weight decay added to the clipped gradient; Kingma & Ba 2015), and optionally the soft target
update target <- lerp(target, param, tau) (Polyak averaging as in Lillicrap et al. 2016; tau = 1 is a hard copy).

Launch 1 (`_grad_sumsq_kernel`, grid-stride, up to 1024 programs) writes one fp32 sum of squares per program into
`partials` (every slot overwritten each call, so no memset); its program 0 alone increments the int64 step counter
and writes the step's two bias-correction scalars. Launch 2 (`_clip_adam_kernel`, one program per 1024 elements)
has every program read all partials, form the same norm and clip coefficient, and update its slice of
param / exp_avg / exp_avg_sq (/ target). Kernel order on the stream is the only synchronisation: no atomics,
no spin-waits, no host reads, no grid of one block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotloop.kernels._common import check_tensor
from hotloop.kernels.dependent_launch import gdc_prologue, pdl_kwargs

_BLOCK_NORM = 1024  # elements per program per grid-stride iteration of launch 1
_BLOCK_ADAM = 1024  # elements per program of launch 2
_MAX_PARTIALS = 1024  # cap on launch-1 programs = partial sums each launch-2 program reads
_MIN_GRID = 2  # never launch a grid of one block, however small the buffer
_MAX_PARAMS = 2**30  # keeps int32 offsets (start + grid * BLOCK) from overflowing


@triton.jit
def _pow_int(base, e):
    """base ** e for a float64 scalar base and an int64 scalar e >= 0, by binary exponentiation."""
    result = base * 0.0 + 1.0
    while e > 0:
        result = tl.where((e & 1) == 1, result * base, result)
        base = base * base
        e = e >> 1
    return result


@triton.jit
def _grad_sumsq_kernel(
    grad_ptr,
    partials_ptr,
    step_ptr,
    lr_ptr,
    hyper_ptr,
    scalars_ptr,
    n,
    lr_decay_steps,
    LR_DECAYS: tl.constexpr,
    BLOCK: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        idx = start + offs
        g = tl.load(grad_ptr + idx, mask=idx < n, other=0.0)
        acc += g * g
    tl.store(partials_ptr + pid, tl.sum(acc, axis=0))
    if pid == 0:
        # Only this program touches `step` in this launch; launch 2 reads what it wrote.
        t = tl.load(step_ptr) + 1
        tl.store(step_ptr, t)
        bias_correction1 = 1.0 - _pow_int(tl.load(hyper_ptr), t)  # float64, like torch's python floats
        bias_correction2 = 1.0 - _pow_int(tl.load(hyper_ptr + 1), t)
        lr = tl.load(lr_ptr).to(tl.float64)
        if LR_DECAYS:  # LinearLR's factor after t - 1 scheduler steps: 1 + (end - 1) * min(t - 1, T) / T
            done = tl.minimum(t - 1, lr_decay_steps).to(tl.float64)
            lr = lr * (1.0 + (tl.load(hyper_ptr + 2) - 1.0) * done / lr_decay_steps)
        step_size = lr / bias_correction1
        tl.store(scalars_ptr, step_size.to(tl.float32))
        tl.store(scalars_ptr + 1, tl.sqrt_rn(bias_correction2.to(tl.float32)))


@triton.jit
def _clip_adam_kernel(
    param_ptr,
    grad_ptr,
    exp_avg_ptr,
    exp_avg_sq_ptr,
    target_ptr,
    partials_ptr,
    scalars_ptr,
    norm_ptr,
    step_ptr,
    target_every,
    n,
    num_partials,
    beta2,
    one_minus_beta1,
    one_minus_beta2,
    eps,
    weight_decay,
    max_norm,
    tau,
    HAS_WD: tl.constexpr,
    BETA1_SMALL: tl.constexpr,
    HAS_TARGET: tl.constexpr,
    TAU_SMALL: tl.constexpr,
    BLOCK: tl.constexpr,
    PBLOCK: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    pid = tl.program_id(0)
    poffs = tl.arange(0, PBLOCK)
    partials = tl.load(partials_ptr + poffs, mask=poffs < num_partials, other=0.0)
    norm = tl.sqrt_rn(tl.sum(partials, axis=0))  # identical in every program: same data, same order
    coef = tl.div_rn(max_norm, norm + 1e-6)
    coef = tl.where(coef > 1.0, 1.0, coef)  # clamp(max=1) keeps a NaN norm NaN, as torch does
    if pid == 0:
        tl.store(norm_ptr, norm)
    step_size = tl.load(scalars_ptr)
    bias_correction2_sqrt = tl.load(scalars_ptr + 1)

    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    p = tl.load(param_ptr + offs, mask=mask, other=0.0)
    g = tl.load(grad_ptr + offs, mask=mask, other=0.0) * coef
    if HAS_WD:
        g = g + weight_decay * p
    # exp_avg.lerp_(g, 1 - beta1) and target.lerp_(p, tau) with torch.lerp's two formulas (inlined: cheaper in the
    # interpreter): start + w * (end - start) if w < 0.5, else end - (end - start) * (1 - w).
    m = tl.load(exp_avg_ptr + offs, mask=mask, other=0.0)
    if BETA1_SMALL:
        m = m + one_minus_beta1 * (g - m)
    else:
        m = g - (g - m) * (1.0 - one_minus_beta1)
    v = tl.load(exp_avg_sq_ptr + offs, mask=mask, other=0.0) * beta2 + one_minus_beta2 * g * g
    denom = tl.div_rn(tl.sqrt_rn(v), bias_correction2_sqrt) + eps
    p = p - step_size * tl.div_rn(m, denom)
    tl.store(exp_avg_ptr + offs, m, mask=mask)
    tl.store(exp_avg_sq_ptr + offs, v, mask=mask)
    tl.store(param_ptr + offs, p, mask=mask)
    if HAS_TARGET:
        if tl.load(step_ptr) % target_every == 0:  # hard or soft update on this step (device-side)
            target = tl.load(target_ptr + offs, mask=mask, other=0.0)
            if TAU_SMALL:
                target = target + tau * (p - target)
            else:
                target = p - (p - target) * (1.0 - tau)
            tl.store(target_ptr + offs, target, mask=mask)


class FusedAdam:
    """Global grad-norm clip + Adam over one flat fp32 parameter buffer, two Triton launches per step.

    Args:
        num_params: P, length of the flat buffers (1 <= P <= 2**30).
        device: where the state lives (CUDA, or CPU under TRITON_INTERPRET=1).
        lr: learning rate, a python float or a 0-dim float32/float64 tensor on `device` that is read by the kernel
            at every step (so a schedule can update it in place, also under CUDA-graph replay).
        betas, eps, weight_decay: as torch.optim.Adam (weight_decay is L2 added to the gradient, not AdamW).
        max_grad_norm: clip threshold of the global L2 norm, as torch.nn.utils.clip_grad_norm_(max_norm=...).
        lr_end_factor, lr_decay_steps: a linear learning-rate decay computed on the device from the step count:
            step t (1-based) uses lr * (1 + (lr_end_factor - 1) * min(t - 1, lr_decay_steps) / lr_decay_steps), the
            factor of torch.optim.lr_scheduler.LinearLR(start_factor=1, end_factor=lr_end_factor,
            total_iters=lr_decay_steps) stepped after every optimizer step; lr_decay_steps = 0 (default) or
            lr_end_factor = 1 keeps lr constant.

    State on `device`: exp_avg, exp_avg_sq (P,) float32 (zeros at start), step () int64 (0 at start, +1 per call,
    incremented inside launch 1), grad_norm () float32 (pre-clip total norm of the last call), plus scratch that
    each call fully overwrites: partials (G,) float32 with G = clamp(ceil(P / 1024), 2, 1024), and two float32
    bias-correction scalars. Hyper-parameters other than a tensor lr are fixed for the object's life.

    Raises ValueError for a non-positive or too large num_params, lr < 0, eps < 0, betas outside [0, 1),
    weight_decay < 0, max_grad_norm <= 0, lr_end_factor outside [0, 1], lr_decay_steps not an int >= 0, or an lr
    tensor of the wrong dtype/shape/device.
    Source: torch/optim/adam.py `_single_tensor_adam`; torch/nn/utils/clip_grad.py; torch/optim/lr_scheduler.py
    `LinearLR`.
    """

    def __init__(
        self,
        num_params: int,
        device: torch.device | str,
        lr: float | torch.Tensor,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        max_grad_norm: float = 10.0,
        lr_end_factor: float = 1.0,
        lr_decay_steps: int = 0,
    ):
        if not isinstance(num_params, int) or not 1 <= num_params <= _MAX_PARAMS:
            raise ValueError(f"num_params must be an int in [1, {_MAX_PARAMS}], got {num_params!r}")
        beta1, beta2 = (float(b) for b in betas)
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
            raise ValueError(f"betas must lie in [0, 1), got {betas!r}")
        if not eps >= 0.0:
            raise ValueError(f"eps must be >= 0, got {eps!r}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
        if not max_grad_norm > 0.0:
            raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm!r}")
        if not 0.0 <= lr_end_factor <= 1.0:
            raise ValueError(f"lr_end_factor must lie in [0, 1], got {lr_end_factor!r}")
        if isinstance(lr_decay_steps, bool) or not isinstance(lr_decay_steps, int) or lr_decay_steps < 0:
            raise ValueError(f"lr_decay_steps must be an int >= 0, got {lr_decay_steps!r}")
        self.num_params = num_params
        self.device = torch.device(device)
        if isinstance(lr, torch.Tensor):
            self.lr = check_tensor("lr", lr, dtype=(torch.float32, torch.float64), shape=(), device=self.device)
        else:
            if not lr >= 0.0:
                raise ValueError(f"lr must be >= 0, got {lr!r}")
            self.lr = torch.tensor(float(lr), dtype=torch.float64, device=self.device)
        self.betas, self.eps, self.weight_decay = (beta1, beta2), float(eps), float(weight_decay)
        self.max_grad_norm = float(max_grad_norm)
        self.lr_decay_steps = lr_decay_steps if lr_end_factor != 1.0 else 0
        self._hyper64 = torch.tensor([beta1, beta2, lr_end_factor], dtype=torch.float64, device=self.device)
        self.exp_avg = torch.zeros(num_params, dtype=torch.float32, device=self.device)
        self.exp_avg_sq = torch.zeros(num_params, dtype=torch.float32, device=self.device)
        self.step_count = torch.zeros((), dtype=torch.int64, device=self.device)
        self.grad_norm = torch.empty((), dtype=torch.float32, device=self.device)
        num_partials = min(max(triton.cdiv(num_params, _BLOCK_NORM), _MIN_GRID), _MAX_PARTIALS)
        self.partials = torch.empty(num_partials, dtype=torch.float32, device=self.device)
        self._scalars = torch.empty(2, dtype=torch.float32, device=self.device)  # step_size, sqrt(bias_corr2)

    def step(
        self,
        params_buf: torch.Tensor,
        grad_buf: torch.Tensor,
        target_buf: torch.Tensor | None = None,
        tau: float = 1.0,
        target_every: int = 1,
    ) -> torch.Tensor:
        """One clip + Adam step, in place on params_buf (and target_buf); grad_buf is only read (not clipped).

        params_buf, grad_buf, target_buf: (P,) float32 contiguous on the optimizer's device; target_buf, if given,
        becomes lerp(target, new_param, tau) with 0 < tau <= 1 (python float, fixed per run; 1.0 = hard copy) on
        the steps whose device step count (after this call's increment) is a multiple of `target_every` (int >= 1;
        decided on the device, so one captured graph does both kinds of step).
        Returns self.grad_norm, a () float32 device tensor holding the pre-clip global L2 norm of grad_buf; it is
        overwritten by the next call (clone it to keep it). No host sync; capturable in a CUDA graph once both
        kernels are compiled. Raises ValueError for a wrong shape/dtype/device, tau outside (0, 1], or a
        target_buf that aliases params_buf or grad_buf.
        """
        shape = (self.num_params,)
        check_tensor("params_buf", params_buf, dtype=torch.float32, shape=shape, device=self.device)
        check_tensor("grad_buf", grad_buf, dtype=torch.float32, shape=shape, device=self.device)
        if target_buf is not None:
            check_tensor("target_buf", target_buf, dtype=torch.float32, shape=shape, device=self.device)
            if target_buf.data_ptr() in (params_buf.data_ptr(), grad_buf.data_ptr()):
                raise ValueError("target_buf must not alias params_buf or grad_buf")
            if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0.0 < tau <= 1.0:
                raise ValueError(f"tau must be a python float in (0, 1], got {tau!r}")
            if isinstance(target_every, bool) or not isinstance(target_every, int) or target_every < 1:
                raise ValueError(f"target_every must be an int >= 1, got {target_every!r}")
        tau = float(tau) if target_buf is not None else 1.0
        num_partials = self.partials.numel()
        _grad_sumsq_kernel[(num_partials,)](
            grad_buf,
            self.partials,
            self.step_count,
            self.lr,
            self._hyper64,
            self._scalars,
            self.num_params,
            self.lr_decay_steps,
            LR_DECAYS=self.lr_decay_steps > 0,
            BLOCK=_BLOCK_NORM,
            **pdl_kwargs(),
        )
        beta1, beta2 = self.betas
        grid = (max(triton.cdiv(self.num_params, _BLOCK_ADAM), _MIN_GRID),)
        _clip_adam_kernel[grid](
            params_buf,
            grad_buf,
            self.exp_avg,
            self.exp_avg_sq,
            params_buf if target_buf is None else target_buf,
            self.partials,
            self._scalars,
            self.grad_norm,
            self.step_count,
            int(target_every),
            self.num_params,
            num_partials,
            beta2,
            1.0 - beta1,
            1.0 - beta2,
            self.eps,
            self.weight_decay,
            self.max_grad_norm,
            tau,
            HAS_WD=self.weight_decay != 0.0,
            BETA1_SMALL=1.0 - beta1 < 0.5,
            HAS_TARGET=target_buf is not None,
            TAU_SMALL=tau < 0.5,
            BLOCK=_BLOCK_ADAM,
            PBLOCK=triton.next_power_of_2(num_partials),
            **pdl_kwargs(),
        )
        return self.grad_norm

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Copies of the device state: 'step' () int64, 'exp_avg' and 'exp_avg_sq' (P,) float32."""
        return {"step": self.step_count.clone(), "exp_avg": self.exp_avg.clone(), "exp_avg_sq": self.exp_avg_sq.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy `state` (as from state_dict, any device) into the existing tensors, keeping their addresses so a
        captured CUDA graph stays valid. Raises ValueError for missing keys or wrong shapes."""
        for key, shape in (("step", ()), ("exp_avg", (self.num_params,)), ("exp_avg_sq", (self.num_params,))):
            if key not in state or not isinstance(state[key], torch.Tensor):
                raise ValueError(f"state must hold a tensor under {key!r}, got keys {sorted(state)}")
            if tuple(state[key].shape) != shape:
                raise ValueError(f"state[{key!r}] must have shape {shape}, got {tuple(state[key].shape)}")
        self.step_count.copy_(state["step"])
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])


def reference_params(
    params_buf: torch.Tensor, grad_buf: torch.Tensor, shapes: list[tuple[int, ...]]
) -> list[torch.nn.Parameter]:
    """Parameters aliasing consecutive slices of params_buf (P,) with `.grad` aliasing the same slices of grad_buf,
    in `shapes` order (their numels must sum to P; ValueError otherwise). Any dtype/device; nothing is copied."""
    sizes = [int(torch.Size(s).numel()) for s in shapes]
    if sum(sizes) != params_buf.numel() or grad_buf.shape != params_buf.shape:
        raise ValueError(
            f"shapes {shapes} (total {sum(sizes)}) must tile params_buf {tuple(params_buf.shape)} and "
            f"grad_buf {tuple(grad_buf.shape)}"
        )
    params, offset = [], 0
    for shape, size in zip(shapes, sizes):
        p = torch.nn.Parameter(params_buf[offset : offset + size].view(shape))
        p.grad = grad_buf[offset : offset + size].view(shape)
        params.append(p)
        offset += size
    return params


def adam_reference(
    optimizer: torch.optim.Adam,
    max_grad_norm: float,
    params_buf: torch.Tensor | None = None,
    target_buf: torch.Tensor | None = None,
    tau: float = 1.0,
) -> torch.Tensor:
    """Plain-torch reference step: clip_grad_norm_ over the optimizer's parameters (clipping their .grad in
    place), optimizer.step(), then target_buf.lerp_(params_buf, tau) when target_buf is given. The parameters
    should come from `reference_params`, so the flat buffers change in place. Returns the pre-clip total norm
    (0-dim tensor, parameters' dtype/device). Source: torch.nn.utils.clip_grad_norm_, torch.optim.Adam."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    if target_buf is not None:
        target_buf.lerp_(params_buf, tau)
    return norm

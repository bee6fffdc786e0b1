"""Fused Double-DQN TD loss for a branching dueling Q-network: target, TD errors, loss, dL/dq, PER priorities and
the reduced metrics in one Triton launch.

Sources: Double DQN target (van Hasselt, Guez & Silver 2016, "Deep RL with Double Q-learning") with the branching
"mean" operator of BDQ (Tavakoli, Pardo & Kormushev 2018, "Action Branching Architectures for Deep RL");
importance-weighted Huber/MSE TD loss and proportional priorities p = (|delta| + eps)^alpha (Schaul et al. 2016,
PER); discrete CQL(H) regularizer (Kumar et al. 2020). The plain-torch terms it matches are `kernels/losses.py`
(double_dqn_target, chosen_q, td_loss, cql_term) combined as in `trainer/learner.py` (objective = td_loss +
cql_weight * cql; priorities from mean_d |td_d|).

Design (one launch, grid = max(2, ceil(B / BLOCK_B)) programs, BLOCK_B = 32 rows: 256 programs at B = 8192):
- each program owns BLOCK_B samples: it computes the target, td, per-sample loss, priorities and the analytic
  gradient dL/dq of its rows (a -w_b rho'(td_bd) / (B D) spike at the taken action, plus
  cql_weight (softmax_a - onehot) / (B D) with CQL), so the backward pass is only `grad * grad_output`;
- reductions need no memset: every program fully overwrites its own row of a `partials` (P, 8) workspace, then
  (after a CTA barrier) takes a ticket with an acq_rel atomic_add on an int32 `counter`. The program that draws
  ticket P - 1 is the last one done: it sums all partial rows in a fixed order (deterministic), writes the
  `metrics` slots and the objective, and resets the counter to 0 with atomic_xchg. Nothing spins, so the Triton
  interpreter (which runs programs one after another) is fine. The counter is zeroed once when it is created
  (`TDLossWorkspace.create`, or the per-device cache on the first, uncaptured call) and is left at 0 by every
  launch; one launch per counter may be in flight (give each concurrent stream its own workspace).
- no host syncs: hyper-parameters are fixed Python constants of a run (kind and cql_weight > 0 select
  compile-time branches), and nothing reads a device value, so the call can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from hotloop.kernels._common import check_tensor
from hotloop.kernels.dependent_launch import gdc_prologue, pdl_kwargs
from hotloop.kernels.losses import chosen_q, cql_term, double_dqn_target, td_loss

METRIC_NAMES = ("objective", "td_loss", "td_abs_mean", "q_mean", "cql")
"""Slots of the `metrics` (5,) tensor, in order."""

_NUM_SLOTS = 8  # partial-row width (power of two >= 4 partial sums)
_BLOCK_B = 32  # samples per program
_BLOCK_P = 128  # partial rows summed per step by the last program
_COUNTERS: dict[torch.device, torch.Tensor] = {}


@triton.jit
def _td_loss_kernel(
    q_ptr,
    qno_ptr,
    qnt_ptr,
    action_ptr,
    reward_ptr,
    term_ptr,
    weight_ptr,
    target_ptr,
    td_ptr,
    per_sample_ptr,
    prio_ptr,
    grad_ptr,
    metrics_ptr,
    objective_ptr,
    partials_ptr,
    counter_ptr,
    B,
    num_actions,
    num_programs,
    gamma,
    huber_delta,
    cql_weight,
    per_eps,
    per_alpha,
    inv_bd,
    y_max,
    NUM_BRANCHES: tl.constexpr,
    HUBER: tl.constexpr,
    USE_CQL: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_A: tl.constexpr,
    NUM_SLOTS: tl.constexpr,
    BLOCK_P: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    pid = tl.program_id(0)
    rows = pid * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.arange(0, BLOCK_A)
    row_ok = rows < B
    # Rows past B re-read row B - 1 (finite values, no masks on loads); only stores and partial sums mask them.
    rows64 = tl.minimum(rows, B - 1).to(tl.int64)
    col_ok = (cols < num_actions)[None, :]
    tile_ok = row_ok[:, None] & col_ok
    row_base = rows64[:, None] * (NUM_BRANCHES * num_actions) + cols[None, :]

    # Double DQN bootstrap: mean_d Q_d^target(s', argmax_a Q_d^online(s', a)), first index on ties (as torch).
    boot = tl.zeros([BLOCK_B], dtype=tl.float32)
    for d in tl.static_range(NUM_BRANCHES):
        qo = tl.load(qno_ptr + row_base + d * num_actions, mask=col_ok, other=float("-inf"))
        qt = tl.load(qnt_ptr + row_base + d * num_actions, mask=col_ok, other=0.0)
        best = tl.max(qo, axis=1)
        first = tl.min(tl.where(qo == best[:, None], cols[None, :], BLOCK_A), axis=1)
        boot += tl.sum(tl.where(cols[None, :] == first[:, None], qt, 0.0), axis=1)
    reward = tl.load(reward_ptr + rows64)
    term = tl.load(term_ptr + rows64)
    w = tl.load(weight_ptr + rows64)
    y = tl.minimum(reward + gamma * (1.0 - term) * (boot / NUM_BRANCHES), y_max)  # y_max: inf when off

    rho_sum = tl.zeros([BLOCK_B], dtype=tl.float32)
    abs_sum = tl.zeros([BLOCK_B], dtype=tl.float32)
    q_sum = tl.zeros([BLOCK_B], dtype=tl.float32)
    cql_sum = tl.zeros([BLOCK_B], dtype=tl.float32)
    coeff = -w * inv_bd
    for d in tl.static_range(NUM_BRANCHES):
        qv = tl.load(q_ptr + row_base + d * num_actions, mask=col_ok, other=float("-inf"))
        act = tl.load(action_ptr + rows64 * NUM_BRANCHES + d)
        onehot = cols[None, :] == act[:, None]
        q_taken = tl.sum(tl.where(onehot, qv, 0.0), axis=1)
        td = y - q_taken
        tl.store(td_ptr + rows64 * NUM_BRANCHES + d, td, mask=row_ok)
        abs_td = tl.abs(td)
        if HUBER:
            rho = tl.where(abs_td < huber_delta, 0.5 * td * td, huber_delta * (abs_td - 0.5 * huber_delta))
            drho = tl.minimum(tl.maximum(td, -huber_delta), huber_delta)
        else:
            rho = 0.5 * td * td
            drho = td
        grad = tl.where(onehot, (coeff * drho)[:, None], 0.0)
        if USE_CQL:
            m = tl.max(qv, axis=1)
            e = tl.exp(qv - m[:, None])
            s = tl.sum(e, axis=1)
            cql_sum += m + tl.log(s) - q_taken
            grad += (cql_weight * inv_bd) * (e / s[:, None] - tl.where(onehot, 1.0, 0.0))
        tl.store(grad_ptr + row_base + d * num_actions, grad, mask=tile_ok)
        rho_sum += rho
        abs_sum += abs_td
        q_sum += q_taken

    td_abs = abs_sum / NUM_BRANCHES
    tl.store(target_ptr + rows, y, mask=row_ok)
    tl.store(per_sample_ptr + rows, (w * rho_sum + cql_weight * cql_sum) / NUM_BRANCHES, mask=row_ok)
    tl.store(prio_ptr + rows, tl.exp(per_alpha * tl.log(td_abs + per_eps)), mask=row_ok)

    # Per-program partial sums; rows past B (duplicates of row B - 1) contribute 0.
    slots = tl.arange(0, NUM_SLOTS)
    p0 = tl.sum(tl.where(row_ok, w * rho_sum, 0.0), axis=0)
    p1 = tl.sum(tl.where(row_ok, abs_sum, 0.0), axis=0)
    p2 = tl.sum(tl.where(row_ok, q_sum, 0.0), axis=0)
    p3 = tl.sum(tl.where(row_ok, cql_sum, 0.0), axis=0)
    part = tl.where(slots == 0, p0, tl.where(slots == 1, p1, tl.where(slots == 2, p2, tl.where(slots == 3, p3, 0.0))))
    tl.store(partials_ptr + pid * NUM_SLOTS + slots, part)
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == num_programs - 1:
        acc = tl.zeros([BLOCK_P, NUM_SLOTS], dtype=tl.float32)
        for start in range(0, num_programs, BLOCK_P):
            prow = start + tl.arange(0, BLOCK_P)
            acc += tl.load(
                partials_ptr + prow[:, None] * NUM_SLOTS + slots[None, :],
                mask=(prow < num_programs)[:, None],
                other=0.0,
                cache_modifier=".cg",
            )
        tot = tl.sum(acc, axis=0) * inv_bd
        loss = tl.sum(tl.where(slots == 0, tot, 0.0), axis=0)
        td_abs_mean = tl.sum(tl.where(slots == 1, tot, 0.0), axis=0)
        q_mean = tl.sum(tl.where(slots == 2, tot, 0.0), axis=0)
        cql = tl.sum(tl.where(slots == 3, tot, 0.0), axis=0)
        objective = loss + cql_weight * cql
        metric = tl.where(
            slots == 0,
            objective,
            tl.where(slots == 1, loss, tl.where(slots == 2, td_abs_mean, tl.where(slots == 3, q_mean, cql))),
        )
        tl.store(metrics_ptr + slots, metric, mask=slots < 5)
        tl.store(objective_ptr, objective)
        tl.atomic_xchg(counter_ptr, 0, sem="acq_rel", scope="gpu")


class TDLossOutputs(NamedTuple):
    """Everything one fused TD-loss pass produces; float32 tensors on q's device (B batch, D branches, A actions).

    Fields:
        objective: () the differentiable loss td_loss + cql_weight * cql (what `loss.backward()` is called on).
        target: (B,) Double-DQN targets y_b (no gradient).
        td: (B, D) TD errors y_b - Q_d(s_b, a_bd).
        per_sample: (B,) per-sample contributions, objective = mean_b per_sample:
            w_b mean_d rho(td_bd) + cql_weight mean_d [logsumexp_a Q_d(s_b, a) - Q_d(s_b, a_bd)].
        priorities: (B,) new PER priorities (mean_d |td_bd| + per_eps) ** per_alpha, for the sum-tree update.
        metrics: (5,) device slots named by METRIC_NAMES: objective, td_loss (importance-weighted, mean over
            branches then batch), td_abs_mean (mean |td|), q_mean (mean chosen Q, as the learner reports it), cql
            (0 when cql_weight == 0).
        grad: (B, D, A) dObjective/dq for grad_output = 1; None in `td_loss_reference`'s result.
    """

    objective: torch.Tensor
    target: torch.Tensor
    td: torch.Tensor
    per_sample: torch.Tensor
    priorities: torch.Tensor
    metrics: torch.Tensor
    grad: torch.Tensor | None

    @staticmethod
    def empty(batch: int, branches: int, actions: int, device: torch.device | str) -> TDLossOutputs:
        """Uninitialized float32 output buffers for a (batch, branches, actions) problem on `device`."""

        def new(*shape: int) -> torch.Tensor:
            return torch.empty(shape, dtype=torch.float32, device=device)

        return TDLossOutputs(
            new(),
            new(batch),
            new(batch, branches),
            new(batch),
            new(batch),
            new(len(METRIC_NAMES)),
            new(batch, branches, actions),
        )


class TDLossWorkspace(NamedTuple):
    """Reduction workspace of the fused TD loss.

    Fields:
        partials: (P, 8) float32, P = max(2, ceil(B / 32)) programs; fully overwritten by every launch (any
            initial contents, even NaN, are fine).
        counter: (1,) int32 ticket counter; must be 0 before a launch and is 0 after it (the last program resets
            it). One launch per counter in flight at a time.
    """

    partials: torch.Tensor
    counter: torch.Tensor

    @staticmethod
    def create(batch: int, device: torch.device | str) -> TDLossWorkspace:
        """A workspace for batch size `batch` on `device` (the counter zeroed here, once)."""
        return TDLossWorkspace(
            torch.empty(_num_programs(batch), _NUM_SLOTS, dtype=torch.float32, device=device),
            torch.zeros(1, dtype=torch.int32, device=device),
        )


def _num_programs(batch: int) -> int:
    """Grid size: one program per 32 samples, at least 2 (no single-block launch even for tiny batches)."""
    return max(2, triton.cdiv(batch, _BLOCK_B))


def _default_workspace(batch: int, device: torch.device) -> TDLossWorkspace:
    """Fresh partials (torch.empty) and the device's cached counter, created zeroed on the first call."""
    counter = _COUNTERS.get(device)
    if counter is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise ValueError(
                "fused_td_loss: no counter cached for this device during CUDA-graph capture; call it "
                "once before capturing (warm-up) or pass workspace=TDLossWorkspace.create(...)"
            )
        counter = _COUNTERS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    partials = torch.empty(_num_programs(batch), _NUM_SLOTS, dtype=torch.float32, device=device)
    return TDLossWorkspace(partials, counter)


def _check_scalars(
    gamma: float,
    kind: str,
    huber_delta: float,
    cql_weight: float,
    per_eps: float,
    per_alpha: float,
    target_max: float = 0.0,
) -> None:
    """Raise ValueError naming the first hyper-parameter that is not a finite real number in its range."""
    if kind not in ("huber", "mse"):
        raise ValueError(f"kind must be 'huber' or 'mse', got {kind!r}")
    checks = (
        ("gamma", gamma, lambda v: 0.0 <= v <= 1.0, "in [0, 1]"),
        ("huber_delta", huber_delta, lambda v: v > 0.0, "> 0"),
        ("cql_weight", cql_weight, lambda v: v >= 0.0, ">= 0"),
        ("per_eps", per_eps, lambda v: v > 0.0, "> 0"),
        ("per_alpha", per_alpha, lambda v: v >= 0.0, ">= 0"),
        ("target_max", target_max, lambda v: v >= 0.0, ">= 0 (0: no clip)"),
    )
    for name, value, ok, what in checks:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
            raise ValueError(f"{name} must be a finite number {what}, got {value!r}")


def td_loss_forward(
    q: torch.Tensor,
    q_next_online: torch.Tensor,
    q_next_target: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    weights: torch.Tensor,
    gamma: float,
    kind: str = "huber",
    huber_delta: float = 1.0,
    cql_weight: float = 0.0,
    per_eps: float = 1e-6,
    per_alpha: float = 0.6,
    out: TDLossOutputs | None = None,
    workspace: TDLossWorkspace | None = None,
    target_max: float = 0.0,
) -> TDLossOutputs:
    """Launch the fused TD-loss kernel once (no autograd; `fused_td_loss` is the differentiable entry point).

    Args:
        q: (B, D, A) float32 online Q(s, .) per branch, all branches of equal size A (stack the branch outputs).
        q_next_online, q_next_target: (B, D, A) float32 online / target Q(s', .) (read only; no gradient).
        action: (B, D) int64 actions taken, each in [0, A) (not checked on the device: that would need a sync).
        reward, terminated, weights: (B,) float32 rewards, 1.0-where-terminal flags, importance-sampling weights.
        gamma: discount in [0, 1]. kind: 'huber' or 'mse' (0.5 td^2). huber_delta: > 0.
        cql_weight: >= 0, 0 turns the CQL term off (compiled out). per_eps: > 0. per_alpha: >= 0.
        target_max: >= 0; when > 0 every TD target is clipped to at most target_max (`double_dqn_target`'s
            `target_max`: the most discounted return the rewards allow); 0 = no clip.
        out: optional preallocated `TDLossOutputs.empty(B, D, A, device)` (e.g. static buffers for a CUDA graph);
            every element is overwritten.
        workspace: optional `TDLossWorkspace.create(B, device)`; default: fresh partials and a per-device cached
            counter (created on the first call, which must not be under CUDA-graph capture).
    All tensors contiguous, on one device (CUDA, or the CPU under TRITON_INTERPRET=1).
    Returns: `out` (or new buffers) filled; `objective` is not attached to autograd.
    Raises: ValueError naming the offending argument (dtype, shape, device, contiguity, value range).
    """
    _check_scalars(gamma, kind, huber_delta, cql_weight, per_eps, per_alpha, target_max)
    check_tensor("q", q, dtype=torch.float32, ndim=3)
    batch, branches, actions = q.shape
    if batch < 1 or branches < 1 or actions < 1:
        raise ValueError(f"q must have B, D, A >= 1, got shape {tuple(q.shape)}")
    device = q.device
    inputs = {
        "q_next_online": (q_next_online, torch.float32, (batch, branches, actions)),
        "q_next_target": (q_next_target, torch.float32, (batch, branches, actions)),
        "action": (action, torch.int64, (batch, branches)),
        "reward": (reward, torch.float32, (batch,)),
        "terminated": (terminated, torch.float32, (batch,)),
        "weights": (weights, torch.float32, (batch,)),
    }
    if out is None:
        out = TDLossOutputs.empty(batch, branches, actions, device)
    if workspace is None:
        workspace = _default_workspace(batch, device)
    shapes = {
        "objective": (),
        "target": (batch,),
        "td": (batch, branches),
        "per_sample": (batch,),
        "priorities": (batch,),
        "metrics": (len(METRIC_NAMES),),
        "grad": (batch, branches, actions),
    }
    inputs.update({f"out.{name}": (t, torch.float32, shapes[name]) for name, t in out._asdict().items()})
    inputs["workspace.partials"] = (workspace.partials, torch.float32, (_num_programs(batch), _NUM_SLOTS))
    inputs["workspace.counter"] = (workspace.counter, torch.int32, (1,))
    for name, (t, dtype, shape) in inputs.items():
        check_tensor(name, t, dtype=dtype, shape=shape)
        if t.device != device:
            raise ValueError(f"{name} must be on q's device {device}, got {t.device}")
    num_programs = _num_programs(batch)
    block_a = triton.next_power_of_2(actions)
    _td_loss_kernel[(num_programs,)](
        q,
        q_next_online,
        q_next_target,
        action,
        reward,
        terminated,
        weights,
        out.target,
        out.td,
        out.per_sample,
        out.priorities,
        out.grad,
        out.metrics,
        out.objective,
        workspace.partials,
        workspace.counter,
        batch,
        actions,
        num_programs,
        float(gamma),
        float(huber_delta),
        float(cql_weight),
        float(per_eps),
        float(per_alpha),
        1.0 / (batch * branches),
        float(target_max) if target_max > 0 else math.inf,
        NUM_BRANCHES=branches,
        HUBER=kind == "huber",
        USE_CQL=cql_weight > 0,
        BLOCK_B=_BLOCK_B,
        BLOCK_A=block_a,
        NUM_SLOTS=_NUM_SLOTS,
        BLOCK_P=_BLOCK_P,
        num_warps=2 if _BLOCK_B * block_a <= 256 else 4,
        **pdl_kwargs(),
    )
    return out


class FusedTDLoss(torch.autograd.Function):
    """autograd wrapper of `td_loss_forward`: forward returns (objective, target, td, per_sample, priorities,
    metrics, grad) with only `objective` differentiable (w.r.t. q); backward is one elementwise grad * grad_output.

    apply(q, q_next_online, q_next_target, action, reward, terminated, weights, gamma, kind, huber_delta,
    cql_weight, per_eps, per_alpha, out, workspace, target_max): arguments as in `td_loss_forward` (all
    positional).
    """

    @staticmethod
    def forward(
        ctx,
        q,
        q_next_online,
        q_next_target,
        action,
        reward,
        terminated,
        weights,
        gamma,
        kind,
        huber_delta,
        cql_weight,
        per_eps,
        per_alpha,
        out,
        workspace,
        target_max,
    ):
        res = td_loss_forward(
            q,
            q_next_online,
            q_next_target,
            action,
            reward,
            terminated,
            weights,
            gamma,
            kind,
            huber_delta,
            cql_weight,
            per_eps,
            per_alpha,
            out,
            workspace,
            target_max,
        )
        ctx.save_for_backward(res.grad)
        ctx.mark_non_differentiable(*res[1:])
        return tuple(res)

    @staticmethod
    def backward(ctx, grad_objective, *unused):
        (grad,) = ctx.saved_tensors
        return (grad * grad_objective,) + (None,) * 15


def fused_td_loss(
    q: torch.Tensor,
    q_next_online: torch.Tensor,
    q_next_target: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    weights: torch.Tensor,
    gamma: float,
    kind: str = "huber",
    huber_delta: float = 1.0,
    cql_weight: float = 0.0,
    per_eps: float = 1e-6,
    per_alpha: float = 0.6,
    out: TDLossOutputs | None = None,
    workspace: TDLossWorkspace | None = None,
    target_max: float = 0.0,
) -> TDLossOutputs:
    """Differentiable fused Double-DQN TD loss (+ CQL): `res.objective.backward()` writes dObjective/dq into q's
    graph. Arguments, shapes and errors as `td_loss_forward`; the returned tensors are detached except
    `objective`. The saved gradient lives in `res.grad`; with reused `out` buffers, call backward before the next
    call overwrites them."""
    return TDLossOutputs(
        *FusedTDLoss.apply(
            q,
            q_next_online,
            q_next_target,
            action,
            reward,
            terminated,
            weights,
            gamma,
            kind,
            huber_delta,
            cql_weight,
            per_eps,
            per_alpha,
            out,
            workspace,
            target_max,
        )
    )


def td_loss_reference(
    q: torch.Tensor,
    q_next_online: torch.Tensor,
    q_next_target: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    weights: torch.Tensor,
    gamma: float,
    kind: str = "huber",
    huber_delta: float = 1.0,
    cql_weight: float = 0.0,
    per_eps: float = 1e-6,
    per_alpha: float = 0.6,
    target_max: float = 0.0,
) -> TDLossOutputs:
    """Plain-torch reference built from kernels/losses.py, as trainer/learner.py combines them; any float dtype and
    device (tests upcast to float64). Same shapes as `td_loss_forward`; `objective` is differentiable w.r.t. q
    (call backward for the gradient), `grad` is None. Raises ValueError for an unknown kind (from td_loss)."""
    branches = q.shape[1]
    q_list, next_online, next_target = ([t[:, d] for d in range(branches)] for t in (q, q_next_online, q_next_target))
    y = double_dqn_target(reward, terminated, gamma, next_online, next_target, target_max)
    td = y.unsqueeze(1) - chosen_q(q_list, action)
    loss = td_loss(td, weights, kind, huber_delta)
    per_sample = torch.func.vmap(lambda t, w: td_loss(t[None], w[None], kind, huber_delta))(td, weights)
    if cql_weight > 0:
        cql = cql_term(q_list, action)
        lse = torch.stack([qd.logsumexp(dim=1) for qd in q_list], dim=1)
        per_sample = per_sample + cql_weight * (lse - chosen_q(q_list, action)).mean(dim=1)
    else:
        cql = loss.new_zeros(())
    objective = loss + cql_weight * cql
    td_abs = td.detach().abs()
    metrics = torch.stack([objective, loss, td_abs.mean(), chosen_q(q_list, action).mean(), cql]).detach()
    priorities = (td_abs.mean(dim=1) + per_eps).pow(per_alpha)
    return TDLossOutputs(objective, y, td.detach(), per_sample.detach(), priorities, metrics, None)

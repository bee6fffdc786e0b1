"""Precision by evidence: the learner's GEMMs run on a real batch and measured against float64.

"TF32 forward, FP32-accurate backward" (kernels/linear.py) used to be judged from kernel NAMES (guards/
step_metrics.py `gemm_precision`): a forward kernel switched to `input_precision="ieee"`, or a backward whose
3xTF32 products were cut down to one TF32 dot, keeps its name. This module judges what the kernels compute.

`probe_step(learner, batch)` runs the step's forward and backward math on `batch` with the launch functions the step
calls (`learner.linear_forward` via trainer/flat_net.py `flat_forward`, the fused TD loss, `heads_backward`,
`learner.linear_backward_input`, hotloop.trainer.step's `linear_backward_weight`: swapped launchers, e.g.
guards/faults.py's, are probed as they are), the run's real parameters (`learner.nets`), the learner's layout and
flags (fused first-layer weight gradient, WeightTranspose), into buffers of its own (the learner's are untouched:
no optimizer step, no priority update). One difference: every input-gradient launch also stores dZ (`dx`), where the
step leaves it None for the layer whose dZ nobody reads (a store flag of the same kernel; the GEMM code is the
same), so that its product can be measured. `probe_precision(learner, batch)` = `measure(probe_step(...))`:
per product a `Product` with its normwise error and class; `precision_verdict(result)` -> (verdict, evidence).

Products (M = batch rows): forward: "forward.L<i>" (online layer i: Y = act(g (X W^T) + b), K = its input width),
"ddqn.L<i>" (the online and target nets on s', one launch), "forward.heads", "ddqn.heads" (the dueling output
layer, K = head_hidden); backward: "backward.heads.dh" (K = 1 or A: IEEE FMAs by design), "backward.heads.dW"
(K = M), "backward.dX.L<i>" (dZ_{i-1} = (dY_i (g W_i)) masked by X_i > 0, K = layer i's width),
"backward.dW.L<i>" (dW_i = g dY_i^T X_i, K = M; layer 0's is fused into layer 1's input-gradient kernel when its
input fits one tile). Each product is measured against the float64 evaluation of the same math on the same fp32
inputs (those its kernel read: the previous kernel's fp32 output, not a float64 chain), so errors do not compound.

Metric: the normwise relative error of the product over the entries the output carries,
    e = ||(Y_hat - Y)_L||_F / ||(P)_L||_F,
Y the float64 result, P its product part (bias left out, before the ReLU: g (X W^T); P = Y for the gradients),
L the live entries (behind a ReLU: where Y or Y_hat is > 0; for a masked gradient: where the mask passes; else
all). Why this one: the normwise relative error is the standard summary of a matrix product's accuracy (Higham,
"Accuracy and Stability of Numerical Algorithms", 2nd ed., sec. 3.5 and 6; the LAPACK test ratios); it averages
over the M x N entries instead of keeping the single worst of millions (whose value moves with the batch); for a
dot product whose terms carry independent relative perturbations delta (operand rounding) it is ~rms(delta),
independent of K, so one band fits K = 4..8192. On L, Y_hat - Y is g times the product's error (the bias add and
ReLU add at most 2^-24 |Y|); leaving the bias and the dead ReLU entries out keeps e an error of the PRODUCT (a
large bias or many dead units would otherwise dilute it).

Bounds (constants below; they MUST be re-justified from H200 measurements: `PYTHONPATH=results python -m lab.precision_bounds --preset
seed-scale`, lab code run from the checkout, prints e for the step, an IEEE forward and a 1xTF32 backward):
- TF32 keeps 10 explicit mantissa bits: an fp32 operand read by a TF32 MMA is perturbed by up to 2^-11 = 4.9e-4
  relative (round to nearest, as cvt.rna.tf32.f32) or 2^-10 (truncation, what the tensor core does with fp32 data:
  tests/kernels/test_tf32_emulated.py), so a product of two such operands has e ~ 3e-4..1e-3. Measured on the H200
  (results/h200/kernels/split_gemm_probe.csv, seed-scale shapes, K = 512, max|err| / max|C|): Triton tf32
  8e-4, cuBLAS tf32 3e-4. TF32_MIN = 5e-5 sits ~6x below that (one operand already TF32-exact, e.g. the split
  parts, still leaves ~2e-4); TF32_MAX = 1e-2 only rejects results no TF32 product gives (a wrong kernel).
- FP32: 3xTF32 keeps ~2^-22 = 2.4e-7 per product (the dropped lo*lo term and lo's own rounding: Ootomo & Yokota
  2022), plus FP32 accumulation (~2^-24 per addition, growing ~sqrt(additions) for rounding errors of random
  sign, faster for the tensor cores' truncating accumulator alignment: Fasi et al. 2021). Measured (same CSV):
  the step's backward kernels 2.2e-7, Triton tf32x3 2.5e-7, IEEE FP32 FMAs 1e-6 (a K = 512 FMA chain), cuBLAS
  IEEE 4e-7. FP32_BOUND = 1e-5: 10x above the worst FP32 measurement (room for the dW GEMMs' K = 8192 reduction),
  ~30x below a one-dot TF32 product.
- Bias: a TF32 MMA truncates fp32 operands, shrinking each product by ~2^-11 per operand on average; the forward
  kernels round their operands first (kernels/linear.py), which leaves no sign. Each product's signed relative bias b
  = <Y_hat - Y, P>_L / ||P_L||^2 (`_Err.bias`: truncated ~-5e-4..-1e-3, rounded ~1e-5 in the CPU emulation) is
  evidence; what is judged is its part beyond rounding, b_x = <Y_hat - Y_r, P>_L / ||P_L||^2 = b - b_r
  (`Product.excess_bias`), Y_r the float64 result on the operands as the MMA reads them: the input and the weights
  rounded to the nearest TF32 (`split_tf32`, the kernels' `tf32_rna` bit for bit), bias and gain as they are, where
  this platform's TF32 dots round. The rounding errors of these very operands are known, so their draw b_r leaves the
  judgement: where few weights carry a layer it is a draw of a few rounding errors, not a truncation, and a large one
  (forward.L0 on CartPole, K = 4, 256 weights: +1.4e-4 on the H200, results/h200/gate/clean5/README.md, 021d63f;
  -2.4e-4 at 4.2 two-way clustered standard errors on the H100, a clean gate that FAILed at e589755,
  results/h200/bench/levers/README.md) was a false FAIL of the raw bias's rule. What b_x keeps: the output's rounding
  to TF32 (`out_tf32`: per entry, no sign; |b_x| ~1e-5 in the CPU emulation) and the accumulation, and a truncating
  forward's whole shift (H200: truncated x tiles alone gave b = -3.5e-4 on every trunk layer; CPU emulation, 4 seeds:
  truncated |b| >= 7.6 se; tests/trainer/test_precision_probe.py: b_x < -1e-4 on every trunk layer of the truncating
  variant, also on weights placed so that rounding shrinks every one). The price: truncated minus rounded is 0 or a
  whole ulp per operand, so b_x has ~1.2x the standard error of b (CartPole's shape with only layer 0's weights left
  unrounded, 10 seeds, CPU emulation: 9.5-15.7 se against 12.4-17.2). A trunk layer FAILs when |b_x| > TF32_BIAS_MAX =
  1e-4 and |b_x| > BIAS_Z = 4 of its standard errors (`_Err.bias_se` of the fit against Y_r, clustered by rows and by
  columns). The heads' b_x must stay within TF32_HEADS_BIAS_MAX = 2e-4 (no standard error: three output columns are
  too few clusters). That limit was set for their raw bias, a draw of their few weights' rounding errors (3 x 32 on
  CartPole) divided by the dueling combination's small difference (+5.7e-5 and +8.2e-5 on the H200 with rounded
  operands, 2026-12-02, results/h200/ab/tf32_rounding/; an unrounded input truncated by the MMA gave -3.5e-4 in the
  CPU emulation); their output is not rounded, so their b_x is ~1e-8 in the CPU emulation, and the limit stays until a
  GPU shows theirs (not re-tuned from the emulation alone). Their few weights also let the heads be "between FP32 and
  TF32": they read the last layer's output already rounded, so only their weights' rounding shows (2.9e-5 and 4.0e-5
  on the H200 after 100 seed-scale steps, 1.5e-4 and 1.9e-4 after 20), and even FP32-like (forward.heads 9.5e-6 in one
  clean CartPole gate of five, H200, b3b907e: results/h200/gate/clean5/README.md), which they may be where the
  compiled instructions are checked (`forward_kernels_without_tf32`: a heads kernel without TF32 MMAs FAILs on them).
  A forward in FP32 on the rounded weights has TF32's errors and no sign: only the compiled instructions show it
  (Triton kernels), and a swapped launcher must bring its own weights (guards/faults.py's fwd_fp32 reads them
  unrounded: FP32-like).
Classes (`classify`): "FP32-like" e <= FP32_BOUND; "TF32-like" TF32_MIN <= e <= TF32_MAX; "between FP32 and TF32";
"worse than TF32" e > TF32_MAX; "non-finite"; "no live entries".

Platform: the Triton CPU interpreter computes every dot in full fp32 whatever its input_precision (kernels/
linear.py), so there a TF32 forward looks FP32-like and a one-dot TF32 backward passes. `tf32_dot_rounds(device)`
checks, with one tiny TF32 `tl.dot` on operands whose low mantissa bits a TF32 MMA drops, whether this platform's
TF32 dots round at all (True on a GPU with TF32 tensor cores, and under the test suite's emulation patch of the
interpreter's dot). When they do not, the verdicts that depend on it say NOT_MEASURED instead of PASS/FAIL.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
import triton
import triton.language as tl

from hotloop.kernels.heads import heads_reference
from hotloop.kernels.replay_batch import gather_transitions
from hotloop.kernels.td_loss import TDLossWorkspace, td_loss_forward
from hotloop.kernels.tf32_split import split_tf32

FP32_BOUND = 1e-5
"""Largest normwise error of an FP32-accurate product (the backward must stay within it); reasoning: module doc."""
TF32_MIN = 5e-5
"""Smallest normwise error counted as a TF32 product's (a TF32 forward must reach it); reasoning: module doc."""
TF32_MAX = 1e-2
"""Largest normwise error counted as a TF32 product's; above it the product is "worse than TF32"."""
TF32_BIAS_MAX = 1e-4
"""Largest signed relative bias beyond rounding of a TF32 forward product (`Product.excess_bias`): the kernels round
their operands to TF32 before the MMA (kernels/linear.py), whose own truncation would shrink every product by
~5e-4..1e-3, a bias of Q that the TD fixed point amplifies 100x (results/cpu/learning_causes/README.md, H6). Rounded
operands leave ~1e-5 (the output's own rounding). For the trunk layers; the heads' bound is TF32_HEADS_BIAS_MAX
(module doc, "Bias")."""
TF32_HEADS_BIAS_MAX = 2e-4
"""Largest signed relative bias beyond rounding of a heads forward product (module doc, "Bias")."""
BIAS_Z = 4.0
"""A trunk layer's bias beyond rounding beyond TF32_BIAS_MAX FAILs only when it is also BIAS_Z standard errors
(`Product.excess_bias_se`) from zero: what the output's rounding and the accumulation leave is no evidence of
truncation (module doc, "Bias")."""
PASS, FAIL = "PASS", "FAIL"
NOT_MEASURED = "not measured (CPU interpreter: no TF32 rounding)"
"""The verdict where this platform's TF32 dots do not round (`tf32_dot_rounds` False), so TF32 and FP32 products
cannot be told apart."""
FP32_LIKE, TF32_LIKE = "FP32-like", "TF32-like"
BETWEEN, WORSE, NON_FINITE, NO_LIVE = "between FP32 and TF32", "worse than TF32", "non-finite", "no live entries"


@triton.jit
def _tf32_canary_kernel(a_ptr, c_ptr, BLOCK: tl.constexpr, K: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    offs_k = tl.arange(0, K)
    a = tl.load(a_ptr + offs[:, None] * K + offs_k[None, :])
    b = tl.full((K, BLOCK), 1.0, tl.float32)
    c = tl.dot(a, b, input_precision="tf32")
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], c)


def tf32_dot_rounds(device: torch.device | str) -> bool:
    """Whether a `tl.dot(input_precision="tf32")` on `device` drops the low mantissa bits of its fp32 operands, as a
    TF32 MMA does: A (64, 16) of 1 + 2^-20 (exactly fp32; TF32 keeps 10 mantissa bits, so a TF32 MMA reads 1.0,
    whether it rounds to nearest or truncates) times ones (16, 64): every entry is 16 with TF32, 16 + 2^-16 (exact
    in fp32) without. One launch of two programs (both write the same tile: no single-block launch, which the
    guards flag) and a host read (not for the hot loop)."""
    a = torch.full((64, 16), 1.0 + 2.0**-20, dtype=torch.float32, device=device)
    c = torch.empty(64, 64, dtype=torch.float32, device=device)
    _tf32_canary_kernel[(2,)](a, c, BLOCK=64, K=16, num_warps=4)
    return bool((c == 16.0).all())


def classify(error: float) -> str:
    """The class of a normwise error (module doc, "Classes"); NaN means no live entries."""
    if math.isnan(error):
        return NO_LIVE
    if not math.isfinite(error):
        return NON_FINITE
    if error <= FP32_BOUND:
        return FP32_LIKE
    if error < TF32_MIN:
        return BETWEEN
    return TF32_LIKE if error <= TF32_MAX else WORSE


@dataclass(frozen=True)
class Product:
    """One measured GEMM of the step.

    name: e.g. "forward.L0", "backward.dW.L1" (module doc); phase: "forward" or "backward"; launcher: the qualified
    name of the function that ran it; m, n, k: the output (m, n) and the reduction length k; error: normwise relative
    error (module doc; inf when the result is not finite, NaN with no live entries); live: entries compared;
    cls: `classify(error)`; expected: "TF32" (forward) or "FP32" (backward); bias: the signed relative bias
    (`_Err.bias`; NaN when not measured); bias_se: its standard error (`_Err.bias_se`; NaN when not measured);
    excess_bias: the forward's bias beyond what rounding these very operands to the nearest TF32 gives (module doc,
    "Bias": the one judged; NaN for the backward), excess_bias_se: its standard error."""

    name: str
    phase: str
    launcher: str
    m: int
    n: int
    k: int
    error: float
    live: int
    cls: str
    expected: str
    bias: float = math.nan
    bias_se: float = math.nan
    excess_bias: float = math.nan
    excess_bias_se: float = math.nan


@dataclass(frozen=True)
class ProbeResult:
    """What `probe_precision` measured: products (tuple of Product, forward first), tf32_rounds (the platform's
    TF32 dots round: `tf32_dot_rounds`), platform (e.g. "cuda: NVIDIA H200", "cpu (Triton interpreter)"), batch
    (rows M), label (free text, e.g. the CLI's configuration name), instructions: hotloop.profiles.kernel_evidence
    `kernel_summary()` of the step's GEMM kernels after the probe (or the string saying why there is none)."""

    products: tuple[Product, ...]
    tf32_rounds: bool
    platform: str
    batch: int
    label: str = "step"
    instructions: dict | str = field(default_factory=dict)

    def phase(self, phase: str) -> list[Product]:
        """The products of one phase ("forward" / "backward")."""
        return [p for p in self.products if p.phase == phase]

    def table(self):
        """A pandas DataFrame, one row per product (the Product fields)."""
        import pandas as pd

        return pd.DataFrame([vars(p) for p in self.products])


@dataclass(frozen=True)
class Launchers:
    """The launch functions the probe runs (drop-ins of hotloop.kernels'): forward (`linear_forward`),
    backward_input (`linear_backward_input`), backward_weight (`linear_backward_weight`), weights_copy
    (`tf32_round_copy`: the forwards' weights). `Launchers.of(learner)`: the step's own (its instance attributes,
    and hotloop.trainer.step's module-level `linear_backward_weight`, read at call time so that a swapped one is
    probed)."""

    forward: Callable
    backward_input: Callable
    backward_weight: Callable
    weights_copy: Callable

    @staticmethod
    def of(learner) -> Launchers:
        from hotloop.trainer import step

        return Launchers(
            learner.linear_forward, learner.linear_backward_input, step.linear_backward_weight, learner.round_weights
        )


def _name(fn: Callable) -> str:
    module = getattr(fn, "__module__", None) or ""
    return f"{module}.{getattr(fn, '__qualname__', type(fn).__name__)}".lstrip(".")


@dataclass
class ProbeTensors:
    """Every buffer `probe_step` filled (float32 on the learner's device, B = batch rows; layers as
    learner.layout.layers): idx (B,) int64, nets (2, P) (the parameters used), obs / next_obs (B, obs_dim) (the
    replay rows), acts [B x width] online activations, acts_t [(2, width, B) or None], ddqn_acts [(2, B, width)], q
    (B, D A), q_next (2, B, D A), td_grad (B, D, A) dLoss/dQ, grads (P,) the gradient buffer, dz [(B, width)] each
    layer's pre-activation gradient (all stored, layer 0's too), dz_t [(width, B) or None], obs_t (2, obs_dim, B),
    wts [None, (2, K, N) ...] the split g-scaled W^T, launchers (Launchers), fused (first weight gradient fused)."""

    idx: torch.Tensor
    nets: torch.Tensor
    obs: torch.Tensor
    next_obs: torch.Tensor
    acts: list
    acts_t: list
    ddqn_acts: list
    q: torch.Tensor
    q_next: torch.Tensor
    td_grad: torch.Tensor
    grads: torch.Tensor
    dz: list
    dz_t: list
    obs_t: torch.Tensor
    wts: list
    launchers: Launchers
    fused: bool


def _batch(learner, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices (B,) int64, weights (B,) float32) on the learner's device from a PrioritizedBatch-like object (with
    .indices and .weights) or an indices tensor (weights 1)."""
    idx = batch.indices if hasattr(batch, "indices") else batch
    if not isinstance(idx, torch.Tensor) or idx.dtype != torch.int64 or idx.ndim != 1 or idx.numel() < 1:
        raise ValueError(
            "batch must be a PrioritizedBatch (or have .indices: (B,) int64) or a (B,) int64 tensor of replay slots"
        )
    idx = idx.to(learner.device).contiguous()
    if int(idx.min()) < 0 or int(idx.max()) >= learner.replay.capacity:
        raise ValueError(f"batch indices must be replay slots in [0, {learner.replay.capacity})")
    weights = getattr(batch, "weights", None)
    if weights is None:
        weights = torch.ones(idx.shape[0], device=learner.device)
    weights = weights.to(learner.device, torch.float32).contiguous()
    if tuple(weights.shape) != tuple(idx.shape):
        raise ValueError(f"batch weights must be ({idx.shape[0]},), got {tuple(weights.shape)}")
    return idx, weights


@torch.no_grad()
def probe_step(learner, batch, *, nets: torch.Tensor | None = None, launchers: Launchers | None = None) -> ProbeTensors:
    """Run the learner step's forward, loss and backward (not its optimizer, spectral norm or priority update) on
    `batch` into new buffers, as HotLearner._body launches them (module doc; one difference: dZ is stored for
    every layer).

    learner: a hotloop.trainer.step.HotLearner (its layout, replay storage, flags, cfg; CUDA, or the CPU under
        TRITON_INTERPRET=1). batch: a PrioritizedBatch sampled from learner.replay (indices and importance weights
        used; the transitions are read from the replay by index, as the step reads them), or a (B,) int64 tensor
        of replay slots (weights 1). B may differ from cfg.batch_size, but the kernels choose tiles by B: pass the
        run's batch size to probe the tiles the step runs.
    nets: (2, P) float32 contiguous online + target parameters (default learner.nets, the run's).
    launchers: default Launchers.of(learner).
    Returns ProbeTensors. Raises ValueError for a bad batch or nets, and whatever the launchers raise.
    """
    from hotloop.trainer import step
    from hotloop.trainer.flat_net import flat_forward

    lay, cfg, rp, dev = learner.layout, learner.cfg, learner.replay, learner.device
    if dev.type == "cuda":  # whatever stream the run's last step went to, it is done (not in the hot loop)
        torch.cuda.synchronize(dev)
    nets = learner.nets if nets is None else nets
    if (
        not isinstance(nets, torch.Tensor)
        or tuple(nets.shape) != (2, lay.numel)
        or nets.dtype != torch.float32
        or not nets.is_contiguous()
        or nets.device != learner.nets.device
    ):
        raise ValueError(f"nets must be a contiguous (2, {lay.numel}) float32 tensor on {learner.nets.device}")
    fns = Launchers.of(learner) if launchers is None else launchers
    idx, weights = _batch(learner, batch)
    b, d, a = idx.shape[0], lay.branches, lay.actions
    params = nets[0]

    def new(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype, device=dev)

    # forwards, exactly as HotLearner._forward (rows gathered from replay storage by index)
    acts = [new(b, x.rows) for x in lay.layers]
    acts_t = [new(2, x.rows, b) for x in lay.layers[:-1]] + [None]
    q = new(b, d * a)
    nets_tf32 = fns.weights_copy(nets, torch.empty_like(nets))
    flat_forward(lay, params, rp.obs, acts, q, rows=idx, nets=1, linear=fns.forward, acts_t=acts_t, w_buf=nets_tf32[0])
    ddqn_acts = [new(2, b, x.rows) for x in lay.layers]
    q_next = new(2, b, d * a)
    flat_forward(lay, params, rp.next_obs, ddqn_acts, q_next, rows=idx, nets=2, linear=fns.forward, w_buf=nets_tf32[0])
    action, reward, term, obs_t = new(b, d, dtype=torch.int64), new(b), new(b), new(2, lay.obs_dim, b)
    gather_transitions(idx, rp.action, rp.reward, rp.terminated, rp.obs, action, reward, term, obs_t)
    td = td_loss_forward(
        q.view(b, d, a),
        q_next[0].view(b, d, a),
        q_next[1].view(b, d, a),
        action,
        reward,
        term,
        weights,
        cfg.gamma,
        cfg.loss,
        cfg.huber_delta,
        cfg.cql_weight,
        cfg.per_eps,
        cfg.per_alpha,
        workspace=TDLossWorkspace.create(b, dev),
        target_max=cfg.td_target_max,
    )
    # backward, as HotLearner._backward
    fused = bool(learner.fuse_first_weight_grad)
    grads = torch.zeros(lay.numel, device=dev)
    wt = new(learner.weight_transpose.numel)
    learner.weight_transpose(params, wt)
    wts = [None, *learner.weight_transpose.views(wt)]
    dz = [new(b, x.rows) for x in lay.layers]
    dz_t = [None if i == 0 and fused else new(x.rows, b) for i, x in enumerate(lay.layers)]
    w_out, _, g_out = lay.out_views(params)
    dw_out, db_out, dg_out = lay.out_views(grads)
    learn = learner.learns_gains  # fixed gains: no gain gradient (dg None), the step's kernel variant
    step.heads_backward(
        acts[-1],
        td.grad.view(b, -1),
        w_out,
        g_out,
        dz[-1],
        dz_t[-1],
        lay.layers[-1].views(grads)[1],
        dw_out,
        db_out,
        dg_out if learn else None,
        d,
    )
    for i in reversed(range(len(lay.layers))):
        slots = lay.layers[i]
        w, _, g = slots.views(params)
        dw, _, dg = slots.views(grads)
        if i > 0 or not fused:
            fns.backward_weight(
                dz_t[i], obs_t if i == 0 else acts_t[i - 1], w, g, dw, dg if learn else None, slots.gain_group
            )
        if i > 0:
            below = None
            if i == 1 and fused:
                (w0, _, g0), (dw0, _, dg0) = lay.layers[0].views(params), lay.layers[0].views(grads)
                below = (obs_t, w0, g0, dw0, dg0 if learn else None, lay.layers[0].gain_group)
            fns.backward_input(
                dz[i],
                wts[i],
                acts[i - 1],
                dz_t[i - 1],
                lay.layers[i - 1].views(grads)[1],
                dx=dz[i - 1],
                weight_grad_below=below,
            )
    return ProbeTensors(
        idx,
        nets,
        rp.obs[idx],
        rp.next_obs[idx],
        acts,
        acts_t,
        ddqn_acts,
        q,
        q_next,
        td.grad,
        grads,
        dz,
        dz_t,
        obs_t,
        wts,
        fns,
        fused,
    )


class _Err:
    """Accumulates ||(got - ref)_L||^2 and ||(prod)_L||^2 over pieces (e.g. the two nets of the DDQN forward), and
    the entries of (got - ref) * prod and prod^2 that `bias_se` needs."""

    def __init__(self) -> None:
        self.num, self.den, self.cross, self.live, self.finite = 0.0, 0.0, 0.0, 0, True
        # (got - ref) * prod and prod^2 per entry, summed over pieces of one shape (the DDQN forward's two nets read
        # the same inputs, and equal weights right after a target sync: their rows and columns are one cluster)
        self.pieces: dict[tuple[int, ...], list[torch.Tensor]] = {}

    def add(
        self, got: torch.Tensor, ref: torch.Tensor, prod: torch.Tensor | None = None, live: torch.Tensor | None = None
    ) -> _Err:
        got, ref = got.double(), ref.double()
        prod = ref if prod is None else prod.double()
        live = torch.ones_like(got, dtype=torch.bool) if live is None else live
        self.finite &= bool(torch.isfinite(got[live]).all())
        self.live += int(live.sum())
        # dead entries count as zeros (keeps the rows and columns for `bias_se`)
        got, ref, prod = (torch.where(live, v, 0.0) for v in (got, ref, prod))
        self.num += float(((got - ref) ** 2).sum())
        self.den += float((prod**2).sum())
        if got.numel():  # (0, n): nothing to cluster
            ep = ((got - ref) * prod).reshape(got.shape[0] if got.dim() else 1, -1)
            pp = (prod**2).reshape(ep.shape)
            self.cross += float(ep.sum())
            acc = self.pieces.setdefault(tuple(ep.shape), [torch.zeros_like(ep), torch.zeros_like(pp)])
            acc[0] += ep
            acc[1] += pp
        return self

    def error(self) -> float:
        if not self.finite:
            return math.inf
        if self.den == 0.0:
            return 0.0 if self.num == 0.0 and self.live else math.nan
        return math.sqrt(self.num / self.den)

    def bias(self) -> float:
        """The least-squares slope of the error on the product, <(got - ref), prod> / ||prod||^2: the signed
        relative bias (about -2^-11 per truncated operand, ~0 for rounded ones); NaN where `error` is not finite."""
        e = self.error()
        return self.cross / self.den if math.isfinite(e) and self.den > 0 else math.nan

    def bias_se(self) -> float:
        """The standard error of `bias`, clustered two ways: sqrt(V_rows + V_cols - V_entries) / ||prod||^2, where
        V_c sums over clusters c (rows, columns, single entries) the square of sum_c (got - ref - bias * prod) * prod
        (the residuals of the least-squares fit `bias`; Cameron, Gelbach & Miller 2011, "Robust inference with
        multiway clustering"; where V_rows + V_cols - V_entries is not positive, the larger one-way part). A row's
        entries share its input's rounding errors and a column's its weights', so the errors are independent
        neither along rows nor along columns; pieces of one shape (the DDQN forward's two nets on the same inputs)
        share their rows, columns and entries. The estimate is as large as the bias itself when a few rows or
        columns carry ||prod||^2 (few weights: forward.L0's K = 4 on CartPole; module doc, "Bias"); 0 for a single
        row and column. NaN as `bias`."""
        b = self.bias()
        if not math.isfinite(b):
            return math.nan
        v = [0.0, 0.0, 0.0]
        for ep, pp in self.pieces.values():
            r = ep - b * pp  # residual * prod per entry
            v[0] += float((r.sum(1) ** 2).sum())
            v[1] += float((r.sum(0) ** 2).sum())
            v[2] += float((r**2).sum())
        both = v[0] + v[1] - v[2]
        return math.sqrt(both if both > 0 else max(v[0], v[1], 0.0)) / self.den


def _scale(g: torch.Tensor, gain_group: int, rows: int) -> torch.Tensor:
    return g.repeat_interleave(gain_group)[:rows]


def _as_read(v: torch.Tensor, rounds: bool) -> torch.Tensor:
    """The fp32 tensor v in float64 as a TF32 forward's MMA reads it: rounded to the nearest TF32 first (the
    kernels' `tf32_rna`, kernels/linear.py; its plain-torch twin `split_tf32`) where this platform's TF32 dots round
    (`rounds`: `tf32_dot_rounds`), as it is where they do not (the dot then reads it whole)."""
    return (split_tf32(v.float())[0] if rounds else v).double()


def _relu_live(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return (ref > 0) | (got > 0)


def measure(t: ProbeTensors, learner, *, label: str = "step", tf32_rounds: bool | None = None) -> ProbeResult:
    """The products of a `probe_step` run, each against its float64 reference (module doc), classified.
    tf32_rounds: the platform check (default: `tf32_dot_rounds(learner.device)`, one tiny launch)."""
    from hotloop.kernels.heads import heads_forward
    from hotloop.profiles.kernel_evidence import kernel_summary

    lay, dev = learner.layout, learner.device
    b, d = t.idx.shape[0], lay.branches
    rounds = tf32_dot_rounds(dev) if tf32_rounds is None else tf32_rounds
    f64 = [t.nets[0].double(), t.nets[1].double()]
    f64_read = [_as_read(t.nets[0], rounds), _as_read(t.nets[1], rounds)]  # weights as a TF32 forward's MMA reads them
    fwd_name = _name(t.launchers.forward)
    out: list[Product] = []

    def add(name, phase, launcher, m, n, k, err: _Err, excess: _Err | None = None) -> None:
        e = err.error()
        out.append(
            Product(
                name,
                phase,
                launcher,
                m,
                n,
                k,
                e,
                err.live,
                classify(e),
                "TF32" if phase == "forward" else "FP32",
                err.bias(),
                err.bias_se(),
                excess.bias() if excess is not None else math.nan,
                excess.bias_se() if excess is not None else math.nan,
            )
        )

    def layer_ref(i: int, x: torch.Tensor, z: int, read: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(result, product part) of layer i of net z on the fp32 input x, in float64: of the fp32 operands, or
        with `read` of the operands as the MMA reads them (the input and the weights rounded; bias and gain not)."""
        slots = lay.layers[i]
        _, bias, g = slots.views(f64[z])
        w = slots.views(f64_read[z] if read else f64[z])[0]
        prod = ((_as_read(x, rounds) if read else x.double()) @ w.T) * _scale(g, slots.gain_group, slots.rows)
        ref = prod + bias
        return (ref.relu() if slots.relu else ref), prod

    def errs(pieces, ref, relu: bool = False) -> tuple[_Err, _Err]:
        """(error against the fp32 operands' result, error against the read operands' result: the excess) over
        (input, output, net) pieces, both slopes taken on the fp32 operands' product part; `ref(x, z, read)` ->
        (result, product part); behind a ReLU only the live entries (`_relu_live`) count."""
        err, excess = _Err(), _Err()
        for x, got, z in pieces:
            full, prod = ref(x, z)
            live = _relu_live(got, full) if relu else None
            err.add(got, full, prod, live)
            excess.add(got, ref(x, z, True)[0], prod, live)
        return err, excess

    # forward: online net on s, and online + target on s'
    for i, slots in enumerate(lay.layers):
        x = t.obs if i == 0 else t.acts[i - 1]
        online = errs([(x, t.acts[i], 0)], partial(layer_ref, i), slots.relu)
        add(f"forward.L{i}", "forward", fwd_name, b, slots.rows, slots.cols, *online)
    for i, slots in enumerate(lay.layers):
        pieces = [(t.next_obs if i == 0 else t.ddqn_acts[i - 1][z], t.ddqn_acts[i][z], z) for z in range(2)]
        ddqn = errs(pieces, partial(layer_ref, i), slots.relu)
        add(f"ddqn.L{i}", "forward", fwd_name, 2 * b, slots.rows, slots.cols, *ddqn)

    def heads_ref(h: torch.Tensor, z: int, read: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(result, product part: the bias left out) of the heads of net z on h, in float64 (`read` as layer_ref's)."""
        _, bb, g = lay.out_views(f64[z])
        w = lay.out_views(f64_read[z] if read else f64[z])[0]
        h64 = _as_read(h, rounds) if read else h.double()
        full, prod = (heads_reference(h64, w, c, g, d).reshape(h.shape[0], -1) for c in (bb, torch.zeros_like(bb)))
        return full, prod

    j = lay.out.rows
    h_name = _name(heads_forward)
    add("forward.heads", "forward", h_name, b, j, lay.head_hidden, *errs([(t.acts[-1], t.q, 0)], heads_ref))
    pieces = [(t.ddqn_acts[-1][z], t.q_next[z], z) for z in range(2)]
    add("ddqn.heads", "forward", h_name, 2 * b, j, lay.head_hidden, *errs(pieces, heads_ref))

    # backward: the heads (autograd of the float64 reference), then each layer's dX and dW
    from hotloop.trainer import step

    hb_name = _name(step.heads_backward)
    with torch.enable_grad():
        h64 = t.acts[-1].double().requires_grad_(True)
        w_out64 = lay.out_views(f64[0])[0].clone().requires_grad_(True)
        _, b_out64, g_out64 = lay.out_views(f64[0])
        heads_reference(h64, w_out64, b_out64, g_out64, d).backward(t.td_grad.double())
    mask = t.acts[-1] > 0
    add(
        "backward.heads.dh",
        "backward",
        hb_name,
        b,
        t.acts[-1].shape[1],
        lay.actions,
        _Err().add(t.dz[-1], h64.grad * mask, live=mask),
    )
    add(
        "backward.heads.dW",
        "backward",
        hb_name,
        j,
        lay.head_hidden,
        b,
        _Err().add(lay.out_views(t.grads)[0], w_out64.grad),
    )
    for i in reversed(range(len(lay.layers))):
        slots = lay.layers[i]
        w64, _, g64 = slots.views(f64[0])
        scale = _scale(g64, slots.gain_group, slots.rows)
        dy64 = t.dz[i].double()
        x64 = (t.obs if i == 0 else t.acts[i - 1]).double()
        fused_here = i == 0 and t.fused
        launcher = _name(t.launchers.backward_input if fused_here else t.launchers.backward_weight)
        add(
            f"backward.dW.L{i}",
            "backward",
            launcher + (" (fused into layer 1's)" if fused_here else ""),
            slots.rows,
            slots.cols,
            b,
            _Err().add(slots.views(t.grads)[0], scale[:, None] * (dy64.T @ x64)),
        )
        if i > 0:
            live = t.acts[i - 1] > 0
            ref = (dy64 @ (scale[:, None] * w64)) * live
            add(
                f"backward.dX.L{i}",
                "backward",
                _name(t.launchers.backward_input),
                b,
                slots.cols,
                slots.rows,
                _Err().add(t.dz[i - 1], ref, live=live),
            )
    platform = f"cuda: {torch.cuda.get_device_name(dev)}" if dev.type == "cuda" else f"{dev.type} (Triton interpreter)"
    return ProbeResult(tuple(out), rounds, platform, b, label, kernel_summary())


def probe_precision(
    learner, batch, *, nets: torch.Tensor | None = None, launchers: Launchers | None = None, label: str = "step"
) -> ProbeResult:
    """Measure every GEMM of the learner step on `batch` (`probe_step`, then `measure`): see the module doc.

    learner: the trained HotLearner; batch: a PrioritizedBatch from its replay (e.g. `replay_batch(learner)`) or a
    (B,) int64 tensor of replay slots; nets, launchers: as `probe_step`. Cost: the step's GEMM launches plus float64
    references of the same shapes, one TF32 canary launch and a few host reads (run it after the guarded steps,
    never inside them). Raises ValueError from `probe_step`."""
    return measure(probe_step(learner, batch, nets=nets, launchers=launchers), learner, label=label)


def replay_batch(learner, size: int | None = None):
    """A PrioritizedBatch of `size` (default cfg.batch_size) transitions sampled from the learner's replay
    (PrioritizedReplay.sample, beta = cfg.per_beta_end; draws from the replay's generator or the global one).
    Raises ValueError for an empty replay."""
    return learner.replay.sample(size or learner.cfg.batch_size, learner.cfg.per_beta_end)


def _line(p: Product) -> str:
    return (
        f"{p.name} ({p.m}x{p.n}, K={p.k}; {p.launcher}): normwise error {p.error:.2e}, {p.cls} "
        f"(expected {p.expected}), bias {p.bias:+.1e} (se {p.bias_se:.1e})"
        + (f", beyond rounding {p.excess_bias:+.1e} (se {p.excess_bias_se:.1e})" if p.phase == "forward" else "")
    )


def forward_kernels_without_tf32(instructions: dict | str) -> list[str]:
    """The TF32 forward GEMM kernels (names starting "_fwd_" or "_heads_" and holding "tf32") of a `kernel_summary`
    with a compiled specialization that has no TF32 MMA, as "name (fma.f32=N)"; [] where there is no evidence
    (a string: the interpreter, nothing compiled)."""
    if isinstance(instructions, str):
        return []
    return [
        f"{name} (fma.f32={row.get('fma.f32', 0)})"
        for name, rows in instructions.items()
        if name.startswith(("_fwd_", "_heads_")) and "tf32" in name and not isinstance(rows, str)
        for row in rows
        if not row.get("tf32_mma", 0)
    ]


def _bias_max(p: Product) -> float:
    return TF32_HEADS_BIAS_MAX if ".heads" in p.name else TF32_BIAS_MAX


def _in_se(p: Product) -> str:
    """|excess bias| in its standard errors, for the FAIL line ("inf" where the standard error is 0, "nan"
    unmeasured)."""
    if not p.excess_bias_se > 0:
        return "nan" if math.isnan(p.excess_bias_se) else "inf"
    return f"{abs(p.excess_bias) / p.excess_bias_se:.1f}"


def _biased(p: Product) -> bool:
    """Its bias beyond rounding (`Product.excess_bias`) beyond its limit (`_bias_max`) and, for a trunk layer,
    BIAS_Z standard errors from zero; the heads' three output columns are too few clusters for `_Err.bias_se`
    (module doc, "Bias"). A NaN excess (not measured) counts as biased."""
    if abs(p.excess_bias) <= _bias_max(p):
        return False
    return ".heads" in p.name or not abs(p.excess_bias) <= BIAS_Z * p.excess_bias_se


def forward_verdict(result: ProbeResult) -> tuple[str, list[str]]:
    """ "TF32 forward": PASS when every forward product is TF32-like (products with no live entries left out) with
    its bias beyond rounding within TF32_BIAS_MAX or BIAS_Z standard errors (the heads: within TF32_HEADS_BIAS_MAX;
    `_biased`) and no compiled forward kernel lacks TF32 MMAs;
    FAIL when one is biased beyond it (its operands reached the MMA unrounded), when one is not TF32-like (an
    FP32-like one: its kernel does not round to TF32, whatever it is named) on a platform whose TF32 dots round, on
    any platform when one is worse than TF32 or not finite, and when a forward kernel compiled without TF32 MMAs
    (`forward_kernels_without_tf32`: the step rounds every forward operand to TF32 first, so an IEEE dot on them has
    TF32's errors, and only the instructions tell it from the MMA); NOT_MEASURED where TF32 dots do not round and
    the others are FP32-like or between. The heads' products may also be "between FP32 and TF32", and FP32-like
    where the compiled instructions were checked (module doc, "Bias"). Returns (verdict, evidence lines)."""
    fwd = result.phase("forward")
    heads_may = (BETWEEN, FP32_LIKE) if isinstance(result.instructions, dict) else (BETWEEN,)
    bad = [p for p in fwd if p.cls not in (TF32_LIKE, NO_LIVE) and not (".heads" in p.name and p.cls in heads_may)]
    lines = [_line(p) for p in fwd]
    if not fwd or all(p.cls == NO_LIVE for p in fwd):
        return FAIL, lines + ["no forward product measured"]
    no_mma = forward_kernels_without_tf32(result.instructions)
    if no_mma:
        return FAIL, lines + [f"not TF32: forward kernels compiled without TF32 MMAs: {', '.join(no_mma)}"]
    biased = [p for p in fwd if p.cls in (TF32_LIKE, BETWEEN) and _biased(p)]
    if not bad and not biased:
        return PASS, lines
    if biased and not bad:
        return FAIL, lines + [
            f"TF32, but biased beyond rounding by more than {TF32_BIAS_MAX:.0e} and {BIAS_Z:g} standard errors "
            f"(heads {TF32_HEADS_BIAS_MAX:.0e}; operands truncated by the MMA, not rounded first): "
            f"{', '.join(f'{p.name} ({p.excess_bias:+.1e}, {_in_se(p)} se)' for p in biased)}"
        ]
    if not result.tf32_rounds and not any(p.cls in (WORSE, NON_FINITE) for p in bad):
        return NOT_MEASURED, lines + [
            f"{len(bad)} forward product(s) not TF32-like, but this platform's TF32 dots do "
            f"not round ({result.platform}): TF32 and FP32 look the same here"
        ]
    also = f"; biased too: {', '.join(f'{p.name} ({p.excess_bias:+.1e})' for p in biased)}" if biased else ""
    return FAIL, lines + [f"not TF32: {', '.join(f'{p.name} ({p.cls}, {p.error:.1e})' for p in bad)}{also}"]


def backward_verdict(result: ProbeResult) -> tuple[str, list[str]]:
    """ "FP32-accurate backward": FAIL when a backward product's error exceeds FP32_BOUND (or is not finite) on any
    platform; PASS when none does and TF32 dots round here; NOT_MEASURED when none does but they do not round (a
    one-dot TF32 backward would pass too). Returns (verdict, evidence lines)."""
    bwd = result.phase("backward")
    lines = [_line(p) for p in bwd]
    if not bwd:
        return FAIL, ["no backward product measured"]
    bad = [p for p in bwd if not p.error <= FP32_BOUND and p.cls != NO_LIVE]
    if bad:
        return FAIL, lines + [
            f"above the FP32 bound {FP32_BOUND:.0e}: {', '.join(f'{p.name} ({p.error:.1e})' for p in bad)}"
        ]
    if not result.tf32_rounds:
        return NOT_MEASURED, lines + [
            "within the FP32 bound, but this platform's TF32 dots do not round: a one-dot TF32 backward would pass too"
        ]
    return PASS, lines


def precision_verdict(result: ProbeResult) -> tuple[str, list[str]]:
    """The "TF32 forward, FP32-accurate backward" verdict of a probe: FAIL if `forward_verdict` or
    `backward_verdict` fails, PASS if both pass, else NOT_MEASURED. Evidence: the platform check, both verdicts'
    lines, and the instruction counts of the step's GEMM kernels (hotloop.profiles.kernel_evidence; the forward
    verdict judges whether its kernels have TF32 MMAs). Returns (verdict, evidence lines)."""
    from hotloop.profiles.kernel_evidence import summary_lines

    fv, fl = forward_verdict(result)
    bv, bl = backward_verdict(result)
    verdict = FAIL if FAIL in (fv, bv) else PASS if fv == bv == PASS else NOT_MEASURED
    evidence = [
        f"platform {result.platform}: TF32 dots {'round' if result.tf32_rounds else 'do NOT round'} "
        f"(canary); batch {result.batch}; {result.label}",
        f"forward: {fv}",
        *(f"  {x}" for x in fl),
        f"backward: {bv}",
        *(f"  {x}" for x in bl),
    ]
    ins = result.instructions
    if isinstance(ins, str):
        evidence.append(f"instructions: {ins}")
    elif ins:
        evidence += [
            "instructions (static counts in the compiled kernels, hotloop.profiles.kernel_evidence):",
            *(f"  {x}" for x in summary_lines(ins)),
        ]
    return verdict, evidence

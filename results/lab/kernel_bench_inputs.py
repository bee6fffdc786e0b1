"""The kernel bench's inputs: for each kernel module it times (results/lab/kernel_bench.py), seed-scale inputs and
(name, kernel, reference) pairs of zero-argument closures, each call one launch of the kernel or one run of its
plain-torch reference (hotloop.kernels keeps kernel, launcher and reference only).

`PAIRS`: module name -> its pairs function (device -> list of (name, kernel, reference)). The inputs are made on
`device` (a CUDA device for the bench; any device the kernels run on for the CPU smoke tests, under
TRITON_INTERPRET=1 there), from fixed seeds. Lab code: not shipped, run from the checkout.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hotloop.kernels.fused_adam import FusedAdam, adam_reference, reference_params
from hotloop.kernels.segment_tree import sample_reference, tree_rebuild, tree_sample, tree_update
from hotloop.kernels.spectral_norm import SEED_SHAPES, SpectralNormTable, spectral_norm_, spectral_norm_reference
from hotloop.kernels.td_loss import fused_td_loss, td_loss_reference

Pair = tuple[str, Callable[[], object], Callable[[], object]]
"""(name, kernel closure, reference closure): zero-argument functions, each call one launch / one reference run."""

ADAM_SEED_SHAPES = [
    (256, 64),
    (256,),
    (256, 256),
    (256,),
    (256, 256),
    (256,),
    (128, 256),
    (128,),
    (1, 128),
    (1,),
    (128, 256),
    (128,),
] + [(64, 128), (64,)] * 4
"""The optimizer bench's parameter shapes: a seed-scale network (obs 64 -> trunk 256-256-256, value head 128-1,
advantage 128 + 4 branches of 64), weight matrices and biases."""


def tree_inputs(device: torch.device | str) -> dict:
    """Seed-scale inputs of the sum-tree kernels (hotloop.kernels.segment_tree): a kernel tree and a reference
    `SumTree` of capacity 2^20 with random priorities, 8192 update indices (heavy duplicates) and priorities, 8192
    uniforms, beta, and output buffers, on `device`."""
    from hotloop.kernels.sum_tree import SumTree

    capacity, batch = 1 << 20, 8192
    g = torch.Generator(device=device).manual_seed(0)
    ref = SumTree(capacity, device)
    ref.update(torch.arange(capacity, device=device), torch.rand(capacity, generator=g, device=device) + 0.01)
    return {
        "capacity": capacity,
        "ref": ref,
        "nodes": ref.nodes.clone(),
        "max_value": ref.max_value.clone(),
        "bad_count": ref.bad_priority_count.clone(),
        "indices": torch.randint(0, capacity // 8, (batch,), generator=g, device=device),
        "values": torch.rand(batch, generator=g, device=device) * 2 + 0.01,
        "uniforms": torch.rand(batch, generator=g, device=device),
        "beta": torch.tensor(0.4, device=device),
        "out_indices": torch.empty(batch, dtype=torch.int64, device=device),
        "out_weights": torch.empty(batch, dtype=torch.float32, device=device),
    }


def tree_pairs(device: torch.device | str) -> list[Pair]:
    """The sum tree's update, sample and rebuild at seed scale; kernel and reference run on separate trees."""
    d = tree_inputs(device)
    ref, cap = d["ref"], d["capacity"]
    batch = d["uniforms"].shape[0]
    return [
        (
            "tree_update_8192_on_2^20",
            lambda: tree_update(d["nodes"], d["indices"], d["values"], cap, d["max_value"], d["bad_count"]),
            lambda: ref.update(d["indices"], d["values"]),
        ),
        (
            "tree_sample_8192",
            lambda: tree_sample(
                d["nodes"], cap, cap, batch, d["uniforms"], d["beta"], d["out_indices"], d["out_weights"]
            ),
            lambda: sample_reference(ref, cap, d["uniforms"], 0.4),
        ),
        ("tree_rebuild_2^20", lambda: tree_rebuild(d["nodes"]), ref.rebuild),
    ]


def spectral_norm_inputs(device: torch.device | str) -> dict:
    """Seed-scale inputs of hotloop.kernels.spectral_norm: its 10 SEED_SHAPES matrices packed in a flat fp32
    params_buf (~247k floats, values N(0, 0.05^2)), their table and persistent u, v, on `device`."""
    table = SpectralNormTable.from_shapes(SEED_SHAPES, device)
    gen = torch.Generator().manual_seed(0)
    params_buf = (0.05 * torch.randn(table.required_numel, generator=gen)).to(device)
    u, v = table.new_vectors(gen)
    return {"params_buf": params_buf, "table": table, "u": u, "v": v}


def spectral_norm_pairs(device: torch.device | str) -> list[Pair]:
    """The fused in-place spectral norm of the 10 matrices vs the reference loop over them in torch ops (one power
    iteration each)."""
    x = spectral_norm_inputs(device)
    mats, us, vs = x["table"].views(x["params_buf"], x["u"], x["v"])
    return [
        (
            "spectral_norm_10_matrices",
            lambda: spectral_norm_(x["params_buf"], x["table"], x["u"], x["v"]),
            lambda: spectral_norm_reference(mats, us, vs),
        )
    ]


def adam_inputs(device: torch.device | str) -> dict:
    """Seed-scale inputs of hotloop.kernels.fused_adam: 'shapes' (ADAM_SEED_SHAPES, P = 247,169 params, ~1 MB of
    fp32 grads), fresh random 'params_buf', 'grad_buf', 'target_buf' (P,) float32 on `device`, and the
    hyper-parameters."""
    shapes = list(ADAM_SEED_SHAPES)
    num = sum(int(torch.Size(s).numel()) for s in shapes)
    gen = torch.Generator(device="cpu").manual_seed(0)
    bufs = {
        k: torch.randn(num, generator=gen).to(device) * scale
        for k, scale in (("params_buf", 0.05), ("grad_buf", 0.02), ("target_buf", 0.05))
    }
    return dict(shapes=shapes, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, max_grad_norm=10.0, **bufs)


def adam_pairs(device: torch.device | str) -> list[Pair]:
    """One optimizer step per call, each on its own buffers: the fused two-launch step vs clip_grad_norm_ +
    torch.optim.Adam(foreach=True), and vs Adam(fused=True)."""
    inp = adam_inputs(device)
    hyper = dict(lr=inp["lr"], betas=inp["betas"], eps=inp["eps"], weight_decay=inp["weight_decay"])
    fused = FusedAdam(inp["params_buf"].numel(), device, max_grad_norm=inp["max_grad_norm"], **hyper)
    params, grads = inp["params_buf"].clone(), inp["grad_buf"].clone()

    def kernel():
        fused.step(params, grads)

    def make_reference(**adam_flags):
        ref_params = reference_params(inp["params_buf"].clone(), inp["grad_buf"].clone(), inp["shapes"])
        opt = torch.optim.Adam(ref_params, **hyper, **adam_flags)
        return lambda: adam_reference(opt, inp["max_grad_norm"])

    return [
        ("gradnorm_clip_adam_248k", kernel, make_reference(foreach=True, fused=False)),
        ("gradnorm_clip_adam_248k_vs_torch_fused", kernel, make_reference(fused=True)),
    ]


def td_loss_inputs(device: torch.device | str) -> dict:
    """Seed-scale inputs of hotloop.kernels.td_loss (B=8192, D=3, A=4, Huber, gamma 0.99, CQL on) as keyword
    arguments of `fused_td_loss`, on `device`; q requires grad."""
    g = torch.Generator(device=device).manual_seed(0)
    b, d, a = 8192, 3, 4

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g, device=device)

    return dict(
        q=randn(b, d, a).requires_grad_(),
        q_next_online=randn(b, d, a),
        q_next_target=randn(b, d, a),
        action=torch.randint(0, a, (b, d), generator=g, device=device),
        reward=randn(b),
        terminated=(torch.rand(b, generator=g, device=device) < 0.1).float(),
        weights=torch.rand(b, generator=g, device=device) * 0.9 + 0.1,
        gamma=0.99,
        kind="huber",
        huber_delta=1.0,
        cql_weight=0.1,
        per_eps=1e-6,
        per_alpha=0.6,
    )


def td_loss_pairs(device: torch.device | str) -> list[Pair]:
    """The fused TD loss's forward + backward vs the reference's forward + backward."""
    kw = td_loss_inputs(device)
    q = kw["q"]

    def fused() -> None:
        q.grad = None
        fused_td_loss(**kw).objective.backward()

    def reference() -> None:
        q.grad = None
        td_loss_reference(**kw).objective.backward()

    return [("td_loss_fused_8192x3x4", fused, reference)]


PAIRS: dict[str, Callable[[torch.device | str], list[Pair]]] = {
    "hotloop.kernels.segment_tree": tree_pairs,
    "hotloop.kernels.spectral_norm": spectral_norm_pairs,
    "hotloop.kernels.fused_adam": adam_pairs,
    "hotloop.kernels.td_loss": td_loss_pairs,
}
"""The kernel modules the bench times, in its order, and the pairs of each."""

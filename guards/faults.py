"""Faults the gate must catch, injected into a running Trainer: mutation tests of the guards on the real hot path.

`inject(trainer, name)` changes the step the gate guards (`Trainer.learner_step` with the hotloop learner,
`Trainer.train_step` with the reference one) so that it commits one regression of docs/criteria.md's table;
`hotloop gate --inject NAME` then has to FAIL the fault's criterion (`FAULTS[name].criterion`, a criterion id; the
list: hotloop.guards.fault_list). Each fault keeps
the step's math; it changes only what the criteria watch (a host read, a copy, a launch shape, a precision, a
stream). Two kinds:
- wrappers (item, event_sync, device_sync, pageable_copy, d2d_copy, grid1): the original step, then one extra
  operation;
- one-rank faults (extra_collective, rank_sync, rank_hang; `hotloop gate --nproc N`, N >= 2, any device): on rank
  hotloop.guards.fault_list.RANK_FAULT_RANK only, the learner step followed by an all-reduce of a one-element
  tensor over a group holding that rank alone (every rank creates the group: dist.new_group is collective), by a
  host read (`.item()`) of the step's metrics (or of the parameters' sum), or blocked forever on a
  threading.Event inside the step (`rank_hang`: the other ranks then block in the gradient all-reduce; the hang
  watchdog ends every rank with exit 3);
- learner changes (sn_split, ddqn_serial, fwd_fp32, bwd_tf32; hotloop learner only): a launch function of the
  HotLearner is swapped (its `linear_forward`, `linear_backward_input`, `spectral_norm` attributes) or its second
  stream dropped, and the CUDA graph is dropped so the next step re-captures it. fwd_fp32 / bwd_tf32 put cuBLAS
  GEMMs in place of the Triton ones; cuBLAS kernel names carry no phase, so these two run the step eagerly (no
  graph), where its record_function ranges name the phases.
Source of the idea: mutation testing of a guard (mutmut / cosmic-ray; TorchRL's exact-count recompile test,
`test/rb/test_composable.py::test_extend_sample_recompile`); the fault list is issue 5's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from hotloop.guards.fault_list import FAULTS, RANK_FAULT_RANK, Fault
from hotloop.guards.probes.bench_variants import tf32_matmuls
from hotloop.kernels.linear import linear_forward
from hotloop.kernels.spectral_norm import SpectralNormTable, spectral_norm_
from hotloop.kernels.tf32_split import split_tf32


def check_request(
    name: str | None,
    update_baseline: bool = False,
    *,
    device: torch.device | str | None = None,
    learner: str | None = None,
    spectral_norm: bool | None = None,
    world_size: int | None = None,
    grouped_forward: bool | None = None,
) -> None:
    """Raise ValueError for a fault `name` that is not in FAULTS, or any fault with update_baseline (a faulty run
    must never become a baseline). None (no fault) passes.
    A one-rank fault (FAULTS[name].one_rank) runs on any device, and needs `world_size` (the gate's ranks: --nproc,
    or the process group's size; None: not checked) >= RANK_FAULT_RANK + 1.

    When given (the CLI passes both, so that a request `inject` would refuse fails before any training):
    `device` (the run's resolved device): every fault but the one-rank ones needs a CUDA device (they are GPU
    regressions; a CPU run has no trace criteria to fail); `learner` ("hotloop" or "reference", the run's resolved
    learner kind): a learner fault (FAULTS[name].hot_only) needs the hotloop learner. `spectral_norm` (the run's
    cfg.spectral_norm): sn_split needs it on (without it the step launches no spectral norm to split).
    `grouped_forward` (the run's cfg.grouped_forward): fwd_fp32 and ddqn_serial need it off (the grouped forward
    calls neither the step's swappable `linear_forward` nor a Double-DQN stream: the fault would not be there)."""
    if name is not None and name not in FAULTS:
        raise ValueError(f"--inject: unknown fault {name!r}; choose one of {sorted(FAULTS)}")
    if name is not None and update_baseline:
        raise ValueError("--inject cannot be combined with --update-baseline (a faulty run is no baseline)")
    if name is None:
        return
    if FAULTS[name].one_rank:
        if world_size is not None and world_size <= RANK_FAULT_RANK:
            raise ValueError(
                f"--inject {name}: the fault acts on rank {RANK_FAULT_RANK} of a data-parallel gate: pass --nproc N "
                f"with N >= {RANK_FAULT_RANK + 1} (this gate has {world_size} process{'es' * (world_size != 1)})"
            )
        return
    if device is not None and torch.device(device).type != "cuda":
        raise ValueError(
            f"--inject {name}: the faults are GPU regressions and need a CUDA device, this run is on "
            f"{device} (pass --device cuda on a machine with a GPU)"
        )
    if learner is not None and FAULTS[name].hot_only and learner != "hotloop":
        raise ValueError(
            f"--inject {name}: the fault changes the hotloop learner; this run uses the {learner!r} "
            f"learner (set learner=hotloop or leave it auto on CUDA)"
        )
    if grouped_forward and name in ("fwd_fp32", "ddqn_serial"):
        raise ValueError(
            f"--inject {name}: this run has grouped_forward on, whose forward launches neither the swappable "
            "linear_forward nor a Double-DQN stream: the fault would not reach it (--set grouped_forward=false)"
        )
    if spectral_norm is False and name == "sn_split":
        raise ValueError(
            "--inject sn_split: this run has spectral norm off, so its step launches no spectral norm "
            "to split (--set spectral_norm=true, or the seed-scale preset)"
        )


def inject(trainer, name: str) -> Fault:
    """Inject fault `name` into `trainer` (a hotloop.trainer.loop.Trainer on CUDA) before its guarded steps; returns it.

    Raises ValueError for an unknown name (listing the valid ones), a learner fault with the reference learner,
    sn_split with spectral norm off, fwd_fp32 / ddqn_serial with grouped_forward on, or a trainer not on CUDA for a fault other than a one-rank one (those are GPU
    regressions: a CPU run has no trace criteria to fail); a one-rank fault: ValueError without a process group of
    at least 2 ranks (`_inject_one_rank`).
    """
    check_request(name, spectral_norm=trainer.cfg.spectral_norm, grouped_forward=trainer.cfg.grouped_forward)
    fault = FAULTS[name]
    if fault.one_rank:
        return _inject_one_rank(trainer, fault)
    hot = trainer.learner_kind == "hotloop"
    if fault.hot_only and not hot:
        raise ValueError(
            f"fault {name!r} changes the hotloop learner; this trainer uses the {trainer.learner_kind!r} learner"
        )
    if trainer.device.type != "cuda":
        raise ValueError(f"fault {name!r} needs a CUDA trainer (got {trainer.device})")
    if fault.hot_only:
        _LEARNER_FAULTS[name](trainer.learner)
        return fault
    attr = "learner_step" if hot else "train_step"
    step = getattr(trainer, attr)
    extra = _wrapper_fault(name, trainer)

    def faulty_step():
        out = step()
        extra()
        return out

    setattr(trainer, attr, faulty_step)
    return fault


def _inject_one_rank(trainer, fault: Fault) -> Fault:
    """Inject the one-rank `fault` into `trainer` (module docstring): its learner step (`Trainer.learner_step`, the
    loop's) on rank RANK_FAULT_RANK gets the extra operation after it (extra_collective, rank_sync) or blocks forever
    inside it (rank_hang); the other ranks only take part in creating extra_collective's group. Every rank must call
    it (dist.new_group). ValueError without a process group of more than RANK_FAULT_RANK ranks."""
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_initialized() else 1
    check_request(fault.name, world_size=world)
    group = dist.new_group([RANK_FAULT_RANK]) if fault.name == "extra_collective" else None
    if dist.get_rank() != RANK_FAULT_RANK:
        return fault
    step = trainer.learner_step
    one = torch.zeros(1, device=trainer.device)

    def faulty_step():
        if fault.name == "rank_hang":
            threading.Event().wait()  # never set: blocks forever, the GIL released (as a blocked collective does)
        out = step()
        if fault.name == "extra_collective":
            one.copy_(out[0] if out is not None else one)  # the step's loss, "averaged for the log"
            dist.all_reduce(one, group=group)
        else:  # rank_sync
            (out.sum() if out is not None else trainer.learner.params.sum()).item()
        return out

    trainer.learner_step = faulty_step
    return fault


def _wrapper_fault(name: str, trainer) -> Callable[[], object]:
    device = trainer.device
    params = (
        trainer.learner.params
        if trainer.learner_kind == "hotloop"
        else next(trainer.learner.online.parameters()).detach()
    )
    if name == "item":
        return lambda: params.sum().item()
    if name == "event_sync":

        def event_sync() -> None:
            event = torch.cuda.Event()
            event.record()
            event.synchronize()

        return event_sync
    if name == "device_sync":
        return lambda: torch.cuda.synchronize(device)
    if name == "pageable_copy":
        host = torch.empty(params.shape, dtype=params.dtype)  # not pinned
        return lambda: host.copy_(params, non_blocking=True)
    if name == "d2d_copy":
        spare = torch.empty_like(params)
        return lambda: spare.copy_(params)
    one = torch.zeros(1, device=device)  # grid1
    return lambda: one.add_(1.0)


def _scaled(t: torch.Tensor, g: torch.Tensor, gain_group: int) -> torch.Tensor:
    """t (M, N) times the gain of each column's group (N = groups * gain_group), by broadcasting (no tiny kernel)."""
    m, n = t.shape
    return (t.view(m, n // gain_group, gain_group) * g.view(1, -1, 1)).view(m, n)


def _fwd_fp32(learner) -> None:
    def forward(
        x,
        w,
        b,
        g,
        y,
        gain_group,
        relu,
        *,
        rows=None,
        nets=1,
        p_zstride=0,
        x_zstride=0,
        ddqn=False,
        yt=None,
        x_tf32=False,
        w_tf32=False,
        out_tf32=False,
    ):
        if nets != 1:  # the Double-DQN forward keeps its kernels
            return linear_forward(
                x,
                w,
                b,
                g,
                y,
                gain_group,
                relu,
                rows=rows,
                nets=nets,
                p_zstride=p_zstride,
                x_zstride=x_zstride,
                ddqn=ddqn,
                yt=yt,
                x_tf32=x_tf32,
                w_tf32=w_tf32,
                out_tf32=out_tf32,
            )
        inp = x.index_select(0, rows) if rows is not None else x[: y.shape[0]]
        with tf32_matmuls(False):
            torch.mm(inp, w.t(), out=y)
        y.copy_(_scaled(y, g, gain_group) + b)
        if relu:
            y.relu_()
        if yt is not None:  # y^T split into TF32 parts, as the kernel writes it
            yt.copy_(split_tf32(y.t()))
        return y

    learner.linear_forward = forward
    learner.round_weights = lambda src, dst: dst.copy_(src)  # FP32 on the weights as they are, not TF32-rounded
    _eager(learner)


def _bwd_tf32(learner) -> None:
    def input_grad(dy, wt, x, dxt, db, dx=None, *, weight_grad_below=None):
        with tf32_matmuls(True):  # wt: the (2, K, N) TF32 split of g W^T (hotloop.kernels.linear.WeightTranspose)
            dz = torch.mm(dy, (wt[0] + wt[1]).t()).mul_(x > 0)
        if dxt is not None:
            dxt.copy_(dz.t())
        db.add_(dz.sum(0))
        if dx is not None:
            dx.copy_(dz)
        if weight_grad_below is not None:  # the fused weight gradient of the layer below, in TF32 too
            x0t, w0, g0, dw0, dg0, gain0 = weight_grad_below
            with tf32_matmuls(True):
                part = torch.mm(dz.t(), (x0t[0] + x0t[1]).t())
            dw0.add_(_scaled(part.t().contiguous(), g0, gain0).t())
            if dg0 is not None:  # None: fixed gains (spectral norm off), as the kernel it stands in for
                dg0.add_((w0 * part).sum(1).view(-1, gain0).sum(1))
        return dxt

    learner.linear_backward_input = input_grad
    _eager(learner)


def _sn_split(learner) -> None:
    table = learner.sn_table
    rows = [r for r, _ in table.shapes]
    cols = [c for _, c in table.shapes]
    us, vs = learner.sn_u.split(rows), learner.sn_v.split(cols)
    tables = [
        SpectralNormTable.from_shapes([shape], learner.device, [offset])
        for shape, offset in zip(table.shapes, table.offsets)
    ]
    iters = learner.cfg.sn_power_iterations

    def per_matrix() -> None:
        for t, u, v in zip(tables, us, vs):
            spectral_norm_(learner.params, t, u, v, iters)

    learner.spectral_norm = per_matrix
    learner.graph = None


def _ddqn_serial(learner) -> None:
    learner.side = None
    learner.graph = None


def _eager(learner) -> None:
    learner.graph = None
    learner.use_graph = False


_LEARNER_FAULTS: dict[str, Callable[[object], None]] = {
    "sn_split": _sn_split,
    "ddqn_serial": _ddqn_serial,
    "fwd_fp32": _fwd_fp32,
    "bwd_tf32": _bwd_tf32,
}

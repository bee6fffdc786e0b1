"""The faults `hotloop gate --inject` can inject, by name, each with the id of the criterion it must FAIL: the fault
registry (hotloop.guards.faults injects them; `hotloop gate --help` lists them from here, `inject_help`).

A module of its own, importing no torch, so that building the `hotloop` parser stays light.
"""

from __future__ import annotations

from dataclasses import dataclass

from hotloop.guards.criteria import criterion


@dataclass(frozen=True)
class Fault:
    """One injectable regression: its name, the id of the criterion that must FAIL (hotloop.guards.criteria), what
    it does, whether it changes the hotloop learner (hot_only), and whether it acts on one rank of a data-parallel
    gate (`one_rank`: on rank RANK_FAULT_RANK only; `hotloop gate --nproc N`, N >= 2, on any device). Raises
    ValueError for an unknown criterion id."""

    name: str
    criterion: str
    what: str
    hot_only: bool
    one_rank: bool = False

    def __post_init__(self) -> None:
        criterion(self.criterion)  # ValueError naming an unknown id


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault("item", "no_stream_sync", "loss.item() after every step", False),
        Fault("event_sync", "no_event_sync", "record an event and Event.synchronize() after every step", False),
        Fault("device_sync", "no_event_sync", "torch.cuda.synchronize() after every step", False),
        Fault(
            "pageable_copy", "no_event_sync", "a non_blocking copy of the parameters into pageable host memory", False
        ),
        Fault("d2d_copy", "no_d2d_weight_sync", "a device-to-device copy of the parameters every step", False),
        Fault("grid1", "no_single_block_kernels", "a one-element add (a grid (1,1,1) kernel) every step", False),
        Fault("sn_split", "spectral_norm_fused", "spectral norm launched once per weight matrix", True),
        Fault(
            "ddqn_serial", "ddqn_overlapped", "the Double-DQN forward on the main stream, after the online one", True
        ),
        Fault("fwd_fp32", "tf32_forward_only", "the online forward's GEMMs in IEEE FP32 (cuBLAS, TF32 off)", True),
        Fault("bwd_tf32", "tf32_forward_only", "the backward's input-gradient GEMMs in TF32 (cuBLAS)", True),
        Fault(
            "extra_collective",
            "one_all_reduce_per_step",
            "rank 1 all-reduces a one-element tensor (a logged metric) over a group of its own after every "
            "learner step",
            False,
            one_rank=True,
        ),
        Fault(
            "rank_sync",
            "no_stream_sync",
            "rank 1 reads a value of its step to the host (.item()) after every learner step",
            False,
            one_rank=True,
        ),
        Fault(
            "rank_hang",
            "no_hang",
            "rank 1 blocks forever inside its next learner step (the other ranks then wait in the all-reduce)",
            False,
            one_rank=True,
        ),
    )
}
"""Fault name -> Fault, in the order `hotloop gate --help` lists them."""
RANK_FAULT_RANK = 1
"""The rank a one-rank fault (Fault.one_rank) acts on; the other ranks run the loop as it is."""
ONE_PROCESS_FAULTS = tuple(name for name, f in FAULTS.items() if not f.one_rank)
"""The faults a one-process gate can take (every fault but the one-rank ones)."""


def inject_help() -> str:
    """The faults as `hotloop gate --inject`'s help lists them: "item (no_stream_sync), event_sync (no_event_sync),
    ..." in FAULTS' order."""
    return ", ".join(f"{f.name} ({f.criterion})" for f in FAULTS.values())

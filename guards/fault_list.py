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
    it does, and whether it changes the hotloop learner (hot_only). Raises ValueError for an unknown criterion id."""

    name: str
    criterion: str
    what: str
    hot_only: bool

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
    )
}
"""Fault name -> Fault, in the order `hotloop gate --help` lists them."""


def inject_help() -> str:
    """The faults as `hotloop gate --inject`'s help lists them: "item (no_stream_sync), event_sync (no_event_sync),
    ..." in FAULTS' order."""
    return ", ".join(f"{f.name} ({f.criterion})" for f in FAULTS.values())

"""Programmatic dependent launch (PDL) for the learner step's Triton kernels: issue 38, lever 1.

On Hopper a kernel launched with the attribute cudaLaunchAttributeProgrammaticStreamSerialization may start while
the kernel before it on its stream still runs: its programs are dispatched as soon as every program of the
previous kernel has called `griddepcontrol.launch_dependents` (or exited), and each waits in `griddepcontrol.wait`
until that kernel has completed and its memory is visible (CUDA C++ Programming Guide, "Programmatic Dependent
Launch and Synchronization"; PTX ISA, griddepcontrol). What it overlaps is the next kernel's launch and ramp-up with
the previous kernel's last wave; stream capture keeps it as a programmatic edge of the CUDA graph (CUDA 12.3+).
Triton exposes both instructions (`tl.extra.cuda.gdc_wait`, `gdc_launch_dependents`) and the launch attribute
(`launch_pdl=True`: triton-lang/triton#6394, python/tutorials/11-programmatic-dependent-launch.py).

The contract every kernel launched here keeps: `gdc_prologue(GDC)` is its first statement, before it reads or
writes any memory, so a kernel started early touches nothing until its predecessor is complete. The wait comes
first in every program, so a kernel's completion implies its predecessor's: the ordering of a chain holds
transitively, also where a kernel without the attribute (a torch fill, an NCCL collective) follows or precedes
one. `hotloop.profiles.sm90_compile.dependent_launch_order` checks the contract on each launch's compiled PTX.

Switch: `dependent_launch(True)` around the launches (HotLearner._body under Config.dependent_launch); the
launchers pass `**pdl_kwargs()`. Under TRITON_INTERPRET=1 the interpreter has no griddepcontrol: GDC stays False
and `launch_pdl` is ignored there, so the CPU tests run the same arithmetic either way.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

import triton
import triton.language as tl

from hotloop.kernels._common import interpreting

_ENABLED = contextvars.ContextVar("hotloop_dependent_launch", default=False)


@contextmanager
def dependent_launch(enabled: bool = True) -> Iterator[None]:
    """Context: the kernels launched inside it (by launchers that pass `pdl_kwargs()`) use programmatic dependent
    launch when `enabled`; restores the previous setting on exit (nestable; per thread and task)."""
    token = _ENABLED.set(bool(enabled))
    try:
        yield
    finally:
        _ENABLED.reset(token)


def _compiles_gdc() -> bool:
    """Whether the kernels compile the griddepcontrol instructions: on a GPU; not on the interpreter (which has
    none). hotloop.profiles.sm90_compile's capture patches it to True: its launches are compiled, never run."""
    return not interpreting()


def pdl_kwargs() -> dict[str, bool]:
    """The launch keywords of a kernel that takes the GDC constexpr: {"GDC": ..., "launch_pdl": ...}, both the
    current `dependent_launch` setting (GDC False on the interpreter)."""
    enabled = _ENABLED.get()
    return {"GDC": enabled and _compiles_gdc(), "launch_pdl": enabled}


@triton.jit
def gdc_prologue(GDC: tl.constexpr):
    """A PDL kernel's first statement: wait for the previous kernel on the stream to complete (its memory
    visible), then let the next kernel's programs launch (they wait in their own prologue). No-op when GDC is
    False."""
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()

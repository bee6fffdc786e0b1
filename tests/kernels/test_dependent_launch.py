"""The programmatic-dependent-launch switch (kernels/dependent_launch.py, issue 38 lever 1): the launch keywords it
gives, its scoping, and the learner step's launches under Config.dependent_launch. That each PDL kernel waits before
touching memory is checked on its compiled PTX (tests/profiles/test_sm90_compile.py); the timing on the GPU
(`hotloop bench --variants hotloop,hotloop:dependent_launch`)."""

from __future__ import annotations

import threading

import pytest
import torch

from hotloop.kernels._common import interpreting
from hotloop.kernels.dependent_launch import dependent_launch, pdl_kwargs
from hotloop.trainer.config import preset
from hotloop.trainer.replay import PrioritizedReplay
from hotloop.trainer.step import HotLearner


def test_the_switch_is_off_by_default_and_scoped():
    assert pdl_kwargs() == {"GDC": False, "launch_pdl": False}
    with dependent_launch(True):
        assert pdl_kwargs()["launch_pdl"] is True
        # the interpreter has no griddepcontrol: the kernels compile it only on a GPU
        assert pdl_kwargs()["GDC"] is (not interpreting())
        with dependent_launch(False):
            assert pdl_kwargs() == {"GDC": False, "launch_pdl": False}
        assert pdl_kwargs()["launch_pdl"] is True
        seen = []
        thread = threading.Thread(target=lambda: seen.append(pdl_kwargs()["launch_pdl"]))
        thread.start()
        thread.join()
        assert seen == [False]  # another thread's launches are not switched
    assert pdl_kwargs()["launch_pdl"] is False
    with pytest.raises(KeyError):
        with dependent_launch(True):
            raise KeyError("boom")
    assert pdl_kwargs()["launch_pdl"] is False  # restored after an exception


def _learner(on: bool) -> HotLearner:
    cfg = preset("cartpole", learner="hotloop", batch_size=32, replay_capacity=256, dependent_launch=on)
    rp = PrioritizedReplay(256, 4, 1, alpha=cfg.per_alpha, eps=cfg.per_eps, device="cpu", use_kernels=True)
    g = torch.Generator().manual_seed(3)
    rp.add(
        torch.randn(256, 4, generator=g),
        torch.randint(0, 2, (256, 1), generator=g),
        torch.randn(256, generator=g),
        torch.randn(256, 4, generator=g),
        torch.rand(256, generator=g) < 0.1,
    )
    return HotLearner(cfg, 4, (2,), torch.device("cpu"), rp)


@pytest.mark.skipif(not interpreting(), reason="runs the learner step's kernels on the CPU interpreter")
def test_the_step_launches_every_kernel_with_the_switch_and_learns_the_same():
    from hotloop.profiles.sm90_compile import capture_launches

    on, off = _learner(True), _learner(False)
    with capture_launches() as launches:
        on.step()
    assert len(launches) >= 15 and all(launch.options.get("launch_pdl") is True for launch in launches), [
        (launch.name, launch.options) for launch in launches if not launch.options.get("launch_pdl")
    ]
    on, off = _learner(True), _learner(False)
    for _ in range(3):
        on.step()
        off.step()
    assert torch.isfinite(on.params).all() and not torch.equal(on.params, _learner(True).params)  # it learned
    assert torch.equal(on.params, off.params)  # the same arithmetic: PDL changes only when kernels start
    assert pdl_kwargs()["launch_pdl"] is False  # the step's switch does not leak out of it

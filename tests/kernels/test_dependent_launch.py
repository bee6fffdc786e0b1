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


@pytest.mark.skipif(not interpreting(), reason="captures the learner step's launches on the CPU interpreter")
def test_the_step_launches_every_kernel_with_the_switch():
    """Every Triton launch of a step under Config.dependent_launch asks for PDL (a launcher that forgot
    pdl_kwargs() would launch plainly: no race, no gain; one that passed it to a kernel without the prologue fails
    at the launch, GDC having no default), and the switch does not leak out of the step. The arithmetic under PDL is
    checked on the GPU (tests/trainer/test_hot_learner.py, graph replay against eager steps)."""
    from hotloop.profiles.sm90_compile import capture_launches

    on, off = _learner(True), _learner(False)
    for learner, expected in ((on, True), (off, False)):
        with capture_launches() as launches:
            learner.step()
        assert len(launches) >= 15 and all(launch.options.get("launch_pdl") is expected for launch in launches), [
            (launch.name, launch.options) for launch in launches if launch.options.get("launch_pdl") is not expected
        ]
    assert pdl_kwargs()["launch_pdl"] is False


def test_a_gpu_older_than_hopper_is_refused_before_any_work(monkeypatch):
    from hotloop.trainer.step import check_device_supports

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    cfg = preset("cartpole", dependent_launch=True)
    with pytest.raises(ValueError, match="dependent_launch needs a Hopper-class GPU .* is sm_80"):
        check_device_supports(cfg, torch.device("cuda"))
    check_device_supports(preset("cartpole"), torch.device("cuda"))  # the switch off: any GPU
    check_device_supports(cfg, torch.device("cpu"))  # the CPU's interpreter ignores it
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_device_supports(cfg, torch.device("cuda"))

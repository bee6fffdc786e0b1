"""Learning on real input: the cartpole preset learns CartPole-v1 on the CPU (issue 2's acceptance)."""

import math

import pytest

from hotloop.trainer.config import preset
from hotloop.trainer.loop import Trainer


@pytest.mark.slow
def test_cartpole_preset_reaches_195_on_cpu():
    # 15 epochs of the cartpole preset (15k learner steps, ~125k env steps): the mean training return over the
    # last 100 episodes must reach CartPole-v0's "solved" bar of 195.
    trainer = Trainer(preset("cartpole", device="cpu", epochs=15))
    rows = [s for s in trainer.epochs()]
    returns = [s.mean_return_100 for s in rows]
    assert not any(math.isnan(r) for r in returns)
    assert returns[-1] >= 195.0, returns
    assert rows[-1].epsilon == pytest.approx(preset("cartpole").eps_end)

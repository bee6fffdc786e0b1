"""The side-by-side tracer (results/lab/learner_compare.py): the flat net mapped into the reference network computes the
same Q-values, the first step of both learners on the same batch from the same parameters gives the same loss and
priorities, and a config it cannot compare is refused. CPU: the hotloop kernels run in the Triton interpreter."""

import pytest
import torch

from hotloop.trainer.config import preset
from hotloop.trainer.flat_net import FlatLayout, forward_reference
from hotloop.trainer.network import BranchingDuelingQNet
from lab.learner_compare import COMPARE_COLUMNS, compare_learners, reference_weights

TINY = dict(
    device="cuda" if torch.cuda.is_available() else "cpu",
    num_envs=8,
    learning_starts=256,
    batch_size=32,
    trunk_hidden=(16,),
    head_hidden=16,
    spectral_norm=False,
)


def test_reference_weights_give_the_flat_nets_q_values():
    lay = FlatLayout(5, (3, 3), (12, 10), 7)
    buf = lay.init_params(torch.Generator().manual_seed(3))
    for s in lay.layers:  # gains other than 1, so that folding them in is tested
        s.views(buf)[2].uniform_(0.5, 2.0)
    lay.out_views(buf)[2].uniform_(0.5, 2.0)

    class _Learner:  # what reference_weights reads of a HotLearner
        layout = lay

    net = BranchingDuelingQNet(5, (3, 3), (12, 10), 7, spectral_norm=False)
    net.load_state_dict(reference_weights(_Learner, buf))
    obs = torch.randn(9, 5)
    expected = forward_reference(lay, buf.double(), obs.double())  # (B, D, A)
    got = torch.stack(net(obs), dim=1).double()
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_the_two_learners_take_the_same_steps():
    """Same loss and priorities at the first step; with spectral norm off the gains stay 1 (no gain gradient is
    written: results/cpu/learning_causes/README.md H1), so in FP32 the parameters stay equal to float rounding
    (they parted by one Adam step of the gains, ~7e-4, per step before)."""
    table = compare_learners(preset("cartpole-fast", **TINY), steps=3)
    assert list(table.columns) == COMPARE_COLUMNS and table.step.tolist() == [1, 2, 3]
    first = table.iloc[0]
    tol = 1e-5 if TINY["device"] == "cpu" else 5e-3  # TF32 forward on the GPU
    assert first.loss_rel < tol and first.priority_rel < tol, first
    assert (table.gain_dev == 0).all(), table.gain_dev
    assert (table.params_rel < (1e-6 if TINY["device"] == "cpu" else 1e-3)).all(), table.params_rel


def test_the_two_learners_clip_the_same_targets():
    """With a TD-target clip that binds (this tiny net's first targets are 0.77-0.78 and 1.0 where terminal, so 0.775
    cuts through them), both learners still take the same first step; the clip changes that step's loss, so a
    learner that ignored it would differ."""
    free = compare_learners(preset("cartpole-fast", **TINY), steps=1).iloc[0]
    clipped = compare_learners(preset("cartpole-fast", **TINY, td_target_max=0.775), steps=1).iloc[0]
    assert abs(clipped.loss_ref - free.loss_ref) > 1e-3 * free.loss_ref, "the clip must bind"
    tol = 1e-5 if TINY["device"] == "cpu" else 5e-3
    assert clipped.loss_rel < tol and clipped.priority_rel < tol, clipped


def test_spectral_norm_is_refused():
    with pytest.raises(ValueError, match="spectral_norm=False"):
        compare_learners(preset("cartpole-fast", **{**TINY, "spectral_norm": True}), steps=1)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        compare_learners(preset("cartpole-fast", **TINY), steps=0)


def test_the_two_learners_decay_lr_alike():
    """lr decays linearly to 0 over the run's 3 learner steps (factors 1, 2/3, 1/3): the reference learner sets its
    Adam lr from its update count, the hotloop learner's FusedAdam from its device step count; they stay equal,
    and the decay changes the parameters (a learner that ignored it would part from the other)."""
    short = dict(TINY, epochs=1, learner_steps_per_epoch=3)
    const = compare_learners(preset("cartpole-fast", **short), steps=3)
    decayed = compare_learners(preset("cartpole-fast", **short, lr_end_factor=0.0), steps=3)
    assert (decayed.params_rel < (1e-6 if TINY["device"] == "cpu" else 1e-3)).all(), decayed.params_rel
    assert abs(decayed.loss_ref.iloc[2] - const.loss_ref.iloc[2]) > 1e-4 * const.loss_ref.iloc[2], "no decay seen"

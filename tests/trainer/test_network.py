import pytest
import torch

from hotloop.trainer.network import BranchingDuelingQNet


def _net(**kw):
    torch.manual_seed(0)
    args = dict(obs_dim=6, action_nvec=(3, 2), trunk_hidden=(16, 12), head_hidden=8)
    args.update(kw)
    return BranchingDuelingQNet(**args)


@pytest.mark.smoke
def test_shapes_and_matrix_count():
    net = _net()
    q = net(torch.randn(5, 6))
    assert [t.shape for t in q] == [(5, 3), (5, 2)]
    assert all(t.dtype == torch.float32 for t in q)
    assert len(net.weight_matrices()) == 2 + 2 + 2 * 2


def test_dueling_decomposition():
    net = _net().eval()  # eval: no power-iteration step between the two forwards
    obs = torch.randn(7, 6)
    q, _ = net.forward_with_features(obs)
    v = net.value(net.trunk(obs))
    for qd in q:  # mean_a Q_d(s, a) == V(s) because the advantages are centred
        torch.testing.assert_close(qd.mean(dim=1, keepdim=True), v, rtol=1e-5, atol=1e-5)


def test_every_weight_matrix_is_spectrally_normalized():
    net = _net(power_iterations=1)
    net.train()
    for _ in range(200):  # power iteration converges on the persistent u vectors
        net(torch.randn(4, 6))
    net.eval()
    for layer in (m for m in net.modules() if isinstance(m, torch.nn.Linear)):
        w = layer.weight.detach().double()
        sigma = torch.linalg.matrix_norm(w, ord=2).item()
        assert sigma == pytest.approx(1.0, rel=1e-3), layer
    # The effective matrices are the normalized ones times the learned gain.
    for w, layer in zip(net.weight_matrices(), (m for m in net.modules() if isinstance(m, torch.nn.Linear))):
        torch.testing.assert_close(w, layer.weight * layer.gain)


def test_without_spectral_norm_the_weights_are_plain():
    net = _net(spectral_norm=False)
    sigmas = [torch.linalg.matrix_norm(w.detach(), ord=2).item() for w in net.weight_matrices()]
    assert any(abs(s - 1.0) > 0.05 for s in sigmas)


def test_bad_sizes():
    with pytest.raises(ValueError, match="bad sizes"):
        _net(action_nvec=())

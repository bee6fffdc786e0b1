import pytest
import torch

from hotloop.kernels.losses import branch_diversity_term, chosen_q, cql_term, double_dqn_target, td_loss


def test_double_dqn_target_hand_made_example():
    # Two transitions, one branch of 3 actions. The online net picks the argmax on s'; the target net scores it.
    next_online = [torch.tensor([[1.0, 5.0, 2.0], [0.0, -1.0, 3.0]])]  # argmax: action 1, action 2
    next_target = [torch.tensor([[10.0, 7.0, 30.0], [4.0, 8.0, 6.0]])]  # max would be 30 and 8: not used
    reward = torch.tensor([1.0, 2.0])
    terminated = torch.tensor([0.0, 0.0])
    y = double_dqn_target(reward, terminated, 0.5, next_online, next_target)
    torch.testing.assert_close(y, torch.tensor([1.0 + 0.5 * 7.0, 2.0 + 0.5 * 6.0]))
    # A terminal transition does not bootstrap.
    y = double_dqn_target(reward, torch.tensor([1.0, 0.0]), 0.5, next_online, next_target)
    torch.testing.assert_close(y, torch.tensor([1.0, 5.0]))


def test_double_dqn_target_clipped_to_the_return_bound():
    # The hand-made example's targets 4.5 and 5.0, clipped at 4.8: only the second one moves; 0 = no clip.
    next_online = [torch.tensor([[1.0, 5.0, 2.0], [0.0, -1.0, 3.0]])]
    next_target = [torch.tensor([[10.0, 7.0, 30.0], [4.0, 8.0, 6.0]])]
    reward, terminated = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0])
    y = double_dqn_target(reward, terminated, 0.5, next_online, next_target, target_max=4.8)
    torch.testing.assert_close(y, torch.tensor([4.5, 4.8]))
    y = double_dqn_target(reward, terminated, 0.5, next_online, next_target, target_max=0.0)
    torch.testing.assert_close(y, torch.tensor([4.5, 5.0]))


def test_double_dqn_target_averages_branches():
    next_online = [torch.tensor([[0.0, 1.0]]), torch.tensor([[2.0, 0.0, 1.0]])]  # picks 1 and 0
    next_target = [torch.tensor([[3.0, 4.0]]), torch.tensor([[6.0, 9.0, 9.0]])]  # 4 and 6 -> mean 5
    y = double_dqn_target(torch.tensor([0.0]), torch.tensor([False]), 1.0, next_online, next_target)
    torch.testing.assert_close(y, torch.tensor([5.0]))


def test_td_loss_huber_and_mse_with_weights():
    td = torch.tensor([[0.5, 3.0], [-2.0, 0.1]])
    w = torch.tensor([1.0, 0.5])
    huber = torch.tensor([[0.125, 2.5], [1.5, 0.005]])
    expected = (w * huber.mean(dim=1)).mean()
    torch.testing.assert_close(td_loss(td, w, "huber", 1.0), expected)
    torch.testing.assert_close(td_loss(td, w, "mse"), (w * (0.5 * td.square()).mean(dim=1)).mean())
    with pytest.raises(ValueError, match="kind must be"):
        td_loss(td, w, "l1")


def test_cql_and_chosen_q():
    q = [torch.tensor([[1.0, 2.0], [0.0, 0.0]])]
    action = torch.tensor([[1], [0]])
    torch.testing.assert_close(chosen_q(q, action), torch.tensor([[2.0], [0.0]]))
    lse = torch.tensor([1.0, 2.0]).logsumexp(0)
    expected = ((lse - 2.0) + (torch.tensor(2.0).log() - 0.0)) / 2
    torch.testing.assert_close(cql_term(q, action), expected)


def test_branch_diversity():
    a = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    assert branch_diversity_term([a]).item() == 0.0
    torch.testing.assert_close(branch_diversity_term([a, a]), torch.tensor(1.0))
    torch.testing.assert_close(branch_diversity_term([a, -a, a]), torch.tensor(1.0))
    orth = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    torch.testing.assert_close(branch_diversity_term(list(orth)), torch.tensor(0.0))

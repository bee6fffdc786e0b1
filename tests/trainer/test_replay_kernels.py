"""PrioritizedReplay with the Triton tree kernels (interpreter on CPU, native on CUDA) vs its torch tree."""

import torch

from hotloop.trainer.replay import PrioritizedReplay

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _pair(capacity=37):
    g1 = torch.Generator(device=DEV).manual_seed(5)
    g2 = torch.Generator(device=DEV).manual_seed(5)
    return (
        PrioritizedReplay(capacity, 3, 2, device=DEV, generator=g1, use_kernels=True),
        PrioritizedReplay(capacity, 3, 2, device=DEV, generator=g2, use_kernels=False),
    )


def _transitions(n, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return (
        torch.randn(n, 3, generator=g, device=DEV),
        torch.randint(0, 4, (n, 2), generator=g, device=DEV),
        torch.randn(n, generator=g, device=DEV),
        torch.randn(n, 3, generator=g, device=DEV),
        torch.rand(n, generator=g, device=DEV) < 0.2,
    )


def test_kernel_tree_matches_torch_tree_through_add_sample_update():
    fast, ref = _pair()
    for step in range(6):
        batch = _transitions(11, seed=step)  # 66 transitions into 37 slots: the ring wraps
        fast.add(*batch)
        ref.add(*batch)
        torch.testing.assert_close(fast.tree.nodes, ref.tree.nodes, rtol=1e-5, atol=1e-6)
        a, b = fast.sample(16, beta=0.5), ref.sample(16, beta=0.5)
        assert torch.equal(a.indices, b.indices)
        torch.testing.assert_close(a.weights, b.weights, rtol=1e-5, atol=1e-6)
        assert torch.equal(a.obs, b.obs) and torch.equal(a.action, b.action)
        td = torch.randn(16, generator=torch.Generator(device=DEV).manual_seed(100 + step), device=DEV)
        unique = torch.unique(a.indices)  # duplicates may resolve differently; use one index each
        fast.update_priorities(unique, td[: unique.numel()])
        ref.update_priorities(unique, td[: unique.numel()])
        torch.testing.assert_close(fast.tree.nodes, ref.tree.nodes, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fast.max_priority, ref.max_priority)
    assert fast.use_kernels and not ref.use_kernels

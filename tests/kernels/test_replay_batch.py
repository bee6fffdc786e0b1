"""kernels/replay_batch.py against its plain-torch references: fresh random inputs, outputs poisoned first.
On CPU the kernels run in the Triton interpreter; on the GPU natively."""

from __future__ import annotations

import pytest
import torch

from hotloop.kernels.replay_batch import batch_uniforms, gather_reference, gather_transitions, uniforms_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("batch,branches,capacity,obs_dim", [(37, 3, 101, 5), (1030, 1, 2000, 40)])
def test_gather_matches_indexing(batch, branches, capacity, obs_dim):
    gen = torch.Generator().manual_seed(batch)
    idx = torch.randint(0, capacity, (batch,), generator=gen).to(DEVICE)  # duplicates included
    action = torch.randint(0, 7, (capacity, branches), generator=gen).to(DEVICE)
    reward = torch.randn(capacity, generator=gen).to(DEVICE)
    term = (torch.rand(capacity, generator=gen) < 0.3).float().to(DEVICE)
    obs = torch.randn(capacity, obs_dim, generator=gen).to(DEVICE)
    outs = (
        torch.full((batch, branches), -99, dtype=torch.int64, device=DEVICE),
        torch.full((batch,), float("nan"), device=DEVICE),
        torch.full((batch,), float("nan"), device=DEVICE),
        torch.full((2, obs_dim, batch), float("nan"), device=DEVICE),
    )
    gather_transitions(idx, action, reward, term, obs, *outs)
    with pytest.raises(ValueError, match="obs_src must be 2-D"):
        gather_transitions(idx, action, reward, term, obs[:, 0], *outs)
    for got, want in zip(outs, gather_reference(idx, action, reward, term, obs)):
        assert torch.equal(got, want)
    hi, lo = outs[3]  # the TF32 split: hi has 10 mantissa bits, and hi + lo is the observation within 2^-22
    assert not bool((hi.view(torch.int32) & 0x1FFF).any())
    torch.testing.assert_close((hi.double() + lo.double()), obs[idx].T.double(), rtol=2.5e-7, atol=0)


@pytest.mark.smoke
def test_uniforms_depend_on_the_counter_only_and_beta_anneals():
    out = torch.full((3000,), float("nan"), device=DEVICE)
    beta = torch.full((), float("nan"), device=DEVICE)
    draws = []
    for step in (0, 1, 0, 250, 1000):
        counter = torch.tensor(step, dtype=torch.int64, device=DEVICE)
        batch_uniforms(counter, out, beta, seed=7, beta_start=0.4, beta_end=1.0, anneal_steps=500)
        assert float(beta) == pytest.approx(uniforms_reference(step, 0.4, 1.0, 500))
        assert 0.0 <= float(out.min()) and float(out.max()) < 1.0 and abs(float(out.mean()) - 0.5) < 0.03
        draws.append(out.clone())
    assert torch.equal(draws[0], draws[2])  # same counter, same numbers (eager == graph replay)
    assert not torch.equal(draws[0], draws[1])  # the next step draws new ones
    with pytest.raises(ValueError, match="anneal_steps"):
        batch_uniforms(torch.tensor(0, device=DEVICE), out, beta, 7, 0.4, 1.0, 0)

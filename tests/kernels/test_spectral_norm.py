"""Fused spectral norm (kernels/spectral_norm.py) vs its float64 reference and torch's own parametrization.

On CPU the kernel runs under the Triton interpreter (tests/conftest.py); `gpu` tests run natively on CUDA.
Small `min_slabs` keep the interpreter's grid short; the default (66) is checked on the table alone and on the GPU.
"""

import pytest
import torch
from torch import nn

from hotloop.kernels.spectral_norm import SEED_SHAPES, SpectralNormTable, spectral_norm_, spectral_norm_reference

ODD = [(1, 1), (3, 5), (7, 130), (130, 7), (257, 33)]
NAN = float("nan")


# Kernel tests run natively on a CUDA machine and on the Triton interpreter elsewhere.
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def setup(shapes, device=DEV, seed=0, gap=3, **table_kw):
    """Table with `gap` floats between matrices (poisoned with a sentinel), random N(0, 1) weights and normalized
    random u, v; the table's sigma and scratch poisoned with NaN (the kernel must write before it reads)."""
    offsets, o = [], gap
    for r, c in shapes:
        offsets.append(o)
        o += r * c + gap
    table = SpectralNormTable.from_shapes(shapes, device, offsets=offsets, **table_kw)
    g = torch.Generator().manual_seed(seed)
    buf = torch.full((o,), 1234.5)
    for (r, c), off in zip(shapes, offsets):
        buf[off : off + r * c] = torch.randn(r * c, generator=g)
    u, v = table.new_vectors(g)
    for t in (table.sigma, table.partials, table.slab_norms):
        t.fill_(NAN)
    return table, buf.to(device), u, v


def reference(table, buf, u, v, n):
    mats, us, vs = table.views(buf, u, v)
    return spectral_norm_reference([m.double() for m in mats], [x.double() for x in us], [x.double() for x in vs], n)


def assert_matches(table, buf, u, v, ref, rtol=2e-5, atol=2e-6):
    mats, us, vs = table.views(buf, u, v)
    ref_w, ref_sigma, ref_u, ref_v = ref
    torch.testing.assert_close(table.sigma.double(), ref_sigma, rtol=rtol, atol=0)
    for i, (got, want) in enumerate(zip(mats + us + vs, ref_w + ref_u + ref_v)):
        torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol, msg=f"tensor {i}")


def assert_clean(table, buf, gap_value=1234.5):
    """Counters reset by the kernel itself, and nothing outside the matrices written."""
    assert table.counters.eq(0).all() and table.done.eq(0).all() and table.ticket.eq(0).all()
    mask = torch.ones(buf.numel(), dtype=torch.bool, device=buf.device)
    for (r, c), o in zip(table.shapes, table.offsets):
        mask[o : o + r * c] = False
    assert buf[mask].eq(gap_value).all()


@pytest.mark.parametrize("n_iter", [1, 2, 3])
def test_odd_shapes_match_reference(n_iter):
    table, buf, u, v = setup(ODD, min_slabs=8)
    ref = reference(table, buf, u, v, n_iter)
    u.fill_(NAN)  # as in torch, the incoming u is overwritten before it is read
    sigma = spectral_norm_(buf, table, u, v, n_power_iterations=n_iter)
    assert sigma is table.sigma
    assert_matches(table, buf, u, v, ref)
    assert_clean(table, buf)


@pytest.mark.smoke
def test_many_slabs_and_chunks_match_reference():
    # 8-row slabs, 64-column chunks, 8-slab reduction chunks: every loop of the kernel runs several times
    table, buf, u, v = setup(ODD, seed=1, min_slabs=32, tile=512)
    assert (table.block_rows, table.block_cols, table.block_slabs) == (8, 64, 8) and table.n_slabs == 53
    ref = reference(table, buf, u, v, 2)
    spectral_norm_(buf, table, u, v, n_power_iterations=2)
    assert_matches(table, buf, u, v, ref)
    assert_clean(table, buf)


@pytest.mark.parametrize("n_iter", [1, 3])
def test_sigma_matches_torch_parametrization(n_iter):
    """Kernel step k == torch's _power_method step k from the same v (u is overwritten first in both)."""
    shapes = [(7, 130), (33, 5)]
    table, buf, u, v = setup(shapes, seed=2, min_slabs=4)
    mats, us, vs = table.views(buf, u, v)
    expected = []
    for w, u0, v0 in zip(mats, us, vs):
        lin = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device).double()
        lin.weight.data.copy_(w)
        nn.utils.parametrizations.spectral_norm(lin, n_power_iterations=n_iter)
        param = lin.parametrizations.weight[0]
        param._u.copy_(u0)
        param._v.copy_(v0)
        lin.train()
        w_sn = lin.weight.detach().clone()  # runs n_iter power iterations, then W / sigma
        sigma = torch.vdot(param._u, torch.mv(lin.parametrizations.weight.original, param._v))
        expected.append((w_sn, sigma, param._u.clone(), param._v.clone()))
    spectral_norm_(buf, table, u, v, n_power_iterations=n_iter)
    for (w_sn, sigma, tu, tv), w, s, ku, kv in zip(expected, mats, table.sigma, us, vs):
        torch.testing.assert_close(s.double(), sigma, rtol=2e-5, atol=0)
        torch.testing.assert_close(w.double(), w_sn, rtol=2e-5, atol=2e-6)
        torch.testing.assert_close(ku.double(), tu, rtol=2e-5, atol=2e-6)
        torch.testing.assert_close(kv.double(), tv, rtol=2e-5, atol=2e-6)


def test_repeated_calls_converge_to_unit_spectral_norm():
    shapes = [(1, 1), (3, 5), (9, 17), (20, 6)]
    table, buf, u, v = setup(shapes, seed=3, min_slabs=4)
    ref = reference(table, buf, u, v, 4)  # the first call's; then the reference applied to the previous call's output
    for _ in range(12):
        sigma = spectral_norm_(buf, table, u, v, n_power_iterations=4)
        assert_matches(table, buf, u, v, ref)
        ref = reference(table, buf, u, v, 4)
    mats, _, _ = table.views(buf, u, v)
    torch.testing.assert_close(sigma, torch.ones_like(sigma), rtol=1e-4, atol=0)
    true_norms = torch.stack([torch.linalg.matrix_norm(w.double(), 2) for w in mats])
    torch.testing.assert_close(true_norms, torch.ones_like(true_norms), rtol=1e-3, atol=0)
    assert_clean(table, buf)


def test_scratch_poison_between_calls_is_harmless():
    """Partials and slab norms are fully rewritten before being read, in every call."""
    table, buf, u, v = setup([(5, 9), (12, 4)], seed=4, min_slabs=4)
    spectral_norm_(buf, table, u, v, n_power_iterations=2)
    ref = reference(table, buf, u, v, 2)
    for t in (table.sigma, table.partials, table.slab_norms):
        t.fill_(NAN)
    spectral_norm_(buf, table, u, v, n_power_iterations=2)
    assert_matches(table, buf, u, v, ref)


def test_table_layout_and_seed_grid():
    table = SpectralNormTable.from_shapes(SEED_SHAPES, DEV)
    assert table.required_numel == sum(r * c for r, c in SEED_SHAPES) == 246800
    assert table.block_rows == 16 and table.n_slabs == 72  # the H200 sweep's split: 144 programs per iteration
    assert (table.block_cols, table.block_slabs) == (512, 16)
    assert table.slab_count.tolist() == [32, 16, 5, 1, 5, 5, 5, 1, 1, 1]
    assert table.partials.numel() == 2 * table.part_numel
    tiny = SpectralNormTable.from_shapes([(1, 1)], DEV)
    assert tiny.n_slabs == 1  # the launch still has (n + 1) * 1 >= 2 programs, never a single block


def test_seed_shapes_are_the_networks():
    from hotloop.trainer.network import BranchingDuelingQNet

    net = BranchingDuelingQNet(64, (4, 4, 4), (512, 256), 80, spectral_norm=False)
    shapes = [tuple(m.weight.shape) for m in net.modules() if isinstance(m, nn.Linear)]
    assert sorted(shapes) == sorted(SEED_SHAPES)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(shapes=[]),
        dict(shapes=[(0, 3)]),
        dict(shapes=[(2, 3)], offsets=[-1]),
        dict(shapes=[(2, 3), (2, 2)], offsets=[0, 5]),
        dict(shapes=[(2, 3)], offsets=[0, 6]),
        dict(shapes=[(2, 3)], tile=100),
        dict(shapes=[(2, 3)], min_slabs=0),
    ],
)
def test_table_rejects_bad_layouts(kwargs):
    with pytest.raises(ValueError):
        SpectralNormTable.from_shapes(device=DEV, **kwargs)


def test_launcher_rejects_bad_inputs():
    table, buf, u, v = setup([(3, 5), (4, 2)], min_slabs=2)
    bad = [
        (buf.double(), u, v, {}),
        (buf[:-5], u, v, {}),
        (buf.view(1, -1), u, v, {}),
        (buf[::2], u, v, {}),
        (buf, u[:-1], v, {}),
        (buf, u, v.double(), {}),
        (buf, u, torch.zeros(7, 2)[:, 0], {}),
        (buf.to("meta"), u, v, {}),
        (buf, u, v, dict(n_power_iterations=0)),
        (buf, u, v, dict(eps=0.0)),
        (buf, u, v, dict(n_power_iterations=1.5)),
    ]
    for b, uu, vv, kw in bad:
        with pytest.raises(ValueError):
            spectral_norm_(b, table, uu, vv, **kw)
    other = SpectralNormTable.from_shapes([(3, 5), (4, 3)], DEV)  # table mismatch: v has 7, needs 8
    with pytest.raises(ValueError, match="v must have shape"):
        spectral_norm_(buf, other, u, v)
    assert table.sigma.isnan().all()  # nothing launched


@pytest.mark.gpu
@pytest.mark.parametrize("n_iter", [1, 2, 5])
def test_gpu_seed_scale_matches_reference(n_iter):
    table, buf, u, v = setup(SEED_SHAPES, device="cuda", seed=5)
    assert table.n_slabs == 72
    ref = reference(table, buf, u, v, n_iter)
    spectral_norm_(buf, table, u, v, n_power_iterations=n_iter)
    assert_matches(table, buf, u, v, ref, rtol=5e-5, atol=5e-6)
    assert_clean(table, buf)


@pytest.mark.gpu
def test_gpu_stress_deterministic_and_graph_capturable():
    """Races would show as run-to-run differences: the kernel's reductions have a fixed order, so 300 calls from
    the same start must agree bitwise, eagerly and replayed from a CUDA graph, and track the float64 reference."""
    results = []
    for mode in ("eager", "graph"):
        table, buf, u, v = setup(SEED_SHAPES, device="cuda", seed=6)
        ref_buf, ref_u, ref_v = buf.double(), u.double(), v.double()
        if mode == "graph":
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up (compiles) on a copy, outside the capture
                spectral_norm_(buf.clone(), table, u.clone(), v.clone(), n_power_iterations=2)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                spectral_norm_(buf, table, u, v, n_power_iterations=2)
        for _ in range(300):
            graph.replay() if mode == "graph" else spectral_norm_(buf, table, u, v, n_power_iterations=2)
        torch.cuda.synchronize()
        for _ in range(300):
            mats, us, vs = table.views(ref_buf, ref_u, ref_v)
            ws, _, nu, nv = spectral_norm_reference(mats, us, vs, 2)
            for dst, src in zip(mats + us + vs, ws + nu + nv):
                dst.copy_(src)
        torch.testing.assert_close(buf.double(), ref_buf, rtol=1e-4, atol=1e-5)
        assert_clean(table, buf)
        results.append((buf.clone(), u.clone(), v.clone(), table.sigma.clone()))
    for a, b in zip(*results):
        assert torch.equal(a, b)

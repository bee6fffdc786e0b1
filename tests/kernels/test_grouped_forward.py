"""The grouped forward (Config.grouped_forward; issue 38 lever 2, "fewer, fuller launches"): kernels/linear.py
`linear_forward_grouped`, kernels/heads.py `heads_forward_grouped` and trainer/flat_net.py `flat_forward_grouped`
against the separate launches they replace (the online forward on s, `nets=1`, and the Double-DQN forward on s',
`nets=2, ddqn=True`).

Fresh random inputs and parameters (never zeros; the target net's differ from the online net's), outputs poisoned
with NaN before each launch. The grouped kernels run the same body with the same tiles at these shapes, so on the
CPU interpreter the outputs are bit-equal; on a GPU within 1e-6 relative (the warps of a launch may differ).
"""

from __future__ import annotations

import pytest
import torch

from hotloop.kernels.heads import heads_forward, heads_forward_grouped
from hotloop.kernels.linear import linear_forward, linear_forward_grouped
from hotloop.trainer.flat_net import FlatLayout, flat_forward, flat_forward_grouped

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert not got.isnan().any() and not want.isnan().any()  # every poisoned entry was written
    if DEVICE == "cpu":
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def _nan(*shape: int) -> torch.Tensor:
    return torch.full(shape, float("nan"), device=DEVICE)


def _randn(*shape: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(DEVICE)


def _nets(gen: torch.Generator, n: int, k: int, gain_group: int, pad: int = 5) -> tuple[torch.Tensor, int]:
    """Two nets' (W, b, g) in one flat buffer, net 1 `p` floats after net 0 (and `pad` floats of other parameters
    between them, as in a layout): (buffer, p)."""
    p = n * k + n + -(-n // gain_group) + pad
    buf = torch.randn(2 * p, generator=gen)
    buf[n * k + n : n * k + n + -(-n // gain_group)] += 1.0  # gains around 1
    buf[p + n * k + n : p + n * k + n + -(-n // gain_group)] += 1.0
    return buf.to(DEVICE), p


def _views(buf: torch.Tensor, n: int, k: int, gain_group: int):
    return buf[: n * k].view(n, k), buf[n * k : n * k + n], buf[n * k + n : n * k + n + -(-n // gain_group)]


@pytest.mark.parametrize(
    "m,n,k,gain_group,relu,first,with_t",
    [
        (45, 24, 17, 24, True, True, True),  # the first layer: both inputs gathered from replay-like storage
        (70, 40, 33, 8, True, False, True),  # a hidden layer: one input per net on s'
        (37, 30, 20, 10, False, False, False),  # no ReLU, no y^T
        (300, 48, 24, 16, True, True, False),  # several row tiles
    ],
)
def test_grouped_layer_equals_the_online_and_double_dqn_launches(m, n, k, gain_group, relu, first, with_t):
    gen = torch.Generator().manual_seed(m * n + k)
    buf, p = _nets(gen, n, k, gain_group)
    w, b, g = _views(buf, n, k, gain_group)
    if first:  # replay storage: rows picked by index, R > M
        r = m + 13
        x, x_next = _randn(r, k, gen=gen), _randn(r, k, gen=gen)
        rows = torch.randperm(r, generator=gen)[:m].to(DEVICE)
        x_online, x_ddqn, x_zstride = x, x_next, 0
    else:  # the previous layer's outputs: (M, K) for the online net on s, (2, M, K) on s'
        x, x_next, rows = _randn(m, k, gen=gen), _randn(2, m, k, gen=gen), None
        x_online, x_ddqn, x_zstride = x, x_next.view(2 * m, k), m * k
    y, yt, y_next = _nan(m, n), _nan(2, n, m) if with_t else None, _nan(2, m, n)
    linear_forward(x_online, w, b, g, y, gain_group, relu, rows=rows, yt=yt)
    linear_forward(
        x_ddqn, w, b, g, y_next, gain_group, relu, rows=rows, nets=2, p_zstride=p, x_zstride=x_zstride, ddqn=True
    )
    gy, gyt, gy_next = _nan(m, n), _nan(2, n, m) if with_t else None, _nan(2, m, n)
    out = linear_forward_grouped(x, x_next, w, b, g, gy, gy_next, gain_group, relu, p_zstride=p, rows=rows, yt=gyt)
    assert out[0] is gy and out[1] is gy_next
    _same(gy, y)
    _same(gy_next, y_next)
    if with_t:
        _same(gyt, yt)
    assert not torch.equal(gy_next[0], gy_next[1])  # the target net read its own parameters


@pytest.mark.parametrize("m,branches,actions,hidden", [(50, 3, 4, 20), (140, 1, 2, 32)])
def test_grouped_heads_equal_the_online_and_double_dqn_launches(m, branches, actions, hidden):
    gen = torch.Generator().manual_seed(m + hidden)
    j = 1 + branches * actions
    p = j * hidden + j + 1 + branches + 3
    buf = torch.randn(2 * p, generator=gen).to(DEVICE)

    def views(b):
        return b[: j * hidden].view(j, hidden), b[j * hidden : j * hidden + j], b[j * hidden + j : p - 3]

    w, b, g = views(buf)
    width = (1 + branches) * hidden
    h, h_next = torch.relu(_randn(m, width, gen=gen)), torch.relu(_randn(2, m, width, gen=gen))
    q, q_next = _nan(m, branches * actions), _nan(2, m, branches * actions)
    heads_forward(h, w, b, g, q, branches)
    heads_forward(h_next, w, b, g, q_next, branches, nets=2, p_zstride=p, ddqn=True)
    gq, gq_next = _nan(m, branches * actions), _nan(2, m, branches * actions)
    out = heads_forward_grouped(h, h_next, w, b, g, gq, gq_next, branches, p_zstride=p)
    assert out[0] is gq and out[1] is gq_next
    _same(gq, q)
    _same(gq_next, q_next)


def test_grouped_flat_forward_equals_the_two_flat_forwards():
    """The whole net (two trunk layers, the stacked hidden layer, the heads) from replay-like storage, with the
    TF32-rounded weight copy and the transposed activations, as the learner step calls it."""
    gen = torch.Generator().manual_seed(11)
    lay = FlatLayout(12, (3, 3), (24, 16), 16)
    nets = torch.stack([lay.init_params(gen), lay.init_params(gen)]).to(DEVICE)
    for row in nets:  # fresh gains, not the initial 1s
        for _, _, g in [s.views(row) for s in lay.layers] + [lay.out_views(row)]:
            g.copy_(torch.rand(g.shape, generator=gen).to(DEVICE) + 0.5)
    r, m, d, a = 90, 37, lay.branches, lay.actions
    obs, next_obs = _randn(r, 12, gen=gen), _randn(r, 12, gen=gen)
    rows = torch.randperm(r, generator=gen)[:m].to(DEVICE)
    w_buf = nets.clone()  # stands in for the rounded copy: the kernels read their weights from it

    def outputs():
        acts = [_nan(m, s.rows) for s in lay.layers]
        acts_t = [_nan(2, s.rows, m) for s in lay.layers[:-1]] + [None]
        return acts, acts_t, [_nan(2, m, s.rows) for s in lay.layers], _nan(m, d * a), _nan(2, m, d * a)

    acts, acts_t, ddqn_acts, q, q_next = outputs()
    flat_forward(lay, nets[0], obs, acts, q, rows=rows, acts_t=acts_t, w_buf=w_buf[0])
    flat_forward(lay, nets[0], next_obs, ddqn_acts, q_next, rows=rows, nets=2, w_buf=w_buf[0])
    g_acts, g_acts_t, g_ddqn_acts, g_q, g_q_next = outputs()
    flat_forward_grouped(
        lay, nets[0], obs, next_obs, g_acts, g_ddqn_acts, g_q, g_q_next, rows=rows, acts_t=g_acts_t, w_buf=w_buf[0]
    )
    for got, want in zip(
        g_acts + g_acts_t[:-1] + g_ddqn_acts + [g_q, g_q_next], acts + acts_t[:-1] + ddqn_acts + [q, q_next]
    ):
        _same(got, want)
    assert g_acts_t[-1] is None


def test_grouped_launchers_reject_bad_inputs_before_any_launch():
    gen = torch.Generator().manual_seed(3)
    m, n, k = 6, 8, 16
    buf, p = _nets(gen, n, k, n)
    w, b, g = _views(buf, n, k, n)
    x, x_next = _randn(m, k, gen=gen), _randn(m, k, gen=gen)
    y, y_next, yt = _nan(m, n), _nan(2, m, n), _nan(2, n, m)

    def call(**kw):
        args = dict(x=x, x_next=x_next, w=w, b=b, g=g, y=y, y_next=y_next, gain_group=n, relu=True)
        opts = dict(p_zstride=p, rows=None, yt=yt)
        for key, v in kw.items():
            (args if key in args else opts)[key] = v
        linear_forward_grouped(*args.values(), **opts)

    bad = [
        (dict(x=_randn(m, k + 1, gen=gen)), "x must be"),
        (dict(x_next=_randn(m, k - 1, gen=gen)), "x_next must be"),
        (dict(x_next=_randn(3, m, k, gen=gen)), "x_next must be"),
        (dict(x_next=x_next.double()), "x_next must have dtype"),
        (dict(b=b[:-1]), "b must have shape"),
        (dict(gain_group=0), "gain_group must be"),
        (dict(g=torch.ones(2, device=DEVICE)), "g must have shape"),
        (dict(y=_nan(m, n + 1)), "y must be"),
        (dict(y_next=_nan(m, n)), "y_next must have shape"),
        (dict(y_next=_nan(2, m, n)[:, :, :4]), "y_next must have shape"),
        (dict(rows=torch.arange(m, device=DEVICE, dtype=torch.int32)), "rows must have dtype"),
        (dict(yt=_nan(2, m, n)), "yt must have shape"),
        (dict(p_zstride=-1), "p_zstride must be"),
        (dict(p_zstride=True), "p_zstride must be"),
        (dict(x=_randn(m - 1, k, gen=gen)), "y needs"),
    ]
    for kw, match in bad:
        with pytest.raises(ValueError, match=match):
            call(**kw)
    assert y.isnan().all() and y_next.isnan().all() and yt.isnan().all()  # nothing launched

    hidden, branches, actions = 4, 2, 3
    j = 1 + branches * actions
    wo, bo, go = _randn(j, hidden, gen=gen), _randn(j, gen=gen), _randn(1 + branches, gen=gen)
    h, h_next = _randn(m, 3 * hidden, gen=gen), _randn(2, m, 3 * hidden, gen=gen)
    q, q_next = _nan(m, branches * actions), _nan(2, m, branches * actions)
    heads_bad = [
        ((h[:, :-1].contiguous(), h_next, wo, bo, go, q, q_next), {}, "h must be"),
        ((h, h_next[0], wo, bo, go, q, q_next), {}, "h_next must have shape"),
        ((h, h_next, wo[:-1], bo, go, q, q_next), {}, "w_out must be"),
        ((h, h_next, wo, bo[:-1], go, q, q_next), {}, "b_out must have shape"),
        ((h, h_next, wo, bo, go[:-1], q, q_next), {}, "g_out must have shape"),
        ((h, h_next, wo, bo, go, q_next, q_next), {}, "q must have shape"),
        ((h, h_next, wo, bo, go, q, q), {}, "q_next must have shape"),
        ((h, h_next, wo, bo, go, q, q_next), {"p_zstride": -3}, "p_zstride must be"),
    ]
    for args, kw, match in heads_bad:
        with pytest.raises(ValueError, match=match):
            heads_forward_grouped(*args, branches, **{"p_zstride": 0, **kw})
    assert q.isnan().all() and q_next.isnan().all()

    lay = FlatLayout(k, (3,), (8,), hidden)
    params = lay.init_params(gen).to(DEVICE)
    acts, acts_next = [_nan(m, s.rows) for s in lay.layers], [_nan(2, m, s.rows) for s in lay.layers]
    with pytest.raises(ValueError, match="acts_next must hold one entry per layer"):
        flat_forward_grouped(lay, params, x, x_next, acts, acts_next[:1], _nan(m, 3), _nan(2, m, 3))
    with pytest.raises(ValueError, match="w_buf must have"):
        flat_forward_grouped(lay, params, x, x_next, acts, acts_next, _nan(m, 3), _nan(2, m, 3), w_buf=params[:-1])
    assert all(t.isnan().all() for t in acts + acts_next)


def test_two_net_launches_refuse_a_net_stride_past_the_buffer():
    """Net 1 reads every parameter view p_zstride floats further. A stride that would put the target net's W, b or
    g past the end of the flat buffer (a read out of bounds on the GPU) is refused, naming p_zstride, before any
    launch of the four two-net launchers; the buffer's own stride is taken."""
    gen = torch.Generator().manual_seed(5)
    m, n, k, pad = 6, 8, 16, 5
    buf, p = _nets(gen, n, k, n, pad=pad)
    w, b, g = _views(buf, n, k, n)
    x, x_next = _randn(m, k, gen=gen), _randn(2, m, k, gen=gen)
    y, y_next = _nan(m, n), _nan(2, m, n)
    past = p + pad + 1  # g's last float of net 1 one past the buffer's end
    with pytest.raises(ValueError, match=rf"p_zstride {past} puts net 1's g past the end of its storage"):
        linear_forward(x_next[0], w, b, g, y_next, n, True, nets=2, p_zstride=past, ddqn=True)
    with pytest.raises(ValueError, match=rf"p_zstride {past} puts net 1's g past the end"):
        linear_forward_grouped(x, x_next, w, b, g, y, y_next, n, True, p_zstride=past)
    assert y.isnan().all() and y_next.isnan().all()  # nothing launched
    linear_forward_grouped(x, x_next, w, b, g, y, y_next, n, True, p_zstride=past - 1)  # the last float: in bounds

    hidden, branches, actions = 4, 2, 3
    j = 1 + branches * actions
    hbuf = torch.randn(2 * (j * hidden + j + 1 + branches), generator=gen).to(DEVICE)
    hp = hbuf.numel() // 2
    wo, bo, go = hbuf[: j * hidden].view(j, hidden), hbuf[j * hidden : j * hidden + j], hbuf[j * hidden + j : hp]
    h, h_next = _randn(m, 3 * hidden, gen=gen), _randn(2, m, 3 * hidden, gen=gen)
    q, q_next = _nan(m, branches * actions), _nan(2, m, branches * actions)
    with pytest.raises(ValueError, match=rf"p_zstride {hp + 1} puts net 1's g_out past the end"):
        heads_forward(h_next, wo, bo, go, q_next, branches, nets=2, p_zstride=hp + 1, ddqn=True)
    with pytest.raises(ValueError, match=rf"p_zstride {hp + 1} puts net 1's g_out past the end"):
        heads_forward_grouped(h, h_next, wo, bo, go, q, q_next, branches, p_zstride=hp + 1)
    assert q.isnan().all() and q_next.isnan().all()
    heads_forward_grouped(h, h_next, wo, bo, go, q, q_next, branches, p_zstride=hp)
    assert not q_next.isnan().any()

"""The branching dueling Q-network with every parameter a view of one flat fp32 buffer (hotloop's network).

Same architecture as trainer/network.py's BranchingDuelingQNet (shared ReLU trunk, value head and one advantage
branch per action dimension, each with one hidden layer; Wang et al. 2016, Tavakoli et al. 2018), with spectral
norm in projection form (Miyato et al. 2018: each weight matrix is kept at sigma = 1 by the fused in-place kernel
after every optimizer step) and a learned scalar gain per matrix (sigma-reparam, Zhai et al. 2023).

Layout of the buffer (`FlatLayout`, P floats): per trunk layer i its W_i (t_i, t_{i-1}), b_i, g_i (1,); then the
value head's and every branch's hidden layer stacked as ONE layer W_h ((1 + D) H, t_last) (rows [0, H) value,
[(1 + d) H, (2 + d) H) branch d), b_h, g_h (1 + D,); then the output layer W_out (1 + D A, H) (row 0 value, rows
1 + d A .. branch d), b_out, g_out (1 + D,). The 10 weight matrices of the seed-scale net (2 trunk, 4 hidden,
4 output) are the spectral-norm table's entries; stacking the hidden layers makes one GEMM of them.
All branches must have the same size A (the fused TD loss works on (B, D, A)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hotloop.kernels.heads import heads_forward, heads_forward_grouped, heads_reference
from hotloop.kernels.linear import linear_forward, linear_forward_grouped, linear_reference
from hotloop.kernels.tf32_split import tf32_round_copy


@dataclass(frozen=True)
class LayerSlots:
    """One linear layer's place in the flat buffer: weight (rows, cols) at w_offset, bias at b_offset, gains
    (rows // gain_group of them) at g_offset; relu: whether a ReLU follows."""

    w_offset: int
    rows: int
    cols: int
    b_offset: int
    g_offset: int
    gain_group: int
    relu: bool

    def views(self, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(W (rows, cols), b (rows,), g (groups,)) views of the 1-D buffer `buf` (parameters or gradients)."""
        n = self.rows * self.cols
        groups = self.rows // self.gain_group
        return (
            buf[self.w_offset : self.w_offset + n].view(self.rows, self.cols),
            buf[self.b_offset : self.b_offset + self.rows],
            buf[self.g_offset : self.g_offset + groups],
        )


class FlatLayout:
    """Offsets of every parameter of the network in one flat buffer.

    Args: obs_dim; action_nvec (D equal branch sizes A); trunk_hidden widths; head_hidden H.
    Attributes: layers (trunk layers, then the stacked hidden layer; `LayerSlots`), out (the output layer's
    offsets; its 1 + D gains are read with `out_views`, not `LayerSlots.views`), numel (P), branches (D),
    actions (A), head_hidden (H), obs_dim.
    Raises ValueError for empty/non-positive sizes or unequal branch sizes.
    """

    def __init__(self, obs_dim: int, action_nvec: tuple[int, ...], trunk_hidden: tuple[int, ...], head_hidden: int):
        if (
            obs_dim < 1
            or not trunk_hidden
            or min(trunk_hidden) < 1
            or head_hidden < 1
            or not action_nvec
            or min(action_nvec) < 1
        ):
            raise ValueError(
                f"FlatLayout: bad sizes obs_dim={obs_dim}, action_nvec={action_nvec}, "
                f"trunk_hidden={trunk_hidden}, head_hidden={head_hidden}"
            )
        if len(set(action_nvec)) != 1:
            raise ValueError(f"FlatLayout: every action branch must have the same size, got {action_nvec}")
        self.obs_dim, self.branches, self.actions = obs_dim, len(action_nvec), action_nvec[0]
        self.head_hidden = head_hidden
        pos = 0

        def slot(rows: int, cols: int, gain_group: int, relu: bool) -> LayerSlots:
            nonlocal pos
            w, b, g = pos, pos + rows * cols, pos + rows * cols + rows
            pos = g + rows // gain_group
            return LayerSlots(w, rows, cols, b, g, gain_group, relu)

        widths = (obs_dim, *trunk_hidden)
        self.layers = [slot(o, i, o, True) for i, o in zip(widths, widths[1:])]
        d = self.branches
        self.layers.append(slot((1 + d) * head_hidden, widths[-1], head_hidden, True))
        out_rows = 1 + d * self.actions
        w, b = pos, pos + out_rows * head_hidden
        self.out = LayerSlots(w, out_rows, head_hidden, b, b + out_rows, 1, False)
        self.numel = b + out_rows + 1 + d

    def out_views(self, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(W_out (1 + D A, H), b_out (1 + D A,), g_out (1 + D,)) views of `buf`."""
        o = self.out
        return (
            buf[o.w_offset : o.b_offset].view(o.rows, o.cols),
            buf[o.b_offset : o.g_offset],
            buf[o.g_offset : o.g_offset + 1 + self.branches],
        )

    def sn_matrices(self) -> tuple[list[tuple[int, int]], list[int]]:
        """(shapes, offsets) of every weight matrix for `hotloop.kernels.spectral_norm.SpectralNormTable`: the trunk
        matrices, each (H, t_last) block of the stacked hidden layer, the value row (1, H) and each branch's (A, H)
        output block."""
        shapes, offsets = [], []
        for lay in self.layers[:-1]:
            shapes.append((lay.rows, lay.cols))
            offsets.append(lay.w_offset)
        hid, h = self.layers[-1], self.head_hidden
        for blk in range(1 + self.branches):
            shapes.append((h, hid.cols))
            offsets.append(hid.w_offset + blk * h * hid.cols)
        shapes.append((1, h))
        offsets.append(self.out.w_offset)
        for d in range(self.branches):
            shapes.append((self.actions, h))
            offsets.append(self.out.w_offset + (1 + d * self.actions) * h)
        return shapes, offsets

    def init_params(self, generator: torch.Generator) -> torch.Tensor:
        """A fresh (P,) float32 CPU buffer: weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)) as nn.Linear's
        default (kaiming_uniform with a = sqrt(5) gives the same bound for weights), gains 1."""
        buf = torch.empty(self.numel)
        for w, b, g in [lay.views(buf) for lay in self.layers] + [self.out_views(buf)]:
            bound = w.shape[1] ** -0.5
            w.uniform_(-bound, bound, generator=generator)
            b.uniform_(-bound, bound, generator=generator)
            g.fill_(1.0)
        return buf


def forward_reference(layout: FlatLayout, buf: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
    """Plain-torch Q (B, D, A) of the net whose parameters are `buf` (1-D, any float dtype; autograd flows into
    it), for obs (B, obs_dim) of the same dtype."""
    h = obs
    for lay in layout.layers:
        w, b, g = lay.views(buf)
        h = linear_reference(h, w, b, g, lay.gain_group, lay.relu)
    w_out, b_out, g_out = layout.out_views(buf)
    return heads_reference(h, w_out, b_out, g_out, layout.branches)


def flat_forward(
    layout: FlatLayout,
    buf: torch.Tensor,
    x: torch.Tensor,
    acts: list[torch.Tensor],
    q: torch.Tensor,
    *,
    rows: torch.Tensor | None = None,
    nets: int = 1,
    linear=linear_forward,
    acts_t: list[torch.Tensor | None] | None = None,
    w_buf: torch.Tensor | None = None,
) -> torch.Tensor:
    """Forward of `nets` networks (1, or 2: online and target in one launch per layer, the Double-DQN forward)
    whose net-0 parameters are the 1-D float32 buffer `buf` (net 1's are `layout.numel` floats further), with the
    fused kernels. x: (R, obs_dim) float32 input rows (with `rows` (M,) int64, row m is x[rows[m]], e.g. replay
    storage); acts: one (M, width) or (nets, M, width) float32 output per layer of `layout.layers` (kept: the
    backward reads them); q: (M, D * A) or (nets, M, D * A), returned. `linear`: the layer launcher
    (hotloop.kernels.linear.linear_forward or a drop-in of the same signature). acts_t: optional, per layer None or a
    (2, width, M) float32 output for the activations transposed and split into TF32 parts (nets = 1; the
    backward's weight-gradient GEMMs read them). w_buf: optional 1-D float32 copy of buf (and of net 1's
    parameters after it) with every weight rounded to TF32 (`tf32_round_copy`): the kernels read their weights
    from it and round none; without it they round the weight tiles themselves (slower: kernels/linear.py).
    Every layer stores its activations rounded to TF32 (`out_tf32`), which the next layer and the heads read as
    they are; the first layer rounds its input. Raises ValueError from the launchers, and for a w_buf of another
    shape than buf."""
    if w_buf is not None and w_buf.shape != buf.shape:
        raise ValueError(f"w_buf must have buf's shape {tuple(buf.shape)}, got {tuple(w_buf.shape)}")
    p, x_zstride = layout.numel, 0
    wsrc = buf if w_buf is None else w_buf
    for i, (slots, y) in enumerate(zip(layout.layers, acts)):
        _, b, g = slots.views(buf)
        linear(
            x,
            slots.views(wsrc)[0],
            b,
            g,
            y,
            slots.gain_group,
            slots.relu,
            rows=rows,
            nets=nets,
            p_zstride=p,
            x_zstride=x_zstride,
            ddqn=nets == 2,
            yt=acts_t[i] if acts_t is not None else None,
            x_tf32=i > 0,
            w_tf32=w_buf is not None,
            out_tf32=True,
        )
        x, rows, x_zstride = y.view(-1, slots.rows), None, y.shape[-2] * slots.rows
    _, b_out, g_out = layout.out_views(buf)
    return heads_forward(
        acts[-1],
        layout.out_views(wsrc)[0],
        b_out,
        g_out,
        q,
        layout.branches,
        nets=nets,
        p_zstride=p,
        ddqn=nets == 2,
        x_tf32=True,
        w_tf32=w_buf is not None,
    )


def flat_forward_grouped(
    layout: FlatLayout,
    buf: torch.Tensor,
    obs: torch.Tensor,
    next_obs: torch.Tensor,
    acts: list[torch.Tensor],
    acts_next: list[torch.Tensor],
    q: torch.Tensor,
    q_next: torch.Tensor,
    *,
    rows: torch.Tensor | None = None,
    acts_t: list[torch.Tensor | None] | None = None,
    w_buf: torch.Tensor | None = None,
    linear=linear_forward_grouped,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The three forwards of a learner step, ONE launch per layer and one for the heads (grid z = 3: the online
    net on obs, the online and the target net on next_obs), the outputs as `flat_forward` writes them with nets = 1
    on obs and nets = 2 on next_obs. Source: issue 38, lever 2 ("fewer, fuller launches"); Config.grouped_forward.

    buf: the 1-D float32 buffer of net 0's parameters (net 1's `layout.numel` floats further); obs, next_obs:
    (R, obs_dim) float32 input rows (with `rows` (M,) int64, row m is obs[rows[m]] / next_obs[rows[m]], e.g.
    replay storage); acts: one (M, width) float32 output per layer of `layout.layers` (the online net on obs),
    acts_next: one (2, M, width) per layer ([0] online, [1] target on next_obs); q: (M, D * A) and q_next:
    (2, M, D * A), returned as (q, q_next). acts_t, w_buf: as `flat_forward`'s (acts_t for the online net on obs).
    `linear`: the layer launcher (hotloop.kernels.linear.linear_forward_grouped or a drop-in of its signature).
    All on buf's device. Raises ValueError from the launchers (each checks its inputs before it launches), for
    per-layer lists of another length than layout.layers, and for a w_buf of another shape than buf."""
    if w_buf is not None and w_buf.shape != buf.shape:
        raise ValueError(f"w_buf must have buf's shape {tuple(buf.shape)}, got {tuple(w_buf.shape)}")
    n = len(layout.layers)
    for name, lst in (("acts", acts), ("acts_next", acts_next), ("acts_t", acts_t)):
        if lst is not None and len(lst) != n:
            raise ValueError(f"{name} must hold one entry per layer ({n}), got {len(lst)}")
    p = layout.numel
    wsrc = buf if w_buf is None else w_buf
    x, x_next = obs, next_obs
    for i, (slots, y, y_next) in enumerate(zip(layout.layers, acts, acts_next)):
        _, b, g = slots.views(buf)
        linear(
            x,
            x_next,
            slots.views(wsrc)[0],
            b,
            g,
            y,
            y_next,
            slots.gain_group,
            slots.relu,
            p_zstride=p,
            rows=rows,
            yt=acts_t[i] if acts_t is not None else None,
            x_tf32=i > 0,
            w_tf32=w_buf is not None,
            out_tf32=True,
        )
        x, x_next, rows = y, y_next, None
    _, b_out, g_out = layout.out_views(buf)
    return heads_forward_grouped(
        acts[-1],
        acts_next[-1],
        layout.out_views(wsrc)[0],
        b_out,
        g_out,
        q,
        q_next,
        layout.branches,
        p_zstride=p,
        x_tf32=True,
        w_tf32=w_buf is not None,
    )


class FlatForward:
    """Forward-only evaluation of the flat net with the fused kernels (acting and evaluation), with its own
    activation buffers per batch size and its own TF32-rounded copy of the weights, made at every call (one
    `tf32_round_copy` launch: the forward kernels then read the weights as they are, kernels/linear.py says why).

    `q(buf, obs)`: buf (layout.numel,) float32 parameters, obs (N, obs_dim) float32 on buf's device -> Q (N, D, A)
    float32 (a buffer reused by the next call with the same N). `greedy(buf, obs)`: argmax per branch, (N, D)
    int64. Raises ValueError from the launchers (a buf of another size: `tf32_round_copy`).
    """

    def __init__(self, layout: FlatLayout, device: torch.device) -> None:
        self.layout, self.device = layout, device
        self._acts: dict[int, list[torch.Tensor]] = {}
        self._w = torch.empty(layout.numel, device=device)

    def _buffers(self, n: int) -> list[torch.Tensor]:
        if n not in self._acts:
            lay = self.layout
            self._acts[n] = [torch.empty(n, x.rows, device=self.device) for x in lay.layers] + [
                torch.empty(n, lay.branches * lay.actions, device=self.device)
            ]
        return self._acts[n]

    def q(self, buf: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        lay = self.layout
        bufs = self._buffers(obs.shape[0])
        q = flat_forward(lay, buf, obs.float().contiguous(), bufs[:-1], bufs[-1], w_buf=tf32_round_copy(buf, self._w))
        return q.view(obs.shape[0], lay.branches, lay.actions)

    def greedy(self, buf: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        return self.q(buf, obs).argmax(dim=2)

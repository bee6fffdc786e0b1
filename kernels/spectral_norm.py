"""Fused spectral norm (projection form) over every weight matrix stored in one flat fp32 parameter buffer.

Algorithm: spectral normalization by power iteration (Miyato et al. 2018, "Spectral Normalization for GANs"),
step for step as torch.nn.utils.parametrizations.spectral_norm (`_SpectralNorm._power_method` and `forward`):
per iteration u <- normalize(W v), then v <- normalize(W^T u); sigma = u^T W v; W <- W / sigma, where
normalize(x) = x / max(||x||_2, eps). As in torch, the incoming u is overwritten before it is read: the persistent
state that carries from one call to the next is v (u is an output kept for inspection and for torch's layout).

Design: ONE launch of `_spectral_norm_kernel` does all matrices and all iterations. Each matrix is split into row
slabs of BLOCK_R rows (T slabs over all matrices: 72 at seed scale, see `SpectralNormTable.from_shapes`). The launch has
(n_power_iterations + 1) * T programs, in n + 1 stages of T tasks:
  - power stage j (j < n), slab s of matrix m: gets v_j (stage 0: the stored v; stage j > 0: reduces the
    per-slab partials of stage j - 1, see below), computes y_s = W_s v_j for its rows, and writes the per-slab
    partials P_s = W_s^T y_s (cols floats) and ||y_s||^2 into a double-buffered scratch (index j % 2), then
    increments the counter cnt[j % 2, m] (release). Because u = y / max(||y||, eps),
    W^T u = (sum_s P_s) / max(sqrt(sum_s ||y_s||^2), eps): every consumer can rebuild v_{j+1} from the partials.
  - finalize stage (j = n), slab s of matrix m: waits for all stage n - 1 slabs of m, reduces the partials to
    z = W^T u and v = z / max(||z||, eps), sigma = u^T W v = z.v = ||z||^2 / max(||z||, eps), then writes
    u_s = y_s / max(||y||, eps) (y_s was left in u by its stage n - 1 task), scales its rows W_s <- W_s / sigma in
    place, and (slab 0 only) writes v and sigma. No single program touches more than its slab of W: no serial tail.
Cross-program dependencies without deadlock: each program first takes a ticket from an atomic counter; the ticket
(not program_id) decides its stage and slab. A task of stage j waits (spinning on a volatile load, then one acquire
atomic) only for tasks of stage j - 1, which hold smaller tickets and are therefore already running on the GPU
(a ticket is taken by a resident program), so the wait always ends whatever the dispatch order or co-residency
(the single-pass scan's dynamic tile ids, Merrill & Garland 2016). Under the Triton interpreter the programs run one
after another in program order, so tickets equal program ids and every wait is already satisfied when reached.
Writers publish with a CTA barrier followed by a release atomic; readers read shared scratch with volatile loads.
No memsets: the partials are fully overwritten by each call; the counters reset themselves inside the kernel (the
holder of the last ticket zeroes the ticket counter; the last finalize task of a matrix, found with a per-matrix
done counter, zeroes that matrix's counters once no task of the matrix can still read them). Counters count
cumulatively over the double-buffered stages, so any number of iterations runs in the same single launch:
n iterations = (n + 1) * T programs in n + 1 dependent stages, each extra iteration one more pass over W and
one more reduction of the partials (scratch stays 2 buffers whatever n).
One launch per table at a time (the counters are per table): launches on one stream, as in a captured CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hotloop.kernels._common import check_tensor
from hotloop.kernels.dependent_launch import gdc_prologue, pdl_kwargs

# Weight shapes (out_features, in_features) of trainer/network.py's BranchingDuelingQNet at seed scale:
# obs_dim 64, trunk_hidden (512, 256), head_hidden 80, action_nvec (4, 4, 4); module order trunk, value head,
# branch hidden layers, branch outputs.
SEED_SHAPES: tuple[tuple[int, int], ...] = (
    (512, 64),
    (256, 512),
    (80, 256),
    (1, 80),
    (80, 256),
    (80, 256),
    (80, 256),
    (4, 80),
    (4, 80),
    (4, 80),
)


@triton.jit
def _slab_sum(base, n_slabs, cols, offs_c, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):
    """Sum over the n_slabs partial rows (row stride cols) at columns offs_c: (BLOCK_C,) fp32, volatile loads."""
    offs_s = tl.arange(0, BLOCK_S)
    acc = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    cmask = offs_c < cols
    for s0 in range(0, n_slabs, BLOCK_S):
        s = s0 + offs_s
        acc += tl.load(
            base + s[:, None] * cols + offs_c[None, :],
            mask=(s[:, None] < n_slabs) & cmask[None, :],
            other=0.0,
            volatile=True,
        )
    return tl.sum(acc, axis=0)


@triton.jit
def _spectral_norm_kernel(
    w_ptr,
    u_ptr,
    v_ptr,
    sigma_ptr,
    slab_mat_ptr,
    w_off_ptr,
    rows_ptr,
    cols_ptr,
    u_off_ptr,
    v_off_ptr,
    p_off_ptr,
    slab0_ptr,
    n_slabs_ptr,
    part_ptr,
    nrm_ptr,
    cnt_ptr,
    done_ptr,
    ticket_ptr,
    n_iter,
    n_mats,
    total_slabs,
    part_numel,
    eps,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_S: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    ticket = tl.atomic_add(ticket_ptr, 1)
    tl.atomic_xchg(ticket_ptr, 0, mask=ticket == (n_iter + 1) * total_slabs - 1)  # last ticket: reset for next call
    stage = ticket // total_slabs
    g = ticket - stage * total_slabs
    m = tl.load(slab_mat_ptr + g)
    w_base = w_ptr + tl.load(w_off_ptr + m)
    rows = tl.load(rows_ptr + m)
    cols = tl.load(cols_ptr + m)
    u_base = u_ptr + tl.load(u_off_ptr + m)
    v_base = v_ptr + tl.load(v_off_ptr + m)
    slab0 = tl.load(slab0_ptr + m)
    n_slabs = tl.load(n_slabs_ptr + m)
    local = g - slab0
    offs_r = local * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = offs_r < rows
    offs_c0 = tl.arange(0, BLOCK_C)
    prev_part = part_ptr + ((stage + 1) % 2) * part_numel + tl.load(p_off_ptr + m)

    # Stage j > 0: wait until all stage j-1 tasks of this matrix have published (cumulative count of the
    # double-buffered counter), then dy = max(||y||, eps) and dz = max(||z||, eps) with z = W^T y / dy = W^T u.
    dy = tl.full((), 1.0, tl.float32)
    dz = tl.full((), 1.0, tl.float32)
    nz2_sum = tl.full((), 0.0, tl.float32)
    if stage > 0:
        prev = (stage + 1) % 2
        cnt = cnt_ptr + prev * n_mats + m
        while tl.load(cnt, volatile=True) < ((stage + 1) // 2) * n_slabs:
            pass
        tl.atomic_add(cnt, 0, sem="acquire")
        offs_s0 = tl.arange(0, BLOCK_S)
        ny2 = tl.zeros([BLOCK_S], dtype=tl.float32)
        for s0 in range(0, n_slabs, BLOCK_S):
            s = s0 + offs_s0
            ny2 += tl.load(nrm_ptr + prev * total_slabs + slab0 + s, mask=s < n_slabs, other=0.0, volatile=True)
        dy = tl.maximum(tl.sqrt(tl.sum(ny2)), eps)
        nz2 = tl.zeros([BLOCK_C], dtype=tl.float32)
        for c0 in range(0, cols, BLOCK_C):
            z = _slab_sum(prev_part, n_slabs, cols, c0 + offs_c0, BLOCK_S, BLOCK_C) / dy
            nz2 += z * z
        nz2_sum = tl.sum(nz2)
        dz = tl.maximum(tl.sqrt(nz2_sum), eps)

    if stage < n_iter:
        # power stage: y = W_s v_j, partials P_s = W_s^T y and ||y_s||^2; publish with CTA barrier + release
        cur = stage % 2
        y = tl.zeros([BLOCK_R], dtype=tl.float32)
        for c0 in range(0, cols, BLOCK_C):
            offs_c = c0 + offs_c0
            cmask = offs_c < cols
            if stage > 0:
                vc = _slab_sum(prev_part, n_slabs, cols, offs_c, BLOCK_S, BLOCK_C) / dy / dz
            else:
                vc = tl.load(v_base + offs_c, mask=cmask, other=0.0)
            w = tl.load(
                w_base + offs_r[:, None] * cols + offs_c[None, :], mask=rmask[:, None] & cmask[None, :], other=0.0
            )
            y += tl.sum(w * vc[None, :], axis=1)
        # the last power stage leaves the unnormalized u (= y) in u; its finalize task divides by dy
        tl.store(u_base + offs_r, y, mask=offs_r < tl.where(stage == n_iter - 1, rows, 0))
        tl.store(nrm_ptr + cur * total_slabs + g, tl.sum(y * y))
        part = part_ptr + cur * part_numel + tl.load(p_off_ptr + m) + local * cols
        for c0 in range(0, cols, BLOCK_C):
            offs_c = c0 + offs_c0
            cmask = offs_c < cols
            w = tl.load(
                w_base + offs_r[:, None] * cols + offs_c[None, :], mask=rmask[:, None] & cmask[None, :], other=0.0
            )
            tl.store(part + offs_c, tl.sum(w * y[:, None], axis=0), mask=cmask)
        tl.debug_barrier()
        tl.atomic_add(cnt_ptr + cur * n_mats + m, 1, sem="release")
    else:
        # finalize: sigma = u^T W v = z.v = ||z||^2 / dz; u_s = y_s / dy; W_s /= sigma; slab 0 writes v, sigma
        sigma = nz2_sum / dz
        y = tl.load(u_base + offs_r, mask=rmask, other=0.0, volatile=True)
        tl.store(u_base + offs_r, y / dy, mask=rmask)
        for c0 in range(0, cols, BLOCK_C):
            offs_c = c0 + offs_c0
            ptrs = w_base + offs_r[:, None] * cols + offs_c[None, :]
            wmask = rmask[:, None] & (offs_c < cols)[None, :]
            tl.store(ptrs, tl.load(ptrs, mask=wmask, other=0.0) / sigma, mask=wmask)
        if local == 0:
            tl.store(sigma_ptr + m, sigma)
            for c0 in range(0, cols, BLOCK_C):
                offs_c = c0 + offs_c0
                vc = _slab_sum(prev_part, n_slabs, cols, offs_c, BLOCK_S, BLOCK_C) / dy / dz
                tl.store(v_base + offs_c, vc, mask=offs_c < cols)
        # the last finalize task of this matrix resets its counters: every task of the matrix is past its waits
        tl.debug_barrier()
        last = tl.atomic_add(done_ptr + m, 1) == n_slabs - 1
        tl.atomic_xchg(cnt_ptr + m, 0, mask=last)
        tl.atomic_xchg(cnt_ptr + n_mats + m, 0, mask=last)
        tl.atomic_xchg(done_ptr + m, 0, mask=last)


@dataclass(frozen=True, eq=False)
class SpectralNormTable:
    """Where each weight matrix lives in the flat parameter buffer, plus the kernel's persistent scratch.

    Device tensors (on `device`): per matrix (M,) int64 `w_offsets`, `rows`, `cols`, `u_offsets`, `v_offsets`,
    `part_offsets`, `slab_start`, `slab_count`; per slab (T,) int32 `slab_matrix`; outputs `sigma` (M,) fp32;
    scratch `partials` (2 * part_numel,) fp32, `slab_norms` (2 * T,) fp32 (fully overwritten each call) and int32
    counters `counters` (2 * M,), `done` (M,), `ticket` (1,), zeroed once here and reset by the kernel itself.
    Host values: `shapes`, `offsets` (python tuples), `total_rows` / `total_cols` (lengths of the concatenated u / v),
    `required_numel` (params_buf must hold at least this many floats), tile sizes `block_rows`, `block_cols`,
    `block_slabs`.
    """

    shapes: tuple[tuple[int, int], ...]
    offsets: tuple[int, ...]
    device: torch.device
    total_rows: int
    total_cols: int
    required_numel: int
    n_slabs: int
    part_numel: int
    block_rows: int
    block_cols: int
    block_slabs: int
    w_offsets: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    u_offsets: torch.Tensor
    v_offsets: torch.Tensor
    part_offsets: torch.Tensor
    slab_start: torch.Tensor
    slab_count: torch.Tensor
    slab_matrix: torch.Tensor
    sigma: torch.Tensor
    partials: torch.Tensor
    slab_norms: torch.Tensor
    counters: torch.Tensor
    done: torch.Tensor
    ticket: torch.Tensor

    @classmethod
    def from_shapes(cls, shapes, device, offsets=None, min_slabs: int = 66, tile: int = 8192) -> "SpectralNormTable":
        """Build the table for matrices of `shapes` [(rows, cols), ...] (row-major, torch Linear weight layout)
        starting at element `offsets` of params_buf (default: packed back to back from 0), on `device`.

        BLOCK_R (rows per slab) is the largest power of two <= 64 giving at least `min_slabs` slabs in all (or 1);
        `tile` (a power of two >= 16) bounds the register tiles BLOCK_R x BLOCK_C and BLOCK_S x BLOCK_C (elements).
        The defaults are the fastest of the H200 sweep at the seed-scale shapes (results/h200/
        spectral_norm_sweep.csv, one power iteration, isolated): 72 slabs of 16 rows, 11.8 us, against 16.2 us
        with 140 slabs of 8 rows (one program per SM in each stage), 21.5-30.9 with 276 and 27-37 with 24 (likely
        because every finalize task reduces all of its matrix's per-slab partials: more slabs, more of that
        work; fewer, less spread). Both stages of one iteration are 144 programs, one launch.
        Raises ValueError for an empty list, non-positive sizes, negative or overlapping offsets, a length
        mismatch between shapes and offsets, min_slabs < 1 or a bad tile.
        """
        if min_slabs < 1 or tile < 16 or tile & (tile - 1):
            raise ValueError(
                f"SpectralNormTable: need min_slabs >= 1 and tile a power of two >= 16, got "
                f"min_slabs={min_slabs}, tile={tile}"
            )
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        shapes = tuple((int(r), int(c)) for r, c in shapes)
        if not shapes or any(r < 1 or c < 1 for r, c in shapes):
            raise ValueError(
                f"SpectralNormTable: shapes must be a non-empty list of positive (rows, cols), got {shapes}"
            )
        sizes = [r * c for r, c in shapes]
        if offsets is None:
            offsets = tuple(sum(sizes[:i]) for i in range(len(sizes)))
        offsets = tuple(int(o) for o in offsets)
        if len(offsets) != len(shapes) or min(offsets) < 0:
            raise ValueError(f"SpectralNormTable: need {len(shapes)} non-negative offsets, got {offsets}")
        spans = sorted(zip(offsets, sizes))
        if any(a + n > b for (a, n), (b, _) in zip(spans, spans[1:])):
            raise ValueError(f"SpectralNormTable: matrices overlap in params_buf: offsets {offsets}, sizes {sizes}")
        block_rows = 64
        while block_rows > 1 and sum(-(-r // block_rows) for r, _ in shapes) < min_slabs:
            block_rows //= 2
        counts = [-(-r // block_rows) for r, _ in shapes]
        max_cols = max(c for _, c in shapes)
        block_cols = min(triton.next_power_of_2(max_cols), max(16, tile // block_rows))
        block_slabs = max(1, min(triton.next_power_of_2(max(counts)), tile // block_cols))
        part_sizes = [n * c for n, (_, c) in zip(counts, shapes)]

        def starts(xs):
            return [sum(xs[:i]) for i in range(len(xs))]

        def i64(xs):
            return torch.tensor(xs, dtype=torch.int64, device=device)

        def zeros(n, dtype):
            return torch.zeros(n, dtype=dtype, device=device)

        m = len(shapes)
        return cls(
            shapes=shapes,
            offsets=offsets,
            device=device,
            total_rows=sum(r for r, _ in shapes),
            total_cols=sum(c for _, c in shapes),
            required_numel=max(o + n for o, n in zip(offsets, sizes)),
            n_slabs=sum(counts),
            part_numel=sum(part_sizes),
            block_rows=block_rows,
            block_cols=block_cols,
            block_slabs=block_slabs,
            w_offsets=i64(offsets),
            rows=i64([r for r, _ in shapes]),
            cols=i64([c for _, c in shapes]),
            u_offsets=i64(starts([r for r, _ in shapes])),
            v_offsets=i64(starts([c for _, c in shapes])),
            part_offsets=i64(starts(part_sizes)),
            slab_start=i64(starts(counts)),
            slab_count=i64(counts),
            slab_matrix=torch.tensor(
                [i for i, n in enumerate(counts) for _ in range(n)], dtype=torch.int32, device=device
            ),
            sigma=zeros(m, torch.float32),
            partials=zeros(2 * sum(part_sizes), torch.float32),
            slab_norms=zeros(2 * sum(counts), torch.float32),
            counters=zeros(2 * m, torch.int32),
            done=zeros(m, torch.int32),
            ticket=zeros(1, torch.int32),
        )

    def views(self, params_buf: torch.Tensor, u: torch.Tensor, v: torch.Tensor):
        """Split into per-matrix views: ([W_i (rows_i, cols_i)], [u_i (rows_i,)], [v_i (cols_i,)]) sharing storage
        with params_buf (1-D), u (total_rows,) and v (total_cols,)."""
        mats = [params_buf[o : o + r * c].view(r, c) for (r, c), o in zip(self.shapes, self.offsets)]
        return mats, list(u.split([r for r, _ in self.shapes])), list(v.split([c for _, c in self.shapes]))

    def new_vectors(self, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh u (total_rows,) and v (total_cols,) fp32 on the table's device, each matrix's piece drawn from
        N(0, 1) and normalized (as torch's `_SpectralNorm.__init__` does before its warm-up iterations)."""
        u = torch.randn(self.total_rows, generator=generator).to(self.device)
        v = torch.randn(self.total_cols, generator=generator).to(self.device)
        for x in u.split([r for r, _ in self.shapes]) + v.split([c for _, c in self.shapes]):
            x.div_(x.norm().clamp_min(1e-12))
        return u, v


def spectral_norm_(
    params_buf: torch.Tensor,
    table: SpectralNormTable,
    u: torch.Tensor,
    v: torch.Tensor,
    n_power_iterations: int = 1,
    eps: float = 1e-12,
) -> torch.Tensor:
    """Spectral-normalize every matrix of `table` in place in `params_buf`; one kernel launch.

    params_buf: 1-D fp32 (>= table.required_numel), u: (table.total_rows,) fp32, v: (table.total_cols,) fp32, all
    contiguous on the table's device. Per matrix, runs `n_power_iterations` steps of torch's power method from the
    stored v (u <- normalize(W v); v <- normalize(W^T u)), writes u and v in place, sigma = u^T W v into
    table.sigma, and W <- W / sigma. Returns table.sigma ((M,) fp32, overwritten by the next call).
    Launch: one grid of (n_power_iterations + 1) * table.n_slabs programs (see the module docstring); no host sync.
    Raises ValueError for a wrong dtype/shape/device/contiguity, a params_buf shorter than the table needs,
    n_power_iterations < 1 or eps <= 0.
    """
    dev = table.device
    check_tensor("params_buf", params_buf, dtype=torch.float32, ndim=1, device=dev)
    check_tensor("u", u, dtype=torch.float32, shape=(table.total_rows,), device=dev)
    check_tensor("v", v, dtype=torch.float32, shape=(table.total_cols,), device=dev)
    for name, t in (("params_buf", params_buf), ("u", u), ("v", v)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device}, the table on {dev}")
    if params_buf.numel() < table.required_numel:
        raise ValueError(f"params_buf has {params_buf.numel()} elements, table needs {table.required_numel}")
    if int(n_power_iterations) != n_power_iterations or n_power_iterations < 1:
        raise ValueError(f"n_power_iterations must be an int >= 1, got {n_power_iterations}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    n_iter = int(n_power_iterations)
    grid = ((n_iter + 1) * table.n_slabs,)
    _spectral_norm_kernel[grid](
        params_buf,
        u,
        v,
        table.sigma,
        table.slab_matrix,
        table.w_offsets,
        table.rows,
        table.cols,
        table.u_offsets,
        table.v_offsets,
        table.part_offsets,
        table.slab_start,
        table.slab_count,
        table.partials,
        table.slab_norms,
        table.counters,
        table.done,
        table.ticket,
        n_iter,
        len(table.shapes),
        table.n_slabs,
        table.part_numel,
        float(eps),
        BLOCK_R=table.block_rows,
        BLOCK_C=table.block_cols,
        BLOCK_S=table.block_slabs,
        **pdl_kwargs(),
    )
    return table.sigma


def spectral_norm_reference(mats, u, v, n_power_iterations: int = 1, eps: float = 1e-12):
    """Plain-torch spectral norm of each matrix, op for op as torch's `_SpectralNorm._power_method` + `forward`.

    mats: list of (rows_i, cols_i) tensors; u, v: lists of (rows_i,), (cols_i,) vectors of the same dtype (pass
    float64 for a tight reference). Inputs are not modified. Returns (normalized matrices W_i / sigma_i,
    sigma (M,), new u list, new v list) in the input dtype.
    """
    out_w, sigmas, out_u, out_v = [], [], [], []
    for w, ui, vi in zip(mats, u, v):
        ui, vi = ui.clone(), vi.clone()
        for _ in range(n_power_iterations):
            ui = torch.nn.functional.normalize(torch.mv(w, vi), dim=0, eps=eps)
            vi = torch.nn.functional.normalize(torch.mv(w.H, ui), dim=0, eps=eps)
        sigma = torch.vdot(ui, torch.mv(w, vi))
        out_w.append(w / sigma)
        sigmas.append(sigma)
        out_u.append(ui)
        out_v.append(vi)
    return out_w, torch.stack(sigmas), out_u, out_v

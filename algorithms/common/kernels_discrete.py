"""Fused kernels for the discrete-action (SMAX/SMAC) networks: the GRU recurrence and the
counterfactual mixer, each one autograd Function with a hand-written backward. Same equations as
the plain paths they replace (`StackedRNNAgent`/`RNNAgent`, `StackedQMixer`/`QMixer.counterfactual`),
which stay in the code as the readable reference; `tests/test_discrete_fast.py` checks values and
every gradient against them.

Why (smax-2s3z, 128 episodes x 121 observations x 5 agents, 10 members, 1 thread): the plain
autograd GRU issues ~25 ops per time step forward and backward (split/cat pairs, per-step weight
gradients), and the counterfactual mixer materialises an [E, B*T, n, A, embed] tensor (1 GB) several
times per round under checkpointing. Every large tensor is also a fresh mmap that the kernel faults
in page by page (the allocator setting below).

  fused_gru   the recurrence in one Function: ~10 ops per step forward (tanh as 2·sigmoid(2x) − 1,
              4x cheaper on CPU), ~11 backward (tanh/sigmoid
              backward as single ops, lerp for the state update), gates saved in one buffer, the
              weight gradients as one GEMM over all steps after the loop. Each step's input
              projection is computed at its step (in cache for its gates). The gate and gradient
              buffers come from a pool kept across rounds (no page faults).
  packed_agent_unroll
              an episode batch's unroll over its real observations only (PackedSequence order, the
              episodes sorted by length; `Packing`, `packed_gru`: the same GRU kernel, whose padded
              case is fused_gru): ~63 % of the padded rows on 2s3z medium; zeros on the padding,
              which every consumer masks. `Packing.of` builds it once per batch.
  real_rows, scatter_rows
              the same idea for the mixers (CF-CQL's negative term, the target mixers): a batch's
              real indices in batch order, and zeros scattered back on the padding
  narrow_linear
              the stacked agents' Q head (A outputs) with its weight gradient as (g^T x)^T, the fast
              layout on CPU for few outputs.
  counterfactual_mix
              Q_tot(s, a_i = j, a_-i) for every agent i and action j, forward and backward in row
              blocks of ~BLOCK_BYTES, so the [rows, n, A, embed] intermediate lives in cache and is
              recomputed in backward instead of stored.
  cf_negative CF-CQL's negative term Σ_i λ_i logsumexp_j Q_tot(s, a_i = j, a_-i) with λ, the same
              blocks, the gradient computed in forward while the block is in cache (no recomputation),
              the ELU and its derivative from one exp. Where it builds, its forward runs as C
              (algorithms/common/native.py, csrc/cf_negative.c: one pass per row instead of ~12 ops
              per block); this torch form is the reference and the fallback.
  shared_input_linear
              the members' first layers on a shared input (the agents' fc1, the hypernetworks at the
              states) as chunked GEMMs, without baddbmm's E-fold copy of the expanded input.
  first_layer QMIX's first layer at the data joint action, shared by the TD term and CF-CQL, with a
              broadcast-multiply weight gradient.
  (the allocator: kernels.large_allocations_from_heap, set once per process by the runner for discrete
  tasks on CPU: serving the round's large tensors from the heap saves ~1.1 s of system time per PLCQL
  round on 2s3z)

The switch is the one in kernels.py (`use_fused`, the runner's PLCQL_KERNELS): each network reads it
when it is built (the `fused` attribute of RNNAgent, QMixer, StackedRNNAgent, StackedQMixer) and takes
its plain torch path (discrete.py, discrete_ensemble.py) when it is off. Not part of an algorithm's config, so run keys do not change.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from plcql_bench.algorithms.common import native
from plcql_bench.algorithms.common.masked import masked_softmax

BLOCK_BYTES = 1 << 21  # bytes of [rows, n, A, embed] intermediate per block (1-4 MB measured alike; 2 MB best on 2s3z)


class _Pool:
    """Large scratch buffers reused across rounds (fresh ones would be mmapped and faulted in every
    time). A buffer is handed out once and only comes back through `give`; a buffer never given back
    (a graph dropped before its backward) is simply freed by Python."""

    def __init__(self, keep: int = 8) -> None:
        self.free: list[torch.Tensor] = []
        self.keep = keep

    def take(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        need = 1
        for s in shape:
            need *= s
        fits = [i for i, b in enumerate(self.free)
                if b.numel() >= need and b.dtype == like.dtype and b.device == like.device]
        if fits:
            buf = self.free.pop(min(fits, key=lambda i: self.free[i].numel()))
        else:
            buf = torch.empty(need, dtype=like.dtype, device=like.device)
        return buf[:need].view(shape)

    def give(self, *views: torch.Tensor) -> None:
        for v in views:
            base = v._base if v._base is not None else v
            if all(base.data_ptr() != b.data_ptr() for b in self.free):
                self.free.append(base)
        if len(self.free) > self.keep:  # drop the smallest (a shape seen once)
            self.free.sort(key=torch.Tensor.numel)
            del self.free[: len(self.free) - self.keep]


POOL = _Pool()


# --------------------------------------------------------------------------------------------
# Elementwise forms that are faster on CPU (used by the GRU and by cf_negative)


LOG2E = 1.4426950408889634


def _exp_(x: torch.Tensor) -> torch.Tensor:
    """exp in place as 2^(x·log2 e): torch's CPU exp is ~2.2x slower than its exp2 plus the multiply (743 vs 335
    µs for a [327, 5, 10, 32] block of CF-CQL at 1 thread, AMD EPYC); equal up to ~1e-6 relative (the rounding
    of x·log2 e, larger for larger |x|)."""
    return x.mul_(LOG2E).exp2_()


def _tanh_(x: torch.Tensor) -> torch.Tensor:
    """tanh in place as 2·sigmoid(2x) − 1: torch's CPU tanh is ~4x slower than its sigmoid (1.0 vs 0.25 ms
    for the [10, 640, 64] gate of a stacked step, 4 passes included); equal up to rounding (~1 ulp of 1)."""
    return x.mul_(2.0).sigmoid_().mul_(2.0).sub_(1.0)


# --------------------------------------------------------------------------------------------
# GRU


def _gru_steps(x: torch.Tensor, w_ih: torch.Tensor, b_ih: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor,
               h0: torch.Tensor | None, hs: torch.Tensor, gates: torch.Tensor | None, pk: "Packing") -> None:
    """The recurrence (nn.GRU's equations, gate order r, z, n) over the rows of `pk` (step t = rows
    offsets[t] .. offsets[t] + rows[t]): x [E, P, In] -> hs [E, P, H]. Each step's input projection
    gi = x W_ih + b_ih is computed at its step, into a small buffer the step's gates read while it is in
    cache (one [E, P, 3H] projection before the loop is written to memory and read back: ~7 % slower on
    2s3z). With `gates` [E, P, 4H] it keeps, per row, r, z, the hidden projection's n part W_hn h + b_hn
    and n (in that order) for the backward pass. The hidden projection is written straight into the step's
    gate rows (no copy): its r and z parts are then overwritten by the gates. h0 [E, rows[0], H] or None
    (zeros)."""
    E, H = x.shape[0], w_hh.shape[1]
    N = pk.rows[0]
    gi_t = x.new_empty(E, N, 3 * H)
    tmp = None if gates is not None else hs.new_empty(E, N, 4 * H)
    h = h0 if h0 is not None else hs.new_zeros(E, N, H)
    native_step = native.gru_forward_step_kernel()  # the elementwise part below in one pass, or None
    for o, k in zip(pk.offsets, pk.rows):
        g = gates[:, o:o + k] if gates is not None else tmp[:, :k]
        h, gi = h[:, :k], gi_t[:, :k]  # the rows still running: a prefix of the previous step's rows
        torch.baddbmm(b_ih, x[:, o:o + k], w_ih, out=gi)  # W_ih x + b_ih: [gi_r, gi_z, gi_n]
        torch.baddbmm(b_hh, h, w_hh, out=g[..., :3 * H])  # W_hh h + b_hh: [gh_r, gh_z, gh_n]
        if native_step is not None and native_step(gi, g, h, hs[:, o:o + k]):
            h = hs[:, o:o + k]
            continue
        rz = g[..., :2 * H]
        torch.add(gi[..., :2 * H], rz, out=rz).sigmoid_()
        n = g[..., 3 * H:]
        _tanh_(torch.addcmul(gi[..., 2 * H:], rz[..., :H], g[..., 2 * H:3 * H], out=n))
        torch.lerp(n, h, rz[..., H:], out=hs[:, o:o + k])  # (1 - z)·n + z·h
        h = hs[:, o:o + k]


class _GRU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_ih, b_ih, w_hh, b_hh, h0, pk):
        E, P, _ = x.shape
        H = w_hh.shape[1]
        gates = POOL.take((E, P, 4 * H), x)
        hs = x.new_empty(E, P, H)
        _gru_steps(x, w_ih, b_ih, w_hh, b_hh, h0, hs, gates, pk)
        ctx.save_for_backward(x, w_ih, w_hh, hs, h0)
        ctx.bufs, ctx.pk = [gates], pk
        return hs

    @staticmethod
    def backward(ctx, dhs):
        if ctx.bufs is None:
            raise RuntimeError("fused_gru frees its buffers in backward: no retain_graph")
        x, w_ih, w_hh, hs, h0 = ctx.saved_tensors
        (gates,), pk = ctx.bufs, ctx.pk
        ctx.bufs = None
        E, P, H = hs.shape
        N = pk.rows[0]
        dgi = POOL.take((E, P, 3 * H), hs)  # d(W_ih x + b_ih)
        dhs = dhs.contiguous()
        dghn = POOL.take((E, P, H), hs)  # d(W_hn h + b_hn) = d n_pre · r
        wt_rz = w_hh[..., :2 * H].transpose(1, 2).contiguous()  # [E, 2H, H]
        wt_n = w_hh[..., 2 * H:].transpose(1, 2).contiguous()  # [E, H, H]
        dh, dn = hs.new_empty(E, N, H), hs.new_empty(E, N, H)
        drz = hs.new_empty(E, N, 2 * H)
        dh_rec = hs.new_zeros(E, N, H)  # gradient reaching h_t through step t+1 (zero for rows that ended)
        start = h0 if h0 is not None else hs.new_zeros(E, N, H)
        native_step = native.gru_backward_step_kernel()  # the elementwise part below in one pass, or None
        for t in range(len(pk.rows) - 1, -1, -1):
            o, k = pk.offsets[t], pk.rows[t]
            g = gates[:, o:o + k]
            r, z, ghn, n = g[..., :H], g[..., H:2 * H], g[..., 2 * H:3 * H], g[..., 3 * H:]
            h_prev = hs[:, pk.offsets[t - 1]:pk.offsets[t - 1] + k] if t > 0 else start[:, :k]
            dh_k, dn_k, drz_k, rec = dh[:, :k], dn[:, :k], drz[:, :k], dh_rec[:, :k]
            if native_step is not None and native_step(dhs[:, o:o + k], h_prev, g, rec, dgi[:, o:o + k],
                                                       dghn[:, o:o + k]):
                rec.baddbmm_(dgi[:, o:o + k, :2 * H], wt_rz).baddbmm_(dghn[:, o:o + k], wt_n)
                continue
            torch.add(dhs[:, o:o + k], rec, out=dh_k)
            torch.sub(h_prev, n, out=drz_k[..., H:]).mul_(dh_k)  # dz = dh·(h_prev − n)
            torch.mul(dh_k, z, out=rec)  # the direct path z·h_prev
            torch.sub(dh_k, rec, out=dn_k)  # dn = dh·(1 − z)
            dn_pre = dgi[:, o:o + k, 2 * H:]
            torch.ops.aten.tanh_backward.grad_input(dn_k, n, grad_input=dn_pre)
            torch.mul(dn_pre, ghn, out=drz_k[..., :H])  # dr
            drz_pre = dgi[:, o:o + k, :2 * H]
            torch.ops.aten.sigmoid_backward.grad_input(drz_k, g[..., :2 * H], grad_input=drz_pre)
            torch.mul(dn_pre, r, out=dghn[:, o:o + k])
            rec.baddbmm_(drz_pre, wt_rz).baddbmm_(dghn[:, o:o + k], wt_n)
        dx = dw_ih = db_ih = dw_hh = db_hh = dh0 = None
        if ctx.needs_input_grad[0]:
            dx = torch.bmm(dgi, w_ih.transpose(1, 2))
        if ctx.needs_input_grad[1]:
            dw_ih = torch.bmm(x.transpose(1, 2), dgi)
        db_i = dgi.sum(1, keepdim=True) if ctx.needs_input_grad[2] or ctx.needs_input_grad[4] else None
        if ctx.needs_input_grad[2]:
            db_ih = db_i
        if ctx.needs_input_grad[3]:  # steps 1..: their previous hidden states, in step order
            h_prev = (hs[:, :P - N] if pk.h_prev is None else hs.index_select(1, pk.h_prev)).transpose(1, 2)
            dw_hh = torch.cat([torch.bmm(h_prev, dgi[:, N:, :2 * H]), torch.bmm(h_prev, dghn[:, N:])], -1)
            if h0 is not None:  # step 0 starts from h0
                dw_hh += torch.cat([torch.bmm(h0.transpose(1, 2), dgi[:, :N, :2 * H]),
                                    torch.bmm(h0.transpose(1, 2), dghn[:, :N])], -1)
        if ctx.needs_input_grad[4]:
            db_hh = torch.cat([db_i[..., :2 * H], dghn.sum(1, keepdim=True)], -1)  # r, z: the same sums as b_ih's
        if ctx.needs_input_grad[5]:
            dh0 = dh_rec
        POOL.give(dgi, gates, dghn)
        return dx, dw_ih, db_ih, dw_hh, db_hh, dh0, None


def _gru(x: torch.Tensor, w_ih: torch.Tensor, b_ih: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor,
         h0: torch.Tensor | None, pk: "Packing") -> torch.Tensor:
    """E GRUs (weights stacked on a leading member axis) over the rows of `pk`: x [E, P, In] ->
    hidden states [E, P, H] (w_ih [E, In, 3H], b_ih [E, 1, 3H], w_hh [E, H, 3H], b_hh [E, 1, 3H],
    h0 [E, rows[0], H] or None: zeros)."""
    E, P, _ = x.shape
    H = w_hh.shape[1]
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, w_ih, b_ih, w_hh, b_hh, h0)):
        return _GRU.apply(x, w_ih, b_ih, w_hh, b_hh, h0, pk)
    hs = x.new_empty(E, P, H)
    _gru_steps(x, w_ih, b_ih, w_hh, b_hh, h0, hs, None, pk)
    return hs


def fused_gru(x: torch.Tensor, w_ih: torch.Tensor, b_ih: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor,
              h0: torch.Tensor | None, steps: int) -> torch.Tensor:
    """E GRUs over `steps` time steps of N rows each (the padded layout).

    x [E, L·N, In] time-major rows (step t = rows t·N .. t·N+N−1), w_ih [E, In, 3H], b_ih [E, 1, 3H],
    w_hh [E, H, 3H], b_hh [E, 1, 3H], h0 [E, N, H] or None (zeros) -> hidden states [E, L, N, H]."""
    E, LN, _ = x.shape
    return _gru(x, w_ih, b_ih, w_hh, b_hh, h0, Packing.full(steps, LN // steps)).view(E, steps, LN // steps, -1)


def packed_gru(x: torch.Tensor, w_ih: torch.Tensor, b_ih: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor,
               pk: "Packing") -> torch.Tensor:
    """E GRUs over packed rows x [E, P, In] (see `Packing`) from zero states -> hidden states [E, P, H]."""
    return _gru(x, w_ih, b_ih, w_hh, b_hh, None, pk)


# --------------------------------------------------------------------------------------------
# Packed unroll: the agents over an episode batch's real observations only


class Packing:
    """Which rows of an episode batch an unroll needs, in PackedSequence order. Episode b of length
    len_b has real observations at indices 0..len_b (index len_b is the final next observation);
    later indices are padding, whose outputs every consumer masks. With the episodes sorted by length
    (longest first, ties in batch order), the episodes still running at step t are a prefix, so step t
    is one contiguous block of `rows[t]` = (episodes with len ≥ t) x n agent rows starting at
    `offsets[t]`, and its previous hidden states are the first rows[t] rows of step t − 1's block.

    index [P]   packed row -> its row in the batch-major flat layout [B·L·n] (b, t, agent)
    h_prev [P − rows[0]]
                packed rows of steps 1.. -> the packed row of the same agent one step earlier
                (None for `Packing.full`, the padded layout, where that is row p − N)
    On smax-2s3z medium a batch of 128 episodes pads to ~109 observations but holds ~69 on average:
    the packed unroll does ~63 % of the padded one's work."""

    def __init__(self, lengths: torch.Tensor, L: int, n: int) -> None:
        lens = lengths.to("cpu", torch.int64)
        order = torch.sort(-lens, stable=True).indices
        alive = lens[order][None, :] >= torch.arange(L)[:, None]  # [L, B]: sorted episode j still running at t
        counts = alive.sum(1)  # non-increasing
        starts = torch.cumsum(counts, 0) - counts  # first (t, j) pair of each step
        self.rows = (counts * n).tolist()
        self.offsets = (starts * n).tolist()
        self.total = int(counts.sum()) * n
        t, j = alive.nonzero(as_tuple=True)  # the (step, sorted episode) pairs in packed order
        agent = torch.arange(n)
        self.index = ((order[j, None] * L + t[:, None]) * n + agent).reshape(-1).to(lengths.device)
        later = t > 0  # the same agent's row one step earlier: step t − 1's block, same j
        prev = (starts[t[later] - 1, None] + j[later, None]) * n + agent
        self.h_prev = prev.reshape(-1).to(lengths.device)

    @classmethod
    def of(cls, lengths: torch.Tensor, L: int, n: int) -> "Packing":
        """`Packing(lengths, L, n)`, built once per batch: a round unrolls the same batch with the online
        and the target agents, and building it reads `lengths` on the host (a device sync on a GPU). The
        last one is kept while its `lengths` tensor is alive (a weak reference: a new batch misses)."""
        ref, key, pk = _LAST_PACKING
        if ref is not None and ref() is lengths and key == (L, n):
            return pk
        pk = cls(lengths, L, n)
        _LAST_PACKING[:] = [weakref.ref(lengths), (L, n), pk]
        return pk

    @classmethod
    def full(cls, L: int, N: int) -> "Packing":
        """The padded layout: L steps of the same N rows (time-major rows t·N .. t·N + N − 1)."""
        pk = cls.__new__(cls)
        pk.rows, pk.offsets, pk.total = [N] * L, [t * N for t in range(L)], L * N
        pk.index = pk.h_prev = None
        return pk


_LAST_PACKING: list = [None, None, None]  # [weakref to lengths, (L, n), Packing]: see Packing.of


def packed_inputs(obs: torch.Tensor, last_onehot: torch.Tensor, pk: Packing) -> torch.Tensor:
    """The agents' inputs obs ⊕ one-hot(last action) ⊕ one-hot(agent id) at the packed rows: [P, in]
    (from obs [B, L, n, o], last_onehot [B, L, n, A])."""
    n = obs.shape[2]
    eye = torch.eye(n, device=obs.device, dtype=obs.dtype).repeat(pk.total // n, 1)
    return torch.cat([obs.reshape(-1, obs.shape[-1]).index_select(0, pk.index),
                      last_onehot.reshape(-1, last_onehot.shape[-1]).index_select(0, pk.index), eye], -1)


def real_rows(lengths: torch.Tensor, L: int, last: int = 0) -> torch.Tensor:
    """Flat indices b·L + t of an episode batch's real indices, in batch order: t ≤ len_b + last, i.e.
    observations 0..len (last = 0, L = T + 1) or transitions 0..len − 1 (last = −1, L = T). The
    mixers' fused paths compute these rows only and scatter zeros on the rest (`scatter_rows`)."""
    t = torch.arange(L, device=lengths.device)
    return (t[None] <= lengths[:, None] + last).reshape(-1).nonzero()[:, 0]


def scatter_rows(values: torch.Tensor, rows: torch.Tensor, total: int) -> torch.Tensor:
    """values [E, len(rows), ...] at `rows` of a zero tensor [E, total, ...] (`real_rows`' inverse)."""
    return values.new_zeros(values.shape[0], total, *values.shape[2:]).index_copy(1, rows, values)


def has_padding(lengths: torch.Tensor, L: int) -> bool:
    """Whether a batch of episodes of these lengths, padded to L observations, has padded indices
    (an episode of length len has real observations 0..len). Without padding the packed unroll does
    the same work as the unpacked one plus its gathers, so the unroll takes the unpacked path."""
    return bool((lengths < L - 1).any())


def packed_agent_unroll(obs: torch.Tensor, last_onehot: torch.Tensor, lengths: torch.Tensor,
                        fc1_w: torch.Tensor, fc1_b: torch.Tensor, w_ih: torch.Tensor, b_ih: torch.Tensor,
                        w_hh: torch.Tensor, b_hh: torch.Tensor, fc2_w: torch.Tensor,
                        fc2_b: torch.Tensor) -> torch.Tensor:
    """E GRU agents (fc1 -> ReLU -> GRU -> fc2, weights stacked [E, ...] as in StackedRNNAgent) over an
    episode batch from zero states, computed on the real observations only (`Packing`): outputs
    [E, B, L, n, A], zeros at the padded indices (index > the episode's length)."""
    B, L, n, _ = obs.shape
    E, A = fc1_w.shape[0], fc2_w.shape[-1]
    pk = Packing.of(lengths, L, n)
    x = packed_inputs(obs, last_onehot, pk)  # [P, in]
    x = F.relu_(shared_input_linear(x, fc1_w, fc1_b))  # [E, P, H]
    y = packed_gru(x, w_ih, b_ih, w_hh, b_hh, pk)  # [E, P, H]
    out = narrow_linear(y, fc2_w, fc2_b)  # [E, P, A]
    full = out.new_zeros(E, B * L * n, A).index_copy(1, pk.index, out)
    return full.view(E, B, L, n, A)


class _NarrowLinear(torch.autograd.Function):
    """y = x @ w + b for stacked members with few outputs (the agents' Q head: A actions): autograd's
    weight gradient x^T @ g ([E, In, R] @ [E, R, A]) runs at ~3 GFLOP/s on CPU for A = 10; computed as
    (g^T @ x)^T it is ~9x faster (smax-2s3z: 280 -> 32 ms per round). Same numbers up to summation order."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return torch.baddbmm(b, x, _column_major(w))

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx = torch.bmm(g, w.transpose(1, 2)) if need[0] else None
        dw = torch.bmm(g.transpose(1, 2), x).transpose(1, 2) if need[1] else None
        db = g.sum(1, keepdim=True) if need[2] else None
        return dx, dw, db


def _column_major(w: torch.Tensor) -> torch.Tensor:
    """w [E, In, A] with each member's matrix stored column-major (a copy of a few KB): MKL's product
    with few outputs runs ~1.6x faster with that layout (smax-2s3z's Q head: 72 -> 45 ms per unroll)."""
    return w.mT.contiguous().mT


def narrow_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x [E, R, In] @ w [E, In, A] + b [E, 1, A] (see `_NarrowLinear`)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, w, b)):
        return _NarrowLinear.apply(x, w, b)
    return torch.baddbmm(b, x, _column_major(w))


class _SharedInputLinear(torch.autograd.Function):
    """y[e] = x @ w[e] + b[e] for E members that read the same input x [R, In] (the agents' first layer,
    the mixers' hypernetworks at the states). baddbmm on x expanded over the members copies it E times
    first (440 MB per unroll on 2s3z); here it is one [rows, In] x [In, E·H] GEMM per chunk of rows, each
    chunk's result written member-major while it is in cache (2s3z's agents: ~104 -> ~86 ms per unroll at
    2 threads). The weight gradient is baddbmm's (x^T g per member)."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return _shared_input_matmul(x, w, b)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx = torch.bmm(g, w.transpose(1, 2)).sum(0) if need[0] else None
        dw = torch.bmm(x.t().expand(w.shape[0], -1, -1), g) if need[1] else None
        db = g.sum(1, keepdim=True) if need[2] else None
        return dx, dw, db


SHARED_INPUT_ROWS = 1024  # rows per GEMM of _shared_input_matmul (512-2048 measured alike on 2s3z)


def _shared_input_matmul(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    E, In, H = w.shape
    w_cat = w.transpose(0, 1).reshape(In, E * H)  # [In, E·H]: member e's columns e·H .. e·H + H − 1
    b_cat = b.reshape(1, E * H)
    out = x.new_empty(E, x.shape[0], H)
    for r0 in range(0, x.shape[0], SHARED_INPUT_ROWS):
        y = torch.addmm(b_cat, x[r0:r0 + SHARED_INPUT_ROWS], w_cat)  # [rows, E·H]
        out[:, r0:r0 + SHARED_INPUT_ROWS].copy_(y.view(-1, E, H).transpose(0, 1))
    return out


def shared_input_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x [R, In] @ w [E, In, H] + b [E, 1, H] -> [E, R, H] (baddbmm(b, x.expand(E, -1, -1), w); see
    `_SharedInputLinear`)."""
    x = x.contiguous()
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, w, b)):
        return _SharedInputLinear.apply(x, w, b)
    return _shared_input_matmul(x, w, b)


# --------------------------------------------------------------------------------------------
# QMIX's first layer at the data joint action


class _FirstLayer(torch.autograd.Function):
    """pre[r] = b1[r] + Σ_i q[r, i] · w1[r, i] for R rows of n agents: one [1, n] x [n, Em] product per row.
    Autograd's weight gradient of that bmm is an outer-product bmm per row (~2x slower than a broadcast
    multiply on CPU, 113 vs 56 ms for 153,600 rows on 2s3z)."""

    @staticmethod
    def forward(ctx, q, w1, b1):
        ctx.save_for_backward(q, w1)
        return torch.baddbmm(b1.unsqueeze(1), q.unsqueeze(1), w1).squeeze(1)

    @staticmethod
    def backward(ctx, dpre):
        q, w1 = ctx.saved_tensors
        need = ctx.needs_input_grad
        dq = torch.bmm(w1, dpre.unsqueeze(-1)).squeeze(-1) if need[0] else None
        dw1 = q.unsqueeze(-1) * dpre.unsqueeze(1) if need[1] else None
        return dq, dw1, (dpre if need[2] else None)


def first_layer(q: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor) -> torch.Tensor:
    """QMIX's first layer before the ELU, q [R, n] (one joint action's Qs per row), |W1| [R, n, Em],
    b1 [R, Em] -> [R, Em]. The fused update computes it once and shares it between Q_tot at the data
    (the TD term) and the counterfactual mixer (`pre` of counterfactual_mix / cf_negative)."""
    return _FirstLayer.apply(q.contiguous(), w1.contiguous(), b1.contiguous())


# --------------------------------------------------------------------------------------------
# Counterfactual mixer


def _block_rows(row_elems: int, elem_bytes: int) -> int:
    return max(1, BLOCK_BYTES // max(1, row_elems * elem_bytes))


def _cf_block(pre, delta, w1):
    """elu(pre + delta·w1) for one block: [rb, n, A, Em]."""
    x = torch.addcmul(pre[:, None, None, :], delta.unsqueeze(-1), w1.unsqueeze(2))
    return F.elu_(x)


class _CounterfactualMix(torch.autograd.Function):
    """out[r, i, j] = Σ_e w2[r, e] · elu(pre[r, e] + delta[r, i, j] · w1[r, i, e]). With s = elu'(x):
    d pre = w2 ⊙ Σ_ij dout·s,  d w2 = Σ_ij dout·elu(x),  d w1[r, i] = w2 ⊙ Σ_j dout·delta·s,
    d delta[r, i, j] = dout · Σ_e s·w1·w2. The sums over (i, j) are batched row-vector × matrix
    products; the short sums over j and e are a multiply and a sum (faster on CPU than a bmm)."""

    @staticmethod
    def forward(ctx, pre, delta, w1, w2):
        R, n, A = delta.shape
        Em = pre.shape[-1]
        out = delta.new_empty(R, n, A)
        rb = _block_rows(n * A * Em, delta.element_size())
        for r0 in range(0, R, rb):
            s = slice(r0, r0 + rb)
            e = _cf_block(pre[s], delta[s], w1[s])
            torch.sum(e.mul_(w2[s][:, None, None, :]), -1, out=out[s])
        ctx.save_for_backward(pre, delta, w1, w2)
        return out

    @staticmethod
    def backward(ctx, dout):
        pre, delta, w1, w2 = ctx.saved_tensors
        R, n, A = delta.shape
        Em = pre.shape[-1]
        dout = dout.contiguous()
        dpre, ddelta = torch.empty_like(pre), torch.empty_like(delta)
        dw1, dw2 = torch.empty_like(w1), torch.empty_like(w2)
        w12 = w1 * w2.unsqueeze(1)  # [R, n, Em]
        gd = dout * delta  # [R, n, A]
        rb = _block_rows(n * A * Em, delta.element_size())
        tmp_all = delta.new_empty(min(rb, R), n, A, Em)
        for r0 in range(0, R, rb):
            s = slice(r0, r0 + rb)
            e = _cf_block(pre[s], delta[s], w1[s])
            k = e.shape[0]
            go = dout[s].view(k, 1, n * A)
            torch.bmm(go, e.view(k, n * A, Em), out=dw2[s].view(k, 1, Em))
            sd = e.clamp_(max=0.0).add_(1.0)  # elu'(x) from elu(x): exp(x) below 0, 1 above
            torch.bmm(go, sd.view(k, n * A, Em), out=dpre[s].view(k, 1, Em))
            tmp = tmp_all[:k]
            torch.sum(torch.mul(sd, gd[s].unsqueeze(-1), out=tmp), 2, out=dw1[s])  # (a bmm with K = A is slower)
            torch.sum(sd.mul_(w12[s].unsqueeze(2)), -1, out=ddelta[s])
        dpre.mul_(w2)
        dw1.mul_(w2.unsqueeze(1))
        ddelta.mul_(dout)
        return dpre, ddelta, dw1, dw2


def counterfactual_mix(pre: torch.Tensor, delta: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Σ_e elu(pre_e + delta_ij · w1_ie) · w2_e for every row, agent i and action j, in cache-sized
    row blocks: pre [R, Em], delta [R, n, A], w1 [R, n, Em], w2 [R, Em] -> [R, n, A] (QMIX's second
    layer without its bias; see QMixer.counterfactual)."""
    pre, delta, w1, w2 = (t.contiguous() for t in (pre, delta, w1, w2))
    return _CounterfactualMix.apply(pre, delta, w1, w2)


# --------------------------------------------------------------------------------------------
# CF-CQL's negative term, fused with the counterfactual mixer


@torch.no_grad()
def cf_lambda(cf: torch.Tensor, avail: torch.Tensor, logbeta: torch.Tensor | None, temp: float) -> torch.Tensor:
    """CFCQL's λ over agents (CFCQLDiscrete.cf_weights' formula): cf [..., n, A], avail [..., n, A],
    logbeta = log(β + 1e-5) [..., n, A] (None: uniform 1/n) -> [..., n]."""

    n = cf.shape[-2]
    if logbeta is None or temp == 0:
        return cf.new_full(cf.shape[:-1], 1.0 / n)
    mu = masked_softmax(cf, avail).add_(1e-5)
    kl = (mu * (mu.log() - logbeta) * avail).sum(-1)
    if temp >= 100:
        return F.one_hot(kl.argmax(-1), n).to(cf.dtype)
    return torch.softmax(temp * kl, -1)


class _CFNegative(torch.autograd.Function):
    """neg[r] = Σ_i λ_i(r) · logsumexp_{j available} cf[r, i, j], cf = counterfactual_mix(...) + b2,
    λ from cf (detached, `cf_lambda`'s formula). Each row depends only on its own inputs, so the gradient
    of neg[r] for an upstream gradient of 1 is computed in forward, block by block, while the block's
    [rows, n, A, embed] activations are in cache (no recomputation), and backward scales it by each
    row's upstream gradient (as kernels._BlockedLSE). d neg / d cf = λ_i · softmax_avail(cf_i).
    The per-block softmax, logsumexp and λ share one exp pass (few ops: they run once per block)."""

    @staticmethod
    def forward(ctx, pre, delta, w1, w2, b2, avail, logbeta, temp, members):
        ctx.used = False
        done = native.cf_negative(pre, delta, w1, w2, b2, avail, logbeta, temp, members)
        if done is not None:  # the same outputs from the C form (algorithms/common/csrc/cf_negative.c)
            neg, lam, *grads = done
            ctx.save_for_backward(*grads)
            ctx.mark_non_differentiable(lam)
            return neg, lam
        R, n, A = delta.shape
        Em = pre.shape[-1]
        M = R // members
        neg, lam = delta.new_empty(R), delta.new_empty(R, n)
        dpre, ddelta = torch.empty_like(pre), torch.empty_like(delta)
        dw1, dw2, db2 = torch.empty_like(w1), torch.empty_like(w2), torch.empty_like(b2)
        rb = min(M, _block_rows(n * A * Em, delta.element_size()))
        x_all, m_all, tmp_all = (delta.new_empty(rb, n, A, Em) for _ in range(3))
        w12 = w1 * w2.unsqueeze(1)  # [R, n, Em]
        bias = (b2 - w2.sum(-1, keepdim=True)).view(R, 1, 1)  # cf = Σ_e w2·(elu + 1) + b2 − Σ_e w2
        ok = avail > 0
        any_ok = ok.any(-1)  # [M, n]: agents with an available action (all of them on real steps)
        # -inf on unavailable actions; a row with none available counts all (finite), then zeroed by any_ok
        mask_add = torch.zeros_like(avail).masked_fill_(~ok & any_ok.unsqueeze(-1), float("-inf"))
        keep = any_ok.to(delta.dtype)
        uniform = logbeta is None or temp == 0
        for e in range(members):  # blocks within a member: rows e·M + m share avail[m] and β[m]
            for m0 in range(0, M, rb):
                k = min(M, m0 + rb) - m0
                s, sm = slice(e * M + m0, e * M + m0 + k), slice(m0, m0 + k)
                x, m, tmp = x_all[:k], m_all[:k], tmp_all[:k]
                # ELU from one exp (torch's elu is ~1.7x slower than its exp; `_exp_`: faster still): with
                # x = pre_cf, m = exp(min(x, 0)) = elu'(x) and u = max(x, 0) + m = elu(x) + 1. The clamp at −87
                # keeps exp out of float32's subnormals (slow on x86; exp(−87) = 1.6e-38 stands in for less).
                torch.addcmul(pre[s][:, None, None, :], delta[s].unsqueeze(-1), w1[s].unsqueeze(2), out=x)
                _exp_(torch.clamp(x, -87.0, 0.0, out=m))
                u = x.clamp_(min=0.0).add_(m)
                cf = torch.sum(torch.mul(u, w2[s][:, None, None, :], out=tmp), -1).add_(bias[s])
                z = cf.add_(mask_add[sm])
                mx = z.amax(-1, keepdim=True)
                p = z.sub_(mx).exp_()  # cf no longer needed
                se = p.sum(-1, keepdim=True)
                p.div_(se)  # masked softmax over the available actions
                lse = se.log_().add_(mx)[..., 0]  # masked logsumexp
                kp = keep[sm]
                if uniform:
                    lam_b = kp.new_full(kp.shape, 1.0 / n)
                else:  # KL(μ || β) per agent, μ = the softmax (CFCQLDiscrete.cf_weights)
                    mu = p + 1e-5
                    kl = (mu * mu.log().sub_(logbeta[sm]) * avail[sm]).sum(-1)
                    lam_b = F.one_hot(kl.argmax(-1), n).to(kl.dtype) if temp >= 100 else torch.softmax(temp * kl, -1)
                lam[s] = lam_b
                lk = lam_b * kp
                neg[s] = (lk * lse).sum(-1)
                go = p.mul_(lk.unsqueeze(-1))  # d neg / d cf [k, n, A]
                gsum = go.sum((1, 2))
                db2[s] = gsum.view(k, 1)
                gov = go.view(k, 1, n * A)
                torch.bmm(gov, u.view(k, n * A, Em), out=dw2[s].view(k, 1, Em))
                dw2[s] -= gsum.unsqueeze(1)  # Σ go·elu = Σ go·u − Σ go
                torch.bmm(gov, m.view(k, n * A, Em), out=dpre[s].view(k, 1, Em))
                torch.sum(torch.mul(m, (go * delta[s]).unsqueeze(-1), out=tmp), 2, out=dw1[s])
                torch.sum(m.mul_(w12[s].unsqueeze(2)), -1, out=ddelta[s])
                ddelta[s].mul_(go)
        dpre.mul_(w2)
        dw1.mul_(w2.unsqueeze(1))
        ctx.save_for_backward(dpre, ddelta, dw1, dw2, db2)
        ctx.mark_non_differentiable(lam)
        return neg, lam

    @staticmethod
    def backward(ctx, gneg, glam):
        if ctx.used:
            raise RuntimeError("cf_negative scales its saved gradients in place in backward: no retain_graph")
        ctx.used = True
        dpre, ddelta, dw1, dw2, db2 = ctx.saved_tensors
        g = gneg.view(-1, 1)  # in place: these [R, ...] buffers are this call's own (no new ones)
        return (dpre.mul_(g), ddelta.mul_(g.unsqueeze(-1)), dw1.mul_(g.unsqueeze(-1)), dw2.mul_(g), db2.mul_(g),
                None, None, None, None)


def cf_negative(pre: torch.Tensor, delta: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
                avail: torch.Tensor, logbeta: torch.Tensor | None, temp: float, members: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """CF-CQL's negative term Σ_i λ_i logsumexp_j Q_tot(s, a_i = j, a_-i) per row, and λ, in one
    cache-blocked pass (see _CFNegative). Rows r = e·M + m for `members` mixers over M states:
    pre [R, Em], delta [R, n, A], w1 [R, n, Em], w2 [R, Em], b2 [R, 1] (QMIX's first layer at the data,
    the counterfactual deltas, |W1|, |W2|, b2; see QMixer.counterfactual), avail [M, n, A],
    logbeta [M, n, A] = log(β + 1e-5) or None (λ = 1/n) -> neg [R], λ [R, n] (no gradient)."""
    args = [t.contiguous() for t in (pre, delta, w1, w2, b2)]
    lb = None if logbeta is None else logbeta.contiguous()
    return _CFNegative.apply(*args, avail.contiguous(), lb, float(temp), int(members))

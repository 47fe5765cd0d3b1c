"""Fused and cache-blocked CPU kernels for the continuous critics (`EnsembleCritic` in continuous.py,
OMAR's `IndepCritics` in independent.py), behind a switch: the plain torch code in continuous.py,
cfcql.py, independent.py and omar.py states the math, these compute the same numbers (up to float
summation order) with less memory traffic. The discrete networks' kernels are in kernels_discrete.py,
behind the same switch.

    _FusedTrunk   the critic from the first layer's action part on, with a hand-written in-place backward
    _BlockedLSE   the CF-CQL penalty's critic part, forwarded and backpropagated block by block of states
                  (also OMAR's CQL logsumexp: `blocked_lse`; its search's Q values: `blocked_trunk`); on the
                  CPU in float32 each block's elementwise work runs in C where native.py can build
                  csrc/cql_block_*.c (`_native_block_loop`), else in torch ops (`_torch_block_loop`)
    _Workspace    a pool of the large activation buffers `_FusedTrunk` reuses across updates
    keep_freed_memory, large_allocations_from_heap
                  the glibc allocator settings the runner makes once per process (suite/runs/runner.py)

Switch: `use_fused(False)` (the runner: PLCQL_KERNELS=plain; `fused_kernels(False)` for a block) makes
every network built afterwards take the plain path. On by default: on CPU the fused path is the faster
one (docs/algorithms/cfcql.md "Speed", docs/algorithms/discrete-machinery.md "Fused kernels"); it is
what every committed result ran with. Not part of the run key, like the device and the thread count,
which also move the last bits. tests/test_speed_equivalence.py, tests/test_omar_fast.py and
tests/test_discrete_fast.py check every kernel against a plain-autograd reference and the plain path of
the algorithms.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Iterator

import torch

from plcql_bench.algorithms.common import native

_FUSED = True


def use_fused(on: bool) -> None:
    """Critics built after this call take the fused kernels (True) or the plain torch path (False)."""
    global _FUSED
    _FUSED = bool(on)


def fused_default() -> bool:
    return _FUSED


@contextlib.contextmanager
def fused_kernels(on: bool) -> Iterator[None]:
    """`use_fused(on)` inside the block, the previous choice restored after it: networks built inside
    take the fused (True) or plain (False) path for their lifetime (tests, `bench-speed --compare-plain`)."""
    old = _FUSED
    use_fused(on)
    try:
        yield
    finally:
        use_fused(old)


# --------------------------------------------------------------------------------------------
# The critic trunk
# --------------------------------------------------------------------------------------------


class _FusedTrunk(torch.autograd.Function):
    """The critic from the first layer's action part on, for R joint actions per state, with a
    hand-written backward that works in place on the saved activations.

        h1 = relu(a @ W1a + h_s[state of the row])      [E, B*R, H]
        h2 = relu(h1 @ W2 + b2)                          [E, B*R, H]
        q  = h2 @ w3 + b3                                [E, B*R]

    a [B*R, nA] (rows grouped by state: row b*R + r belongs to state b), h_s [E, B, H] (the state
    part of the first layer, bias included). Mathematically the same graph as autograd's; the
    differences are in memory traffic, which dominates on CPU for the CF-CQL term's large
    [E, B*R, H] activations:
      * forward: the broadcast add and both ReLUs are in place (no copies);
      * backward: the ReLU masks are taken in place from the saved post-ReLU activations
        (sign_() of a ReLU output is its 0/1 derivative), and the output layer's weight w3 is folded
        into the small [H, H] matrices instead of being multiplied into the big gradient:
        dh2 = m2 * g * w3^T  =>  dW2 = (h1^T (m2 * g)) * w3^T and dh1 = (m2 * g) @ (W2 * w3^T)^T.
    The saved activations are overwritten by backward, so the graph can be backpropagated once
    (no retain_graph / double backward), which is all the algorithms do.
    """

    @staticmethod
    def forward(ctx, h_s, a, w1a, w2, b2, w3, b3, keep):
        E, B, H = h_s.shape
        BR = a.shape[0]
        h1 = _WORKSPACE.take((E, BR, H), h_s)
        torch.matmul(a, w1a, out=h1)  # [E, BR, H]
        h1.view(E, B, BR // B, H).add_(h_s.unsqueeze(2))
        h1.relu_()
        h2 = torch.baddbmm(b2, h1, w2, out=_WORKSPACE.take((E, BR, H), h_s)).relu_()
        # [E, 1, H] @ [E, H, BR]: a batched GEMV laid out so that MKL streams h2 row-major
        # (h2 @ w3 as [E, BR, H] @ [E, H, 1] is ~4x slower on CPU)
        q = torch.baddbmm(b3, w3.transpose(1, 2), h2.transpose(1, 2))  # [E, 1, BR]
        if keep:  # a backward will come (decided by the caller: inside forward grad mode is off)
            ctx.save_for_backward(a, w1a, w2, w3, h1, h2)
            ctx.B = B
        else:  # no backward will come: the activations go straight back to the pool
            _WORKSPACE.give(h1, h2)
        return q.view(E, BR)

    @staticmethod
    def backward(ctx, gq):
        if getattr(ctx, "done", False):
            raise RuntimeError("the fused critic trunk frees its activations in backward: no retain_graph")
        ctx.done = True
        a, w1a, w2, w3, h1, h2 = ctx.saved_tensors
        E, BR, H = h1.shape
        need = ctx.needs_input_grad
        g3 = gq.reshape(E, BR, 1)
        # dW3 = h2^T g as (g^T h2)^T: [E, 1, BR] @ [E, BR, H] (h2^T @ g is ~10x slower on CPU)
        dw3 = torch.bmm(g3.transpose(1, 2), h2).transpose(1, 2) if need[5] else None
        db3 = gq.sum(1).view(E, 1, 1) if need[6] else None
        w3t = w3.transpose(1, 2)  # [E, 1, H]
        m2 = h2.sign_()  # the ReLU derivative, in place
        # db2 = sum_r m2 * g * w3^T = (g^T m2) * w3^T: a GEMV (faster than a column sum)
        db2 = torch.bmm(g3.transpose(1, 2), m2).mul_(w3t) if need[4] else None
        d2 = m2.mul_(g3)  # m2 * g ; the true dh2 is d2 * w3^T
        dw2 = torch.bmm(h1.transpose(1, 2), d2).mul_(w3t) if need[3] else None
        dh1 = torch.bmm(d2, (w2 * w3t).transpose(1, 2), out=_WORKSPACE.take((E, BR, H), h1))  # [E, BR, H]
        dh1.mul_(h1.sign_())
        dw1a = torch.matmul(a.t(), dh1) if need[2] else None
        dh_s = dh1.view(E, ctx.B, BR // ctx.B, H).sum(2) if need[0] else None
        da = torch.matmul(dh1, w1a.transpose(1, 2)).sum(0) if need[1] else None
        _WORKSPACE.give(h1, h2, dh1)
        return dh_s, da, dw1a, dw2, db2, dw3, db3, None

def fused_trunk(h_s, a, w1a, w2, b2, w3, b3) -> torch.Tensor:
    """q [E, B*R] = relu(relu(a @ w1a + h_s[state of the row]) @ w2 + b2) @ w3 + b3 (see `_FusedTrunk`)."""
    args = (h_s, a, w1a, w2, b2, w3, b3)
    keep = torch.is_grad_enabled() and any(t.requires_grad for t in args)
    return _FusedTrunk.apply(*args, keep)


# --------------------------------------------------------------------------------------------
# The CF-CQL penalty's critic part
# --------------------------------------------------------------------------------------------


# Target size of one [E, rows, H] activation block of `_BlockedLSE`, per torch thread (its L2: 1 MiB a core on
# the dev VM): 1.5 MiB at 1 thread (the runs' default), 3 MiB at 2 (tuned on CN: flat between 1 and 4 MiB for
# E = 2, best near 3 MiB for E = 10; 8 MiB and more spill the cache). At 1 thread, paired against 3 MiB (CPU
# clock, 2026-11-28): PLCQL CN 0.973 (0.941-0.993), mpe-pp 0.967; CFCQL CN 0.946 (0.920-0.977); OMAR CN 0.950
# (0.941-0.960). More than 2 threads keep 3 MiB (not measured).
BLOCK_BYTES_PER_THREAD = 3 << 19
BLOCK_BYTES: int | None = None  # a fixed size instead (tests; dispatched_ops' single block)
# The same with the native form of the block loop (csrc/cql_block_*.c), at least twice one [E, H, H] weight
# tensor. Measured on one _BlockedLSE call at 1 thread (CPU clock, 2026-12-05; native, native at 1.5 MiB,
# torch form at 1.5 MiB): CN E = 2 12.8, 15.9, 20.0 ms (384 KiB: 12.4; 128 KiB: 14.1); CN E = 10 65.9,
# 69.5, 88.2 ms; Half-Cheetah (H 256, 60 rows a state) at its 1 MiB 69.0, 72.4, 78.4 ms (512 KiB: 73.6).
NATIVE_BLOCK_BYTES_PER_THREAD = 1 << 19
# On a GPU the blocks only multiply kernel launches (CN: ~80 blocks x ~12 kernels per critic update);
# one block of the whole batch takes ~0.7 GB at the paper's CN sizes (E 10, 90 candidates, hidden 64).
GPU_BLOCK_BYTES = 2 << 30


def block_bytes(device: torch.device, native_form: bool = False, weight_bytes: int = 0) -> int:
    """Bytes of one [E, rows, H] activation block of `_BlockedLSE` (and `blocked_trunk`). `native_form`: the
    block's elementwise work runs in C (`_native_block_loop`), which passes over each block ~3 times instead
    of ~14, so smaller blocks that stay in L2 pay: NATIVE_BLOCK_BYTES_PER_THREAD, or more where the [E, H, H]
    weights are large (`weight_bytes`, one such tensor: the GEMMs stream three of them per block)."""
    if device.type != "cpu":
        return GPU_BLOCK_BYTES
    if BLOCK_BYTES is not None:
        return BLOCK_BYTES
    threads = min(torch.get_num_threads(), 2)
    if native_form:
        return max(NATIVE_BLOCK_BYTES_PER_THREAD * threads, 2 * weight_bytes)
    return BLOCK_BYTES_PER_THREAD * threads


def _add_relu_(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x <- relu(x + y) in one pass (aten's fused _add_relu_ where available; bitwise the same)."""
    op = getattr(torch.ops.aten, "_add_relu_", None)
    if op is not None:
        try:
            return op.Tensor(x, y)
        except (RuntimeError, AttributeError):
            pass
    return x.add_(y).relu_()


def softmax_last(z: torch.Tensor) -> torch.Tensor:
    """softmax over the last dimension as exp(z − max) / sum, a new tensor: torch's CPU softmax over a short
    last dimension (CF-CQL's M = 10 candidates) is ~5x slower (a [10, 40, 3, 10] block at 1 thread: 217 vs
    45 µs, ~20 ms of a PLCQL round on MPE). Equal up to rounding (~1e-7)."""
    e = z.sub(z.amax(-1, keepdim=True)).exp_()
    return e.div_(e.sum(-1, keepdim=True))


class _BlockedLSE(torch.autograd.Function):
    """pol_j = mean_b sum_g w[b, g] * T * logsumexp_m(z_j[b, g, m] / T), z = critic trunk output - off,
    forwarded AND backpropagated block by block of states while the block's activations are in cache.

    Inputs as `_FusedTrunk` (h_s [E, B, H] with bias, w1a, w2, b2, w3, b3) plus a [B*R, nA] (rows grouped
    by state, no gradient), off [B, G, M] (or [E, B, G, M]: per member) or None, w [B, G], T. Every pol_j
    depends only on member j's parameters and is a mean over states of per-state terms that depend only on
    that state's rows, so the gradient of pol_j with respect to member j's parameters is a sum over state blocks of the blocks'
    gradients, and dpol_j/dh_s[j, b] depends only on block(b)'s forward. These gradients (for an upstream
    gradient of 1 per member) are computed inside forward, block by block, and backward scales them by
    the upstream gradient of each member: the same numbers as autograd through the full [E, B*R, H]
    graph up to float summation order, without ever holding (or re-reading from memory) the full
    activations. The per-block backward is `_FusedTrunk`'s (in-place ReLU masks, w3 folded into the
    [H, H] matrices); d/dz of T*lse(z/T) is softmax_m(z/T). Checked against a plain-autograd reference
    in tests/test_speed_equivalence.py.

    On the CPU in float32, with the native kernels on and built (native.cql_block_kernels), each block's
    elementwise work (first layer, ReLUs and their derivatives, output layer, offsets, softmax, dW3, dW1a,
    dh_s) runs as three C passes between the three GEMMs (`_native_block_loop`); otherwise, and always on
    CUDA, as torch ops (`_torch_block_loop`). Same blocks, same GEMMs, same numbers up to float summation order.
    """

    @staticmethod
    def forward(ctx, h_s, w1a, w2, b2, w3, b3, a, off, w, T, keep):
        E, B, H = h_s.shape
        G = w.shape[1]
        nA = a.shape[1]
        R = a.shape[0] // B
        M = R // G
        nat = _native_blocks(h_s, w1a, w3, b3, a, off, w, M)
        Eg = native_member_group(E) if nat is not None else E  # members per pass over the states
        size = block_bytes(h_s.device, nat is not None, Eg * H * H * h_s.element_size())
        bs = max(1, min(B, size // max(1, Eg * R * H * h_s.element_size())))  # states per block
        rows_max = bs * R
        # h1 carries a constant-1 column (H + 1 columns): the second layer's bias rides in its GEMM
        # (h1' @ [W2; b2]) instead of a pass that pre-fills h2 with b2, and in backward h1'^T d2 gives
        # [dW2; db2] in one GEMM. The column comes from the first layer: a @ [W1a, 0] + [h_s, 1].
        H1 = H + 1
        w2_ = torch.cat([w2, b2], 1)  # [E, H + 1, H]
        buf1 = h_s.new_empty(Eg * rows_max * H1)
        buf2 = h_s.new_empty(Eg * rows_max * H)
        buf3 = torch.empty_like(buf2) if keep else None
        z_all = h_s.new_empty(E, B, G, M)  # z = Q - off, all states (small)
        wB = (w * (1.0 / B)).unsqueeze(-1)  # [B, G, 1]: d pol / d (T lse)
        w3t = w3.transpose(1, 2)  # [E, 1, H]
        if keep:
            dh_s = h_s.new_empty(E, B, H)  # contiguous, as the native loop writes them
            dw1a = h_s.new_zeros(E, nA, H)
            gw2 = h_s.new_zeros(E, H1, H)  # h1'^T (m2 * g) = [dW2; db2] / w3^T
            dw3t = h_s.new_zeros(E, 1, H)
            w23t = (w2 * w3t).transpose(1, 2)  # (W2 * w3^T)^T
        grads = (dh_s, dw1a, gw2, dw3t, w23t) if keep else None
        if nat is not None:  # the same blocks, their elementwise work in C (csrc/cql_block_*.c), Eg members a pass
            for e0 in range(0, E, Eg):
                m = slice(e0, min(E, e0 + Eg))
                _native_block_loop(nat, h_s[m], w1a[m], w2_[m], w3[m], b3[m], a,
                                   off if off is None or off.dim() == 3 else off[m], wB, T, z_all[m], buf1, buf2,
                                   buf3, bs, None if grads is None else tuple(t[m] for t in grads))
        else:
            w1a_ = torch.cat([w1a, w1a.new_zeros(E, nA, 1)], 2)  # [E, nA, H + 1]
            h_s_ = torch.cat([h_s, h_s.new_ones(E, B, 1)], 2)  # [E, B, H + 1]
            _torch_block_loop(h_s_, w1a_, w2_, w3t, b3, a, off, wB, T, z_all, buf1, buf2, buf3, bs, grads)
        lse = torch.logsumexp(z_all if T == 1.0 else z_all / T, dim=-1)  # [E, B, G]
        pol = (lse * w).sum((1, 2)) * (T / B)
        zsum = z_all.sum((1, 2, 3))
        if keep:
            db3 = wB.sum().expand(E, 1, 1)  # sum of d pol / d z over rows = sum_b,g w / B (softmax sums to 1)
            gw2.mul_(w3t)
            ctx.save_for_backward(dh_s, dw1a, gw2[:, :H], gw2[:, H:], dw3t.transpose(1, 2), db3)
        ctx.mark_non_differentiable(zsum)
        return pol, zsum

    @staticmethod
    def backward(ctx, gpol, gzsum):
        dh_s, dw1a, dw2, db2, dw3, db3 = ctx.saved_tensors
        gv = gpol.view(-1, 1, 1)
        need = ctx.needs_input_grad
        return (dh_s * gv if need[0] else None, dw1a * gv if need[1] else None,
                dw2 * gv if need[2] else None, db2 * gv if need[3] else None,
                dw3 * gv if need[4] else None, db3 * gv if need[5] else None,
                None, None, None, None, None)

def _torch_block_loop(h_s_, w1a_, w2_, w3t, b3, a, off, wB, T, z_all, buf1, buf2, buf3, bs, grads) -> None:
    """`_BlockedLSE.forward`'s loop over blocks of states in torch ops: z into z_all and, with `grads` =
    (dh_s, dw1a, gw2, dw3t, w23t), the gradients for an upstream gradient of 1 (dh_s written, the rest
    accumulated)."""
    E, B, H1 = h_s_.shape
    H, nA = H1 - 1, a.shape[1]
    R = a.shape[0] // B
    relu_bwd = torch.ops.aten.threshold_backward.grad_input  # (x > 0) * g, written into grad_input
    for b0 in range(0, B, bs):
        b1_ = min(B, b0 + bs)
        nb = b1_ - b0
        rows = nb * R
        a_c = a[b0 * R:b1_ * R].expand(E, rows, nA)
        h1 = buf1[:E * rows * H1].view(E, rows, H1)
        h2 = buf2[:E * rows * H].view(E, rows, H)
        torch.bmm(a_c, w1a_, out=h1)
        _add_relu_(h1.view(E, nb, R, H1), h_s_[:, b0:b1_].unsqueeze(2))
        torch.bmm(h1, w2_, out=h2).relu_()
        z = z_all[:, b0:b1_]
        # [E, 1, H] @ [E, H, rows]: the output layer as a GEMV streaming h2 row-major
        torch.baddbmm(b3, w3t, h2.transpose(1, 2), out=z.view(E, 1, rows))
        if off is not None:
            z.sub_(off[..., b0:b1_, :, :])  # off [B, G, M], or [E, B, G, M] per member
        if grads is None:
            continue
        dh_s, dw1a, gw2, dw3t, w23t = grads
        # d pol / d z = w * softmax_m(z / T) / B (the logsumexp itself is taken once, after the loop)
        gq = softmax_last(z if T == 1.0 else z / T).mul_(wB[b0:b1_])
        g3 = gq.view(E, rows, 1)
        dw3t.baddbmm_(gq.view(E, 1, rows), h2)
        d2 = relu_bwd(g3, h2, 0, grad_input=h2)  # (h2 > 0) * g, in place of h2; dh2 = d2 * w3^T
        gw2.baddbmm_(h1.transpose(1, 2), d2)
        dh1 = buf3[:E * rows * H].view(E, rows, H)
        torch.bmm(d2, w23t, out=dh1)
        relu_bwd(dh1, h1[:, :, :H], 0, grad_input=dh1)
        dw1a.baddbmm_(a_c.transpose(1, 2), dh1)
        torch.sum(dh1.view(E, nb, R, H), 2, out=dh_s[:, b0:b1_])


# Members per pass of the native loop over the states: a 10-member ensemble in two passes of 5 gets blocks of
# twice as many states at the same bytes, so GEMMs twice as tall (~157 -> ~180 GFLOP/s at these sizes). One
# call on CN at 1 thread, CPU clock, 2026-12-05: per member 5.5 ms at E = 2, 5.6 at E = 5, 6.05 at E = 10.
NATIVE_MEMBERS_PER_PASS = 5


def native_member_group(E: int) -> int:
    """Members per pass of the native block loop: E split evenly into passes of at most NATIVE_MEMBERS_PER_PASS."""
    passes = -(-E // NATIVE_MEMBERS_PER_PASS)
    return -(-E // passes)


def _native_blocks(h_s, w1a, w3, b3, a, off, w, M):
    """csrc/cql_block_*.c's (layer1, head, tail) where they can take this call (float32 on the CPU, the native
    kernels on and built: native.cql_block_kernels), else None: the torch loop. CUDA keeps the torch ops."""
    if h_s.device.type != "cpu" or any(t is not None and t.dtype != torch.float32
                                       for t in (h_s, w1a, w3, b3, a, off, w)):
        return None
    if a.shape[1] > 64 or M > 4096 or h_s.shape[2] % 16 != 0:  # the kernels' scratch, their 16-column tiles
        return None
    return native.cql_block_kernels()


def _native_block_loop(nat, h_s, w1a, w2_, w3, b3, a, off, wB, T, z_all, buf1, buf2, buf3, bs, grads) -> None:
    """`_torch_block_loop` with each block's elementwise work in three C passes (csrc/cql_block_*.c state the
    formulas): layer1 (h1 = relu(a @ w1a + h_s) with the constant-1 column), the second layer's GEMM in
    torch, head (ReLU, output layer, offset, softmax, dW3, the ReLU derivative times d pol / d q, in place
    of h2), the dW2 and dh1 GEMMs in torch, tail (dh1's ReLU derivative, dW1a, dh_s). The GEMMs are the torch
    loop's; the blocks are smaller (`block_bytes` with native_form)."""
    layer1, head, tail = nat
    E, B, H = h_s.shape
    nA = a.shape[1]
    R = a.shape[0] // B
    G, M = z_all.shape[2], z_all.shape[3]
    H1, f = H + 1, 4  # float32 bytes
    h_s, w1a, a, wB = h_s.contiguous(), w1a.contiguous(), a.contiguous(), wB.contiguous()
    w3v, b3v = w3.reshape(E, H).contiguous(), b3.reshape(E).contiguous()
    off = None if off is None else off.contiguous()
    s_off_e = 0 if off is None or off.dim() == 3 else B * G * M
    threads = torch.get_num_threads()
    p_a, p_hs, p_z, p_wB = a.data_ptr(), h_s.data_ptr(), z_all.data_ptr(), wB.data_ptr()
    p_off = None if off is None else off.data_ptr()
    p_h1, p_h2 = buf1.data_ptr(), buf2.data_ptr()
    if grads is not None:
        dh_s, dw1a, gw2, dw3t, w23t = grads
        p_dw3, p_dw1a, p_dhs, p_dh1 = dw3t.data_ptr(), dw1a.data_ptr(), dh_s.data_ptr(), buf3.data_ptr()
    for b0 in range(0, B, bs):
        nb = min(B, b0 + bs) - b0
        rows = nb * R
        h1 = buf1[:E * rows * H1].view(E, rows, H1)
        h2 = buf2[:E * rows * H].view(E, rows, H)
        _check(layer1(p_a + b0 * R * nA * f, w1a.data_ptr(), p_hs + b0 * H * f, p_h1, E, nb, R, nA, H, B * H,
                      threads), "cql_block_layer1")
        torch.bmm(h1, w2_, out=h2)
        _check(head(p_h2, w3v.data_ptr(), b3v.data_ptr(), None if p_off is None else p_off + b0 * G * M * f,
                    p_wB + b0 * G * f, p_z + b0 * G * M * f, p_dw3 if grads is not None else None, T, E, nb, G,
                    M, H, s_off_e, B * G * M, int(grads is not None), threads), "cql_block_head")
        if grads is None:
            continue
        gw2.baddbmm_(h1.transpose(1, 2), h2)  # h2 now holds d2 = (h2 > 0) * d pol / d q
        torch.bmm(h2, w23t, out=buf3[:E * rows * H].view(E, rows, H))
        _check(tail(p_dh1, p_h1, p_a + b0 * R * nA * f, p_dw1a, p_dhs + b0 * H * f, E, nb, R, nA, H, B * H,
                    threads), "cql_block_tail")


def _check(status: int, name: str) -> None:
    if status != 0:
        raise RuntimeError(f"native {name} failed (status {status}: bad sizes)")


def blocked_lse_penalty(critic, state: torch.Tensor, actions: torch.Tensor, n_groups: int,
                        offset: torch.Tensor | None, weights: torch.Tensor, temp: float = 1.0,
                        members: slice | None = None, state_part: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """The CF-CQL term's critic part, cache-blocked over states (`_BlockedLSE`).

    state [B, S], actions [B, G * M, nA] (G = n_groups groups of M candidates per state, no gradient),
    offset [B, G, M] or None (subtracted from Q), weights [G] or [B, G]. With z = Q_j(s, a) - offset:
        pol_j = mean_b sum_g weights_g * T * logsumexp_m(z / T)              -> [E']
    Returns pol [E'] and the sum of z over all rows [E'] (detached, for diagnostics): the same value and
    gradients as evaluating `critic(state, actions, members)` and reducing with autograd (the plain path
    in continuous.py: `cf_cql_penalty`), but every activation block is forwarded and backpropagated while it
    is in cache."""
    B, R, nA = actions.shape
    sl = members if members is not None else slice(None)
    h_s, a, w1_a = critic.first_layer(state, actions.reshape(B * R, nA), sl, fold_actions=True,
                                      state_part=state_part)
    P = critic.member_params(sl, False)
    args = (h_s, w1_a, P["l2.weight"], P["l2.bias"], P["l3.weight"], P["l3.bias"])
    keep = torch.is_grad_enabled() and any(t.requires_grad for t in args)
    w = weights.detach().to(h_s.dtype).expand(B, n_groups).contiguous()
    off = None if offset is None else offset.detach().to(h_s.dtype).reshape(B, n_groups, R // n_groups)
    return _BlockedLSE.apply(*args, a.detach(), off, w, float(temp), keep)


def blocked_lse(h_s: torch.Tensor, w1a: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor, w3: torch.Tensor,
                b3: torch.Tensor, a: torch.Tensor, offset: torch.Tensor | None, weights: torch.Tensor,
                temp: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """`_BlockedLSE` on a first layer already split (h_s [E, B, H] with bias, w1a [E, nA, H], a [B*R, nA]),
    for critics other than EnsembleCritic (OMAR's per-agent critics, independent.py: `sampled_lse`).
    offset [B, G, M] or [E, B, G, M] (per member), weights [B, G]. Returns pol [E] and sum z [E]."""
    args = (h_s, w1a, w2, b2, w3, b3)
    keep = torch.is_grad_enabled() and any(t.requires_grad for t in args)
    off = None if offset is None else offset.detach().to(h_s.dtype).contiguous()
    return _BlockedLSE.apply(*args, a.detach(), off, weights.detach().to(h_s.dtype).contiguous(), float(temp),
                             keep)


@torch.no_grad()
def blocked_trunk(h_s: torch.Tensor, w1a: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor, w3: torch.Tensor,
                  b3: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """q [E, B*R] of the critic trunk (as `fused_trunk`) without gradient, in blocks of states whose
    activations stay in cache (as `_BlockedLSE`'s forward): OMAR's zeroth-order search evaluates Q_1 at
    many sampled actions per observation and keeps only the values."""
    E, B, H = h_s.shape
    nA = a.shape[1]
    R = a.shape[0] // B
    # as _BlockedLSE's forward: h1 carries a constant-1 column so b2 rides in the second GEMM
    w1a_ = torch.cat([w1a, w1a.new_zeros(E, nA, 1)], 2)
    h_s_ = torch.cat([h_s, h_s.new_ones(E, B, 1)], 2)
    w2_ = torch.cat([w2, b2], 1)
    w3t = w3.transpose(1, 2)
    bs = max(1, min(B, block_bytes(h_s.device) // max(1, E * R * H * h_s.element_size())))
    buf1, buf2 = h_s.new_empty(E * bs * R * (H + 1)), h_s.new_empty(E * bs * R * H)
    q = h_s.new_empty(E, B * R)
    for b0 in range(0, B, bs):
        nb = min(B, b0 + bs) - b0
        rows = nb * R
        h1 = buf1[:E * rows * (H + 1)].view(E, rows, H + 1)
        h2 = buf2[:E * rows * H].view(E, rows, H)
        torch.bmm(a[b0 * R:b0 * R + rows].expand(E, rows, nA), w1a_, out=h1)
        _add_relu_(h1.view(E, nb, R, H + 1), h_s_[:, b0:b0 + nb].unsqueeze(2))
        torch.bmm(h1, w2_, out=h2).relu_()
        q[:, b0 * R:b0 * R + rows] = torch.baddbmm(b3, w3t, h2.transpose(1, 2)).view(E, rows)  # GEMV, row-major h2
    return q


# --------------------------------------------------------------------------------------------
# Memory: the activation pool and the allocator
# --------------------------------------------------------------------------------------------


class _Workspace:
    """A small pool of large activation buffers for `_FusedTrunk`, reused across updates.

    Tensors above glibc's mmap threshold (32 MiB at most: the [10, 30720, 64] CF-CQL activations of a
    10-member ensemble are 79 MB) are mmapped on every allocation and unmapped on free, so each update
    re-faults them page by page (~58k page faults per PLCQL critic update). Buffers are taken when a
    forward/backward needs one and given back when that backward has finished (or right after a forward
    that will not be backpropagated); a buffer still in use is never handed out again, so nested or
    overlapping graphs just allocate fresh ones. Only buffers of at least `min_bytes` are pooled."""

    def __init__(self, min_bytes: int = 8 << 20, per_key: int = 4) -> None:
        self.free: dict[tuple, list[torch.Tensor]] = {}
        self.min_bytes, self.per_key = min_bytes, per_key

    def take(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        key = (shape, like.dtype, like.device)
        lst = self.free.get(key)
        if lst:
            return lst.pop()
        return torch.empty(shape, dtype=like.dtype, device=like.device)

    def give(self, *ts: torch.Tensor) -> None:
        for t in ts:
            if t.numel() * t.element_size() < self.min_bytes or not t.is_contiguous():
                continue
            lst = self.free.setdefault((tuple(t.shape), t.dtype, t.device), [])
            if len(lst) < self.per_key and all(t.data_ptr() != x.data_ptr() for x in lst):
                lst.append(t)


_WORKSPACE = _Workspace()


_DENORMALS_FLUSHED = False


def flush_denormals(on: bool = True) -> bool:
    """Make this thread's CPU float arithmetic (and that of threads it starts afterwards, the native kernels'
    included) treat denormal numbers (float32 magnitudes below 2^-126) as zero: x86's FTZ/DAZ flags, through
    torch.set_flush_denormal. Returns whether they are now flushed (False where the CPU cannot).

    Why: a critic whose Adam moments or activations decay into that range runs through the CPU's slow path
    for them. From a CFCQL checkpoint of PP medium-replay (round 1,800 of a campaign run) the same 20 rounds took
    ~273 ms each, and ~104 ms with denormals flushed (docs/runner.md gives the measurement). Only values below
    float32's normal range change (a ReLU pre-activation that is itself denormal becomes 0, its gradient 0), and
    whole rounds agree within the kernel forms' tolerances (tests/test_speed_equivalence.py:
    test_algorithm_rounds_match_with_denormals_flushed). GPUs run denormals at full speed; CUDA runs do not set it."""
    global _DENORMALS_FLUSHED
    supported = bool(torch.set_flush_denormal(on))
    _DENORMALS_FLUSHED = on and supported
    return _DENORMALS_FLUSHED


def denormals_flushed() -> bool:
    """Whether flush_denormals last turned flushing on in this process."""
    return _DENORMALS_FLUSHED


def keep_freed_memory() -> None:
    """Ask glibc malloc to keep freed memory for reuse instead of returning it to the OS.

    The CF-CQL term makes several [E, B*n*M, H] activations per update (16 MB each on MPE); with
    glibc's defaults they are mmapped/trimmed and re-faulted every update, which on this kind of
    VM costs ~35k page faults and ~100 ms per CFCQL round. Process-wide, idempotent, CPU only;
    silently does nothing where glibc is not available.
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 * 1024 * 1024)  # M_MMAP_THRESHOLD: glibc's maximum, 32 MiB
        libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: never trim the heap top
        libc.mallopt(-2, 64 * 1024 * 1024)  # M_TOP_PAD
    except (OSError, AttributeError):
        pass


_MALLOC_TUNED = False

# Discrete tasks: glibc mmaps every allocation above its mmap threshold (32 MiB at most) and unmaps it on
# free, so each of a discrete ensemble round's large tensors (a [10, 77440, 64] GRU output is 198 MB on
# smax-2s3z) is faulted in page by page on every round: with the fused kernels and their buffer pool
# still ~0.7 million page faults and ~1.1 s of system time per PLCQL round (1 thread), against 0.05
# million and 0.07 s from the heap (docs/algorithms/discrete-machinery.md "Fused kernels"). Serving them
# from the heap (M_MMAP_MAX = 0) and never trimming it (keep_freed_memory) reuses the same pages from
# round to round. The process keeps its peak memory; requests the heap cannot grow for still fall back
# to mmap inside glibc.
_M_MMAP_MAX, _GLIBC_DEFAULT_MMAP_MAX = -4, 65536


def large_allocations_from_heap(on: bool = True) -> None:
    """Serve large allocations from the heap (True) or with glibc's default mmap (False). Process-wide:
    the runner sets it once for discrete tasks on CPU (suite/runs/runner.py: configure_process), after
    `keep_freed_memory`; silently does nothing where glibc is not available."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_MAX, 0 if on else _GLIBC_DEFAULT_MMAP_MAX)
    except (OSError, AttributeError):
        pass

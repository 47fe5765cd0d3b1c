"""The fused discrete kernels (algorithms/common/kernels_discrete.py) against the plain torch paths they
replace (discrete.py, discrete_ensemble.py: a network's `fused` off, or built under
kernels.fused_kernels(False), the runner's PLCQL_KERNELS=plain), which are the code as it was before them:

  * fused_gru vs the stacked autograd GRU (StackedRNNAgent) and nn.GRU (RNNAgent), and the packed unroll
    (real observations only) vs the padded one: outputs, last
    hidden state, the gradients of every parameter and of h0, with and without h0, one step and many;
  * counterfactual_mix vs the materialised [rows, n, A, embed] mixer (StackedQMixer / QMixer), with
    a tiny block size so that several blocks and a ragged last one run;
  * the per-agent MLP critics on packed rows (discrete_critics.py, `rows=`) vs the padded ones;
  * whole update rounds of every discrete algorithm, fused vs plain from the same seed: every parameter
    after three rounds and the logged metrics agree within float tolerance.
"""

from __future__ import annotations

import pytest
import torch

from plcql_bench.algorithms.base import get_algorithm, make_config
from plcql_bench.algorithms.common import kernels
from plcql_bench.algorithms.common import kernels_discrete as fast
from plcql_bench.algorithms.common.discrete import QMixer, RNNAgent
from plcql_bench.algorithms.common.discrete_ensemble import StackedQMixer, StackedRNNAgent
from plcql_bench.datasets.episodes import EpisodeSampler

from test_discrete_machinery import SPEC, ragged

torch.set_num_threads(1)
F64 = torch.float64


def _grads(out, params, seed=1):
    """Gradients of a random linear function of the outputs (every output element matters)."""
    loss = sum((o * torch.randn(o.shape, generator=torch.Generator().manual_seed(seed + i), dtype=o.dtype)).sum()
               for i, o in enumerate(out))
    return torch.autograd.grad(loss, params)


def _set_fused(net: torch.nn.Module, on: bool) -> None:
    for m in net.modules():
        if hasattr(m, "fused"):
            m.fused = on


def _run_both(net, fn):
    """fn() with `net`'s fused kernels on, then with its plain path."""
    _set_fused(net, True)
    got = fn()
    _set_fused(net, False)
    exp = fn()
    _set_fused(net, True)
    return got, exp


def _close(got, exp, rtol=1e-10, atol=1e-12):
    for i, (g, e) in enumerate(zip(got, exp)):
        assert g.shape == e.shape, i
        assert torch.allclose(g, e, rtol=rtol, atol=atol * max(1.0, float(e.detach().abs().max()))), (i, (g - e).abs().max())


@pytest.mark.parametrize("steps", [1, 7])
@pytest.mark.parametrize("with_h0", [False, True])
def test_fused_gru_matches_stacked_autograd_gru(steps, with_h0):
    torch.manual_seed(0)
    E, B, n, o, A, H = 3, 4, 3, 5, 6, 8
    agent = StackedRNNAgent([RNNAgent(n, o, A, H) for _ in range(E)]).to(F64)
    g = torch.Generator().manual_seed(2)
    obs = torch.randn(B, steps, n, o, generator=g, dtype=F64)
    last = torch.randn(B, steps, n, A, generator=g, dtype=F64)
    h0 = torch.randn(E, B, n, H, generator=g, dtype=F64, requires_grad=True) if with_h0 else None
    params = list(agent.parameters()) + ([h0] if with_h0 else [])

    def run():
        out, hT = agent(obs, last, h0)
        return out, hT, _grads((out, hT), params)

    (out, hT, gr), (out_p, hT_p, gr_p) = _run_both(agent, run)
    _close([out, hT, *gr], [out_p, hT_p, *gr_p])
    with torch.no_grad():  # the no-grad path (targets, acting) gives the same values
        out_ng, hT_ng = agent(obs, last, h0)
    assert torch.allclose(out_ng, out, rtol=1e-12) and torch.allclose(hT_ng, hT, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["f32", "f64"])
def test_fused_gru_matches_nn_gru_agent(dtype):
    torch.manual_seed(1)
    B, L, n, o, A, H = 5, 9, 3, 7, 6, 16
    agent = RNNAgent(n, o, A, H).to(dtype)
    g = torch.Generator().manual_seed(3)
    obs = torch.randn(B, L, n, o, generator=g).to(dtype)
    last = torch.randn(B, L, n, A, generator=g).to(dtype)
    h0 = torch.randn(B, n, H, generator=g).to(dtype).requires_grad_()
    params = list(agent.parameters()) + [h0]

    def run():
        out, hT = agent(obs, last, h0)
        return out, hT, _grads((out, hT), params)

    (out, hT, gr), (out_p, hT_p, gr_p) = _run_both(agent, run)
    rtol, atol = (1e-10, 1e-12) if dtype == F64 else (1e-4, 1e-6)
    _close([out, hT, *gr], [out_p, hT_p, *gr_p], rtol, atol)


@pytest.fixture
def tiny_blocks(monkeypatch):
    """Two rows per block: several blocks and a ragged last one."""
    monkeypatch.setattr(fast, "BLOCK_BYTES", 2 * 3 * 6 * 4 * 8)


def _stacked_mixer_case(torch_seed: int, data_seed: int, E: int, M: int, n: int, A: int, S: int):
    """An E-member float64 stacked QMIX mixer and random per-member agent Qs [E, M, n, A] (requiring
    grad), dataset actions [M, n] and states [M, S]; also the generator, for more inputs."""
    torch.manual_seed(torch_seed)
    mixer = StackedQMixer([QMixer(n, S, 4, 8) for _ in range(E)]).to(F64)
    g = torch.Generator().manual_seed(data_seed)
    q = (torch.randn(E, M, n, A, generator=g, dtype=F64) * 3).requires_grad_()
    acts = torch.randint(0, A, (M, n), generator=g)
    state = torch.randn(M, S, generator=g, dtype=F64)
    return mixer, q, acts, state, g


@pytest.mark.parametrize("grad", [True, False])
def test_shared_input_linear_matches_baddbmm_on_the_expanded_input(monkeypatch, grad):
    """x @ w[e] + b[e] for every member from one input, in row chunks (here of 3 rows: a ragged last
    chunk): the values of baddbmm on x expanded over the members, and the gradients of x, w and b."""
    monkeypatch.setattr(fast, "SHARED_INPUT_ROWS", 3)
    g = torch.Generator().manual_seed(11)
    E, R, In, H = 3, 10, 5, 4
    x, w, b = (torch.randn(*shape, generator=g, dtype=F64).requires_grad_(grad)
               for shape in ((R, In), (E, In, H), (E, 1, H)))
    up = torch.randn(E, R, H, generator=g, dtype=F64)
    exp = torch.baddbmm(b, x.expand(E, -1, -1), w)
    got = fast.shared_input_linear(x, w, b)
    _close([got], [exp])
    if grad:
        _close(torch.autograd.grad((got * up).sum(), [x, w, b]), torch.autograd.grad((exp * up).sum(), [x, w, b]))


def test_counterfactual_mix_matches_the_stacked_mixer(tiny_blocks):
    E, M, n, A, S = 3, 11, 3, 6, 9
    mixer, q, acts, state, g = _stacked_mixer_case(2, 4, E, M, n, A, S)
    params = [q, *mixer.parameters()]

    def run():
        cf = mixer.counterfactual(q, acts, state)
        return cf, _grads((cf,), params)

    (cf, gr), (cf_p, gr_p) = _run_both(mixer, run)
    _close([cf, *gr], [cf_p, *gr_p])
    # the weights argument (shared with the TD mixer) gives the same values
    w = mixer.weights(state)
    assert torch.allclose(mixer.counterfactual(q, acts, state, w), cf, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["f32", "f64"])
def test_counterfactual_mix_matches_the_single_mixer(tiny_blocks, dtype):
    torch.manual_seed(3)
    B, T, n, A, S = 2, 5, 3, 6, 9
    mixer = QMixer(n, S, 4, 8).to(dtype)
    g = torch.Generator().manual_seed(5)
    q = (torch.randn(B, T, n, A, generator=g) * 3).to(dtype).requires_grad_()
    acts = torch.randint(0, A, (B, T, n), generator=g)
    state = torch.randn(B, T, S, generator=g).to(dtype)
    params = [q, *mixer.parameters()]

    def run():
        cf = mixer.counterfactual(q, acts, state)
        return cf, _grads((cf,), params)

    (cf, gr), (cf_p, gr_p) = _run_both(mixer, run)
    rtol, atol = (1e-10, 1e-12) if dtype == F64 else (1e-4, 1e-6)
    _close([cf, *gr], [cf_p, *gr_p], rtol, atol)


def test_fused_gru_refuses_a_second_backward():
    agent = StackedRNNAgent([RNNAgent(2, 3, 4, 5) for _ in range(2)])
    assert agent.fused  # the default
    out, _ = agent(torch.randn(2, 3, 2, 3), torch.zeros(2, 3, 2, 4))
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_graph"):
        out.sum().backward()


TINY = {"batch_episodes": 4, "hidden": 8, "mixing_embed": 4, "hypernet_embed": 8, "behaviour_max_updates": 3,
        "softmax_temp": 1.0, "target_update_interval": 2}
ENSEMBLE = {"n_critics": 3}


@pytest.mark.parametrize("name,temp", [("cfcql", 1.0), ("cfcql", 100.0), ("macql", 1.0), ("spacql", 1.0),
                                       ("plcql", 1.0), ("plcql", 0.0), ("plcql-lcb", 1.0),
                                       # the GRU-agent baselines: fused = the packed unroll (zeros on padding)
                                       ("bc", 1.0), ("iql", 1.0), ("awac", 1.0), ("maicq", 1.0), ("omar", 1.0),
                                       ("madtkd", 1.0)])
def test_update_rounds_match_the_plain_kernels(name, temp, monkeypatch):
    """Three update rounds from the same seed: fused and plain give the same parameters (Adam, clipping,
    target copies and the random draws all included) and the same metrics, within float32 tolerance."""
    _check_fused_rounds_match_plain(name, {"softmax_temp": temp}, monkeypatch)


@pytest.mark.parametrize("name", ["iql", "awac", "omar"])
def test_update_rounds_match_the_plain_kernels_bootstrapping_timeouts(name, monkeypatch):
    """As above with timeouts bootstrapped: the critics' value at an episode's final next observation
    (the last real row of the packed [B, T+1] layout) then enters the targets."""
    assert "bootstrap_timeouts" in get_algorithm(name, discrete=True).Config.__dataclass_fields__
    _check_fused_rounds_match_plain(name, {"bootstrap_timeouts": True}, monkeypatch)


def _check_fused_rounds_match_plain(name, extra, monkeypatch):
    monkeypatch.setattr(fast, "BLOCK_BYTES", 4096)  # several counterfactual blocks per round
    cls = get_algorithm(name, discrete=True)
    fields = set(cls.Config.__dataclass_fields__)
    cfg = {k: v for k, v in {**TINY, **ENSEMBLE, "par_hidden": 8, **extra}.items() if k in fields}
    arrays = ragged(lens=(5, 2, 4, 1, 3, 5, 2, 4))
    runs = {}
    for plain in (False, True):
        torch.manual_seed(0)
        with kernels.fused_kernels(not plain):  # what PLCQL_KERNELS=plain does: networks built on the plain path
            algo = cls(SPEC, make_config(cls, cfg), 0)
        assert all(m.fused != plain for net in algo.modules().values() for m in net.modules() if hasattr(m, "fused"))
        sampler = EpisodeSampler(arrays, 0, "cpu")
        metrics = [algo.update(sampler) for _ in range(3)]
        runs[plain] = (algo, metrics)
    (fa, fm), (pa, pm) = runs[False], runs[True]
    for key, mod in fa.modules().items():
        for (pname, p), q in zip(mod.state_dict().items(), pa.modules()[key].state_dict().values()):
            assert torch.allclose(p.float(), q.float(), rtol=1e-4, atol=1e-5), (key, pname, (p - q).abs().max())
    for a, b in zip(fm, pm):
        assert a.keys() == b.keys()
        for k in a:
            assert abs(a[k] - b[k]) <= 1e-4 * max(1.0, abs(b[k])), (k, a[k], b[k])


@pytest.mark.parametrize("temp", [0.0, 0.5, 100.0], ids=["uniform", "soft", "hard"])
def test_cf_negative_matches_the_formulas(tiny_blocks, temp):
    """Σ_i λ_i masked-logsumexp_j Q_tot(s, a_i = j, a_-i), λ from the KL to β (CFCQL's formula), in one
    blocked pass: values, λ, and the gradients of q and every mixer parameter."""
    from plcql_bench.algorithms.common.discrete import masked_logsumexp, masked_softmax

    from test_discrete_machinery import random_masks

    E, M, n, A, S = 3, 7, 3, 6, 9
    mixer, q, acts, state, g = _stacked_mixer_case(4, 6, E, M, n, A, S)
    avail = random_masks(g, (M, n, A)).to(F64)
    beta = masked_softmax(torch.randn(M, n, A, generator=g, dtype=F64), avail)
    logbeta = (beta + 1e-5).log()
    up = torch.randn(E, M, generator=g, dtype=F64)
    params = [q, *mixer.parameters()]

    mixer.fused = False
    cf = mixer.counterfactual(q, acts, state)  # [E, M, n, A]: the plain path
    mixer.fused = True
    mu = masked_softmax(cf.detach(), avail) + 1e-5
    kl = (mu * (mu.log() - logbeta) * avail).sum(-1)
    lam_r = {0.0: torch.full_like(kl, 1 / n), 100.0: torch.nn.functional.one_hot(kl.argmax(-1), n).to(F64)}.get(
        temp, torch.softmax(temp * kl, -1))
    neg_r = (lam_r * masked_logsumexp(cf, avail)).sum(-1)
    exp = torch.autograd.grad((neg_r * up).sum(), params)

    neg, lam = fast.cf_negative(*mixer.counterfactual_parts(q, acts, state), avail, logbeta if temp else None, temp, E)
    assert torch.allclose(neg.view(E, M), neg_r, rtol=1e-10) and torch.allclose(lam.view(E, M, n), lam_r, rtol=1e-10)
    got = torch.autograd.grad((neg.view(E, M) * up).sum(), params)
    _close(got, exp)


def test_cf_negative_matches_the_formulas_far_below_zero(tiny_blocks):
    """Counterfactual pre-activations far below −87 (where exp is subnormal in float32 and the kernel clamps
    it): the same values and gradients as the plain ELU mixer."""
    from plcql_bench.algorithms.common.discrete import masked_logsumexp

    E, M, n, A, S = 2, 5, 3, 4, 6
    mixer, q, acts, state, g = _stacked_mixer_case(5, 7, E, M, n, A, S)
    q = (q.detach() * 60).requires_grad_()  # |delta · w1| up to a few hundred
    avail = torch.ones(M, n, A, dtype=F64)
    params = [q, *mixer.parameters()]
    mixer.fused = False
    cf = mixer.counterfactual(q, acts, state)
    mixer.fused = True
    parts = mixer.counterfactual_parts(q, acts, state)
    assert float((parts[0].unsqueeze(1).unsqueeze(1) + parts[1].unsqueeze(-1) * parts[2].unsqueeze(2)).detach().min()) < -200
    neg_r = (masked_logsumexp(cf, avail) / n).sum(-1)
    exp = torch.autograd.grad(neg_r.sum(), params)
    neg, _ = fast.cf_negative(*parts, avail, None, 0.0, E)
    assert torch.allclose(neg.view(E, M), neg_r, rtol=1e-10)
    _close(torch.autograd.grad(neg.sum(), params), exp)


def test_cf_negative_refuses_a_second_backward():
    mixer, q, acts, state, _ = _stacked_mixer_case(1, 2, 2, 3, 2, 3, 4)
    neg, _ = fast.cf_negative(*mixer.counterfactual_parts(q, acts, state), torch.ones(3, 2, 3, dtype=F64), None, 0.0, 2)
    neg.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_graph"):
        neg.sum().backward()


@pytest.mark.parametrize("stacked", [True, False])
def test_mix_data_matches_mix_many(stacked):
    """The fused update's Q_tot at the data joint action (`mix_data`, through first_layer's hand-written
    backward) equals `mix_many` with K = 1, values and gradients; its first layer is counterfactual_parts' pre."""
    E, M, n, A, S = (3 if stacked else 1), 6, 3, 4, 5
    mixer, q, acts, state, g = _stacked_mixer_case(3, 4, E, M, n, A, S)
    if not stacked:
        torch.manual_seed(3)
        mixer = QMixer(n, S, 4, 8).to(F64)
    q_taken = q.gather(-1, acts.expand(E, -1, -1).unsqueeze(-1))[..., 0]  # [E, M, n]
    params = [q, *mixer.parameters()]
    up = torch.randn(E, M, generator=g, dtype=F64)
    w = mixer.weights(state)
    if stacked:
        q_tot, pre = mixer.mix_data(q_taken, w)
        ref = mixer.mix_many(q_taken.unsqueeze(-2), state)[..., 0]
    else:
        q_tot, pre = mixer.mix_data(q_taken[0], w)
        q_tot, ref = q_tot[None], mixer.mix_many(q_taken[0].unsqueeze(-2), state)[None, :, 0]
    _close([q_tot, *torch.autograd.grad((q_tot * up).sum(), params, retain_graph=True)],
           [ref, *torch.autograd.grad((ref * up).sum(), params)])
    parts = mixer.counterfactual_parts(q if stacked else q[0], acts, state)
    assert torch.allclose(parts[0], pre, rtol=1e-12)


def test_online_member_q_tot_reuses_predict_weights_only_while_valid():
    """Without gradient, the online mixers at a batch's states reuse `predict`'s hypernetwork weights (same
    values as computing them); after the parameters change (an optimiser step, an in-place edit) they are
    computed afresh."""
    cls = get_algorithm("plcql", discrete=True)
    torch.manual_seed(0)
    algo = cls(SPEC, make_config(cls, {**TINY, **ENSEMBLE, "par_hidden": 8}), 0)
    bb = algo.backbone
    batch = EpisodeSampler(ragged(lens=(5, 2, 4, 1)), 0, "cpu")(4)
    q_all = bb.unroll(batch)
    joint = torch.randint(0, SPEC.act_dim, (*batch.state.shape[:2], 2, SPEC.n_agents))
    with torch.no_grad():
        fresh = bb.member_q_tot(q_all, joint, batch.state)
    bb.predict(batch, q_all)
    calls = []
    weights = bb.mixers.weights
    bb.mixers.weights = lambda s: calls.append(s.shape[0]) or weights(s)
    with torch.no_grad():
        reused = bb.member_q_tot(q_all, joint, batch.state)
        assert calls == [batch.size]  # the final next states only
        assert torch.allclose(reused, fresh, rtol=1e-5, atol=1e-6)
        next(bb.mixer.parameters()).add_(0.5)
        changed = bb.member_q_tot(q_all, joint, batch.state)
    assert calls[-1] == batch.size * (batch.max_t + 1)  # recomputed at every state
    assert not torch.allclose(changed, reused)
    bb.mixers.weights = weights
    pred = bb.predict(batch, q_all)
    bb.update(batch, pred, torch.zeros(batch.size, batch.max_t))
    assert bb._predicted_weights(batch.state) is None  # the step invalidates them


def test_the_runner_switch_reaches_the_discrete_networks(monkeypatch):
    """PLCQL_KERNELS=plain (the runner's configure_process) builds every discrete network on its plain path;
    fused (the default) on the kernels."""
    from plcql_bench.suite.runs.runner import KERNELS_ENV, configure_process

    cls = get_algorithm("plcql", discrete=True)
    cfg = {k: v for k, v in {**TINY, **ENSEMBLE, "par_hidden": 8}.items() if k in cls.Config.__dataclass_fields__}
    try:
        for choice, on in (("plain", False), ("fused", True)):
            monkeypatch.setenv(KERNELS_ENV, choice)
            configure_process("cpu", discrete=True)
            algo = cls(SPEC, make_config(cls, cfg), 0)
            flags = [m.fused for net in algo.modules().values() for m in net.modules() if hasattr(m, "fused")]
            assert len(flags) >= 4 and all(f == on for f in flags), (choice, flags)
    finally:
        kernels.use_fused(True)


def test_the_allocator_is_set_by_the_runner_not_by_an_algorithm(monkeypatch):
    """Large allocations from the heap: set by configure_process for a discrete task on CPU (and reset for a
    continuous one), never by building or updating an algorithm; no algorithm file calls mallopt."""
    from pathlib import Path

    from plcql_bench.suite.runs.runner import configure_process

    calls = []
    monkeypatch.setattr(kernels, "large_allocations_from_heap", lambda on=True: calls.append(on))
    cls = get_algorithm("cfcql", discrete=True)
    cfg = {k: v for k, v in TINY.items() if k in cls.Config.__dataclass_fields__}
    cls(SPEC, make_config(cls, cfg), 0).update(EpisodeSampler(ragged(lens=(3, 2)), 0, "cpu"))
    assert calls == []
    configure_process("cpu", discrete=True)
    configure_process("cpu", discrete=False)
    assert calls == [True, False]
    root = Path(__file__).resolve().parent.parent / "algorithms"
    callers = [p.name for p in root.rglob("*.py") if "mallopt" in p.read_text() and p.name != "kernels.py"]
    assert callers == []


def test_behaviour_cache_gives_the_unrolled_beta_and_follows_beta():
    """Once β is trained, a round reads log(β + 1e-5) from the per-episode cache: the same values as
    unrolling β over the padded batch (ragged episodes, padding included), a new cache when β's
    weights change (a checkpoint load), and the unroll for a batch that does not say its episodes."""
    import dataclasses

    cls = get_algorithm("cfcql", discrete=True)
    torch.manual_seed(0)
    algo = cls(SPEC, make_config(cls, TINY), 0)
    bb = algo.backbone
    sampler = EpisodeSampler(ragged(lens=(5, 2, 4, 1, 3, 5, 2, 4)), 0, "cpu")
    algo.update(sampler)  # β trains (3 updates) before the first critic step
    assert bb.behaviour_state["done"]

    def both(batch):
        cached = bb.behaviour_logprob(batch)
        bb.cache_behaviour = False
        unrolled = bb.behaviour_logprob(batch)
        bb.cache_behaviour = True
        return cached, unrolled

    for _ in range(3):
        batch = sampler(4)
        cached, unrolled = both(batch)
        assert cached.shape == unrolled.shape == (4 * batch.max_t, SPEC.n_agents, SPEC.act_dim)
        torch.testing.assert_close(cached, unrolled, rtol=1e-6, atol=1e-6)
    first = bb._behaviour_cache
    assert first is not None and first.valid_for(bb.behaviour, sampler)

    state = {k: v + 0.5 for k, v in bb.behaviour.state_dict().items()}  # another β, loaded in place
    bb.behaviour.load_state_dict(state)
    batch = sampler(4)
    cached, unrolled = both(batch)
    torch.testing.assert_close(cached, unrolled, rtol=1e-6, atol=1e-6)
    assert bb._behaviour_cache is not first

    anonymous = dataclasses.replace(batch, episode_ids=None)
    bb._behaviour_cache = None
    torch.testing.assert_close(bb.behaviour_logprob(anonymous), unrolled)
    assert bb._behaviour_cache is None  # nothing to gather by: unrolled, no cache built


def test_packing_rows_of_a_ragged_batch():
    """Episodes sorted by length (ties in batch order); step t = the episodes with len ≥ t; each row's
    previous hidden state is the same agent's row one step earlier."""
    pk = fast.Packing(torch.tensor([1, 3, 1, 2]), L=4, n=2)  # indices 0..len are real
    assert pk.rows == [8, 8, 4, 2] and pk.offsets == [0, 8, 16, 20] and pk.total == 22
    L, n = 4, 2
    rows = [(int(i) // (L * n), int(i) // n % L, int(i) % n) for i in pk.index]  # (episode, step, agent)
    order = [1, 3, 0, 2]
    assert rows[:8] == [(b, 0, a) for b in order for a in range(2)]
    assert rows[16:] == [(1, 2, 0), (1, 2, 1), (3, 2, 0), (3, 2, 1), (1, 3, 0), (1, 3, 1)]
    for p, q in enumerate(pk.h_prev.tolist(), start=8):  # steps 1..: same episode and agent, one step earlier
        (b, t, a), (b2, t2, a2) = rows[p], rows[q]
        assert (b2, t2, a2) == (b, t - 1, a)
    assert fast.has_padding(torch.tensor([1, 3, 1, 2]), 4) and not fast.has_padding(torch.tensor([2, 2]), 3)


def test_packing_is_built_once_per_batch():
    """The online and the target unroll of one batch share its Packing; another batch (even with equal
    lengths) or another shape gets its own."""
    lens = torch.tensor([1, 3, 1, 2])
    pk = fast.Packing.of(lens, 4, 2)
    assert fast.Packing.of(lens, 4, 2) is pk
    assert fast.Packing.of(lens, 5, 2) is not pk and fast.Packing.of(lens.clone(), 4, 2) is not pk
    fresh = fast.Packing.of(torch.tensor([2, 1]), 3, 2)
    assert fresh.rows == fast.Packing(torch.tensor([2, 1]), 3, 2).rows


def test_real_rows_are_the_indices_up_to_each_length():
    """Observations 0..len (last = 0) or transitions 0..len − 1 (last = −1), flat b·L + t in batch order,
    and scatter_rows puts values back there with zeros elsewhere."""
    lens = torch.tensor([2, 0, 1])
    assert fast.real_rows(lens, 3).tolist() == [0, 1, 2, 3, 6, 7]
    assert fast.real_rows(lens, 2, last=-1).tolist() == [0, 1, 4]
    out = fast.scatter_rows(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([0, 1, 4]), 6)
    assert out.tolist() == [[1.0, 2.0, 0.0, 0.0, 3.0, 0.0]]


@pytest.mark.parametrize("lens", [(5, 2, 4, 1, 3, 5, 2, 4), (5, 5, 5)], ids=["ragged", "full"])
@pytest.mark.parametrize("members", [1, 3])
def test_packed_unroll_matches_the_padded_unroll(lens, members):
    """The fused unroll computes the real observations only: equal outputs there (float64), zeros on the
    padding, and the same gradient for every parameter of a loss that ignores the padding (the
    gradients reach the weights through the packed GRU's hand-written backward)."""
    arrays = ragged(lens=lens)
    batch = EpisodeSampler(arrays, 0, "cpu")(len(lens))
    torch.manual_seed(0)
    agents = [RNNAgent(SPEC.n_agents, SPEC.obs_dim, SPEC.act_dim, hidden=8).double() for _ in range(members)]
    net = StackedRNNAgent(agents).double() if members > 1 else agents[0]
    batch.obs = batch.obs.double()
    real = (torch.arange(batch.max_t + 1)[None] <= batch.lengths[:, None])[:, :, None, None]  # [B, T+1, 1, 1]
    params = list(net.parameters())

    def outputs():
        q = net.unroll(batch)
        return [q * real, *_grads([q * real], params)]

    got, exp = _run_both(net, outputs)
    _close(got, exp)
    q = net.unroll(batch)
    assert (q * ~real == 0).all() and (q * real != 0).any()


@pytest.mark.parametrize("layout", ["steps", "obs"])
@pytest.mark.parametrize("kind", ["value", "dueling", "twin", "twin-shared-head"])
def test_packed_critics_match_the_padded_critics(layout, kind):
    """The per-agent MLP critics with `rows=` (discrete_critics.py): the real rows' values equal the
    padded plain path's (float64), the padding is exactly 0, and a loss that ignores the padding has the
    same gradient for every parameter. Without `rows`, or when every row is real, the fused path
    computes all rows (in-place sums and ReLUs) and equals the plain one everywhere."""
    from plcql_bench.algorithms.common.discrete_critics import AgentMLP, TwinAgentQ, obs_rows, step_rows

    batch = EpisodeSampler(ragged(lens=(5, 2, 4, 1, 3, 5, 2, 4)), 0, "cpu")(8)
    T, n, S, o, A = batch.max_t, SPEC.n_agents, SPEC.state_dim, SPEC.obs_dim, SPEC.act_dim
    L, rows = (T, step_rows(batch)) if layout == "steps" else (T + 1, obs_rows(batch))
    last = 0 if layout == "obs" else -1
    real = (torch.arange(L)[None] <= batch.lengths[:, None] + last)[:, :, None, None]  # [B, L, 1, 1]
    assert 0 < rows.numel() < real.numel() and int(real.sum()) == rows.numel()
    torch.manual_seed(0)
    if kind.startswith("twin"):
        net = TwinAgentQ(S, o, n, A, hidden=16, dueling=True, shared_head=kind.endswith("head")).double()
        run = lambda *a: net.both(*a)  # noqa: E731
    else:
        net = AgentMLP(S, o, n, 1 if kind == "value" else A, hidden=16, dueling=kind == "dueling").double()
        run = lambda *a: (net(*a),)  # noqa: E731
    state, obs = batch.state[:, :L].double(), batch.obs[:, :L].double()
    params = list(net.parameters())

    def masked_grads(out):
        return _grads([torch.where(real, y, torch.zeros_like(y)) for y in out], params)

    got, exp = _run_both(net, lambda: run(state, obs, rows))
    for g, e in zip(got, exp):
        assert g.shape == e.shape == (8, L, n, e.shape[-1])
        assert (g.masked_select(~real) == 0).all()
    _close([torch.where(real, g, 0.0) for g in got], [torch.where(real, e, 0.0) for e in exp])
    _close(*_run_both(net, lambda: masked_grads(run(state, obs, rows))))
    for args in ((state, obs), (state, obs, torch.arange(8 * L))):  # nothing to skip: every row computed
        _close(*_run_both(net, lambda: [*run(*args), *_grads(run(*args), params)]))

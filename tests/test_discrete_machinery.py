"""Shared discrete-action machinery (algorithms/common/discrete.py, datasets/episodes.py): masks,
QMIX, TD(lambda), episode batches, recurrent evaluation and the two-implementation registry."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plcql_bench.algorithms.base import get_algorithm, implementations, load_all, make_config
from plcql_bench.algorithms.common.discrete import (
    NEG, QMixer, RNNAgent, last_action_onehot, masked_argmax, masked_log_softmax, masked_logsumexp,
    masked_sample, masked_softmax, td_lambda_targets)
from plcql_bench.datasets.format import synthetic_dataset
from plcql_bench.datasets.episodes import EpisodeSampler
from plcql_bench.suite.core.spec import TaskSpec

torch.set_num_threads(1)
SPEC = TaskSpec("smax-2s3z", "smax", n_agents=3, obs_dim=7, state_dim=9, act_dim=6, discrete=True,
                episode_limit=10, tiers=("medium", "medium-replay", "expert", "mixed"), score="win_rate")


def random_masks(g: torch.Generator, shape) -> torch.Tensor:
    """Random 0/1 masks over the last axis with every row non-empty; about a third of the rows have
    exactly one available action."""
    m = (torch.rand(shape, generator=g) < 0.5).float()
    single = torch.rand(shape[:-1], generator=g) < 0.35
    only = torch.randint(shape[-1], shape[:-1], generator=g)
    one = torch.nn.functional.one_hot(only, shape[-1]).float()
    m = torch.where(single[..., None], one, m)
    empty = m.sum(-1, keepdim=True) == 0
    return torch.where(empty, one, m)


@pytest.mark.parametrize("trial", range(5))
def test_masks_property(trial):
    g = torch.Generator().manual_seed(trial)
    shape = (64, 4, 9)
    x = torch.randn(shape, generator=g) * 10
    x[..., 0] += 100.0  # the unmasked argmax is often an unavailable action
    avail = random_masks(g, shape)
    a = masked_argmax(x, avail)
    assert (avail.gather(-1, a[..., None]) == 1).all()
    ref = torch.where(avail > 0, x, torch.full_like(x, -1e30)).argmax(-1)
    assert torch.equal(a, ref)
    single = avail.sum(-1) == 1
    assert single.any() and torch.equal(a[single], avail.argmax(-1)[single])
    for _ in range(20):
        s = masked_sample(x * 0.01, avail, g)
        assert (avail.gather(-1, s[..., None]) == 1).all()
    # logsumexp equals the logsumexp over the available subset, row by row
    xr = x.requires_grad_(True)
    lse = masked_logsumexp(xr, avail)
    for idx in np.ndindex(*shape[:-1]):
        sub = x[idx][avail[idx] > 0]
        assert torch.allclose(lse[idx], torch.logsumexp(sub, 0), atol=1e-4)
    lse.sum().backward()
    assert torch.isfinite(xr.grad).all() and (xr.grad[avail == 0] == 0).all()
    p = masked_softmax(x.detach(), avail)
    assert (p[avail == 0] == 0).all() and torch.allclose(p.sum(-1), torch.ones(shape[:-1]))
    lp = masked_log_softmax(x.detach(), avail)
    assert (lp[avail == 0] == NEG).all() and torch.allclose(lp.exp() * avail, p, atol=1e-6)


def test_fully_masked_rows_are_finite():
    x = torch.randn(5, 4, requires_grad=True)
    avail = torch.zeros(5, 4)
    avail[0, 2] = 1
    out = masked_logsumexp(x, avail) + masked_log_softmax(x, avail).sum(-1) + masked_softmax(x, avail).sum(-1)
    assert torch.isfinite(out).all() and (masked_logsumexp(x, avail)[1:] == 0).all()
    (out * torch.tensor([1.0, 0, 0, 0, 0])).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert masked_argmax(x, avail).tolist() == [2, 0, 0, 0, 0]


def test_qmix_monotone_and_counterfactual():
    torch.manual_seed(0)
    mixer = QMixer(n_agents=4, state_dim=6, embed=8, hypernet=16)
    for _ in range(3):
        for p in mixer.parameters():
            p.data.normal_(0, 1)
        qs = (torch.randn(50, 4) * 5).requires_grad_(True)
        s = torch.randn(50, 6)
        q_tot = mixer(qs, s)
        (grad,) = torch.autograd.grad(q_tot.sum(), qs)
        assert (grad >= 0).all() and (grad > 0).any()
    # counterfactual(i, j) equals mixing the explicit joint vector
    q_all = torch.randn(2, 3, 4, 5)  # [B, T, n, A]
    acts = torch.randint(5, (2, 3, 4))
    st = torch.randn(2, 3, 6)
    cf = mixer.counterfactual(q_all, acts, st)
    q_taken = q_all.gather(-1, acts[..., None])[..., 0]
    for i in range(4):
        for j in range(5):
            q = q_taken.clone()
            q[..., i] = q_all[..., i, j]
            assert torch.allclose(cf[..., i, j], mixer(q, st), atol=1e-5)
    many = mixer.mix_many(torch.stack([q_taken, q_taken + 1], -2), st)
    assert torch.allclose(many[..., 0], mixer(q_taken, st), atol=1e-6)


def test_td_lambda_by_hand():
    r = torch.tensor([[1.0, 2.0, 3.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    term = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # ep 0: length 3, terminal
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])  # ep 1: length 4, timeout
    q = torch.tensor([[10.0, 20.0, 30.0, 40.0, 50.0], [5.0, 6.0, 7.0, 8.0, 9.0]])
    g = 0.5
    y0 = td_lambda_targets(r, term, mask, q, g, 0.0)
    assert torch.allclose(y0[0, :3], torch.tensor([1 + g * 20, 2 + g * 30, 3.0]))
    assert torch.allclose(y0[1], torch.tensor([1 + g * 6, 1 + g * 7, 1 + g * 8, 1 + g * 9]))
    y1 = td_lambda_targets(r, term, mask, q, g, 1.0)
    assert torch.allclose(y1[0, :3], torch.tensor([1 + g * 2 + g * g * 3, 2 + g * 3, 3.0]))
    assert torch.allclose(y1[1, 0], torch.tensor(1 + g + g**2 + g**3 + g**4 * 9))
    # lambda = 0.6, episode 1, t = 2: G_3 = 1 + g*9; G_2 = 1 + g*(0.4*8 + 0.6*G_3)
    y = td_lambda_targets(r, term, mask, q, g, 0.6)
    g3 = 1 + g * 9
    assert torch.allclose(y[1, 3], torch.tensor(g3))
    assert torch.allclose(y[1, 2], torch.tensor(1 + g * (0.4 * 8 + 0.6 * g3)))
    # a timeout shorter than the batch bootstraps from its own final value, not the padding
    mask2 = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    y2 = td_lambda_targets(r[:1], torch.zeros(1, 4), mask2, q[:1], g, 0.6)
    assert torch.allclose(y2[0, 1], torch.tensor(2 + g * 30))


def ragged(spec=SPEC, lens=(5, 2, 4, 1, 3), seed=0):
    """A dataset with episodes of the given lengths (odd episodes end in a terminal)."""
    arrays, _ = synthetic_dataset(spec, n_episodes=len(lens), episode_len=max(lens), seed=seed)
    keep = arrays["steps"] < np.asarray(lens)[arrays["episode_ids"]]
    out = {k: v[keep] for k, v in arrays.items()}
    last = np.r_[out["episode_ids"][1:] != out["episode_ids"][:-1], True]
    odd = out["episode_ids"] % 2 == 1
    out["terminals"] = (last & odd).astype(np.uint8)
    out["timeouts"] = (last & ~odd).astype(np.uint8)
    return out


def check_acts_available(algo, envs: int = 16, steps: int = 4) -> None:
    """Greedy acting over `steps` steps of `envs` episodes with random masks (SPEC's 3 agents, 7 obs,
    6 actions) returns int64 [envs, 3] actions that are all available."""
    g = torch.Generator().manual_seed(1)
    algo.begin_episodes(envs)
    for step in range(steps):
        obs = np.random.default_rng(step).normal(size=(envs, 3, 7)).astype(np.float32)
        avail = random_masks(g, (envs, 3, 6)).numpy().astype(np.uint8)
        a = algo.act(obs, avail)
        assert a.shape == (envs, 3) and a.dtype == np.int64
        assert (np.take_along_axis(avail, a[..., None], -1) == 1).all()


def check_seeding_and_resume(build, arrays, tmp_path, warm_updates: int = 2) -> None:
    """Shared by every discrete algorithm's test: the same seed gives identical first metrics and
    parameters, another seed differs; a checkpoint taken after `warm_updates` more rounds (past a
    target update) and loaded into an algorithm built with another seed continues identically."""
    def first(seed):
        torch.manual_seed(123)  # the global RNG must not matter
        algo = build(seed=seed)
        return algo, algo.update(EpisodeSampler(arrays, seed=0))

    def same_params(a, b):
        for key in a.modules():
            for p, q in zip(a.modules()[key].parameters(), b.modules()[key].parameters()):
                assert torch.equal(p, q), key

    a0, m0 = first(0)
    a0b, m0b = first(0)
    _, m1 = first(1)
    assert m0 == m0b and m0 != m1
    same_params(a0, a0b)
    for _ in range(warm_updates):
        a0.update(EpisodeSampler(arrays, seed=1))
    torch.save(a0.state_dict(), tmp_path / "c.pt")
    fresh = build(seed=7)
    fresh.load_state_dict(torch.load(tmp_path / "c.pt", weights_only=False))
    for _ in range(2):
        assert a0.update(EpisodeSampler(arrays, seed=3)) == fresh.update(EpisodeSampler(arrays, seed=3))
    same_params(a0, fresh)


def test_episode_sampler_reconstructs_episodes():
    arrays = ragged()
    s = EpisodeSampler(arrays, seed=0)
    b = s.episodes(torch.tensor([1, 0, 3]))
    assert b.obs.shape == (3, 6, 3, 7) and b.state.shape == (3, 6, 9) and b.avail.shape == (3, 6, 3, 6)
    assert b.actions.shape == (3, 5, 3) and b.actions.dtype == torch.int64 and b.mask.shape == (3, 5)
    assert b.lengths.tolist() == [2, 5, 1]
    assert b.mask.tolist()[0] == [1, 1, 0, 0, 0]
    ids = arrays["episode_ids"]
    for row, e in enumerate([1, 0, 3]):
        sel = np.flatnonzero(ids == e)
        L = len(sel)
        np.testing.assert_array_equal(b.obs[row, :L].numpy(), arrays["obs"][sel])
        np.testing.assert_array_equal(b.obs[row, L].numpy(), arrays["next_obs"][sel[-1]])
        np.testing.assert_array_equal(b.state[row, L].numpy(), arrays["next_state"][sel[-1]])
        np.testing.assert_array_equal(b.avail[row, L].numpy(), arrays["next_avail_actions"][sel[-1]])
        np.testing.assert_array_equal(b.actions[row, :L].numpy(), arrays["actions"][sel])
        np.testing.assert_array_equal(b.rewards[row, :L].numpy(), arrays["rewards"][sel])
        assert b.terminals[row, L - 1] == arrays["terminals"][sel[-1]]
        assert (b.obs[row, L + 1:] == 0).all() and (b.avail[row, L + 1:] == 0).all()
        assert (b.rewards[row, L:] == 0).all() and (b.actions[row, L:] == 0).all()
    # batches: without replacement, seeded, generator state restores the stream
    s2 = EpisodeSampler(arrays, seed=0)
    assert sorted(s2.draw(5).tolist()) == [0, 1, 2, 3, 4]
    st = s.generator.get_state()
    a = s(4)
    s.generator.set_state(st)
    assert torch.equal(s(4).obs, a.obs)


def test_recurrent_agent_step_matches_unroll():
    torch.manual_seed(0)
    agent = RNNAgent(3, 7, 6, hidden=16)
    b = EpisodeSampler(ragged(), seed=0).episodes(torch.tensor([0, 2]))
    full = agent.unroll(b)
    last = last_action_onehot(b.actions, 6)
    h = agent.init_hidden(2)
    real = torch.arange(b.max_t + 1)[None] <= b.lengths[:, None]  # [B, T+1]: indices 0..len
    assert not real.all()  # padding present
    for t in range(b.max_t + 1):
        out, h = agent.step(b.obs[:, t], last[:, t], h)
        assert torch.allclose(out[real[:, t]], full[real[:, t], t], atol=1e-5)
        assert agent.fused and (full[~real[:, t], t] == 0).all()  # the fused unroll skips the padding


def test_registry_two_implementations():
    load_all()
    impl = implementations("cfcql")
    assert impl["continuous"].discrete is False and impl["discrete"].discrete is True
    assert get_algorithm("bc", discrete=True).batch_kind == "episodes"
    assert get_algorithm("bc", discrete=False).discrete is False
    assert get_algorithm("bc") is get_algorithm("bc", discrete=False)
    with pytest.raises(KeyError, match="dof has no discrete-action implementation"):
        get_algorithm("dof", discrete=True)
    from plcql_bench.leaderboard.build import support

    assert support("cfcql", True) == "yes" and support("cfcql", False) == "yes"
    assert support("dof", True) == "no" and support("nonexistent-algo", True) == "unknown"


def test_resolve_config_error_is_one_line():
    from plcql_bench.suite.core.errors import BenchError
    from plcql_bench.suite.runs.profiles import load_profile
    from plcql_bench.suite.runs.runner import Cell, resolve_config

    with pytest.raises(BenchError, match="^dof has no discrete-action implementation$"):
        resolve_config(Cell("dof", "smax-2s3z", "medium", 0), load_profile("smoke"))
    cfg = resolve_config(Cell("bc", "smax-2s3z", "medium", 0), load_profile("smoke"))
    assert cfg.batch_episodes == 128 and cfg.hidden == 64


class _FakeEnv:
    """Two envs; env 0 finishes after 1 step, env 1 after 3; records the actions it receives."""

    def __init__(self, spec):
        self.spec, self.t, self.seen = spec, 0, []

    def _step(self):
        from plcql_bench.suite.core.spec import Step

        n, A = self.spec.n_agents, self.spec.act_dim
        avail = np.zeros((2, n, A), np.uint8)
        avail[:, :, (self.t % 2) + 1] = 1  # a single available action that changes with t
        done = np.array([self.t >= 1, self.t >= 3])
        return Step(obs=np.full((2, n, self.spec.obs_dim), self.t, np.float32),
                    state=np.zeros((2, self.spec.state_dim), np.float32), reward=np.ones(2, np.float32),
                    terminal=done, timeout=np.zeros(2, bool), avail=avail, info={"won": done})

    def reset(self, seeds):
        self.t = 0
        return self._step()

    def step(self, actions):
        self.seen.append((self.t, np.array(actions)))
        self.t += 1
        return self._step()


def test_recurrent_evaluation_protocol():
    from plcql_bench.suite.envs import protocol
    from plcql_bench.suite.core.spec import Task

    cls = get_algorithm("bc", discrete=True)
    algo = cls(SPEC, make_config(cls, {"hidden": 8}), 0)
    envs = []

    def make_env(num):
        envs.append(_FakeEnv(SPEC))
        return envs[-1]

    task = Task(SPEC, make_env)
    calls = []
    begin = lambda num: (calls.append(num), algo.begin_episodes(num))  # noqa: E731
    out = protocol.rollout_returns(task, lambda s: algo.act(s.obs, s.avail), np.arange(2), begin=begin)
    assert calls == [2]
    assert out["returns"].tolist() == [1.0, 3.0] and out["won"].tolist() == [True, True]
    for t, acts in envs[0].seen:  # every action (finished env included) was available
        assert (acts == (t % 2) + 1).all()
    # begin_episodes resets the hidden state: the same episode gives the same actions again
    obs = np.random.default_rng(0).normal(size=(4, 3, 7)).astype(np.float32)
    av = np.ones((4, 3, 6), np.uint8)
    algo.begin_episodes(4)
    first = [algo.act(obs, av) for _ in range(3)]
    algo.begin_episodes(4)
    again = [algo.act(obs, av) for _ in range(3)]
    assert all((a == b).all() for a, b in zip(first, again))
    h_after = algo._h.clone()
    algo.begin_episodes(4)
    assert (algo._h == 0).all() and not torch.equal(h_after, algo._h)

"""Discrete-action algorithms (bc, cfcql, macql on SMAX/SMAC): training, masks, CF-CQL by hand,
λ weights, seeding and resume, per-map tables, and an end-to-end run on a smoke SMAX dataset."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from plcql_bench.algorithms.base import get_algorithm, make_config
from plcql_bench.algorithms.common.discrete import masked_logsumexp, masked_uniform_sample
from plcql_bench.datasets.episodes import EpisodeSampler
from plcql_bench.suite.core.spec import TaskSpec

from test_discrete_machinery import SPEC, check_acts_available, check_seeding_and_resume, ragged, random_masks

torch.set_num_threads(1)
DISCRETE = ["bc", "cfcql", "macql"]
TINY = {"batch_episodes": 4, "hidden": 8}
EXTRA = {"cfcql": {"mixing_embed": 4, "hypernet_embed": 8, "behaviour_max_updates": 3, "softmax_temp": 1.0,
                   "target_update_interval": 2},
         "macql": {"mixing_embed": 4, "hypernet_embed": 8, "n_sampled_actions": 7, "target_update_interval": 2}}


def build(name, seed=0, spec=SPEC, **over):
    cls = get_algorithm(name, discrete=True)
    return cls(spec, make_config(cls, {**TINY, **EXTRA.get(name, {}), **over}), seed)


@pytest.fixture(scope="module")
def arrays():
    return ragged(lens=(5, 2, 4, 1, 3, 5, 2, 4))


@pytest.mark.parametrize("name", DISCRETE)
def test_trains_finite_and_acts_available(name, arrays):
    algo = build(name)
    assert algo.discrete is True and algo.batch_kind == "episodes"
    s = EpisodeSampler(arrays, seed=0)
    params0 = [p.detach().clone() for p in algo.policy_agent().parameters()]
    for _ in range(3):
        m = algo.update(s)
        assert m and all(isinstance(v, float) and math.isfinite(v) for v in m.values()), m
    assert any(not torch.equal(a, b) for a, b in zip(params0, algo.policy_agent().parameters()))
    check_acts_available(algo)


def test_bc_learns_the_data(arrays):
    algo = build("bc", lr=1e-2, hidden=32, batch_episodes=8)
    s = EpisodeSampler(arrays, seed=0)
    first = algo.update(s)["bc/cross_entropy"]
    for _ in range(60):
        last = algo.update(s)["bc/cross_entropy"]
    assert last < 0.6 * first


def test_cfcql_penalty_by_hand(arrays):
    algo = build("cfcql", softmax_temp=0.0)
    assert algo.backbone.behaviour is None  # temp 0: uniform λ, no behaviour model
    b = EpisodeSampler(arrays, seed=0)(4)
    T = b.max_t
    with torch.no_grad():
        q = algo.backbone.critic.unroll(b)[:, :T]
        q_taken = q.gather(-1, b.actions[..., None])[..., 0]
        q_tot = algo.backbone.mixer(q_taken, b.state[:, :T])
        pen = algo.backbone.cql_penalty(b, q[None], q_tot[None])[0][0]  # one member
        n, A = SPEC.n_agents, SPEC.act_dim
        expect = torch.zeros_like(q_tot)
        for i in range(n):
            vals = []
            for j in range(A):
                qq = q_taken.clone()
                qq[..., i] = q[..., i, j]
                vals.append(algo.backbone.mixer(qq, b.state[:, :T]))
            vals = torch.stack(vals, -1)  # [B, T, A]
            av = b.avail[:, :T, i]
            lse = torch.where(av.sum(-1) > 0,
                              torch.logsumexp(vals.masked_fill(av == 0, float("-inf")), -1), torch.zeros(()))
            expect += lse / n
        expect -= q_tot
    m = b.mask > 0
    assert torch.allclose(pen[m], expect[m], atol=1e-4)


def test_behaviour_trains_for_the_reference_timestep_budget(arrays):
    """β trains until its batches held `behaviour_timesteps` sampled timesteps, counted as the
    reference counts them (L + 1 filled entries per episode), with no early stop, before the first
    Q step; the update count is in the metrics."""
    budget = 600
    algo = build("cfcql", softmax_temp=1.0, behaviour_max_updates=0, behaviour_timesteps=budget)
    m = algo.update(EpisodeSampler(arrays, seed=0))
    replay, seen, expect = EpisodeSampler(arrays, seed=0), 0, 0  # the same batches, drawn again
    while seen < budget:
        seen += int((replay(4).lengths + 1).sum())
        expect += 1
    assert expect > 20  # well past the old 20-step patience: no early stop
    assert m["behaviour/updates"] == expect and m["behaviour/timesteps"] == seen
    st = algo.backbone.behaviour_state
    assert st == {**st, "updates": expect, "timesteps": seen, "done": True}
    assert build("cfcql").cfg.behaviour_timesteps == 10_000_000  # max_behaviour_train_steps
    assert build("cfcql").cfg.behaviour_max_updates == 3 and get_algorithm("cfcql", discrete=True).Config().behaviour_max_updates == 0


def test_cfcql_lambda_from_behaviour(arrays):
    s = EpisodeSampler(arrays, seed=0)
    algo = build("cfcql", softmax_temp=1.0, behaviour_max_updates=50)
    m = algo.update(s)
    assert m["behaviour/updates"] == 50 and algo.backbone.behaviour_state["done"]
    steps = algo.backbone.behaviour_state["updates"]
    algo.update(s)
    assert algo.backbone.behaviour_state["updates"] == steps  # trained once, before the first Q step
    b = s(4)
    T = b.max_t
    with torch.no_grad():
        q = algo.backbone.critic.unroll(b)[:, :T]
        cf = algo.backbone.mixer.counterfactual(q, b.actions, b.state[:, :T])
        lam = algo.backbone.cf_weights(cf[None], b)[0]  # one member
        assert torch.allclose(lam.sum(-1), torch.ones(lam.shape[:-1]))
        algo.cfg.softmax_temp = 100.0
        hard = algo.backbone.cf_weights(cf[None], b)[0]
        assert ((hard == 0) | (hard == 1)).all() and (hard.sum(-1) == 1).all()


def test_macql_samples_only_available():
    g = torch.Generator().manual_seed(0)
    avail = random_masks(g, (40, 3, 9))
    idx = masked_uniform_sample(avail, 500, g)  # [40, 3, 500]
    assert (avail.gather(-1, idx) == 1).all()
    counts = torch.nn.functional.one_hot(idx, 9).sum(-2).float()  # [40, 3, 9]
    freq = counts / 500
    expect = avail / avail.sum(-1, keepdim=True)
    assert (freq - expect).abs().max() < 0.12
    assert torch.isfinite(masked_logsumexp(torch.randn(40, 3, 9), avail)).all()


@pytest.mark.parametrize("name", DISCRETE)
def test_seeding_and_resume(name, arrays, tmp_path):
    check_seeding_and_resume(lambda seed: build(name, seed=seed), arrays, tmp_path)


def test_reward_scale_multiplies_only_the_rewards(arrays):
    """SMAX rewards x reward_scale reach every reward-learning algorithm's update, nothing else
    changes: a CFCQL update on rewards r with scale 10 equals one on rewards 10 r with scale 1."""
    s1, s2 = EpisodeSampler(arrays, seed=0), EpisodeSampler(arrays, seed=0)
    big = build("cfcql", reward_scale=1.0)
    scaled = build("cfcql", reward_scale=10.0)
    m_scaled = scaled.update(s1)
    m_big = big.update(lambda n: _times(s2(n), 10.0))
    assert m_scaled == m_big
    b = EpisodeSampler(arrays, seed=0)(4)
    assert torch.equal(scaled.scaled(b).rewards, b.rewards * 10.0) and scaled.scaled(b).obs is b.obs
    assert build("cfcql", bootstrap_timeouts=True).scaled(b) is b  # scale 1 (TINY) and no timeout change


def _times(batch, c):
    from dataclasses import replace

    return replace(batch, rewards=batch.rewards * c)


def test_tables():
    cf = get_algorithm("cfcql", discrete=True)
    mk = lambda tid: TaskSpec(tid, tid.split("-")[0], 5, 7, 9, 11, True, 10, ("medium",))  # noqa: E731
    assert cf.task_overrides(mk("smax-2s3z"), "medium") == {"cql_alpha": 0.1, "softmax_temp": 0.5, "reward_scale": 10.0}
    assert cf.task_overrides(mk("smac-2s3z"), "mixed") == {"cql_alpha": 0.5, "softmax_temp": 0.0}
    assert cf.task_overrides(mk("smax-5m_vs_6m"), "expert") == {"cql_alpha": 50.0, "softmax_temp": 100.0,
                                                                 "reward_scale": 10.0}
    # td_lambda 0.6 on every map: the README's command sets none (configs/cfcql_discrete.yaml)
    assert "td_lambda" not in cf.task_overrides(mk("smax-6h_vs_8z"), "medium") and cf.Config().td_lambda == 0.6
    assert "reward_scale" not in cf.task_overrides(mk("smac-6h_vs_8z"), "medium")  # SC2: already at scale
    mc = get_algorithm("macql", discrete=True)
    assert mc.Config().cql_alpha == 5.0 and mc.task_overrides(mk("smax-2s3z"), "medium") == {"reward_scale": 10.0}
    assert mc.task_overrides(mk("smax-6h_vs_8z"), "expert") == {"reward_scale": 10.0}
    for name in ("bc", "madtkd"):  # no reward learning (MADTKD scales its return token itself)
        assert "reward_scale" not in get_algorithm(name, discrete=True).task_overrides(mk("smax-2s3z"), "medium")
    for name in ("cfcql", "macql", "maicq", "omar", "iql", "awac", "spacql", "plcql", "plcql-k1"):
        cls = get_algorithm(name, discrete=True)
        assert cls.task_overrides(mk("smax-3s_vs_5z"), "expert")["reward_scale"] == 10.0, name
        assert "reward_scale" not in cls.task_overrides(mk("smac-3s_vs_5z"), "expert"), name
    for name in DISCRETE:
        cls = get_algorithm(name, discrete=True)
        for tid in ("smax-2s3z", "smax-3s_vs_5z", "smax-5m_vs_6m", "smax-6h_vs_8z", "smac-6h_vs_8z"):
            for tier in ("medium", "medium-replay", "expert", "mixed"):
                make_config(cls, cls.task_overrides(mk(tid), tier))


TINY_PROFILE = """
name: tinysmax
description: test profile
datasets:
  episodes: {default: 6}
train:
  updates: {default: 2}
  eval_every: 2
  eval_episodes: 2
  final_eval_episodes: 3
  checkpoint_every: 2
matrix:
  algos: [bc, cfcql]
  tasks: [smax-2s3z]
  tiers: [medium]
  seeds: [0]
algo_overrides: {batch_episodes: 4, hidden: 16, behaviour_max_updates: 2}
"""


def test_end_to_end_smax(tmp_path):
    pytest.importorskip("jaxmarl")
    profile = tmp_path / "tiny.yaml"
    profile.write_text(TINY_PROFILE)
    base = [sys.executable, "-m", "plcql_bench.suite.commands.main", "--data-dir", str(tmp_path / "data"),
            "--results-dir", str(tmp_path / "results")]
    for args in (["datasets", "build", "smax-2s3z", "medium", "--profile", str(profile)],
                 ["all", "--profile", str(profile)]):
        proc = subprocess.run(base + args, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    finals = {json.loads(p.read_text())["algo"]: json.loads(p.read_text())
              for p in (tmp_path / "results").rglob("final.json")}
    assert set(finals) == {"bc", "cfcql"}
    for f in finals.values():
        ev = f["final_eval"]
        assert f["score_name"] == "win_rate" and ev["episodes"] == 3
        assert ev["win_rate"] is not None and 0.0 <= ev["win_rate"] <= 1.0 and f["score"] == ev["win_rate"]
        assert [p["update"] for p in f["curve"]] == [0, 2]
    assert finals["cfcql"]["config"]["cql_alpha"] == 0.1 and finals["cfcql"]["config"]["softmax_temp"] == 0.5


@pytest.mark.parametrize("name", DISCRETE)
def test_every_round_reports_the_same_metrics(name, arrays):
    algo = build(name)
    s = EpisodeSampler(arrays, seed=0)
    keys = [set(algo.update(s)) for _ in range(3)]
    assert keys[0] == keys[1] == keys[2]

"""PLCQL's PAR learning against Algorithm 1: one PAR update per critic batch, with that batch's k;
the fixed/uniform variants; the LCB reward; the probe diagnostics and the collapse warning."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from unit_runs import profile_with_dataset
import torch

from plcql_bench.algorithms.base import Batch, load_all, make_config
from plcql_bench.algorithms.plcql import PLCQL, collapse_warnings, par_collapse, par_reward_terms
from plcql_bench.suite.runs.runner import Cell, execute, plan_run
from plcql_bench.suite.core.schema import CURVE_KEYS, float32_digits
from plcql_bench.suite.core.spec import TaskSpec

torch.set_num_threads(1)
TOY = TaskSpec("toy", "mpe", n_agents=3, obs_dim=2, state_dim=4, act_dim=1, discrete=False,
               episode_limit=5, tiers=("expert",))


def _algo(name="plcql", **over):
    cls = load_all()[name]
    return cls(TOY, make_config(cls, {"n_critics": 3, "hidden": 8, "batch_size": 16, **over}), 0)


class CountingSampler:
    """Batch u of a round has next_state filled with u + offset, so a PAR update can be traced to it."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, B: int) -> Batch:
        g = torch.Generator().manual_seed(self.calls)
        tag = float(self.calls)
        self.calls += 1
        return Batch(obs=torch.randn(B, 3, 2, generator=g), state=torch.randn(B, 4, generator=g),
                     actions=torch.rand(B, 3, 1, generator=g) * 2 - 1, rewards=torch.randn(B, generator=g),
                     next_obs=torch.randn(B, 3, 2, generator=g), next_state=torch.full((B, 4), tag),
                     next_actions=torch.rand(B, 3, 1, generator=g) * 2 - 1, next_actions_valid=torch.ones(B),
                     terminals=torch.zeros(B))


def _trace_par(algo, monkeypatch):
    """Records (batch tag, k drawn for that batch's target) at every compute_target and every PAR step."""
    drawn, updated = [], []
    real_target, real_step = algo.compute_target, algo.par.step

    def target(batch):
        y, aux = real_target(batch)
        drawn.append((float(batch.next_state[0, 0]), aux["k"].clone()))
        return y, aux

    def step(next_state, k, logp_old, r_par, m, steps=None):
        updated.append((float(next_state[0, 0]), k.clone()))
        return real_step(next_state, k, logp_old, r_par, m, steps)

    monkeypatch.setattr(algo, "compute_target", target)
    monkeypatch.setattr(algo.par, "step", step)
    return drawn, updated


def test_par_updates_once_per_critic_batch_with_its_own_k(monkeypatch):
    """Algorithm 1: every critic step is followed by a V and a PPO update on the same batch, with the k
    drawn for that batch's target (the default, `par_updates: every-batch`)."""
    algo = _algo()
    assert algo.cfg.par_updates == "every-batch" and algo.cfg.ca_ratio == 5
    drawn, updated = _trace_par(algo, monkeypatch)
    m = algo.update(CountingSampler())
    assert [t for t, _ in updated] == [0.0, 1.0, 2.0, 3.0, 4.0]
    for (t_d, k_d), (t_u, k_u) in zip(drawn, updated):
        assert t_d == t_u and torch.equal(k_d, k_u)
    assert {"par/value_loss", "ppo/loss", "par/r_par"} <= set(m)


def test_first_batch_schedule_updates_par_once(monkeypatch):
    algo = _algo(par_updates="first-batch")
    drawn, updated = _trace_par(algo, monkeypatch)
    algo.update(CountingSampler())
    assert len(drawn) == 5 and [t for t, _ in updated] == [0.0]
    assert torch.equal(updated[0][1], drawn[0][1])


def test_fixed_and_uniform_k_do_not_learn(monkeypatch):
    for name, n_updates in (("plcql-kn", 0), ("plcql-k2", 0), ("plcql-uniform", 0), ("plcql", 5)):
        algo = _algo(name)
        drawn, updated = _trace_par(algo, monkeypatch)
        algo.update(CountingSampler())
        assert len(updated) == n_updates, name
        ks = torch.cat([k for _, k in drawn])
        if name == "plcql-kn":
            assert (ks == 3).all()
        if name == "plcql-k2":
            assert (ks == 2).all()
    uniform = _algo("plcql-uniform")
    k, logp, probs = uniform.par.sample_k(torch.zeros(30000, 4), uniform.gen)
    assert torch.allclose(torch.bincount(k, minlength=4)[1:].float() / 30000, torch.full((3,), 1 / 3), atol=0.02)
    assert torch.allclose(logp, torch.full_like(logp, -math.log(3)))


def test_lcb_reward_by_hand():
    """This suite's variant: D_j = Q_j(s', a'^(k)) - Q_j(s', a'_D); r_par = mean_j D_j - beta * sqrt(Var_j D_j);
    the disagreement every k shares (about the state's value) cancels; w is reported as 1."""
    cfg = make_config(load_all()["plcql-lcb"], {"lcb_beta": 2.0})
    q = torch.tensor([[4.0, 1.0], [5.0, 1.0], [6.0, 1.0]])
    q_data = torch.tensor([[3.0, 0.0], [5.0, 2.0], [5.0, 4.0]])  # D = [[1, 1], [0, -1], [1, -3]]
    r, u, w = par_reward_terms(q, cfg, q_data)
    u0, u1 = math.sqrt(2 / 9), math.sqrt(((1 + 1) ** 2 + (-1 + 1) ** 2 + (-3 + 1) ** 2) / 3)
    torch.testing.assert_close(u, torch.tensor([u0, u1]))
    torch.testing.assert_close(r, torch.tensor([2 / 3 - 2 * u0, -1.0 - 2 * u1]))
    assert torch.equal(w, torch.ones(2))
    shifted = q_data + torch.tensor([[10.0], [-7.0], [3.0]])  # a per-member offset shared with q
    r2, u2, _ = par_reward_terms(q + torch.tensor([[10.0], [-7.0], [3.0]]), cfg, shifted)
    torch.testing.assert_close((r2, u2), (r, u))


def test_advantage_normalisations_by_hand():
    """"advantage": (A - mean A) / std A; "reward": (A - mean A) / std r_par; "none": A. Masked rows
    (m = 0) take no part in the statistics."""
    adv = torch.tensor([1.0, 3.0, 100.0])
    r_par = torch.tensor([10.0, 14.0, -50.0])
    m = torch.tensor([1.0, 1.0, 0.0])
    got = {norm: _algo(advantage_norm=norm).par.normalised_advantage(adv, r_par, m) for norm in ("advantage", "reward", "none")}
    torch.testing.assert_close(got["advantage"][:2], torch.tensor([-1.0, 1.0]))  # mean 2, std 1
    torch.testing.assert_close(got["reward"][:2], torch.tensor([-0.5, 0.5]))  # std of r_par over rows 0-1: 2
    assert torch.equal(got["none"], adv)


def test_diagnostics_leave_training_untouched():
    """Two copies updated identically; one gets a diagnostics call between rounds: same parameters
    afterwards (the probe has its own generator and the actors' running statistics are restored)."""
    a, b = _algo(), _algo()
    probe = CountingSampler()(64)
    sa, sb = CountingSampler(), CountingSampler()
    for _ in range(2):
        a.update(sa)
        b.update(sb)
        d = a.diagnostics(probe)
    for name, mod in a.modules().items():  # parameters and buffers (running statistics) alike
        for (key, va), vb in zip(mod.state_dict().items(), b.modules()[name].state_dict().values()):
            assert torch.equal(va, vb), f"{name}.{key}"
    assert torch.equal(a.gen.get_state(), b.gen.get_state())
    assert {f"diag/{x}_k{k}" for x in ("q1", "qmean", "u", "w", "rpar", "dmean", "dstd", "p")
            for k in (1, 2, 3)} <= set(d)
    assert abs(sum(d[f"diag/p_k{k}"] for k in (1, 2, 3)) - 1) < 1e-5


def test_diagnostics_per_k_by_hand(monkeypatch):
    """A fake online critic: member j returns (j + 1) * (number of replaced agents). Per k the probe
    values are then Q_1 = k, mean = 2k, u = k sqrt(2/3), w = sigmoid(-u T) + 0.5, r_par = w k."""
    algo = _algo(n_critics=3)
    coefs = torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1)
    # replaced agents play 1, the data plays 0
    monkeypatch.setattr(algo, "replacement_actions", lambda obs, gen: torch.ones(obs.shape[0], 3, 1))

    def fake_critic(state, actions, members=None):
        return coefs * actions.sum(-1).unsqueeze(0)

    algo.critic = fake_critic
    probe = CountingSampler()(32)
    probe.next_actions = torch.zeros_like(probe.next_actions)
    d = algo.diagnostics(probe)
    for k in (1, 2, 3):
        u = k * math.sqrt(2 / 3)
        w = 1 / (1 + math.exp(u)) + 0.5
        assert d[f"diag/q1_k{k}"] == pytest.approx(k) and d[f"diag/qmean_k{k}"] == pytest.approx(2 * k)
        assert d[f"diag/u_k{k}"] == pytest.approx(u, rel=1e-5) and d[f"diag/w_k{k}"] == pytest.approx(w, rel=1e-5)
        assert d[f"diag/rpar_k{k}"] == pytest.approx(w * k, rel=1e-5)
        # the dataset's next action (all zeros) is worth 0 to every member: the improvement is Q itself
        assert d[f"diag/dmean_k{k}"] == pytest.approx(2 * k) and d[f"diag/dstd_k{k}"] == pytest.approx(u, rel=1e-5)


def test_diagnostics_lowest_and_highest_member(monkeypatch):
    """Member j of a fake critic values every joint action at (j + 1) x the sum of its actions: with the
    dataset's next actions all ones (3 agents), the members' mean Qs at (s', a'_D) are 3, 6 and 9."""
    algo = _algo(n_critics=3)
    coefs = torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1)
    algo.critic = lambda state, actions, members=None: coefs * actions.sum(-1).unsqueeze(0)
    probe = CountingSampler()(32)
    probe.next_actions = torch.ones_like(probe.next_actions)
    d = algo.diagnostics(probe)
    assert d["diag/q_member_min"] == pytest.approx(3.0) and d["diag/q_member_max"] == pytest.approx(9.0)


def _history(p_last: list[float], n_points=10, collapsed_from=8):
    """n_points evaluation points; from `collapsed_from` on, pi_par's marginal is p_last."""
    out = []
    for i in range(n_points):
        p = p_last if i >= collapsed_from else [1 / 3] * 3
        ent = -sum(x * math.log(x) for x in p if x > 0)
        out.append({"update": i * 10, **{f"diag/p_k{k + 1}": p[k] for k in range(3)},
                    "diag/par_marginal_entropy": ent})
    return out


def test_collapse_rule():
    collapsed = _history([0.0, 0.001, 0.999])
    info = par_collapse(collapsed, learned=True)
    assert info["k"] == 3 and info["p_k"] == pytest.approx(0.999)
    warnings, _ = collapse_warnings(collapsed, True, 3)
    assert len(warnings) == 1 and "PAR collapsed to k = n" in warnings[0]
    assert par_collapse(collapsed, learned=False) is None  # a fixed k is no collapse
    assert par_collapse(_history([0.0, 0.001, 0.999], collapsed_from=9), True) is None  # only the last 10 %
    assert par_collapse(_history([0.2, 0.3, 0.5]), True) is None
    assert par_collapse([{"update": 0}], True) is None  # no diagnostics logged


def test_collapse_rule_ignores_a_single_spike():
    """A CN random run (p(k = 3) >= 0.985 at each of its last 120 evaluation points) had one point at
    entropy 0.063 and was recorded as not collapsed; >= 90 % of the tail below the threshold counts."""
    history = _history([0.0, 0.001, 0.999], n_points=50, collapsed_from=10)
    history[45].update({"diag/p_k1": 0.01, "diag/p_k2": 0.01, "diag/p_k3": 0.98, "diag/par_marginal_entropy": 0.112})
    info = par_collapse(history, True)
    assert info["k"] == 3 and info["p_k"] == pytest.approx((9 * 0.999 + 0.98) / 10)
    assert info["entropy"] < 0.05  # the tail's median, not the spike
    history[47]["diag/par_marginal_entropy"] = 0.2  # two of the ten points above: no longer 'stayed below'
    assert par_collapse(history, True) is None


PROFILE = """
name: unit
description: PLCQL collapse warning
datasets: {episodes: {default: 6}}
train: {updates: {default: 10}, eval_every: 2, eval_episodes: 1, final_eval_episodes: 1, checkpoint_every: 10}
matrix: {algos: [plcql], tasks: [mpe-cn], tiers: [random], seeds: [0]}
algo_overrides: {batch_size: 32, n_critics: 2, hidden: 16, par_lr: 0.0}
"""


@pytest.fixture(scope="module")
def unit(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("collapse")
    return profile_with_dataset(tmp, PROFILE)


def test_collapse_warning_in_final_json(unit, monkeypatch):
    """pi_par pinned to k = n (huge bias, lr 0) is flagged in final.json and the run log; the uniform
    ablation, with the same schedule, is not."""
    tmp, profile = unit
    real_init = PLCQL.__init__

    def pinned(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        with torch.no_grad():
            self.par.policy.out.bias[..., -1] = 50.0

    monkeypatch.setattr(PLCQL, "__init__", pinned)
    logs: list[str] = []
    res = {}
    for algo in ("plcql", "plcql-uniform"):
        plan = plan_run(Cell(algo, "mpe-cn", "random", 0), profile, tmp / "data", tmp / "results")
        res[algo] = execute(plan, log=logs.append)
        on_disk = json.loads(Path(plan.final_path).read_text())
        assert on_disk.get("warnings", []) == res[algo].get("warnings", [])  # an empty list is not written
        lines = [json.loads(x) for x in (plan.run_dir / "metrics.jsonl").read_text().splitlines()]
        assert len(lines) == 6 and all("diag/par_marginal_entropy" in x for x in lines)
        # training and diagnostic values are written at float32 precision (schema.float32_digits), the curve exactly
        assert all(float32_digits(v) == v for x in lines for k, v in x.items() if k not in CURVE_KEYS)
        assert [{k: x[k] for k in CURVE_KEYS} for x in lines] == on_disk["curve"]
    assert res["plcql"]["par_collapse"]["k"] == 3 and "PAR collapsed to k = n" in res["plcql"]["warnings"][0]
    assert any("WARNING" in line and "PAR collapsed" in line for line in logs)
    assert not res["plcql-uniform"].get("warnings") and not res["plcql-uniform"].get("par_collapse")


def test_reproduction_table_from_result_files(tmp_path):
    """The study table: seeds, the six views (final = the recorded score; last 10 / best from the curve;
    OMAR's scale from the returns) and the PAR collapse count, from valid result files only."""
    from lb_fixtures import write_run

    from plcql_bench.leaderboard.reproduction import collect, markdown

    root = tmp_path / "results"
    learned = {"lr": 0.001, "fixed_k": None}
    write_run(root, "plcql", "mpe-cn", "random", 0, 40.0, par_collapse={"k": 3, "entropy": 0.01, "p_k": 0.99},
              warnings=["PAR collapsed to k = n"], config=learned)
    write_run(root, "plcql", "mpe-cn", "random", 1, 60.0, par_collapse=None, config=learned)
    write_run(root, "cfcql", "mpe-cn", "random", 0, 50.0)
    (root / "paper" / "cfcql" / "mpe-cn" / "random" / "seed9-broken").mkdir(parents=True)
    (root / "paper" / "cfcql" / "mpe-cn" / "random" / "seed9-broken" / "final.json").write_text("{")
    table = collect(root / "paper", ["mpe-cn/random"], ["cfcql", "plcql"])
    runs = table["mpe-cn/random"]["plcql"]
    assert [r["final-ours"] for r in runs] == [40.0, 60.0] and [r["best-ours"] for r in runs] == [40.0, 60.0]
    assert runs[0]["final-omar"] == pytest.approx(100 * (40.0 - 159.8) / (516.8 - 159.8))
    assert [r["collapsed"] for r in runs] == [True, False] and table["mpe-cn/random"]["cfcql"][0]["collapsed"] is None
    text = markdown(table)
    assert "| plcql | 2 | 50.0 ± 14.1 |" in text and "| 1 of 2 |" in text and "| cfcql | 1 | 50.0 |" in text


def test_study_table_gives_late_expected_k_and_probe_q():
    """E[k] = Σ k·p_k and the probe's Q_θ1 at k = 1, averaged over the last 20 % of the points that carry
    them (early points and points without PAR diagnostics do not count); none for a baseline."""
    from plcql_bench.leaderboard.reproduction import late_par

    early = [{"diag/p_k1": 1.0, "diag/p_k2": 0.0, "diag/p_k3": 0.0, "diag/q1_k1": 0.0}] * 8
    late = [{"diag/p_k1": 0.0, "diag/p_k2": 0.5, "diag/p_k3": 0.5, "diag/q1_k1": q} for q in (10.0, 20.0)]
    got = late_par(early + [{"eval/score": 1.0}] + late)
    assert got["E_k"] == pytest.approx(2.5) and got["q_probe"] == pytest.approx(15.0)
    assert late_par([{"eval/score": 1.0}]) == {"E_k": None, "q_probe": None}


def test_leaderboard_recomputes_a_collapse_missing_from_older_files(tmp_path):
    """Runs finished under the old all-points rule have no par_collapse in final.json although their
    metrics.jsonl shows one: the leaderboard (and the study table) recompute it, and say so."""
    import json as _json

    from lb_fixtures import write_run

    from plcql_bench.leaderboard.load import load
    from plcql_bench.leaderboard.reproduction import collect

    history = _history([0.0, 0.001, 0.999], n_points=50, collapsed_from=10)
    history[45]["diag/par_marginal_entropy"] = 0.063  # the spike that hid the collapse
    metrics = "".join(_json.dumps(h) + "\n" for h in history)
    write_run(tmp_path, "plcql", "mpe-cn", "random", 0, 60.0, config={"fixed_k": None}, metrics=metrics)
    write_run(tmp_path, "plcql-kn", "mpe-cn", "random", 0, 55.0, config={"fixed_k": 3}, metrics=metrics)
    runs = {r.rec.algo: r.rec for r in load(tmp_path).runs}
    assert runs["plcql"].par_collapse["k"] == 3 and "recomputed" in runs["plcql"].par_collapse["source"]
    assert runs["plcql-kn"].par_collapse is None  # a fixed k is no collapse
    table = collect(tmp_path, ["mpe-cn/random"], ["plcql", "plcql-kn"])["mpe-cn/random"]
    assert table["plcql"][0]["collapsed"] is True and table["plcql-kn"][0]["collapsed"] is None

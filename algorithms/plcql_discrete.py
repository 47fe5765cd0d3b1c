"""PLCQL, discrete actions (SMAX/SMAC), Algorithm 1 of the paper on CFCQL-discrete's backbone.
See docs/algorithms/plcql.md, "Discrete (SMAX/SMAC)".

Backbone: QMIX + TD(λ) + counterfactual CQL with the per-map cql_alpha/softmax_temp
(configs/cfcql_discrete.yaml), with an ensemble of `n_critics` = 10 QMIX value functions (GRU agent +
mixer per member, stacked; the family's backbone with its critic update, algorithms/common/discrete_ensemble.py). Per update round (one gradient
step on 128 episodes, as CFCQL-discrete):

  * PAR policy π_par(k | s') (MLP 64x64 on the global state -> categorical over k = 1..n) draws one k
    for every observation index t' of every episode (s' = s_t', the bootstrap state of step t'-1);
    k agents chosen uniformly take the current policy's greedy AVAILABLE action (argmax of the mean of
    the online members' individual Qs), the others keep the dataset's action a_t'. At the final next
    observation (no a_t' in the data) every agent is replaced, whatever k;
  * bootstrap values Q(t') = min_j Qbar_tot,j(s_t', a'^(k)_t') (target agents + target mixers), and
    y = TD(λ) returns over them (exactly CFCQL-discrete's recursion; PAR only changes the bootstrap
    joint action);
  * r_par = (σ(−u_Q T) + 0.5) · Q_tot,1(s_t', a'^(k)_t'), u_Q = sqrt(Var_j) (population variance, Algorithm 1
    line 189) over the ONLINE members at the same point, before the round's gradient step (detached);
  * value baseline V(s') (MLP 64x64, MSE to r_par) and PPO (clipped surrogate, advantage r_par − V,
    ratio against the π_par that drew k) on the indices whose dataset action is known (1 <= t' < len:
    elsewhere k has no effect).
One critic step per round, so π_par and V update once per critic step, as Algorithm 1.
Variants (registered for discrete tasks too, as the continuous PLCQL's): `fixed_k` (1, 2, "n", "uniform"),
`uncertainty_weight` (False -> w = 1), `temperature`, `par_reward` ("lcb", this suite's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from plcql_bench.algorithms.base import EpisodeBatch, register, register_variant
from plcql_bench.algorithms.common.continuous import host_floats
from plcql_bench.algorithms.common.discrete import DiscreteAlgorithm, masked_mean, td_lambda_targets
from plcql_bench.algorithms.common.discrete_ensemble import (
    ENSEMBLE_LEGACY_KEYS, CFCQLBackbone, EnsembleConfig, MeanQPolicy, next_action_data, uses_behaviour)
from plcql_bench.algorithms.plcql import PAR_LEGACY_KEYS, PAR_VARIANTS, Par, ParConfig, par_probe_stats, probe_terms
from plcql_bench.suite.core.spec import TaskSpec


@dataclass
class Config(EnsembleConfig, ParConfig):
    """CFCQL-discrete's ensemble settings and the PAR settings of the continuous PLCQL."""


@register
class PLCQLDiscrete(DiscreteAlgorithm):
    name = "plcql"
    Config = Config
    table = "cfcql_discrete"  # CFCQL-discrete's per-map cql_alpha / softmax_temp
    legacy_keys = {**ENSEMBLE_LEGACY_KEYS, **PAR_LEGACY_KEYS}

    def __init__(self, spec: TaskSpec, config: Config, seed: int, device: str = "cpu") -> None:
        super().__init__(spec, config, seed, device)
        self.backbone = CFCQLBackbone(self, config.n_critics, stacked=True, use_behaviour=uses_behaviour(config),
                                      block_mb=config.cf_block_mb)
        # the PAR component (plcql.Par), its parameters from their own generator
        self.par = Par(config, self.n, spec.state_dim, torch.Generator().manual_seed(self.seed * 1000 + 7),
                       self.device)

    def modules(self) -> dict[str, nn.Module]:
        return {**self.backbone.modules(), **self.par.modules()}

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return {**self.backbone.optimisers(), **self.par.optimisers()}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "behaviour_state": dict(self.backbone.behaviour_state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.backbone.behaviour_state = dict(state["behaviour_state"])

    def policy_agent(self) -> MeanQPolicy:
        return self.backbone.policy

    # -- targets --------------------------------------------------------------------------------
    @torch.no_grad()
    def par_joint_actions(self, batch: EpisodeBatch, q_all: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """k ~ π_par(.|s_t') at every index and a'^(k) [B, T+1, n]."""
        B, T1, n = batch.size, batch.max_t + 1, self.n
        data, valid, boot = next_action_data(batch)
        greedy = self.backbone.greedy_actions(batch, q_all)
        k, logp_old, probs = self.par.sample_k(batch.state.reshape(B * T1, -1), self.gen)
        mask = self.par.mask(k, valid.reshape(-1), self.gen).view(B, T1, n)
        joint = torch.where(mask, greedy, data)
        return dict(joint=joint, mask=mask, k=k.view(B, T1), logp_old=logp_old.view(B, T1),
                    probs=probs.view(B, T1, n), valid=valid, boot=boot)

    @torch.no_grad()
    def compute_target(self, batch: EpisodeBatch, q_all: torch.Tensor | None = None):
        """y [B, T]: TD(λ) over min_j Qbar_tot,j(s_t', a'^(k)_t'); info carries k and a'^(k)."""
        info = self.par_joint_actions(batch, q_all)
        tq = self.backbone.unroll(batch, target=True)
        v = self.backbone.member_q_tot(tq, info["joint"].unsqueeze(2), batch.state, target=True,
                                       lengths=batch.lengths)[..., 0].min(0).values
        y = td_lambda_targets(batch.rewards, batch.terminals, batch.mask, v, self.cfg.gamma, self.cfg.td_lambda)
        info["stats"] = {"par/k_replaced": masked_mean(info["mask"].float().sum(-1), info["boot"])}
        return y, info

    @torch.no_grad()
    def online_q_tot(self, batch: EpisodeBatch, q_all: torch.Tensor, joint: torch.Tensor) -> torch.Tensor:
        """[E, B, T+1]: every online member's Q_tot at (s_t', a'^(k)_t')."""
        return self.backbone.member_q_tot(q_all.detach(), joint.unsqueeze(2), batch.state)[..., 0]

    @torch.no_grad()
    def par_reward(self, batch: EpisodeBatch, q_all: torch.Tensor, joint: torch.Tensor):
        """(r_par, u_Q, w), all [B, T+1], with the online members (see plcql.par_reward_terms)."""
        q = self.online_q_tot(batch, q_all, joint)
        if q.shape[0] < 2:  # one member: no disagreement to measure
            u = torch.zeros_like(q[0])
            return q[0], u, torch.ones_like(u)
        q_data = None
        if self.cfg.par_reward == "lcb":  # the dataset's a_t' (0 where unknown: those rows are masked out)
            q_data = self.online_q_tot(batch, q_all, next_action_data(batch)[0])
        return self.par.reward(q, q_data)

    def par_update(self, batch: EpisodeBatch, info: dict[str, Any], pre: dict[str, Any]) -> dict[str, float]:
        """One PAR update (V, then PPO) on the indices whose dataset action is known and whose state
        bootstraps a real step, with r_par from before the critic step (`pre`); returns its metrics."""
        rows = (info["valid"] * info["boot"]) > 0.5  # [B, T+1]: dataset a_t' known, s_t' bootstraps a real step
        if not bool(rows.any()):
            keys = [f"par/p_k{i + 1}" for i in range(self.n)] + ["par/E_k", "par/k_sampled", "par/r_par",
                                                                  "par/u_q", "par/w"]
            if self.par.learned:
                keys += ["par/value_loss", "par/adv_raw", "ppo/loss", "ppo/entropy", "ppo/clip_frac"]
            return {kk: 0.0 for kk in keys}
        k = info["k"][rows]
        out = self.par.stats(info["probs"][rows], k, pre["r_par"][rows], pre["u"][rows], pre["w"][rows])
        if self.par.learned:
            s = batch.state[rows]
            out.update(self.par.step(s, k, info["logp_old"][rows], pre["r_par"][rows],
                                     torch.ones(s.shape[0], device=s.device)))
        return host_floats(out)

    # -- one round ------------------------------------------------------------------------------
    def update(self, sample) -> dict[str, float]:
        out = self.backbone.train_behaviour(sample)
        batch = self.scaled(sample(self.cfg.batch_episodes))
        q_all = self.backbone.unroll(batch)  # [E, B, T+1, n, A]
        pred = self.backbone.predict(batch, q_all)  # before the target (the graph's order)
        y, info = self.compute_target(batch, q_all)
        r_par, u, w = self.par_reward(batch, q_all, info["joint"])  # the online members before their step
        out.update(self.backbone.update(batch, pred, y, extra_stats=info["stats"]))
        self.rounds += 1
        if self.rounds % self.cfg.target_update_interval == 0:
            self.backbone.update_targets()
        out.update(self.par_update(batch, info, {"r_par": r_par, "u": u, "w": w}))
        return out

    # -- diagnostics (runner: at every evaluation point, on a fixed probe batch) ----------------------
    @torch.no_grad()
    def diagnostics(self, probe: EpisodeBatch) -> dict[str, float]:
        """As the continuous PLCQL's: per k, the online members at (s_t', a'^(k)_t') over the probe's
        bootstrap indices with a known dataset action, and π_par on their states (own generator)."""
        B, T1, n = probe.size, probe.max_t + 1, self.n
        q_all = self.backbone.unroll(probe)
        data, valid, boot = next_action_data(probe)
        greedy = self.backbone.greedy_actions(probe, q_all)
        rows = (valid * boot) > 0.5
        gen = torch.Generator(device=self.device).manual_seed(12345)
        q_data = self.online_q_tot(probe, q_all, data)[:, rows]
        per_k = []
        for kk in range(1, n + 1):
            k = torch.full((B * T1,), kk, dtype=torch.long, device=self.device)
            mask = self.par.mask(k, valid.reshape(-1), gen).view(B, T1, n)
            q = self.online_q_tot(probe, q_all, torch.where(mask, greedy, data))[:, rows]  # [E, R]
            per_k.append(probe_terms(q, q_data, self.cfg))
        return par_probe_stats(per_k, self.par.probs(probe.state[rows]))

    def run_warnings(self, history: list[dict]) -> tuple[list[str], dict]:
        return self.par.run_warnings(history)


for _name, _doc, _defaults in PAR_VARIANTS:
    register_variant(PLCQLDiscrete, _name, _doc, **_defaults)

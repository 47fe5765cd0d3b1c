"""SPaCQL, discrete actions (SMAX/SMAC). See docs/algorithms/spacql.md, "Discrete (SMAX/SMAC)".

CFCQL-discrete's backbone (QMIX, TD(λ), counterfactual CQL with the per-map cql_alpha/softmax_temp of
configs/cfcql_discrete.yaml) with an ensemble of `n_critics` = 10 QMIX value functions (GRU agent +
mixer per member, stacked: the family's backbone, algorithms/common/discrete_ensemble.py, with its
critic update). Only the bootstrap joint action of the TD(λ) targets changes:

  at every observation index t' (the s' of step t'-1) and for every k = 1..n, an independent uniform
  subset of exactly k agents takes the current policy's greedy AVAILABLE action (argmax of the mean of
  the online members' individual Qs); the others keep the dataset's action a_t'. At the final next
  observation of an episode (no a_t' in the data) every agent is replaced, for every k.
      Q_k(t')  = min_j Qbar_tot,j(s_t', a'^(k)_t')                 (target agents + target mixers)
      u_k(t')  = std_j Qbar_tot,j(s_t', a'^(k)_t')                 (or the online ensemble)
      w_k      = (1/(u_k + eps)) / Σ_k' 1/(u_k' + eps)           (per index, or per batch)
      V(t')    = Σ_k w_k Q_k(t')
  y = TD(λ) returns over V (td_lambda_targets, exactly as CFCQL-discrete over its Q_tot).
All n·(T+1) joint actions of an episode go through one stacked target-mixer call (K = n per state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from plcql_bench.algorithms.base import EpisodeBatch, register
from plcql_bench.algorithms.common.discrete import DiscreteAlgorithm, masked_mean, td_lambda_targets
from plcql_bench.algorithms.common.discrete_ensemble import (
    ENSEMBLE_LEGACY_KEYS, CFCQLBackbone, EnsembleConfig, MeanQPolicy, next_action_data, uses_behaviour)
from plcql_bench.algorithms.spacql import check_weight_choices, inverse_std_weights, par_masks_all_k
from plcql_bench.suite.core.spec import TaskSpec


@dataclass
class Config(EnsembleConfig):
    # --- paper-silent choices (as the continuous SPaCQL) ---
    weights_per: str = "sample"  # "sample": w_k per (episode, index); "batch": from the batch-mean u_k
    uncertainty_from: str = "online"  # "online" (u_k over Q_j, as PLCQL's u_Q) or "target" (the min's ensemble)
    detach_weights: bool = True  # False: gradients flow through w_k into the online ensemble
    weight_eps: float = 1e-6


@register
class SPaCQLDiscrete(DiscreteAlgorithm):
    name = "spacql"
    Config = Config
    table = "cfcql_discrete"  # CFCQL-discrete's per-map cql_alpha / softmax_temp
    legacy_keys = ENSEMBLE_LEGACY_KEYS

    def __init__(self, spec: TaskSpec, config: Config, seed: int, device: str = "cpu") -> None:
        check_weight_choices(config)
        super().__init__(spec, config, seed, device)
        self.backbone = CFCQLBackbone(self, config.n_critics, stacked=True, use_behaviour=uses_behaviour(config),
                                      block_mb=config.cf_block_mb)

    def modules(self) -> dict[str, nn.Module]:
        return self.backbone.modules()

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return self.backbone.optimisers()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "behaviour_state": dict(self.backbone.behaviour_state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.backbone.behaviour_state = dict(state["behaviour_state"])

    def policy_agent(self) -> MeanQPolicy:
        return self.backbone.policy

    # -- target ---------------------------------------------------------------------------------
    @torch.no_grad()
    def par_joint_actions(self, batch: EpisodeBatch, q_all: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """a'^(k) for k = 1..n at every index: [B, T+1, n_k, n], the masks [B, T+1, n_k, n], and the
        bootstrap-row mask [B, T+1]."""
        B, T1 = batch.size, batch.max_t + 1
        data, valid, boot = next_action_data(batch)
        greedy = self.backbone.greedy_actions(batch, q_all)  # [B, T+1, n]
        masks = par_masks_all_k(B * T1, self.n, valid.reshape(-1), self.gen).view(B, T1, self.n, self.n)
        joint = torch.where(masks, greedy.unsqueeze(2), data.unsqueeze(2))
        return joint, masks, boot

    def compute_target(self, batch: EpisodeBatch, q_all: torch.Tensor | None = None):
        """y [B, T] (TD(λ) over Σ_k w_k min_j Qbar_j(s', a'^(k))) and {"stats": diagnostics}."""
        c = self.cfg
        joint, masks, boot = self.par_joint_actions(batch, q_all)
        with torch.no_grad():
            tq = self.backbone.unroll(batch, target=True)  # [E, B, T+1, n, A]
            qk = self.backbone.member_q_tot(tq, joint, batch.state, target=True, lengths=batch.lengths)  # [E, B, T+1, n_k]
            q_min = qk.min(0).values
        if c.uncertainty_from == "target":
            u = qk.std(0, correction=0)
        else:
            with torch.set_grad_enabled(not c.detach_weights and torch.is_grad_enabled()):
                oq = self.backbone.unroll(batch) if q_all is None else q_all
                u = self.backbone.member_q_tot(oq, joint, batch.state).std(0, correction=0)
        w = inverse_std_weights(u, c.weights_per, c.weight_eps, rows=boot)
        if c.detach_weights:
            w = w.detach()
        v = (w * q_min).sum(-1)  # [B, T+1]
        y = td_lambda_targets(batch.rewards, batch.terminals, batch.mask, v, c.gamma, c.td_lambda)
        wd = w.detach()
        kvals = torch.arange(1, self.n + 1, dtype=wd.dtype, device=wd.device)
        stats = {"spacql/E_k_weighted": masked_mean((wd * kvals).sum(-1), boot)}
        for i in range(self.n):  # metrics only (n scalars)
            stats[f"spacql/w_k{i + 1}"] = masked_mean(wd[..., i], boot)
            stats[f"spacql/u_k{i + 1}"] = masked_mean(u.detach()[..., i], boot)
        return y, {"stats": stats, "joint": joint, "masks": masks}

    # -- one round ------------------------------------------------------------------------------
    def update(self, sample) -> dict[str, float]:
        out = self.backbone.train_behaviour(sample)
        batch = self.scaled(sample(self.cfg.batch_episodes))
        q_all = self.backbone.unroll(batch)  # [E, B, T+1, n, A]
        pred = self.backbone.predict(batch, q_all)  # before the target (the graph's order)
        y, info = self.compute_target(batch, q_all)
        out.update(self.backbone.update(batch, pred, y, extra_stats=info["stats"]))
        self.rounds += 1
        if self.rounds % self.cfg.target_update_interval == 0:
            self.backbone.update_targets()
        return out

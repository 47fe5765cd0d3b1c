"""CFCQL, discrete actions (SMAX/SMAC): QMIX with TD(λ) targets + counterfactual CQL.

Reference: `thu-rllab/CFCQL` `discrete/src/learners/cq_learner.py` with `config/algs/cql_qmix.yaml`
(reference-implementations.md §4.3). One update round = one gradient step on 128 episodes:

  Q-values    q = GRU agent(o_t ⊕ a_{t-1} ⊕ id)                          [B, T+1, n, A]
  target      y = TD(λ) returns of Q'_tot(s_t, argmax_avail q(o_t)) (double Q: online argmax over the
              available actions, target agent + target mixer), γ 0.99, λ 0.6
  TD loss     mean over real steps of ½ (Q_tot(s, a) − y)²
  CF-CQL      for agent i and each of its actions j: Q_tot(s, a_i = j, a_-i from the data); unavailable
              j never enter (masked logsumexp);
              pen = mean over real steps of Σ_i λ_i logsumexp_{j avail} Q_tot(s, j, a_-i) − Q_tot(s, a)
  loss        TD + cql_alpha · pen; Adam lr 1e-3, gradient-norm clip 10
  targets     hard copy every 25 rounds (the reference's "every 200 episodes", its episode counter
              growing by batch_size_run = 8 per iteration)

λ (`moderate_lambda`): a behaviour model β (the same GRU agent, masked softmax policy, trained by
masked cross-entropy, CFCQL `train_behaviour`) is trained first. Then per step
    KL_i = Σ_{j avail} μ_i(j) (log μ_i(j) − log β_i(j)),   μ_i = softmax_j Q_tot(s, j, a_-i)
(μ is the policy the counterfactual Q_tot implies for agent i: the reference's `kl_div(log β, μ)`),
λ = softmax_i(softmax_temp · KL_i), detached; softmax_temp = 100 means a hard argmax over agents and
0 uniform weights 1/n (then no behaviour model is trained). `cql_alpha` (the reference's
`global_cql_alpha`) and `softmax_temp` come per map and dataset from configs/cfcql_discrete.yaml.

Behaviour training budget, as the reference's (`run/offline_utils.py` `train_behaviour_policy`,
lines 23-36; `config/default.yaml` `max_behaviour_train_steps: 10000000`): β trains before the first
Q step on 128-episode batches until the batches it has drawn hold `behaviour_timesteps` = 10M
sampled timesteps, counted as the reference counts them: its `filled` mask marks L + 1 entries per
episode of L steps (the runner fills the reset observation and every next observation,
`runners/parallel_runner.py` lines 85 and 179). No early stop: the reference computes a "loss not
improved for 20 steps" flag (`learners/cq_learner.py` lines 119-124) and never uses it.
`behaviour_max_updates` (0 = none, the reference) caps the updates for smoke profiles. The metrics
report `behaviour/updates` and `behaviour/timesteps`. See docs/algorithms/cfcql.md.

The value function, β and the critic update are the family's backbone (algorithms/common/discrete_ensemble.py,
`CFCQLBackbone`, here with E = 1 member: one GRU agent and one mixer; its `td_target` is the target
above); this file has CFCQL's round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from plcql_bench.algorithms.base import EpisodeBatch, register
from plcql_bench.algorithms.common.discrete import DiscreteAlgorithm, RNNAgent
from plcql_bench.algorithms.common.discrete_ensemble import (
    SINGLE_LEGACY_KEYS, BackboneConfig, CFCQLBackbone, uses_behaviour)
from plcql_bench.suite.core.spec import TaskSpec


@dataclass
class Config(BackboneConfig):
    """CFCQL-discrete's settings are the backbone's (algorithms/common/discrete_ensemble.py, `BackboneConfig`)."""


@register
class CFCQLDiscrete(DiscreteAlgorithm):
    name = "cfcql"
    Config = Config
    table = "cfcql_discrete"  # algorithms/configs/cfcql_discrete.yaml (also SPaCQL's and PLCQL's)
    legacy_keys = SINGLE_LEGACY_KEYS

    def __init__(self, spec: TaskSpec, config: Config, seed: int, device: str = "cpu") -> None:
        super().__init__(spec, config, seed, device)
        self.backbone = CFCQLBackbone(self, 1, stacked=False, use_behaviour=uses_behaviour(config))

    # -- checkpoint -----------------------------------------------------------------------------
    def modules(self) -> dict[str, nn.Module]:
        return self.backbone.modules()

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return self.backbone.optimisers()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "behaviour_state": dict(self.backbone.behaviour_state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.backbone.behaviour_state = dict(state["behaviour_state"])

    def policy_agent(self) -> RNNAgent:
        return self.backbone.policy

    # -- one round -------------------------------------------------------------------------------
    def compute_target(self, batch: EpisodeBatch, q_all: torch.Tensor | None = None) -> torch.Tensor:
        """CFCQL-discrete's TD(λ) double-Q target [B, T] (`CFCQLBackbone.td_target`)."""
        return self.backbone.td_target(batch, q_all)

    def update(self, sample) -> dict[str, float]:
        out = self.backbone.train_behaviour(sample)  # every round reports the same keys (the runner averages them)
        batch = self.scaled(sample(self.cfg.batch_episodes))
        q_all = self.backbone.unroll(batch)  # [1, B, T+1, n, A]
        pred = self.backbone.predict(batch, q_all)
        out.update(self.backbone.update(batch, pred, self.compute_target(batch, q_all)))
        self.rounds += 1
        if self.rounds % self.cfg.target_update_interval == 0:
            self.backbone.update_targets()
        return out

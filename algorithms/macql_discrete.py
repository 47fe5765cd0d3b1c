"""MACQL, discrete actions (SMAX/SMAC): QMIX + CQL over sampled JOINT actions.

Reference: `thu-rllab/CFCQL` `cq_learner.py` with `raw_cql=True` (`--config=cql_qmix with raw_cql=True
global_cql_alpha=5.0`, reference-implementations.md §4.2). Everything but the conservative term is
CFCQL-discrete's (algorithms/cfcql_discrete.py). The term, per step:

    pen = logsumexp_m Q_tot(s, a^m) − Q_tot(s, a),   m = 1..n_sampled_actions (100)

Deviation, for availability masking: the reference draws every agent's action uniformly from ALL
actions and multiplies Q_tot of a joint action with an unavailable component by 0 (such samples then
enter the logsumexp as exp(0)). Here each agent's sampled action is drawn uniformly from its available
actions (`masked_uniform_sample`), so no unavailable action enters the logsumexp. No behaviour model is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from plcql_bench.algorithms.base import EpisodeBatch, register
from plcql_bench.algorithms.common import kernels_discrete as fast
from plcql_bench.algorithms.common.discrete import DiscreteAlgorithm, RNNAgent, masked_mean, masked_uniform_sample
from plcql_bench.algorithms.common.discrete_ensemble import SINGLE_LEGACY_KEYS, BackboneConfig, CFCQLBackbone
from plcql_bench.suite.core.spec import TaskSpec


@dataclass
class Config(BackboneConfig):
    cql_alpha: float = 5.0  # global_cql_alpha=5.0 (README's MACQL command, every map and dataset)
    softmax_temp: float = 0.0  # unused (no counterfactual weights)
    n_sampled_actions: int = 100  # raw_sample_actions 100 (joint actions per step)


@register
class MACQLDiscrete(DiscreteAlgorithm):
    name = "macql"
    Config = Config
    table = "macql_discrete"
    legacy_keys = SINGLE_LEGACY_KEYS

    def __init__(self, spec: TaskSpec, config: Config, seed: int, device: str = "cpu") -> None:
        super().__init__(spec, config, seed, device)
        self.backbone = CFCQLBackbone(self, 1, stacked=False, use_behaviour=False)

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

    def cql_penalty(self, batch: EpisodeBatch, q: torch.Tensor, q_tot: torch.Tensor,
                    mix_w: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, dict]:
        """logsumexp over M sampled available joint actions of Q_tot, minus Q_tot(s, a): [E, B, T]."""
        E, B, T, n, A = q.shape
        M = self.cfg.n_sampled_actions
        joint = masked_uniform_sample(batch.avail[:, :T], M, self.gen)  # [B, T, n, M], available only
        state = batch.state[:, :T]
        packed = self.backbone.mixers.fused and mix_w is not None and fast.has_padding(batch.lengths, T + 1)
        if packed:  # the fused path mixes the real steps' samples only (the padding is masked out of the
            # penalty; the same draws as the plain path): rows b·T + t -> the R real ones
            real = fast.real_rows(batch.lengths, T, last=-1)  # the transitions 0..len − 1
            q, joint = q.reshape(E, B * T, n, A).index_select(1, real), joint.reshape(B * T, n, M).index_select(0, real)
            state, mix_w = state.reshape(B * T, -1).index_select(0, real), tuple(x.index_select(0, real) for x in mix_w)
        q_s = q.gather(-1, joint.unsqueeze(0).expand(E, *joint.shape)).transpose(-1, -2)  # [E, *L, M, n]
        q_tot_s = self.backbone.mixers.mix_many(q_s, state, mix_w)  # [E, *L, M]
        neg = torch.logsumexp(q_tot_s, -1)
        if packed:  # back to [E, B, T], zeros on the padding
            neg = fast.scatter_rows(neg, real, B * T).view(E, B, T)
        return neg - q_tot, {"cql/negative": masked_mean(neg.detach(), batch.mask)}

    def compute_target(self, batch: EpisodeBatch, q_all: torch.Tensor | None = None) -> torch.Tensor:
        """CFCQL-discrete's TD(λ) double-Q target [B, T] (`CFCQLBackbone.td_target`)."""
        return self.backbone.td_target(batch, q_all)

    def update(self, sample) -> dict[str, float]:
        batch = self.scaled(sample(self.cfg.batch_episodes))
        q_all = self.backbone.unroll(batch)  # [1, B, T+1, n, A]
        pred = self.backbone.predict(batch, q_all)
        out = self.backbone.update(batch, pred, self.compute_target(batch, q_all),
                                   penalty=self.cql_penalty)
        self.rounds += 1
        if self.rounds % self.cfg.target_update_interval == 0:
            self.backbone.update_targets()
        return out

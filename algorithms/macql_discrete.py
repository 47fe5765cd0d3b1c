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

import torch

from plcql_bench.algorithms.base import EpisodeBatch, register
from plcql_bench.algorithms.cfcql_discrete import CFCQLDiscrete
from plcql_bench.algorithms.cfcql_discrete import Config as CFCQLConfig
from plcql_bench.algorithms.common.discrete import masked_mean, masked_uniform_sample


@dataclass
class Config(CFCQLConfig):
    cql_alpha: float = 5.0  # global_cql_alpha=5.0 (README's MACQL command, every map and dataset)
    softmax_temp: float = 0.0  # unused (no counterfactual weights)
    n_sampled_actions: int = 100  # raw_sample_actions 100 (joint actions per step)


@register
class MACQLDiscrete(CFCQLDiscrete):
    name = "macql"
    Config = Config
    table = "macql_discrete"

    def uses_behaviour(self) -> bool:
        return False

    def cql_penalty(self, batch: EpisodeBatch, q: torch.Tensor, q_tot: torch.Tensor,
                    mix_w: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, dict]:
        B, T, n, A = q.shape
        M = self.cfg.n_sampled_actions
        joint = masked_uniform_sample(batch.avail[:, :T], M, self.gen)  # [B, T, n, M], available only
        q_s = q.gather(-1, joint).transpose(-1, -2)  # [B, T, M, n]
        q_tot_s = self.mixer.mix_many(q_s, batch.state[:, :T], mix_w)  # [B, T, M]
        neg = torch.logsumexp(q_tot_s, -1)
        return neg - q_tot, {"cql/negative": masked_mean(neg.detach(), batch.mask)}

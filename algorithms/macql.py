"""MACQL, continuous: CQL over the JOINT action on CFCQL's centralised-critic code path.

Reference: `thu-rllab/CFCQL` `continuous/main.py --cql --central_critic` without `--cf_cql`
(reference-implementations.md §4.2): the CQL term samples whole joint actions a^m ~ U[-1, 1]^{nA}
(10 of them) and uses the joint log-density (nA * log 0.5):

    pen_j = mean_b [ logsumexp_m (Q_j(s, a^m) - nA log 0.5) - Q_j(s, a) ]

HalfCheetah branch (`sample_action_class="1-1-1"`, set by task_overrides): the joint samples are
uniform plus noisy current-policy and next-policy joint actions, each with its joint log-density.
Everything else (twin centralised critic, targets with N(0, 0.05) smoothing, cf_pol actor, --ca_ratio 5
rounds, backbone) is CFCQL's (algorithms/common/continuous.py). The code has no separate MACQL alpha table (§4.2: NOT FOUND), so the
CFCQL `cql_alpha` table is used (configs/cfcql.yaml).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from plcql_bench.algorithms.base import Batch, register
from plcql_bench.algorithms.common import rng
from plcql_bench.algorithms.common.continuous import CentralCriticConfig, CentralCriticAlgorithm


@dataclass
class Config(CentralCriticConfig):
    pass  # same fields and defaults as CFCQL; n_sampled_actions = joint samples per state


@register
class MACQL(CentralCriticAlgorithm):
    name = "macql"
    Config = Config

    def critic_loss(self, batch: Batch, target: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        B = batch.size
        nA = self.n * self.A
        q = self.critic(batch.state, batch.actions.reshape(B, 1, -1))[:, :, 0]  # [E, B]
        td = (q - target.unsqueeze(0)).pow(2).mean(1).sum()
        stats = {"critic/td_loss": td.detach(), "critic/q_data": q.detach().mean(), "critic/target": target.detach().mean()}
        loss = td
        if self.cfg.cql_alpha > 0:
            M = self.cfg.n_sampled_actions
            joint = rng.rand(self.gen, B, M, nA, device=self.device) * 2 - 1
            logp = torch.full((B, M), nA * math.log(0.5), device=self.device)
            extra = self.policy_cql_samples(batch)  # HalfCheetah branch: noisy current/next joint policy actions
            if extra is not None:
                pa, plp = extra  # [B, n, M', A], [B, n, M']
                joint = torch.cat([joint, pa.transpose(1, 2).reshape(B, pa.shape[2], nA)], 1)
                logp = torch.cat([logp, plp.sum(1)], 1)  # joint density = product over agents
            q_s = self.critic(batch.state, joint)  # [E, B, M_total], one call
            if self.cfg.soft_q:
                q_s = q_s - logp
            lse = torch.logsumexp(q_s / self.cfg.lse_temp, dim=-1) * self.cfg.lse_temp
            pen = (lse - q).mean(-1).sum()
            loss = loss + self.cfg.cql_alpha * pen
            stats.update({"cql/penalty": pen.detach(), "cql/lse_q": lse.detach().mean()})
        stats["critic/loss"] = loss.detach()
        return loss, stats

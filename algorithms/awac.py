"""Multi-agent AWAC (continuous): per-agent advantage-weighted actor-critic.

Only a SMAC AWAC exists in the references (CFCQL `baseline_awac.yaml`, reference-implementations.md
§4.7): per-agent twin Q, V taken as the policy's expectation of the target Q, weight exp(beta * A)
capped at 100, beta = 3.0, Q-target EMA 0.005, lr 1e-3. Continuous construction on OMAR's independent
backbone with the deterministic tanh actor (so the policy expectation is Q at pi(o)):

    Q_t,i:   MSE( Q_t,i(o_i, a_i), r + gamma (1 - d) min_t Qbar_t,i(o'_i, pi_i(o'_i)) )
    A_i   =  min_t Qbar_t,i(o_i, a_i) - min_t Qbar_t,i(o_i, pi_i(o_i))
    actor_i: mean_b[ min(exp(beta * A_i), 100) * |pi_i(o_i) - a_i|^2 ]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plcql_bench.algorithms.base import BatchSampler, per_agent_rewards, register
from plcql_bench.algorithms.common.independent import IndependentBase


@dataclass
class Config:
    hidden: int = 64  # OMAR backbone sizes (SMAC AWAC critics: 256)
    lr: float = 1e-3  # baseline_awac.yaml lr 1e-3
    batch_size: int = 1024
    tau: float = 0.005  # baseline_awac.yaml Q-target EMA 0.005
    gamma: float = 0.95
    input_norm: bool = True
    grad_clip: float = 0.5
    beta: float = 3.0  # baseline_awac.yaml
    max_weight: float = 100.0


@register
class AWAC(IndependentBase):
    name = "awac"
    Config = Config

    def update(self, sample: BatchSampler) -> dict[str, float]:
        c, b = self.cfg, sample(self.cfg.batch_size)
        with torch.no_grad():
            pi_next, pi_now = self.actors(b.next_obs), self.actors(b.obs)
            q_next = self.target_critic(b.next_obs, pi_next).min(0).values
            y = per_agent_rewards(b.rewards) + c.gamma * (1 - b.terminals).unsqueeze(1) * q_next
            adv = self.target_critic(b.obs, b.actions).min(0).values - self.target_critic(b.obs, pi_now).min(0).values
            weight = torch.exp(c.beta * adv).clamp(max=c.max_weight)
        td, a_loss = self.advantage_weighted_round(b, y, weight)
        return {"critic/td_loss": float(td.detach()), "actor/loss": float(a_loss.detach()),
                "awac/adv": float(adv.mean()), "awac/weight": float(weight.mean())}

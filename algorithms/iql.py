"""Multi-agent IQL (continuous): per-agent implicit Q-learning with advantage-weighted regression.

No continuous multi-agent IQL exists in the references read (reference-implementations.md §4.6). The
settings are those of CFCQL's SMAC `baseline_iql.yaml` (expectile tau = 0.7, beta = 3.0, exp-advantage
capped at 100, target-Q EMA 0.005, lr 1e-3) on OMAR's independent MLP backbone (sizes per task):

    V_i:     expectile_0.7( min_t Qbar_t,i(o_i, a_i) - V_i(o_i) )
    Q_t,i:   MSE( Q_t,i(o_i, a_i), r + gamma (1 - d) V_i(o'_i) )
    actor_i: mean_b[ min(exp(beta * (min_t Qbar_t,i(o_i, a_i) - V_i(o_i))), 100) * |pi_i(o_i) - a_i|^2 ]

The actor is the deterministic tanh actor of the other baselines, so the advantage-weighted
log-likelihood becomes an advantage-weighted squared error (a Gaussian with fixed variance).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plcql_bench.algorithms.base import BatchSampler, per_agent_rewards, register
from plcql_bench.algorithms.common.independent import IndependentBase


@dataclass
class Config:
    hidden: int = 64  # OMAR backbone sizes (64 MPE / 256 HalfCheetah); SMAC IQL uses 256
    lr: float = 1e-3  # baseline_iql.yaml lr 1e-3 (all three networks)
    batch_size: int = 1024  # OMAR backbone batch (1024 MPE / 256 HalfCheetah)
    tau: float = 0.005  # baseline_iql.yaml target-Q EMA alpha 0.005
    gamma: float = 0.95  # task discount (0.95 MPE / 0.99 HalfCheetah)
    input_norm: bool = True
    grad_clip: float = 0.5  # backbone clip (SMAC IQL: none found; kept for stability, 0 = off)
    expectile: float = 0.7  # baseline_iql.yaml
    beta: float = 3.0  # baseline_iql.yaml advantage temperature
    max_weight: float = 100.0  # exp-advantage cap


@register
class IQL(IndependentBase):
    name = "iql"
    Config = Config
    use_value = True

    def update(self, sample: BatchSampler) -> dict[str, float]:
        c, b = self.cfg, sample(self.cfg.batch_size)
        with torch.no_grad():
            q_t = self.target_critic(b.obs, b.actions).min(0).values  # [B, n]
        v = self.value(b.obs)[0]
        diff = q_t - v
        w = torch.where(diff > 0, c.expectile, 1 - c.expectile)
        v_loss = (w * diff.pow(2)).mean(0).sum()
        self.value_opt.zero_grad(set_to_none=True)
        v_loss.backward()
        self.value_opt.step()
        with torch.no_grad():
            y = per_agent_rewards(b.rewards) + c.gamma * (1 - b.terminals).unsqueeze(1) * self.value(b.next_obs)[0]
            adv = q_t - self.value(b.obs)[0]
            weight = torch.exp(c.beta * adv).clamp(max=c.max_weight)
        td, a_loss = self.advantage_weighted_round(b, y, weight)
        return {"critic/td_loss": float(td.detach()), "value/loss": float(v_loss.detach()),
                "actor/loss": float(a_loss.detach()), "iql/adv": float(adv.mean()), "iql/weight": float(weight.mean())}

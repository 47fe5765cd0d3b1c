"""MA-TD3+BC (continuous): independent TD3 (OMAR's backbone) with the TD3+BC actor loss.

The OMAR paper's "MA-TD3+BC" is built on its independent TD3; `ling-pan/OMAR` ships no implementation
(reference-implementations.md §4.8). The actor loss is standard TD3+BC as in OG-MARL `iddpg_bc.py`
(`bc_alpha = 2.5`):

    actor_i: -(alpha / mean_b |Q_1,i(o_i, pi_i(o_i))|) * mean_b Q_1,i(o_i, pi_i(o_i)) + MSE(pi_i(o_i), a_i)

with the normaliser detached. Critic: OMAR's independent twin TD3 critic (no CQL, no target smoothing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plcql_bench.algorithms.base import BatchSampler, per_agent_rewards, register
from plcql_bench.algorithms.common.independent import IndependentBase


@dataclass
class Config:
    hidden: int = 64  # OMAR backbone (main.py): 64 MPE / 256 HalfCheetah
    lr: float = 0.01  # OMAR backbone lr (0.01 MPE / 3e-4 HalfCheetah)
    batch_size: int = 1024
    tau: float = 0.01
    gamma: float = 0.95
    input_norm: bool = True
    grad_clip: float = 0.5
    alpha: float = 2.5  # OG-MARL iddpg_bc.yaml bc_alpha 2.5 (= TD3+BC's alpha)


@register
class MATD3BC(IndependentBase):
    name = "matd3bc"
    Config = Config
    backbone_keys = None  # hidden, batch, gamma and the backbone learning rates

    def update(self, sample: BatchSampler) -> dict[str, float]:
        c, b = self.cfg, sample(self.cfg.batch_size)
        with torch.no_grad():
            q_next = self.target_critic(b.next_obs, self.target_actors(b.next_obs)).min(0).values
            y = per_agent_rewards(b.rewards) + c.gamma * (1 - b.terminals).unsqueeze(1) * q_next
        q = self.critic(b.obs, b.actions)
        td = (q - y).pow(2).mean(1).sum()
        self.critic_step(td)
        pi = self.actors(b.obs)
        q_pi = self.critic(b.obs, pi)[0]  # [B, n]
        lam = c.alpha / q_pi.abs().mean(0).detach().clamp(min=1e-6)  # [n], per agent
        bc = (pi - b.actions).pow(2).mean((0, 2))  # [n]
        loss = (-lam * q_pi.mean(0) + bc).sum()
        self.actor_step(loss)
        self.update_targets()
        self.rounds += 1
        return {"critic/td_loss": float(td.detach()), "critic/q_data": float(q.detach().mean()),
                "actor/bc_mse": float(bc.detach().mean()), "actor/q": float(q_pi.detach().mean()),
                "actor/lambda": float(lam.mean())}

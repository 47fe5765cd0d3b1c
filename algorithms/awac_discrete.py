"""AWAC (advantage-weighted actor-critic, multi-agent), discrete actions (SMAX/SMAC): twin per-agent Q
with the policy's expected target Q as V, and advantage-weighted behaviour cloning of a GRU policy.

Reference: `thu-rllab/CFCQL` `discrete/src/learners/awac_learner.py` + `config/algs/baseline_awac.yaml`,
critic `modules/critics/doubleqv.py` (reference-implementations.md §4.7). One update round = one Q step
and one policy step on a batch of 128 episodes:

  V          V_i(o_t) = Σ_{j available} π_i(j | τ_t) Q'_i(j), π_i the GRU policy's softmax over the
             available actions (detached), Q'_i = min of the target twins; at every observation.
  Q          twin Q_i^{1,2}(s, o_i, i) (MLP 256-256 -> A each), one-step targets
             y = r + γ (1 − d) V_i(o_{t+1}); loss = mean over the twins of the masked MSE.
  target Q   EMA with rate 0.005 after every Q step (`alpha`).
  policy     weights w = min(exp(β (Q'_i(a_i) − V_i(o_t))), 100), β = 3; loss = − mean over real (step,
             agent) of w · log π_i(a_i).
  optimisers Adam lr 1e-3 (policy and Q), gradient-norm clip 10 (default.yaml).

`td_lambda` 0.8 and `adv_lambda` are in baseline_awac.yaml but the learner never reads them (its targets
are one-step). Deviations (docs/algorithms/awac.md): the twins have their own output layers (the
reference's share `fc3`; `shared_head` reproduces it); the cosine lr schedule of the policy is left out
(period t_max = 10.05M calls, ~2k calls in a run: no effect).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from plcql_bench.algorithms.base import register
from plcql_bench.algorithms.common.discrete import DiscreteAlgorithm, RNNAgent, masked_mean
from plcql_bench.algorithms.common.discrete_critics import (
    TwinAgentQ, clipped_exp_weights, obs_rows, policy_expectation, step_rows)
from plcql_bench.algorithms.common.nets import polyak_
from plcql_bench.algorithms.iql_discrete import weighted_bc_loss
from plcql_bench.suite.core.spec import TaskSpec


@dataclass
class Config:
    # --- networks (default.yaml, modules/critics/doubleqv.py) ---
    hidden: int = 64  # rnn_hidden_dim 64 (policy)
    critic_hidden: int = 256  # DoubleQNetwork hidden_dim 256
    shared_head: bool = False  # True = the reference's twins sharing fc3 (a bug)
    # --- optimisation (baseline_awac.yaml, default.yaml) ---
    lr: float = 1e-3  # lr 0.001 (policy and Q; Adam)
    grad_clip: float = 10.0  # grad_norm_clip 10
    batch_episodes: int = 128  # batch_size 128 episodes
    gamma: float = 0.99  # gamma 0.99
    reward_scale: float = 1.0  # rewards x this in the update; SMAX: 10 (configs/discrete_common.yaml)
    bootstrap_timeouts: bool = False  # False: a timeout is terminal, as in the references (common/discrete.py)
    target_rate: float = 0.005  # alpha 0.005 (target-Q EMA)
    # --- AWAC (baseline_awac.yaml, awac_learner.py) ---
    beta: float = 3.0  # beta 3.0
    max_weight: float = 100.0  # EXP_ADV_MAX 100


@register
class AWACDiscrete(DiscreteAlgorithm):
    name = "awac"
    Config = Config
    legacy_keys = {"q": "critic", "target_q": "target_critic", "q_opt": "critic_opt"}  # before issue 22

    def __init__(self, spec: TaskSpec, config: Config, seed: int, device: str = "cpu") -> None:
        super().__init__(spec, config, seed, device)
        c = config
        self.actor = self.build(1, lambda: self.new_agent(c.hidden))
        self.critic = self.build(2, lambda: TwinAgentQ(spec.state_dim, spec.obs_dim, self.n, self.A, c.critic_hidden,
                                                  shared_head=c.shared_head))
        self.target_critic = self.target_of(self.critic)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=c.lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=c.lr)

    def modules(self) -> dict[str, nn.Module]:
        return {"actor": self.actor, "critic": self.critic, "target_critic": self.target_critic}

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor_opt": self.actor_opt, "critic_opt": self.critic_opt}

    def policy_agent(self) -> RNNAgent:
        return self.actor

    @torch.no_grad()
    def values(self, batch, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(V [B, T+1, n] = the policy's expected target Q, Q'(a_data) [B, T, n])."""
        T = batch.max_t
        tq = self.target_critic(batch.state, batch.obs, obs_rows(batch))  # [B, T+1, n, A]
        v = policy_expectation(logits, tq, batch.avail)
        return v, tq[:, :T].gather(-1, batch.actions.unsqueeze(-1))[..., 0]

    def update(self, sample) -> dict[str, float]:
        c = self.cfg
        batch = self.scaled(sample(c.batch_episodes))
        T = batch.max_t
        m = batch.mask.unsqueeze(-1).expand(-1, -1, self.n)
        act = batch.actions.unsqueeze(-1)
        logits = self.actor.unroll(batch)  # [B, T+1, n, A]
        v_all, tq = self.values(batch, logits.detach())
        v, next_v = v_all[:, :T], v_all[:, 1:]
        adv = tq - v
        # Q: one-step targets from the policy's expected target Q at o_{t+1}
        y = batch.rewards.unsqueeze(-1) + c.gamma * (1.0 - batch.terminals.unsqueeze(-1)) * next_v
        qs = self.critic.both(batch.state[:, :T], batch.obs[:, :T], step_rows(batch))
        q_taken = [q.gather(-1, act)[..., 0] for q in qs]
        q_loss = sum(masked_mean((qt - y).pow(2), m) for qt in q_taken) / len(qs)
        self.critic_opt.zero_grad(set_to_none=True)
        q_loss.backward()
        q_gn = nn.utils.clip_grad_norm_(self.critic.parameters(), c.grad_clip)
        self.critic_opt.step()
        polyak_(self.target_critic, self.critic, c.target_rate)
        # policy: advantage-weighted BC
        w = clipped_exp_weights(adv, c.beta, c.max_weight)
        p_loss, logp = weighted_bc_loss(logits[:, :T], batch, w)
        self.actor_opt.zero_grad(set_to_none=True)
        p_loss.backward()
        p_gn = nn.utils.clip_grad_norm_(self.actor.parameters(), c.grad_clip)
        self.actor_opt.step()
        self.rounds += 1
        stats = {"critic/q_loss": q_loss.detach(), "critic/grad_norm": q_gn,
                 "critic/q_taken": masked_mean(q_taken[0].detach(), m), "critic/target_q": masked_mean(tq, m),
                 "critic/v": masked_mean(v, m), "actor/loss": p_loss.detach(), "actor/grad_norm": p_gn,
                 "actor/weight_mean": masked_mean(w, m),
                 "actor/weight_clipped": masked_mean((w >= c.max_weight).float(), m),
                 "actor/log_pi_taken": masked_mean(logp.detach(), m)}
        return {k: float(v_) for k, v_ in stats.items()}

"""IQL (implicit Q-learning, multi-agent), discrete actions (SMAX/SMAC): per-agent expectile V, twin
per-agent Q, and advantage-weighted behaviour cloning of a GRU policy.

Reference: `thu-rllab/CFCQL` `discrete/src/learners/iql_learner.py` + `config/algs/baseline_iql.yaml`,
critics `modules/critics/doubleqv.py` (reference-implementations.md §4.6). One update round = one V, one
Q and one policy step on a batch of 128 episodes, in the reference's order:

  V          V_i(s, o_i, i) (MLP 256-256 -> 1); expectile loss on u = Q'_i(a_i) − V_i with
             τ = 0.7: mean over real (step, agent) of |τ − 1(u < 0)| u²,
             Q'_i = min of the target twins (the reference's `DoubleQNetwork.forward`).
  Q          twin Q_i^{1,2}(s, o_i, i) (MLP 256-256 -> A each), one-step targets from V:
             y = r + γ (1 − d) V_i(o_{t+1}) (V before this round's V step), loss = mean over the twins of
             the masked MSE.
  target Q   EMA with rate 0.005 after every Q step (`alpha`).
  policy     weights w = min(exp(β (Q'_i(a_i) − V_i)), 100), β = 3 (advantages from before the V step);
             loss = − mean over real (step, agent) of w · log π_i(a_i), π_i = softmax over the available
             actions of the GRU policy's logits.
  optimisers Adam lr 1e-3 for all three, gradient-norm clip 10 (default.yaml).

Deviations (docs/algorithms/iql.md): the twins have their own output layers (the reference's
`DoubleQNetwork.both` uses `fc3` for both; `shared_head` reproduces it); the policy's cosine lr
schedule is left out (its period is t_max = 10.05M calls against ~2k update calls in the reference,
so its lr falls by less than 1e-5 relative over a run).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from plcql_bench.algorithms.base import register
from plcql_bench.algorithms.common.discrete import (
    DiscreteAlgorithm, RNNAgent, masked_log_softmax, masked_mean)
from plcql_bench.algorithms.common.discrete_critics import (
    AgentMLP, TwinAgentQ, clipped_exp_weights, expectile_loss, obs_rows, step_rows)
from plcql_bench.algorithms.common.nets import polyak_
from plcql_bench.suite.core.spec import TaskSpec


@dataclass
class Config:
    # --- networks (default.yaml, modules/critics/doubleqv.py) ---
    hidden: int = 64  # rnn_hidden_dim 64 (policy)
    critic_hidden: int = 256  # DoubleQNetwork / ValueNetwork hidden_dim 256
    shared_head: bool = False  # True = the reference's twins sharing fc3 (a bug)
    # --- optimisation (baseline_iql.yaml, default.yaml) ---
    lr: float = 1e-3  # lr 0.001 (policy, Q and V; Adam)
    grad_clip: float = 10.0  # grad_norm_clip 10
    batch_episodes: int = 128  # batch_size 128 episodes
    gamma: float = 0.99  # gamma 0.99
    reward_scale: float = 1.0  # rewards x this in the update; SMAX: 10 (configs/discrete_common.yaml)
    bootstrap_timeouts: bool = False  # False: a timeout is terminal, as in the references (common/discrete.py)
    target_rate: float = 0.005  # alpha 0.005 (target-Q EMA)
    # --- IQL (baseline_iql.yaml, iql_learner.py) ---
    expectile: float = 0.7  # tau 0.7
    beta: float = 3.0  # beta 3.0 (inverse temperature of the advantage weights)
    max_weight: float = 100.0  # EXP_ADV_MAX 100


def weighted_bc_loss(logits: torch.Tensor, batch, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(− mean over real (step, agent) of w · log π(a_data), log π(a_data) [B, T, n]); π = softmax over
    the available actions. logits [B, T, n, A], weights [B, T, n] (detached)."""
    T = batch.max_t
    logp = masked_log_softmax(logits, batch.avail[:, :T]).gather(-1, batch.actions.unsqueeze(-1))[..., 0]
    m = batch.mask.unsqueeze(-1).expand_as(logp)
    return -masked_mean(weights * logp, m), logp


@register
class IQLDiscrete(DiscreteAlgorithm):
    name = "iql"
    Config = Config
    legacy_keys = {"q": "critic", "target_q": "target_critic", "q_opt": "critic_opt"}  # before issue 22

    def __init__(self, spec: TaskSpec, config: Config, seed: int, device: str = "cpu") -> None:
        super().__init__(spec, config, seed, device)
        c = config
        S, o = spec.state_dim, spec.obs_dim
        self.actor = self.build(1, lambda: self.new_agent(c.hidden))
        self.critic = self.build(2, lambda: TwinAgentQ(S, o, self.n, self.A, c.critic_hidden, shared_head=c.shared_head))
        self.value = self.build(3, lambda: AgentMLP(S, o, self.n, 1, c.critic_hidden))
        self.target_critic = self.target_of(self.critic)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=c.lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=c.lr)
        self.value_opt = torch.optim.Adam(self.value.parameters(), lr=c.lr)

    def modules(self) -> dict[str, nn.Module]:
        return {"actor": self.actor, "critic": self.critic, "value": self.value, "target_critic": self.target_critic}

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor_opt": self.actor_opt, "critic_opt": self.critic_opt, "value_opt": self.value_opt}

    def policy_agent(self) -> RNNAgent:
        return self.actor

    def _step(self, loss: torch.Tensor, net: nn.Module, opt: torch.optim.Optimizer) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = nn.utils.clip_grad_norm_(net.parameters(), self.cfg.grad_clip)
        opt.step()
        return gn

    def update(self, sample) -> dict[str, float]:
        c = self.cfg
        batch = self.scaled(sample(c.batch_episodes))
        T = batch.max_t
        m = batch.mask.unsqueeze(-1).expand(-1, -1, self.n)  # [B, T, n]
        act = batch.actions.unsqueeze(-1)
        steps = step_rows(batch)  # the critics compute the real rows only (fused path; discrete_critics.py)
        # V: expectile of the target Q at the data action
        v_all = self.value(batch.state, batch.obs, obs_rows(batch))[..., 0]  # [B, T+1, n]
        v, next_v = v_all[:, :T], v_all[:, 1:].detach()
        with torch.no_grad():
            tq = self.target_critic(batch.state[:, :T], batch.obs[:, :T], steps).gather(-1, act)[..., 0]  # [B, T, n]
        adv = tq - v
        v_loss = masked_mean(expectile_loss(adv, c.expectile), m)
        v_gn = self._step(v_loss, self.value, self.value_opt)
        # Q: one-step targets from V(o_{t+1})
        y = batch.rewards.unsqueeze(-1) + c.gamma * (1.0 - batch.terminals.unsqueeze(-1)) * next_v
        qs = self.critic.both(batch.state[:, :T], batch.obs[:, :T], steps)
        q_taken = [q.gather(-1, act)[..., 0] for q in qs]
        q_loss = sum(masked_mean((qt - y).pow(2), m) for qt in q_taken) / len(qs)
        q_gn = self._step(q_loss, self.critic, self.critic_opt)
        polyak_(self.target_critic, self.critic, c.target_rate)
        # policy: advantage-weighted BC
        w = clipped_exp_weights(adv, c.beta, c.max_weight)
        p_loss, logp = weighted_bc_loss(self.actor.unroll(batch)[:, :T], batch, w)
        p_gn = self._step(p_loss, self.actor, self.actor_opt)
        self.rounds += 1
        stats = {"value/loss": v_loss.detach(), "value/grad_norm": v_gn, "value/v": masked_mean(v.detach(), m),
                 "critic/q_loss": q_loss.detach(), "critic/grad_norm": q_gn,
                 "critic/q_taken": masked_mean(q_taken[0].detach(), m), "critic/target_q": masked_mean(tq, m),
                 "actor/loss": p_loss.detach(), "actor/grad_norm": p_gn, "actor/weight_mean": masked_mean(w, m),
                 "actor/weight_clipped": masked_mean((w >= c.max_weight).float(), m),
                 "actor/log_pi_taken": masked_mean(logp.detach(), m)}
        return {k: float(v_) for k, v_ in stats.items()}

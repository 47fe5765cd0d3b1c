"""MAICQ (ICQ-MA), discrete actions (SMAX/SMAC): implicit constraint Q-learning with in-sample
targets and an advantage-softmax policy, both weighted across the batch.

Reference: `thu-rllab/CFCQL` `discrete/src/learners/icq_learner.py` + `config/algs/baseline_icq.yaml`
(the ICQ baseline of the CFCQL paper), itself `YiqinYang/ICQ` `ICQ-MA/src/learners/offpg_learner.py`
(reference-implementations.md §4.5). One update round = one critic step and one actor step on a batch
of 128 episodes:

  critic      Q_i(s, o_i, i) per agent over its own actions (OffPGCritic: MLP 256-256, dueling a + v
              head), mixed by a QMIX mixer: Q_tot(s, a) = mix(Q_i(a_i)).
  target      in-sample: Q'_tot at the DATA joint action of step t+1 (target critic + target mixer),
              weighted by ICQ's importance weights across the batch
                  w_b,t = N_t · softmax_b(Q'_tot(b, t) / β_Q),   β_Q = 1000
              (softmax over the episodes b of the batch, per step t, among the N_t episodes still
              running at t; mean weight 1), then TD(λ) returns of w·Q'_tot, λ = 0.8, γ = 0.99.
  critic loss mean over real steps of (Q_tot(s_t, a_t) − y_t)²; RMSprop lr 1e-4 (critic and mixer).
  actor       GRU policy π_i = softmax over the available actions; per agent
                  A_i = Q_i(a_i) − Σ_{j avail} π_i(j) Q_i(j),
                  w_i = N · softmax over the batch of A_i / β,   β = 0.1,
                  loss = − mean over real (step, agent) of k_i(s) · w_i · log π_i(a_i),
              k_i(s) = the mixer's normalised per-agent slope (|W1| |W2|, summed to 1 over agents:
              the reference's `mixer.k`); RMSprop lr 5e-4.
  targets     hard copy every 600 critic steps, counted as the reference counts them (it takes one
              critic step per time index of the batch, so a round adds the batch's longest episode).

Deviations (docs/algorithms/maicq.md): one critic gradient step per round over all time steps (the
reference takes one step per time index, sequentially; the brief's rule of no Python loops over time
outside recursions), and the actor uses this round's critic values from before the critic step; the
mixer's hypernetworks have two layers (the shared QMixer, hypernet 64) where the reference's have
one; softmaxes over the batch ignore padded entries (the reference includes them); the bootstrap at
the final observation of a truncated episode (no data action) uses the policy's expected per-agent
target Q. `tb_lambda` (0.93) and `step` (5) are in the reference configs but unused by both learners.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from plcql_bench.algorithms.base import EpisodeBatch, register
from plcql_bench.algorithms.common.discrete import (
    DiscreteAlgorithm, QMixer, RNNAgent, masked_log_softmax, masked_mean, masked_softmax,
    td_lambda_targets)
from plcql_bench.algorithms.common.nets import hard_update_
from plcql_bench.algorithms.common.discrete_critics import (
    AgentMLP, batch_softmax_weights, obs_mask, obs_rows, policy_expectation, step_rows)
from plcql_bench.suite.core.spec import TaskSpec


@dataclass
class Config:
    # --- networks (default.yaml, baseline_icq.yaml, modules/critics/offpg.py) ---
    hidden: int = 64  # rnn_hidden_dim 64 (agent "rnn")
    critic_hidden: int = 256  # OffPGCritic fc1/fc2 256
    mixing_embed: int = 32  # mixing_embed_dim 32
    hypernet_embed: int = 64  # the shared QMixer's 2-layer hypernetworks (reference: 1 layer)
    # --- optimisation (baseline_icq.yaml, default.yaml) ---
    lr: float = 5e-4  # lr 0.0005 (actor, RMSprop)
    critic_lr: float = 1e-4  # critic_lr 0.0001 (critic and mixer, RMSprop)
    optim_alpha: float = 0.99  # optim_alpha 0.99 (RMSprop α)
    optim_eps: float = 1e-5  # optim_eps 1e-5
    grad_clip: float = 10.0  # grad_norm_clip 10 (default.yaml; ICQ's own repo: 20)
    batch_episodes: int = 128  # batch_size 128 episodes (ICQ's own repo: 32)
    gamma: float = 0.99  # gamma 0.99
    reward_scale: float = 1.0  # rewards x this in the update; SMAX: 10 (configs/discrete_common.yaml)
    bootstrap_timeouts: bool = False  # False: a timeout is terminal, as in the references (common/discrete.py)
    td_lambda: float = 0.8  # td_lambda 0.8
    # --- ICQ weights (icq_learner.py constants) ---
    beta_q: float = 1000.0  # critic importance weights softmax(Q'_tot / 1000) over the batch
    beta_policy: float = 0.1  # actor weights softmax(A / 0.1) over the batch
    target_update_interval: int = 600  # target_update_interval 600 critic steps (reference counting)


def mixer_slopes(mixer: QMixer, state: torch.Tensor) -> torch.Tensor:
    """k(s) [*L, n]: the mixer's per-agent slope |W1|·|W2| through the hidden layer, normalised to sum
    1 over agents (the reference's `QMixer.k`; with ELU's slope taken as 1)."""
    lead = state.shape[:-1]
    w1, _, w2, _ = mixer.weights(state.reshape(-1, state.shape[-1]))
    k = torch.bmm(w1, w2)[..., 0]  # [M, n]
    return (k / k.sum(-1, keepdim=True).clamp_min(1e-12)).reshape(*lead, -1)


@register
class MAICQDiscrete(DiscreteAlgorithm):
    name = "maicq"
    Config = Config

    def __init__(self, spec: TaskSpec, config: Config, seed: int, device: str = "cpu") -> None:
        super().__init__(spec, config, seed, device)
        c = config
        self.actor = self.build(1, lambda: self.new_agent(c.hidden))
        self.critic = self.build(2, lambda: AgentMLP(spec.state_dim, spec.obs_dim, self.n, self.A, c.critic_hidden,
                                                     dueling=True))
        self.mixer = self.build(3, lambda: self.new_mixer(c.mixing_embed, c.hypernet_embed))
        self.target_critic = self.target_of(self.critic)
        self.target_mixer = self.target_of(self.mixer)
        rms = dict(alpha=c.optim_alpha, eps=c.optim_eps)
        self.actor_opt = torch.optim.RMSprop(self.actor.parameters(), lr=c.lr, **rms)
        self.critic_params = [*self.critic.parameters(), *self.mixer.parameters()]
        self.critic_opt = torch.optim.RMSprop(self.critic_params, lr=c.critic_lr, **rms)
        self.counters = {"critic_steps": 0, "last_target_update": 0}

    # -- checkpoint -----------------------------------------------------------------------------
    def modules(self) -> dict[str, nn.Module]:
        return {"actor": self.actor, "critic": self.critic, "mixer": self.mixer, "target_critic": self.target_critic,
                "target_mixer": self.target_mixer}

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor_opt": self.actor_opt, "critic_opt": self.critic_opt}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "counters": dict(self.counters)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.counters = dict(state["counters"])

    def policy_agent(self) -> RNNAgent:
        return self.actor

    # -- losses ---------------------------------------------------------------------------------
    @torch.no_grad()
    def compute_target(self, batch: EpisodeBatch,
                       logits: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(TD(λ) targets [B, T], importance weights [B, T+1]) from the target critic and mixer at the
        data actions (at the final observation of an episode: the policy's expected target Q; logits =
        the actor's outputs [B, T+1, n, A], computed here when not given)."""
        T = batch.max_t
        if logits is None:
            logits = self.actor.unroll(batch)
        tq = self.target_critic(batch.state, batch.obs, obs_rows(batch))  # [B, T+1, n, A]
        acts = torch.cat([batch.actions, batch.actions.new_zeros(batch.actions[:, :1].shape)], 1)  # [B, T+1, n]
        q_data = tq.gather(-1, acts.unsqueeze(-1))[..., 0]
        q_pi = policy_expectation(logits, tq, batch.avail)
        last = torch.arange(T + 1, device=tq.device)[None, :] == batch.lengths[:, None]  # [B, T+1]
        q_tot = self.target_mixer(torch.where(last.unsqueeze(-1), q_pi, q_data), batch.state)  # [B, T+1]
        om = obs_mask(batch)
        w = batch_softmax_weights(q_tot, om, self.cfg.beta_q) * om.sum(0, keepdim=True)
        y = td_lambda_targets(batch.rewards, batch.terminals, batch.mask, w * q_tot, self.cfg.gamma,
                              self.cfg.td_lambda)
        return y, w

    def actor_loss(self, batch: EpisodeBatch, logits: torch.Tensor, q: torch.Tensor,
                   k: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """ICQ policy loss from logits [B, T, n, A], critic values q [B, T, n, A] and mixer slopes
        k [B, T, n] (both detached)."""
        T = batch.max_t
        avail = batch.avail[:, :T]
        m = batch.mask.unsqueeze(-1).expand(-1, -1, self.n)  # [B, T, n]
        logp = masked_log_softmax(logits, avail).gather(-1, batch.actions.unsqueeze(-1))[..., 0]
        q_taken = q.gather(-1, batch.actions.unsqueeze(-1))[..., 0]
        adv = q_taken - policy_expectation(logits.detach(), q, avail)
        w = batch_softmax_weights(adv, m, self.cfg.beta_policy) * m.sum(0, keepdim=True)
        loss = -masked_mean(k * w * logp, m)
        pi_max = masked_softmax(logits.detach(), avail).max(-1).values
        return loss, {"actor/adv": masked_mean(adv, m), "actor/weight_max": (w * m).max(),
                      "actor/pi_max": masked_mean(pi_max, m), "actor/log_pi_taken": masked_mean(logp.detach(), m)}

    def update(self, sample) -> dict[str, float]:
        c = self.cfg
        batch = self.scaled(sample(c.batch_episodes))
        T = batch.max_t
        logits = self.actor.unroll(batch)  # [B, T+1, n, A]
        y, w_q = self.compute_target(batch, logits.detach())
        # critic + mixer
        q = self.critic(batch.state[:, :T], batch.obs[:, :T], step_rows(batch))  # [B, T, n, A]
        q_tot = self.mixer(q.gather(-1, batch.actions.unsqueeze(-1))[..., 0], batch.state[:, :T])
        td = masked_mean((q_tot - y).pow(2), batch.mask)
        with torch.no_grad():
            k = mixer_slopes(self.mixer, batch.state[:, :T])
        self.critic_opt.zero_grad(set_to_none=True)
        td.backward()
        cgn = nn.utils.clip_grad_norm_(self.critic_params, c.grad_clip)
        self.critic_opt.step()
        self.counters["critic_steps"] += int(batch.lengths.max())
        if self.counters["critic_steps"] - self.counters["last_target_update"] >= c.target_update_interval:
            hard_update_(self.target_critic, self.critic)
            hard_update_(self.target_mixer, self.mixer)
            self.counters["last_target_update"] = self.counters["critic_steps"]
        # actor
        loss, stats = self.actor_loss(batch, logits[:, :T], q.detach(), k)
        self.actor_opt.zero_grad(set_to_none=True)
        loss.backward()
        agn = nn.utils.clip_grad_norm_(self.actor.parameters(), c.grad_clip)
        self.actor_opt.step()
        self.rounds += 1
        stats.update({"critic/td_loss": td.detach(), "critic/q_taken": masked_mean(q_tot.detach(), batch.mask),
                      "critic/target": masked_mean(y, batch.mask), "critic/grad_norm": cgn,
                      "critic/is_weight_max": w_q.max(), "actor/loss": loss.detach(), "actor/grad_norm": agn})
        return {k_: float(v) for k_, v in stats.items()}

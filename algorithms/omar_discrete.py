"""OMAR, discrete actions (SMAX/SMAC): independent per-agent CQL critics + a policy-gradient actor
rectified toward the critic's best action.

Reference: `thu-rllab/CFCQL` `discrete/src/learners/omar_learner.py` + `config/algs/baseline_omar.yaml`
(the OMAR baseline of the CFCQL paper; reference-implementations.md §4.1 "OMAR on SMAC"). One update
round = one critic step and one actor step on a batch of 128 episodes:

  critic     twin per-agent Q_i^{1,2}(s, o_i, i) over agent i's own actions (`DoubleMLPNetwork`: MLP
             256-256, dueling a + v heads); independent learners, no mixer.
  target     per agent and per twin, TD(λ) returns (λ 0.6, γ 0.99, the team reward for every agent) of
             Q'_i at the TARGET policy's greedy available action; y_i = min over the twins' returns.
  CQL        per agent and twin: logsumexp over the AVAILABLE actions of Q_i − Q_i(a_i), cql_alpha 5.
  critic loss Σ_twins mean (Q_i(a_i) − y_i)² + cql_alpha · Σ_twins mean CQL; Adam lr 1e-3.
  actor      GRU policy π_i (softmax over the available actions), Adam lr 1e-3:
               (1 − omar_coe) · COMA-style PG: − mean A_i · log π_i(a_i),  A_i = Q^1_i(a_i) − Σ_j π_i(j) Q^1_i(j)
             + omar_coe · rectification: mean over real (step, agent) of mean_j (π_i(j) − 1[j = â_i])²,
             â_i = the rectification target below; omar_coe 0.5.
  targets    hard copy of critic and policy every 25 rounds (the reference's "every 200 episodes", its
             episode counter growing by batch_size_run = 8 per iteration, as for CFCQL).

Rectification target â (`omar_search`):
  "argmax"  (default) â = argmax_{j available} Q^1_i(j): what the reference's live code does (its
            zeroth-order CEM search over action indices is commented out, so `omar_iters` and
            `omar_num_samples` have no effect there). Exact, and the limit of "sampled" with many samples.
  "sampled" the zeroth-order search of OMAR (continuous: iterated Q-softmax-weighted resampling)
            carried to a categorical: start from the uniform distribution over the available actions;
            for `omar_iters` iterations draw `omar_num_samples` actions from it and replace it by the
            softmax(Q^1)-weighted empirical distribution of the samples. â = the better, by Q^1, of
            the last iteration's best sample and the policy's greedy action (OMAR's rule).

Deviations (docs/algorithms/omar.md): one critic step per round over all time steps (the reference
steps once per time index); the actor uses this round's critic values from before the critic step;
CQL's logsumexp and the rectification argmax run over the available actions only (the reference takes
both over all actions); the rectification MSE averages over real steps only (the reference's includes
padding); the twins have their own output heads (the reference's share `fc3`/`fc3_v`: `shared_head`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from plcql_bench.algorithms.base import EpisodeBatch, register
from plcql_bench.algorithms.common.discrete import (
    DiscreteAlgorithm, RNNAgent, masked_argmax, masked_log_softmax, masked_logsumexp, masked_mean,
    masked_softmax)
from plcql_bench.algorithms.common.nets import hard_update_
from plcql_bench.algorithms.common.discrete_critics import TwinAgentQ, obs_rows, per_agent_td_lambda, step_rows
from plcql_bench.suite.core.spec import TaskSpec


@dataclass
class Config:
    # --- networks (default.yaml, modules/critics/discrete_critic.py) ---
    hidden: int = 64  # rnn_hidden_dim 64
    critic_hidden: int = 256  # DoubleMLPNetwork hidden_dim 256
    shared_head: bool = False  # True = the reference's twins sharing fc3/fc3_v (a bug)
    # --- optimisation (baseline_omar.yaml, default.yaml) ---
    lr: float = 1e-3  # lr 0.001 (actor, Adam)
    critic_lr: float = 1e-3  # critic_lr 0.001 (Adam)
    grad_clip: float = 10.0  # grad_norm_clip 10
    batch_episodes: int = 128  # batch_size 128 episodes
    gamma: float = 0.99  # gamma 0.99
    reward_scale: float = 1.0  # rewards x this in the update; SMAX: 10 (configs/discrete_common.yaml)
    bootstrap_timeouts: bool = False  # False: a timeout is terminal, as in the references (common/discrete.py)
    td_lambda: float = 0.6  # td_lambda 0.6
    target_update_interval: int = 25  # rounds: target_update_interval 200 "episodes" / batch_size_run 8
    # --- CQL and OMAR (baseline_omar.yaml) ---
    cql_alpha: float = 5.0  # cql_alpha 5.0
    omar_coe: float = 0.5  # omar_coe 0.5
    omar_search: str = "argmax"  # "argmax" (the reference's live code) | "sampled" (zeroth-order search)
    omar_iters: int = 5  # omar_iters 5 ("sampled" only)
    omar_num_samples: int = 10  # omar_num_samples 10 ("sampled" only)


@register
class OMARDiscrete(DiscreteAlgorithm):
    name = "omar"
    Config = Config

    def __init__(self, spec: TaskSpec, config: Config, seed: int, device: str = "cpu") -> None:
        super().__init__(spec, config, seed, device)
        c = config
        if c.omar_search not in ("argmax", "sampled"):
            raise ValueError(f"omar: omar_search must be 'argmax' or 'sampled', got {c.omar_search!r}")
        self.actor = self.build(1, lambda: self.new_agent(c.hidden))
        self.critic = self.build(2, lambda: TwinAgentQ(spec.state_dim, spec.obs_dim, self.n, self.A, c.critic_hidden,
                                                       dueling=True, shared_head=c.shared_head))
        self.target_actor = self.target_of(self.actor)
        self.target_critic = self.target_of(self.critic)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=c.lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=c.critic_lr)

    def modules(self) -> dict[str, nn.Module]:
        return {"actor": self.actor, "critic": self.critic, "target_actor": self.target_actor,
                "target_critic": self.target_critic}

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor_opt": self.actor_opt, "critic_opt": self.critic_opt}

    def policy_agent(self) -> RNNAgent:
        return self.actor

    # -- critic ---------------------------------------------------------------------------------
    @torch.no_grad()
    def compute_target(self, batch: EpisodeBatch) -> torch.Tensor:
        """y [B, T, n]: min over the twins of per-agent TD(λ) returns at the target policy's greedy
        available action."""
        a_next = masked_argmax(self.target_actor.unroll(batch), batch.avail)  # [B, T+1, n]
        tq1, tq2 = self.target_critic.both(batch.state, batch.obs, obs_rows(batch))  # [B, T+1, n, A]
        c = self.cfg
        ys = [per_agent_td_lambda(batch, tq.gather(-1, a_next.unsqueeze(-1))[..., 0], c.gamma, c.td_lambda)
              for tq in (tq1, tq2)]
        return torch.minimum(*ys)

    # -- actor ----------------------------------------------------------------------------------
    @torch.no_grad()
    def rectify_target(self, q: torch.Tensor, avail: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """â [*L] (int64, always available): the action the policy is pulled toward (module docstring)."""
        if self.cfg.omar_search == "argmax":
            return masked_argmax(q, avail)
        A = q.shape[-1]
        ok = (avail > 0).to(q.dtype)
        ok = torch.where(ok.sum(-1, keepdim=True) > 0, ok, torch.ones_like(ok))  # empty rows: anything (masked later)
        p = (ok / ok.sum(-1, keepdim=True)).reshape(-1, A)
        qf = q.reshape(-1, A)
        K = self.cfg.omar_num_samples
        for _ in range(self.cfg.omar_iters):  # a few iterations of the search, each vectorised over all rows
            samples = torch.multinomial(p, K, replacement=True, generator=self.gen)  # [M, K]
            w = torch.softmax(qf.gather(-1, samples), -1)  # [M, K]
            p = torch.zeros_like(p).scatter_add_(-1, samples, w)
        q_s = qf.gather(-1, samples)
        best = samples.gather(-1, q_s.argmax(-1, keepdim=True))[:, 0]  # [M]
        greedy = masked_argmax(logits, avail).reshape(-1)
        q_best, q_greedy = q_s.max(-1).values, qf.gather(-1, greedy[:, None])[:, 0]
        return torch.where(q_greedy > q_best, greedy, best).reshape(q.shape[:-1])

    def actor_loss(self, batch: EpisodeBatch, logits: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """logits [B, T, n, A], q = Q^1 [B, T, n, A] (detached) -> (loss, diagnostics)."""
        T, c = batch.max_t, self.cfg
        avail = batch.avail[:, :T]
        m = batch.mask.unsqueeze(-1).expand(-1, -1, self.n)
        probs = masked_softmax(logits, avail)
        logp = masked_log_softmax(logits, avail).gather(-1, batch.actions.unsqueeze(-1))[..., 0]
        q_taken = q.gather(-1, batch.actions.unsqueeze(-1))[..., 0]
        adv = q_taken - (probs.detach() * torch.where(avail > 0, q, torch.zeros_like(q))).sum(-1)
        pg = -masked_mean(adv * logp, m)
        target = self.rectify_target(q, avail, logits.detach())
        rect = masked_mean((probs - F.one_hot(target, self.A).to(probs.dtype)).pow(2).mean(-1), m)
        loss = (1.0 - c.omar_coe) * pg + c.omar_coe * rect
        agree = (masked_argmax(logits.detach(), avail) == target).to(probs.dtype)
        return loss, {"actor/pg_loss": pg.detach(), "actor/omar_loss": rect.detach(),
                      "actor/pi_taken": masked_mean(logp.detach().exp(), m), "actor/greedy_is_target": masked_mean(agree, m)}

    def update(self, sample) -> dict[str, float]:
        c = self.cfg
        batch = self.scaled(sample(c.batch_episodes))
        T = batch.max_t
        m = batch.mask.unsqueeze(-1).expand(-1, -1, self.n)
        avail = batch.avail[:, :T]
        y = self.compute_target(batch)
        q1, q2 = self.critic.both(batch.state[:, :T], batch.obs[:, :T], step_rows(batch))  # [B, T, n, A]
        td, cql = 0.0, 0.0
        for q in (q1, q2):  # the two twins
            q_taken = q.gather(-1, batch.actions.unsqueeze(-1))[..., 0]
            td = td + masked_mean((q_taken - y).pow(2), m)
            cql = cql + masked_mean(masked_logsumexp(q, avail) - q_taken, m)
        closs = td + c.cql_alpha * cql
        self.critic_opt.zero_grad(set_to_none=True)
        closs.backward()
        cgn = nn.utils.clip_grad_norm_(self.critic.parameters(), c.grad_clip)
        self.critic_opt.step()
        logits = self.actor.unroll(batch)[:, :T]
        aloss, stats = self.actor_loss(batch, logits, q1.detach())
        self.actor_opt.zero_grad(set_to_none=True)
        aloss.backward()
        agn = nn.utils.clip_grad_norm_(self.actor.parameters(), c.grad_clip)
        self.actor_opt.step()
        self.rounds += 1
        if self.rounds % c.target_update_interval == 0:
            hard_update_(self.target_critic, self.critic)
            hard_update_(self.target_actor, self.actor)
        q1_taken = q1.detach().gather(-1, batch.actions.unsqueeze(-1))[..., 0]
        stats.update({"critic/td_loss": td.detach(), "critic/cql": cql.detach(), "critic/loss": closs.detach(),
                      "critic/q_taken": masked_mean(q1_taken, m), "critic/target": masked_mean(y, m),
                      "critic/grad_norm": cgn, "actor/loss": aloss.detach(), "actor/grad_norm": agn})
        return {k: float(v) for k, v in stats.items()}

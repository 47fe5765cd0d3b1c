"""CFCQL, discrete actions (SMAX/SMAC): QMIX with TD(λ) targets + counterfactual CQL.

Reference: `thu-rllab/CFCQL` `discrete/src/learners/cq_learner.py` with `config/algs/cql_qmix.yaml`
(reference-implementations.md §4.3). One update round = one gradient step on 128 episodes:

  Q-values    q = GRU agent(o_t ⊕ a_{t-1} ⊕ id)                          [B, T+1, n, A]
  target      y = TD(λ) returns of Q'_tot(s_t, argmax_avail q(o_t)) (double Q: online argmax over the
              available actions, target agent + target mixer), γ 0.99, λ 0.6
  TD loss     mean over real steps of ½ (Q_tot(s, a) − y)²
  CF-CQL      for agent i and each of its actions j: Q_tot(s, a_i = j, a_-i from the data); unavailable
              j never enter (masked logsumexp);
              pen = mean over real steps of Σ_i λ_i logsumexp_{j avail} Q_tot(s, j, a_-i) − Q_tot(s, a)
  loss        TD + cql_alpha · pen; Adam lr 1e-3, gradient-norm clip 10
  targets     hard copy every 25 rounds (the reference's "every 200 episodes", its episode counter
              growing by batch_size_run = 8 per iteration)

λ (`moderate_lambda`): a behaviour model β (the same GRU agent, masked softmax policy, trained by
masked cross-entropy, CFCQL `train_behaviour`) is trained first. Then per step
    KL_i = Σ_{j avail} μ_i(j) (log μ_i(j) − log β_i(j)),   μ_i = softmax_j Q_tot(s, j, a_-i)
(μ is the policy the counterfactual Q_tot implies for agent i: the reference's `kl_div(log β, μ)`),
λ = softmax_i(softmax_temp · KL_i), detached; softmax_temp = 100 means a hard argmax over agents and
0 uniform weights 1/n (then no behaviour model is trained). `cql_alpha` (the reference's
`global_cql_alpha`) and `softmax_temp` come per map and dataset from configs/cfcql_discrete.yaml.

Behaviour training budget, as the reference's (`run/offline_utils.py` `train_behaviour_policy`,
lines 23-36; `config/default.yaml` `max_behaviour_train_steps: 10000000`): β trains before the first
Q step on 128-episode batches until the batches it has drawn hold `behaviour_timesteps` = 10M
sampled timesteps, counted as the reference counts them: its `filled` mask marks L + 1 entries per
episode of L steps (the runner fills the reset observation and every next observation,
`runners/parallel_runner.py` lines 85 and 179). No early stop: the reference computes a "loss not
improved for 20 steps" flag (`learners/cq_learner.py` lines 119-124) and never uses it.
`behaviour_max_updates` (0 = none, the reference) caps the updates for smoke profiles. The metrics
report `behaviour/updates` and `behaviour/timesteps`. See docs/algorithms/cfcql.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from plcql_bench.algorithms.base import EpisodeBatch, register
from plcql_bench.algorithms.bc_discrete import bc_step
from plcql_bench.algorithms.common import kernels_discrete as fast
from plcql_bench.algorithms.common.discrete import (
    DiscreteAlgorithm, RNNAgent, masked_argmax, masked_logsumexp, masked_mean, masked_softmax,
    td_lambda_targets)
from plcql_bench.algorithms.common.nets import hard_update_
from plcql_bench.suite.core.spec import TaskSpec


@dataclass
class Config:
    # --- QMIX backbone (cql_qmix.yaml, default.yaml) ---
    hidden: int = 64  # rnn_hidden_dim 64 (n_rnn agent)
    mixing_embed: int = 32  # mixing_embed_dim 32
    hypernet_embed: int = 64  # hypernet_embed 64
    lr: float = 1e-3  # lr 0.001, optimizer adam
    gamma: float = 0.99  # gamma 0.99
    reward_scale: float = 1.0  # rewards x this in the update; SMAX: 10 (configs/discrete_common.yaml)
    bootstrap_timeouts: bool = False  # False: a timeout is terminal, as in the references (common/discrete.py)
    td_lambda: float = 0.6  # td_lambda 0.6 on every map (configs/cfcql_discrete.yaml says why)
    batch_episodes: int = 128  # batch_size 128 episodes
    grad_clip: float = 10.0  # grad_norm_clip 10
    target_update_interval: int = 25  # rounds: 200 "episodes" / batch_size_run 8
    double_q: bool = True  # online argmax, target evaluation (cq_learner)
    # --- counterfactual CQL ---
    cql_alpha: float = 50.0  # global_cql_alpha 50.0 (cql_qmix.yaml); per map/dataset via the table
    softmax_temp: float = 5.0  # softmax_temp 5 (cql_qmix.yaml); per map/dataset via the table; 0 = 1/n
    # --- behaviour model for λ (moderate_lambda) ---
    behaviour_lr: float = 1e-3  # the reference's behaviour optimiser uses args.lr
    behaviour_timesteps: int = 10_000_000  # max_behaviour_train_steps 10M sampled (filled) timesteps
    behaviour_max_updates: int = 0  # cap on β updates; 0 = none (the reference); smoke profiles set it


def new_behaviour_state() -> dict[str, Any]:
    """β's training progress (checkpointed): updates, sampled timesteps, done, last loss."""
    return {"updates": 0, "timesteps": 0, "done": False, "loss": 0.0}


def counterfactual_cql(cf: torch.Tensor, lam: torch.Tensor, batch: EpisodeBatch,
                       q_tot: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """cf [..., B, T, n, A] (Q_tot with agent i's action replaced by each action), λ [..., B, T, n]:
    Σ_i λ_i logsumexp over agent i's AVAILABLE actions, minus q_tot [..., B, T]; and diagnostics."""
    lse = masked_logsumexp(cf, batch.avail[:, :batch.max_t])  # [..., B, T, n]
    return cql_from_negative((lam * lse).sum(-1), lam, batch, q_tot)


def cql_from_negative(neg: torch.Tensor, lam: torch.Tensor, batch: EpisodeBatch,
                      q_tot: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The penalty neg − q_tot [..., B, T] and diagnostics from the negative term and λ."""
    m = batch.mask
    stats = {"cql/lambda_max": masked_mean(lam.max(-1).values, m), "cql/lambda_min": masked_mean(lam.min(-1).values, m),
             "cql/negative": masked_mean(neg.detach(), m)}
    return neg - q_tot, stats


@register
class CFCQLDiscrete(DiscreteAlgorithm):
    name = "cfcql"
    Config = Config
    table = "cfcql_discrete"  # also the table of its subclasses (MACQL sets its own)
    legacy_keys = {"q_agent": "critic", "target_agent": "target_critic", "opt": "critic_opt"}  # before issue 22

    def __init__(self, spec: TaskSpec, config: Config, seed: int, device: str = "cpu") -> None:
        super().__init__(spec, config, seed, device)
        c = config
        self.critic = self.build(1, lambda: self.agent(c.hidden))
        self.mixer = self.build(2, lambda: self.mixer(c.mixing_embed, c.hypernet_embed))
        self.target_critic = self.target_of(self.critic)
        self.target_mixer = self.target_of(self.mixer)
        self.critic_opt = torch.optim.Adam([*self.critic.parameters(), *self.mixer.parameters()], lr=c.lr)
        self.behaviour: RNNAgent | None = None
        if self.uses_behaviour():
            self.behaviour = self.build(3, lambda: self.agent(c.hidden))
            self.behaviour_opt = torch.optim.Adam(self.behaviour.parameters(), lr=c.behaviour_lr)
        self.behaviour_state = new_behaviour_state()

    def uses_behaviour(self) -> bool:
        return self.cfg.softmax_temp != 0 and self.cfg.cql_alpha > 0

    # -- protocol -------------------------------------------------------------------------------
    def value_modules(self) -> dict[str, nn.Module]:
        """The Q agents and mixers, online and target (the ensemble subclass stacks them)."""
        return {"critic": self.critic, "mixer": self.mixer, "target_critic": self.target_critic,
                "target_mixer": self.target_mixer}

    def modules(self) -> dict[str, nn.Module]:
        m = self.value_modules()
        if self.behaviour is not None:
            m["behaviour"] = self.behaviour
        return m

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        o = {"critic_opt": self.critic_opt}
        if self.behaviour is not None:
            o["behaviour_opt"] = self.behaviour_opt
        return o

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "behaviour_state": dict(self.behaviour_state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.behaviour_state = dict(state["behaviour_state"])

    def policy_agent(self) -> RNNAgent:
        return self.critic

    # -- behaviour model ------------------------------------------------------------------------
    def train_behaviour(self, sample) -> dict[str, float]:
        """Train β until its sampled-timestep budget is spent (or the optional update cap); a
        no-op once done. Called before every Q step, so β is fully trained before the first one."""
        st, c = self.behaviour_state, self.cfg
        while not st["done"]:
            batch = sample(c.batch_episodes)
            st["loss"] = bc_step(self.behaviour, self.behaviour_opt, batch, c.grad_clip)
            st["updates"] += 1
            st["timesteps"] += int((batch.lengths + 1).sum())  # the reference's filled entries: L + 1
            capped = 0 < c.behaviour_max_updates <= st["updates"]
            st["done"] = st["timesteps"] >= c.behaviour_timesteps or capped
        return {"behaviour/updates": float(st["updates"]), "behaviour/timesteps": float(st["timesteps"]),
                "behaviour/loss": float(st["loss"])}

    @torch.no_grad()
    def cf_weights(self, cf: torch.Tensor, batch: EpisodeBatch) -> torch.Tensor:
        """λ [B, T, n] from the counterfactual Q_tot cf [B, T, n, A] (see the module docstring)."""
        B, T, n, _ = cf.shape
        temp = self.cfg.softmax_temp
        if self.behaviour is None or temp == 0:
            return cf.new_full((B, T, n), 1.0 / n)
        avail = batch.avail[:, :T]
        beta = masked_softmax(self.behaviour.unroll(batch)[:, :T], avail)
        mu = masked_softmax(cf, avail)
        eps = 1e-5  # as the reference's kl_div(log(β + 1e-5), μ + 1e-5)
        kl = ((mu + eps) * ((mu + eps).log() - (beta + eps).log()) * avail).sum(-1)  # [B, T, n]
        if temp >= 100:  # the reference's hard argmax
            return torch.nn.functional.one_hot(kl.argmax(-1), n).float()
        return torch.softmax(temp * kl, -1)

    # -- losses ---------------------------------------------------------------------------------
    @torch.no_grad()
    def compute_target(self, batch: EpisodeBatch, q_all: torch.Tensor | None = None) -> torch.Tensor:
        """TD(λ) targets [B, T] (double Q over the available actions; q_all = the online agent's
        outputs [B, T+1, n, A], computed here when not given)."""
        tq = self.target_critic.unroll(batch)  # [B, T+1, n, A]
        if q_all is None and self.cfg.double_q:
            q_all = self.critic.unroll(batch)
        choose_from = q_all.detach() if self.cfg.double_q else tq
        a_star = masked_argmax(choose_from, batch.avail)  # [B, T+1, n]
        tq_tot = self.target_mixer(tq.gather(-1, a_star.unsqueeze(-1))[..., 0], batch.state)  # [B, T+1]
        return td_lambda_targets(batch.rewards, batch.terminals, batch.mask, tq_tot, self.cfg.gamma,
                                 self.cfg.td_lambda)

    @torch.no_grad()
    def behaviour_logprob(self, batch: EpisodeBatch) -> torch.Tensor | None:
        """log(β + 1e-5) [B·T, n, A] for the fused λ (kernels_discrete.cf_lambda); None when λ is uniform."""
        if self.behaviour is None or self.cfg.softmax_temp == 0:
            return None
        T = batch.max_t
        beta = masked_softmax(self.behaviour.unroll(batch)[:, :T], batch.avail[:, :T])
        return beta.add_(1e-5).log_().flatten(0, 1)

    def cql_penalty(self, batch: EpisodeBatch, q: torch.Tensor, q_tot: torch.Tensor,
                    mix_w: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, dict]:
        """Counterfactual CQL: [B, T] negative term minus Q_tot(s, a), and diagnostics (mix_w: the
        mixer's weights at s_0..s_T-1 when the caller has them)."""
        if self.mixer.fused:  # mixer, λ and logsumexp in one cache-blocked pass (kernels_discrete.cf_negative)
            B, T, n, A = q.shape
            parts = self.mixer.counterfactual_parts(q, batch.actions, batch.state[:, :T], mix_w)
            neg, lam = fast.cf_negative(*parts, batch.avail[:, :T].reshape(B * T, n, A), self.behaviour_logprob(batch),
                                        self.cfg.softmax_temp, 1)
            return cql_from_negative(neg.view(B, T), lam.view(B, T, n), batch, q_tot)
        cf = self.mixer.counterfactual(q, batch.actions, batch.state[:, :batch.max_t], mix_w)  # [B, T, n, A]
        return counterfactual_cql(cf, self.cf_weights(cf.detach(), batch), batch, q_tot)

    def update(self, sample) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.behaviour is not None:  # every round reports the same keys (the runner averages them)
            out.update(self.train_behaviour(sample))
        batch = self.scaled(sample(self.cfg.batch_episodes))
        T = batch.max_t
        q_all = self.critic.unroll(batch)  # [B, T+1, n, A]
        q = q_all[:, :T]
        q_taken = q.gather(-1, batch.actions.unsqueeze(-1))[..., 0]  # [B, T, n]
        mix_w = self.mixer.weights(batch.state[:, :T].reshape(-1, batch.state.shape[-1])) if self.mixer.fused else None
        q_tot = self.mixer.mix_many(q_taken.unsqueeze(-2), batch.state[:, :T], mix_w)[..., 0]  # [B, T] (shared weights)
        y = self.compute_target(batch, q_all)
        td = masked_mean(0.5 * (q_tot - y).pow(2), batch.mask)
        loss = td
        stats = {"critic/td_loss": td.detach(), "critic/q_taken": masked_mean(q_tot.detach(), batch.mask),
                 "critic/target": masked_mean(y, batch.mask)}
        if self.cfg.cql_alpha > 0:
            pen_bt, cst = self.cql_penalty(batch, q, q_tot, mix_w)
            pen = masked_mean(pen_bt, batch.mask)
            loss = loss + self.cfg.cql_alpha * pen
            stats.update(cst)
            stats["cql/penalty"] = pen.detach()
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        params = [*self.critic.parameters(), *self.mixer.parameters()]
        gn = nn.utils.clip_grad_norm_(params, self.cfg.grad_clip) if self.cfg.grad_clip > 0 else torch.zeros(())
        self.critic_opt.step()
        self.rounds += 1
        if self.rounds % self.cfg.target_update_interval == 0:
            hard_update_(self.target_critic, self.critic)
            hard_update_(self.target_mixer, self.mixer)
        stats["critic/loss"] = loss.detach()
        stats["critic/grad_norm"] = gn
        out.update({k: float(v) for k, v in stats.items()})
        return out

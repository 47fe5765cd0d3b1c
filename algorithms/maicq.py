"""MAICQ (ICQ-MA, Yang et al. 2021), a continuous-action construction.

The reference (`YiqinYang/ICQ@5a4da85` ICQ-MA, and CFCQL's `baseline_icq.yaml`) is discrete-only; no
continuous MA-ICQ exists in any repository read (reference-implementations.md §4.5). This construction
keeps ICQ-MA's two ingredients and its constants, and replaces only what needs discrete actions:

  * critic: per-agent Q_i(o_i, a_i) (an MLP over the agent's observation and continuous action instead
    of a head over the discrete actions), combined by a QMIX mixer on the state (embed 32, hypernet 64,
    monotonic, as `QMixer`);
  * in-sample critic target (one-step, the reference uses TD(lambda) over episodes):
        y = r + gamma (1 - d) * B * softmax_batch(Qbar_tot(s', a') / beta_Q) * Qbar_tot(s', a'),
    a' = the DATASET next joint action, beta_Q = 1000; the weights are detached;
  * actor: ICQ's advantage-softmax weighted behaviour cloning, per agent
        L_i = B * sum_b softmax_batch(A_i / beta_pi)_b * |pi_i(o_i) - a_i|^2 / B,  beta_pi = 0.1,
    A_i = Q_i(o_i, a_i) - Q_i(o_i, pi_i(o_i)) (the deterministic actor's value replaces the expectation
    over the discrete policy); the squared error replaces -log pi (a fixed-variance Gaussian);
  * optimiser RMSprop (alpha 0.99, eps 1e-5), lr 5e-4 actor / 1e-4 critic, grad clip 20, target critic
    updated every 600 critic steps (hard), gamma of the task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from plcql_bench.algorithms.base import BatchSampler, register
from plcql_bench.algorithms.common.configs import tier_table
from plcql_bench.algorithms.common.continuous import Actors
from plcql_bench.algorithms.common.independent import IndepCritics
from plcql_bench.algorithms.common.checkpoint import Checkpointable, DeterministicActors
from plcql_bench.algorithms.common.nets import clip_grad_norm_stacked_, hard_update_
from plcql_bench.suite.core.spec import TaskSpec


@dataclass
class Config:
    hidden: int = 64  # ICQ RNN agents hidden 64; MLPs here (OMAR sizes: 64 MPE / 256 HalfCheetah)
    lr: float = 5e-4  # offpg_smac.yaml lr (actor)
    critic_lr: float = 1e-4  # offpg_smac.yaml critic_lr
    batch_size: int = 1024  # transitions (the reference: 32 / 128 episodes)
    gamma: float = 0.95  # task discount
    beta_pi: float = 0.1  # advantage softmax temperature (policy)
    beta_q: float = 1000.0  # target-Q softmax temperature (critic)
    mixing_embed_dim: int = 32
    hypernet_embed: int = 64
    target_update_interval: int = 600  # hard target update every 600 critic steps
    grad_clip: float = 20.0
    input_norm: bool = True  # actor input BatchNorm, as the other MPE baselines


class QMixer(nn.Module):
    """Monotonic QMIX mixer: Q_tot = elu(q W1(s) + b1(s)) w2(s) + V(s), |W1|, |w2| (hypernetworks)."""

    def __init__(self, n: int, state_dim: int, embed: int, hyper: int) -> None:
        super().__init__()
        self.n, self.embed = n, embed
        self.w1 = nn.Sequential(nn.Linear(state_dim, hyper), nn.ReLU(), nn.Linear(hyper, n * embed))
        self.w2 = nn.Sequential(nn.Linear(state_dim, hyper), nn.ReLU(), nn.Linear(hyper, embed))
        self.b1 = nn.Linear(state_dim, embed)
        self.v = nn.Sequential(nn.Linear(state_dim, embed), nn.ReLU(), nn.Linear(embed, 1))

    def forward(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """q [B, n], s [B, S] -> [B]."""
        B = q.shape[0]
        w1 = self.w1(s).abs().view(B, self.n, self.embed)
        h = nn.functional.elu(torch.bmm(q.unsqueeze(1), w1)[:, 0] + self.b1(s))
        return (h * self.w2(s).abs()).sum(-1) + self.v(s)[:, 0]


@register
class MAICQ(Checkpointable, DeterministicActors):
    name = "maicq"
    Config = Config
    discrete = False

    @classmethod
    def task_overrides(cls, spec: TaskSpec, tier: str) -> dict[str, Any]:
        bb = tier_table("omar_backbone", spec, tier)
        return {**{k: bb[k] for k in ("hidden", "batch_size", "gamma") if k in bb}, **tier_table("maicq", spec, tier)}

    def __init__(self, spec: TaskSpec, config: Config, seed: int, device: str = "cpu") -> None:
        if spec.discrete:
            raise ValueError("maicq (continuous construction) needs a continuous-action task")
        self.spec, self.cfg, self.device = spec, config, torch.device(device)
        self.n = spec.n_agents
        torch_gen = torch.Generator().manual_seed(int(seed))
        c = config
        self.actors = Actors(self.n, spec.obs_dim, spec.act_dim, c.hidden, c.input_norm, torch_gen)
        self.critic = IndepCritics(self.n, 1, spec.obs_dim, spec.act_dim, c.hidden, False, torch_gen)
        self.target_critic = IndepCritics(self.n, 1, spec.obs_dim, spec.act_dim, c.hidden, False, torch_gen)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))  # nn.Linear init inside the mixer draws from the global RNG
            self.mixer = QMixer(self.n, spec.state_dim, c.mixing_embed_dim, c.hypernet_embed)
            self.target_mixer = QMixer(self.n, spec.state_dim, c.mixing_embed_dim, c.hypernet_embed)
        for m in self.modules().values():
            m.to(self.device)
        hard_update_(self.target_critic, self.critic)
        hard_update_(self.target_mixer, self.mixer)
        rms = dict(alpha=0.99, eps=1e-5)
        self.actor_opt = torch.optim.RMSprop(self.actors.parameters(), lr=c.lr, **rms)
        self.critic_opt = torch.optim.RMSprop(list(self.critic.parameters()) + list(self.mixer.parameters()),
                                              lr=c.critic_lr, **rms)
        self.rounds = 0

    def modules(self) -> dict[str, nn.Module]:
        return {"actors": self.actors, "critic": self.critic, "target_critic": self.target_critic,
                "mixer": self.mixer, "target_mixer": self.target_mixer}

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor_opt": self.actor_opt, "critic_opt": self.critic_opt}

    def update(self, sample: BatchSampler) -> dict[str, float]:
        c, b = self.cfg, sample(self.cfg.batch_size)
        B = b.size
        with torch.no_grad():
            q_next = self.target_mixer(self.target_critic(b.next_obs, b.next_actions)[0], b.next_state)  # [B]
            w = torch.softmax(q_next / c.beta_q, dim=0) * B
            y = b.rewards + c.gamma * (1 - b.terminals) * w * q_next
        q_i = self.critic(b.obs, b.actions)[0]  # [B, n]
        q_tot = self.mixer(q_i, b.state)
        td = (q_tot - y).pow(2).mean()
        self.critic_opt.zero_grad(set_to_none=True)
        td.backward()
        params = list(self.critic.parameters()) + list(self.mixer.parameters())
        torch.nn.utils.clip_grad_norm_(params, c.grad_clip)
        self.critic_opt.step()

        pi = self.actors(b.obs)
        with torch.no_grad():
            adv = q_i.detach() - self.critic(b.obs, pi.detach())[0]  # [B, n]
            wa = torch.softmax(adv / c.beta_pi, dim=0) * B
        a_loss = (wa * (pi - b.actions).pow(2).sum(-1)).mean(0).sum()
        self.actor_opt.zero_grad(set_to_none=True)
        a_loss.backward()
        clip_grad_norm_stacked_(list(self.actors.parameters()), c.grad_clip, self.n)
        self.actor_opt.step()
        self.rounds += 1
        if self.rounds % c.target_update_interval == 0:
            hard_update_(self.target_critic, self.critic)
            hard_update_(self.target_mixer, self.mixer)
        return {"critic/td_loss": float(td.detach()), "critic/q_tot": float(q_tot.detach().mean()),
                "actor/loss": float(a_loss.detach()), "maicq/adv": float(adv.mean()),
                "maicq/w_q_max": float(w.max()), "maicq/w_pi_max": float(wa.max())}

"""Behaviour cloning for continuous actions: per-agent deterministic tanh actors regressed onto the
dataset actions with MSE.

No continuous BC implementation exists in the reference repositories (reference-implementations.md
§4.9: "an MLP actor regressed onto dataset actions would be the obvious reading"); the actor is the
same network as CFCQL/PLCQL's actors so that BC is a like-for-like baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from plcql_bench.algorithms.base import BatchSampler, register
from plcql_bench.algorithms.common.configs import tier_table
from plcql_bench.algorithms.common.continuous import Actors
from plcql_bench.algorithms.common.checkpoint import Checkpointable, DeterministicActors
from plcql_bench.algorithms.common.nets import clip_grad_norm_stacked_
from plcql_bench.suite.core.spec import TaskSpec


@dataclass
class Config:
    hidden: int = 64  # same actor as CFCQL on MPE (reference --hidden_dim 64); 256 on HalfCheetah
    lr: float = 1e-3  # CFCQL continuous default lr (main.py --lr 0.001); 3e-4 on HalfCheetah
    batch_size: int = 1024  # CFCQL/OMAR MPE batch; 256 on HalfCheetah
    input_norm: bool = True  # actor input BatchNorm, as the reference actors
    grad_clip: float = 0.5  # per-agent gradient-norm clip, as the reference actors (0 = off)


@register
class BC(Checkpointable, DeterministicActors):
    name = "bc"
    Config = Config
    legacy_keys = {"opt": "actor_opt"}  # before issue 22
    discrete = False

    @classmethod
    def task_overrides(cls, spec: TaskSpec, tier: str) -> dict[str, Any]:
        return tier_table("bc", spec, tier)  # algorithms/configs/bc.yaml

    def __init__(self, spec: TaskSpec, config: Config, seed: int, device: str = "cpu") -> None:
        if spec.discrete:
            raise ValueError("bc (continuous) needs a continuous-action task")
        self.spec, self.cfg, self.device = spec, config, torch.device(device)
        gen = torch.Generator().manual_seed(int(seed))
        self.actors = Actors(spec.n_agents, spec.obs_dim, spec.act_dim, config.hidden, config.input_norm, gen)
        self.actors.to(self.device)
        self.actor_opt = torch.optim.Adam(self.actors.parameters(), lr=config.lr)
        self.rounds = 0

    def modules(self) -> dict[str, nn.Module]:
        return {"actors": self.actors}

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor_opt": self.actor_opt}

    def update(self, sample: BatchSampler) -> dict[str, float]:
        """One round = one gradient step on a fresh batch."""
        batch = sample(self.cfg.batch_size)
        pred = self.actors(batch.obs)
        per_agent = (pred - batch.actions).pow(2).mean(dim=(0, 2))  # [n]
        loss = per_agent.sum()  # agents are independent; summing keeps each agent's gradient scale
        self.actor_opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip > 0:
            clip_grad_norm_stacked_(list(self.actors.parameters()), self.cfg.grad_clip, self.spec.n_agents)
        self.actor_opt.step()
        self.rounds += 1
        return {"bc/mse": float(per_agent.detach().mean())}

"""Behaviour cloning for discrete actions (SMAX/SMAC): the shared-parameter GRU agent trained with
a per-agent masked cross-entropy on the dataset actions over batches of whole episodes.

Reference: `thu-rllab/CFCQL` `discrete/src/config/algs/bc.yaml` + `learners/bc_learner.py`
(reference-implementations.md §4.9): `n_rnn` agent (hidden 64) with agent id and last action in
the input, policy logits masked before the softmax (`mask_before_softmax`), Adam lr 5e-4, batch of
128 episodes, gradient-norm clip 10 (default.yaml). Acting: greedy over the available actions at
evaluation (the reference samples multinomially while collecting, greedily at test).
One update round = one gradient step on a fresh batch of episodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from plcql_bench.algorithms.base import register
from plcql_bench.algorithms.common.discrete import DiscreteAlgorithm, RNNAgent, bc_step
from plcql_bench.suite.core.spec import TaskSpec


@dataclass
class Config:
    hidden: int = 64  # rnn_hidden_dim 64 (default.yaml)
    lr: float = 5e-4  # bc.yaml lr 0.0005 (Adam)
    batch_episodes: int = 128  # bc.yaml batch_size 128 (episodes)
    grad_clip: float = 10.0  # default.yaml grad_norm_clip 10 (0 = off)


@register
class BCDiscrete(DiscreteAlgorithm):
    name = "bc"
    Config = Config
    legacy_keys = {"opt": "actor_opt"}  # before issue 22

    def __init__(self, spec: TaskSpec, config: Config, seed: int, device: str = "cpu") -> None:
        super().__init__(spec, config, seed, device)
        self.actor = self.build(1, lambda: self.new_agent(config.hidden))
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=config.lr)

    def modules(self) -> dict[str, nn.Module]:
        return {"actor": self.actor}

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor_opt": self.actor_opt}

    def policy_agent(self) -> RNNAgent:
        return self.actor

    def update(self, sample) -> dict[str, float]:
        loss = bc_step(self.actor, self.actor_opt, sample(self.cfg.batch_episodes), self.cfg.grad_clip)
        self.rounds += 1
        return {"bc/cross_entropy": loss}

"""The batch types the runner hands an algorithm's `update(sample)`: transitions (`Batch`) or whole
padded episodes (`EpisodeBatch`, datasets/episodes.py builds them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class Batch:
    """A batch of B transitions as torch tensors on the algorithm's device.

    obs            float32 [B, n, obs_dim]      next_obs          float32 [B, n, obs_dim]
    state          float32 [B, state_dim]       next_state        float32 [B, state_dim]
    actions        float32 [B, n, act_dim]  (continuous)  or int64 [B, n] (discrete)
    next_actions   like actions: the dataset's next joint action a'
    next_actions_valid float32 [B]: 1 where a' is known; 0 at the last step of an episode whose
                   next action the dataset could not record (PAR targets then replace every agent)
    rewards        float32 [B]   the reward the algorithm's `reward` names: the team's or agent 0's; or
                   float32 [B, n] each agent's own (`per_agent`, on data with per-agent rewards)
    terminals      float32 [B]   1 = true terminal (no bootstrap); time-limit cuts are NOT terminal
    avail, next_avail  float32 [B, n, n_actions] for discrete tasks, else None
    """

    obs: torch.Tensor
    state: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    next_state: torch.Tensor
    next_actions: torch.Tensor
    next_actions_valid: torch.Tensor
    terminals: torch.Tensor
    avail: torch.Tensor | None = None
    next_avail: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.rewards.shape[0]


@dataclass
class EpisodeBatch:
    """A batch of B whole episodes, padded to T steps (T = the longest episode in the dataset), as
    torch tensors on the algorithm's device. Index t in 0..T-1 is a transition; the extra index T
    (and index len for an episode of length len < T) holds the final next observation.

    obs       float32 [B, T+1, n, obs_dim]   o_t; o_len = the episode's last next_obs; zeros after
    state     float32 [B, T+1, state_dim]    s_t, same layout
    avail     float32 [B, T+1, n, n_actions] availability at t (index len: next_avail of the last
                                             step); all zeros on padding (no action available)
    actions   int64   [B, T, n]              a_t (0 on padding)
    rewards   float32 [B, T]                 team reward r_t (0 on padding)
    terminals float32 [B, T]                 1 at a true terminal (no bootstrap); timeouts are 0
    mask      float32 [B, T]                 1 on real steps t < len, 0 on padding
    lengths   int64   [B]                    len of each episode
    timeouts  float32 [B, T] or None         1 where the time limit cut the episode (a learner that
                                             follows the references counts it as terminal:
                                             DiscreteAlgorithm.scaled, `bootstrap_timeouts`)
    episode_ids int64 [B] or None            which episodes of the sampler that drew the batch (for
                                             per-episode caches such as the frozen behaviour model's)
    """

    obs: torch.Tensor
    state: torch.Tensor
    avail: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    terminals: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor
    timeouts: torch.Tensor | None = None
    episode_ids: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.rewards.shape[0]

    @property
    def max_t(self) -> int:
        return self.rewards.shape[1]


class BatchSampler(Protocol):
    def __call__(self, batch_size: int) -> Batch: ...  # EpisodeBatch for batch_kind "episodes"

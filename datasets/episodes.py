"""Batches of whole episodes for recurrent (GRU) agents, built from the format-v1 transition arrays.

The dataset stores transitions episode by episode (docs/dataset-format.md). `EpisodeSampler`
rearranges them once into an episode-major flat store with one extra row per episode (the final
next observation / state / availability), and each call draws B episodes and pads them into an
`EpisodeBatch` (suite/core/batch.py) of length T = the longest episode in the batch, as PyMARL
truncates its padded batches to the longest filled episode. Padding is zeros, mask 0, and no
available action.

Episodes are drawn uniformly without replacement within a batch (PyMARL's
`ReplayBuffer.sample` uses `np.random.choice(..., replace=False)`); a batch larger than the
dataset draws with replacement. The sampler's own `torch.Generator` is checkpointed by the runner
exactly like `Sampler.generator`, so resumed runs draw the same batches.
"""

from __future__ import annotations

import numpy as np
import torch

from plcql_bench.suite.core.batch import EpisodeBatch
from plcql_bench.suite.core.errors import BenchError


class EpisodeSampler:
    """Uniform batches of padded episodes from an in-memory discrete-action dataset."""

    def __init__(self, arrays: dict[str, np.ndarray], seed: int, device: str = "cpu"):
        if "avail_actions" not in arrays:
            raise BenchError("episode batches need a discrete-action dataset (no avail_actions array)")
        ids = np.asarray(arrays["episode_ids"], dtype=np.int64)
        n_tr = len(ids)
        if n_tr == 0:
            raise BenchError("episode batches need a non-empty dataset")
        n_ep = int(ids[-1]) + 1
        lengths = np.bincount(ids, minlength=n_ep).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        last = starts + lengths - 1
        # Flat store with one extra row per episode: rows off[e] .. off[e] + len[e]; the last is the
        # final next_obs (so row index = transition index + episode id).
        rows = np.arange(n_tr) + ids
        final_rows = last + np.arange(n_ep) + 1

        def with_final(cur: str, nxt: str, dtype) -> torch.Tensor:
            c, x = np.asarray(arrays[cur]), np.asarray(arrays[nxt])
            out = np.zeros((n_tr + n_ep,) + c.shape[1:], dtype=dtype)
            out[rows] = c
            out[final_rows] = x[last]
            return torch.as_tensor(out).to(device)

        self.device = torch.device(device)
        self.obs = with_final("obs", "next_obs", np.float32)
        self.state = with_final("state", "next_state", np.float32)
        self.avail = with_final("avail_actions", "next_avail_actions", np.float32)
        t = lambda name, dtype: torch.as_tensor(np.asarray(arrays[name], dtype=dtype)).to(device)  # noqa: E731
        self.actions = t("actions", np.int64)
        self.rewards = t("rewards", np.float32)
        self.terminals = t("terminals", np.float32)
        self.timeouts = t("timeouts", np.float32)
        self.lengths = torch.as_tensor(lengths).to(device)
        self.starts = torch.as_tensor(starts).to(device)
        self.offsets = torch.as_tensor(starts + np.arange(n_ep)).to(device)
        self.n_episodes = n_ep
        self.size = n_ep  # what "uniform" draws from
        self.generator = torch.Generator().manual_seed(int(seed))

    def draw(self, batch_size: int) -> torch.Tensor:
        """Episode indices [B] (CPU generator, so the stream is device-independent)."""
        if batch_size <= self.n_episodes:
            return torch.randperm(self.n_episodes, generator=self.generator)[:batch_size]
        return torch.randint(self.n_episodes, (batch_size,), generator=self.generator)

    def episodes(self, idx: torch.Tensor) -> EpisodeBatch:
        """The padded EpisodeBatch of the given episode indices."""
        idx = idx.to(self.device)
        lens = self.lengths[idx]  # [B]
        T = int(lens.max())
        t = torch.arange(T + 1, device=self.device)
        t1 = torch.minimum(t[None], lens[:, None])  # [B, T+1]
        rows = self.offsets[idx][:, None] + t1
        has_obs = (t[None] <= lens[:, None]).float()  # index len is the final next_obs
        obs = self.obs[rows] * has_obs[..., None, None]
        state = self.state[rows] * has_obs[..., None]
        avail = self.avail[rows] * has_obs[..., None, None]
        real = t[None, :T] < lens[:, None]  # [B, T]
        tr = self.starts[idx][:, None] + torch.minimum(t[None, :T], lens[:, None] - 1)
        mask = real.float()
        actions = torch.where(real[..., None], self.actions[tr], torch.zeros((), dtype=torch.int64,
                                                                             device=self.device))
        return EpisodeBatch(obs=obs, state=state, avail=avail, actions=actions,
                            rewards=self.rewards[tr] * mask, terminals=self.terminals[tr] * mask,
                            mask=mask, lengths=lens, timeouts=self.timeouts[tr] * mask, episode_ids=idx)

    def __call__(self, batch_size: int) -> EpisodeBatch:
        return self.episodes(self.draw(batch_size))

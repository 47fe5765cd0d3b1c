"""SPaCQL (Jin & Montana 2025, "Partial action replacement ... conservative Q-learning"), continuous.

No code is public (reference-implementations.md §4.4). What the paper summary states, implemented as
such on top of the CFCQL continuous backbone (algorithms/common/continuous.py; the paper: "all hyperparameters consistent with CFCQL"):

  * an ensemble of E = 10 centralised critics (one batched call) with ensemble-min targets;
  * one PAR target per k = 1..n: exactly k agents, chosen uniformly without replacement, take the
    current policy's next action (the summary: "samples from the current policies"; deterministic
    actors, so pi_i(o'_i)); the others keep the dataset's next action. All n joint actions go through
    ONE target-critic call (R = n);
  * uncertainty u_k = std (population, as PLCQL's u_Q) over the (online) ensemble of Q_j(s', a'^(k));
    weights w_k = (1/u_k) / sum_k' 1/u_k';
  * target y = r + gamma (1 - terminal) sum_k w_k min_j Qbar_j(s', a'^(k));
  * critic loss sum_j MSE(Q_j(s, a), y) + cql_alpha * sum_j CF-CQL penalty_j (CFCQL's term);
  * actors as CFCQL (cf_pol on Q_1), round as CFCQL (--ca_ratio 5).

Paper-silent, configurable (docs/algorithms/spacql.md):
  weights per sample (default) or per batch (`weights_per`), which ensemble gives u_k (`uncertainty_from`:
  the online one, default, as the summary's Q_j and PLCQL's u_Q over Q_theta_j read; or the target one, which
  the target evaluates anyway), whether the weights carry gradient (`detach_weights`; online only), and
  which actors replaced agents follow (`replace_with`: "online", default, or "target": the target actors
  with CFCQL's clipped smoothing noise).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plcql_bench.algorithms.base import Batch, register
from plcql_bench.algorithms.common import rng
from plcql_bench.algorithms.common.continuous import CentralCriticConfig, CentralCriticAlgorithm


@dataclass
class Config(CentralCriticConfig):
    n_critics: int = 10  # SPaCQL: "an ensemble of 10 Q-networks" (§4.4)
    # --- paper-silent choices ---
    weights_per: str = "sample"  # "sample": w_k per transition; "batch": w_k from the batch-mean u_k
    uncertainty_from: str = "online"  # "online" (u_k over Q_j, as PLCQL's u_Q) or "target" (the min's ensemble)
    detach_weights: bool = True  # False: gradients flow through w_k into the online critic
    weight_eps: float = 1e-6  # 1 / (u_k + eps): guards u_k = 0 (identical members)
    replace_with: str = "online"  # "online": current actors (the summary); "target": target actors + smoothing
    critic_clip: str = "per-member"  # each of the 10 members clipped on its own, as PLCQL's (plcql.py Config)


def par_masks_all_k(B: int, n: int, valid: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """[B, n_k, n] bool: mask[b, k-1, i] = agent i replaced in the k-th PAR joint action of row b.

    For each (row, k) an independent uniform subset of exactly k agents (ranks of a random permutation
    < k); rows whose dataset next action is unknown (`valid` = 0) replace every agent for every k."""
    scores = rng.rand(generator, B, n, n, device=valid.device)
    ranks = scores.argsort(dim=2).argsort(dim=2)
    k = torch.arange(1, n + 1, device=valid.device).view(1, n, 1)
    return (ranks < k) | (valid < 0.5).view(B, 1, 1)


def inverse_std_weights(u: torch.Tensor, per: str, eps: float, rows: torch.Tensor | None = None) -> torch.Tensor:
    """u [..., n_k] -> w [..., n_k], w_k = (1/(u_k+eps)) / sum_k' 1/(u_k'+eps). per = "batch": every row
    uses the mean of u_k over the rows (over those with `rows` = 1 when given: the discrete variant's
    real bootstrap indices)."""
    if per == "batch":
        flat = u.flatten(0, -2)
        if rows is None:
            ubar = flat.mean(0)
        else:
            r = rows.reshape(-1, 1).to(u.dtype)
            ubar = (flat * r).sum(0) / r.sum(0).clamp_min(1.0)
        u = ubar.expand_as(u)
    elif per != "sample":
        raise ValueError(f"weights_per must be 'sample' or 'batch', got {per!r}")
    inv = 1.0 / (u + eps)
    return inv / inv.sum(-1, keepdim=True)


def check_weight_choices(cfg) -> None:
    """The paper-silent SPaCQL choices shared by both action spaces (see the module docstring)."""
    if cfg.uncertainty_from not in ("target", "online"):
        raise ValueError(f"uncertainty_from must be 'target' or 'online', got {cfg.uncertainty_from!r}")
    if cfg.weights_per not in ("sample", "batch"):
        raise ValueError(f"weights_per must be 'sample' or 'batch', got {cfg.weights_per!r}")


@register
class SPaCQL(CentralCriticAlgorithm):
    name = "spacql"
    Config = Config

    def __init__(self, spec, config: Config, seed: int, device: str = "cpu") -> None:
        check_weight_choices(config)
        if config.replace_with not in ("online", "target"):  # a continuous-only field
            raise ValueError(f"replace_with must be 'online' or 'target', got {config.replace_with!r}")
        super().__init__(spec, config, seed, device)

    @torch.no_grad()
    def par_joint_actions(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """a'^(k) for k = 1..n: [B, n_k, n * A], and the masks [B, n_k, n]."""
        B = batch.size
        masks = par_masks_all_k(B, self.n, batch.next_actions_valid, self.gen)
        if self.cfg.replace_with == "online":
            pi_next = self.actors(batch.next_obs).clamp(-1.0, 1.0)  # shared by every k
        else:
            pi_next = self.target_policy_actions(batch.next_obs)  # one draw, shared by every k
        joint = torch.where(masks.unsqueeze(-1), pi_next.unsqueeze(1), batch.next_actions.unsqueeze(1))
        return joint.reshape(B, self.n, -1), masks

    def compute_target(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """y [B] = r + gamma (1 - terminal) sum_k w_k min_j Qbar_j(s', a'^(k)), and diagnostics."""
        joint, masks = self.par_joint_actions(batch)
        with torch.no_grad():
            q_t = self.target_critic(batch.next_state, joint)  # [E, B, n_k]
            q_min = q_t.min(0).values  # [B, n_k]
        if self.cfg.uncertainty_from == "target":
            u = q_t.std(dim=0, correction=0)
        else:
            with torch.set_grad_enabled(not self.cfg.detach_weights):
                u = self.critic(batch.next_state, joint).std(dim=0, correction=0)
        w = inverse_std_weights(u, self.cfg.weights_per, self.cfg.weight_eps)
        if self.cfg.detach_weights:
            w = w.detach()
        y = batch.rewards + self.cfg.gamma * (1.0 - batch.terminals) * (w * q_min).sum(-1)
        kvals = torch.arange(1, self.n + 1, dtype=w.dtype, device=w.device)
        stats = {"spacql/E_k_weighted": (w.detach() * kvals).sum(-1).mean()}
        for i in range(self.n):  # metrics only (n scalars)
            stats[f"spacql/w_k{i + 1}"] = w.detach()[:, i].mean()
            stats[f"spacql/u_k{i + 1}"] = u.detach()[:, i].mean()
        return y, stats

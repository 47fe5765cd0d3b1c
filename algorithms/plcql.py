"""PLCQL: PAR-Learning-based Conservative Q-Learning (continuous actions), Algorithm 1 of the paper.

On top of the CFCQL machinery (centralised critic, per-agent tanh actors, counterfactual CQL):
  * an ensemble of E = 10 centralised Q-networks (one batched call) with ensemble-min targets;
  * a PAR policy pi_par(k | s') (MLP 64x64 on s' -> categorical over k = 1..n). For every sampled
    transition a k is drawn, k agents are chosen uniformly, those take the target policy's next action
    (with CFCQL's clipped N(0, 0.05) smoothing), the others keep the dataset's next action:
        Y = r + gamma (1 - terminal) min_j Qbar_j(s', a'^(k))
    Where the dataset's next action is unknown (`next_actions_valid` = 0, last step of an episode),
    every agent is replaced (k = n) whatever k was drawn;
  * critic loss: sum_j MSE(Q_j(s, a), Y) + cql_alpha * sum_j CF-CQL penalty_j;
  * bandit reward r_par = (sigmoid(-u_Q * T) + 0.5) * Q_1(s', a'^(k)), u_Q = std over the ONLINE
    ensemble at (s', a'^(k)) (detached); value baseline V(s') (MLP 64x64) trained by MSE to r_par;
  * PPO clipped objective on pi_par with advantage r_par - V(s'), ratio against the pi_par that drew k.

Round structure (as CFCQL, --ca_ratio 5): update 0 = critic + value + actor + PPO on one batch, then
4 critic-only updates on fresh batches (each draws its own k from pi_par), then Polyak targets.
Variants: `fixed_k` (None | 1 | "n") and `uncertainty_weight` (False -> w = 1); registered as
"plcql-k1", "plcql-kn", "plcql-w1".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch
from torch import nn

from plcql_bench.algorithms.base import Batch, BatchSampler, register, register_variant
from plcql_bench.algorithms.cfcql import CFCQL
from plcql_bench.algorithms.cfcql import Config as CFCQLConfig
from plcql_bench.algorithms.common.continuous import host_floats, make_adam, mean_metrics, replace_agents
from plcql_bench.algorithms.common.nets import StackedMLP


@dataclass
class Config(CFCQLConfig):
    # Everything of CFCQL's Config (paper: "all other hyperparameters follow SPaCQL", which follows
    # CFCQL, reference-implementations.md §4.4), plus:
    n_critics: int = 10  # paper §Experimental Setup: "an ensemble of ten Q-networks"
    par_hidden: int = 64  # paper: PAR policy "two hidden layers of 64 units"; same for the baseline V
    # --- paper-silent choices (docs/algorithms/plcql.md) ---
    temperature: float = 1.0  # T in sigma(-u_Q T) + 0.5
    uncertainty_weight: bool = True  # False -> w = 1 (ablation "plcql-w1")
    fixed_k: Union[int, str, None] = None  # None = learned PAR; 1 or "n" = fixed k (ablations)
    ppo_epochs: int = 4  # full-batch PPO gradient steps per round on the round's first batch
    ppo_clip: float = 0.2  # epsilon (PPO default)
    normalize_advantage: bool = True  # per-batch mean/std normalisation of r_par - V
    entropy_coef: float = 0.01  # entropy bonus on pi_par
    par_lr: float = 3e-4  # Adam lr of pi_par
    value_lr: float = 1e-3  # Adam lr of V
    value_steps: int = 1  # gradient steps on L_v per round (Algorithm 1: one)
    par_grad_clip: float = 0.5  # grad-norm clip of pi_par and V (0 = off)


def par_mask(k: torch.Tensor, valid: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """[B, n] bool: True for the agents whose next action is replaced.

    k [B] int64 in 1..n; valid [B] (0 = dataset next action unknown -> replace all). The k agents are
    uniform without replacement: the ranks of a uniform random permutation that are < k.
    """
    B = k.shape[0]
    scores = torch.rand(B, n, generator=generator, device=k.device)
    ranks = scores.argsort(dim=1).argsort(dim=1)
    mask = ranks < k.unsqueeze(1)
    return mask | (valid < 0.5).unsqueeze(1)


@register
class PLCQL(CFCQL):
    name = "plcql"
    Config = Config

    # -- construction --------------------------------------------------------------------------------
    def _build_extra(self, init_gen: torch.Generator) -> None:
        S, n, h = self.spec.state_dim, self.n, self.cfg.par_hidden
        self.par_policy = StackedMLP(1, S, n, hidden=h, generator=init_gen)
        self.par_value = StackedMLP(1, S, 1, hidden=h, generator=init_gen)
        fk = self.cfg.fixed_k
        if fk is not None and not (fk == "n" or (isinstance(fk, int) and 1 <= fk <= n)):
            raise ValueError(f"fixed_k must be None, 'n' or an int in 1..{n}; got {fk!r}")

    def _build_extra_optimisers(self) -> None:
        self.par_opt = make_adam(self.par_policy.parameters(), self.cfg.par_lr)
        self.value_opt = make_adam(self.par_value.parameters(), self.cfg.value_lr)

    def modules(self) -> dict[str, nn.Module]:
        return {**super().modules(), "par_policy": self.par_policy, "par_value": self.par_value}

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return {**super().optimisers(), "par_opt": self.par_opt, "value_opt": self.value_opt}

    @property
    def learned_par(self) -> bool:
        return self.cfg.fixed_k is None

    # -- PAR policy ----------------------------------------------------------------------------------
    def par_logits(self, next_state: torch.Tensor) -> torch.Tensor:
        return self.par_policy(next_state)[0]  # [B, n]; column c is k = c + 1

    @torch.no_grad()
    def sample_k(self, next_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns k [B] (1..n), log pi_par(k|s') [B] and the probabilities [B, n]."""
        B = next_state.shape[0]
        if not self.learned_par:
            kk = self.n if self.cfg.fixed_k == "n" else int(self.cfg.fixed_k)
            probs = torch.zeros(B, self.n, device=next_state.device)
            probs[:, kk - 1] = 1.0
            return (torch.full((B,), kk, dtype=torch.long, device=next_state.device),
                    torch.zeros(B, device=next_state.device), probs)
        logp_all = torch.log_softmax(self.par_logits(next_state), dim=-1)
        probs = logp_all.exp()
        idx = torch.multinomial(probs, 1, generator=self.gen)[:, 0]
        return idx + 1, logp_all.gather(1, idx[:, None])[:, 0], probs

    # -- targets ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def par_next_actions(self, batch: Batch, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """a'^(k) [B, n, A] and the replacement mask [B, n]."""
        mask = par_mask(k, batch.next_actions_valid, self.n, self.gen)
        pi_next = self.target_policy_actions(batch.next_obs)
        return replace_agents(batch.next_actions, pi_next, mask), mask

    @torch.no_grad()
    def par_target(self, batch: Batch, joint_next: torch.Tensor) -> torch.Tensor:
        """Y = r + gamma (1 - terminal) min_j Qbar_j(s', a'^(k)), [B]."""
        q = self.target_critic(batch.next_state, joint_next.reshape(batch.size, 1, -1))[:, :, 0]
        return batch.rewards + self.cfg.gamma * (1.0 - batch.terminals) * q.min(0).values

    @torch.no_grad()
    def compute_target(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Y [B] for one critic update: draw k ~ pi_par(.|s'), build a'^(k), one target-ensemble call."""
        k, logp_old, probs = self.sample_k(batch.next_state)
        joint_next, mask = self.par_next_actions(batch, k)
        return self.par_target(batch, joint_next), dict(k=k, logp_old=logp_old, probs=probs,
                                                          joint_next=joint_next, mask=mask)

    @torch.no_grad()
    def par_reward(self, batch: Batch, joint_next: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """r_par = w * Q_1(s', a'^(k)), w = sigmoid(-u_Q T) + 0.5 (or 1). Returns (r_par, u_Q, w)."""
        q = self.critic(batch.next_state, joint_next.reshape(batch.size, 1, -1))[:, :, 0]  # [E, B]
        u = q.std(dim=0)  # sample std over members (torch default correction=1)
        if self.cfg.uncertainty_weight:
            w = torch.sigmoid(-u * self.cfg.temperature) + 0.5
        else:
            w = torch.ones_like(u)
        return w * q[0], u, w

    # -- PAR learning -----------------------------------------------------------------------------------
    def value_update(self, next_state: torch.Tensor, r_par: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        loss = torch.zeros((), device=next_state.device)
        for _ in range(self.cfg.value_steps):
            v = self.par_value(next_state)[0, :, 0]
            loss = ((v - r_par).pow(2) * m).sum() / m.sum().clamp(min=1)
            self.value_opt.zero_grad(set_to_none=True)
            loss.backward()
            if self.cfg.par_grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.par_value.parameters(), self.cfg.par_grad_clip, foreach=True)
            self.value_opt.step()
        return loss.detach()

    def ppo_update(self, next_state: torch.Tensor, k: torch.Tensor, logp_old: torch.Tensor,
                   adv: torch.Tensor, m: torch.Tensor) -> dict[str, torch.Tensor]:
        """Clipped-surrogate PPO on pi_par over the rows with m = 1 (`ppo_epochs` full-batch steps)."""
        denom = m.sum().clamp(min=1)
        if self.cfg.normalize_advantage:
            mean = (adv * m).sum() / denom
            std = (((adv - mean) ** 2 * m).sum() / denom).sqrt()
            adv = (adv - mean) / (std + 1e-8)
        idx = (k - 1).unsqueeze(1)
        stats: dict[str, torch.Tensor] = {}
        for epoch in range(self.cfg.ppo_epochs):
            logp_all = torch.log_softmax(self.par_logits(next_state), dim=-1)
            logp = logp_all.gather(1, idx)[:, 0]
            ratio = (logp - logp_old).exp()
            surr = torch.min(ratio * adv, ratio.clamp(1 - self.cfg.ppo_clip, 1 + self.cfg.ppo_clip) * adv)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
            loss = -((surr + self.cfg.entropy_coef * entropy) * m).sum() / denom
            self.par_opt.zero_grad(set_to_none=True)
            loss.backward()
            if self.cfg.par_grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.par_policy.parameters(), self.cfg.par_grad_clip, foreach=True)
            self.par_opt.step()
            if epoch == self.cfg.ppo_epochs - 1:  # the logged statistics are the last epoch's
                with torch.no_grad():
                    stats = {"ppo/loss": loss.detach(), "ppo/entropy": (entropy * m).sum() / denom,
                             "ppo/clip_frac": (((ratio - 1).abs() > self.cfg.ppo_clip).float() * m).sum() / denom}
        return stats

    # -- one round -----------------------------------------------------------------------------------------
    def update(self, sample: BatchSampler) -> dict[str, float]:
        critic_ms, out = [], {}
        for u in range(self.cfg.ca_ratio):
            batch = sample(self.cfg.batch_size)
            target, aux = self.compute_target(batch)
            k, logp_old, probs, joint_next, mask = (aux[x] for x in ("k", "logp_old", "probs", "joint_next", "mask"))
            if u == 0:
                # r_par at (s', a'^(k)) with the online ensemble before this round's critic step
                r_par, u_q, w = self.par_reward(batch, joint_next)
            loss, stats = self.critic_loss(batch, target)
            gn = self.critic_step(loss)
            critic_ms.append({**stats, "critic/grad_norm": gn, "par/k_replaced": mask.float().sum(1).mean()})
            if u == 0:
                out.update(self.actor_step(batch))
                valid = batch.next_actions_valid
                out.update({f"par/p_k{i + 1}": probs[:, i].mean() for i in range(self.n)})
                kvals = torch.arange(1, self.n + 1, dtype=probs.dtype, device=probs.device)
                out["par/E_k"] = (probs * kvals).sum(1).mean()
                out["par/k_sampled"] = k.float().mean()
                out.update({"par/r_par": r_par.mean(), "par/u_q": u_q.mean(), "par/w": w.mean()})
                if self.learned_par:
                    # rows whose next action is unknown replace every agent whatever k: no signal for pi_par
                    mrow = (valid > 0.5).float()
                    out["par/value_loss"] = self.value_update(batch.next_state, r_par, mrow)
                    with torch.no_grad():
                        adv = r_par - self.par_value(batch.next_state)[0, :, 0]
                    out["par/adv_raw"] = (adv * mrow).sum() / mrow.sum().clamp(min=1)
                    out.update(self.ppo_update(batch.next_state, k, logp_old, adv, mrow))
        self.update_targets()
        self.rounds += 1
        out.update(mean_metrics(critic_ms))
        return host_floats(out)


register_variant(PLCQL, "plcql-k1", "PLCQL ablation: k fixed to 1 (single-agent replacement).", fixed_k=1)
register_variant(PLCQL, "plcql-kn", "PLCQL ablation: k fixed to n (full joint replacement).", fixed_k="n")
register_variant(PLCQL, "plcql-w1", "PLCQL ablation: no uncertainty weighting (w = 1).", uncertainty_weight=False)

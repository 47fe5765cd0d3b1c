"""PLCQL, discrete actions (SMAX/SMAC), Algorithm 1 of the paper on CFCQL-discrete's backbone.
See docs/algorithms/plcql.md, "Discrete (SMAX/SMAC)".

Backbone: QMIX + TD(λ) + counterfactual CQL with the per-map cql_alpha/softmax_temp
(configs/cfcql_discrete.yaml), with an ensemble of `n_critics` = 10 QMIX value functions (GRU agent +
mixer per member, stacked; algorithms/common/discrete_ensemble.py). Per update round (one gradient
step on 128 episodes, as CFCQL-discrete):

  * PAR policy π_par(k | s') (MLP 64x64 on the global state -> categorical over k = 1..n) draws one k
    for every observation index t' of every episode (s' = s_t', the bootstrap state of step t'-1);
    k agents chosen uniformly take the current policy's greedy AVAILABLE action (argmax of the mean of
    the online members' individual Qs), the others keep the dataset's action a_t'. At the final next
    observation (no a_t' in the data) every agent is replaced, whatever k;
  * bootstrap values Q(t') = min_j Qbar_tot,j(s_t', a'^(k)_t') (target agents + target mixers), and
    y = TD(λ) returns over them (exactly CFCQL-discrete's recursion; PAR only changes the bootstrap
    joint action);
  * r_par = (σ(−u_Q T) + 0.5) · Q_tot,1(s_t', a'^(k)_t'), u_Q = std over the ONLINE members at the same
    point, before the round's gradient step (detached);
  * value baseline V(s') (MLP 64x64, MSE to r_par) and PPO (clipped surrogate, advantage r_par − V,
    ratio against the π_par that drew k) on the indices whose dataset action is known (1 <= t' < len:
    elsewhere k has no effect).
Variants: `fixed_k` (None | 1 | "n") and `uncertainty_weight` (False -> w = 1), registered as
"plcql-k1", "plcql-kn", "plcql-w1" for discrete tasks too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import torch
from torch import nn

from plcql_bench.algorithms.base import EpisodeBatch, register, register_variant
from plcql_bench.algorithms.common.continuous import host_floats, make_adam
from plcql_bench.algorithms.common.discrete import masked_mean, td_lambda_targets
from plcql_bench.algorithms.common.discrete_ensemble import EnsembleCFCQLDiscrete, EnsembleConfig
from plcql_bench.algorithms.common.nets import StackedMLP
from plcql_bench.algorithms.plcql import PLCQL, par_mask


@dataclass
class Config(EnsembleConfig):
    # PAR policy and PPO: the continuous PLCQL's fields and defaults (docs/algorithms/plcql.md)
    par_hidden: int = 64
    temperature: float = 1.0
    uncertainty_weight: bool = True
    fixed_k: Union[int, str, None] = None
    ppo_epochs: int = 4
    ppo_clip: float = 0.2
    normalize_advantage: bool = True
    entropy_coef: float = 0.01
    par_lr: float = 3e-4
    value_lr: float = 1e-3
    value_steps: int = 1
    par_grad_clip: float = 0.5


@register
class PLCQLDiscrete(EnsembleCFCQLDiscrete):
    name = "plcql"
    Config = Config

    # the PAR machinery is the continuous PLCQL's, unchanged (flat rows of s')
    par_logits = PLCQL.par_logits
    sample_k = PLCQL.sample_k
    value_update = PLCQL.value_update
    ppo_update = PLCQL.ppo_update
    learned_par = PLCQL.learned_par

    def __init__(self, spec, config: Config, seed: int, device: str = "cpu") -> None:
        fk, n = config.fixed_k, spec.n_agents
        if fk is not None and not (fk == "n" or (isinstance(fk, int) and 1 <= fk <= n)):
            raise ValueError(f"fixed_k must be None, 'n' or an int in 1..{n}; got {fk!r}")
        super().__init__(spec, config, seed, device)
        g = torch.Generator().manual_seed(self.seed * 1000 + 7)
        S, h = spec.state_dim, config.par_hidden
        self.par_policy = StackedMLP(1, S, n, hidden=h, generator=g).to(self.device)
        self.par_value = StackedMLP(1, S, 1, hidden=h, generator=g).to(self.device)
        self.par_opt = make_adam(self.par_policy.parameters(), config.par_lr)
        self.value_opt = make_adam(self.par_value.parameters(), config.value_lr)

    def modules(self) -> dict[str, nn.Module]:
        return {**super().modules(), "par_policy": self.par_policy, "par_value": self.par_value}

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return {**super().optimisers(), "par_opt": self.par_opt, "value_opt": self.value_opt}

    # -- targets --------------------------------------------------------------------------------
    @torch.no_grad()
    def par_joint_actions(self, batch: EpisodeBatch, q_all: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """k ~ π_par(.|s_t') at every index and a'^(k) [B, T+1, n]."""
        B, T1, n = batch.size, batch.max_t + 1, self.n
        data, valid, boot = self.next_action_data(batch)
        greedy = self.greedy_actions(batch, q_all)
        k, logp_old, probs = self.sample_k(batch.state.reshape(B * T1, -1))
        mask = par_mask(k, valid.reshape(-1), n, self.gen).view(B, T1, n)
        joint = torch.where(mask, greedy, data)
        return dict(joint=joint, mask=mask, k=k.view(B, T1), logp_old=logp_old.view(B, T1),
                    probs=probs.view(B, T1, n), valid=valid, boot=boot)

    @torch.no_grad()
    def compute_target(self, batch: EpisodeBatch, q_all: torch.Tensor | None = None):
        """y [B, T]: TD(λ) over min_j Qbar_tot,j(s_t', a'^(k)_t'); info carries k and a'^(k)."""
        info = self.par_joint_actions(batch, q_all)
        tq = self.target_q_ens.unroll(batch)
        v = self.member_q_tot(tq, self.target_mix_ens, info["joint"].unsqueeze(2), batch.state)[..., 0].min(0).values
        y = td_lambda_targets(batch.rewards, batch.terminals, batch.mask, v, self.cfg.gamma, self.cfg.td_lambda)
        info["stats"] = {"par/k_replaced": masked_mean(info["mask"].float().sum(-1), info["boot"])}
        return y, info

    @torch.no_grad()
    def par_reward(self, batch: EpisodeBatch, q_all: torch.Tensor, joint: torch.Tensor):
        """r_par = w · Q_tot,1(s', a'^(k)), w = σ(−u_Q T) + 0.5 (or 1), u_Q = std over the online
        members; all [B, T+1]."""
        q = self.member_q_tot(q_all.detach(), self.mix_ens, joint.unsqueeze(2), batch.state)[..., 0]  # [E, B, T+1]
        u = q.std(0) if q.shape[0] > 1 else torch.zeros_like(q[0])
        w = torch.sigmoid(-u * self.cfg.temperature) + 0.5 if self.cfg.uncertainty_weight else torch.ones_like(u)
        return w * q[0], u, w

    def before_step(self, batch: EpisodeBatch, q_all: torch.Tensor, info: dict[str, Any]) -> dict[str, Any]:
        r_par, u, w = self.par_reward(batch, q_all, info["joint"])
        return {"r_par": r_par, "u": u, "w": w}

    def after_step(self, batch: EpisodeBatch, info: dict[str, Any], pre: dict[str, Any]) -> dict[str, float]:
        rows = (info["valid"] * info["boot"]) > 0.5  # [B, T+1]: dataset a_t' known, s_t' bootstraps a real step
        probs, k = info["probs"][rows], info["k"][rows]
        out: dict[str, Any] = {}  # values as tensors or floats; host_floats copies them to the host at once
        nrows = int(rows.sum())
        if nrows:
            out.update({f"par/p_k{i + 1}": probs[:, i].mean() for i in range(self.n)})
            kvals = torch.arange(1, self.n + 1, dtype=probs.dtype, device=probs.device)
            out["par/E_k"] = (probs * kvals).sum(1).mean()
            out["par/k_sampled"] = k.float().mean()
        else:
            out.update({f"par/p_k{i + 1}": 0.0 for i in range(self.n)})
            out["par/E_k"] = out["par/k_sampled"] = 0.0
        r_par, u, w = pre["r_par"][rows], pre["u"][rows], pre["w"][rows]
        out.update({"par/r_par": r_par.mean() if nrows else 0.0, "par/u_q": u.mean() if nrows else 0.0,
                    "par/w": w.mean() if nrows else 0.0})
        if self.learned_par:
            keys = ("par/value_loss", "par/adv_raw", "ppo/loss", "ppo/entropy", "ppo/clip_frac")
            if not nrows:
                out.update({kk: 0.0 for kk in keys})
                return host_floats(out)
            s = batch.state[rows]
            m = torch.ones(nrows, device=s.device)
            out["par/value_loss"] = self.value_update(s, r_par, m)
            with torch.no_grad():
                adv = r_par - self.par_value(s)[0, :, 0]
            out["par/adv_raw"] = adv.mean()
            out.update(self.ppo_update(s, k, info["logp_old"][rows], adv, m))
        return host_floats(out)


register_variant(PLCQLDiscrete, "plcql-k1", "PLCQL ablation: k fixed to 1 (single-agent replacement).", fixed_k=1)
register_variant(PLCQLDiscrete, "plcql-kn", "PLCQL ablation: k fixed to n (full joint replacement).", fixed_k="n")
register_variant(PLCQLDiscrete, "plcql-w1", "PLCQL ablation: no uncertainty weighting (w = 1).", uncertainty_weight=False)

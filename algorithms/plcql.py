"""PLCQL: PAR-Learning-based Conservative Q-Learning (continuous actions), Algorithm 1 of the paper.

On top of the CFCQL backbone (algorithms/common/continuous.py: centralised critic, per-agent tanh actors,
counterfactual CQL, its losses and steps):
  * an ensemble of E = 10 centralised Q-networks (one batched call) with ensemble-min targets;
  * a PAR policy pi_par(k | s') (MLP 64x64 on s' -> categorical over k = 1..n). For every sampled
    transition a k is drawn (line 182), k agents are chosen uniformly (183), those take the CURRENT
    policy's next action (184; the actors are deterministic, so the sample is pi_i(o'_i)), the others
    keep the dataset's next action (185):
        Y = r + gamma (1 - terminal) min_j Qbar_j(s', a'^(k))                            (186)
    Where the dataset's next action is unknown (`next_actions_valid` = 0, last step of an episode),
    every agent is replaced (k = n) whatever k was drawn;
  * critic loss: sum_j MSE(Q_j(s, a), Y) + cql_alpha * sum_j CF-CQL penalty_j (187, 194);
  * bandit reward r_par = w * Q_1(s', a'^(k)), w = sigmoid(-u_Q * T) + 0.5,
    u_Q = sqrt(Var_j Q_j(s', a'^(k))) over the ONLINE ensemble, population variance (189-191), detached;
  * value baseline V(s') (MLP 64x64) trained by MSE to r_par (192, 197);
  * PPO clipped objective on pi_par with advantage r_par - V(s'), ratio against the pi_par that drew k
    (204-206).

Round structure (as CFCQL, --ca_ratio 5): 5 critic updates, each on a fresh batch with its own k drawn
from pi_par, each followed by one V update and one PPO update on that batch (Algorithm 1 makes one PAR
update per critic step); the actors are updated once, after the first critic update; then Polyak targets.

Configurable departures (docs/algorithms/plcql.md): `replace_with` ("target": target actors + CFCQL's
clipped smoothing noise), `par_updates` ("first-batch": PAR learns from the round's first batch only),
`u_ddof` (1: sample std), `fixed_k` (1, 2, ..., "n", "uniform": no PAR learning), `uncertainty_weight`
(False: w = 1), `par_reward` ("lcb": this suite's lower-confidence-bound reward, not the paper's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import torch
from torch import nn

from plcql_bench.algorithms.base import Batch, register, register_variant
from plcql_bench.algorithms.common import rng
from plcql_bench.algorithms.common.continuous import (
    CentralCriticConfig, CentralCriticAlgorithm, make_adam, replace_agents)
from plcql_bench.algorithms.common.nets import StackedMLP, buffers_restored
from plcql_bench.algorithms.common.steps import RunSteps


@dataclass
class ParConfig:
    """The PAR policy's settings, shared by the continuous and the discrete PLCQL."""

    par_hidden: int = 64  # paper: PAR policy "two hidden layers of 64 units"; same for the baseline V
    # --- paper-silent choices (docs/algorithms/plcql.md) ---
    temperature: float = 1.0  # T in sigma(-u_Q T) + 0.5
    uncertainty_weight: bool = True  # False -> w = 1 (ablation "plcql-w1")
    # None = learned PAR; an int 1..n or "n" = fixed k (ablations); "uniform" = k ~ U{1..n}, pi_par frozen
    fixed_k: Union[int, str, None] = None
    u_ddof: int = 0  # u_Q = sqrt(Var_j) (Algorithm 1 line 189: population variance); 1 = sample std
    # "paper": w * Q_1; "lcb" (this suite's): a lower confidence bound on the improvement over the dataset's
    # next action, mean_j D_j - lcb_beta * std_j D_j with D_j = Q_j(s', a'^(k)) - Q_j(s', a'_D)
    par_reward: str = "paper"
    lcb_beta: float = 1.0  # beta of the "lcb" reward
    ppo_epochs: int = 4  # full-batch PPO gradient steps per PAR update
    ppo_clip: float = 0.2  # epsilon (PPO default)
    # PPO's advantage A = r_par - V(s'): "advantage" = per-batch (A - mean A) / std A (PPO's usual);
    # "reward" = (A - mean A) / std r_par (keeps the size of the k-effect relative to how much r_par varies
    # across states: a tiny preference stays a small step); "none" = A as it is (Q units)
    advantage_norm: str = "advantage"
    entropy_coef: float = 0.01  # entropy bonus on pi_par
    par_lr: float = 3e-4  # Adam lr of pi_par
    value_lr: float = 1e-3  # Adam lr of V
    value_steps: int = 1  # gradient steps on L_v per PAR update (Algorithm 1: one)
    par_grad_clip: float = 0.5  # grad-norm clip of pi_par and V (0 = off)


@dataclass
class Config(CentralCriticConfig, ParConfig):
    # Everything of CFCQL's Config (paper: "all other hyperparameters follow SPaCQL", which follows
    # CFCQL, reference-implementations.md §4.4), the PAR settings, plus:
    n_critics: int = 10  # paper §Experimental Setup: "an ensemble of ten Q-networks"
    # "online": replaced agents take the current actors' actions (Algorithm 1 line 184);
    # "target": the target actors' actions with CFCQL's clipped N(0, target_noise) smoothing
    replace_with: str = "online"
    # "every-batch": one V + PPO update per critic batch (Algorithm 1); "first-batch": only the first
    par_updates: str = "every-batch"
    # The paper is silent on how the gradient clip applies to 10 members. "per-member": each member's
    # norm on its own, as 10 separate Q-networks (and as the discrete backbone clips its members); the
    # twin-critic references' one joint clip ("joint", CFCQL's default) let the critic run away on CN
    # medium-replay (docs/reproduction.md, "the critic diverges"; `plcql-joint-clip`)
    critic_clip: str = "per-member"


def check_par_config(cfg, n: int) -> None:
    """One line naming the field for a PAR setting out of range (both action spaces)."""
    fk = cfg.fixed_k
    if fk is not None and not (fk in ("n", "uniform") or (isinstance(fk, int) and 1 <= fk <= n)):
        raise ValueError(f"fixed_k must be None, 'n', 'uniform' or an int in 1..{n}; got {fk!r}")
    if cfg.par_reward not in ("paper", "lcb"):
        raise ValueError(f"par_reward must be 'paper' or 'lcb', got {cfg.par_reward!r}")
    if cfg.advantage_norm not in ("advantage", "reward", "none"):
        raise ValueError(f"advantage_norm must be 'advantage', 'reward' or 'none', got {cfg.advantage_norm!r}")
    if cfg.u_ddof not in (0, 1):
        raise ValueError(f"u_ddof must be 0 or 1, got {cfg.u_ddof!r}")


def par_mask(k: torch.Tensor, valid: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """[B, n] bool: True for the agents whose next action is replaced.

    k [B] int64 in 1..n; valid [B] (0 = dataset next action unknown -> replace all). The k agents are
    uniform without replacement: the ranks of a uniform random permutation that are < k.
    """
    B = k.shape[0]
    scores = rng.rand(generator, B, n, device=k.device)
    ranks = scores.argsort(dim=1).argsort(dim=1)
    mask = ranks < k.unsqueeze(1)
    return mask | (valid < 0.5).unsqueeze(1)


def par_reward_terms(q: torch.Tensor, cfg, q_data: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [E, ...]: the online members' Q at (s', a'^(k)); q_data [E, ...] at the dataset's (s', a'_D), needed
    by "lcb" only. Returns (r_par, u, w), each [...].

    paper: r_par = w * Q_1, w = sigmoid(-u_Q T) + 0.5 (or 1), u = u_Q = sqrt(Var_j Q_j) (Algorithm 1, 189-191).
    lcb (this suite's variant): D_j = Q_j(s', a'^(k)) - Q_j(s', a'_D), the improvement member j expects from
    replacing the k agents; r_par = mean_j D_j - beta * u with u = sqrt(Var_j D_j), a lower confidence bound
    on it (the members' disagreement about the replacement, without the disagreement about the state's value
    that every k shares); w reported as 1.
    """
    if cfg.par_reward == "lcb":
        d = q - q_data
        u = d.std(dim=0, correction=cfg.u_ddof)
        return d.mean(0) - cfg.lcb_beta * u, u, torch.ones_like(u)
    u = q.std(dim=0, correction=cfg.u_ddof)
    w = torch.sigmoid(-u * cfg.temperature) + 0.5 if cfg.uncertainty_weight else torch.ones_like(u)
    return w * q[0], u, w


# PAR's optimiser keys before issue 22 (`Checkpointable.legacy_keys`)
PAR_LEGACY_KEYS = {"par_opt": "par_policy_opt", "value_opt": "par_value_opt"}


class Par:
    """The PAR component both PLCQLs hold as `self.par` (one implementation for both action spaces):
    pi_par(k | s') and its baseline V(s'), their optimisers, and the PAR settings (`ParConfig`):
    sampling k, the replacement mask, the reward r_par, the value update and the PPO update.

    Checkpoint keys stay the algorithm's: `modules()` and `optimisers()` name the networks par_policy
    and par_value and the optimisers par_policy_opt and par_value_opt, which the algorithm merges into its own."""

    def __init__(self, cfg: ParConfig, n: int, state_dim: int, init_gen: torch.Generator,
                 device: torch.device | str = "cpu") -> None:
        check_par_config(cfg, n)
        self.cfg, self.n = cfg, n
        self.policy = StackedMLP(1, state_dim, n, hidden=cfg.par_hidden, generator=init_gen).to(device)
        self.value = StackedMLP(1, state_dim, 1, hidden=cfg.par_hidden, generator=init_gen).to(device)
        self.policy_opt = make_adam(self.policy.parameters(), cfg.par_lr)
        self.value_opt = make_adam(self.value.parameters(), cfg.value_lr)

    def modules(self) -> dict[str, nn.Module]:
        return {"par_policy": self.policy, "par_value": self.value}

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return {"par_policy_opt": self.policy_opt, "par_value_opt": self.value_opt}

    @property
    def learned(self) -> bool:
        return self.cfg.fixed_k is None

    def logits(self, next_state: torch.Tensor) -> torch.Tensor:
        return self.policy(next_state)[0]  # [B, n]; column c is k = c + 1

    @torch.no_grad()
    def probs(self, next_state: torch.Tensor) -> torch.Tensor:
        """[B, n]: the distribution k is drawn from (one-hot for a fixed k, uniform for "uniform")."""
        B, fk = next_state.shape[0], self.cfg.fixed_k
        if fk is None:
            return torch.softmax(self.logits(next_state), dim=-1)
        if fk == "uniform":
            return torch.full((B, self.n), 1.0 / self.n, device=next_state.device)
        probs = torch.zeros(B, self.n, device=next_state.device)
        probs[:, (self.n if fk == "n" else int(fk)) - 1] = 1.0
        return probs

    @torch.no_grad()
    def sample_k(self, next_state: torch.Tensor, generator: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns k [B] (1..n), log pi_par(k|s') [B] and the probabilities [B, n]."""
        fk = self.cfg.fixed_k
        if fk is not None and fk != "uniform":  # a fixed k draws no random numbers
            probs = self.probs(next_state)
            kk = self.n if fk == "n" else int(fk)
            return torch.full_like(probs[:, 0], kk, dtype=torch.long), torch.zeros_like(probs[:, 0]), probs
        if fk is None:
            logp_all = torch.log_softmax(self.logits(next_state), dim=-1)
            probs = logp_all.exp()
        else:
            probs = self.probs(next_state)
            logp_all = probs.log()
        idx = rng.categorical(generator, probs)
        return idx + 1, logp_all.gather(1, idx[:, None])[:, 0], probs

    def value_loss(self, next_state: torch.Tensor, r_par: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """L_v: the masked MSE of V(s') to r_par (Algorithm 1 line 197)."""
        v = self.value(next_state)[0, :, 0]
        return ((v - r_par).pow(2) * m).sum() / m.sum().clamp(min=1)

    def value_update(self, next_state: torch.Tensor, r_par: torch.Tensor, m: torch.Tensor,
                     steps: RunSteps | None = None) -> torch.Tensor:
        """`value_steps` Adam steps of V on L_v, each gradient norm clipped to par_grad_clip; the last loss.
        `steps`: how the stages run (algorithms/common/steps.py; default this Par's own, one run)."""
        steps = steps or RunSteps(self)
        loss = steps.zeros(next_state.device)
        for _ in range(self.cfg.value_steps):
            loss = steps.call(self.value_loss, next_state, r_par, m)
            steps.optimise("par_value_opt", "par_value", loss, self.cfg.par_grad_clip)
        return loss.detach()

    @torch.no_grad()
    def advantage(self, next_state: torch.Tensor, r_par: torch.Tensor, m: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """PPO's advantage r_par - V(s') normalised per `advantage_norm`, and its raw masked mean (logged)."""
        adv = r_par - self.value(next_state)[0, :, 0]
        return self.normalised_advantage(adv, r_par, m), (adv * m).sum() / m.sum().clamp(min=1)

    def normalised_advantage(self, adv: torch.Tensor, r_par: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """The advantage PPO sees, per `advantage_norm` (masked mean/std over the rows with m = 1)."""
        if self.cfg.advantage_norm == "none":
            return adv
        denom = m.sum().clamp(min=1)

        def mean_std(x):
            mean = (x * m).sum() / denom
            return mean, (((x - mean) ** 2 * m).sum() / denom).sqrt()

        mean, std = mean_std(adv)
        if self.cfg.advantage_norm == "reward":
            std = mean_std(r_par)[1]
        return (adv - mean) / (std + 1e-8)

    def ppo_loss(self, next_state: torch.Tensor, k: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor,
                 m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The clipped-surrogate loss with an entropy bonus over the rows with m = 1; also the ratio and the
        entropy per row (for `ppo_stats`)."""
        logp_all = torch.log_softmax(self.logits(next_state), dim=-1)
        logp = logp_all.gather(1, (k - 1).unsqueeze(1))[:, 0]
        ratio = (logp - logp_old).exp()
        surr = torch.min(ratio * adv, ratio.clamp(1 - self.cfg.ppo_clip, 1 + self.cfg.ppo_clip) * adv)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        loss = -((surr + self.cfg.entropy_coef * entropy) * m).sum() / m.sum().clamp(min=1)
        return loss, ratio, entropy

    @torch.no_grad()
    def ppo_stats(self, loss: torch.Tensor, ratio: torch.Tensor, entropy: torch.Tensor, m: torch.Tensor
                  ) -> dict[str, torch.Tensor]:
        denom = m.sum().clamp(min=1)
        return {"ppo/loss": loss.detach(), "ppo/entropy": (entropy * m).sum() / denom,
                "ppo/clip_frac": (((ratio - 1).abs() > self.cfg.ppo_clip).float() * m).sum() / denom}

    def ppo_update(self, next_state: torch.Tensor, k: torch.Tensor, logp_old: torch.Tensor,
                   adv: torch.Tensor, m: torch.Tensor, steps: RunSteps | None = None) -> dict[str, torch.Tensor]:
        """Clipped-surrogate PPO on pi_par over the rows with m = 1 (`ppo_epochs` full-batch steps, each gradient
        norm clipped to par_grad_clip), with the advantage as given; the logged statistics are the last epoch's."""
        steps = steps or RunSteps(self)
        stats: dict[str, torch.Tensor] = {}
        for epoch in range(self.cfg.ppo_epochs):
            loss, ratio, entropy = steps.call(self.ppo_loss, next_state, k, logp_old, adv, m)
            steps.optimise("par_policy_opt", "par_policy", loss, self.cfg.par_grad_clip)
            if epoch == self.cfg.ppo_epochs - 1:
                stats = steps.call(self.ppo_stats, loss, ratio, entropy, m)
        return stats

    def step(self, next_state: torch.Tensor, k: torch.Tensor, logp_old: torch.Tensor, r_par: torch.Tensor,
             m: torch.Tensor, steps: RunSteps | None = None) -> dict[str, torch.Tensor]:
        """One PAR update on the rows with m = 1: V towards r_par, then PPO with advantage r_par - V(s'). Written
        once: a seed stack passes its own `steps` (algorithms/common/stacked.py)."""
        steps = steps or RunSteps(self)
        out = {"par/value_loss": self.value_update(next_state, r_par, m, steps)}
        adv, out["par/adv_raw"] = steps.call(self.advantage, next_state, r_par, m)
        out.update(self.ppo_update(next_state, k, logp_old, adv, m, steps))
        return out

    def stats(self, probs: torch.Tensor, k: torch.Tensor, r_par: torch.Tensor, u: torch.Tensor,
                  w: torch.Tensor) -> dict[str, torch.Tensor]:
        """The logged PAR quantities of one batch (rows already selected)."""
        kvals = torch.arange(1, self.n + 1, dtype=probs.dtype, device=probs.device)
        out = {f"par/p_k{i + 1}": probs[:, i].mean() for i in range(self.n)}
        out.update({"par/E_k": (probs * kvals).sum(1).mean(), "par/k_sampled": k.float().mean(),
                    "par/r_par": r_par.mean(), "par/u_q": u.mean(), "par/w": w.mean()})
        return out

    @torch.no_grad()
    def mask(self, k: torch.Tensor, valid: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """[B, n] bool: the agents whose next action is replaced (`par_mask`)."""
        return par_mask(k, valid, self.n, generator)

    @torch.no_grad()
    def reward(self, q: torch.Tensor, q_data: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(r_par, u, w) from the online members' Q at (s', a'^(k)) (`par_reward_terms`)."""
        return par_reward_terms(q, self.cfg, q_data)

    def run_warnings(self, history: list[dict]) -> tuple[list[str], dict]:
        """Warnings for final.json, and its extra fields (par_collapse, for a learned pi_par only)."""
        warnings, info = collapse_warnings(history, self.learned, self.n)
        return warnings, ({"par_collapse": info} if self.learned else {})


def probe_terms(q: torch.Tensor, q_data: torch.Tensor, cfg) -> dict[str, torch.Tensor]:
    """Per-row probe values for one k: Q_1, mean_j Q_j, the configured (r_par, u, w), and the improvement
    over the dataset's next action D_j = Q_j(s', a'^(k)) - Q_j(s', a'_D) (its mean and std over members)."""
    r_par, u, w = par_reward_terms(q, cfg, q_data)
    d = q - q_data
    return {"q1": q[0], "qmean": q.mean(0), "u": u, "w": w, "rpar": r_par, "dmean": d.mean(0),
            "dstd": d.std(0, correction=cfg.u_ddof)}


def par_probe_stats(per_k: list[dict[str, torch.Tensor]], probs: torch.Tensor) -> dict[str, float]:
    """The evaluation-point diagnostics from per-k probe values (each dict: `probe_terms`) and
    pi_par's probabilities [B, n] on the probe states: per-k means, p(k), pi_par's mean per-state entropy
    and the entropy of its marginal over the probe states (0 when every state gets the same k)."""
    out: dict[str, float] = {}
    for i, d in enumerate(per_k):
        for name in ("q1", "qmean", "u", "w", "rpar", "dmean", "dstd"):
            out[f"diag/{name}_k{i + 1}"] = float(d[name].mean())
    marginal = probs.mean(0)
    for i in range(probs.shape[1]):
        out[f"diag/p_k{i + 1}"] = float(marginal[i])
    plogp = lambda p: -(p * p.clamp_min(1e-12).log()).sum(-1)  # noqa: E731
    out["diag/par_entropy"] = float(plogp(probs).mean())
    out["diag/par_marginal_entropy"] = float(plogp(marginal))
    return out


COLLAPSE_ENTROPY = 0.05  # nats: pi_par's marginal entropy on the probe below this ...
COLLAPSE_TAIL = 0.2  # ... over the last 20 % of the evaluation points ...
COLLAPSE_SHARE = 0.9  # ... at >= 90 % of them = collapsed. Not at every one: a single evaluation point
# above the threshold (seen at round 5,040 of a CN random run whose p(k = 3) never fell below 0.985
# in its last 1,200 rounds) must not hide a collapse.


def par_collapse(history: list[dict], learned: bool) -> dict | None:
    """{"k", "entropy", "p_k"} when pi_par's marginal entropy on the probe stayed below COLLAPSE_ENTROPY
    at COLLAPSE_SHARE of the last COLLAPSE_TAIL of the evaluation points (a learned pi_par only), else
    None. k is the most likely k of the tail's mean marginal, p_k its tail mean, entropy the tail's
    median."""
    points = [h for h in history if "diag/par_marginal_entropy" in h]
    if not learned or not points:
        return None
    tail = points[-max(1, int(round(len(points) * COLLAPSE_TAIL))):]
    entropies = sorted(h["diag/par_marginal_entropy"] for h in tail)
    if sum(e < COLLAPSE_ENTROPY for e in entropies) < COLLAPSE_SHARE * len(tail):
        return None
    n = sum(1 for key in tail[-1] if key.startswith("diag/p_k"))
    mean_p = {i: sum(h[f"diag/p_k{i}"] for h in tail) / len(tail) for i in range(1, n + 1)}
    k = max(mean_p, key=mean_p.get)
    return {"k": k, "entropy": entropies[len(entropies) // 2], "p_k": mean_p[k]}


def collapse_warnings(history: list[dict], learned: bool, n: int) -> tuple[list[str], dict | None]:
    info = par_collapse(history, learned)
    if info is None:
        return [], None
    where = "k = n" if info["k"] == n else f"k = {info['k']}"
    return [f"PAR collapsed to {where} (mean p = {info['p_k']:.3f}, median marginal entropy {info['entropy']:.4f}; "
            f"below {COLLAPSE_ENTROPY} at >= {int(COLLAPSE_SHARE * 100)}% of the last {int(COLLAPSE_TAIL * 100)}% "
            "of evaluations)"], info


@register
class PLCQL(CentralCriticAlgorithm):
    name = "plcql"
    Config = Config
    legacy_keys = PAR_LEGACY_KEYS

    # -- construction --------------------------------------------------------------------------------
    def __init__(self, spec, config: Config, seed: int, device: str = "cpu") -> None:
        for name, allowed in (("replace_with", ("online", "target")), ("par_updates", ("every-batch", "first-batch"))):
            if getattr(config, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(config, name)!r}")
        super().__init__(spec, config, seed, device)
        # the PAR component (pi_par, V), drawn from the initialisation generator after the actors and critics
        self.par = Par(config, self.n, spec.state_dim, self.init_gen, self.device)

    def modules(self) -> dict[str, nn.Module]:
        return {**super().modules(), **self.par.modules()}

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return {**super().optimisers(), **self.par.optimisers()}

    # -- targets ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def replacement_actions(self, next_obs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """[B, n, A]: the actions replaced agents take at o' (`replace_with`)."""
        if self.cfg.replace_with == "online":
            return self.actors(next_obs).clamp(-1.0, 1.0)
        return self.target_policy_actions(next_obs, generator)

    @torch.no_grad()
    def par_next_actions(self, batch: Batch, k: torch.Tensor,
                         generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """a'^(k) [B, n, A] and the replacement mask [B, n]."""
        gen = self.gen if generator is None else generator
        mask = self.par.mask(k, batch.next_actions_valid, gen)
        return replace_agents(batch.next_actions, self.replacement_actions(batch.next_obs, gen), mask), mask

    @torch.no_grad()
    def par_target(self, batch: Batch, joint_next: torch.Tensor) -> torch.Tensor:
        """Y = r + gamma (1 - terminal) min_j Qbar_j(s', a'^(k)), [B]."""
        q = self.target_critic(batch.next_state, joint_next.reshape(batch.size, 1, -1))[:, :, 0]
        return batch.rewards + self.cfg.gamma * (1.0 - batch.terminals) * q.min(0).values

    @torch.no_grad()
    def compute_target(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Y [B] for one critic update: draw k ~ pi_par(.|s'), build a'^(k), one target-ensemble call."""
        k, logp_old, probs = self.par.sample_k(batch.next_state, self.gen)
        joint_next, mask = self.par_next_actions(batch, k)
        return self.par_target(batch, joint_next), dict(k=k, logp_old=logp_old, probs=probs,
                                                          joint_next=joint_next, mask=mask)

    @torch.no_grad()
    def online_q(self, batch: Batch, joint_next: torch.Tensor) -> torch.Tensor:
        """[E, B]: every online member at (s', a'^(k))."""
        return self.critic(batch.next_state, joint_next.reshape(batch.size, 1, -1))[:, :, 0]

    @torch.no_grad()
    def par_reward(self, batch: Batch, joint_next: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(r_par, u, w) at (s', a'^(k)) with the online ensemble (see `par_reward_terms`)."""
        q_data = self.online_q(batch, batch.next_actions) if self.cfg.par_reward == "lcb" else None
        return self.par.reward(self.online_q(batch, joint_next), q_data)

    # -- PAR's part of the round (CentralCriticAlgorithm.round's hooks) -------------------------------------
    def target_stats(self, aux: dict[str, Any]) -> dict[str, Any]:
        """Agents replaced per row, averaged (mask [B, n]; [S, B, n] in a seed stack, hence the axes from the end)."""
        return {"par/k_replaced": aux["mask"].float().sum(-1).mean(-1)}

    def before_critic_step(self, steps: RunSteps, u: int, batch: Batch, aux: dict[str, Any]) -> Any:
        """On the batches PAR learns from (the first, or every one): r_par with the online ensemble before this
        batch's critic step."""
        if u == 0 or self.cfg.par_updates == "every-batch":
            return steps.call(self.par_reward, batch, aux["joint_next"])
        return None

    def after_actor_step(self, steps: RunSteps, u: int, batch: Batch, aux: dict[str, Any], pre: Any
                         ) -> dict[str, Any] | None:
        """PAR's statistics and, for a learned pi_par, its update (V, then PPO) on the batches with an r_par."""
        if pre is None:
            return None
        r_par, u_q, w = pre
        ms = steps.call(self.par.stats, aux["probs"], aux["k"], r_par, u_q, w)
        if self.par.learned:
            # rows whose next action is unknown replace every agent whatever k: no signal for pi_par
            ms.update(self.par.step(batch.next_state, aux["k"], aux["logp_old"], r_par,
                                    (batch.next_actions_valid > 0.5).float(), steps))
        return ms

    # -- diagnostics (runner: at every evaluation point, on a fixed probe batch) ----------------------------
    @torch.no_grad()
    def diagnostics(self, probe: Batch) -> dict[str, float]:
        """Per k = 1..n: mean Q_1, mean_j Q_j, u_Q, w and r_par at (s', a'^(k)) on the probe's rows with a
        known next action, and pi_par on their s'; the lowest and highest member's mean Q at (s', a'_D). Uses
        its own generator: training randomness is untouched."""
        rows = probe.next_actions_valid > 0.5
        batch = Batch(**{f: (v[rows] if torch.is_tensor(v) else v) for f, v in vars(probe).items()})
        gen = torch.Generator(device=self.device).manual_seed(12345)
        q_data = self.online_q(batch, batch.next_actions)
        per_k = []
        with buffers_restored(self.actors):  # the actors' running input statistics stay as training left them
            for kk in range(1, self.n + 1):
                joint, _ = self.par_next_actions(batch, torch.full((batch.size,), kk, device=self.device), gen)
                per_k.append(probe_terms(self.online_q(batch, joint), q_data, self.cfg))
        member_q = q_data.mean(1)  # [E]: each member's mean Q at (s', a'_D): shows one member running away
        return {**par_probe_stats(per_k, self.par.probs(batch.next_state)),
                "diag/q_member_min": float(member_q.min()), "diag/q_member_max": float(member_q.max())}

    def run_warnings(self, history: list[dict]) -> tuple[list[str], dict]:
        """Warnings for final.json, and extra fields for it (par_collapse, for a learned pi_par only)."""
        return self.par.run_warnings(history)


# The ablations and PAR variants of both action spaces (plcql_discrete.py registers the same list).
PAR_VARIANTS = (
    ("plcql-k1", "PLCQL ablation: k fixed to 1 (single-agent replacement).", {"fixed_k": 1}),
    ("plcql-k2", "PLCQL ablation: k fixed to 2.", {"fixed_k": 2}),
    ("plcql-kn", "PLCQL ablation: k fixed to n (full joint replacement).", {"fixed_k": "n"}),
    ("plcql-w1", "PLCQL ablation: no uncertainty weighting (w = 1).", {"uncertainty_weight": False}),
    ("plcql-uniform", "PLCQL ablation: pi_par frozen at uniform over k = 1..n.", {"fixed_k": "uniform"}),
    ("plcql-t0.1", "PLCQL with temperature T = 0.1.", {"temperature": 0.1}),
    ("plcql-t10", "PLCQL with temperature T = 10.", {"temperature": 10.0}),
    ("plcql-lcb", "This suite's PAR variant (not the paper's): LCB on the improvement over the dataset action, "
     "advantages scaled by the spread of r_par.", {"par_reward": "lcb", "advantage_norm": "reward"}),
)
for _name, _doc, _defaults in PAR_VARIANTS:
    register_variant(PLCQL, _name, _doc, **_defaults)
# Continuous only: the replaced agents' actions from actors (discrete PAR takes the greedy mean-Q action).
register_variant(PLCQL, "plcql-target-actors", "PLCQL with the replaced agents' next actions from the target actors "
                 "plus CFCQL's clipped smoothing noise (TD3's target), not Algorithm 1's online actors.",
                 replace_with="target")
register_variant(PLCQL, "plcql-kn-target", "Control (not the paper's): k fixed to n with the target actors plus smoothing, "
                 "i.e. CFCQL's own target and update on the 10-member ensemble (is a diverging critic PLCQL's, or the "
                 "ensemble's?).", fixed_k="n", replace_with="target")
register_variant(PLCQL, "plcql-member-clip", "Control (not the paper's) that set PLCQL's critic_clip default: the critic's "
                 "gradient norm clipped per ensemble member; the same config as plcql since 2026-11-27.",
                 critic_clip="per-member")
register_variant(PLCQL, "plcql-joint-clip", "PLCQL with the critic's gradient norm clipped once over all 10 members "
                 "(the twin-critic references' clip; PLCQL's default before 2026-11-27).", critic_clip="joint")

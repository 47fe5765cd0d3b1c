"""Independent (decentralised-critic) actor-critic backbone: the OMAR paper's "independent TD3"
(reference-implementations.md §4.0), used by OMAR, MA-TD3+BC, IQL and AWAC.

Every agent i has its own critic(s) over its own (o_i, a_i) and its own tanh actor. All agents and
twins are ONE stacked network: member index t * n + i = twin t of agent i (`StackedMLP`, batched
matmuls), so there is no Python loop over agents or members in an update.

The reference updates each agent on its own fresh batch; here all agents share the round's batch
(agents have disjoint parameters, so this only changes which transitions each agent sees).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from plcql_bench.algorithms.common import kernels
from plcql_bench.algorithms.common.configs import tier_table
from plcql_bench.algorithms.common.continuous import Actors
from plcql_bench.algorithms.common.checkpoint import Checkpointable, DeterministicActors
from plcql_bench.algorithms.common.nets import StackedMLP, clip_grad_norm_stacked_, hard_update_, polyak_
from plcql_bench.suite.core.spec import TaskSpec


class IndepCritics(nn.Module):
    """n_twins x n agents critics Q_{t,i}(o_i, a_i) (or V_i(o_i) with act_dim = 0), one stacked MLP."""

    def __init__(self, n_agents: int, n_twins: int, obs_dim: int, act_dim: int, hidden: int, input_norm: bool,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.n, self.T = n_agents, n_twins
        self.mlp = StackedMLP(n_twins * n_agents, obs_dim + act_dim, 1, hidden=hidden, input_norm=input_norm,
                              generator=generator)
        self.fused = kernels.fused_default()  # OMAR's sampled actions through kernels.py (omar.py)

    def forward(self, obs: torch.Tensor, act: torch.Tensor | None = None, twins: int | None = None,
                frozen: bool = False) -> torch.Tensor:
        """obs [B, n, o] (act [B, n, A]) -> Q [T, B, n]. Extra leading sample axes: obs [B, M, n, o]
        -> [T, B, M, n]. `twins`: evaluate only the first `twins` twins (T = twins; twin 1 alone for
        OMAR's Q_1); `frozen`: no gradient to the critics' parameters (only to obs/act)."""
        T = self.T if twins is None else twins
        x = obs if act is None else torch.cat([obs, act], -1)
        lead = x.shape[:-2]
        x = x.reshape(-1, self.n, x.shape[-1]).transpose(0, 1)  # [n, B*, in]
        x = x.unsqueeze(0).expand(T, -1, -1, -1).reshape(T * self.n, -1, x.shape[-1])
        members = None if T == self.T else slice(0, T * self.n)  # member t * n + i = twin t of agent i
        q = self.mlp(x, members, frozen)[..., 0].view(T, self.n, -1).transpose(1, 2)  # [T, B*, n]
        return q.reshape(T, *lead, self.n)


    # -- sampled actions: the observation part of the first layer computed once per observation ---------
    def obs_part(self, obs: torch.Tensor, members: slice | None = None) -> tuple[torch.Tensor, ...]:
        """The first layer's observation part without bias, standardised o_i @ (g_o * W1_o) [E', B, H],
        and the observation columns' batch mean and variance [E', 1, o] (several calls on the same
        observations can share it: `split_first_layer(..., obs_part=)`)."""
        mlp, n = self.mlp, self.n
        sl = members if members is not None else slice(None)
        w1 = mlp.hidden[0].weight[sl]
        E, o = w1.shape[0], obs.shape[-1]
        x_o = obs.transpose(0, 1)[torch.arange(E, device=obs.device) % n]  # [E', B, o]: member t·n + i reads o_i
        w1_o = w1[:, :o]
        if mlp.norm is None:
            return torch.bmm(x_o, w1_o), None, None
        mo, vo = mlp.norm.stats(x_o)
        x_o = (x_o - mo) * torch.rsqrt(vo + mlp.norm.eps)
        return torch.bmm(x_o, w1_o * mlp.norm.weight[sl][:, 0, :o].unsqueeze(-1)), mo, vo

    def split_first_layer(self, obs: torch.Tensor, samples: torch.Tensor, members: slice | None = None,
                          obs_part: tuple[torch.Tensor, ...] | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The critics at R sampled actions per observation, first layer split as EnsembleCritic's:
        obs [B, n, o], samples [B, R, n, A] -> h_s [E', B, H] (observation part, bias and the input
        normaliser folded in), w1a [E', n·A, H] (member t·n + i reads agent i's block, zeros elsewhere)
        and a [B·R, n·A] (the samples, rows grouped by observation), so that member e's first layer
        at row (b, r) is h_s[e, b] + a[b·R + r] @ w1a[e]. The normaliser's statistics are those of the
        plain call on the B·R concatenated rows (each observation repeated R times: its columns'
        statistics are the B observations'); its running statistics are updated as that call would."""
        B, R, n, A = samples.shape
        mlp = self.mlp
        sl = members if members is not None else slice(None)
        w1, b1 = mlp.hidden[0].weight[sl], mlp.hidden[0].bias[sl]  # [E', o + A, H], [E', 1, H]
        E, o = w1.shape[0], obs.shape[-1]
        agent = torch.arange(E, device=obs.device) % n  # member t·n + i -> agent i
        hs_o, mo, vo = self.obs_part(obs, members) if obs_part is None else obs_part
        a = samples.reshape(B * R, n * A)
        w1_a = w1[:, o:]
        if mlp.norm is not None:
            norm = mlp.norm
            g, beta = norm.weight[sl], norm.bias[sl]  # [E', 1, o + A]
            ma, va = (x.view(n, 1, A)[agent] for x in norm.stats(a))  # each agent's sample columns
            norm.update_running(torch.cat([mo, ma], -1), torch.cat([vo, va], -1), B * R, members)
            ga = g[:, :, o:] * torch.rsqrt(va + norm.eps)  # [E', 1, A]: the action columns' scale, folded
            b1 = b1 + torch.bmm(beta, w1) - torch.bmm(ma * ga, w1_a)
            w1_a = w1_a * ga.transpose(1, 2)
        h_s = hs_o + b1  # [E', B, H]
        onehot = torch.nn.functional.one_hot(agent, n).to(w1.dtype)  # [E', n]
        w1a = (onehot[:, :, None, None] * w1_a.unsqueeze(1)).reshape(E, n * A, -1)
        return h_s, w1a, a

    def sampled_lse(self, obs: torch.Tensor, samples: torch.Tensor, offset: torch.Tensor, temp: float = 1.0
                    ) -> torch.Tensor:
        """OMAR's CQL logsumexp, cache-blocked (kernels.blocked_lse: forward and backward of each block
        of observations while it is in cache): obs [B, n, o], samples [B, R, n, A], offset [B, R, n]
        -> [T·n]: mean over b of T·logsumexp_r((Q_e(o_i, a^r_i) - offset[b, r, i]) / T), member e = t·n + i.
        The plain statement is OMAR.critic_loss's non-fused branch (omar.py)."""
        B, R, n, _ = samples.shape
        h_s, w1a, a = self.split_first_layer(obs, samples)
        mlp, E = self.mlp, h_s.shape[0]
        off = offset.permute(2, 0, 1)[torch.arange(E, device=obs.device) % n].unsqueeze(2)  # [E, B, 1, R]
        pol, _ = kernels.blocked_lse(h_s, w1a, mlp.hidden[1].weight, mlp.hidden[1].bias, mlp.out.weight,
                                     mlp.out.bias, a, off, h_s.new_ones(B, 1), temp)
        return pol

    @torch.no_grad()
    def sampled_q(self, obs: torch.Tensor, samples: torch.Tensor, twins: int = 1,
                  obs_part: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """Q of the first `twins` twins at R sampled actions per observation (no gradient), in blocks of
        observations whose activations stay in cache (kernels.blocked_trunk): obs [B, n, o], samples
        [B, R, n, A] -> [twins, B, R, n] (`obs_part`: self.obs_part(obs, those twins' members), shared by
        calls on the same observations)."""
        B, R, n, _ = samples.shape
        sl = slice(0, twins * n)
        h_s, w1a, a = self.split_first_layer(obs, samples, sl, obs_part)
        mlp = self.mlp
        q = kernels.blocked_trunk(h_s, w1a, mlp.hidden[1].weight[sl], mlp.hidden[1].bias[sl], mlp.out.weight[sl],
                                  mlp.out.bias[sl], a)  # [E', B·R]
        return q.view(twins, n, B, R).permute(0, 2, 3, 1)


class IndependentBase(Checkpointable, DeterministicActors):
    """Actors (+ targets), stacked independent critics (+ targets), Adams, sampling RNG, checkpoints."""

    name = "independent"
    discrete = False
    reward = "per_agent"  # each agent's critic learns from its own reward, as OMAR's (§4.0-4.1)
    n_twins = 2
    use_value = False  # IQL: an extra V_i(o_i)
    use_target_actors = True

    # Keys taken from the backbone's per-domain settings (configs/omar_backbone.yaml; None = all of them); the
    # rest of an algorithm's config comes from its own table in algorithms/configs/<name>.yaml.
    backbone_keys: ClassVar[tuple[str, ...] | None] = ("hidden", "batch_size", "gamma")

    @classmethod
    def task_overrides(cls, spec: TaskSpec, tier: str) -> dict[str, Any]:
        bb = tier_table("omar_backbone", spec, tier)
        keys = bb if cls.backbone_keys is None else cls.backbone_keys
        return {**{k: bb[k] for k in keys if k in bb}, **tier_table(cls.name, spec, tier)}

    def __init__(self, spec: TaskSpec, config: Any, seed: int, device: str = "cpu") -> None:
        if spec.discrete:
            raise ValueError(f"{self.name} is for continuous actions; task {spec.task_id} is discrete")
        self.spec, self.cfg, self.seed, self.device = spec, config, seed, torch.device(device)
        self.n, self.A = spec.n_agents, spec.act_dim
        g = torch.Generator().manual_seed(int(seed))
        c = config
        self.actors = Actors(self.n, spec.obs_dim, self.A, c.hidden, c.input_norm, g)
        self.target_actors = Actors(self.n, spec.obs_dim, self.A, c.hidden, c.input_norm, g)
        self.critic = IndepCritics(self.n, self.n_twins, spec.obs_dim, self.A, c.hidden, c.input_norm, g)
        self.target_critic = IndepCritics(self.n, self.n_twins, spec.obs_dim, self.A, c.hidden, c.input_norm, g)
        if self.use_value:
            self.value = IndepCritics(self.n, 1, spec.obs_dim, 0, c.hidden, c.input_norm, g)
        for m in self.modules().values():
            m.to(self.device)
        hard_update_(self.target_actors, self.actors)
        hard_update_(self.target_critic, self.critic)
        self.actor_opt = torch.optim.Adam(self.actors.parameters(), lr=c.lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=c.lr)
        if self.use_value:
            self.value_opt = torch.optim.Adam(self.value.parameters(), lr=c.lr)
        self.gen = torch.Generator(device=self.device).manual_seed(int(seed) + 1)
        self.rounds = 0

    def modules(self) -> dict[str, nn.Module]:
        m = {"actors": self.actors, "target_actors": self.target_actors, "critic": self.critic,
             "target_critic": self.target_critic}
        if self.use_value:
            m["value"] = self.value
        return m

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        o = {"actor_opt": self.actor_opt, "critic_opt": self.critic_opt}
        if self.use_value:
            o["value_opt"] = self.value_opt
        return o

    # pieces -------------------------------------------------------------------------------------
    def critic_step(self, loss: torch.Tensor) -> None:
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip > 0:  # reference clips each agent's critic (both twins) separately
            clip_grad_norm_agents_(list(self.critic.parameters()), self.cfg.grad_clip, self.n_twins, self.n)
        self.critic_opt.step()

    def actor_step(self, loss: torch.Tensor) -> None:
        self.actor_opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip > 0:
            clip_grad_norm_stacked_(list(self.actors.parameters()), self.cfg.grad_clip, self.n)
        self.actor_opt.step()

    def advantage_weighted_round(self, b, y: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """IQL/AWAC round after the targets: TD step of the critics to y [B, n], then the
        deterministic actors regress onto the dataset actions weighted by `weight` [B, n], then
        only the critic targets move (these methods have no target actors in use)."""
        td = (self.critic(b.obs, b.actions) - y).pow(2).mean(1).sum()
        self.critic_step(td)
        a_loss = (weight * (self.actors(b.obs) - b.actions).pow(2).sum(-1)).mean(0).sum()
        self.actor_step(a_loss)
        polyak_(self.target_critic, self.critic, self.cfg.tau)
        self.rounds += 1
        return td.detach(), a_loss.detach()

    def update_targets(self) -> None:
        polyak_(self.target_critic, self.critic, self.cfg.tau)
        polyak_(self.target_actors, self.actors, self.cfg.tau)

    # checkpoint ---------------------------------------------------------------------------------
def clip_grad_norm_agents_(params: list[nn.Parameter], max_norm: float, n_twins: int, n_agents: int) -> torch.Tensor:
    """Clip per agent over all its twins (member t * n + i belongs to agent i), as the reference's
    clip_grad_norm_(agent_i.critic.parameters()) on a twin critic."""
    grads = [p.grad for p in params if p.grad is not None]
    sq = torch.stack([g.reshape(n_twins, n_agents, -1).pow(2).sum((0, 2)) for g in grads]).sum(0)  # [n]
    coef = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.view(n_twins, n_agents, -1).mul_(coef.view(1, n_agents, 1))
    return sq.sqrt()

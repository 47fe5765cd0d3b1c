"""Q-ensembles for the discrete-action (SMAX/SMAC) algorithms, and the shared backbone of discrete
SPaCQL and PLCQL. See docs/algorithms/spacql.md / plcql.md, "Discrete (SMAX/SMAC)".

Each of the E members is a full QMIX value function: its own GRU agent (`RNNAgent`) and its own
mixer (`QMixer`), built exactly as CFCQL-discrete builds its single pair (PyTorch default init, each
member under its own seed). The members are *stacked*, not looped over:

  StackedRNNAgent  weights [E, ...]; the input layer, the GRU input projections and the output layer
                   are one batched matmul each over all members and all time steps; the recurrence is
                   one `baddbmm` per time step for all members ([E, B·n, H] x [E, H, 3H]). It computes
                   exactly nn.GRU's equations (gate order r, z, n).
  StackedQMixer    hypernetwork weights [E, ...]: one batched matmul per layer for all members;
                   `mix_many` and `counterfactual` as QMixer's, with a leading member axis.

`EnsembleCFCQLDiscrete` is CFCQL-discrete (QMIX + TD(λ) + counterfactual CQL with the per-map
`cql_alpha`/`softmax_temp`, behaviour model for λ) with the single pair replaced by the ensemble:
  * loss = Σ_j [TD_j + cql_alpha · pen_j]: every member regresses on the SAME target and carries its own
    CF-CQL term (as the continuous PLCQL/SPaCQL, which apply CFCQL's term to every member); each member's
    gradient norm is clipped at `grad_clip` separately, so a member trains exactly like CFCQL's pair;
  * greedy policy = argmax over the available actions of the MEAN of the members' individual Qs
    (acting, and the replaced agents' actions in PAR targets);
  * targets: the subclass builds the bootstrap joint actions at every observation index
    (`compute_target`); this class provides the PAR bookkeeping (dataset next actions, masks) and
    Q_tot of every target member at given joint actions.
Memory: the counterfactual CQL term has an [E, B·T, n, A, embed] intermediate (1.9 GB in float32 for
E = 10 on 6h_vs_8z, B = 128, T = 150); it is evaluated in row blocks of `cf_block_mb` under activation
checkpointing (recomputed in the backward pass), so only one block's intermediate is alive at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from plcql_bench.algorithms.base import EpisodeBatch
from plcql_bench.algorithms.cfcql_discrete import CFCQLDiscrete, counterfactual_cql, cql_from_negative
from plcql_bench.algorithms.cfcql_discrete import Config as CFCQLConfig
from plcql_bench.algorithms.cfcql_discrete import new_behaviour_state
from plcql_bench.algorithms.common.continuous import make_adam
from plcql_bench.algorithms.common.discrete import (
    DiscreteAlgorithm, QMixer, RNNAgent, last_action_onehot, masked_argmax, masked_mean,
    masked_softmax)
from plcql_bench.algorithms.common import kernels
from plcql_bench.algorithms.common import kernels_discrete as fast
from plcql_bench.algorithms.common.nets import clip_grad_norm_stacked_, hard_update_
from plcql_bench.suite.core.spec import TaskSpec


class StackedRNNAgent(nn.Module):
    """E RNNAgents with stacked weights. Built from E `RNNAgent`s (copies their parameters)."""

    def __init__(self, members: list[RNNAgent]) -> None:
        super().__init__()
        m0 = members[0]
        self.n_members, self.n_agents, self.n_actions, self.hidden = len(members), m0.n_agents, m0.n_actions, m0.hidden

        def st(f):
            return nn.Parameter(torch.stack([f(m).detach().clone() for m in members]))

        self.fc1_w = st(lambda m: m.fc1.weight.t())  # [E, in, H]
        self.fc1_b = st(lambda m: m.fc1.bias[None])  # [E, 1, H]
        self.w_ih = st(lambda m: m.rnn.weight_ih_l0.t())  # [E, H, 3H]
        self.b_ih = st(lambda m: m.rnn.bias_ih_l0[None])  # [E, 1, 3H]
        self.w_hh = st(lambda m: m.rnn.weight_hh_l0.t())  # [E, H, 3H]
        self.b_hh = st(lambda m: m.rnn.bias_hh_l0[None])  # [E, 1, 3H]
        self.fc2_w = st(lambda m: m.fc2.weight.t())  # [E, H, A]
        self.fc2_b = st(lambda m: m.fc2.bias[None])  # [E, 1, A]
        self.fused = kernels.fused_default()  # the recurrence through kernels_discrete.fused_gru

    def init_hidden(self, batch: int) -> torch.Tensor:
        return self.fc1_w.new_zeros(self.n_members, batch, self.n_agents, self.hidden)

    def forward(self, obs: torch.Tensor, last_onehot: torch.Tensor,
                h0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [B, L, n, o], last_onehot [B, L, n, A], h0 [E, B, n, H] (zeros if None)
        -> (outputs [E, B, L, n, A], last hidden state [E, B, n, H])."""
        B, L, n, _ = obs.shape
        E, H = self.n_members, self.hidden
        eye = torch.eye(n, device=obs.device, dtype=obs.dtype).expand(B, L, n, n)
        x = torch.cat([obs, last_onehot, eye], -1).transpose(0, 1).reshape(1, L * B * n, -1)  # time-major rows
        x = F.relu(torch.baddbmm(self.fc1_b, x.expand(E, -1, -1), self.fc1_w))  # [E, L·B·n, H]
        if self.fused:  # the recurrence below as one Function (algorithms/common/kernels_discrete.py)
            h0r = None if h0 is None else h0.reshape(E, B * n, H)
            y = fast.fused_gru(x, self.w_ih, self.b_ih, self.w_hh, self.b_hh, h0r, L)  # [E, L, B·n, H]
            out = fast.narrow_linear(y.view(E, L * B * n, H), self.fc2_w, self.fc2_b)  # fast weight gradient
            return out.view(E, L, B, n, self.n_actions).transpose(1, 2), y[:, -1].reshape(E, B, n, H)
        gis = torch.baddbmm(self.b_ih, x, self.w_ih).view(E, L, B * n, 3 * H).unbind(1)  # unbind: one backward stack, not L scatters
        h = self.init_hidden(B).view(E, B * n, H) if h0 is None else h0.reshape(E, B * n, H)
        hs = []
        for g in gis:
            gh_rz, gh_n = torch.baddbmm(self.b_hh, h, self.w_hh).split([2 * H, H], -1)  # [E, B·n, 3H]
            g_rz, g_n = g.split([2 * H, H], -1)  # split, not slicing: its backward is one cat
            r, z = torch.sigmoid(g_rz + gh_rz).split([H, H], -1)
            cand = torch.tanh(g_n + r * gh_n)
            h = cand + z * (h - cand)  # (1 - z)·cand + z·h
            hs.append(h)
        y = torch.stack(hs, 1).view(E, L * B * n, H)
        out = torch.baddbmm(self.fc2_b, y, self.fc2_w).view(E, L, B, n, self.n_actions).transpose(1, 2)
        return out, h.view(E, B, n, H)

    def unroll(self, batch: EpisodeBatch) -> torch.Tensor:
        """[E, B, T+1, n, A] from zero hidden states."""
        return self(batch.obs, last_action_onehot(batch.actions, self.n_actions))[0]

    def step(self, obs: torch.Tensor, last_onehot: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [B, n, o], last_onehot [B, n, A], h [E, B, n, H] -> ([E, B, n, A], h')."""
        out, h2 = self(obs[:, None], last_onehot[:, None], h)
        return out[:, :, 0], h2


class MeanQPolicy:
    """The greedy policy's agent for `RecurrentActing`: mean over the members' individual Qs."""

    def __init__(self, agent: StackedRNNAgent) -> None:
        self.agent = agent

    def init_hidden(self, batch: int) -> torch.Tensor:
        return self.agent.init_hidden(batch)

    def step(self, obs, last_onehot, h):
        out, h2 = self.agent.step(obs, last_onehot, h)
        return out.mean(0), h2


class StackedQMixer(nn.Module):
    """E QMixers with stacked hypernetwork weights (built from E `QMixer`s). The state is shared by
    all members; outputs carry a leading member axis."""

    def __init__(self, members: list[QMixer]) -> None:
        super().__init__()
        self.n_members, self.n_agents, self.embed = len(members), members[0].n_agents, members[0].embed
        names = {"w1a": ("hyper_w1", 0), "w1b": ("hyper_w1", 2), "b1": ("hyper_b1", None),
                 "w2a": ("hyper_w2", 0), "w2b": ("hyper_w2", 2), "b2a": ("hyper_b2", 0), "b2b": ("hyper_b2", 2)}
        for key, (attr, idx) in names.items():
            layers = [getattr(m, attr) if idx is None else getattr(m, attr)[idx] for m in members]
            setattr(self, key + "_w", nn.Parameter(torch.stack([lin.weight.detach().t().clone() for lin in layers])))
            setattr(self, key + "_b", nn.Parameter(torch.stack([lin.bias.detach()[None].clone() for lin in layers])))
        self.fused = kernels.fused_default()  # counterfactuals through kernels_discrete

    def _lin(self, key: str, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(getattr(self, key + "_b"), x, getattr(self, key + "_w"))

    def weights(self, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """state [M, S] -> |W1| [E, M, n, Em], b1 [E, M, 1, Em], |W2| [E, M, Em, 1], b2 [E, M, 1, 1]."""
        E, M = self.n_members, state.shape[0]
        s = state.unsqueeze(0).expand(E, -1, -1)
        w1 = self._lin("w1b", F.relu(self._lin("w1a", s))).abs().view(E, M, self.n_agents, self.embed)
        b1 = self._lin("b1", s).view(E, M, 1, self.embed)
        w2 = self._lin("w2b", F.relu(self._lin("w2a", s))).abs().view(E, M, self.embed, 1)
        b2 = self._lin("b2b", F.relu(self._lin("b2a", s))).view(E, M, 1, 1)
        return w1, b1, w2, b2

    def mix_many(self, qs: torch.Tensor, state: torch.Tensor, w: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """qs [E, *L, K, n], state [*L, S] -> Q_tot [E, *L, K] (member j mixes qs[j]); `w` = weights(state)
        when the caller already has them."""
        E, lead, K = self.n_members, state.shape[:-1], qs.shape[-2]
        w = self.weights(state.reshape(-1, state.shape[-1])) if w is None else w
        w1, b1, w2, b2 = (x.flatten(0, 1) for x in w)
        h = F.elu(torch.baddbmm(b1, qs.reshape(-1, K, self.n_agents), w1))  # [E·M, K, Em]
        return torch.baddbmm(b2, h, w2).reshape(E, *lead, K)

    def forward(self, qs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """qs [E, *L, n], state [*L, S] -> [E, *L]."""
        return self.mix_many(qs.unsqueeze(-2), state)[..., 0]

    def counterfactual(self, q_all: torch.Tensor, actions: torch.Tensor, state: torch.Tensor,
                       w: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """QMixer.counterfactual per member: q_all [E, *L, n, A], actions [*L, n], state [*L, S] -> [E, *L, n, A];
        `w` = weights(state) when the caller already has them."""
        E, lead, (n, A) = self.n_members, state.shape[:-1], q_all.shape[-2:]
        if self.fused:  # the [E, M, n, A, Em] intermediate in cache-sized blocks, never stored
            pre, delta, w1, w2, b2 = self.counterfactual_parts(q_all, actions, state, w)
            out = fast.counterfactual_mix(pre, delta, w1, w2) + b2.unsqueeze(-1)
            return out.reshape(E, *lead, n, A)
        w1, b1, w2, b2 = self.weights(state.reshape(-1, state.shape[-1])) if w is None else w  # [E, M, ...]
        q_all = q_all.reshape(E, -1, n, A)
        q_taken = q_all.gather(-1, actions.reshape(1, -1, n, 1).expand(E, -1, -1, -1))  # [E, M, n, 1]
        pre = torch.matmul(q_taken.transpose(-1, -2), w1) + b1  # [E, M, 1, Em]
        pre_cf = pre.unsqueeze(-2) + (q_all - q_taken).unsqueeze(-1) * w1.unsqueeze(-2)  # [E, M, n, A, Em]
        M, Em = pre_cf.shape[1], pre_cf.shape[-1]
        out = torch.bmm(F.elu(pre_cf).view(E * M, n * A, Em), w2.reshape(E * M, Em, 1))  # one bmm, no broadcast copy
        return (out.view(E, M, n, A) + b2).reshape(E, *lead, n, A)


    def counterfactual_parts(self, q_all: torch.Tensor, actions: torch.Tensor, state: torch.Tensor,
                             w: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, ...]:
        """The inputs of the fused counterfactual kernels (kernels_discrete), rows r = e·M + m: QMIX's first
        layer at the data pre [R, Em], the deltas q_all − q_taken [R, n, A], |W1| [R, n, Em], |W2| [R, Em],
        b2 [R, 1] (q_all [E, *L, n, A], actions [*L, n], state [*L, S])."""
        E, (n, A) = self.n_members, q_all.shape[-2:]
        w1, b1, w2, b2 = self.weights(state.reshape(-1, state.shape[-1])) if w is None else w  # [E, M, ...]
        q_all = q_all.reshape(E, -1, n, A)
        q_taken = q_all.gather(-1, actions.reshape(1, -1, n, 1).expand(E, -1, -1, -1))  # [E, M, n, 1]
        pre = torch.matmul(q_taken.transpose(-1, -2), w1) + b1  # [E, M, 1, Em]
        M, Em = pre.shape[1], pre.shape[-1]
        return (pre.reshape(E * M, Em), (q_all - q_taken).reshape(E * M, n, A), w1.reshape(E * M, n, Em),
                w2.reshape(E * M, Em), b2.reshape(E * M, 1))


@dataclass
class EnsembleConfig(CFCQLConfig):
    # Everything of CFCQL-discrete's Config (QMIX backbone, per-map cql_alpha / softmax_temp, behaviour
    # model for λ), plus:
    n_critics: int = 10  # "an ensemble of ten Q-networks" (PLCQL paper; SPaCQL §4.4)
    cf_block_mb: float = 256.0  # CF-CQL evaluated in row blocks of this many MB of intermediate, checkpointed (0 = one block, no checkpointing)


class EnsembleCFCQLDiscrete(CFCQLDiscrete):
    """CFCQL-discrete with an E-member stacked QMIX ensemble (see the module docstring). Subclasses
    implement `compute_target(batch, q_all) -> (y [B, T], info)`; `before_step(batch, q_all, info)` runs
    after the target and before the gradient step (PLCQL's r_par)."""

    Config = EnsembleConfig
    legacy_keys = {"q_ens": "critic", "mixer_ens": "mixer", "target_q_ens": "target_critic",
                   "target_mixer_ens": "target_mixer", "opt": "critic_opt"}  # before issue 22

    def __init__(self, spec: TaskSpec, config: EnsembleConfig, seed: int, device: str = "cpu") -> None:
        DiscreteAlgorithm.__init__(self, spec, config, seed, device)
        c = config
        if c.n_critics < 1:
            raise ValueError(f"n_critics must be >= 1, got {c.n_critics}")
        E = c.n_critics
        self.critic = StackedRNNAgent([self.build(10 + j, lambda: self.agent(c.hidden)) for j in range(E)]).to(self.device)
        self.mixer = StackedQMixer([self.build(10 + E + j, lambda: self.mixer(c.mixing_embed, c.hypernet_embed))
                                      for j in range(E)]).to(self.device)
        self.target_critic = self.target_of(self.critic)
        self.target_mixer = self.target_of(self.mixer)
        self.critic_opt = make_adam([*self.critic.parameters(), *self.mixer.parameters()], c.lr)
        self.behaviour: RNNAgent | None = None
        if self.uses_behaviour():
            self.behaviour = self.build(3, lambda: self.agent(c.hidden))
            self.behaviour_opt = torch.optim.Adam(self.behaviour.parameters(), lr=c.behaviour_lr)
        self.behaviour_state = new_behaviour_state()
        self._policy = MeanQPolicy(self.critic)

    def value_modules(self) -> dict[str, nn.Module]:
        return {"critic": self.critic, "mixer": self.mixer, "target_critic": self.target_critic,
                "target_mixer": self.target_mixer}

    def policy_agent(self) -> MeanQPolicy:  # type: ignore[override]
        return self._policy

    # -- PAR bookkeeping ------------------------------------------------------------------------
    @staticmethod
    def next_action_data(batch: EpisodeBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per observation index t' in 0..T: the dataset action a_t' [B, T+1, n] (0 at T), whether it
        is known [B, T+1] (t' < len; the final next observation has none: PAR replaces every agent
        there), and whether Q(s_t', ·) bootstraps a real step [B, T+1] (1 <= t' <= len)."""
        B, T, n = batch.actions.shape
        data = torch.cat([batch.actions, batch.actions.new_zeros(B, 1, n)], 1)
        zero = batch.mask.new_zeros(B, 1)
        valid = torch.cat([batch.mask, zero], 1)
        boot = torch.cat([zero, batch.mask], 1)
        return data, valid, boot

    @torch.no_grad()
    def greedy_actions(self, batch: EpisodeBatch, q_all: torch.Tensor | None) -> torch.Tensor:
        """The current policy's greedy available action at every observation [B, T+1, n]: argmax of
        the mean over the ONLINE members' individual Qs (computed here when q_all is None)."""
        if q_all is None:
            q_all = self.critic.unroll(batch)
        return masked_argmax(q_all.detach().mean(0), batch.avail)

    def member_q_tot(self, agent_q: torch.Tensor, mixer: StackedQMixer, joint: torch.Tensor,
                     state: torch.Tensor) -> torch.Tensor:
        """Q_tot of every member at joint actions: agent_q [E, B, L, n, A], joint [B, L, K, n] (K joint
        actions per index), state [B, L, S] -> [E, B, L, K]. Carries gradient when enabled."""
        E = agent_q.shape[0]
        idx = joint.transpose(2, 3).unsqueeze(0).expand(E, -1, -1, -1, -1)  # [E, B, L, n, K]
        q = agent_q.gather(-1, idx).transpose(-1, -2)  # [E, B, L, K, n]
        return mixer.mix_many(q, state)

    # -- λ weights and CF-CQL on the ensemble ---------------------------------------------------
    @torch.no_grad()
    def cf_weights_ens(self, cf: torch.Tensor, batch: EpisodeBatch) -> torch.Tensor:
        """CFCQL's λ per member: cf [E, B, T, n, A] -> [E, B, T, n] (β computed once)."""
        E, B, T, n, _ = cf.shape
        temp = self.cfg.softmax_temp
        if self.behaviour is None or temp == 0:
            return cf.new_full((E, B, T, n), 1.0 / n)
        avail = batch.avail[:, :T]
        beta = masked_softmax(self.behaviour.unroll(batch)[:, :T], avail)
        mu = masked_softmax(cf, avail)
        eps = 1e-5
        kl = ((mu + eps) * ((mu + eps).log() - (beta + eps).log()) * avail).sum(-1)  # [E, B, T, n]
        if temp >= 100:
            return F.one_hot(kl.argmax(-1), n).float()
        return torch.softmax(temp * kl, -1)

    def counterfactual_blocked(self, q: torch.Tensor, actions: torch.Tensor, state: torch.Tensor,
                               w: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """mix_ens.counterfactual over rows [B·T] in blocks of ~cf_block_mb, each under activation
        checkpointing (its [E, rows, n, A, embed] intermediate is recomputed in the backward pass).
        The fused kernel (kernels_discrete.counterfactual_mix) blocks inside and takes all rows at once,
        with the mixer weights `w` of these states when given."""
        E, B, T, n, A = q.shape
        M = B * T
        qf, af, sf = q.reshape(E, M, n, A), actions.reshape(M, n), state.reshape(M, -1)
        if self.mixer.fused:
            return self.mixer.counterfactual(qf, af, sf, w).view(E, B, T, n, A)
        per_row = E * n * A * self.cfg.mixing_embed * 4 * 3  # pre_cf, elu, product (bytes)
        rows = M if self.cfg.cf_block_mb <= 0 else max(1, int(self.cfg.cf_block_mb * 2 ** 20 // per_row))
        if rows >= M and self.cfg.cf_block_mb <= 0:
            return self.mixer.counterfactual(qf, af, sf).view(E, B, T, n, A)
        outs = []
        for r0 in range(0, M, rows):
            sl = slice(r0, r0 + rows)
            if torch.is_grad_enabled():
                outs.append(checkpoint(self.mixer.counterfactual, qf[:, sl], af[sl], sf[sl], use_reentrant=False))
            else:
                outs.append(self.mixer.counterfactual(qf[:, sl], af[sl], sf[sl]))
        return torch.cat(outs, 1).view(E, B, T, n, A)

    def cql_penalty_ens(self, batch: EpisodeBatch, q: torch.Tensor, q_tot: torch.Tensor,
                        w: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, dict]:
        """[E, B, T] counterfactual CQL term per member (CFCQL's), and diagnostics (`w`: the online
        mixers' weights at the batch's states s_0..s_T-1, when the caller has them)."""
        if self.mixer.fused:  # mixer, λ and logsumexp in one cache-blocked pass (kernels_discrete.cf_negative)
            E, B, T, n, A = q.shape
            parts = self.mixer.counterfactual_parts(q, batch.actions, batch.state[:, :T], w)
            neg, lam = fast.cf_negative(*parts, batch.avail[:, :T].reshape(B * T, n, A), self.behaviour_logprob(batch),
                                        self.cfg.softmax_temp, E)
            return cql_from_negative(neg.view(E, B, T), lam.view(E, B, T, n), batch, q_tot)
        cf = self.counterfactual_blocked(q, batch.actions, batch.state[:, :batch.max_t], w)  # [E, B, T, n, A]
        return counterfactual_cql(cf, self.cf_weights_ens(cf.detach(), batch), batch, q_tot)

    # -- one round ------------------------------------------------------------------------------
    def compute_target(self, batch: EpisodeBatch, q_all: torch.Tensor | None = None):  # pragma: no cover
        raise NotImplementedError

    def before_step(self, batch: EpisodeBatch, q_all: torch.Tensor, info: dict[str, Any]) -> dict[str, Any]:
        """Runs after the target, before the gradient step; its result goes to after_step."""
        return {}

    def after_step(self, batch: EpisodeBatch, info: dict[str, Any], pre: dict[str, Any]) -> dict[str, float]:
        """Runs after the gradient step; returns extra metrics."""
        return {}

    def update(self, sample) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.behaviour is not None:
            out.update(self.train_behaviour(sample))
        c = self.cfg
        batch = self.scaled(sample(c.batch_episodes))
        T, E = batch.max_t, c.n_critics
        q_all = self.critic.unroll(batch)  # [E, B, T+1, n, A]
        q = q_all[:, :, :T]
        act = batch.actions.unsqueeze(0).unsqueeze(-1).expand(E, -1, -1, -1, -1)
        q_taken = q.gather(-1, act)[..., 0]  # [E, B, T, n]
        # the fused path computes the online mixers' hypernetworks once for the TD term and CF-CQL
        mix_w = self.mixer.weights(batch.state[:, :T].reshape(-1, batch.state.shape[-1])) if self.mixer.fused else None
        q_tot = self.mixer.mix_many(q_taken.unsqueeze(-2), batch.state[:, :T], mix_w)[..., 0]  # [E, B, T]
        y, info = self.compute_target(batch, q_all)
        pre = self.before_step(batch, q_all, info)
        m = batch.mask
        td_e = (0.5 * (q_tot - y).pow(2) * m).sum((1, 2)) / m.sum().clamp_min(1.0)  # [E]
        loss = td_e.sum()
        stats = {"critic/td_loss": td_e.detach().mean(), "critic/q_taken": masked_mean(q_tot.detach(), m),
                 "critic/target": masked_mean(y.detach(), m),
                 "critic/q_std": masked_mean(q_tot.detach().std(0) if E > 1 else torch.zeros_like(y), m)}
        if c.cql_alpha > 0:
            pen_bt, cst = self.cql_penalty_ens(batch, q, q_tot, mix_w)
            pen_e = (pen_bt * m).sum((1, 2)) / m.sum().clamp_min(1.0)
            loss = loss + c.cql_alpha * pen_e.sum()
            stats.update(cst)
            stats["cql/penalty"] = pen_e.detach().mean()
        stats.update(info.get("stats", {}))
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        params = [*self.critic.parameters(), *self.mixer.parameters()]
        if c.grad_clip > 0:
            gn = clip_grad_norm_stacked_(params, c.grad_clip, E).mean()
        else:
            gn = torch.zeros(())
        self.critic_opt.step()
        self.rounds += 1
        if self.rounds % c.target_update_interval == 0:
            hard_update_(self.target_critic, self.critic)
            hard_update_(self.target_mixer, self.mixer)
        stats["critic/loss"] = loss.detach() / E
        stats["critic/grad_norm"] = gn
        out.update({k: float(v) for k, v in stats.items()})
        out.update(self.after_step(batch, info, pre))
        return out

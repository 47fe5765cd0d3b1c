"""The backbone of the discrete-action (SMAX/SMAC) CFCQL family, with the ensemble size E as a parameter:
CFCQL (E = 1), MACQL (E = 1, its own penalty), SPaCQL and PLCQL (E = n_critics = 10). See
docs/algorithms/cfcql.md, spacql.md and plcql.md, "Discrete (SMAX/SMAC)".

`CFCQLBackbone` is a component an algorithm holds (`self.backbone`); it has the E QMIX value functions
(GRU agent + mixer each), their targets and one Adam, the behaviour model β for λ, and the one critic
update of the family (`update`):

  q_all    = E agents' Qs at every observation                                  [E, B, T+1, n, A]
  Q_tot,j  = member j's mixer at the data joint action (s_t, a_t)                [E, B, T]
  loss     = Σ_j [ mean over real steps of ½ (Q_tot,j − y)²  +  cql_alpha · pen_j ]
  pen_j    = Σ_i λ_i logsumexp_{a available} Q_tot,j(s, a_i = a, a_-i) − Q_tot,j(s, a)   (counterfactual CQL)
  λ        = softmax_i(softmax_temp · KL(μ_i || β_i)), μ_i = softmax over agent i's counterfactual Q_tot
  step     = Adam on all members; gradient norm clipped per member (with one member: over all its
             parameters, CFCQL's clip); hard target copies every target_update_interval rounds

The target y [B, T] is the algorithm's (CFCQL: TD(λ) over the target members' min at the double-Q action;
SPaCQL, PLCQL: at PAR joint actions), as is the penalty where it differs (MACQL's sampled joint actions).
Every member regresses on the SAME target and carries its own penalty, so a member trains exactly like
CFCQL's pair; the greedy policy (acting, PAR's replaced agents) is the argmax of the MEAN of the members'
individual Qs over the available actions.

Members. CFCQL and MACQL hold one `RNNAgent` and one `QMixer` (the checkpoint keeps their layout); the
update sees them through `OneAgent`/`OneMixer`, which add a member axis of size 1, so one code path runs
E = 1 and E = 10 and CFCQL's numbers are those of its own single-pair code. The ensembles stack their
members, built exactly as CFCQL builds its pair (PyTorch default init, each member under its own seed):

  StackedRNNAgent  weights [E, ...]; the input layer, the GRU input projections and the output layer
                   are one batched matmul each over all members and all time steps; the recurrence is
                   one `baddbmm` per time step for all members ([E, B·n, H] x [E, H, 3H]). It computes
                   exactly nn.GRU's equations (gate order r, z, n).
  StackedQMixer    hypernetwork weights [E, ...]: one batched matmul per layer for all members;
                   `mix_many` and `counterfactual` as QMixer's, with a leading member axis.

Memory: the counterfactual CQL term has an [E, B·T, n, A, embed] intermediate (1.9 GB in float32 for
E = 10 on 6h_vs_8z, B = 128, T = 150); on the plain path it is evaluated in row blocks of `cf_block_mb`
under activation checkpointing (recomputed in the backward pass), so only one block's intermediate is
alive at a time; the fused path (kernels_discrete.cf_negative) never stores it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from plcql_bench.algorithms.base import EpisodeBatch
from plcql_bench.algorithms.common import kernels
from plcql_bench.algorithms.common import kernels_discrete as fast
from plcql_bench.algorithms.common.continuous import make_adam
from plcql_bench.algorithms.common.discrete import (
    QMixer, RNNAgent, bc_step, last_action_onehot, masked_argmax, masked_logsumexp, masked_mean, masked_softmax,
    td_lambda_targets, time_major_inputs)
from plcql_bench.algorithms.common.nets import clip_grad_norm_stacked_, hard_update_


@dataclass
class BackboneConfig:
    """CFCQL-discrete's settings, shared by the family (each algorithm's Config derives from this one)."""

    # --- QMIX backbone (cql_qmix.yaml, default.yaml) ---
    hidden: int = 64  # rnn_hidden_dim 64 (n_rnn agent)
    mixing_embed: int = 32  # mixing_embed_dim 32
    hypernet_embed: int = 64  # hypernet_embed 64
    lr: float = 1e-3  # lr 0.001, optimizer adam
    gamma: float = 0.99  # gamma 0.99
    reward_scale: float = 1.0  # rewards x this in the update; SMAX: 10 (configs/discrete_common.yaml)
    bootstrap_timeouts: bool = False  # False: a timeout is terminal, as in the references (common/discrete.py)
    td_lambda: float = 0.6  # td_lambda 0.6 on every map (configs/cfcql_discrete.yaml says why)
    batch_episodes: int = 128  # batch_size 128 episodes
    grad_clip: float = 10.0  # grad_norm_clip 10
    target_update_interval: int = 25  # rounds: 200 "episodes" / batch_size_run 8
    double_q: bool = True  # online argmax, target evaluation (cq_learner)
    # --- counterfactual CQL ---
    cql_alpha: float = 50.0  # global_cql_alpha 50.0 (cql_qmix.yaml); per map/dataset via the table
    softmax_temp: float = 5.0  # softmax_temp 5 (cql_qmix.yaml); per map/dataset via the table; 0 = 1/n
    # --- behaviour model for λ (moderate_lambda) ---
    behaviour_lr: float = 1e-3  # the reference's behaviour optimiser uses args.lr
    behaviour_timesteps: int = 10_000_000  # max_behaviour_train_steps 10M sampled (filled) timesteps
    behaviour_max_updates: int = 0  # cap on β updates; 0 = none (the reference); smoke profiles set it


@dataclass
class EnsembleConfig(BackboneConfig):
    # Everything of CFCQL-discrete's Config (QMIX backbone, per-map cql_alpha / softmax_temp, behaviour
    # model for λ), plus:
    n_critics: int = 10  # "an ensemble of ten Q-networks" (PLCQL paper; SPaCQL §4.4)
    cf_block_mb: float = 256.0  # CF-CQL evaluated in row blocks of this many MB of intermediate, checkpointed (0 = one block, no checkpointing)


def new_behaviour_state() -> dict[str, Any]:
    """β's training progress (checkpointed): updates, sampled timesteps, done, last loss."""
    return {"updates": 0, "timesteps": 0, "done": False, "loss": 0.0}


def counterfactual_cql(cf: torch.Tensor, lam: torch.Tensor, batch: EpisodeBatch,
                       q_tot: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """cf [..., B, T, n, A] (Q_tot with agent i's action replaced by each action), λ [..., B, T, n]:
    Σ_i λ_i logsumexp over agent i's AVAILABLE actions, minus q_tot [..., B, T]; and diagnostics."""
    lse = masked_logsumexp(cf, batch.avail[:, :batch.max_t])  # [..., B, T, n]
    return cql_from_negative((lam * lse).sum(-1), lam, batch, q_tot)


def cql_from_negative(neg: torch.Tensor, lam: torch.Tensor, batch: EpisodeBatch,
                      q_tot: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The penalty neg − q_tot [..., B, T] and diagnostics from the negative term and λ."""
    m = batch.mask
    stats = {"cql/lambda_max": masked_mean(lam.max(-1).values, m), "cql/lambda_min": masked_mean(lam.min(-1).values, m),
             "cql/negative": masked_mean(neg.detach(), m)}
    return neg - q_tot, stats


class BehaviourCache:
    """log(β + 1e-5) [rows, n, A] at every observation of one sampler's episodes (its flat store's rows),
    computed once β is trained. β is frozen from then on (its training ends before the first critic step),
    so each round gathers its batch's rows here instead of unrolling β over the batch (~15 % of a
    CFCQL-discrete round on 2s3z).

    The values are the unrolled ones up to float rounding: β's output at step t of an episode depends
    only on that episode's observations and actions up to t, which a padded batch and the whole-episode
    unroll share; at padding past an episode's final observation nothing is available, so both give
    log(1e-5)."""

    EPS = 1e-5
    CHUNK = 128  # episodes per unroll while building (sorted by length: little padding)

    def __init__(self, behaviour: RNNAgent, sampler: Any) -> None:
        self.sampler, self.behaviour = sampler, behaviour
        self.versions = self._versions()
        n, A = sampler.avail.shape[1:]
        self.logp = sampler.avail.new_zeros(sampler.avail.shape[0], n, A)
        self.log_eps = torch.tensor(self.EPS, dtype=self.logp.dtype, device=self.logp.device).log()
        with torch.no_grad():
            for idx in torch.argsort(sampler.lengths.cpu()).split(self.CHUNK):
                batch = sampler.episodes(idx)
                beta = masked_softmax(behaviour.unroll(batch), batch.avail)  # [B, T+1, n, A]
                t = torch.arange(batch.max_t + 1, device=beta.device)
                real = t[None] <= batch.lengths[:, None]  # observations 0..len
                rows = sampler.offsets[batch.episode_ids][:, None] + t[None]
                self.logp[rows[real]] = beta[real].add_(self.EPS).log_()

    def _versions(self) -> tuple[int, ...]:
        return tuple(p._version for p in self.behaviour.parameters())

    def valid_for(self, behaviour: RNNAgent, sampler: Any) -> bool:
        """Built from this β, unchanged since (a checkpoint load bumps the version counters), for this sampler."""
        return behaviour is self.behaviour and sampler is self.sampler and self.versions == self._versions()

    def gather(self, batch: EpisodeBatch) -> torch.Tensor:
        """log(β + 1e-5) at the batch's steps 0..T-1, [B·T, n, A] (as `CFCQLBackbone.behaviour_logprob`)."""
        t = torch.arange(batch.max_t, device=self.logp.device)
        lens = batch.lengths[:, None]
        rows = self.sampler.offsets[batch.episode_ids][:, None] + torch.minimum(t[None], lens)
        out = self.logp[rows].masked_fill_((t[None] > lens)[..., None, None], self.log_eps)
        return out.flatten(0, 1)


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
        x = time_major_inputs(obs, last_onehot).reshape(L * B * n, -1)  # time-major rows
        if self.fused:  # the first layer and the recurrence through algorithms/common/kernels_discrete.py
            x = F.relu_(fast.shared_input_linear(x, self.fc1_w, self.fc1_b))  # [E, L·B·n, H]; in place: no second
            # [E, L·B·n, H] tensor (the first layer's backward does not read its output)
            h0r = None if h0 is None else h0.reshape(E, B * n, H)
            y = fast.fused_gru(x, self.w_ih, self.b_ih, self.w_hh, self.b_hh, h0r, L)  # [E, L, B·n, H]
            out = fast.narrow_linear(y.view(E, L * B * n, H), self.fc2_w, self.fc2_b)  # fast weight gradient
            return out.view(E, L, B, n, self.n_actions).transpose(1, 2), y[:, -1].reshape(E, B, n, H)
        x = F.relu(torch.baddbmm(self.fc1_b, x.expand(E, -1, -1), self.fc1_w))  # [E, L·B·n, H]
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
        """[E, B, T+1, n, A] from zero hidden states. The fused path computes the real observations only
        (kernels_discrete.packed_agent_unroll) and returns zeros at the padded indices, which every
        consumer masks (a batch without padding takes the unpacked fused path); the plain path computes
        the padding too."""
        last = last_action_onehot(batch.actions, self.n_actions)
        if self.fused and fast.has_padding(batch.lengths, batch.obs.shape[1]):
            return fast.packed_agent_unroll(batch.obs, last, batch.lengths, self.fc1_w, self.fc1_b, self.w_ih,
                                            self.b_ih, self.w_hh, self.b_hh, self.fc2_w, self.fc2_b)
        return self(batch.obs, last)[0]

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
        if x.dim() == 2:  # the state, shared by the members: [M, S]
            if self.fused:
                return fast.shared_input_linear(x, getattr(self, key + "_w"), getattr(self, key + "_b"))
            x = x.unsqueeze(0).expand(self.n_members, -1, -1)
        return torch.baddbmm(getattr(self, key + "_b"), x, getattr(self, key + "_w"))

    def weights(self, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """state [M, S] -> |W1| [E, M, n, Em], b1 [E, M, 1, Em], |W2| [E, M, Em, 1], b2 [E, M, 1, 1]."""
        E, M, s = self.n_members, state.shape[0], state  # _lin shares s over the members
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
                             w: tuple[torch.Tensor, ...] | None = None,
                             pre: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """The inputs of the fused counterfactual kernels (kernels_discrete), rows r = e·M + m: QMIX's first
        layer at the data pre [R, Em] (`pre` when the caller has it: `mix_data`), the deltas q_all − q_taken
        [R, n, A], |W1| [R, n, Em], |W2| [R, Em], b2 [R, 1] (q_all [E, *L, n, A], actions [*L, n], state [*L, S])."""
        E, (n, A) = self.n_members, q_all.shape[-2:]
        w1, b1, w2, b2 = self.weights(state.reshape(-1, state.shape[-1])) if w is None else w  # [E, M, ...]
        q_all = q_all.reshape(E, -1, n, A)
        q_taken = q_all.gather(-1, actions.reshape(1, -1, n, 1).expand(E, -1, -1, -1))  # [E, M, n, 1]
        M, Em = q_all.shape[1], w1.shape[-1]
        if pre is None:
            pre = fast.first_layer(q_taken.reshape(E * M, n), w1.reshape(E * M, n, Em), b1.reshape(E * M, Em))
        return (pre, (q_all - q_taken).reshape(E * M, n, A), w1.reshape(E * M, n, Em),
                w2.reshape(E * M, Em), b2.reshape(E * M, 1))

    def mix_data(self, q_taken: torch.Tensor, w: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The fused update's Q_tot at one joint action per state (`mix_many` with K = 1), q_taken [E, M, n],
        w = weights(state) -> (Q_tot [E, M], QMIX's first layer there [E·M, Em], which `counterfactual_parts`
        reuses: the TD term and the counterfactual CQL term share it and its backward pass)."""
        E, M, n = q_taken.shape
        w1, b1, w2, b2 = (x.reshape(E * M, *x.shape[2:]) for x in w)
        pre = fast.first_layer(q_taken.reshape(E * M, n), w1, b1[:, 0])  # [E·M, Em]
        return torch.baddbmm(b2, F.elu(pre).unsqueeze(1), w2).view(E, M), pre


def uses_behaviour(cfg) -> bool:
    """β is trained when λ is not uniform and there is a penalty to weight."""
    return cfg.softmax_temp != 0 and cfg.cql_alpha > 0


# Checkpoint keys before issue 22 (`Checkpointable.legacy_keys`): the single pair's and the ensembles'.
SINGLE_LEGACY_KEYS = {"q_agent": "critic", "target_agent": "target_critic", "opt": "critic_opt"}
ENSEMBLE_LEGACY_KEYS = {"q_ens": "critic", "mixer_ens": "mixer", "target_q_ens": "target_critic",
                        "target_mixer_ens": "target_mixer", "opt": "critic_opt"}


class OneAgent:
    """A single `RNNAgent` seen as an ensemble of one: `unroll` gains a leading member axis of size 1."""

    def __init__(self, agent: RNNAgent) -> None:
        self.agent = agent

    def unroll(self, batch: EpisodeBatch) -> torch.Tensor:
        return self.agent.unroll(batch).unsqueeze(0)


class OneMixer:
    """A single `QMixer` seen as an ensemble of one: inputs with a member axis of size 1 lose it, outputs
    gain it; the calls and tensors are QMixer's own (CFCQL's numbers)."""

    def __init__(self, mixer: QMixer) -> None:
        self.mixer = mixer
        self.fused = mixer.fused

    def weights(self, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.mixer.weights(state)

    def mix_many(self, qs: torch.Tensor, state: torch.Tensor, w: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        return self.mixer.mix_many(qs[0], state, w).unsqueeze(0)

    def counterfactual(self, q_all: torch.Tensor, actions: torch.Tensor, state: torch.Tensor,
                       w: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        return self.mixer.counterfactual(q_all[0], actions, state, w).unsqueeze(0)

    def counterfactual_parts(self, q_all: torch.Tensor, actions: torch.Tensor, state: torch.Tensor,
                             w: tuple[torch.Tensor, ...] | None = None,
                             pre: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        return self.mixer.counterfactual_parts(q_all[0], actions, state, w, pre)  # rows r = m, as E·M for E = 1

    def mix_data(self, q_taken: torch.Tensor, w: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        q_tot, pre = self.mixer.mix_data(q_taken[0], w)
        return q_tot.unsqueeze(0), pre


@dataclass
class Prediction:
    """What the critic update regresses (`CFCQLBackbone.predict`)."""

    q: torch.Tensor  # the online members' Qs at s_0..s_T-1 [E, B, T, n, A]
    q_tot: torch.Tensor  # every member's Q_tot at the data joint action (s_t, a_t) [E, B, T]
    mix_w: tuple[torch.Tensor, ...] | None  # the online mixers' weights at s_0..s_T-1 (fused path), for the penalty
    pre: torch.Tensor | None = None  # fused path: QMIX's first layer at (s_t, a_t) [E·B·T, embed], for CF-CQL


class CFCQLBackbone:
    """The family's value functions, β and critic update (module docstring). Checkpoint keys: critic,
    mixer, target_critic, target_mixer, critic_opt, behaviour and behaviour_opt (when β is used)."""

    def __init__(self, algo: Any, n_members: int, stacked: bool, use_behaviour: bool, block_mb: float = 0.0) -> None:
        """`algo`: the DiscreteAlgorithm that holds it (its config, `build`, `agent`, `mixer`, device).
        `stacked`: E members stacked (the ensembles, E >= 1), else one RNNAgent + QMixer (E = 1, CFCQL's).
        `block_mb`: the plain path's CF-CQL row blocks (EnsembleConfig.cf_block_mb; 0 = one block)."""
        self._owner, c = algo, algo.cfg
        if n_members < 1 or (not stacked and n_members != 1):
            raise ValueError(f"n_critics must be >= 1 (1 without stacking), got {n_members}")
        self.n_members, self.stacked, self.block_mb = n_members, stacked, block_mb
        if stacked:
            E = n_members
            self.critic = StackedRNNAgent([algo.build(10 + j, lambda: algo.new_agent(c.hidden)) for j in range(E)]).to(algo.device)
            self.mixer = StackedQMixer([algo.build(10 + E + j, lambda: algo.new_mixer(c.mixing_embed, c.hypernet_embed))
                                        for j in range(E)]).to(algo.device)
        else:
            self.critic = algo.build(1, lambda: algo.new_agent(c.hidden))
            self.mixer = algo.build(2, lambda: algo.new_mixer(c.mixing_embed, c.hypernet_embed))
        self.target_critic, self.target_mixer = algo.target_of(self.critic), algo.target_of(self.mixer)
        params = [*self.critic.parameters(), *self.mixer.parameters()]
        self.critic_opt = make_adam(params, c.lr) if stacked else torch.optim.Adam(params, lr=c.lr)
        # the member-axis views the update works on (the stacked networks are their own)
        self.agents, self.mixers = (self.critic, self.mixer) if stacked else (OneAgent(self.critic), OneMixer(self.mixer))
        self.target_agents, self.target_mixers = (self.target_critic, self.target_mixer) if stacked else (
            OneAgent(self.target_critic), OneMixer(self.target_mixer))
        self.policy = MeanQPolicy(self.critic) if stacked else self.critic  # acting (RecurrentActing)
        self.behaviour: RNNAgent | None = None
        if use_behaviour:
            self.behaviour = algo.build(3, lambda: algo.new_agent(c.hidden))
            self.behaviour_opt = torch.optim.Adam(self.behaviour.parameters(), lr=c.behaviour_lr)
        self.behaviour_state = new_behaviour_state()
        self.cache_behaviour = True  # fused path: β's outputs from a BehaviourCache once β is trained
        self._sampler: Any = None  # the sampler of the latest round (whose episodes the cache covers)
        self._behaviour_cache: BehaviourCache | None = None
        # fused path: the online mixers' weights at the last `predict`'s states s_0..s_T-1, reused by the
        # online `member_q_tot` at the same states until the parameters change (see `_predicted_weights`)
        self._pred_w: tuple[torch.Tensor, tuple[int, ...], tuple[torch.Tensor, ...]] | None = None

    @property
    def cfg(self) -> Any:
        """The holding algorithm's config, as it is now."""
        return self._owner.cfg

    # -- checkpoint ------------------------------------------------------------------------------
    def modules(self) -> dict[str, nn.Module]:
        m = {"critic": self.critic, "mixer": self.mixer, "target_critic": self.target_critic,
             "target_mixer": self.target_mixer}
        if self.behaviour is not None:
            m["behaviour"] = self.behaviour
        return m

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        o = {"critic_opt": self.critic_opt}
        if self.behaviour is not None:
            o["behaviour_opt"] = self.behaviour_opt
        return o

    # -- behaviour model -------------------------------------------------------------------------
    def train_behaviour(self, sample) -> dict[str, float]:
        """Train β until its sampled-timestep budget is spent (or the optional update cap); a no-op once
        done. Called before every critic step, so β is fully trained before the first one ({} without β)."""
        if self.behaviour is None:
            return {}
        self._sampler = sample
        st, c = self.behaviour_state, self.cfg
        while not st["done"]:
            batch = sample(c.batch_episodes)
            st["loss"] = bc_step(self.behaviour, self.behaviour_opt, batch, c.grad_clip)
            st["updates"] += 1
            st["timesteps"] += int((batch.lengths + 1).sum())  # the reference's filled entries: L + 1
            capped = 0 < c.behaviour_max_updates <= st["updates"]
            st["done"] = st["timesteps"] >= c.behaviour_timesteps or capped
        return {"behaviour/updates": float(st["updates"]), "behaviour/timesteps": float(st["timesteps"]),
                "behaviour/loss": float(st["loss"])}

    @torch.no_grad()
    def behaviour_logprob(self, batch: EpisodeBatch) -> torch.Tensor | None:
        """log(β + 1e-5) [B·T, n, A] for the fused λ (kernels_discrete.cf_lambda); None when λ is uniform."""
        if self.behaviour is None or self.cfg.softmax_temp == 0:
            return None
        cache = self._behaviour_cache_for(batch)
        if cache is not None:
            return cache.gather(batch)
        T = batch.max_t
        beta = masked_softmax(self.behaviour.unroll(batch)[:, :T], batch.avail[:, :T])
        return beta.add_(1e-5).log_().flatten(0, 1)

    def _behaviour_cache_for(self, batch: EpisodeBatch) -> BehaviourCache | None:
        """The cache of β's outputs over the latest round's sampler (built on first use), when β is
        trained and the batch says which of that sampler's episodes it holds; else None (unroll β)."""
        sampler = self._sampler
        if (not self.cache_behaviour or not self.behaviour_state["done"] or batch.episode_ids is None
                or not all(hasattr(sampler, a) for a in ("episodes", "offsets", "lengths", "avail"))):
            return None
        if self._behaviour_cache is None or not self._behaviour_cache.valid_for(self.behaviour, sampler):
            self._behaviour_cache = BehaviourCache(self.behaviour, sampler)
        return self._behaviour_cache

    @torch.no_grad()
    def cf_weights(self, cf: torch.Tensor, batch: EpisodeBatch) -> torch.Tensor:
        """λ per member from the counterfactual Q_tot: cf [E, B, T, n, A] -> [E, B, T, n] (β computed once)."""
        E, B, T, n, _ = cf.shape
        temp = self.cfg.softmax_temp
        if self.behaviour is None or temp == 0:
            return cf.new_full((E, B, T, n), 1.0 / n)
        avail = batch.avail[:, :T]
        beta = masked_softmax(self.behaviour.unroll(batch)[:, :T], avail)
        mu = masked_softmax(cf, avail)
        eps = 1e-5  # as the reference's kl_div(log(β + 1e-5), μ + 1e-5)
        kl = ((mu + eps) * ((mu + eps).log() - (beta + eps).log()) * avail).sum(-1)  # [E, B, T, n]
        if temp >= 100:  # the reference's hard argmax
            return F.one_hot(kl.argmax(-1), n).float()
        return torch.softmax(temp * kl, -1)

    # -- values ----------------------------------------------------------------------------------
    def unroll(self, batch: EpisodeBatch, target: bool = False) -> torch.Tensor:
        """Every (target) member's Qs at every observation: [E, B, T+1, n, A]."""
        return (self.target_agents if target else self.agents).unroll(batch)

    @torch.no_grad()
    def greedy_actions(self, batch: EpisodeBatch, q_all: torch.Tensor | None) -> torch.Tensor:
        """The current policy's greedy available action at every observation [B, T+1, n]: argmax of
        the mean over the ONLINE members' individual Qs (computed here when q_all is None)."""
        if q_all is None:
            q_all = self.unroll(batch)
        return masked_argmax(q_all.detach().mean(0), batch.avail)

    def member_q_tot(self, agent_q: torch.Tensor, joint: torch.Tensor, state: torch.Tensor,
                     target: bool = False, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Q_tot of every (target) member at joint actions: agent_q [E, B, L, n, A], joint [B, L, K, n] (K
        joint actions per index), state [B, L, S] -> [E, B, L, K]. Carries gradient when enabled. Without
        gradient, the online mixers at a batch's states s_0..s_T (PLCQL's r_par, SPaCQL's u) reuse the
        weights `predict` computed at s_0..s_T-1 and evaluate the hypernetworks at s_T only. With the
        episodes' `lengths` (targets only, fused path), the target mixers run on the real indices 0..len
        only and the padded ones are 0 (every consumer masks them, as the packed unroll's)."""
        E = agent_q.shape[0]
        idx = joint.transpose(2, 3).unsqueeze(0).expand(E, -1, -1, -1, -1)  # [E, B, L, n, K]
        q = agent_q.gather(-1, idx).transpose(-1, -2)  # [E, B, L, K, n]
        if target:
            B, L, K = q.shape[1:4]
            if lengths is None or not self.target_mixers.fused or not fast.has_padding(lengths, L):
                return self.target_mixers.mix_many(q, state)
            real = fast.real_rows(lengths, L)
            out = self.target_mixers.mix_many(q.flatten(1, 2).index_select(1, real),
                                              state.reshape(B * L, -1).index_select(0, real))  # [E, M', K]
            return fast.scatter_rows(out, real, B * L).view(E, B, L, K)
        w = self._predicted_weights(state)
        if w is None:
            return self.mixers.mix_many(q, state)
        T = state.shape[1] - 1
        head = self.mixers.mix_many(q[:, :, :T], state[:, :T], w)  # [E, B, T, K]
        return torch.cat([head, self.mixers.mix_many(q[:, :, T:], state[:, T:])], 2)

    def _predicted_weights(self, state: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        """The online mixers' weights (detached) at state[:, :-1] when the last `predict` computed them for
        this very state tensor and the parameters have not changed since: `update` clears them after its
        optimiser step (the fused Adam does not bump version counters), and the version counters catch
        in-place changes of the parameters or the state (a checkpoint load); else None. Only without gradient."""
        if self._pred_w is None or torch.is_grad_enabled():
            return None
        ref, versions, w = self._pred_w
        if state is not ref or versions != self._versions(state):
            return None
        return w

    def _versions(self, state: torch.Tensor) -> tuple[int, ...]:
        return (state._version, *(p._version for p in self.mixer.parameters()))

    @torch.no_grad()
    def td_target(self, batch: EpisodeBatch, q_all: torch.Tensor | None = None) -> torch.Tensor:
        """CFCQL's target [B, T]: TD(λ) returns of Q'_tot(s_t, a*_t), a* = argmax over the available actions
        of the (mean over members of the) online Qs (double Q; q_all [E, B, T+1, n, A], computed here when
        not given) or of the target Qs, evaluated by each target member, min over the members."""
        c = self.cfg
        tq = self.unroll(batch, target=True)  # [E, B, T+1, n, A]
        if q_all is None and c.double_q:
            q_all = self.unroll(batch)
        choose_from = q_all.detach() if c.double_q else tq
        a_star = masked_argmax(choose_from.mean(0), batch.avail)  # [B, T+1, n]
        v = self.member_q_tot(tq, a_star.unsqueeze(2), batch.state, target=True,
                              lengths=batch.lengths)[..., 0].min(0).values  # [B, T+1]
        return td_lambda_targets(batch.rewards, batch.terminals, batch.mask, v, c.gamma, c.td_lambda)

    # -- the counterfactual CQL penalty ----------------------------------------------------------
    def counterfactual_blocked(self, q: torch.Tensor, actions: torch.Tensor, state: torch.Tensor,
                               w: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """The mixers' counterfactual Q_tot [E, B, T, n, A] over rows [B·T] in blocks of ~block_mb, each
        under activation checkpointing (its [E, rows, n, A, embed] intermediate is recomputed in the backward
        pass). The fused kernel (kernels_discrete.counterfactual_mix) blocks inside and takes all rows at
        once, with the mixer weights `w` of these states when given."""
        E, B, T, n, A = q.shape
        M = B * T
        qf, af, sf = q.reshape(E, M, n, A), actions.reshape(M, n), state.reshape(M, -1)
        if self.mixers.fused:
            return self.mixers.counterfactual(qf, af, sf, w).view(E, B, T, n, A)
        per_row = E * n * A * self.cfg.mixing_embed * 4 * 3  # pre_cf, elu, product (bytes)
        rows = M if self.block_mb <= 0 else max(1, int(self.block_mb * 2 ** 20 // per_row))
        if rows >= M and self.block_mb <= 0:
            return self.mixers.counterfactual(qf, af, sf).view(E, B, T, n, A)
        outs = []
        for r0 in range(0, M, rows):
            sl = slice(r0, r0 + rows)
            if torch.is_grad_enabled():
                outs.append(checkpoint(self.mixers.counterfactual, qf[:, sl], af[sl], sf[sl], use_reentrant=False))
            else:
                outs.append(self.mixers.counterfactual(qf[:, sl], af[sl], sf[sl]))
        return torch.cat(outs, 1).view(E, B, T, n, A)

    def cql_penalty(self, batch: EpisodeBatch, q: torch.Tensor, q_tot: torch.Tensor,
                    w: tuple[torch.Tensor, ...] | None = None, pre: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """CFCQL's counterfactual CQL term per member [E, B, T] (q [E, B, T, n, A], q_tot [E, B, T]) and
        diagnostics (`w`: the online mixers' weights at s_0..s_T-1, `pre`: their first layer at the data
        (`Prediction.pre`), when the caller has them)."""
        if self.mixers.fused:  # mixer, λ and logsumexp in one cache-blocked pass (kernels_discrete.cf_negative)
            E, B, T, n, A = q.shape
            parts = self.mixers.counterfactual_parts(q, batch.actions, batch.state[:, :T], w, pre)
            # on the real steps only (the padding is masked out of the penalty): rows e·M + m -> e·M' + m'
            real = fast.real_rows(batch.lengths, T, last=-1)  # [M']: the transitions 0..len − 1
            avail, logbeta = batch.avail[:, :T].reshape(B * T, n, A), self.behaviour_logprob(batch)
            if len(real) == B * T:  # no padding: nothing to select
                neg, lam = fast.cf_negative(*parts, avail, logbeta, self.cfg.softmax_temp, E)
                return cql_from_negative(neg.view(E, B, T), lam.view(E, B, T, n), batch, q_tot)
            parts = [x.view(E, B * T, *x.shape[1:]).index_select(1, real).flatten(0, 1) for x in parts]
            neg_r, lam_r = fast.cf_negative(*parts, avail.index_select(0, real),
                                            None if logbeta is None else logbeta.index_select(0, real),
                                            self.cfg.softmax_temp, E)
            neg = fast.scatter_rows(neg_r.view(E, -1), real, B * T)
            lam = fast.scatter_rows(lam_r.view(E, -1, n), real, B * T)
            return cql_from_negative(neg.view(E, B, T), lam.view(E, B, T, n), batch, q_tot)
        cf = self.counterfactual_blocked(q, batch.actions, batch.state[:, :batch.max_t], w)  # [E, B, T, n, A]
        return counterfactual_cql(cf, self.cf_weights(cf.detach(), batch), batch, q_tot)

    # -- the critic update -----------------------------------------------------------------------
    def predict(self, batch: EpisodeBatch, q_all: torch.Tensor) -> Prediction:
        """The online values the update regresses, from the online Qs q_all [E, B, T+1, n, A] (see
        `Prediction`). An algorithm calls it before building its target, so that a target which carries
        gradient (SPaCQL's detach_weights=False) adds its gradients up in the graph's order."""
        E, T = self.n_members, batch.max_t
        q = q_all[:, :, :T]
        act = batch.actions.unsqueeze(0).unsqueeze(-1).expand(E, -1, -1, -1, -1)
        q_taken = q.gather(-1, act)[..., 0]  # [E, B, T, n]
        if not self.mixers.fused:
            return Prediction(q, self.mixers.mix_many(q_taken.unsqueeze(-2), batch.state[:, :T])[..., 0], None)
        # the fused path computes the online mixers' hypernetworks and their first layer at the data once
        # for the TD term and CF-CQL
        mix_w = self.mixers.weights(batch.state[:, :T].reshape(-1, batch.state.shape[-1]))
        self._pred_w = (batch.state, self._versions(batch.state), tuple(x.detach() for x in mix_w))
        q_tot, pre = self.mixers.mix_data(q_taken.reshape(E, -1, q_taken.shape[-1]), mix_w)
        return Prediction(q, q_tot.view(E, *q_taken.shape[1:3]), mix_w, pre)

    def update(self, batch: EpisodeBatch, pred: Prediction, y: torch.Tensor,
               penalty: Callable[..., tuple[torch.Tensor, dict]] | None = None,
               extra_stats: dict[str, Any] | None = None) -> dict[str, float]:
        """One gradient step of every member on TD to y [B, T] + cql_alpha · penalty (default: CFCQL's
        `cql_penalty`; same signature) from `predict`'s values. Returns the metrics (`extra_stats`, the
        algorithm's, are logged with them)."""
        c, E, m, q_tot = self.cfg, self.n_members, batch.mask, pred.q_tot
        td_e = (0.5 * (q_tot - y).pow(2) * m).sum((1, 2)) / m.sum().clamp_min(1.0)  # [E]
        loss = td_e.sum()
        stats = {"critic/td_loss": td_e.detach().mean(), "critic/q_taken": masked_mean(q_tot.detach(), m),
                 "critic/target": masked_mean(y.detach(), m)}
        if self.stacked:
            stats["critic/q_std"] = masked_mean(q_tot.detach().std(0) if E > 1 else torch.zeros_like(y), m)
        if c.cql_alpha > 0:
            if penalty is None:
                pen_bt, cst = self.cql_penalty(batch, pred.q, q_tot, pred.mix_w, pred.pre)
            else:
                pen_bt, cst = penalty(batch, pred.q, q_tot, pred.mix_w)
            pen_e = (pen_bt * m).sum((1, 2)) / m.sum().clamp_min(1.0)
            loss = loss + c.cql_alpha * pen_e.sum()
            stats.update(cst)
            stats["cql/penalty"] = pen_e.detach().mean()
        stats.update(extra_stats or {})
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        params = [*self.critic.parameters(), *self.mixer.parameters()]
        if c.grad_clip <= 0:
            gn = torch.zeros(())
        elif self.stacked:  # each member on its own, as CFCQL's pair
            gn = clip_grad_norm_stacked_(params, c.grad_clip, E).mean()
        else:
            gn = nn.utils.clip_grad_norm_(params, c.grad_clip)
        self.critic_opt.step()
        self._pred_w = None  # the parameters change (the fused Adam leaves their version counters alone)
        stats["critic/loss"] = loss.detach() / E
        stats["critic/grad_norm"] = gn
        return {k: float(v) for k, v in stats.items()}

    def update_targets(self) -> None:
        hard_update_(self.target_critic, self.critic)
        hard_update_(self.target_mixer, self.mixer)


def next_action_data(batch: EpisodeBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per observation index t' in 0..T: the dataset action a_t' [B, T+1, n] (0 at T), whether it is known
    [B, T+1] (t' < len; the final next observation has none: PAR replaces every agent there), and whether
    Q(s_t', ·) bootstraps a real step [B, T+1] (1 <= t' <= len). (SPaCQL and PLCQL's PAR bookkeeping.)"""
    B, T, n = batch.actions.shape
    data = torch.cat([batch.actions, batch.actions.new_zeros(B, 1, n)], 1)
    zero = batch.mask.new_zeros(B, 1)
    valid = torch.cat([batch.mask, zero], 1)
    boot = torch.cat([zero, batch.mask], 1)
    return data, valid, boot

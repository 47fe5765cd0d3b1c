"""Shared machinery of the discrete-action (SMAX/SMAC) algorithms, written once.

Everything is vectorised over agents (agents are folded into the batch axis); the only Python
loops are over time, in `td_lambda_targets`' backward recursion (the GRU runs over the whole
sequence in one `nn.GRU` call). See docs/algorithms/discrete-machinery.md.

Shapes: B episodes, T steps (T+1 observations, the last being the final next observation),
n agents, A actions, S state size. `EpisodeBatch` is in suite/core/batch.py.

Public API
  masks:    (masked.py) masked_argmax, masked_logsumexp, masked_log_softmax, masked_softmax, masked_sample,
            masked_uniform_sample, masked_mean, NEG
  networks: RNNAgent (shared-parameter GRU agent), QMixer (QMIX hypernetwork mixer),
            last_action_onehot, seeded (target updates: nets.polyak_ / nets.hard_update_)
  targets:  td_lambda_targets
  losses:   bc_cross_entropy, bc_step
  acting:   RecurrentActing (begin_episodes()/act() for a greedy GRU policy)
  base:     DiscreteAlgorithm (Checkpointable + RecurrentActing, batch_kind "episodes")
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from dataclasses import fields
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from plcql_bench.algorithms.base import Algorithm, EpisodeBatch
from plcql_bench.algorithms.common import kernels
from plcql_bench.algorithms.common import kernels_discrete as fast
from plcql_bench.algorithms.common.checkpoint import Checkpointable
from plcql_bench.suite.core.spec import TaskSpec
from plcql_bench.algorithms.common.configs import tier_table
from plcql_bench.algorithms.common.masked import (  # noqa: F401 (the public API: masks)
    NEG,
    masked_argmax,
    masked_log_softmax,
    masked_logsumexp,
    masked_mean,
    masked_sample,
    masked_softmax,
    masked_uniform_sample,
)

# --------------------------------------------------------------------------------------------
# Networks


@contextlib.contextmanager
def seeded(seed: int):
    """Build networks from torch's default initialisers with a private seed: the global RNG is
    forked and restored, so construction is reproducible and leaves the caller's stream alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        yield


def last_action_onehot(actions: torch.Tensor, n_actions: int) -> torch.Tensor:
    """actions int64 [B, T, n] -> float [B, T+1, n, A]: index t holds one-hot(a_{t-1}), index 0
    zeros (PyMARL's `actions_onehot` shifted by one, as `_build_inputs` uses it)."""
    oh = F.one_hot(actions, n_actions).float()
    return torch.cat([torch.zeros_like(oh[:, :1]), oh], dim=1)


def time_major_inputs(obs: torch.Tensor, last_onehot: torch.Tensor) -> torch.Tensor:
    """The agents' inputs obs ⊕ one-hot(last action) ⊕ one-hot(agent id) (PyMARL's `_build_inputs`), written
    time-major [L, B, n, in] by the concatenation itself (from obs [B, L, n, o], last_onehot [B, L, n, A]).
    For the fused GRU's time-major rows: transposing after the concatenation costs a second copy of the
    widest tensor of the unroll, and a Linear on the transposed view of weights that need no gradient (a
    target network) multiplies it as a batch of small matrices (~2x slower on CPU)."""
    n = obs.shape[2]
    eye = torch.eye(n, device=obs.device, dtype=obs.dtype).expand(obs.shape[1], obs.shape[0], n, n)
    return torch.cat([obs.transpose(0, 1), last_onehot.transpose(0, 1), eye], -1)


class RNNAgent(nn.Module):
    """Shared-parameter GRU agent of PyMARL/CFCQL (`n_rnn`: fc -> ReLU -> GRU(hidden) -> fc).

    Input per agent: obs ⊕ one-hot(last action) ⊕ one-hot(agent id) (PyMARL `_build_inputs` order,
    `obs_last_action` and `obs_agent_id` on). Agents share the parameters and are folded into the
    batch axis. The recurrence is `nn.GRU`, whose equations and parameters are those of the
    references' `nn.GRUCell`, run over the whole sequence in one call. Output: Q-values or logits
    per action.
    """

    def __init__(self, n_agents: int, obs_dim: int, n_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.n_agents, self.n_actions, self.hidden = n_agents, n_actions, hidden
        self.fc1 = nn.Linear(obs_dim + n_actions + n_agents, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.fc2 = nn.Linear(hidden, n_actions)
        self.fused = kernels.fused_default()  # the recurrence through kernels_discrete.fused_gru

    def init_hidden(self, batch: int) -> torch.Tensor:
        return self.fc1.weight.new_zeros(batch, self.n_agents, self.hidden)

    def _inputs(self, obs: torch.Tensor, last_onehot: torch.Tensor) -> torch.Tensor:
        """[B, L, n, in] (a view of the time-major inputs)."""
        return time_major_inputs(obs, last_onehot).transpose(0, 1)

    def forward(self, obs: torch.Tensor, last_onehot: torch.Tensor,
                h0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [B, L, n, o], last_onehot [B, L, n, A], h0 [B, n, H] (zeros if None)
        -> (outputs [B, L, n, A], last hidden state [B, n, H])."""
        B, L, n, _ = obs.shape
        if self.fused:  # time-major rows through kernels_discrete.fused_gru (one member)
            H, rnn = self.hidden, self.rnn
            x = F.relu_(self.fc1(time_major_inputs(obs, last_onehot))).reshape(1, L * B * n, H)
            h = None if h0 is None else h0.reshape(1, B * n, H)
            y = fast.fused_gru(x, rnn.weight_ih_l0.t()[None], rnn.bias_ih_l0[None, None], rnn.weight_hh_l0.t()[None],
                               rnn.bias_hh_l0[None, None], h, L)  # [1, L, B·n, H]
            out = self.fc2(y.view(L, B, n, H)).transpose(0, 1)
            return out, y[0, -1].reshape(B, n, H)
        x = F.relu(self.fc1(self._inputs(obs, last_onehot)))  # [B, L, n, H]
        x = x.permute(0, 2, 1, 3).reshape(B * n, L, self.hidden)
        h = self.init_hidden(B) if h0 is None else h0
        y, hT = self.rnn(x, h.reshape(1, B * n, self.hidden))
        out = self.fc2(y).reshape(B, n, L, self.n_actions).permute(0, 2, 1, 3)
        return out, hT.reshape(B, n, self.hidden)

    def unroll(self, batch: EpisodeBatch) -> torch.Tensor:
        """Outputs at every observation of the episodes, from a zero hidden state: [B, T+1, n, A]. The
        fused path computes the real observations only (kernels_discrete.packed_agent_unroll) and
        returns zeros at the padded indices, which every consumer masks; a batch without padding (every
        episode as long as the longest) takes the unpacked fused path, which is then the same work."""
        last = last_action_onehot(batch.actions, self.n_actions)
        if self.fused and fast.has_padding(batch.lengths, batch.obs.shape[1]):
            rnn = self.rnn
            return fast.packed_agent_unroll(
                batch.obs, last, batch.lengths, self.fc1.weight.t()[None], self.fc1.bias[None, None],
                rnn.weight_ih_l0.t()[None], rnn.bias_ih_l0[None, None], rnn.weight_hh_l0.t()[None],
                rnn.bias_hh_l0[None, None], self.fc2.weight.t()[None], self.fc2.bias[None, None])[0]
        return self(batch.obs, last)[0]

    def step(self, obs: torch.Tensor, last_onehot: torch.Tensor,
             h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: obs [B, n, o], last_onehot [B, n, A], h [B, n, H] -> ([B, n, A], h')."""
        out, h2 = self(obs[:, None], last_onehot[:, None], h)
        return out[:, 0], h2


class QMixer(nn.Module):
    """QMIX mixer (PyMARL2/CFCQL `nmix.Mixer`, abs weights): Q_tot = elu(q·|W1(s)| + b1(s))·|W2(s)| + b2(s).

    W1: Linear(S, hypernet) -> ReLU -> Linear(hypernet, n·embed); b1: Linear(S, embed);
    W2: Linear(S, hypernet) -> ReLU -> Linear(hypernet, embed); b2: Linear(S, embed) -> ReLU ->
    Linear(embed, 1). Absolute-value weights make Q_tot monotone in every agent's Q.
    """

    def __init__(self, n_agents: int, state_dim: int, embed: int = 32, hypernet: int = 64) -> None:
        super().__init__()
        self.n_agents, self.embed = n_agents, embed
        self.hyper_w1 = nn.Sequential(nn.Linear(state_dim, hypernet), nn.ReLU(),
                                      nn.Linear(hypernet, n_agents * embed))
        self.hyper_b1 = nn.Linear(state_dim, embed)
        self.hyper_w2 = nn.Sequential(nn.Linear(state_dim, hypernet), nn.ReLU(), nn.Linear(hypernet, embed))
        self.hyper_b2 = nn.Sequential(nn.Linear(state_dim, embed), nn.ReLU(), nn.Linear(embed, 1))
        self.fused = kernels.fused_default()  # counterfactuals through kernels_discrete

    def weights(self, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """state [M, S] -> |W1| [M, n, E], b1 [M, 1, E], |W2| [M, E, 1], b2 [M, 1, 1]."""
        M = state.shape[0]
        w1 = self.hyper_w1(state).abs().view(M, self.n_agents, self.embed)
        b1 = self.hyper_b1(state).view(M, 1, self.embed)
        w2 = self.hyper_w2(state).abs().view(M, self.embed, 1)
        b2 = self.hyper_b2(state).view(M, 1, 1)
        return w1, b1, w2, b2

    def mix_many(self, qs: torch.Tensor, state: torch.Tensor, w: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """K joint Q-vectors per state, one hypernetwork pass per state:
        qs [*L, K, n], state [*L, S] -> Q_tot [*L, K]; `w` = weights(state) when the caller has them."""
        lead = state.shape[:-1]
        K = qs.shape[-2]
        w1, b1, w2, b2 = self.weights(state.reshape(-1, state.shape[-1])) if w is None else w
        h = F.elu(torch.bmm(qs.reshape(-1, K, self.n_agents), w1) + b1)  # [M, K, E]
        return (torch.bmm(h, w2) + b2).reshape(*lead, K)

    def forward(self, qs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """qs [*L, n], state [*L, S] -> Q_tot [*L]."""
        return self.mix_many(qs.unsqueeze(-2), state)[..., 0]

    def counterfactual(self, q_all: torch.Tensor, actions: torch.Tensor, state: torch.Tensor,
                       w: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """Q_tot(s, a_i = j, a_-i) for every agent i and action j, the other agents at `actions`:
        q_all [*L, n, A], actions [*L, n], state [*L, S] -> [*L, n, A] (row i, column actions[i]
        is Q_tot at the data joint action). The first layer is linear in q, so changing agent i's
        Q by d moves the pre-activation by d·W1[i]: one hypernetwork pass, no loop over agents
        (`w` = weights(state) when the caller has them)."""
        lead, (n, A) = state.shape[:-1], q_all.shape[-2:]
        if self.fused:  # the [M, n, A, E] intermediate in cache-sized blocks (kernels_discrete)
            pre, delta, w1, w2, b2 = self.counterfactual_parts(q_all, actions, state, w)
            out = fast.counterfactual_mix(pre, delta, w1, w2) + b2.unsqueeze(-1)
            return out.reshape(*lead, n, A)
        w1, b1, w2, b2 = self.weights(state.reshape(-1, state.shape[-1])) if w is None else w
        q_all = q_all.reshape(-1, n, A)
        q_taken = q_all.gather(-1, actions.reshape(-1, n, 1))  # [M, n, 1]
        pre = torch.bmm(q_taken.transpose(1, 2), w1) + b1  # [M, 1, E]
        delta = q_all - q_taken  # [M, n, A]
        pre_cf = pre[:, :, None, :] + delta[..., None] * w1[:, :, None, :]  # [M, n, A, E]
        out = (F.elu(pre_cf) * w2[:, None, :, 0][:, :, None, :]).sum(-1) + b2[:, :, :1]  # [M, n, A]
        return out.reshape(*lead, n, A)

    def counterfactual_parts(self, q_all: torch.Tensor, actions: torch.Tensor, state: torch.Tensor,
                             w: tuple[torch.Tensor, ...] | None = None,
                             pre: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """The inputs of the fused counterfactual kernels (kernels_discrete) per state m: QMIX's first layer
        at the data pre [M, E] (`pre` when the caller has it: `mix_data`), the deltas q_all − q_taken [M, n, A],
        |W1| [M, n, E], |W2| [M, E], b2 [M, 1]."""
        n, A = q_all.shape[-2:]
        w1, b1, w2, b2 = self.weights(state.reshape(-1, state.shape[-1])) if w is None else w
        q_all = q_all.reshape(-1, n, A)
        q_taken = q_all.gather(-1, actions.reshape(-1, n, 1))  # [M, n, 1]
        if pre is None:
            pre = fast.first_layer(q_taken[..., 0], w1, b1[:, 0])  # [M, E]
        return pre, q_all - q_taken, w1, w2[..., 0], b2[:, 0]

    def mix_data(self, q_taken: torch.Tensor, w: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The fused update's Q_tot at one joint action per state (`mix_many` with K = 1), q_taken [M, n],
        w = weights(state) -> (Q_tot [M], QMIX's first layer there [M, E], which `counterfactual_parts` reuses)."""
        w1, b1, w2, b2 = w
        pre = fast.first_layer(q_taken, w1, b1[:, 0])
        return torch.baddbmm(b2, F.elu(pre).unsqueeze(1), w2).view(-1), pre


# --------------------------------------------------------------------------------------------
# Targets and losses


def td_lambda_targets(rewards: torch.Tensor, terminals: torch.Tensor, mask: torch.Tensor,
                      target_qs: torch.Tensor, gamma: float, td_lambda: float) -> torch.Tensor:
    """TD(λ) returns, the backward recursion of PyMARL's `build_td_lambda_targets`:

        G_t = r_t + γ (1 - d_t) [ (1 - λ) Q_{t+1} + λ G_{t+1} ]      for real steps (mask_t = 1)
        G_t = Q_t                                                      for the first padded index

    rewards/terminals/mask [B, T], target_qs [B, T+1] (the target Q_tot at every observation) ->
    [B, T]. An episode of length L bootstraps from Q_L (its final next observation) unless it
    ended in a true terminal; this equals PyMARL's recursion whenever episodes end in a terminal
    or fill the batch (T = L), and also bootstraps correctly from timeouts shorter than T, where
    PyMARL's would decay a padded value. λ = 0 gives one-step targets, λ = 1 Monte Carlo returns
    with the final bootstrap. Values on padded steps are meaningless (mask them)."""
    T = rewards.shape[1]
    ret = target_qs[:, T]
    out = []
    for t in range(T - 1, -1, -1):
        g = rewards[:, t] + gamma * (1.0 - terminals[:, t]) * ((1.0 - td_lambda) * target_qs[:, t + 1]
                                                               + td_lambda * ret)
        ret = mask[:, t] * g + (1.0 - mask[:, t]) * target_qs[:, t]
        out.append(ret)
    return torch.stack(out[::-1], dim=1)


def bc_cross_entropy(logits: torch.Tensor, batch: EpisodeBatch) -> torch.Tensor:
    """Per-agent masked cross-entropy of the dataset actions under softmax(logits) restricted to
    the available actions (CFCQL `bc_learner`: `mask_before_softmax`), averaged over real
    (step, agent) pairs. logits [B, T(+1), n, A]."""
    T = batch.max_t
    logp = masked_log_softmax(logits[:, :T], batch.avail[:, :T])
    taken = logp.gather(-1, batch.actions.unsqueeze(-1))[..., 0]  # [B, T, n]
    return -masked_mean(taken, batch.mask.unsqueeze(-1))


def bc_step(agent: RNNAgent, opt: torch.optim.Optimizer, batch: EpisodeBatch, grad_clip: float) -> float:
    """One masked cross-entropy step of `agent` on `batch`; returns the loss (BC, and the CFCQL
    family's behaviour model)."""
    loss = bc_cross_entropy(agent.unroll(batch), batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        nn.utils.clip_grad_norm_(agent.parameters(), grad_clip)
    opt.step()
    return float(loss.detach())


# --------------------------------------------------------------------------------------------
# Acting and the algorithm base


class RecurrentActing(Algorithm):
    """`begin_episodes()` / `act()` for a greedy GRU policy held in `self.policy_agent()`.

    The evaluation protocol calls `begin_episodes(num_envs)` before each batch of episodes; `act()`
    then carries every env's hidden state and last action from step to step. Envs that already
    finished keep being stepped by the protocol (frozen, actions ignored, results masked), so their
    state simply runs on without effect. `act()` without `begin_episodes()`, or with another
    number of envs, starts fresh episodes."""

    device: torch.device
    spec: TaskSpec
    _h: torch.Tensor | None = None
    _last: torch.Tensor | None = None

    def policy_agent(self) -> RNNAgent:
        raise NotImplementedError

    def begin_episodes(self, num_envs: int) -> None:
        agent = self.policy_agent()
        self._h = agent.init_hidden(num_envs)
        self._last = self._h.new_zeros(num_envs, self.spec.n_agents, self.spec.act_dim)

    @torch.no_grad()
    def act(self, obs: np.ndarray, avail: np.ndarray | None = None) -> np.ndarray:
        obs_t = torch.tensor(np.asarray(obs, dtype=np.float32), device=self.device)
        B = obs_t.shape[0]
        if self._h is None or self._h.shape[0] != B:
            self.begin_episodes(B)
        out, self._h = self.policy_agent().step(obs_t, self._last, self._h)
        if avail is None:
            av = torch.ones_like(out)
        else:
            av = torch.tensor(np.asarray(avail, dtype=np.float32), device=self.device)
        a = masked_argmax(out, av)
        self._last = F.one_hot(a, self.spec.act_dim).float()
        return a.cpu().numpy().astype(np.int64)


# Timeouts (SMAX and SC2 alike). The datasets keep `terminals` (battle over) and `timeouts` (SMAC's
# episode limit reached) apart. The references count a timeout as terminal: CFCQL's envs/sc2.yaml
# sets `continuing_episode: False`, so SMAC never reports `episode_limit` in its info and PyMARL's
# runner stores `terminated = True` at the limit (docs/smax.md, "Timeouts"). The TD learners do the
# same by default (`bootstrap_timeouts` = False in every TD learner's Config; True bootstraps through
# them instead); `DiscreteAlgorithm.scaled` applies it.


class DiscreteAlgorithm(Checkpointable, RecurrentActing):
    """Base of the discrete-action algorithms: episode batches, checkpointing of `modules()`,
    `optimisers()` and `self.gen`, greedy recurrent acting through `policy_agent()`."""

    discrete = True
    batch_kind = "episodes"
    table: str | None = None  # algorithms/configs/<table>.yaml; None: "<name>_discrete" (of variant_of)

    @classmethod
    def task_overrides(cls, spec: TaskSpec, tier: str) -> dict[str, Any]:
        """Per-map/dataset values: configs/discrete_common.yaml (the fields this Config declares: on SMAX,
        `reward_scale` for the algorithms that learn from rewards), then the algorithm's own table."""

        declared = {f.name for f in fields(cls.Config)}
        shared = {k: v for k, v in tier_table("discrete_common", spec, tier).items() if k in declared}
        return {**shared, **tier_table(cls.table or f"{cls.variant_of or cls.name}_discrete", spec, tier)}

    def scaled(self, batch: EpisodeBatch) -> EpisodeBatch:
        """The batch as the TD learners see it: rewards multiplied by the config's `reward_scale`
        (10 on SMAX: configs/discrete_common.yaml) and, unless the config sets `bootstrap_timeouts`, time-limit cuts
        counted as terminals (the references' convention, see above). Only algorithms whose Config
        declares both fields call it."""
        scale = float(self.cfg.reward_scale)
        if scale != 1.0:
            batch = dataclasses.replace(batch, rewards=batch.rewards * scale)
        if not self.cfg.bootstrap_timeouts and batch.timeouts is not None:
            batch = dataclasses.replace(batch, terminals=torch.maximum(batch.terminals, batch.timeouts))
        return batch

    def __init__(self, spec: TaskSpec, config: Any, seed: int, device: str = "cpu") -> None:
        if not spec.discrete:
            raise ValueError(f"{self.name} (discrete) needs a discrete-action task, got {spec.task_id}")
        self.spec, self.cfg, self.device, self.seed = spec, config, torch.device(device), int(seed)
        self.n, self.A = spec.n_agents, spec.act_dim
        self.gen = torch.Generator(device=self.device).manual_seed(int(seed))
        self.rounds = 0

    def build(self, offset: int, fn: Callable[[], nn.Module]) -> nn.Module:
        """fn() under `seeded(seed * 1000 + offset)`, moved to the device."""
        with seeded(self.seed * 1000 + offset):
            return fn().to(self.device)

    @staticmethod
    def target_of(net: nn.Module) -> nn.Module:
        t = copy.deepcopy(net)
        t.requires_grad_(False)
        for m in t.modules():  # a deep copy loses cuDNN's single GRU weight buffer (a copy per call on CUDA)
            if isinstance(m, nn.RNNBase):
                m.flatten_parameters()
        return t

    def new_agent(self, hidden: int) -> RNNAgent:
        return RNNAgent(self.n, self.spec.obs_dim, self.A, hidden)

    def new_mixer(self, embed: int, hypernet: int) -> QMixer:
        return QMixer(self.n, self.spec.state_dim, embed, hypernet)

"""Per-agent MLP critics and small helpers of the discrete baselines (MAICQ, OMAR, IQL, AWAC).

CFCQL's discrete baselines (`thu-rllab/CFCQL` `discrete/src/modules/critics/{offpg,doubleqv,
discrete_critic}.py`) all score agent i from the input  s_t ⊕ o_t^i ⊕ one-hot(i)  with a 2-hidden-
layer ReLU MLP (hidden 256) over agent i's own actions; agents share the parameters. Here agents are
folded into the batch axis, and the first layer is split by input block: W·(s ⊕ o ⊕ id) + b =
W_s·s + W_o·o + (W_id[:, i] + b), so the state part is computed once per step, not once per agent
(same parameters, same function as one `nn.Linear` on the concatenation).

Packed rows (the fused path, on unless PLCQL_KERNELS=plain): an episode batch is padded to its longest
episode, and every consumer of a critic's output masks the padded indices. Given `rows` (the flat
indices of the real ones, `step_rows` / `obs_rows`), the critics compute those rows only and return
zeros on the padding (on smax-2s3z medium ~63 % of the padded rows are real); on that path the
first layer's sums and the ReLUs are also taken in place where autograd allows it cheaply. Same
function on the real rows; `tests/test_discrete_fast.py` checks values and gradients against the
padded plain path.

Public API
  networks: SplitInputLinear, AgentMLP (Q over actions, optional dueling a + v head, or a scalar V),
            TwinAgentQ (two trunks; `shared_head` reproduces the references' twins that share their
            output layer); forward/both(state, obs, rows=None)
  helpers:  step_rows, obs_rows (the real rows for `rows=`), obs_mask, expectile_loss,
            policy_expectation, clipped_exp_weights, batch_softmax_weights, per_agent_td_lambda
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from plcql_bench.algorithms.base import EpisodeBatch
from plcql_bench.algorithms.common import kernels
from plcql_bench.algorithms.common import kernels_discrete as fast
from plcql_bench.algorithms.common.discrete import masked_softmax, td_lambda_targets


def step_rows(batch: EpisodeBatch) -> torch.Tensor:
    """Flat indices b·T + t of the real transitions (t < len_b) of a [B, T] layout."""
    return fast.real_rows(batch.lengths, batch.max_t, last=-1)


def obs_rows(batch: EpisodeBatch) -> torch.Tensor:
    """Flat indices b·(T+1) + t of the real observations (t ≤ len_b) of a [B, T+1] layout."""
    return fast.real_rows(batch.lengths, batch.max_t + 1)


def pack_inputs(state: torch.Tensor, obs: torch.Tensor,
                rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(state [R, S], obs [R, n, o]) at `rows` of state [B, L, S], obs [B, L, n, o]; None when there is
    nothing to skip (no rows given, or every row is real)."""
    BL = state.shape[0] * state.shape[1]
    if rows is None or rows.numel() == BL:
        return None
    return (state.reshape(BL, -1).index_select(0, rows),
            obs.reshape(BL, *obs.shape[2:]).index_select(0, rows))


def unpack_output(y: torch.Tensor, rows: torch.Tensor, lead: torch.Size) -> torch.Tensor:
    """y [R, n, out] back to [B, L, n, out] (lead = (B, L)), zeros on the padding."""
    return fast.scatter_rows(y.unsqueeze(0), rows, lead[0] * lead[1])[0].view(*lead, *y.shape[1:])


class SplitInputLinear(nn.Module):
    """nn.Linear(S + o + n, H) on s ⊕ o_i ⊕ one-hot(i), computed block by block:
    state [*L, S], obs [*L, n, o] -> [*L, n, H]."""

    def __init__(self, state_dim: int, obs_dim: int, n_agents: int, hidden: int) -> None:
        super().__init__()
        self.S, self.o, self.n = state_dim, obs_dim, n_agents
        self.lin = nn.Linear(state_dim + obs_dim + n_agents, hidden)

    def forward(self, state: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        W, b = self.lin.weight, self.lin.bias
        S, o = self.S, self.o
        xs = F.linear(state, W[:, :S])  # [*L, H]
        xo = F.linear(obs, W[:, S:S + o])  # [*L, n, H]
        ids = W[:, S + o:].t() + b  # [n, H]
        return xo + xs.unsqueeze(-2) + ids

    def forward_relu_(self, state: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """relu(forward(state, obs)) with one out-of-place sum and the rest in place (the fused path: two
        [*L, n, H] temporaries fewer). The sum is out of place on purpose: W_o·o of a 3-d input is a
        view, and autograd answers an in-place op on a view by copying the whole gradient in backward."""
        W, b = self.lin.weight, self.lin.bias
        S, o = self.S, self.o
        x = F.linear(obs, W[:, S:S + o]) + F.linear(state, W[:, :S], b).unsqueeze(-2)  # [*L, n, H]
        return x.add_(W[:, S + o:].t()).relu_()


class AgentMLP(nn.Module):
    """fc1 (split input) -> ReLU -> fc2 -> ReLU -> head. out = n_actions: Q over the agent's actions
    (with `dueling`, head a(x) + v(x) as OffPGCritic / DoubleMLPNetwork); out = 1: a scalar V
    (ValueNetwork). forward(state [*L, S], obs [*L, n, o]) -> [*L, n, out]."""

    def __init__(self, state_dim: int, obs_dim: int, n_agents: int, out: int, hidden: int = 256,
                 dueling: bool = False) -> None:
        super().__init__()
        self.fc1 = SplitInputLinear(state_dim, obs_dim, n_agents, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, out)
        self.head_v = nn.Linear(hidden, 1) if dueling else None
        self.fused = kernels.fused_default()  # `rows=` packs the real rows; in-place sums and ReLUs

    def trunk(self, state: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        if self.fused:  # fc2 on the rows as a matrix: addmm's output, not a view (forward_relu_)
            h = self.fc1.forward_relu_(state, obs)
            h = self.fc2(h.view(-1, h.shape[-1])).relu_()
            return h.view(*obs.shape[:-1], h.shape[-1])
        return F.relu(self.fc2(F.relu(self.fc1(state, obs))))

    def out(self, h: torch.Tensor, head: nn.Linear, head_v: nn.Linear | None) -> torch.Tensor:
        y = head(h)
        return y + head_v(h) if head_v is not None else y

    def forward(self, state: torch.Tensor, obs: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[*L, n, out]. With `rows` (flat indices into the leading [B, L] axes, `step_rows`/`obs_rows`)
        the fused path computes those rows only and returns zeros on the others."""
        packed = pack_inputs(state, obs, rows) if self.fused else None
        if packed is None:
            return self.out(self.trunk(state, obs), self.head, self.head_v)
        return unpack_output(self.out(self.trunk(*packed), self.head, self.head_v), rows, state.shape[:2])


class TwinAgentQ(nn.Module):
    """Twin per-agent Q (CFCQL `DoubleQNetwork` / `DoubleMLPNetwork`, hidden 256). `both()` -> (Q1, Q2),
    each [*L, n, A]; `forward()` = min(Q1, Q2). With `shared_head` the second twin uses the first
    twin's output layer(s), as the references' code does (`fc3` for both heads; a bug, off by default)."""

    def __init__(self, state_dim: int, obs_dim: int, n_agents: int, n_actions: int, hidden: int = 256,
                 dueling: bool = False, shared_head: bool = False) -> None:
        super().__init__()
        self.shared_head = shared_head
        self.q1 = AgentMLP(state_dim, obs_dim, n_agents, n_actions, hidden, dueling)
        self.q2 = AgentMLP(state_dim, obs_dim, n_agents, n_actions, hidden, dueling)
        if shared_head:  # the second twin's own head is never used: drop it (no dead parameters)
            self.q2.head, self.q2.head_v = None, None
        self.fused = kernels.fused_default()  # `rows=`: both twins on the real rows, gathered once

    def _both(self, state: torch.Tensor, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q1 = self.q1(state, obs)
        src = self.q1 if self.shared_head else self.q2
        q2 = self.q2.out(self.q2.trunk(state, obs), src.head, src.head_v)
        return q1, q2

    def both(self, state: torch.Tensor, obs: torch.Tensor,
             rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q1, Q2), each [*L, n, A]; `rows` as in AgentMLP.forward."""
        packed = pack_inputs(state, obs, rows) if self.fused else None
        if packed is None:
            return self._both(state, obs)
        return tuple(unpack_output(q, rows, state.shape[:2]) for q in self._both(*packed))

    def forward(self, state: torch.Tensor, obs: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        return torch.minimum(*self.both(state, obs, rows))


def obs_mask(batch: EpisodeBatch) -> torch.Tensor:
    """[B, T+1]: 1 at the observations of an episode (indices 0..len, the last being the final next
    observation), 0 on padding."""
    T = batch.max_t
    idx = torch.arange(T + 1, device=batch.lengths.device)
    return (idx[None, :] <= batch.lengths[:, None]).to(batch.rewards.dtype)


def expectile_loss(u: torch.Tensor, tau: float) -> torch.Tensor:
    """|τ − 1(u < 0)|·u² elementwise (IQL's asymmetric L2; u = target − prediction). Minimising its mean
    over samples of the target gives the τ-expectile."""
    return torch.abs(tau - (u < 0).to(u.dtype)) * u.pow(2)


def policy_expectation(logits: torch.Tensor, q: torch.Tensor, avail: torch.Tensor) -> torch.Tensor:
    """Σ_{a available} π(a)·Q(a) with π = softmax(logits) over the available actions: [..., A] -> [...].
    Unavailable actions have probability exactly 0 (their Q, however large, never enters)."""
    p = masked_softmax(logits, avail)
    return (p * torch.where(avail > 0, q, torch.zeros_like(q))).sum(-1)


def clipped_exp_weights(adv: torch.Tensor, beta: float, max_weight: float = 100.0) -> torch.Tensor:
    """exp(β·A) capped at max_weight (IQL/AWAC `EXP_ADV_MAX` = 100), no normalisation; detached."""
    return torch.exp(beta * adv.detach()).clamp(max=max_weight)


def batch_softmax_weights(values: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """softmax over the BATCH axis (dim 0) of values / β among the entries with mask 1 (ICQ's
    `F.softmax(x / β, dim=0)`, restricted to real entries): every other index (a column) sums to 1
    over its real entries; masked entries and empty columns are 0. values, mask [B, ...]; detached."""
    values = values.detach()
    ok = (mask > 0).expand_as(values)
    any_ok = ok.any(0, keepdim=True)
    x = torch.where(ok | ~any_ok, values / beta, torch.full_like(values, float("-inf")))
    w = torch.softmax(x, 0)
    return torch.where(ok, w, torch.zeros_like(w))


def per_agent_td_lambda(batch: EpisodeBatch, target_q: torch.Tensor, gamma: float, td_lambda: float) -> torch.Tensor:
    """TD(λ) returns per agent from the shared team reward: target_q [B, T+1, n] -> [B, T, n]
    (agents folded into the batch axis of `td_lambda_targets`, as the references' per-agent critics
    repeat the reward over agents)."""
    B, T1, n = target_q.shape
    rep = lambda x: x.unsqueeze(1).expand(B, n, x.shape[1]).reshape(B * n, x.shape[1])  # noqa: E731
    tq = target_q.permute(0, 2, 1).reshape(B * n, T1)
    y = td_lambda_targets(rep(batch.rewards), rep(batch.terminals), rep(batch.mask), tq, gamma, td_lambda)
    return y.reshape(B, n, T1 - 1).permute(0, 2, 1)

"""MADTKD, discrete actions (SMAX/SMAC): a centralised decision-transformer teacher, then
decentralised decision-transformer students distilled from it.

Reference: `thu-rllab/CFCQL` `discrete/src/config/algs/baseline_madtkd.yaml`,
`learners/baseline_madtkd_learner.py`, `controllers/dt_controller.py`, `modules/agents/gpt_model.py`
(reference-implementations.md §4.10). Written from the description, not copied.

Models (one class, `DecisionTransformer`; minGPT blocks: pre-LN attention + GELU MLP, residual):
  token (t, i) = tanh(W_o o_t^i) + E_a[a_{t-1}^i] + tanh(W_R R) + E_id[i] + E_t[t]  (+ tanh(W_s s_t) teacher)
  teacher  centralised: one sequence per episode holding every agent's token at every step; token (t, i)
           attends to all agents' tokens at steps t-K+1 .. t (the joint trajectory: global state, all
           observations, previous joint actions, return). It never sees a_t of any agent.
  students decentralised, one shared-parameter model over agents (agent id in the token): agent i's
           token (t, i) attends only to its own tokens at steps t-K+1 .. t.
  Heads: action logits (masked softmax over the available actions) and the final-layer features.

Losses (all masked: unavailable actions get probability exactly 0 and never enter a softmax):
  teacher  CE = -log π_T(a_t^i | ·) on the dataset actions, mean over real (step, agent) pairs.
  student  CE(π_S) + α · KL(π_T ‖ π_S) + β · Σ_{i≠j} Huber(cos(f_T^i, f_T^j), cos(g(f_S^i), g(f_S^j)))
           (α = β = 0.5; the relational term compares the agents' pairwise cosine similarities of the
           frozen teacher's features with those of the students' features through a learned mapping
           head g, as the reference's `mapping_net`).

Schedule: rounds 1 .. `teacher_rounds` each take one teacher step; every later round takes one student
step with the teacher frozen (the reference trains the teacher in its own run, saves it and loads it
for the student run). Every round reports every metric: the inactive model's losses are evaluated
without a step, and `madtkd/teacher_phase` says which phase the round was in.

Return conditioning: tokens carry the episode's return R = Σ_t r_t (divided by `return_scale`), the
return-to-go at t = 0, constant over the episode. A decision transformer normally decrements the
return-to-go by the rewards received, but the evaluation protocol gives `act()` only observations and
available actions, no rewards, so the students are trained and evaluated on the constant target
(return-conditioned behaviour cloning; the step embedding E_t says how far into the episode it is).
The reference's configuration (`model_type: state_only`) ignores the return altogether
(`condition_on_return: False` reproduces that). At evaluation R = `target_return` or, when it is None,
the highest episode return seen in the training batches so far (a running maximum, checkpointed); on
SMAX that is the dataset's best return (2.0 = all enemy health + the win bonus).

One update round = one gradient step on 128 episodes (the reference's batch_size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from plcql_bench.algorithms.base import EpisodeBatch, register
from plcql_bench.algorithms.common.discrete import (
    DiscreteAlgorithm, bc_cross_entropy, masked_argmax, masked_log_softmax, masked_mean)
from plcql_bench.suite.core.spec import TaskSpec


@dataclass
class Config:
    # --- model (baseline_madtkd.yaml: n_embd 32, n_layer 1, n_head 1; dropout 0) ---
    embed: int = 32  # n_embd 32
    layers: int = 1  # n_layer 1
    heads: int = 1  # n_head 1
    context: int = 4  # steps of history per token (the reference: context_length 1; chosen, see docs)
    condition_on_return: bool = True  # False = the reference's state_only model (no return token)
    return_scale: float = 1.0  # R / return_scale enters the token (20 on SMAC via the table)
    target_return: float | None = None  # evaluation R; None = the best episode return seen in training
    # --- optimisation (gpt_model.configure_optimizers: AdamW, betas 0.9/0.95, decay on Linear weights) ---
    lr: float = 5e-4  # lr 0.0005
    weight_decay: float = 0.1  # weight_decay 0.1
    batch_episodes: int = 128  # batch_size 128 episodes
    grad_clip: float = 1.0  # chosen: minGPT/DT trainers' grad_norm_clip 1.0 (the reference clips nothing)
    # --- distillation ---
    teacher_rounds: int = 1000  # teacher rounds before the students (chosen; per map: half the paper budget)
    alpha: float = 0.5  # alpha 0.5: weight of KL(teacher ‖ student)
    beta: float = 0.5  # beta 0.5: weight of the relational (pairwise cosine) Huber loss


def _init_weights(m: nn.Module) -> None:
    """minGPT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm."""
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor,
                    context: int) -> torch.Tensor:
    """Attention of every token of step t over the m tokens of each of the steps t-K+1 .. t.

    q, k, v [R, T, m, h, d] (R rows, T steps, m tokens per step, h heads), valid [R, T] bool (the
    step exists) -> [R, T, m, h, d]. Keys of missing steps (before the start, padding) get weight 0;
    a token always sees its own step, so every softmax has a finite entry (padding queries give
    finite values that masked losses ignore). Computed blockwise: steps are cut into blocks of
    L >= K steps and each block attends to itself and the block before it under a band mask, so
    the matrix products are (L·m × d)(d × 2L·m) rather than one per token, and nothing is O(T²)."""
    R, T, m, h, d = q.shape
    K = context
    L = max(K, -(-16 // m))  # steps per block: >= K, and >= 16 tokens (measured fastest on CPU)
    nb = -(-T // L)
    pad = nb * L - T

    def blocks(x: torch.Tensor) -> torch.Tensor:  # [R, T, ...] -> [R, nb, L, ...]
        if pad:
            x = torch.cat([x, x.new_zeros((R, pad) + x.shape[2:])], 1)
        return x.reshape((R, nb, L) + x.shape[2:])

    def with_previous(x: torch.Tensor) -> torch.Tensor:  # [R, nb, L, ...] -> [R, nb, 2L, ...]
        return torch.cat([torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1), x], 2)

    heads_first = lambda x: x.reshape(R, nb, -1, h, d).transpose(2, 3)  # noqa: E731  [R, nb, h, tokens, d]
    qb = heads_first(blocks(q))  # [R, nb, h, L·m, d]
    kb, vb = (heads_first(with_previous(blocks(x))) for x in (k, v))  # [R, nb, h, 2L·m, d]
    scores = qb @ kb.transpose(-1, -2) / math.sqrt(d)  # [R, nb, h, L·m, 2L·m]
    tq = torch.arange(L, device=q.device).repeat_interleave(m)  # query step within the block
    tk = torch.arange(-L, L, device=q.device).repeat_interleave(m)  # key step (negative: previous block)
    band = (tk[None] <= tq[:, None]) & (tk[None] > tq[:, None] - K)  # [L·m, 2L·m]
    key_ok = with_previous(blocks(valid)).repeat_interleave(m, -1)  # [R, nb, 2L·m]
    ok = (band & key_ok[:, :, None, None, :]) | (tk[None] == tq[:, None])
    att = torch.softmax(scores.masked_fill(~ok, float("-inf")), -1)
    y = att @ vb  # [R, nb, h, L·m, d]
    return y.transpose(2, 3).reshape(R, nb * L, m, h, d)[:, :T]


class WindowAttention(nn.Module):
    """Multi-head self-attention of each token (t, q) over the m tokens of each of the steps
    t-K+1 .. t of its row (see `local_attention`). x [R, T, m, E], valid [R, T] -> [R, T, m, E]."""

    def __init__(self, embed: int, heads: int, context: int) -> None:
        super().__init__()
        if embed % heads:
            raise ValueError(f"embed {embed} is not a multiple of heads {heads}")
        self.heads, self.context = heads, context
        self.qkv = nn.Linear(embed, 3 * embed)
        self.proj = nn.Linear(embed, embed)

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        R, T, m, E = x.shape
        q, k, v = (y.reshape(R, T, m, self.heads, E // self.heads) for y in self.qkv(x).chunk(3, -1))
        return self.proj(local_attention(q, k, v, valid, self.context).reshape(R, T, m, E))


class Block(nn.Module):
    def __init__(self, embed: int, heads: int, context: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(embed), nn.LayerNorm(embed)
        self.attn = WindowAttention(embed, heads, context)
        self.mlp = nn.Sequential(nn.Linear(embed, 2 * embed), nn.GELU(), nn.Linear(2 * embed, embed))

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), valid)
        return x + self.mlp(self.ln2(x))


class DecisionTransformer(nn.Module):
    """The teacher (`centralised`: one row per episode, n tokens per step, plus the global state)
    or the students (one row per agent and episode, one token per step)."""

    def __init__(self, n_agents: int, obs_dim: int, n_actions: int, state_dim: int, max_t: int,
                 cfg: Config, centralised: bool) -> None:
        super().__init__()
        E = cfg.embed
        self.n, self.A, self.max_t, self.centralised = n_agents, n_actions, max_t, centralised
        self.use_return, self.return_scale = cfg.condition_on_return, cfg.return_scale
        self.obs_emb = nn.Linear(obs_dim, E)
        self.state_emb = nn.Linear(state_dim, E) if centralised else None
        self.ret_emb = nn.Linear(1, E)
        self.act_emb = nn.Embedding(n_actions + 1, E)  # index A = no previous action (t = 0)
        self.id_emb = nn.Embedding(n_agents, E)
        self.time_emb = nn.Embedding(max_t + 1, E)
        self.blocks = nn.ModuleList(Block(E, cfg.heads, cfg.context) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(E)
        self.head = nn.Linear(E, n_actions, bias=False)
        self.apply(_init_weights)

    def forward(self, obs: torch.Tensor, prev: torch.Tensor, ret: torch.Tensor, t: torch.Tensor,
                valid: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [B, T, n, o], prev (previous actions, A = none) int64 [B, T, n], ret [B] (episode
        return), t (absolute step) int64 [B, T], valid [B, T] bool, state [B, T, S] (teacher)
        -> (logits [B, T, n, A], features [B, T, n, E])."""
        B, T, n, _ = obs.shape
        ids = torch.arange(n, device=obs.device)
        x = torch.tanh(self.obs_emb(obs)) + self.act_emb(prev) + self.id_emb(ids)
        x = x + self.time_emb(t.clamp(0, self.max_t))[:, :, None]
        if self.use_return:
            x = x + torch.tanh(self.ret_emb((ret / self.return_scale)[:, None, None, None]))
        if self.centralised:
            x = x + torch.tanh(self.state_emb(state))[:, :, None]
            rows, row_valid = x, valid  # [B, T, n, E]: m = n tokens per step
        else:  # fold agents into rows: [B * n, T, 1, E]
            rows = x.permute(0, 2, 1, 3).reshape(B * n, T, 1, -1)
            row_valid = valid.repeat_interleave(n, 0)
        for blk in self.blocks:
            rows = blk(rows, row_valid)
        f = self.ln_f(rows)
        if not self.centralised:
            f = f.reshape(B, n, T, -1).permute(0, 2, 1, 3)
        return self.head(f), f

    def receptive_steps(self) -> int:
        """Steps of history the output at the last step depends on (itself included)."""
        return len(self.blocks) * (self.blocks[0].attn.context - 1) + 1


def decay_groups(*modules: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups as minGPT: decay on Linear weights only (not on biases, LayerNorm,
    embeddings)."""
    decay, rest = [], []
    for mod in modules:
        for m in mod.modules():
            for name, p in m.named_parameters(recurse=False):
                (decay if isinstance(m, nn.Linear) and name == "weight" else rest).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def relation_matrix(f: torch.Tensor) -> torch.Tensor:
    """Pairwise cosine similarities between agents: f [B, T, n, E] -> [B, T, n, n]."""
    u = F.normalize(f, dim=-1, eps=1e-8)
    return u @ u.transpose(-1, -2)


@register
class MADTKD(DiscreteAlgorithm):
    name = "madtkd"
    Config = Config
    table = "madtkd"  # configs/madtkd.yaml (MADTKD has discrete actions only)

    def __init__(self, spec: TaskSpec, config: Config, seed: int, device: str = "cpu") -> None:
        super().__init__(spec, config, seed, device)
        c = config
        if c.context < 1 or c.layers < 1:
            raise ValueError("madtkd: context and layers must be >= 1")
        mk = lambda central: DecisionTransformer(  # noqa: E731
            self.n, spec.obs_dim, self.A, spec.state_dim, spec.episode_limit, c, central)
        self.teacher = self.build(1, lambda: mk(True))
        self.student = self.build(2, lambda: mk(False))
        self.mapping = self.build(3, lambda: nn.Sequential(nn.Linear(c.embed, 2 * c.embed), nn.GELU(),
                                                           nn.Linear(2 * c.embed, c.embed)).apply(_init_weights))
        adamw = lambda *ms: torch.optim.AdamW(decay_groups(*ms, weight_decay=c.weight_decay),  # noqa: E731
                                              lr=c.lr, betas=(0.9, 0.95))
        self.teacher_opt = adamw(self.teacher)
        self.student_opt = adamw(self.student, self.mapping)
        self.best_return = float("-inf")
        self._hist: dict[str, Any] | None = None

    # -- checkpoint -----------------------------------------------------------------------------
    def modules(self) -> dict[str, nn.Module]:
        return {"teacher": self.teacher, "student": self.student, "mapping": self.mapping}

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return {"teacher_opt": self.teacher_opt, "student_opt": self.student_opt}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "best_return": self.best_return}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.best_return = float(state["best_return"])

    def policy_agent(self) -> nn.Module:
        return self.student

    def eval_return(self) -> float:
        if self.cfg.target_return is not None:
            return float(self.cfg.target_return)
        return self.best_return if math.isfinite(self.best_return) else 0.0

    # -- training -------------------------------------------------------------------------------
    @staticmethod
    def inputs(batch: EpisodeBatch, n_actions: int) -> dict[str, torch.Tensor]:
        """Model inputs over the T transition steps of a batch (see DecisionTransformer.forward)."""
        B, T = batch.size, batch.max_t
        prev = torch.cat([torch.full_like(batch.actions[:, :1], n_actions), batch.actions[:, :-1]], 1)
        return {"obs": batch.obs[:, :T], "prev": prev, "ret": (batch.rewards * batch.mask).sum(1),
                "t": torch.arange(T, device=batch.obs.device).expand(B, T), "valid": batch.mask > 0}

    def update(self, sample) -> dict[str, float]:
        c = self.cfg
        batch = sample(c.batch_episodes)
        T = batch.max_t
        x = self.inputs(batch, self.A)
        self.best_return = max(self.best_return, float(x["ret"].max()))
        teacher_phase = self.rounds < c.teacher_rounds
        avail, real = batch.avail[:, :T], batch.mask.unsqueeze(-1)  # real: [B, T, 1]

        with torch.set_grad_enabled(teacher_phase):
            t_logits, t_feat = self.teacher(**x, state=batch.state[:, :T])
            t_ce = bc_cross_entropy(t_logits, batch)
        if teacher_phase:
            self._step(self.teacher_opt, t_ce, self.teacher.parameters())
        t_logits, t_feat = t_logits.detach(), t_feat.detach()

        with torch.set_grad_enabled(not teacher_phase):
            s_logits, s_feat = self.student(**x)
            s_ce = bc_cross_entropy(s_logits, batch)
            logp_t, logp_s = masked_log_softmax(t_logits, avail), masked_log_softmax(s_logits, avail)
            kl = (logp_t.exp() * (logp_t - logp_s) * avail).sum(-1)  # KL(teacher ‖ student) [B, T, n]
            kl = masked_mean(kl, real)
            rel_t, rel_s = relation_matrix(t_feat), relation_matrix(self.mapping(s_feat))
            off = 1.0 - torch.eye(self.n, device=self.device)
            rel = F.huber_loss(rel_s, rel_t, reduction="none") * off  # [B, T, n, n]
            rel = masked_mean(rel.sum((-1, -2)), batch.mask)  # Σ over ordered pairs i ≠ j, mean over steps
            s_loss = s_ce + c.alpha * kl + c.beta * rel
        if not teacher_phase:
            self._step(self.student_opt, s_loss, [*self.student.parameters(), *self.mapping.parameters()])
        self.rounds += 1
        with torch.no_grad():
            agree = (masked_argmax(s_logits, avail) == masked_argmax(t_logits, avail)).float()
        return {"madtkd/teacher_phase": float(teacher_phase), "teacher/cross_entropy": float(t_ce.detach()),
                "student/cross_entropy": float(s_ce.detach()), "student/kl": float(kl.detach()),
                "student/relation": float(rel.detach()), "student/loss": float(s_loss.detach()), "student/teacher_agreement": float(masked_mean(agree, real)),
                "madtkd/best_return": float(self.best_return)}

    def _step(self, opt: torch.optim.Optimizer, loss: torch.Tensor, params) -> None:
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(list(params), self.cfg.grad_clip)
        opt.step()

    # -- acting ---------------------------------------------------------------------------------
    def begin_episodes(self, num_envs: int) -> None:
        """Forget every env's context: the students see only the current episode's tokens."""
        H, n = self.student.receptive_steps(), self.n
        self._hist = {"obs": torch.zeros(num_envs, 0, n, self.spec.obs_dim, device=self.device),
                      "prev": torch.full((num_envs, 0, n), self.A, dtype=torch.long, device=self.device),
                      "last": torch.full((num_envs, n), self.A, dtype=torch.long, device=self.device),
                      "t": 0, "H": H}

    @torch.no_grad()
    def act(self, obs: np.ndarray, avail: np.ndarray | None = None) -> np.ndarray:
        """Greedy available actions of the students, each agent from its own observations of the
        current episode (the last `receptive_steps()` steps, which is all the model looks at)."""
        obs_t = torch.tensor(np.asarray(obs, dtype=np.float32), device=self.device)
        B = obs_t.shape[0]
        if self._hist is None or self._hist["obs"].shape[0] != B:
            self.begin_episodes(B)
        h = self._hist
        h["obs"] = torch.cat([h["obs"], obs_t[:, None]], 1)[:, -h["H"]:]
        h["prev"] = torch.cat([h["prev"], h["last"][:, None]], 1)[:, -h["H"]:]
        L = h["obs"].shape[1]
        t = torch.arange(h["t"] - L + 1, h["t"] + 1, device=self.device).expand(B, L)
        ret = torch.full((B,), self.eval_return(), device=self.device)
        valid = torch.ones(B, L, dtype=torch.bool, device=self.device)
        was_training = self.student.training
        self.student.eval()
        try:
            logits = self.student(h["obs"], h["prev"], ret, t, valid)[0][:, -1]  # [B, n, A]
        finally:
            self.student.train(was_training)
        av = torch.ones_like(logits) if avail is None else torch.tensor(np.asarray(avail, np.float32), device=self.device)
        a = masked_argmax(logits, av)
        h["last"], h["t"] = a, h["t"] + 1
        return a.cpu().numpy().astype(np.int64)

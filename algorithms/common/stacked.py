"""Several seeds of one continuous CFCQL-family algorithm (CFCQL, MACQL, SPaCQL, PLCQL and its variants)
trained in one process as stacked models: one round of the stack advances S runs, with every network
call one batched call over the seeds (S seeds x E critic members, S seeds x n actors), so a GPU round
issues about as many kernels for S runs as for one (issue 19, item 2).

How. The S runs are built as usual (`cls(spec, config, seed)`, each drawing its networks from its own seed),
then their parameters, buffers and Adam states are stacked along a new leading seed axis
(`torch.func.stack_module_state`). Each stage of a round, the algorithm's own per-seed methods
(`compute_target`, `critic_loss`, `actor_loss`, and what the algorithm's round hooks call), runs once for
all seeds under `torch.func.vmap` with the stacked parameters put in place of the first run's
(as `torch.func.functional_call` would; `vcall`): the math is the algorithm file's, unchanged. Between
the stages the optimiser steps work on the stacked parameters: the S losses are summed (no parameter is shared between seeds, so each
seed's gradient is its own), the gradient norms are clipped per seed (and per agent for the actors,
as the separate runs), and one Adam over the stacked parameters is S Adams (Adam is elementwise).
Random numbers: each seed draws from its own generator, in its separate run's order (rng.py).

What a stacked seed gets: its separate run's numbers up to float summation order (the batched matmuls
sum in another order; the critic takes the plain kernels, `EnsembleCritic.fused = False`, because the
fused ones are not vmappable). tests/test_stacked.py compares parameters and metrics after a few rounds.

`SeedStack.update(samplers)` is one round of every seed (a list of S metric dicts, as `update` returns);
`sync()` writes the stacked state back into the S algorithm objects, which then evaluate, checkpoint
(`state_dict`) and report diagnostics as separate runs do. The round is not written here: it is the
algorithm's own `CentralCriticAlgorithm.round` (continuous.py), with the algorithm's hooks, run through
`StackSteps` (vmapped calls, stacked optimiser steps) where a separate run uses `RunSteps` (steps.py). A
class that overrides `update` or `round` is refused (`stackable`).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn
from torch._C import _functorch as _ft
from torch.func import stack_module_state, vmap

from plcql_bench.algorithms.base import Batch
from plcql_bench.algorithms.common.continuous import CentralCriticAlgorithm
from plcql_bench.algorithms.common.rng import SeedGenerators


def stackable(cls) -> bool:
    """Whether seeds of algorithm class `cls` can be trained as a stack: a member of the continuous CFCQL family
    whose round is the family's (`CentralCriticAlgorithm.round`, changed only through its hooks), run by the
    family's `update`. A class that overrides either is refused, not stacked wrongly."""
    return (isinstance(cls, type) and issubclass(cls, CentralCriticAlgorithm)
            and cls.update is CentralCriticAlgorithm.update and cls.round is CentralCriticAlgorithm.round)


class _Modules(nn.Module):
    """The networks of one run under their checkpoint names (the stacked tensors' names)."""

    def __init__(self, modules: dict[str, nn.Module]) -> None:
        super().__init__()
        for name, m in modules.items():
            self.add_module(name, m)


class SeedStack:
    """S runs of one algorithm class, config and task (different seeds), trained in lockstep as stacked
    models. `algos`: the S algorithm objects, at the same round (fresh or each loaded from its own
    checkpoint)."""

    def __init__(self, algos: Sequence[CentralCriticAlgorithm]) -> None:
        algos = list(algos)
        if not algos:
            raise ValueError("SeedStack: no runs")
        cls = type(algos[0])
        if not stackable(cls):
            raise ValueError(f"{cls.__name__}: overrides update() or round(), so it has no stacked round "
                             "(algorithms/common/stacked.py runs CentralCriticAlgorithm.round)")
        if any(type(a) is not cls or a.cfg != algos[0].cfg for a in algos):
            raise ValueError("SeedStack: the runs must share the algorithm class and config")
        if len({a.rounds for a in algos}) != 1:
            raise ValueError("SeedStack: the runs must be at the same round")
        self.algos, self.S = algos, len(algos)
        self.template, self.cfg = algos[0], algos[0].cfg
        for a in algos:  # the fused kernels are custom autograd Functions, which vmap cannot batch
            a.critic.fused = a.target_critic.fused = False
        self.wrapper = _Modules(self.template.modules())
        per_run = [_Modules(a.modules()) for a in algos]
        params, buffers = stack_module_state(per_run)
        self.params = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        self.buffers = {k: v.detach().clone() for k, v in buffers.items()}
        # where each stacked tensor goes in the template's modules during a vcall: (dict, key, tensor)
        self.slots = [(_owner(self.wrapper, k)._parameters, k.rsplit(".", 1)[-1], v) for k, v in self.params.items()]
        self.slots += [(_owner(self.wrapper, k)._buffers, k.rsplit(".", 1)[-1], v) for k, v in self.buffers.items()]
        self.gens = SeedGenerators([a.gen for a in algos])
        self._build_optimisers()

    # -- the stacked optimisers ------------------------------------------------------------------------
    def _param_names(self, algo) -> dict[int, str]:
        return {id(p): name for name, p in _Modules(algo.modules()).named_parameters()}

    def _build_optimisers(self) -> None:
        """One optimiser per run optimiser, of the same class and settings, over the stacked parameters,
        with the runs' states stacked (a resumed run brings its Adam moments and step count)."""
        self.opts: dict[str, torch.optim.Optimizer] = {}
        self.opt_names: dict[str, list[str]] = {}
        names0 = self._param_names(self.template)
        for key, opt in self.template.optimisers().items():
            names = [names0[id(p)] for group in opt.param_groups for p in group["params"]]
            group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
            stacked = type(opt)([self.params[n] for n in names], **group)
            per_run = [a.optimisers()[key] for a in self.algos]
            for i, name in enumerate(names):
                states = [o.state.get(o.param_groups[0]["params"][i], {}) for o in per_run]
                if states[0]:
                    stacked.state[self.params[name]] = _stack_state(states, self.params[name])
            self.opts[key], self.opt_names[key] = stacked, names

    def sync(self) -> None:
        """Write the stacked parameters, buffers and optimiser states back into the S algorithm objects
        (before they evaluate, checkpoint or report diagnostics)."""
        with torch.no_grad():
            for s, algo in enumerate(self.algos):
                mods = _Modules(algo.modules())
                for name, p in mods.named_parameters():
                    p.copy_(self.params[name][s])
                for name, b in mods.named_buffers():
                    b.copy_(self.buffers[name][s])
                for key, opt in algo.optimisers().items():
                    run_params = [p for group in opt.param_groups for p in group["params"]]
                    for p, name in zip(run_params, self.opt_names[key]):
                        leaf = self.params[name]
                        st = self.opts[key].state.get(leaf)
                        if st:
                            opt.state[p] = {k: (v[s].clone() if torch.is_tensor(v) and v.shape == leaf.shape
                                                else (v.clone() if torch.is_tensor(v) else v))
                                            for k, v in st.items()}

    # -- per-seed methods, vmapped ---------------------------------------------------------------------
    @contextmanager
    def _seed_generators(self) -> Iterator[None]:
        saved = self.template.gen
        self.template.gen = self.gens
        try:
            yield
        finally:
            self.template.gen = saved

    def vcall(self, fn: Callable, *args: Any) -> Any:
        """fn(*args) for every seed: fn is a method of the template run (the first), called with each
        seed's parameters, buffers and arguments (tensors and Batches with a leading seed axis; other
        values are shared). Returns the outputs with a leading seed axis.

        Inside vmap the template's modules hold the stacked tensors, each seen as its seed's slice (what
        `torch.func.functional_call` does with the parameters passed through vmap, without its per-call
        cost: ~1 ms for these ~100 tensors, against a GPU round's ~50 ms and ~50 calls)."""
        flat = [_as_tree(a) for a in args]
        dims = tuple(0 if _batched(a) else None for a in flat)

        def one_seed(*seed_args):
            real = [_from_tree(a, orig) for a, orig in zip(seed_args, args)]
            level = _ft.maybe_current_level()
            saved = [(d, k, d[k]) for d, k, _ in self.slots]
            try:
                for d, k, t in self.slots:
                    d[k] = _ft._add_batch_dim(t, 0, level)
                return fn(*real)
            finally:
                for d, k, t in saved:
                    d[k] = t

        with self._seed_generators():
            return vmap(one_seed, in_dims=dims, randomness="error")(*flat)

    # -- the stacked steps (CentralCriticAlgorithm.critic_step / actor_step, RunSteps.optimise) -----------
    def _leaves(self, prefix: str) -> list[torch.Tensor]:
        return [v for k, v in self.params.items() if k.startswith(prefix + ".")]

    def critic_step(self, loss: torch.Tensor) -> torch.Tensor:
        """loss [S]; returns the per-seed gradient norms [S] (clipped per seed: jointly over the critic, or per
        member with critic_clip "per-member", as the separate run's `critic_step`)."""
        opt = self.opts["critic_opt"]
        opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        if self.cfg.critic_clip == "per-member":
            norms = clip_per_seed_(self._leaves("critic"), self.cfg.grad_clip, self.S, per_member=True)
            norms = norms.pow(2).sum(1).sqrt()
        else:
            norms = clip_per_seed_(self._leaves("critic"), self.cfg.grad_clip, self.S)
        opt.step()
        return norms.detach()

    def actor_step(self, loss: torch.Tensor) -> None:
        params = self._leaves("actors")
        grads = torch.autograd.grad(loss.sum(), params)
        for p, g in zip(params, grads):
            p.grad = g
        clip_per_seed_(params, self.cfg.grad_clip, self.S, per_member=True)  # per seed and agent
        self.opts["actor_opt"].step()
        self.opts["actor_opt"].zero_grad(set_to_none=True)

    def optimise(self, key: str, module: str, loss: torch.Tensor, max_norm: float) -> None:
        """One step of the stacked optimiser `key` over the stacked module `module`, each seed's gradient norm
        clipped to max_norm on its own (0: not clipped), as the separate run's `RunSteps.optimise`."""
        opt = self.opts[key]
        opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        if max_norm > 0:
            clip_per_seed_(self._leaves(module), max_norm, self.S)
        opt.step()

    def update_targets(self) -> None:
        with torch.no_grad():
            for online in ("critic", "actors"):
                names = [k for k in self.params if k.startswith(online + ".")]
                torch._foreach_lerp_([self.params["target_" + k] for k in names], [self.params[k] for k in names],
                                     self.cfg.tau)

    # -- one round -------------------------------------------------------------------------------------
    def sample(self, samplers: Sequence[Callable[[int], Batch]]) -> Batch:
        """Each seed's batch from its own sampler, stacked: fields [S, B, ...]."""
        batches = [s(self.cfg.batch_size) for s in samplers]
        return Batch(**{f: (torch.stack([getattr(b, f) for b in batches]) if getattr(batches[0], f) is not None
                            else None) for f in vars(batches[0])})

    def update(self, samplers: Sequence[Callable[[int], Batch]]) -> list[dict[str, float]]:
        """One round of every seed (each seed's batches from its own sampler); the S metric dicts. The round is
        the algorithm's own (`CentralCriticAlgorithm.round`), run through `StackSteps`."""
        if len(samplers) != self.S:
            raise ValueError(f"SeedStack.update: {len(samplers)} samplers for {self.S} seeds")
        out = self.template.round(StackSteps(self, samplers))
        for a in self.algos:
            a.rounds += 1
        return per_seed_floats(out, self.S)


class StackSteps:
    """The stages of a round for a seed stack (the interface of algorithms/common/steps.py): each call vmapped
    over the seeds, each step one step of the stacked optimisers, each batch one per seed."""

    def __init__(self, stack: SeedStack, samplers: Sequence[Callable[[int], Batch]]) -> None:
        self.stack, self.samplers = stack, samplers

    def batch(self) -> Batch:
        return self.stack.sample(self.samplers)

    def call(self, fn: Callable, *args: Any) -> Any:
        return self.stack.vcall(fn, *args)

    def zeros(self, device: torch.device | str) -> torch.Tensor:
        return torch.zeros(self.stack.S, device=device)

    def critic_step(self, loss: torch.Tensor) -> torch.Tensor:
        return self.stack.critic_step(loss)

    def actor_step(self, loss: torch.Tensor) -> None:
        self.stack.actor_step(loss)

    def optimise(self, opt: str, module: str, loss: torch.Tensor, max_norm: float) -> None:
        self.stack.optimise(opt, module, loss, max_norm)

    def update_targets(self) -> None:
        self.stack.update_targets()


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _owner(root: nn.Module, name: str) -> nn.Module:
    """The submodule that holds parameter or buffer `name` (dotted)."""
    return root.get_submodule(name.rsplit(".", 1)[0]) if "." in name else root


def clip_per_seed_(params: list[torch.Tensor], max_norm: float, n_seeds: int, per_member: bool = False
                   ) -> torch.Tensor:
    """clip_grad_norm_ of each seed's gradients (leading axis of every stacked parameter) on its own, as
    S separate `clip_grad_norm_` calls; with `per_member`, of each seed's member (second axis: the agents
    of stacked actors) on its own, as `clip_grad_norm_stacked_`. Returns the norms [S] (or [S, n])."""
    grads = [p.grad for p in params if p.grad is not None]
    lead = grads[0].shape[:2] if per_member else grads[0].shape[:1]
    sq = torch.stack([g.reshape(*lead, -1).pow(2).sum(-1) for g in grads]).sum(0)
    norms = sq.sqrt()
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(*lead, *([1] * (g.dim() - len(lead)))))
    return norms


def _stack_state(states: list[dict], leaf: torch.Tensor) -> dict:
    """One optimiser state over a stacked parameter from the runs' states for that parameter: tensors shaped
    like the run's parameter are stacked; the rest (Adam's step count) must agree and is kept once."""
    out = {}
    for k, v in states[0].items():
        if torch.is_tensor(v) and v.shape == leaf.shape[1:]:
            out[k] = torch.stack([st[k] for st in states]).to(leaf.device)
        else:
            if any(not _same(st[k], v) for st in states[1:]):
                raise ValueError(f"SeedStack: the runs' optimiser states differ in {k!r} (not at the same round?)")
            out[k] = v.clone() if torch.is_tensor(v) else v
    return out


def _same(a, b) -> bool:
    return bool(torch.equal(a, b)) if torch.is_tensor(a) else a == b


def _as_tree(a: Any) -> Any:
    """A Batch as a dict of its tensor fields (vmap maps over dicts, not dataclasses)."""
    if isinstance(a, Batch):
        return {k: v for k, v in vars(a).items() if v is not None}
    return a


def _from_tree(a: Any, orig: Any) -> Any:
    return Batch(**a) if isinstance(orig, Batch) else a


def _batched(a: Any) -> bool:
    return torch.is_tensor(a) or isinstance(a, dict)


def per_seed_floats(metrics: dict[str, torch.Tensor], n_seeds: int) -> list[dict[str, float]]:
    """{name: [S] tensor} -> S dicts of floats, in one transfer to the host (as `host_floats`)."""
    names = list(metrics)
    if not names:
        return [{} for _ in range(n_seeds)]
    table = torch.stack([metrics[k].detach().reshape(n_seeds).double() for k in names]).t().tolist()
    return [dict(zip(names, row)) for row in table]

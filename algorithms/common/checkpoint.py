"""Pieces of the algorithm contract (algorithms/base.py: Algorithm) every algorithm shares: checkpoint
state and deterministic actor actions.

An algorithm lists its networks in `modules()`, its optimisers in `optimisers()` and its private
random generators in `generators()`; `state_dict()` / `load_state_dict()` then cover all of them
plus the round counter, which is what bitwise resume needs.

Names (they are the checkpoint keys; docs/algorithms/ADDING.md, "Names"): `actors` (one network per
agent, stacked) or `actor` (one network shared by the agents) for the policy, `critic` for the network
that outputs Q (twins and ensemble members stacked in it), `mixer` for a QMIX mixer, `value` for a
state value V, `target_<name>` for a target copy and `<name>_opt` for an optimiser (`actor_opt` for
actors, `critic_opt` for a critic and its mixer). A class that renamed a key lists the old name in
`legacy_keys`, so checkpoints written before the rename still resume (bitwise)."""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

import numpy as np
import torch
from torch import nn

from plcql_bench.algorithms.base import Algorithm


class Checkpointable(Algorithm):
    """`state_dict()` / `load_state_dict()` from `modules()`, `optimisers()`, `generators()` and `rounds`
    (`legacy_keys`, old checkpoint key -> today's, is the contract's: see the module docstring)."""

    rounds: int

    def modules(self) -> dict[str, nn.Module]:
        raise NotImplementedError

    def optimisers(self) -> dict[str, torch.optim.Optimizer]:
        return {}

    def generators(self) -> dict[str, torch.Generator]:
        return {"gen": self.gen} if hasattr(self, "gen") else {}

    def state_dict(self) -> dict[str, Any]:
        sd: dict[str, Any] = {k: m.state_dict() for k, m in self.modules().items()}
        sd.update({k: o.state_dict() for k, o in self.optimisers().items()})
        sd.update({k: g.get_state() for k, g in self.generators().items()})
        sd["rounds"] = self.rounds
        return sd

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = renamed_keys(state, self.legacy_keys)
        for k, m in self.modules().items():
            m.load_state_dict(state[k])
        for k, o in self.optimisers().items():
            o.load_state_dict(state[k])
        # The generators whose saved stream could not continue here (saved on another device kind).
        self.reseeded_generators = [k for k, g in self.generators().items() if not restore_generator(g, state[k])]
        self.rounds = int(state["rounds"])


def restore_generator(g: torch.Generator, saved: torch.Tensor) -> bool:
    """Put `g` in a saved state; True when the stream continues bitwise. A state saved on another device
    kind cannot (a CUDA generator's Philox state is 16 bytes, a CPU generator's Mersenne Twister 5,056): a
    run trained on a GPU and resumed on a CPU, or back. Then `g` is seeded from a hash of the saved state,
    so the resumed run is still deterministic given its checkpoint, but not the run its own device would
    have finished; the runner records the change of device with the result."""
    try:
        g.set_state(saved)
        return True
    except RuntimeError:
        if saved.numel() == g.get_state().numel():
            raise  # same kind of state, so not a device change: a damaged checkpoint
    digest = hashlib.sha256(saved.cpu().numpy().tobytes()).digest()
    g.manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    return False


def renamed_keys(state: dict[str, Any], legacy: dict[str, str]) -> dict[str, Any]:
    """`state` with every old key of `legacy` that it holds under its new name (a checkpoint written
    before a rename); a checkpoint with today's keys is returned as it is."""
    clash = sorted(old for old, new in legacy.items() if old in state and new in state)
    if clash:
        raise KeyError(f"checkpoint holds both old and new keys: {', '.join(f'{o}/{legacy[o]}' for o in clash)}")
    return {legacy.get(k, k): v for k, v in state.items()}


class DeterministicActors(Algorithm):
    """`act()` for algorithms with stacked deterministic tanh actors in `self.actors`."""

    actors: nn.Module
    device: torch.device

    @torch.no_grad()
    def act(self, obs: np.ndarray, avail: np.ndarray | None = None) -> np.ndarray:
        if self.actors.training:  # a single call: in evaluation mode for it, then back
            with self.evaluating():
                return self.act(obs, avail)
        a = self.actors(torch.as_tensor(np.asarray(obs, dtype=np.float32), device=self.device))
        return a.clamp(-1.0, 1.0).cpu().numpy().astype(np.float32, copy=False)

    @contextlib.contextmanager
    def evaluating(self):
        """The actors in evaluation mode (input BatchNorm on running statistics, as the references' rollouts)
        for a whole evaluation, their mode restored after: switching it at every step cost ~40 % of an act()
        on MPE (module.train() walks every submodule), the same actions either way."""
        was_training = self.actors.training
        self.actors.eval()
        try:
            yield
        finally:
            self.actors.train(was_training)

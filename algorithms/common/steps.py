"""The stages of a training round, for one run (`RunSteps`). A round is written once, against this interface:
`CentralCriticAlgorithm.round` (with its hooks) and `Par.step`. A run's `update` runs it with RunSteps, where each
stage is a direct call and each step the run's own optimiser; a seed stack (algorithms/common/stacked.py,
`StackSteps`) runs the same round for S seeds, each stage vmapped over the seeds and each step one step of the
stacked optimiser. The interface:

    batch()                   the next batch (of every seed)
    call(fn, *args)           fn(*args), fn a method of the run (a stack: of its template run, per seed)
    zeros(device)             a zero metric (a stack: one per seed)
    critic_step(loss)         the critic's optimiser step; the gradient norm
    actor_step(loss)          the actors' optimiser step
    optimise(opt, module, loss, max_norm)
                              one step of the optimiser named `opt` over the module named `module` (the names of
                              the owner's `optimisers()` and `modules()`), the gradient norm clipped to max_norm
                              (0: not clipped)
    update_targets()          the Polyak target update
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from plcql_bench.algorithms.base import Batch, BatchSampler


class RunSteps:
    """The stages for one run: `owner` is the algorithm (or a component with `optimisers()` and `modules()`,
    e.g. PLCQL's Par), `sample` its batch sampler (for `batch`)."""

    def __init__(self, owner: Any, sample: BatchSampler | None = None) -> None:
        self.owner, self.sample = owner, sample

    def batch(self) -> Batch:
        return self.sample(self.owner.cfg.batch_size)

    def call(self, fn: Callable, *args: Any) -> Any:
        return fn(*args)

    def zeros(self, device: torch.device | str) -> torch.Tensor:
        return torch.zeros((), device=device)

    def critic_step(self, loss: torch.Tensor) -> torch.Tensor:
        return self.owner.critic_step(loss)

    def actor_step(self, loss: torch.Tensor) -> None:
        self.owner.actor_step(loss)

    def optimise(self, opt: str, module: str, loss: torch.Tensor, max_norm: float) -> None:
        optimiser, net = self.owner.optimisers()[opt], self.owner.modules()[module]
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm, foreach=True)
        optimiser.step()

    def update_targets(self) -> None:
        self.owner.update_targets()

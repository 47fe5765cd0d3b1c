"""The random draws of the continuous CFCQL family (CFCQL, MACQL, SPaCQL, PLCQL), one function per kind.

With a `torch.Generator` each is the plain torch call on that generator. With a `SeedGenerators` (the seed
stack, algorithms/common/stacked.py, which evaluates one seed's code for S seeds at once under
`torch.func.vmap`) each seed draws from its OWN generator, in the same order and with the same shapes as
its separate run, and the S draws enter the vmapped computation as one batched tensor. So a stacked seed
sees the random numbers of its separate run.

vmap refuses random operations on a generator, so the stacked branch steps out of vmap for the draw with
functorch's private helpers (`torch._C._functorch`); tests/test_stacked.py checks the stacked draws against
the separate ones on the installed torch.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch._C import _functorch as ft  # private: tests/test_torch_internals.py checks what is used


class SeedGenerators:
    """One generator per stacked seed (in stack order); stands in for a run's `gen` under the seed stack."""

    def __init__(self, generators: Sequence[torch.Generator]) -> None:
        self.generators = list(generators)


def rand(generator, *shape: int, device=None) -> torch.Tensor:
    """U[0, 1) of `shape` (torch.rand)."""
    return _draw(generator, lambda g: torch.rand(*shape, generator=g, device=device))


def randn(generator, *shape: int, device=None) -> torch.Tensor:
    """N(0, 1) of `shape` (torch.randn)."""
    return _draw(generator, lambda g: torch.randn(*shape, generator=g, device=device))


def categorical(generator, probs: torch.Tensor) -> torch.Tensor:
    """One index per row of probs [B, K] (torch.multinomial(probs, 1)[:, 0])."""
    return _draw(generator, lambda g, p: torch.multinomial(p, 1, generator=g)[:, 0], probs)


def _draw(generator, fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
    if isinstance(generator, torch.Generator):
        return fn(generator, *inputs)
    if not isinstance(generator, SeedGenerators):
        raise TypeError(f"expected a torch.Generator or SeedGenerators, got {type(generator).__name__}")
    return _per_seed_draw(generator.generators, fn, inputs)


def _per_seed_draw(generators: list[torch.Generator], fn, inputs) -> torch.Tensor:
    """Inside vmap over seeds: seed s's draw is fn(generators[s], *inputs of seed s); returns them as one
    tensor batched over the seeds at the current vmap level."""
    level = ft.maybe_current_level()
    if level is None:
        raise RuntimeError("SeedGenerators draw outside the seed stack's vmap")
    per_seed = []
    for x in inputs:  # the physical [S, ...] tensor behind each (batched) input
        bdim = ft.maybe_get_bdim(x) if ft.is_batchedtensor(x) else None
        per_seed.append(ft.get_unwrapped(x).movedim(bdim, 0) if bdim is not None else None)
    with torch._C._DisableFuncTorch():
        draws = [fn(g, *[p[s] if p is not None else x for p, x in zip(per_seed, inputs)])
                 for s, g in enumerate(generators)]
        stacked = torch.stack(draws)
    return ft._add_batch_dim(stacked, 0, level)

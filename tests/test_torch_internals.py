"""The private torch internals the suite uses, each checked here so that a torch release that moves or changes
one fails this file by name (instead of a seed stack failing mid-run). Where each is used:

* algorithms/common/stacked.py (`SeedStack.vcall`) and algorithms/common/rng.py (`_per_seed_draw`):
  torch._C._functorch's batched-tensor helpers, to run one seed stack's per-seed methods under vmap with the
  stacked parameters in place, and to draw each seed's random numbers from its own generator inside vmap;
  torch._C._DisableFuncTorch (rng.py) to draw outside vmap's tracing.
* algorithms/common/nets.py (`polyak_`) and stacked.py (`update_targets`): torch._foreach_lerp_, the target
  networks' Polyak update in one fused call.
"""

from __future__ import annotations

import torch
from torch._C import _functorch as ft
from torch.func import vmap

USED = {
    "torch._C._functorch": ("maybe_current_level", "maybe_get_bdim", "is_batchedtensor", "get_unwrapped",
                            "_add_batch_dim"),
    "torch._C": ("_DisableFuncTorch",),
    "torch": ("_foreach_lerp_",),
}


def test_every_private_name_used_exists():
    modules = {"torch._C._functorch": ft, "torch._C": torch._C, "torch": torch}
    missing = [f"{mod}.{name}" for mod, names in USED.items() for name in names if not hasattr(modules[mod], name)]
    assert not missing, f"torch {torch.__version__} lacks {missing}: see this file's docstring for their users"


def test_batched_tensor_helpers_round_trip_inside_vmap():
    """What vcall and _per_seed_draw rely on: inside vmap the current level is known, an input is a batched
    tensor whose physical [S, ...] tensor and batch dim can be read back, and a physical tensor can be made a
    batched one at that level (the function then sees one seed's slice)."""
    x = torch.arange(12.0).reshape(3, 4)
    extra = torch.tensor([10.0, 20.0, 30.0])

    def one_seed(row):
        level = ft.maybe_current_level()
        assert level is not None and ft.is_batchedtensor(row)
        bdim = ft.maybe_get_bdim(row)
        assert torch.equal(ft.get_unwrapped(row).movedim(bdim, 0), x)
        return row.sum() + ft._add_batch_dim(extra, 0, level)

    assert torch.equal(vmap(one_seed)(x), x.sum(1) + extra)
    assert ft.maybe_current_level() is None  # outside vmap


def test_disable_functorch_and_foreach_lerp():
    with torch._C._DisableFuncTorch():
        assert torch.equal(torch.ones(2) * 2, torch.full((2,), 2.0))
    targets, online = [torch.zeros(3)], [torch.ones(3)]
    torch._foreach_lerp_(targets, online, 0.25)
    assert torch.allclose(targets[0], torch.full((3,), 0.25))

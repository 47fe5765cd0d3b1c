"""Checkpoints written before issue 22 renamed checkpoint keys (q_agent, q_ens, opt, par_opt, ...; the
classes' `legacy_keys`) still load and resume: the fixtures were written by the old code
(tests/fixtures/legacy_ckpt/make_fixtures.py says how), with the metrics of the two rounds that followed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from plcql_bench.algorithms.common.checkpoint import renamed_keys

from fixtures.legacy_ckpt.make_fixtures import RENAMED, build, sampler_generator  # noqa: E402

torch.set_num_threads(1)
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "legacy_ckpt"
# IQL/AWAC (discrete) moved from the references' mul-then-add EMA to nets.polyak_'s lerp, and issue 19
# changed the rounding of the fused discrete kernels every GRU agent and mixer runs on by default
# (kernels_discrete: tanh as 2·sigmoid(2x) − 1, the Q head's weight layout, QMIX's first layer and the
# counterfactual ELU from one exp): their numbers differ from the old code's by float rounding, so their
# metrics are compared with a tolerance (the checkpoints' tensors still load bitwise). Continuous PLCQL's
# CF-CQL blocks changed rounding on 2026-11-28 (kernels.softmax_last, 1.5 MiB blocks at 1 thread).
ROUNDING_ONLY = {("iql", True), ("awac", True), ("bc", True), ("cfcql", True), ("spacql", True), ("plcql", True),
                 ("plcql", False)}


def tensors_equal(a, b) -> bool:
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(tensors_equal(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("name,discrete", RENAMED, ids=[f"{n}-{'d' if d else 'c'}" for n, d in RENAMED])
def test_old_checkpoint_resumes(name, discrete):
    old = torch.load(FIXTURES / f"{name}-{'discrete' if discrete else 'continuous'}.pt", weights_only=False)
    algo, sampler = build(name, discrete)
    legacy = type(algo).legacy_keys
    renamed = [k for k in old["state"] if k in legacy]
    assert renamed, "the fixture holds no old key: it does not test the key map"
    assert not set(renamed) & set(algo.state_dict()), "old keys are still in use"
    algo.load_state_dict(old["state"])
    # every tensor, optimiser state and generator state arrives under its new name, unchanged
    now = algo.state_dict()
    assert set(now) == set(renamed_keys(old["state"], legacy))
    for k, v in old["state"].items():
        assert tensors_equal(now[legacy.get(k, k)], v), k
    sampler_generator(sampler).set_state(old["sampler_rng"])
    got = [algo.update(sampler) for _ in range(2)]
    if (name, discrete) in ROUNDING_ONLY:
        for g, w in zip(got, old["metrics"]):
            assert g.keys() == w.keys()
            assert all(math.isclose(g[k], w[k], rel_tol=1e-4, abs_tol=1e-6) for k in g), (g, w)
    else:
        assert got == old["metrics"]  # bitwise: the resumed run continues as the old code did


def test_old_and_new_key_together_is_refused():
    with pytest.raises(KeyError, match="q_agent/critic"):
        renamed_keys({"q_agent": {}, "critic": {}}, {"q_agent": "critic"})

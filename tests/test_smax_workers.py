"""SMAX collection in spawned worker processes (smax_collect workers=N). Smoke-sized: 2s3z,
random tier, 12 episodes, batch 4; each child compiles its own collector (the cost of this file)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jaxmarl")

from plcql_bench.datasets import format as fmt  # noqa: E402
from plcql_bench.datasets import smax_collect as sc  # noqa: E402
from plcql_bench.datasets import smax_tiers  # noqa: E402
from plcql_bench.suite.envs.tasks import get_task  # noqa: E402

TASK = "smax-2s3z"


def test_workers_tier_matches_chunks(tmp_path):
    spec = get_task(TASK).spec
    seeds = 321 + np.arange(12)
    arrays, meta, pid = smax_tiers.collect_smax_tier(TASK, "random", seeds, batch=4, workers=2)
    assert pid == "random-uniform-avail" and meta["workers"] == 2
    # exactly the requested episodes, episode-major and in seed order
    assert len(meta["lengths"]) == 12 and meta["env_steps"] == len(arrays["rewards"])
    ids = arrays["episode_ids"]
    assert (np.diff(ids) >= 0).all() and np.unique(ids).tolist() == list(range(12))
    assert np.bincount(ids).tolist() == meta["lengths"].tolist()
    np.testing.assert_allclose(meta["returns"], np.bincount(ids, arrays["rewards"]), rtol=1e-6)
    attrs = {"task_id": TASK, "quality": "random", "behaviour_policy_id": pid,
             "generator_version": sc.GENERATOR_VERSION, "generator_seed": 0,
             "env_versions": "{}", "ref_return_random": float("nan"),
             "ref_return_expert": float("nan"), "profile": "smoke"}
    fmt.write_dataset(tmp_path / "w2.h5", arrays, attrs, spec=spec)  # validates format v1
    # the same as collecting each contiguous chunk with workers=1 (in this process)
    parts = [smax_tiers.collect_smax_tier(TASK, "random", c, batch=4)[:2]
             for c in np.array_split(seeds, 2)]
    ref, ref_meta = sc.concat_collections(parts)
    np.testing.assert_array_equal(meta["returns"], ref_meta["returns"])
    np.testing.assert_array_equal(meta["lengths"], ref_meta["lengths"])
    np.testing.assert_array_equal(meta["won"], ref_meta["won"])
    for k in ("actions", "rewards", "episode_ids", "steps", "terminals", "timeouts"):
        np.testing.assert_array_equal(arrays[k], ref[k], err_msg=k)


def test_workers_bench_and_env():
    r = sc.bench(["2s3z"], episodes=8, batch=4, log=None, workers=2)[TASK]
    assert r["workers"] == 2 and r["env_steps"] > 0 and r["env_steps_per_s"] > 0
    assert r["env_steps_per_cpu_s"] > 0


def test_workers_from_env(monkeypatch):
    monkeypatch.delenv(sc.WORKERS_ENV, raising=False)
    assert sc.workers_from_env() == 1
    monkeypatch.setenv(sc.WORKERS_ENV, "3")
    assert sc.workers_from_env() == 3
    monkeypatch.setenv(sc.WORKERS_ENV, "0")
    with pytest.raises(ValueError):
        sc.workers_from_env()

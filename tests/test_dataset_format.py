"""Dataset format v1 and manifest: round trip, determinism, corruption cases, atomicity."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

import numpy as np
import pytest

from plcql_bench.datasets import manifest
from plcql_bench.datasets.format import (
    Dataset,
    DatasetError,
    load_dataset,
    normalised_score,
    sha256_file,
    synthetic_dataset,
    write_dataset,
)
from plcql_bench.suite.core.spec import TaskSpec

CONT = TaskSpec("test-cont", "mpe", n_agents=3, obs_dim=4, state_dim=7, act_dim=2,
                discrete=False, episode_limit=10, tiers=("expert",))  # fmt: skip
DISC = TaskSpec("test-disc", "smac", n_agents=2, obs_dim=5, state_dim=6, act_dim=4,
                discrete=True, episode_limit=10, tiers=("medium",))  # fmt: skip


def _write(tmp_path: Path, spec: TaskSpec = CONT, name: str = "d.h5", **changes) -> tuple[Path, dict, dict]:
    arrays, attrs = synthetic_dataset(spec, n_episodes=4, episode_len=5, seed=1)
    for k, v in changes.items():
        arrays[k] = v
    path = tmp_path / spec.task_id / name
    write_dataset(path, arrays, attrs)
    return path, arrays, attrs


def _raises(path, field: str, fn, *args, **kw) -> DatasetError:
    with pytest.raises(DatasetError) as info:
        fn(*args, **kw)
    err = info.value
    msg = str(err)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: {field}: "), msg
    assert err.field == field
    return err


@pytest.mark.parametrize("spec", [CONT, DISC], ids=["continuous", "discrete"])
def test_round_trip(tmp_path, spec):
    arrays, attrs = synthetic_dataset(spec, n_episodes=4, episode_len=5, seed=0)
    path = tmp_path / spec.task_id / "expert.h5"
    sha = write_dataset(path, arrays, attrs, spec=spec)
    assert sha == sha256_file(path)

    entry = manifest.make_entry(tmp_path, path, sha, profile="smoke")
    assert manifest.record(tmp_path, entry) == f"{spec.task_id}/{attrs['quality']}"
    got = manifest.lookup(tmp_path, spec.task_id, attrs["quality"])
    assert got["sha256"] == sha and got["file"] == f"{spec.task_id}/expert.h5"
    assert got["size_bytes"] == path.stat().st_size and got["n_transitions"] == 20

    ds = manifest.load(tmp_path, spec.task_id, attrs["quality"], spec=spec)
    assert isinstance(ds, Dataset) and ds.sha256 == sha
    assert set(ds.arrays) == set(arrays)
    for k, v in arrays.items():
        assert ds.arrays[k].dtype == v.dtype, k
        np.testing.assert_array_equal(ds.arrays[k], v, err_msg=k)
    assert ds.attrs == attrs
    assert ds.n_transitions == 20 and ds.n_episodes == 4 and ds.discrete == spec.discrete
    assert ds.attrs["env_versions"] == {"synthetic": "1"}
    np.testing.assert_allclose(ds.episode_returns().mean(), ds.attrs["return_mean"])
    if spec.discrete:
        assert ds.arrays["actions"].dtype == np.int64
        assert ds.arrays["actions"].shape == (20, spec.n_agents)
        assert ds.arrays["avail_actions"].shape == (20, spec.n_agents, spec.act_dim)
    # Both end kinds and both next_actions_valid values occur in the synthetic data.
    assert ds.arrays["terminals"].sum() == 2 and ds.arrays["timeouts"].sum() == 2
    assert ds.arrays["next_actions_valid"].sum() == 18


@pytest.mark.parametrize("compression", [None, "lzf", "gzip"])
def test_deterministic_bytes(tmp_path, compression):
    arrays, attrs = synthetic_dataset(DISC, n_episodes=3, episode_len=4, seed=3)
    a = write_dataset(tmp_path / "a.h5", arrays, attrs, compression=compression)
    b = write_dataset(tmp_path / "b.h5", arrays, attrs, compression=compression)
    assert a == b
    assert (tmp_path / "a.h5").read_bytes() == (tmp_path / "b.h5").read_bytes()
    assert load_dataset(tmp_path / "b.h5", DISC).sha256 == a


def test_extra_attrs_and_coercion(tmp_path):
    arrays, attrs = synthetic_dataset(CONT, n_episodes=2, episode_len=3, seed=0)
    arrays["obs"] = arrays["obs"].astype(np.float64)
    arrays["terminals"] = arrays["terminals"].astype(bool)
    attrs = dict(attrs, source="omar:simple_spread/seed_0", win_rate=0.5)
    write_dataset(tmp_path / "x.h5", arrays, attrs)
    ds = load_dataset(tmp_path / "x.h5", CONT)
    assert ds.arrays["obs"].dtype == np.float32 and ds.arrays["terminals"].dtype == np.uint8
    assert ds.attrs["source"] == "omar:simple_spread/seed_0" and ds.attrs["win_rate"] == 0.5


def test_truncated_file(tmp_path):
    path, _, _ = _write(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    err = _raises(path, "file", load_dataset, path)
    assert "cannot be read as HDF5 (truncated or corrupt?)" in str(err)


def test_not_hdf5(tmp_path):
    path = tmp_path / "junk.h5"
    path.write_text("hello")
    _raises(path, "file", load_dataset, path)


def test_wrong_shape_vs_spec(tmp_path):
    other = TaskSpec("test-cont", "mpe", 3, 5, 7, 2, False, 10, ("expert",))  # obs_dim 5, not 4
    path, _, _ = _write(tmp_path, other)
    err = _raises(path, "obs", load_dataset, path, CONT)
    assert "(N, 3, 4)" in str(err)


def test_wrong_task(tmp_path):
    path, _, _ = _write(tmp_path)
    spec = TaskSpec("test-other", "mpe", 3, 4, 7, 2, False, 10, ("expert",))
    _raises(path, "attrs.task_id", load_dataset, path, spec)


def test_nan_in_obs(tmp_path):
    path, arrays, attrs = _write(tmp_path)
    import h5py

    with h5py.File(path, "r+") as f:  # corrupt after writing; the writer refuses NaN
        f["obs"][3, 1, 2] = np.nan
    err = _raises(path, "obs", load_dataset, path)
    assert "row 3" in str(err)
    arrays["obs"][3, 1, 2] = np.nan
    _raises(tmp_path / "n.h5", "obs", write_dataset, tmp_path / "n.h5", arrays, attrs)


def test_checksum_mismatch(tmp_path):
    path, _, _ = _write(tmp_path)
    sha = sha256_file(path)
    load_dataset(path, expected_sha256=sha)
    _raises(path, "sha256", load_dataset, path, expected_sha256="0" * 64)


def test_next_obs_mismatch(tmp_path):
    arrays, attrs = synthetic_dataset(CONT, n_episodes=4, episode_len=5, seed=1)
    arrays["next_obs"][6] += 1.0  # episode 1, step 1: no longer obs[7]
    path = tmp_path / "bad.h5"
    err = _raises(path, "next_obs", write_dataset, path, arrays, attrs)
    assert "episode 1" in str(err)
    # The same file written without checks (simulating a broken import) fails on load.
    write_dataset_unchecked(path, arrays, attrs)
    _raises(path, "next_obs", load_dataset, path)
    load_dataset(path, check_episodes=False)  # the episode checks can be skipped


def test_terminal_mid_episode(tmp_path):
    arrays, attrs = synthetic_dataset(CONT, n_episodes=4, episode_len=5, seed=1)
    arrays["terminals"][2] = 1
    path = tmp_path / "bad.h5"
    write_dataset_unchecked(path, arrays, attrs)
    err = _raises(path, "terminals", load_dataset, path)
    assert "row 2" in str(err)


def test_episode_without_end(tmp_path):
    arrays, attrs = synthetic_dataset(CONT, n_episodes=4, episode_len=5, seed=1)
    arrays["timeouts"][4] = 0  # episode 0 ends with a timeout in the synthetic data
    _raises(tmp_path / "b.h5", "terminals", write_dataset, tmp_path / "b.h5", arrays, attrs)


def test_steps_and_episode_ids(tmp_path):
    arrays, attrs = synthetic_dataset(CONT, n_episodes=4, episode_len=5, seed=1)
    bad = dict(arrays, steps=arrays["steps"].copy())
    bad["steps"][3] = 7
    _raises(tmp_path / "b.h5", "steps", write_dataset, tmp_path / "b.h5", bad, attrs)
    bad = dict(arrays, episode_ids=arrays["episode_ids"].copy())
    bad["episode_ids"][5:] += 1  # skips id 1
    _raises(tmp_path / "b.h5", "episode_ids", write_dataset, tmp_path / "b.h5", bad, attrs)
    long = TaskSpec("test-cont", "mpe", 3, 4, 7, 2, False, 4, ("expert",))  # limit 4 < 5 steps
    _raises(tmp_path / "b.h5", "steps", write_dataset, tmp_path / "b.h5", arrays, attrs, spec=long)


def test_next_actions_valid_semantics(tmp_path):
    arrays, attrs = synthetic_dataset(CONT, n_episodes=4, episode_len=5, seed=1)
    bad = dict(arrays, next_actions_valid=arrays["next_actions_valid"].copy())
    bad["next_actions_valid"][1] = 0  # mid-episode: the next action is known there
    bad["next_actions"] = arrays["next_actions"].copy()
    bad["next_actions"][1] = 0
    _raises(tmp_path / "b.h5", "next_actions_valid", write_dataset, tmp_path / "b.h5", bad, attrs)
    bad = dict(arrays, next_actions=arrays["next_actions"].copy())
    bad["next_actions"][9] = 0.5  # episode 1 ends at row 9 with a terminal, valid=0
    err = _raises(tmp_path / "b.h5", "next_actions", write_dataset, tmp_path / "b.h5", bad, attrs)
    assert "zero-filled" in str(err)


def test_discrete_action_not_available(tmp_path):
    arrays, attrs = synthetic_dataset(DISC, n_episodes=4, episode_len=5, seed=2)
    row, agent = 7, 1
    arrays["avail_actions"][row, agent] = 0
    arrays["avail_actions"][row, agent, (arrays["actions"][row, agent] + 1) % DISC.act_dim] = 1
    arrays["next_avail_actions"][row - 1] = arrays["avail_actions"][row]  # keep reconstruction
    path = tmp_path / "bad.h5"
    write_dataset_unchecked(path, arrays, attrs)
    err = _raises(path, "actions", load_dataset, path, DISC)
    assert f"row {row}" in str(err) and "not available" in str(err)


def test_stats_checked(tmp_path):
    arrays, attrs = synthetic_dataset(CONT, n_episodes=2, episode_len=3, seed=0)
    _raises(tmp_path / "b.h5", "attrs.return_mean", write_dataset, tmp_path / "b.h5", arrays,
            dict(attrs, return_mean=attrs["return_mean"] + 1))
    missing = {k: v for k, v in attrs.items() if k != "behaviour_policy_id"}
    _raises(tmp_path / "b.h5", "attrs.behaviour_policy_id", write_dataset, tmp_path / "b.h5", arrays, missing)


def test_atomic_write_keeps_old_file(tmp_path):
    path, arrays, attrs = _write(tmp_path)
    before = path.read_bytes()
    bad = dict(arrays, rewards=arrays["rewards"][:-1])
    with pytest.raises(DatasetError):
        write_dataset(path, bad, attrs)
    assert path.read_bytes() == before
    assert sorted(os.listdir(path.parent)) == [path.name]


def test_atomic_write_cleans_temp_on_crash(tmp_path, monkeypatch):
    path, arrays, attrs = _write(tmp_path)
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        write_dataset(path, arrays, dict(attrs, quality="other"))
    assert path.read_bytes() == before
    assert sorted(os.listdir(path.parent)) == [path.name]


def test_normalised_score():
    attrs = {"ref_return_random": 10.0, "ref_return_expert": 110.0}
    assert normalised_score(60.0, attrs) == pytest.approx(50.0)
    assert normalised_score(110.0, (10.0, 110.0)) == pytest.approx(100.0)
    np.testing.assert_allclose(normalised_score(np.array([10.0, 210.0]), attrs), [0.0, 200.0])
    with pytest.raises(ValueError, match="equal"):
        normalised_score(1.0, (5.0, 5.0))
    with pytest.raises(ValueError, match="not defined"):
        normalised_score(1.0, (float("nan"), 5.0))


def test_manifest_bad_json(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    err = _raises(tmp_path / "manifest.json", "json", manifest.read_manifest, tmp_path)
    assert "line 1" in str(err)
    (tmp_path / "manifest.json").write_text('{"a/b": {"file": "a/b.h5"}}')
    _raises(tmp_path / "manifest.json", "a/b.sha256", manifest.lookup, tmp_path, "a", "b")


def test_manifest_lookup_missing(tmp_path):
    assert manifest.lookup(tmp_path, "test-cont", "expert") is None
    _raises(tmp_path / "manifest.json", "test-cont/expert", manifest.require, tmp_path, "test-cont", "expert")
    _raises(tmp_path / "manifest.json", "test-cont/expert", manifest.load, tmp_path, "test-cont", "expert")


def test_manifest_checksum_detects_changed_file(tmp_path):
    path, arrays, attrs = _write(tmp_path, name="expert.h5")
    manifest.record(tmp_path, manifest.make_entry(tmp_path, path, sha256_file(path), "smoke"))
    arrays["rewards"] = arrays["rewards"] * 2
    attrs = {k: v for k, v in attrs.items() if not k.startswith("return_")}
    write_dataset(path, arrays, attrs)  # rebuilt without recording it
    _raises(path, "sha256", manifest.load, tmp_path, CONT.task_id, attrs["quality"])


def _record_many(data_dir: str, task: str, n: int) -> None:
    for i in range(n):
        manifest.record(data_dir, {
            "file": f"{task}/t{i}.h5", "sha256": "0" * 64, "size_bytes": 1, "task_id": task,
            "quality": f"t{i}", "format_version": 1, "n_transitions": 1, "n_episodes": 1,
        })  # fmt: skip


def test_manifest_concurrent_records(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_record_many, args=(str(tmp_path), f"task{p}", 15)) for p in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    entries = manifest.read_manifest(tmp_path)
    assert len(entries) == 30
    assert set(entries) == {f"task{p}/t{i}" for p in range(2) for i in range(15)}
    doc = json.loads((tmp_path / "manifest.json").read_text())
    assert set(doc) == set(entries)  # flat: "<task_id>/<tier>" -> entry
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def write_dataset_unchecked(path: Path, arrays: dict, attrs: dict) -> None:
    """Write a v1-shaped file bypassing validation (to test the loader's checks)."""
    import h5py

    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f.create_dataset(k, data=v)
        for k, v in attrs.items():
            f.attrs[k] = json.dumps(v) if isinstance(v, dict) else v

"""Importers: OMAR's per-agent .npy layout and CFCQL's SMAC .h5 -> format v1, on fixture files
written here in those layouts; malformed files give one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from plcql_bench.datasets import manifest
from plcql_bench.datasets.format import DatasetError, load_dataset
from plcql_bench.datasets.importers import import_dataset, read_cfcql_h5, read_omar
from plcql_bench.suite.envs import prey as prey_mod
from plcql_bench.suite.core.spec import TaskSpec
from plcql_bench.suite.envs.tasks import SMAC_TIERS, get_task


def _omar_from_env(task_id: str, root: Path, episodes: int = 4, with_prey: bool = False,
                   seed: int = 0) -> dict:
    """Roll our env with random actions and store it in OMAR's layout; returns the truth."""
    task = get_task(task_id)
    env = task.make_env(episodes)
    rng = np.random.default_rng(seed)
    step = env.reset(np.arange(episodes) + 100)
    rows = []
    for _ in range(task.spec.episode_limit):
        act = rng.uniform(-1.2, 1.2, (episodes, 3, 2)).astype(np.float32)  # some out of range
        nxt = env.step(act)
        rows.append((step, act, nxt))
        step = nxt
    d = root / f"seed_{seed}_data"
    d.mkdir(parents=True)

    def major(x):  # [T][B, ...] -> [B*T, ...] episode by episode
        return np.stack(x, 1).reshape((-1,) + x[0].shape[1:])

    obs, nobs = major([r[0].obs for r in rows]), major([r[2].obs for r in rows])
    acs = major([r[1] for r in rows])
    rews = major([r[2].info["agent_rewards"] for r in rows])
    state, nstate = major([r[0].state for r in rows]), major([r[2].state for r in rows])
    dones = major([r[2].done for r in rows])
    for i in range(3):
        np.save(d / f"obs_{i}.npy", obs[:, i])
        np.save(d / f"next_obs_{i}.npy", nobs[:, i])
        np.save(d / f"acs_{i}.npy", acs[:, i])
        np.save(d / f"rews_{i}.npy", rews[:, i:i + 1])
        np.save(d / f"dones_{i}.npy", dones[:, None])
    if with_prey:  # OMAR's buffer also stores the prey as agent 3
        np.save(d / "obs_3.npy", state[:, 48:])
        np.save(d / "next_obs_3.npy", nstate[:, 48:])
    return {"obs": obs, "actions": acs, "rewards": rews.mean(1), "agent_rewards": rews, "state": state,
            "next_state": nstate, "dir": d}


def test_omar_cn(tmp_path):
    truth = _omar_from_env("mpe-cn", tmp_path / "src")
    spec = get_task("mpe-cn").spec
    entry = import_dataset("auto", tmp_path / "src", spec, "expert", tmp_path / "data", profile="paper")
    ds = manifest.load(tmp_path / "data", "mpe-cn", "expert", spec)
    a = ds.arrays
    np.testing.assert_array_equal(a["obs"], truth["obs"])
    np.testing.assert_array_equal(a["state"], truth["state"])
    np.testing.assert_allclose(a["rewards"], truth["rewards"], rtol=1e-6)
    np.testing.assert_array_equal(a["agent_rewards"], truth["agent_rewards"])  # each learner's own (format v2)
    assert ds.attrs["format_version"] == 2 and (a["agent_rewards"] != a["rewards"][:, None]).any()
    np.testing.assert_array_equal(a["actions"], np.clip(truth["actions"], -1, 1))
    assert ds.attrs["actions_clipped"] > 0
    last = a["steps"] == 24
    assert a["timeouts"][last].all() and not a["timeouts"][~last].any() and not a["terminals"].any()
    assert (a["next_actions_valid"][last] == 0).all() and (a["next_actions"][last] == 0).all()
    inner = np.flatnonzero(~last)
    np.testing.assert_array_equal(a["next_actions"][inner], a["actions"][inner + 1])
    assert ds.attrs["ref_return_expert"] == 516.8 and ds.attrs["ref_return_random"] == 159.8
    assert "MADiff" in ds.attrs["ref_return_source"]
    assert entry["n_episodes"] == 4 and entry["source"].startswith("omar-npy:")


@pytest.mark.parametrize("with_prey", [False, True])
def test_omar_pp_state_and_prey_file(tmp_path, with_prey):
    truth = _omar_from_env("mpe-pp", tmp_path / "src", with_prey=with_prey)
    spec = get_task("mpe-pp").spec
    arrays, info = read_omar(tmp_path / "src", spec)
    # the state (predators' obs + prey obs) is rebuilt exactly enough from the predators' obs
    np.testing.assert_allclose(arrays["state"], truth["state"], atol=1e-5)
    np.testing.assert_allclose(arrays["next_state"], truth["next_state"], atol=1e-5)
    prey = prey_mod.default_prey_path("mpe-pp")
    entry = import_dataset("omar-npy", tmp_path / "src", spec, "medium", tmp_path / "data",
                           profile="paper", prey_file=prey)
    assert (tmp_path / "data" / entry["prey_file"]).read_bytes() == prey.read_bytes()
    assert entry["env_versions"]["prey"].startswith("prey_mpe-pp.pt:sha256=")
    assert entry["ref_return_expert"] == 185.6


def test_omar_halfcheetah_layout(tmp_path):
    spec = TaskSpec("mamujoco-halfcheetah-2x3", "mamujoco", 2, 6, 17, 3, False, 1000,
                    ("expert", "medium", "medium-replay", "random"))
    rng = np.random.default_rng(0)
    e, t = 2, 1000
    obs_full = rng.normal(size=(e, t + 1, 2, 6)).astype(np.float32)
    st_full = rng.normal(size=(e, t + 1, 17)).astype(np.float32)
    d = tmp_path / "seed_0_data"
    d.mkdir()
    for i in range(2):
        np.save(d / f"obs_{i}.npy", obs_full[:, :t, i].reshape(-1, 6))
        np.save(d / f"next_obs_{i}.npy", obs_full[:, 1:, i].reshape(-1, 6))
        np.save(d / f"acs_{i}.npy", rng.uniform(-1, 1, (e * t, 3)).astype(np.float32))
        np.save(d / f"rews_{i}.npy", np.full((e * t, 1), 0.5, np.float32))
        np.save(d / f"dones_{i}.npy", np.zeros((e * t, 1), bool))
        np.save(d / f"states_{i}.npy", st_full[:, :t].reshape(-1, 17))
        np.save(d / f"next_states_{i}.npy", st_full[:, 1:].reshape(-1, 17))
    arrays, _ = read_omar(tmp_path, spec)
    np.testing.assert_array_equal(arrays["next_state"][999], st_full[0, t])
    assert arrays["timeouts"].sum() == 2 and arrays["next_actions_valid"].sum() == e * t - 2
    entry = import_dataset("omar-npy", d, spec, "random", tmp_path / "data", profile="paper")
    assert entry["return_mean"] == pytest.approx(500.0) and entry["ref_return_random"] == -283.97


def _smac_spec(limit: int = 8) -> TaskSpec:
    return TaskSpec("smac-fixture", "smac", 3, 5, 7, 6, True, limit, SMAC_TIERS, score="win_rate")


def _write_cfcql(path: Path, lengths=(3, 8, 5), terminated=(True, False, True), drop=None):
    """pymarl EpisodeBatch layout: slots 0..L-1 transitions, slot L the final state (filled)."""
    spec = _smac_spec()
    rng = np.random.default_rng(0)
    e, t1 = len(lengths), spec.episode_limit + 1
    data = {
        "state": rng.normal(size=(e, t1, 7)), "obs": rng.normal(size=(e, t1, 3, 5)),
        "avail_actions": np.ones((e, t1, 3, 6), np.int32),
        "actions": rng.integers(0, 6, (e, t1, 3, 1)), "probs": np.full((e, t1, 3, 6), 1 / 6),
        "reward": rng.uniform(0, 1, (e, t1, 1)), "terminated": np.zeros((e, t1, 1), np.uint8),
        "filled": np.zeros((e, t1, 1), np.int64),
    }
    data["avail_actions"][:, :, :, 5] = 0
    data["actions"] = np.minimum(data["actions"], 4)
    for k, (L, term) in enumerate(zip(lengths, terminated)):
        data["filled"][k, :L + 1] = 1
        data["terminated"][k, L - 1] = int(term)
        for key in data:  # padding is zeros, as in pymarl
            if key not in ("filled", "terminated"):
                data[key][k, L + 1:] = 0
    with h5py.File(path, "w") as f:
        for k, v in data.items():
            if k != drop:
                f[k] = v
    return data


def test_cfcql_h5(tmp_path):
    src = tmp_path / "fixture_medium.h5"
    raw = _write_cfcql(src)
    spec = _smac_spec()
    a = read_cfcql_h5(src, spec)
    assert len(a["rewards"]) == 3 + 8 + 5
    np.testing.assert_array_equal(a["episode_ids"], np.repeat([0, 1, 2], [3, 8, 5]))
    ends = np.cumsum([3, 8, 5]) - 1
    assert a["terminals"][ends].tolist() == [1, 0, 1] and a["timeouts"][ends].tolist() == [0, 1, 0]
    assert a["terminals"].sum() == 2 and a["timeouts"].sum() == 1
    # the final next_obs of episode 0 is slot L = 3, which pymarl fills with the final state
    np.testing.assert_allclose(a["next_obs"][2], raw["obs"][0, 3], rtol=1e-6)
    np.testing.assert_array_equal(a["actions"][:3], raw["actions"][0, :3, :, 0])
    assert (a["next_actions_valid"][ends] == 0).all() and (a["next_actions"][ends] == 0).all()
    np.testing.assert_array_equal(a["next_actions"][0], a["actions"][1])
    assert a["behaviour_probs"].shape == (16, 3, 6)
    entry = import_dataset("auto", src, spec, "medium_replay", tmp_path / "data", profile="paper")
    ds = load_dataset(tmp_path / "data" / entry["file"], spec=spec)
    assert ds.attrs["quality"] == "medium-replay" and np.isnan(ds.attrs["ref_return_expert"])


@pytest.mark.parametrize("case,field", [
    ("missing_key", "filled"), ("bad_shape", "obs"), ("early_terminal", "terminated"),
    ("not_h5", "file"), ("unavailable", "actions"),
])
def test_cfcql_malformed(tmp_path, case, field):
    src = tmp_path / "bad.h5"
    if case == "missing_key":
        _write_cfcql(src, drop="filled")
    elif case == "not_h5":
        src.write_bytes(b"not an hdf5 file")
    else:
        _write_cfcql(src)
        with h5py.File(src, "r+") as f:
            if case == "bad_shape":
                del f["obs"]
                f["obs"] = np.zeros((3, 9, 3, 4))
            elif case == "early_terminal":
                f["terminated"][1, 2, 0] = 1
            elif case == "unavailable":
                av = f["avail_actions"][()]
                av[0, 0, 0, :] = 0
                av[0, 0, 0, 5] = 1
                f["avail_actions"][...] = av
    with pytest.raises(DatasetError) as err:
        read_cfcql_h5(src, _smac_spec())
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(str(src)) and f": {field}:" in msg


def _cli(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "plcql_bench.suite.commands.main", "--data-dir", str(tmp / "data"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_cli_import_and_malformed(tmp_path):
    truth = _omar_from_env("mpe-cn", tmp_path / "src", episodes=2)
    ok = _cli(tmp_path, "datasets", "import", "mpe-cn", "random", str(tmp_path / "src"))
    assert ok.returncode == 0, ok.stderr
    assert "imported 50 transitions" in ok.stdout
    assert manifest.lookup(tmp_path / "data" / "paper", "mpe-cn", "random")
    # malformed: wrong width in one agent's file -> one line naming the file and field, exit 2
    np.save(truth["dir"] / "acs_1.npy", np.zeros((50, 5), np.float32))
    bad = _cli(tmp_path, "datasets", "import", "mpe-cn", "expert", str(tmp_path / "src"))
    assert bad.returncode == 2
    line = bad.stderr.strip()
    assert "\n" not in line and "acs_1.npy: acs: shape (50, 5)" in line
    # a done flag inside an episode
    np.save(truth["dir"] / "acs_1.npy", np.zeros((50, 2), np.float32))
    dn = np.zeros((50, 1), bool)
    dn[3] = True
    np.save(truth["dir"] / "dones_2.npy", dn)
    bad = _cli(tmp_path, "datasets", "import", "mpe-cn", "expert", str(tmp_path / "src"))
    assert bad.returncode == 2 and "dones_2.npy: dones: row 3" in bad.stderr
    # garbage passed as a CFCQL file
    junk = tmp_path / "junk.h5"
    junk.write_text("junk")
    bad = _cli(tmp_path, "datasets", "import", "mpe-cn", "expert", str(junk))
    assert bad.returncode == 2 and "junk.h5: file: cannot be read as HDF5" in bad.stderr
    # unknown tier
    bad = _cli(tmp_path, "datasets", "import", "mpe-cn", "mixed", str(tmp_path / "src"))
    assert bad.returncode == 2 and "unknown tier" in bad.stderr

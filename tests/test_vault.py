"""OG-MARL Vaults in and out (datasets/vault.py): vaults written by flashbax here, in OG-MARL's layout (one
vault per task, one uid per tier), import into the suite's format with a card and train in `all` through a
profile that names them, their results labelled with the source; our tiers export as vaults flashbax reads
back, and our tier -> vault -> our tier gives identical arrays."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flashbax", reason="the [vault] extra (in dev: make test installs it)")

from plcql_bench.datasets import format as fmt  # noqa: E402
from plcql_bench.datasets import manifest  # noqa: E402
from plcql_bench.suite.envs.tasks import get_task  # noqa: E402
from cli_main import run_cli  # noqa: E402

EPISODE = 25  # MPE's episode length
PROFILE = """
name: vaulttest
description: trains on an imported OG-MARL vault
datasets:
  import:
    mpe-cn/random: {format: vault, path: vaults/omar/mpe/simple_spread.vlt, uid: Random}
train: {updates: {default: 2}, eval_every: 2, eval_episodes: 1, final_eval_episodes: 2, checkpoint_every: 2}
matrix: {algos: [bc], tasks: [mpe-cn], tiers: [random], seeds: [0]}
algo_overrides: {batch_size: 16, hidden: 16}
"""


def _ogmarl_experience(rng, rows: int, n: int, obs: int, state: int, act: int | None, n_actions: int = 0) -> dict:
    """OG-MARL's experience for `rows` timesteps: full episodes of EPISODE steps ended by truncation, then a
    last episode cut by the end of the data (no flag)."""
    truncations = np.zeros((rows, n), bool)
    truncations[EPISODE - 1:rows - rows % EPISODE:EPISODE] = True
    experience = {
        "observations": rng.normal(size=(rows, n, obs)).astype(np.float32),
        "rewards": rng.normal(size=(rows, n)).astype(np.float32),  # per agent (CN's differ)
        "terminals": np.zeros((rows, n), bool), "truncations": truncations,
        "infos": {"state": rng.normal(size=(rows, state)).astype(np.float32)},
    }
    if act is None:  # discrete: an available action index per agent
        legals = (rng.random((rows, n, n_actions)) < 0.6).astype(np.float32)
        legals[..., 0] = 1
        experience["actions"] = np.stack([[rng.choice(np.flatnonzero(legals[t, i])) for i in range(n)]
                                          for t in range(rows)]).astype(np.int32)
        experience["infos"]["legals"] = legals
    else:  # continuous, some components outside [-1, 1] (OMAR's behaviour actions were not clipped)
        experience["actions"] = rng.uniform(-1.2, 1.2, size=(rows, n, act)).astype(np.float32)
    return experience


def _write_with_flashbax(vault_dir: Path, uid: str, experience: dict) -> None:
    """Record `experience` the way OG-MARL does: a flashbax trajectory buffer, then a Vault written from it."""
    import jax
    import jax.numpy as jnp
    import flashbax as fbx
    from flashbax.vault import Vault

    rows = len(experience["rewards"])
    buffer = fbx.make_trajectory_buffer(add_batch_size=1, sample_batch_size=1, sample_sequence_length=1, period=1,
                                        min_length_time_axis=1, max_length_time_axis=rows + 1)  # not full: no wrap
    timestep = jax.tree_util.tree_map(lambda a: jnp.asarray(a[0]), experience)
    state = buffer.add(buffer.init(timestep), jax.tree_util.tree_map(lambda a: jnp.asarray(a)[None], experience))
    vault = Vault(vault_name=vault_dir.name, rel_dir=str(vault_dir.parent), vault_uid=uid,
                  experience_structure=state.experience)
    assert vault.write(state) == rows


def test_an_ogmarl_vault_imports_trains_in_all_and_labels_its_results(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    spec = get_task("mpe-cn").spec
    vault = tmp_path / "vaults" / "omar" / "mpe" / "simple_spread.vlt"  # OG-MARL's layout: one vault per task
    experience = _ogmarl_experience(np.random.default_rng(0), 4 * EPISODE + 10, 3, spec.obs_dim, spec.state_dim,
                                    spec.act_dim)
    _write_with_flashbax(vault, "Random", experience)
    _write_with_flashbax(vault, "Expert", _ogmarl_experience(np.random.default_rng(1), 2 * EPISODE, 3, spec.obs_dim,
                                                             spec.state_dim, spec.act_dim))
    (tmp_path / "p.yaml").write_text(PROFILE)
    base = ["--data-dir", str(tmp_path / "data"), "--results-dir", str(tmp_path / "res")]

    code, out, err = run_cli(monkeypatch, capsys, *base, "all", "--profile", str(tmp_path / "p.yaml"), "--jobs", "1")
    assert code == 0, out + err
    assert "1 cells: trained 1" in out

    root = tmp_path / "data" / "vaulttest"
    entry = manifest.lookup(root, "mpe-cn", "random")
    assert entry["source"] == f"vault:{vault}#Random"
    assert f"vault:{vault}#Random" in (root / "mpe-cn" / "random.card.md").read_text()  # the dataset's card
    data = fmt.load_dataset(root / entry["file"], spec=spec, expected_sha256=entry["sha256"])
    a = data.arrays
    rows = len(experience["rewards"])
    assert data.n_transitions == rows and data.n_episodes == 5
    assert np.array_equal(a["obs"], experience["observations"])
    assert np.array_equal(a["state"], experience["infos"]["state"])
    assert np.array_equal(a["actions"], np.clip(experience["actions"], -1, 1))
    assert data.attrs["actions_clipped"] == int((np.abs(experience["actions"]) > 1).sum()) > 0
    assert np.allclose(a["rewards"], experience["rewards"].mean(axis=1))  # the team reward: the agents' mean
    assert np.array_equal(a["agent_rewards"], experience["rewards"])
    ends = np.flatnonzero(a["timeouts"])
    assert list(ends) == [24, 49, 74, 99, rows - 1] and not a["terminals"].any()  # the cut last episode too
    assert list(a["steps"][95:]) == list(range(20, 25)) + list(range(10))
    inner = np.setdiff1d(np.arange(rows), ends)
    assert np.array_equal(a["next_obs"][inner], a["obs"][inner + 1])
    assert np.array_equal(a["next_obs"][ends], a["obs"][ends]) and data.attrs["vault_next_at_episode_end"] == "repeated"
    assert not a["next_actions_valid"][ends].any() and a["next_actions_valid"][inner].all()

    (final,) = (tmp_path / "res" / "vaulttest" / "bc" / "mpe-cn" / "random").glob("seed0-*/final.json")
    record = json.loads(final.read_text())
    assert record["dataset_source"] == f"vault:{vault}#Random" and record["dataset_sha256"] == entry["sha256"]

    from plcql_bench.leaderboard.build import build
    from plcql_bench.suite.runs import api

    assert api.results_frame(tmp_path / "res").loc[0, "dataset_source"] == f"vault:{vault}#Random"
    build(tmp_path / "res", tmp_path / "site", bootstrap_reps=20, poi_reps=20)
    assert f'<span title="vault:{vault}#Random">imported: vault</span>' in (tmp_path / "site" / "index.html").read_text()

    # the CLI import picks the uid that names the tier (Expert for expert); errors are one line
    code, out, err = run_cli(monkeypatch, capsys, *base, "datasets", "import", "mpe-cn", "expert", str(vault),
                             "--profile", "smoke")
    assert code == 0 and "imported 50 transitions (2 episodes)" in out, err
    code, _, err = run_cli(monkeypatch, capsys, *base, "datasets", "import", "mpe-cn", "medium", str(vault),
                           "--profile", "smoke")
    assert code == 2 and err.count("\n") == 1 and "no uid names tier 'medium' (uids: Expert, Random); pass --uid" in err


def test_a_discrete_vault_keeps_the_legal_actions(tmp_path):
    from plcql_bench.datasets.vault import import_vault

    spec = get_task("smax-3s_vs_5z").spec
    experience = _ogmarl_experience(np.random.default_rng(2), 2 * EPISODE, spec.n_agents, spec.obs_dim,
                                    spec.state_dim, None, spec.act_dim)
    _write_with_flashbax(tmp_path / "3s_vs_5z.vlt", "Medium", experience)
    entry = import_vault(tmp_path / "3s_vs_5z.vlt", spec, "medium", tmp_path / "data", profile="x")
    a = fmt.load_dataset(tmp_path / "data" / entry["file"], spec=spec).arrays
    assert np.array_equal(a["actions"], experience["actions"]) and a["actions"].dtype == np.int64
    assert np.array_equal(a["avail_actions"], experience["infos"]["legals"].astype(np.uint8))
    assert np.array_equal(a["next_avail_actions"][:EPISODE - 1], a["avail_actions"][1:EPISODE])


def test_our_tier_round_trips_through_a_vault_flashbax_reads(tmp_path, monkeypatch, capsys):
    import jax
    from flashbax.vault import Vault

    from plcql_bench.datasets.build import build_dataset

    spec = get_task("mpe-cn").spec
    base = ["--data-dir", str(tmp_path / "data")]
    built = build_dataset("mpe-cn", "random", 4, tmp_path / "data" / "smoke", profile="smoke")
    ours = fmt.load_dataset(tmp_path / "data" / "smoke" / built["file"])
    code, out, err = run_cli(monkeypatch, capsys, *base, "datasets", "export", "mpe-cn", "random", "--format", "vault",
                             "--out", str(tmp_path / "vaults"))
    assert code == 0, err
    vault = tmp_path / "vaults" / "mpe-cn.vlt"
    assert f"from {tmp_path / 'data' / 'smoke' / built['file']} -> vault {vault / 'random'}" in out

    # flashbax reads it back with the same contents, in OG-MARL's layout
    read = Vault(vault_name=vault.name, rel_dir=str(vault.parent), vault_uid="random").read()
    got = jax.tree_util.tree_map(lambda x: np.asarray(x)[0], read.experience)
    assert len(got["observations"]) == ours.n_transitions  # (a read state is a full buffer of them)
    assert np.array_equal(got["observations"], ours.arrays["obs"])
    assert np.array_equal(got["actions"], ours.arrays["actions"])
    assert np.array_equal(got["infos"]["state"], ours.arrays["state"])
    assert np.array_equal(got["rewards"], np.repeat(ours.arrays["rewards"][:, None], 3, axis=1))
    assert np.array_equal(got["truncations"].all(axis=1), ours.arrays["timeouts"].astype(bool))

    # and our import gives back the same arrays, every one of them
    code, _, err = run_cli(monkeypatch, capsys, *base, "datasets", "import", "mpe-cn", "random", str(vault),
                           "--format", "vault", "--profile", "paper")
    assert code == 0, err
    back = fmt.load_dataset(tmp_path / "data" / "paper" / manifest.lookup(tmp_path / "data" / "paper", "mpe-cn",
                                                                          "random")["file"], spec=spec)
    assert sorted(back.arrays) == sorted(ours.arrays)
    for name, array in ours.arrays.items():
        assert back.arrays[name].dtype == array.dtype and np.array_equal(back.arrays[name], array), name
    for key in ("ref_return_random", "ref_return_expert", "behaviour_policy_id", "generator_seed", "return_mean"):
        assert back.attrs[key] == ours.attrs[key], key
    assert back.attrs["source"] == f"vault:{vault}#random"

    # a second export to the same uid is refused (nothing replaced), --force replaces it
    code, _, err = run_cli(monkeypatch, capsys, *base, "datasets", "export", "mpe-cn", "random", "--out",
                           str(tmp_path / "vaults"))
    assert code == 2 and "uid: exists already (--force replaces it)" in err
    assert run_cli(monkeypatch, capsys, *base, "datasets", "export", "mpe-cn", "random", "--out",
                   str(tmp_path / "vaults"), "--force")[0] == 0
    assert sorted(p.name for p in vault.iterdir()) == ["random"]  # no temp folder left behind


@pytest.mark.parametrize("datasets, says", [
    ("{import: {mpe-cn/expret: {path: v.vlt}}}", "datasets.import.mpe-cn/expret: unknown tier"),
    ("{import: {mpe-cn/expert: {uid: Expert}}}", "datasets.import.mpe-cn/expert.path: required key missing"),
    ("{import: {mpe-cn/expert: {path: v.vlt, format: parquet}}}", "format: must be auto, vault, omar-npy or cfcql-h5"),
    ("{from: paper, import: {mpe-cn/expert: {path: v.vlt}}}", "give either 'from: <profile>' or 'episodes'"),
])
def test_a_profiles_imports_are_checked_when_it_loads(tmp_path, datasets, says):
    from plcql_bench.suite.core.errors import BenchError
    from plcql_bench.suite.runs.profiles import load_profile

    (tmp_path / "p.yaml").write_text(PROFILE.replace(PROFILE[PROFILE.index("datasets:"):PROFILE.index("train:")],
                                                     f"datasets: {datasets}\n"))
    with pytest.raises(BenchError) as err:
        load_profile(str(tmp_path / "p.yaml"))
    assert says in str(err.value) and str(tmp_path / "p.yaml") in str(err.value)


def test_a_profiles_import_path_is_taken_from_its_folder(tmp_path, monkeypatch, capsys):
    from plcql_bench.suite.runs.profiles import load_profile

    (tmp_path / "p.yaml").write_text(PROFILE)
    profile = load_profile(str(tmp_path / "p.yaml"))
    assert profile.import_for("mpe-cn", "random") == {
        "format": "vault", "path": str(tmp_path / "vaults/omar/mpe/simple_spread.vlt"), "uid": "Random", "seed": 0}
    assert profile.import_for("mpe-cn", "expert") is None
    # plan names the missing source as the reason the cell cannot run
    code, out, _ = run_cli(monkeypatch, capsys, "--data-dir", str(tmp_path / "d"), "--results-dir", str(tmp_path / "r"),
                           "plan", "--profile", str(tmp_path / "p.yaml"))
    assert code == 0 and f"the profile imports it from {tmp_path / 'vaults/omar/mpe/simple_spread.vlt'}, which is not there" in out

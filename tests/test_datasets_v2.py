"""The v2 dataset generation (issue: datasets v2): OMAR's prey found and checked, uniform random tiers,
format v2 with per-agent rewards (and v1 still read), deterministic builds, the rewards each algorithm
trains on, and the comparison with the originals' statistics."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from plcql_bench.datasets import format as fmt
from plcql_bench.datasets import originals
from plcql_bench.datasets.build import build_dataset
from plcql_bench.suite.core.spec import TaskSpec
from plcql_bench.suite.envs import prey
from plcql_bench.suite.envs.tasks import get_task

SHARED_PREY = Path(__file__).resolve().parents[2] / "shared" / "data" / "omar-prey"
needs_omar_prey = pytest.mark.skipif(
    not (SHARED_PREY / prey.OMAR_PREY_FILES["mpe-pp"][0]).is_file(),
    reason=f"OMAR's prey is not in {SHARED_PREY} (fetched data, never committed)")
V2_PROFILE = """name: v2test
datasets: {episodes: {default: 12}, generation: v2}
train: {updates: 2, eval_every: 1, eval_episodes: 2, final_eval_episodes: 2, checkpoint_every: 1}
matrix: {algos: [bc], tasks: [mpe-cn], tiers: [random], seeds: [0]}
"""


# ------------------------------------------------------------------------------------- OMAR's prey
def test_missing_omar_prey_names_the_file_its_sha256_and_where_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv(prey.OMAR_PREY_ENV, str(tmp_path))
    with pytest.raises(prey.PreyUnavailable) as err:
        prey.omar_prey_path("mpe-pp")
    msg = str(err.value)
    name, sha = prey.OMAR_PREY_FILES["mpe-pp"]
    assert "\n" not in msg and name in msg and sha in msg and str(tmp_path) in msg
    assert "og-marl" in msg and prey.OMAR_PREY_ENV in msg


def test_a_prey_file_with_another_sha256_is_refused(tmp_path, monkeypatch):
    name, sha = prey.OMAR_PREY_FILES["mpe-world"]
    (tmp_path / name).write_bytes(b"not the published prey")
    monkeypatch.setenv(prey.OMAR_PREY_ENV, str(tmp_path))
    with pytest.raises(prey.PreyUnavailable, match="expected OMAR's") as err:
        prey.omar_prey_path("mpe-world")
    assert hashlib.sha256(b"not the published prey").hexdigest() in str(err.value) and sha in str(err.value)


def test_an_omar_prey_task_never_falls_back_to_the_suite_prey(tmp_path, monkeypatch):
    monkeypatch.setenv(prey.OMAR_PREY_ENV, str(tmp_path))
    task = get_task("mpe-pp", prey="omar")
    assert task.spec.env_versions()["prey"].startswith("omar:")  # named without the file
    with pytest.raises(prey.PreyUnavailable):
        task.make_env(2)  # ... but no env without it


@needs_omar_prey
def test_omar_prey_is_read_checked_and_recorded(monkeypatch):
    monkeypatch.setenv(prey.OMAR_PREY_ENV, str(SHARED_PREY))
    for task_id, (name, sha) in prey.OMAR_PREY_FILES.items():
        assert prey.omar_prey_path(task_id) == SHARED_PREY / name
        task = get_task(task_id, prey="omar")
        assert task.spec.env_versions()["prey"] == f"omar:{name}:sha256={sha}"
        assert prey.prey_kind(task.spec.env_versions()) == "omar"
        assert prey.prey_kind(get_task(task_id).spec.env_versions()) == "suite"
        env = task.make_env(4)
        env.reset(np.arange(4))
        assert np.isfinite(env.step(np.zeros((4, 3, 2), np.float32)).reward).all()


def test_prey_kind_recognises_an_imported_omar_prey_by_its_digest():
    name, sha = prey.OMAR_PREY_FILES["mpe-pp"]
    assert prey.prey_kind({"prey": f"{name}:sha256={sha[:16]}"}) == "omar"  # importers record a prefix
    assert prey.prey_kind({"prey": "prey_mpe-pp.pt:sha256=3f41d0c78c8dbc46"}) == "suite"
    assert prey.prey_kind({}) == "suite"


def test_a_v2_build_without_omar_prey_stops_with_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "v2.yaml").write_text(V2_PROFILE)
    env = {"PLCQL_OMAR_PREY_DIR": str(tmp_path / "no-prey-here"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "plcql_bench.suite.commands.main", "--data-dir", str(tmp_path / "data"),
                           "datasets", "build", "mpe-pp", "random", "--profile", str(tmp_path / "v2.yaml")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "simple_tag_pretrained_adv_model.pt" in lines[0] and "Traceback" not in proc.stderr
    assert not list((tmp_path / "data").rglob("*.h5"))


# ---------------------------------------------------------------------------- uniform random, v2 file
@pytest.fixture
def v2_behaviour(tmp_path, monkeypatch):
    """A behaviour folder whose v2 index names an expert (the v1 CN and PP experts stand in): what the v2
    reference returns need, independent of the committed v2 assets."""
    import shutil

    from plcql_bench.datasets.matd3 import ASSETS_DIR, BEHAVIOUR_DIR_ENV

    root = tmp_path / "behaviour"
    for task in ("mpe-cn", "mpe-pp"):
        (root / task).mkdir(parents=True)
        shutil.copyfile(ASSETS_DIR / task / "expert.pt", root / task / "expert.pt")
        (root / task / "index-v2.json").write_text(json.dumps({
            "trainer": "plcql-bench-matd3-1", "tiers": {"random": {"policy": "uniform"}, "expert": {
                "checkpoint": "expert.pt", "env_steps": 1, "return": 0.0, "noise": 0.3}}}))
    monkeypatch.setenv(BEHAVIOUR_DIR_ENV, str(root))
    return root


def test_v2_random_tier_is_uniform_actions_with_per_agent_rewards(v2_behaviour, tmp_path):
    entry = build_dataset("mpe-cn", "random", 40, tmp_path, profile="v2test", generation_name="v2")
    ds = fmt.load_dataset(tmp_path / entry["file"], spec=get_task("mpe-cn").spec)
    assert ds.attrs["format_version"] == 2 and ds.attrs["generation"] == "v2"
    assert entry["behaviour_policy_id"].startswith("uniform-random")
    acts = ds.arrays["actions"].reshape(-1, 2)
    assert np.allclose(acts.std(axis=0), 1 / np.sqrt(3), atol=0.03)  # U(-1, 1): std 0.577
    assert np.allclose(acts.mean(axis=0), 0.0, atol=0.03)
    per_agent = ds.agent_rewards()
    assert per_agent.shape == (ds.n_transitions, 3)
    assert np.allclose(per_agent.mean(axis=1), ds.arrays["rewards"], atol=1e-5)
    a0 = fmt.episode_returns(per_agent[:, 0], ds.arrays["episode_ids"])
    assert entry["agent0_returns"]["mean"] == pytest.approx(a0.mean())


def test_v1_random_tier_is_unchanged_by_v2(tmp_path):
    entry = build_dataset("mpe-cn", "random", 8, tmp_path, profile="v1test")
    ds = fmt.load_dataset(tmp_path / entry["file"])
    assert ds.attrs["format_version"] == 1 and "generation" not in ds.attrs and not ds.has_agent_rewards
    assert entry["behaviour_policy_id"].startswith("matd3:mpe-cn/random")  # the step-0 actor, as before
    assert np.array_equal(ds.agent_rewards(), np.repeat(ds.arrays["rewards"][:, None], 3, axis=1))


def test_a_second_v2_build_gives_the_same_sha256(v2_behaviour, tmp_path):
    first = build_dataset("mpe-cn", "random", 12, tmp_path / "a", profile="v2test", generation_name="v2")
    second = build_dataset("mpe-cn", "random", 12, tmp_path / "b", profile="v2test", generation_name="v2")
    assert first["sha256"] == second["sha256"]


@needs_omar_prey
def test_v2_predator_prey_random_is_collected_against_omars_prey(v2_behaviour, tmp_path, monkeypatch):
    monkeypatch.setenv(prey.OMAR_PREY_ENV, str(SHARED_PREY))
    entry = build_dataset("mpe-pp", "random", 12, tmp_path, profile="v2test", generation_name="v2")
    name, sha = prey.OMAR_PREY_FILES["mpe-pp"]
    assert entry["env_versions"]["prey"] == f"omar:{name}:sha256={sha}"


# ------------------------------------------------------------------------------------- format v2
def _spec() -> TaskSpec:
    return TaskSpec(task_id="toy", domain="test", n_agents=3, obs_dim=4, state_dim=5, act_dim=2,
                    discrete=False, episode_limit=10, tiers=("synthetic",))


def _v2_arrays(seed: int = 0):
    arrays, attrs = fmt.synthetic_dataset(_spec(), n_episodes=3, episode_len=4, seed=seed)
    rng = np.random.default_rng(seed)
    per_agent = (arrays["rewards"][:, None] + rng.normal(0, 0.1, (len(arrays["rewards"]), 3))).astype(np.float32)
    per_agent -= per_agent.mean(axis=1, keepdims=True) - arrays["rewards"][:, None]
    arrays[fmt.AGENT_REWARDS] = per_agent.astype(np.float32)
    return arrays, {k: v for k, v in attrs.items() if k != "format_version"}


def test_format_v2_round_trip_and_v1_still_loads(tmp_path):
    arrays, attrs = _v2_arrays()
    fmt.write_dataset(tmp_path / "v2.h5", arrays, attrs)
    ds = fmt.load_dataset(tmp_path / "v2.h5", spec=_spec())
    assert ds.attrs["format_version"] == 2 and np.array_equal(ds.agent_rewards(), arrays[fmt.AGENT_REWARDS])
    del arrays[fmt.AGENT_REWARDS]
    fmt.write_dataset(tmp_path / "v1.h5", arrays, attrs)
    assert fmt.load_dataset(tmp_path / "v1.h5", spec=_spec()).attrs["format_version"] == 1


@pytest.mark.parametrize("damage, field, problem", [
    (lambda a, t: a.__setitem__(fmt.AGENT_REWARDS, a[fmt.AGENT_REWARDS] + 1.0), fmt.AGENT_REWARDS, "team reward"),
    (lambda a, t: a.__setitem__(fmt.AGENT_REWARDS, a[fmt.AGENT_REWARDS][:, :2].copy()), fmt.AGENT_REWARDS, "shape"),
    (lambda a, t: t.__setitem__("format_version", 1), fmt.AGENT_REWARDS, "version 1"),
    (lambda a, t: (a.pop(fmt.AGENT_REWARDS), t.__setitem__("format_version", 2)), fmt.AGENT_REWARDS, "missing"),
])
def test_bad_per_agent_rewards_are_refused_naming_the_field(tmp_path, damage, field, problem):
    arrays, attrs = _v2_arrays()
    damage(arrays, attrs)
    with pytest.raises(fmt.DatasetError) as err:
        fmt.write_dataset(tmp_path / "bad.h5", arrays, attrs)
    assert err.value.field == field and problem in err.value.problem


# --------------------------------------------------------------------------- the reward an algorithm uses
def test_each_algorithm_trains_on_its_references_reward():
    import torch

    from plcql_bench.algorithms.base import get_algorithm, reward_kind
    from plcql_bench.suite.runs.runner import Sampler

    arrays, _ = _v2_arrays()
    expect = {"cfcql": "agent0", "macql": "agent0", "spacql": "agent0", "plcql": "agent0", "omar": "per_agent",
              "iql": "per_agent", "matd3bc": "per_agent", "awac": "per_agent", "dof": "per_agent", "maicq": "team"}
    for name, kind in expect.items():
        assert reward_kind(get_algorithm(name, discrete=False)) == kind, name
    per = arrays[fmt.AGENT_REWARDS]
    for kind, want in (("team", arrays["rewards"]), ("agent0", per[:, 0]), ("per_agent", per)):
        s = Sampler(arrays, discrete=False, seed=0, device="cpu", reward=kind)
        assert torch.equal(s.tensors["rewards"], torch.as_tensor(want)), kind
    v1 = {k: v for k, v in arrays.items() if k != fmt.AGENT_REWARDS}
    for kind in ("agent0", "per_agent"):  # v1 data: the team reward whatever the choice
        assert torch.equal(Sampler(v1, False, 0, "cpu", reward=kind).tensors["rewards"], torch.as_tensor(v1["rewards"]))


# ------------------------------------------------------------------------------ the originals' rule
def _card(task, tier, mean, std, transitions, episodes, agent0=True):
    stats = {"mean": mean, "std": std, "min": mean - 2 * std, "max": mean + 2 * std}
    card = {"task_id": task, "quality": tier, "n_transitions": transitions, "n_episodes": episodes,
            **{f"return_{k}": v + 1000 for k, v in stats.items()}}  # team stats: not what is compared
    return {**card, "agent0_returns": stats} if agent0 else {**card, **{f"return_{k}": v for k, v in stats.items()}}


def test_the_tolerance_rule_on_means_stds_and_sizes():
    g = originals.load_originals()["tasks"]["mpe-pp"]
    span = g["expert"]["mean"] - g["random"]["mean"]
    e = g["expert"]
    cards = {
        ("mpe-pp", "expert"): _card("mpe-pp", "expert", e["mean"] + 0.049 * span, e["std"] * 1.24, 1_000_000, 40_000),
        ("mpe-pp", "medium"): _card("mpe-pp", "medium", g["medium"]["mean"] + 0.051 * span, g["medium"]["std"],
                                    1_000_000, 40_000),
        ("mpe-pp", "random"): _card("mpe-pp", "random", g["random"]["mean"], g["random"]["std"] * 0.74, 1_000_000,
                                    40_000, agent0=False),
        ("mpe-pp", "medium-replay"): _card("mpe-pp", "medium-replay", g["medium-replay"]["mean"],
                                           g["medium-replay"]["std"], 62_525, 2_501),
    }
    rows = {(r.task, r.tier): r for r in originals.compare(cards)}
    assert rows[("mpe-pp", "expert")].holds
    assert not rows[("mpe-pp", "medium")].holds and "mean" in rows[("mpe-pp", "medium")].problems()[0]
    assert not rows[("mpe-pp", "random")].holds and "std" in rows[("mpe-pp", "random")].problems()[0]
    mr = rows[("mpe-pp", "medium-replay")].problems()
    assert any("transitions" in p for p in mr) and any("episodes" in p for p in mr)
    assert rows[("mpe-cn", "expert")].problems() == ["no card"]
    text = originals.render(list(rows.values()))
    assert "1 of 16 tiers in tolerance" in text


@needs_omar_prey
def test_the_cli_option_names_the_prey_folder(v2_behaviour, tmp_path):
    """`--omar-prey DIR` wins over the environment's folder, and the build records that prey."""
    import shutil

    folder = tmp_path / "my-prey"
    folder.mkdir()
    for name, _ in prey.OMAR_PREY_FILES.values():
        shutil.copyfile(SHARED_PREY / name, folder / name)
    (tmp_path / "v2.yaml").write_text(V2_PROFILE)
    env = {"PATH": "/usr/bin:/bin", "PLCQL_OMAR_PREY_DIR": str(tmp_path / "elsewhere"),
           "PLCQL_BEHAVIOUR_DIR": str(v2_behaviour)}
    base = [sys.executable, "-m", "plcql_bench.suite.commands.main", "--data-dir", str(tmp_path / "data")]
    args = ["datasets", "build", "mpe-pp", "random", "--profile", str(tmp_path / "v2.yaml")]
    without = subprocess.run(base + args, capture_output=True, text=True, timeout=600, env=env)
    assert without.returncode == 2 and "elsewhere" in without.stderr
    proc = subprocess.run(base + ["--omar-prey", str(folder)] + args, capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    from plcql_bench.datasets import manifest

    entry = manifest.lookup(tmp_path / "data" / "v2test", "mpe-pp", "random")
    assert entry["env_versions"]["prey"].startswith("omar:simple_tag")


def test_every_committed_v2_card_is_in_tolerance_of_the_original():
    """The paper profile's committed cards of the v2 generation (datasets/cards/paper/) hold the originals'
    rule: mean within 5 % of the expert - random range, std within 25 %, transitions and episodes equal. A v2
    tier that does not is never committed as the paper's."""
    from plcql_bench.datasets.cards import CARDS_DIR

    cards = {k: c for k, c in originals.committed_cards(CARDS_DIR / "paper").items() if c.get("generation") == "v2"}
    rows = [r for r in originals.compare(cards) if r.ours is not None]
    assert rows, "no v2 card is committed"
    bad = [f"{r.task}/{r.tier}: {'; '.join(r.problems())}" for r in rows if not r.holds]
    assert not bad, "\n".join(bad)
    assert all(r.ours["return"] == "agent 0" for r in rows)


def test_a_dataset_collected_against_an_unknown_prey_is_not_scored_against_another():
    with pytest.raises(prey.PreyUnavailable, match="neither OMAR's nor the suite's"):
        prey.prey_kind({"prey": "unknown (pretrained_adv_model.pt not given)"}, "mpe-pp")
    with pytest.raises(prey.PreyUnavailable):
        prey.prey_kind({"prey": "my_prey.pt:sha256=0123456789abcdef"}, "mpe-world")
    assert prey.prey_kind({"prey": prey.suite_prey_version("mpe-pp")}, "mpe-pp") == "suite"

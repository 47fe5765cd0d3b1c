"""MATD3 behaviour training (smoke budget): checkpoints, resume, tier selection, publishing, and
`datasets build` using the published checkpoints (expert/medium/random/medium-replay)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from plcql_bench.datasets import behaviour, build, matd3
from plcql_bench.datasets.format import load_dataset


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("matd3")
    out, assets = tmp / "run", tmp / "assets"
    budget = replace(matd3.budget_for("mpe-cn", "smoke"), env_steps=600, eval_every=200,
                     checkpoint_every=200)
    t = matd3.Trainer("mpe-cn", "smoke", out, budget=budget)
    # stop early (max_seconds=0 stops after the first collection round), then resume
    assert not t.train(max_seconds=0.0, progress=lambda *_: None)
    assert (out / "state.pt").exists()
    steps_before = t.env_steps
    t2 = matd3.Trainer("mpe-cn", "smoke", out, budget=budget)
    assert t2.env_steps == steps_before and t2.size == steps_before
    assert t2.train(progress=lambda *_: None)
    # a larger env_steps resumes the same run (train longer); other changes are refused
    t3 = matd3.Trainer("mpe-cn", "smoke", out, budget=replace(budget, env_steps=800))
    assert t3.env_steps == 600
    with pytest.raises(Exception, match="another task or budget"):
        matd3.Trainer("mpe-cn", "smoke", out, budget=replace(budget, gamma=0.9))
    rand = build.uniform_random_return(t2.task, 4)
    index = matd3.publish("mpe-cn", out, assets, "smoke", rand)
    return out, assets, index


def test_checkpoints_cards_and_index(trained):
    out, assets, index = trained
    assert sorted(p.name for p in out.glob("ckpt_*.pt")) == [
        "ckpt_000000000.pt", "ckpt_000000200.pt", "ckpt_000000400.pt", "ckpt_000000600.pt"]
    d = assets / "mpe-cn"
    for tier in ("expert", "medium", "random"):
        card = json.loads((d / f"{tier}.json").read_text())
        assert {"eval_return", "training_env_steps", "wall_clock_s", "updates"} <= set(card)
        assert (d / f"{tier}.pt").stat().st_size < 200_000  # small enough to commit
    assert index["tiers"]["random"]["env_steps"] == 0
    assert index["tiers"]["expert"]["env_steps"] >= 400  # from the last third
    assert index["medium_replay"]["up_to_env_step"] == index["tiers"]["medium"]["env_steps"]
    z = np.load(out / "replay.npz")
    assert len(z["rewards"]) == 600 and z["episode_ids"][-1] == 600 // 25 - 1


def test_actor_numpy_matches_torch(trained):
    import torch

    out, _, _ = trained
    policy, meta = matd3.load_actor(out / "ckpt_000000600.pt")
    t = matd3.Trainer("mpe-cn", "smoke", out, budget=replace(
        matd3.budget_for("mpe-cn", "smoke"), env_steps=600, eval_every=200, checkpoint_every=200))
    obs = np.random.default_rng(0).normal(size=(5, 3, 18)).astype(np.float32)
    with torch.no_grad():
        want = t.nets.act(t.nets.actors, torch.as_tensor(obs)).numpy()
    np.testing.assert_allclose(policy(obs), want, atol=1e-5)
    assert meta["env_steps"] == 600


def test_build_uses_trained_checkpoints(trained, tmp_path, monkeypatch):
    _, assets, index = trained
    monkeypatch.setenv(matd3.BEHAVIOUR_DIR_ENV, str(assets))
    for tier in ("expert", "medium", "random"):
        b = behaviour.behaviour_for("mpe-cn", tier)
        assert b.policy_id.startswith(f"matd3:mpe-cn/{tier}@")
    e = build.build_dataset("mpe-cn", "expert", 4, tmp_path, profile="smoke")
    assert e["behaviour_policy_id"].startswith("matd3:")
    # expert reference = the trained expert without noise
    assert e["ref_return_expert"] != pytest.approx(612, abs=100)
    # without the assets, the scripted fallbacks come back
    monkeypatch.setenv(matd3.BEHAVIOUR_DIR_ENV, str(tmp_path / "none"))
    assert behaviour.behaviour_for("mpe-cn", "expert").policy_id.startswith("scripted-cn")
    assert behaviour.behaviour_for("mpe-cn", "medium-replay") is None
    why, fix = behaviour.unavailable("mpe-cn", "medium-replay")
    assert "no trained MATD3 behaviour policy" in why and fix.startswith("plcql-bench datasets train-behaviour")


def test_medium_replay_rebuilds_from_the_published_checkpoints(trained, tmp_path, monkeypatch):
    """publish_replay writes the checkpoint sequence; medium-replay rolls it out on the training
    episodes' env seeds (same initial states as the training replay), without the replay file."""
    import shutil

    out, assets, index = trained
    assert index["medium_replay"]["recipe"] == matd3.REPLAY_RECIPE  # publish() wrote one
    shutil.copytree(assets / "mpe-cn", tmp_path / "assets" / "mpe-cn")
    rep = matd3.publish_replay("mpe-cn", out, tmp_path / "assets", 600)  # the whole smoke run
    assert rep["episodes"] == 24 and rep["transitions"] == 600
    # warm-up, then the nearest checkpoint (200, 400, 600); published tiers' files are reused
    assert [(p["from_step"], p["to_step"]) for p in rep["parts"]] == [(0, 200), (200, 300), (300, 500), (500, 600)]
    assert rep["parts"][0]["policy"] == "uniform"
    for part, step in zip(rep["parts"][1:], (200, 400, 600)):
        assert matd3._same_actors(out / f"ckpt_{step:09d}.pt", tmp_path / "assets" / "mpe-cn" / part["checkpoint"])
    monkeypatch.setenv(matd3.BEHAVIOUR_DIR_ENV, str(tmp_path / "assets"))
    b = behaviour.behaviour_for("mpe-cn", "medium-replay")
    assert b.kind == "parts" and b.policy_id.startswith("matd3:mpe-cn/replay-rollout-to-600@")
    e = build.build_dataset("mpe-cn", "medium-replay", 1000, tmp_path / "d", profile="smoke")
    ds = load_dataset(tmp_path / "d" / e["file"])
    assert ds.n_episodes == 24 and e["behaviour_policy_id"] == b.policy_id
    with np.load(out / "replay.npz") as z:
        train_obs0 = z["obs"][::25]
    np.testing.assert_array_equal(ds.arrays["obs"][ds.arrays["steps"] == 0], train_obs0)
    warm = ds.arrays["actions"][: 8 * 25]
    assert np.abs(warm).max() <= 1 and np.abs(warm).mean() > 0.4  # uniform in [-1, 1]
    # a smaller profile takes evenly spaced episodes of the same sequence
    e4 = build.build_dataset("mpe-cn", "medium-replay", 4, tmp_path / "small", profile="smoke")
    small = load_dataset(tmp_path / "small" / e4["file"])
    picked = np.linspace(0, 23, 4).round().astype(int)
    np.testing.assert_array_equal(small.arrays["obs"][small.arrays["steps"] == 0], train_obs0[picked])
    # a missing checkpoint file makes the tier unavailable, with the reason
    (tmp_path / "assets" / "mpe-cn" / rep["parts"][2]["checkpoint"]).unlink()
    assert behaviour.behaviour_for("mpe-cn", "medium-replay") is None
    assert "checkpoint" in behaviour.unavailable("mpe-cn", "medium-replay")[0]


def test_replay_parts_nearest_and_latest_checkpoint():
    nearest = matd3.replay_parts([0, 100, 200, 300], 200, warmup_steps=30, episode_limit=25)
    # warm-up 30 steps -> 2 whole episodes; checkpoint 0's share (steps 0-50) is all warm-up
    assert [(p.get("policy", p.get("checkpoint_step")), p["from_step"], p["to_step"], p["episodes"])
            for p in nearest] == [("uniform", 0, 50, 2), (100, 50, 150, 4), (200, 150, 200, 2)]
    latest = matd3.replay_parts([0, 100, 200, 300], 200, warmup_steps=30, episode_limit=25, nearest=False)
    assert [(p.get("policy", p.get("checkpoint_step")), p["from_step"], p["to_step"]) for p in latest] == [
        ("uniform", 0, 50), (0, 50, 100), (100, 100, 200)]
    with pytest.raises(ValueError, match="whole number"):
        matd3.replay_parts([0, 110], 200, 0, 25)


def test_replay_file_is_used_where_the_index_names_no_sequence(trained, tmp_path, monkeypatch):
    """An index without a checkpoint sequence (older publishes) reads the training replay file."""
    import shutil

    out, assets, index = trained
    legacy = tmp_path / "assets"
    shutil.copytree(assets / "mpe-cn", legacy / "mpe-cn")
    rep = {"file": str(out / "replay.npz"), "episodes": index["medium_replay"]["episodes"],
           "up_to_env_step": index["medium_replay"]["up_to_env_step"]}
    (legacy / "mpe-cn" / "index.json").write_text(json.dumps({**index, "medium_replay": rep}))
    monkeypatch.setenv(matd3.BEHAVIOUR_DIR_ENV, str(legacy))
    assert behaviour.behaviour_for("mpe-cn", "medium-replay").kind == "replay"
    e = build.build_dataset("mpe-cn", "medium-replay", 1000, tmp_path / "d", profile="smoke")
    ds = load_dataset(tmp_path / "d" / e["file"])
    assert ds.n_episodes == rep["episodes"]
    assert (ds.arrays["next_actions_valid"][ds.arrays["steps"] == 24] == 0).all()


def test_select_tiers_picks_half(tmp_path):
    log = [{"env_steps": s, "return": r, "updates": 0, "wall_clock_s": 0}
           for s, r in [(0, 0), (10, 20), (20, 45), (30, 70), (40, 90), (50, 100), (60, 98)]]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    sel = matd3.select_tiers("mpe-cn", tmp_path, random_return=10.0)
    assert sel["expert"]["env_steps"] == 50 and sel["medium"]["env_steps"] == 20
    assert sel["random"]["env_steps"] == 0


def _fake_stats(table):
    """candidate_stats stand-in: (step, episodes) -> mean and std from `table` (the screen's and the whole tier's)."""
    calls = []

    def stats(task, ckpt, noise, tier, episodes):
        step = int(ckpt.stem.split("_")[1])
        calls.append((step, episodes))
        mean, std = table[(step, episodes)]
        return {"mean": mean, "std": std, "min": mean - 3 * std, "max": mean + std}
    return stats, calls


def _task(task_id: str, domain: str):
    from types import SimpleNamespace

    return SimpleNamespace(spec=SimpleNamespace(task_id=task_id, domain=domain))


def test_half_cheetah_chooses_among_the_screens_best_rolled_out_on_the_whole_tier(monkeypatch):
    """The 64-episode screen favours step 20 (std as the original's), but on all 1,000 episodes of the tier
    step 20 falls over more often (std 360, out of tolerance) and step 30 holds: step 30 is chosen, and only
    the CONFIRM best of the screen are rolled out again."""
    from plcql_bench.datasets import tiers_v2

    orig = tiers_v2.originals.load_originals()["tasks"]["mamujoco-halfcheetah-2x3"]["expert"]
    m, s = orig["mean"], orig["std"]
    table = {(10, 64): (m - 900, s), (20, 64): (m, s), (30, 64): (m - 40, s + 30), (40, 64): (m - 600, s),
             (20, 1000): (m - 20, 360.0), (30, 1000): (m - 30, s + 10), (40, 1000): (m - 600, s)}
    stats, calls = _fake_stats(table)
    monkeypatch.setattr(tiers_v2, "candidate_stats", stats)
    monkeypatch.setitem(tiers_v2.CONFIRM, "mamujoco", 2)
    sel = tiers_v2.select_tier(_task("mamujoco-halfcheetah-2x3", "mamujoco"), Path("run"), "expert",
                               [10, 20, 30, 40], progress=lambda *_: None)
    assert sel["candidates"][1]["in_tolerance"] and sel["candidates"][1]["env_steps"] == 20  # the screen's pick
    assert sel["chosen"]["env_steps"] == 30 and sel["chosen"]["in_tolerance"]
    assert sel["chosen"]["std"] == s + 10  # the whole tier's statistics, not the screen's
    assert sel["confirmed"]["episodes"] == orig["episodes"] == 1000
    assert [r["env_steps"] for r in sel["confirmed"]["candidates"]] == [20, 30]
    assert not sel["confirmed"]["candidates"][0]["in_tolerance"]
    assert sorted(c for c in calls if c[1] == 1000) == [(20, 1000), (30, 1000)]


def test_mpe_tiers_are_chosen_on_the_screen_alone(monkeypatch):
    """MPE (no CONFIRM count): the screen's best is the choice, nothing is rolled out again."""
    from plcql_bench.datasets import tiers_v2

    orig = tiers_v2.originals.load_originals()["tasks"]["mpe-pp"]["medium"]
    m, s = orig["mean"], orig["std"]
    stats, calls = _fake_stats({(10, 1024): (m - 30, s), (20, 1024): (m + 1, s - 2)})
    monkeypatch.setattr(tiers_v2, "candidate_stats", stats)
    sel = tiers_v2.select_tier(_task("mpe-pp", "mpe"), Path("run"), "medium", [10, 20], progress=lambda *_: None)
    assert sel["chosen"]["env_steps"] == 20 and "confirmed" not in sel
    assert calls == [(10, 1024), (20, 1024)]


def _fake_run(d: Path, task_id: str, seed: int, budget: dict, steps: list[int], prey: str = "suite") -> Path:
    """A finished behaviour run on disk: run.json, log.jsonl and one (marked) checkpoint file per step."""
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"task_id": task_id, "seed": seed, "budget": budget, "prey": prey}))
    (d / "log.jsonl").write_text("".join(json.dumps({"env_steps": s, "return": s / 10}) + "\n" for s in [0, *steps]))
    for s in [0, *steps]:
        (d / f"ckpt_{s:09d}.pt").write_bytes(f"{d.name}@{s}".encode())
    return d


def test_a_tier_is_chosen_again_from_another_run_and_that_run_is_recorded(tmp_path, monkeypatch):
    """Half-Cheetah's medium from a second run of the trainer: the medium checkpoint is that run's in-tolerance
    one, its entry names the run (seed, the budget fields that differ), the previous choice stays as evidence,
    and the expert tier and medium-replay are untouched."""
    from plcql_bench.datasets import tiers_v2
    from plcql_bench.suite.core.errors import BenchError

    task_id = "mamujoco-halfcheetah-2x3"
    orig = tiers_v2.originals.load_originals()["tasks"][task_id]["medium"]
    m, s = orig["mean"], orig["std"]
    budget = {"env_steps": 3_000_000, "updates_per_step": 0.08, "warmup_steps": 2000}
    other = _fake_run(tmp_path / "ups0.0775", task_id, 0, {**budget, "env_steps": 480_000, "updates_per_step": 0.0775},
                      [20_000, 40_000, 45_000])
    d = tmp_path / "assets" / task_id
    (d / "v2").mkdir(parents=True)
    expert = {"checkpoint": "v2/expert.pt", "env_steps": 2_880_000, "noise": 0.1, "in_tolerance": True}
    old_medium = {"checkpoint": "v2/medium.pt", "env_steps": 180_000, "noise": 0.1, "in_tolerance": False}
    index = {"task_id": task_id, "budget": budget, "train_seed": 1, "medium_replay": {"episodes": 460},
             "tiers": {"random": {"policy": "uniform"}, "expert": expert, "medium": old_medium},
             "selection": {"rule": "r", "medium": {"episodes": 64, "candidates": [{"env_steps": 180_000}]}}}
    (d / "index-v2.json").write_text(json.dumps(index))
    stats, calls = _fake_stats({(20_000, 64): (m - 700, s), (40_000, 64): (m - 20, s + 5),
                                (20_000, 1000): (m - 700, s), (40_000, 1000): (m - 60, s + 15)})
    monkeypatch.setattr(tiers_v2, "candidate_stats", stats)
    monkeypatch.setattr(tiers_v2, "get_task", lambda *a, **k: _task(task_id, "mamujoco"))
    monkeypatch.setitem(tiers_v2.CONFIRM, "mamujoco", 2)

    new = tiers_v2.republish_tier(task_id, "medium", other, tmp_path / "assets", progress=lambda *_: None)
    assert new == json.loads((d / "index-v2.json").read_text())
    med = new["tiers"]["medium"]
    assert med["env_steps"] == 40_000 and med["in_tolerance"] and med["candidate_stats"]["std"] == s + 15
    assert (d / "v2" / "medium.pt").read_bytes() == b"ups0.0775@40000"
    assert med["run"] == {"name": "ups0.0775", "train_seed": 0,
                          "budget_diff": {"env_steps": 480_000, "updates_per_step": 0.0775}}
    assert [c for c in calls if c[1] == 64] == [(20_000, 64), (40_000, 64)]  # every 10k-step checkpoint; not 45k
    prev = new["selection"]["medium"]["previous"]
    assert prev["entry"] == old_medium and prev["candidates"] == [{"env_steps": 180_000}]
    assert new["tiers"]["expert"] == expert and new["medium_replay"] == {"episodes": 460}
    said = []  # a full publish-v2 afterwards would replace it: it says so first (expert: nothing to say)
    for tier in ("expert", "medium"):
        tiers_v2._say_if_from_another_run(d / "index-v2.json", tier, said.append)
    assert len(said) == 1 and "took medium from run ups0.0775 (seed 0)" in said[0]

    # a run of another task is refused by name, and the index is left as it was
    wrong = _fake_run(tmp_path / "cn-run", "mpe-cn", 0, budget, [20_000])
    with pytest.raises(BenchError, match="cn-run: a run of mpe-cn"):
        tiers_v2.republish_tier(task_id, "medium", wrong, tmp_path / "assets", progress=lambda *_: None)
    assert json.loads((d / "index-v2.json").read_text()) == new


def test_publish_v2_tier_without_a_published_index_says_so(tmp_path, monkeypatch, capsys):
    from cli_main import run_cli

    run = _fake_run(tmp_path / "run", "mpe-cn", 0, {}, [10_000])
    code, _, err = run_cli(monkeypatch, capsys, "datasets", "publish-v2-tier", "mpe-cn", "medium", str(run),
                           "--assets", str(tmp_path / "assets"))
    assert code != 0 and "index-v2.json: no published v2 index" in err and len(err.strip().splitlines()) == 1


def test_train_behaviour_at_another_update_rate_without_publishing(tmp_path, monkeypatch, capsys):
    """A run of another update rate (the kind a tier is chosen from again): its budget records the rate, and
    --no-publish leaves the assets alone; resuming it at the profile's own rate is refused by name."""
    from cli_main import run_cli

    run, assets = tmp_path / "run", tmp_path / "assets"
    args = ["datasets", "train-behaviour", "mpe-cn", "--profile", "smoke", "--env-steps", "200", "--out", str(run),
            "--assets", str(assets)]
    code, out, err = run_cli(monkeypatch, capsys, *args, "--updates-per-step", "0.3", "--no-publish")
    assert code == 0, err
    assert json.loads((run / "run.json").read_text())["budget"]["updates_per_step"] == 0.3
    assert "(not published)" in out and not assets.exists()
    code, _, err = run_cli(monkeypatch, capsys, *args, "--no-publish")
    assert code != 0 and "written with another task or budget" in err

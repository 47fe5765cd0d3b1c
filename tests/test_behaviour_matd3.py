"""MATD3 behaviour training (smoke budget): checkpoints, resume, tier selection, publishing, and
`datasets build` using the published checkpoints (expert/medium/random/medium-replay)."""

from __future__ import annotations

import json
from dataclasses import replace

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
    rep = behaviour.behaviour_for("mpe-cn", "medium-replay")
    assert rep.kind == "replay"
    e = build.build_dataset("mpe-cn", "expert", 4, tmp_path, profile="smoke")
    assert e["behaviour_policy_id"].startswith("matd3:")
    # expert reference = the trained expert without noise
    assert e["ref_return_expert"] != pytest.approx(612, abs=100)
    e = build.build_dataset("mpe-cn", "medium-replay", 1000, tmp_path, profile="smoke")
    ds = load_dataset(tmp_path / e["file"])
    assert ds.n_episodes == index["medium_replay"]["episodes"]
    assert (ds.arrays["next_actions_valid"][ds.arrays["steps"] == 24] == 0).all()
    # without the assets, the scripted fallbacks come back
    monkeypatch.setenv(matd3.BEHAVIOUR_DIR_ENV, str(tmp_path / "none"))
    assert behaviour.behaviour_for("mpe-cn", "expert").policy_id.startswith("scripted-cn")
    assert behaviour.behaviour_for("mpe-cn", "medium-replay") is None


def test_select_tiers_picks_half(tmp_path):
    log = [{"env_steps": s, "return": r, "updates": 0, "wall_clock_s": 0}
           for s, r in [(0, 0), (10, 20), (20, 45), (30, 70), (40, 90), (50, 100), (60, 98)]]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    sel = matd3.select_tiers("mpe-cn", tmp_path, random_return=10.0)
    assert sel["expert"]["env_steps"] == 50 and sel["medium"]["env_steps"] == 20
    assert sel["random"]["env_steps"] == 0

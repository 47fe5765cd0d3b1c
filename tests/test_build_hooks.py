"""datasets build: a task family's own collector and references (its dataset recipe,
datasets/recipes.py), mixed tier composition, and deterministic builds."""

from __future__ import annotations

import numpy as np

from plcql_bench.datasets import build, format as fmt
from plcql_bench.datasets.behaviour import Behaviour
from plcql_bench.datasets.recipes import RECIPES, Recipe
from plcql_bench.suite.envs import tasks
from plcql_bench.suite.core.spec import Task, TaskSpec


def _fake_task() -> tuple[Task, Recipe, list]:
    spec = TaskSpec("fake-smax", "smax", 2, 4, 6, 5, True, 6, tasks.SMAC_TIERS, score="win_rate")
    calls = []

    def collect(task, behaviour, seeds, rng):
        calls.append((behaviour.policy_id, seeds.copy()))
        arrays, _ = fmt.synthetic_dataset(task.spec, n_episodes=len(seeds), episode_len=3,
                                          seed=int(seeds[0]))
        arrays["episode_won"] = np.arange(len(seeds)) % 2 == 0
        return arrays

    def behaviours(task_id, tier):
        if tier in ("medium", "expert"):
            return Behaviour(f"fake-{tier}", lambda rng: {"params": tier})
        return None

    recipe = Recipe(collect=collect, behaviours=behaviours,
                    references=lambda task: {"random": float("nan"), "expert": float("nan")})
    return Task(spec, make_env=None), recipe, calls


def test_collector_hook_and_mixed(tmp_path, monkeypatch):
    task, recipe, calls = _fake_task()
    monkeypatch.setitem(RECIPES, "fake-smax", recipe)
    monkeypatch.setitem(tasks._FACTORIES, "fake-smax", ("tests.none", "none"))
    monkeypatch.setattr(build, "get_task", lambda tid, **_: task)
    import plcql_bench.suite.envs.tasks as t

    orig = t.get_task
    monkeypatch.setattr(t, "get_task", lambda tid, **kw: task if tid == "fake-smax" else orig(tid, **kw))
    e = build.build_dataset("fake-smax", "expert", 4, tmp_path, profile="smoke")
    assert e["behaviour_policy_id"] == "fake-expert" and e["n_episodes"] == 4
    assert e["win_rate"] == 0.5 and np.isnan(e["ref_return_expert"])
    e = build.build_dataset("fake-smax", "mixed", 6, tmp_path, profile="smoke")
    assert e["n_episodes"] == 6 and e["behaviour_policy_id"] == "mixed(fake-medium|fake-expert)"
    assert [c[0] for c in calls[-2:]] == ["fake-medium", "fake-expert"]
    assert len(calls[-2][1]) == 3 and len(calls[-1][1]) == 3
    assert not set(calls[-2][1]) & set(calls[-1][1])  # disjoint seeds


def test_build_deterministic(tmp_path):
    a = build.build_dataset("mpe-cn", "medium", 6, tmp_path / "a", profile="smoke")
    b = build.build_dataset("mpe-cn", "medium", 6, tmp_path / "b", profile="smoke")
    assert a["sha256"] == b["sha256"]

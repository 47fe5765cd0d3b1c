"""`datasets train-behaviour`: train (or resume) a MATD3 behaviour run (datasets/matd3.py), then select and
publish its tiers (v1: matd3.select_tiers / matd3.publish; v2: datasets/tiers_v2.py). It sits above both."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from plcql_bench.datasets.build import uniform_random_return
from plcql_bench.datasets.matd3 import REPO_ROOT, Trainer, budget_for, budget_prey, publish, select_tiers
from plcql_bench.datasets.tiers_v2 import publish_v2


def train_behaviour(task_id: str, profile: str, out: str | Path | None = None, seed: int = 0,
                    max_seconds: float | None = None, assets: str | Path | None = None,
                    progress=print, env_steps: int | None = None, updates_per_step: float | None = None,
                    publish_tiers: bool = True) -> dict | None:
    """Train (or resume) and, when the budget is spent, select and publish the tiers (unless not
    `publish_tiers`: then the finished run's directory only). env_steps overrides the profile's total
    (resuming a run with a larger value trains longer); updates_per_step the profile's update rate (a
    run of another rate, e.g. one a tier is chosen from again: tiers_v2.republish_tier)."""

    out = Path(out or REPO_ROOT / "artifacts" / "behaviour" / task_id / profile)
    budget = budget_for(task_id, profile)
    if env_steps is not None:
        budget = replace(budget, env_steps=int(env_steps))
    if updates_per_step is not None:
        budget = replace(budget, updates_per_step=float(updates_per_step))
    trainer = Trainer(task_id, profile, out, seed=seed, budget=budget, prey=budget_prey(task_id, profile))
    done = trainer.train(max_seconds=max_seconds, progress=progress)
    if not done:
        progress(f"{task_id}: stopped at {trainer.env_steps}/{trainer.b.env_steps} steps; "
                 "run again to resume")
        return None
    if not publish_tiers:
        progress(f"{task_id}: finished at {trainer.env_steps} steps in {out} (not published)")
        return {"out": str(out)}
    rand = uniform_random_return(trainer.task, trainer.b.eval_episodes)
    if profile == "v2":  # tiers chosen by the originals' statistics (datasets/tiers_v2.py)
        return publish_v2(task_id, out, assets, progress)
    if assets is None:
        return {"out": str(out), **select_tiers(task_id, out, rand)}
    return publish(task_id, out, assets, profile, rand)

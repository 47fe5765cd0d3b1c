"""The v2 generation's tiers of a MATD3 behaviour run, chosen by the originals' statistics.

`publish_v2(task, RUN_DIR)` turns a finished `train-behaviour TASK --profile v2` run into
`datasets/assets/behaviour/<task>/index-v2.json` (datasets/generations.py):

* expert and medium: every checkpoint of the run (× each noise level the task allows: CN's expert also
  0.2-0.8, since the original CN expert is broader than a noise-0.1 expert) is rolled out on the tier's
  own first collection seeds, with the tier's own noise generator (on MPE, where the screen is whole
  collection batches, a candidate's statistics are those of the first episodes the build would collect;
  Half-Cheetah's 64 episodes are a sample of the same policy and noise). The candidate closest to the original tier
  (datasets/originals.json), by |Δmean| / mean tolerance + |Δstd| / std tolerance, is chosen; every
  candidate's statistics are kept in the index ("selection") as the evidence. Where a tier holds few
  episodes (Half-Cheetah: 1,000), the best candidates of that screen are rolled out again on all of the
  tier's episodes and the choice is made among them (`CONFIRM`): their statistics are the tier's own;
* random: uniform actions (no checkpoint);
* medium-replay: the run's training replay up to the original's size (its transitions), rebuilt from
  the checkpoint sequence as in v1 (matd3.replay_parts); the run's updates-per-step is what makes that
  replay look like the original's (docs/datasets.md, "v2").

`republish_tier(task, tier, RUN_DIR)` chooses one tier again, possibly among another run's checkpoints (the
trainer's other seeds or budgets: Half-Cheetah's medium, docs/datasets.md), and records that run in its entry.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np

from plcql_bench.datasets import format as fmt
from plcql_bench.datasets import originals
from plcql_bench.datasets.build import collect
from plcql_bench.datasets.generations import prey_for
from plcql_bench.datasets.matd3 import (
    ASSETS_DIR,
    REPLAY_RECIPE,
    TRAINER_VERSION,
    load_actor,
    noisy_policy,
    replay_parts,
)
from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.core.store import atomic_write_json
from plcql_bench.suite.envs import protocol
from plcql_bench.suite.envs.tasks import ALL_TIERS, get_task

# Noise levels tried per task (default: the trainer's exploration noise only).
NOISES: dict[tuple[str, str], tuple[float, ...]] = {
    ("mpe-cn", "expert"): (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8),
}
DEFAULT_NOISE = (0.1,)
# Episodes each candidate is rolled out for: the tier's own first collection seeds (the screen).
EPISODES = {"mpe": 1024, "mamujoco": 64}
# Then the CONFIRM[domain] best-scoring candidates are rolled out on every episode of the tier (the original's
# count), and the choice is made among them. Half-Cheetah: a policy that falls over in 1 episode of 20 widens a
# 1,000-episode tier's spread beyond the 64-episode screen's (2026-12-05: 253.1 on the screen, 354.8 built),
# and 1,000 episodes take ~90 s a candidate. MPE: none (a tier is 40,000 episodes; the screen is 1,024).
CONFIRM = {"mamujoco": 10}
CANDIDATE_EVERY = 10_000  # env steps between the checkpoints tried for expert and medium
INDEX = "index-v2.json"
SUBDIR = "v2"  # checkpoints under datasets/assets/behaviour/<task>/v2/


def _log(run_dir: Path) -> list[dict]:
    by_step = {}
    for line in (run_dir / "log.jsonl").read_text().splitlines():
        if line.strip():
            e = json.loads(line)
            by_step[e["env_steps"]] = e
    return [by_step[k] for k in sorted(by_step)]


def _run_record(run_dir: Path) -> dict:
    """The run's task, seed and budget: run.json, or the state.pt of a run that predates it."""
    if (run_dir / "run.json").is_file():
        return json.loads((run_dir / "run.json").read_text())
    import torch

    return torch.load(run_dir / "state.pt", map_location="cpu", weights_only=False)


def candidate_stats(task, ckpt: Path, noise: float, tier: str, episodes: int) -> dict[str, float]:
    """Agent 0's return statistics over the first `episodes` episodes the tier's build would collect with
    this checkpoint and noise (same seeds, same noise generator: datasets/build.py)."""

    index = ALL_TIERS.index(tier)
    rng = np.random.default_rng([0, index])
    seeds = protocol.collection_seeds(0, index, 0, episodes)
    arrays = collect(task, noisy_policy(load_actor(ckpt)[0], noise, rng), seeds, agent_rewards=True)
    stats = fmt.return_stats(fmt.episode_returns(arrays[fmt.AGENT_REWARDS][:, 0], arrays["episode_ids"]))
    return {k.removeprefix("return_"): round(v, 4) for k, v in stats.items()}


def choose(rows: list[dict], original: dict, mean_tol: float, std_tol: float) -> dict:
    """The candidate closest to the original tier: least |Δmean|/mean_tol + |Δstd|/std_tol (earliest step on
    a tie). Each row gets its `score` and whether it is in tolerance."""
    for r in rows:
        r["score"] = round(abs(r["mean"] - original["mean"]) / mean_tol + abs(r["std"] - original["std"]) / std_tol, 4)
        r["in_tolerance"] = (abs(r["mean"] - original["mean"]) <= mean_tol and abs(r["std"] - original["std"]) <= std_tol)
    return min(rows, key=_rank)


def _rank(row: dict) -> tuple:
    """A scored candidate's place: least score first, the earliest step and lowest noise on a tie."""
    return row["score"], row["env_steps"], row["noise"]


def select_tier(task, run_dir: Path, tier: str, steps: list[int], progress: Callable[[str], None] = print) -> dict:
    """Roll out every candidate (checkpoint step × noise) of `tier` and choose by the originals; where the
    domain has a CONFIRM count, choose among that many best candidates rolled out on the whole tier."""
    task_id = task.spec.task_id
    orig = originals.load_originals()
    tiers = orig["tasks"][task_id]
    span = tiers["expert"]["mean"] - tiers["random"]["mean"]
    tol = orig["tolerance"]
    mean_tol, std_tol = tol["mean_fraction_of_range"] * span, tol["std_fraction"] * tiers[tier]["std"]
    episodes = EPISODES[task.spec.domain]
    rows = []
    for step in steps:
        for noise in NOISES.get((task_id, tier), DEFAULT_NOISE):
            s = candidate_stats(task, run_dir / f"ckpt_{step:09d}.pt", noise, tier, episodes)
            rows.append({"env_steps": step, "noise": noise, **s})
        progress(f"{task_id}/{tier}: candidates at step {step}: "
                 + ", ".join(f"noise {r['noise']}: {r['mean']:.1f} ± {r['std']:.1f}" for r in rows if r["env_steps"] == step))
    best = choose(rows, tiers[tier], mean_tol, std_tol)
    out = {"chosen": best, "episodes": episodes, "candidates": rows}
    keep = CONFIRM.get(task.spec.domain, 0)
    if keep:
        full = int(tiers[tier]["episodes"])
        screened = sorted(rows, key=_rank)[:keep]
        confirmed = _whole_tier(task, run_dir, tier, screened, full, progress)
        out.update(chosen=choose(confirmed, tiers[tier], mean_tol, std_tol),
                   confirmed={"episodes": full, "candidates": confirmed})
    return out


def _whole_tier(task, run_dir: Path, tier: str, screened: list[dict], episodes: int,
                progress: Callable[[str], None]) -> list[dict]:
    """The screened candidates rolled out on all `episodes` of the tier: the statistics of the tier each would build."""
    rows = []
    for r in screened:
        s = candidate_stats(task, run_dir / f"ckpt_{r['env_steps']:09d}.pt", r["noise"], tier, episodes)
        rows.append({"env_steps": r["env_steps"], "noise": r["noise"], **s})
        progress(f"{task.spec.task_id}/{tier}: step {r['env_steps']} noise {r['noise']} on all {episodes} episodes: "
                 f"{s['mean']:.1f} ± {s['std']:.1f} (screen: {r['mean']:.1f} ± {r['std']:.1f})")
    return rows


def publish_v2(task_id: str, run_dir: str | Path, assets: str | Path | None = None,
               progress: Callable[[str], None] = print, tiers: tuple[str, ...] = ("expert", "medium")) -> dict:
    """Choose the tiers of a finished v2 run and write `<assets>/<task>/index-v2.json` with the checkpoints
    under `<assets>/<task>/v2/`. Returns the index."""

    run_dir = Path(run_dir)
    d = Path(assets or ASSETS_DIR) / task_id
    (d / SUBDIR / "replay").mkdir(parents=True, exist_ok=True)
    task = get_task(task_id, prey=prey_for(task_id, "v2"))
    state = _run_record(run_dir)
    budget, log = state["budget"], _log(run_dir)
    steps = [e["env_steps"] for e in log if e["env_steps"] > 0]
    index: dict[str, Any] = {
        "task_id": task_id, "trainer": TRAINER_VERSION, "generation": "v2", "profile": "v2",
        "budget": budget, "train_seed": int(state.get("seed", 0)), "prey": task.spec.env_versions().get("prey"),
        "tiers": {"random": {"policy": "uniform"}}, "selection": {
            "rule": "least |mean - original| / mean tolerance + |std - original| / std tolerance over agent 0's "
                    "returns on the tier's first collection episodes; where 'confirmed' is given, among its best "
                    "candidates rolled out on all of the tier's episodes (datasets/tiers_v2.py)"},
        "learning_curve": [{"env_steps": e["env_steps"], "return": round(e["return"], 3)} for e in log],
    }
    for tier in tiers:
        _say_if_from_another_run(d / INDEX, tier, progress)
        index["tiers"][tier], index["selection"][tier] = _publish_tier(task, run_dir, d, tier, progress)
    index["medium_replay"] = _replay_v2(task, run_dir, d, budget, [0] + steps, index["train_seed"], replay_parts,
                                        REPLAY_RECIPE)
    atomic_write_json(d / INDEX, index)
    return index


def _say_if_from_another_run(path: Path, tier: str, progress: Callable[[str], None]) -> None:
    """Warn before a full publish replaces a tier that `republish_tier` took from another run."""
    try:
        run = json.loads(path.read_text())["tiers"][tier]["run"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    progress(f"note: {path} took {tier} from run {run['name']} (seed {run['train_seed']}); this publish chooses it "
             f"among this run's checkpoints; run `datasets publish-v2-tier` with that run again to restore it")


def _publish_tier(task, run_dir: Path, d: Path, tier: str, progress: Callable[[str], None]) -> tuple[dict, dict]:
    """Choose `tier` among `run_dir`'s checkpoints (every CANDIDATE_EVERY env steps) and copy it to
    `<task>/v2/<tier>.pt`: the tier's index entry and its selection evidence."""
    by_step = {e["env_steps"]: e for e in _log(run_dir)}
    candidates = [s for s in by_step if s > 0 and s % CANDIDATE_EVERY == 0]
    sel = select_tier(task, run_dir, tier, candidates, progress)
    best = sel["chosen"]
    name = f"{SUBDIR}/{tier}.pt"
    shutil.copyfile(run_dir / f"ckpt_{best['env_steps']:09d}.pt", d / name)
    entry = {"checkpoint": name, "env_steps": best["env_steps"], "noise": best["noise"],
             "return": by_step[best["env_steps"]]["return"],
             "candidate_stats": {k: best[k] for k in ("mean", "std", "min", "max")},
             "in_tolerance": best["in_tolerance"]}
    progress(f"{task.spec.task_id}/{tier}: chose step {best['env_steps']} noise {best['noise']}: "
             f"{best['mean']:.1f} ± {best['std']:.1f} (in tolerance: {best['in_tolerance']})")
    return entry, {k: sel[k] for k in ("episodes", "candidates", "confirmed") if k in sel}


def republish_tier(task_id: str, tier: str, run_dir: str | Path, assets: str | Path | None = None,
                   progress: Callable[[str], None] = print) -> dict:
    """Choose one tier (expert or medium) of a published index-v2.json again, among the checkpoints of
    `run_dir`: the publishing run, or another run of the same trainer on the same task, which is then recorded
    in the tier's entry ("run": its seed and the budget fields that differ). The other tiers and medium-replay
    stay as published; the tier's previous entry and selection are kept as evidence
    (selection[tier]["previous"]). Returns the index."""
    if tier not in ("expert", "medium"):
        raise BenchError(f"{tier!r}: only the expert and medium tiers are chosen among checkpoints")
    run_dir = Path(run_dir)
    d = Path(assets or ASSETS_DIR) / task_id
    path = d / INDEX
    if not path.is_file():
        raise BenchError(f"{path}: no published v2 index; "
                         f"run `plcql-bench datasets publish-v2 {task_id} RUN_DIR` first")
    index = json.loads(path.read_text())
    rec = _run_record(run_dir)
    if rec.get("task_id", task_id) != task_id or rec.get("prey", "suite") != prey_for(task_id, "v2"):
        raise BenchError(f"{run_dir}: a run of {rec.get('task_id')} against prey {rec.get('prey', 'suite')!r}, "
                         f"not of {task_id} against the v2 prey {prey_for(task_id, 'v2')!r}")
    task = get_task(task_id, prey=prey_for(task_id, "v2"))
    entry, selection = _publish_tier(task, run_dir, d, tier, progress)
    seed = int(rec.get("seed", 0))
    if seed != index["train_seed"] or rec["budget"] != index["budget"]:
        entry["run"] = {"name": run_dir.name, "train_seed": seed,  # its budget: where it differs from the index's
                        "budget_diff": {k: v for k, v in rec["budget"].items() if index["budget"].get(k) != v}}
    old = index["selection"].get(tier, {})
    selection["previous"] = {"entry": index["tiers"].get(tier),
                             **{k: v for k, v in old.items() if k != "previous"}}
    index["tiers"][tier], index["selection"][tier] = entry, selection
    atomic_write_json(path, index)
    return index


def _replay_v2(task, run_dir: Path, d: Path, budget: dict, steps: list[int], seed: int, replay_parts,
               recipe: str) -> dict:
    """medium-replay: the run's replay up to the original's transitions, as a checkpoint sequence copied to
    `<task>/v2/replay/` (the step-0 checkpoint included)."""
    spec = task.spec
    up_to = int(originals.load_originals()["tasks"][spec.task_id]["medium-replay"]["transitions"])
    parts = replay_parts(steps, up_to, budget["warmup_steps"], spec.episode_limit)
    for p in parts:
        step = p.pop("checkpoint_step", None)
        if step is not None:
            p["checkpoint"] = f"{SUBDIR}/replay/ckpt_{step:09d}.pt"
            shutil.copyfile(run_dir / f"ckpt_{step:09d}.pt", d / p["checkpoint"])
    episodes = sum(p["episodes"] for p in parts)
    return {"recipe": recipe, "up_to_env_step": up_to, "episodes": episodes,
            "transitions": episodes * spec.episode_limit, "noise": budget["expl_noise"],
            "warmup_steps": budget["warmup_steps"], "train_seed": seed, "parts": parts}

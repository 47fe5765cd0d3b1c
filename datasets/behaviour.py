"""Behaviour policies per task and tier, and the reference policies used for normalisation.

Lookup order for (task, tier), see `behaviour_for`:

1. Trained MATD3 checkpoints (datasets/matd3.py), when `<behaviour dir>/<task>/index.json` exists
   (default `datasets/assets/behaviour/`, override with PLCQL_BEHAVIOUR_DIR): expert / medium /
   random run the selected actor checkpoints with Gaussian action noise (EXPLORATION_NOISE, "noise
   added for diversity" as in OMAR). medium-replay rebuilds the training replay up to the medium
   checkpoint from the committed checkpoint sequence (kind="parts", matd3.replay_parts), or reads
   the training replay file where the index names no sequence and the file exists (kind="replay").
   Ids start "matd3:".
2. A task family's own behaviours, from its dataset recipe (datasets/recipes.py; SMAX).
3. Scripted fallbacks (datasets/scripted.py): CN landmark assignment + PD controller, PP/World a
   predator chase heuristic; medium = the same with heavy action noise; random = uniform. Ids
   start "scripted-" / "uniform-random".

Tiers without any behaviour policy are listed as unavailable by `datasets list`, with the reason
and the command that fixes it (`unavailable`).

Every lookup takes the dataset generation (datasets/generations.py, default "v1"): the v2 generation
reads `index-v2.json` (tiers chosen by the originals' statistics, each with its own noise), and its
random tier is uniform actions for every continuous task.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from plcql_bench.datasets import scripted
from plcql_bench.datasets.cards import moved_references
from plcql_bench.datasets.generations import generation
from plcql_bench.suite.core.spec import Policy
from plcql_bench.datasets.matd3 import ASSETS_DIR, behaviour_dir, load_actor, noisy_policy, resolve_replay
from plcql_bench.datasets.recipes import Behaviour, recipe_for
from plcql_bench.suite.envs.tasks import get_task

GENERATOR_VERSION = "plcql-bench-collect-1"


EXPLORATION_NOISE = 0.1  # Gaussian action noise of the trained behaviour policies


def _random(act_dim: int = 2) -> Behaviour:
    return Behaviour("uniform-random-v1", lambda rng: scripted.random_policy(rng, act_dim),
                     "uniform actions in [-1, 1]")


def _cn_scripted(noise: float) -> Behaviour:
    return Behaviour(
        f"scripted-cn-pd-v1(noise={noise})",
        lambda rng: scripted.cn_expert_policy(noise_std=noise, rng=rng),
        "landmark assignment + PD controller with Gaussian action noise",
    )


def _chase(task_id: str, noise: float) -> Behaviour:
    return Behaviour(
        f"scripted-chase-v1(noise={noise})",
        lambda rng: scripted.chase_policy(task_id, noise_std=noise, rng=rng),
        "every predator steers at the prey, with Gaussian action noise",
    )


# (task, tier) -> behaviour policy that generates that tier's data. Noise levels put the medium
# tier near half of the expert reference's normalised score (mean returns on the evaluation
# seeds: CN noise 1.5 -> 362, random 146, expert 612; PP 1.0 -> 20, -7, 59; World 0.7 -> 13, -9, 26).
BEHAVIOURS: dict[tuple[str, str], Behaviour] = {
    ("mpe-cn", "expert"): _cn_scripted(0.2),
    ("mpe-cn", "medium"): _cn_scripted(1.5),
    ("mpe-cn", "random"): _random(),
    ("mpe-pp", "expert"): _chase("mpe-pp", 0.2),
    ("mpe-pp", "medium"): _chase("mpe-pp", 1.0),
    ("mpe-pp", "random"): _random(),
    ("mpe-world", "expert"): _chase("mpe-world", 0.2),
    ("mpe-world", "medium"): _chase("mpe-world", 0.7),
    ("mpe-world", "random"): _random(),
}

# task -> (random reference, expert reference). Both are measured with the evaluation protocol.
REFERENCES: dict[str, tuple[Behaviour, Behaviour]] = {
    "mpe-cn": (_random(), _cn_scripted(0.0)),
    "mpe-pp": (_random(), _chase("mpe-pp", 0.0)),
    "mpe-world": (_random(), _chase("mpe-world", 0.0)),
}


def _trained_index(task_id: str, gen: str | None = None) -> tuple[dict, Path] | None:
    d = behaviour_dir() / task_id
    path = d / generation(gen).index_file
    if not path.is_file():
        return None
    index = json.loads(path.read_text())
    if not str(index.get("trainer", "")).startswith("plcql-bench-matd3"):
        return None  # another trainer's files (e.g. SMAX) are not MATD3 checkpoints
    return index, d


def _file_tag(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def trained_behaviour(task_id: str, tier: str, noise: float | None = None, gen: str | None = None) -> Behaviour | None:
    """The trained MATD3 behaviour for (task, tier), or None. noise: the Gaussian action noise; None
    takes the tier's own (index entry "noise", else EXPLORATION_NOISE)."""
    found = _trained_index(task_id, gen)
    if found is None:
        return None
    index, d = found
    if tier == "medium-replay":
        return _medium_replay(task_id, index.get("medium_replay") or {}, d)
    entry = index.get("tiers", {}).get(tier)
    if entry is None or "checkpoint" not in entry:
        return None
    noise = float(entry.get("noise", EXPLORATION_NOISE)) if noise is None else noise
    ckpt = d / entry["checkpoint"]

    def make(rng: np.random.Generator, ckpt=ckpt) -> Policy:
        return noisy_policy(load_actor(ckpt)[0], noise, rng)

    run = f" of run {entry['run']['name']} (seed {entry['run']['train_seed']})" if "run" in entry else ""
    return Behaviour(f"matd3:{task_id}/{tier}@{_file_tag(ckpt)}(noise={noise})", make,
                     f"MATD3 checkpoint at {entry['env_steps']} env steps{run}, eval return "
                     f"{entry['return']:.2f}")


def _medium_replay(task_id: str, rep: dict, d: Path) -> Behaviour | None:
    """medium-replay: rebuilt from the committed checkpoint sequence (index "parts", see
    matd3.replay_parts), or else the training replay file where it is on disk."""
    if rep.get("parts"):
        parts = [{**p, "checkpoint": str(d / p["checkpoint"])} if "checkpoint" in p else dict(p)
                 for p in rep["parts"]]
        missing = [p["checkpoint"] for p in parts if "checkpoint" in p and not Path(p["checkpoint"]).is_file()]
        if missing:
            return None
        tags = [_file_tag(Path(p["checkpoint"])) if "checkpoint" in p else p["policy"] for p in parts]
        recipe = json.dumps([rep["recipe"], rep["train_seed"], rep["noise"],
                             [(p["from_step"], p["to_step"]) for p in parts], tags])
        tag = hashlib.sha256(recipe.encode()).hexdigest()[:12]
        return Behaviour(f"matd3:{task_id}/replay-rollout-to-{rep['up_to_env_step']}@{tag}(noise={rep['noise']})",
                         lambda rng: None,
                         f"the MATD3 training replay up to the medium checkpoint, rebuilt: {len(parts)} "
                         "parts, each checkpoint rolled out with the trainer's noise for the env steps "
                         "it was in charge of", kind="parts", replay={**rep, "parts": parts})

    if not rep.get("file") or not resolve_replay(rep["file"]).is_file():
        return None
    rep = {**rep, "file": str(resolve_replay(rep["file"]))}
    return Behaviour(f"matd3:{task_id}/replay-to-step-{rep['up_to_env_step']}",
                     lambda rng: None, "MATD3 training replay up to the medium checkpoint",
                     kind="replay", replay=rep)


def replay_part_policy(part: dict, noise: float, act_dim: int, rng: np.random.Generator) -> Policy:
    """The policy of one part of a rebuilt medium-replay: uniform actions (the trainer's warm-up)
    or a checkpoint with the trainer's Gaussian exploration noise."""
    if part.get("policy") == "uniform":
        return scripted.random_policy(rng, act_dim)

    return noisy_policy(load_actor(part["checkpoint"])[0], noise, rng)


def unavailable(task_id: str, tier: str, gen: str | None = None) -> tuple[str, str] | None:
    """(why nothing can build task/tier, the command that fixes it), or None when it can be built."""
    if available(task_id, tier, gen):
        return None

    spec = get_task(task_id).spec
    if spec.discrete:
        return (f"no behaviour policy for {tier}",
                f"plcql-bench datasets import {task_id} {tier} <official dataset file>")
    index_file = generation(gen).index_file
    train = f"plcql-bench datasets train-behaviour {task_id} --profile {'v2' if index_file != 'index.json' else 'cpu'}"
    where = behaviour_dir() / task_id
    shown = where.relative_to(ASSETS_DIR.parents[2]) if where.is_relative_to(ASSETS_DIR.parents[2]) else where
    if _trained_index(task_id, gen) is None:
        return f"no trained MATD3 behaviour policy in {shown} ({index_file})", train
    if tier == "medium-replay":
        return (f"{shown}/{index_file} has no checkpoint sequence for medium-replay (or a checkpoint "
                "file is missing), and the training replay is not on this machine",
                f"{train} (publishes the checkpoint sequence)")
    return f"{shown}/{index_file} has no {tier} checkpoint", train


def _task_behaviour(task_id: str, tier: str) -> Behaviour | None:
    hook = recipe_for(task_id).behaviours
    return hook(task_id, tier) if hook else None


def behaviour_for(task_id: str, tier: str, gen: str | None = None) -> Behaviour | None:
    if tier == "random" and generation(gen).uniform_random and _task_behaviour(task_id, tier) is None:
        return _random(_act_dim(task_id))  # v2: the originals' random tiers are uniform joint actions
    if generation(gen).index_file != generation(None).index_file:  # v2: its own index, no fallbacks
        return trained_behaviour(task_id, tier, gen=gen) or _task_behaviour(task_id, tier)
    return (trained_behaviour(task_id, tier) or _task_behaviour(task_id, tier)
            or BEHAVIOURS.get((task_id, tier)))


def _act_dim(task_id: str) -> int:
    return get_task(task_id).spec.act_dim


def references_for(task_id: str, gen: str | None = None) -> tuple[Behaviour, Behaviour] | None:
    """(random reference, expert reference): uniform random, and the trained expert without
    noise when a checkpoint exists, else (v1 only) the scripted expert."""
    expert = trained_behaviour(task_id, "expert", noise=0.0, gen=gen)
    if expert is not None:
        return _random(_act_dim(task_id)), expert
    return REFERENCES.get(task_id) if generation(gen).index_file == generation(None).index_file else None


def available(task_id: str, tier: str, gen: str | None = None) -> str | None:
    """The policy id that would generate (task, tier), or None when nothing can build it."""
    b = behaviour_for(task_id, tier, gen)
    if b is not None:
        return b.policy_id
    if tier == "mixed":
        halves = [behaviour_for(task_id, t, gen) for t in ("medium", "expert")]
        if None not in halves:
            return f"mixed({halves[0].policy_id}|{halves[1].policy_id})"
    return None


def stale(entry: dict | None, task_id: str, tier: str, gen: str | None = None) -> str | None:
    """Why a built dataset's manifest entry no longer matches what this code would build (its
    behaviour-policy id changed, e.g. a new collection recipe), or None. Imported datasets (their
    entry names a ``source``) and tiers nothing can build are never stale. The old file stays
    usable: runs are keyed by its sha256, so their results remain valid for that data."""
    if not entry or entry.get("source"):
        return None
    now = available(task_id, tier, gen)
    old = entry.get("behaviour_policy_id")
    if now is None or old is None:
        return None
    if old == now:
        return moved_references(entry)
    return f"built from {old!r}; this code builds {now!r}"

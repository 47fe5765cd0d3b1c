"""Behaviour policies per task and tier, and the reference policies used for normalisation.

Lookup order for (task, tier), see `behaviour_for`:

1. Trained MATD3 checkpoints (datasets/matd3.py), when `<behaviour dir>/<task>/index.json` exists
   (default `datasets/assets/behaviour/`, override with PLCQL_BEHAVIOUR_DIR): expert / medium /
   random run the selected actor checkpoints with Gaussian action noise (EXPLORATION_NOISE, "noise
   added for diversity" as in OMAR), and medium-replay replays the training replay up to the
   medium checkpoint (kind="replay"; only where that replay file exists). Ids start "matd3:".
2. A task's own behaviours: `task.extras["behaviours"](tier) -> Behaviour | None` (SMAX).
3. Scripted fallbacks (datasets/scripted.py): CN landmark assignment + PD controller, PP/World a
   predator chase heuristic; medium = the same with heavy action noise; random = uniform. Ids
   start "scripted-" / "uniform-random".

Tiers without any behaviour policy are listed as unavailable by `datasets list`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from plcql_bench.datasets import scripted
from plcql_bench.suite.spec import Policy

GENERATOR_VERSION = "plcql-bench-collect-1"


@dataclass(frozen=True)
class Behaviour:
    policy_id: str
    make: Callable[[np.random.Generator], Policy]
    note: str = ""
    kind: str = "policy"  # "policy": roll out make(rng); "replay": read `replay` (medium-replay)
    replay: dict | None = None  # kind="replay": {"file", "episodes", "up_to_env_step", ...}


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


def _trained_index(task_id: str) -> tuple[dict, Path] | None:
    from plcql_bench.datasets.matd3 import behaviour_dir

    d = behaviour_dir() / task_id
    path = d / "index.json"
    if not path.is_file():
        return None
    index = json.loads(path.read_text())
    if not str(index.get("trainer", "")).startswith("plcql-bench-matd3"):
        return None  # another trainer's files (e.g. SMAX) are not MATD3 checkpoints
    return index, d


def _file_tag(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def trained_behaviour(task_id: str, tier: str, noise: float = EXPLORATION_NOISE) -> Behaviour | None:
    """The trained MATD3 behaviour for (task, tier), or None."""
    found = _trained_index(task_id)
    if found is None:
        return None
    index, d = found
    if tier == "medium-replay":
        from plcql_bench.datasets.matd3 import resolve_replay

        rep = index.get("medium_replay")
        if not rep or not resolve_replay(rep["file"]).is_file():
            return None
        rep = {**rep, "file": str(resolve_replay(rep["file"]))}
        return Behaviour(f"matd3:{task_id}/replay-to-step-{rep['up_to_env_step']}",
                         lambda rng: None, "MATD3 training replay up to the medium checkpoint",
                         kind="replay", replay=rep)
    entry = index.get("tiers", {}).get(tier)
    if entry is None:
        return None
    ckpt = d / entry["checkpoint"]

    def make(rng: np.random.Generator, ckpt=ckpt) -> Policy:
        from plcql_bench.datasets.matd3 import load_actor, noisy_policy

        return noisy_policy(load_actor(ckpt)[0], noise, rng)

    return Behaviour(f"matd3:{task_id}/{tier}@{_file_tag(ckpt)}(noise={noise})", make,
                     f"MATD3 checkpoint at {entry['env_steps']} env steps, eval return "
                     f"{entry['return']:.2f}")


def _task_behaviour(task_id: str, tier: str) -> Behaviour | None:
    from plcql_bench.suite.tasks import get_task

    hook = get_task(task_id).extras.get("behaviours")
    return hook(tier) if hook else None


def behaviour_for(task_id: str, tier: str) -> Behaviour | None:
    return (trained_behaviour(task_id, tier) or _task_behaviour(task_id, tier)
            or BEHAVIOURS.get((task_id, tier)))


def references_for(task_id: str) -> tuple[Behaviour, Behaviour] | None:
    """(random reference, expert reference): uniform random, and the trained expert without
    noise when a checkpoint exists, else the scripted expert."""
    expert = trained_behaviour(task_id, "expert", noise=0.0)
    if expert is not None:
        from plcql_bench.suite.tasks import get_task

        return _random(get_task(task_id).spec.act_dim), expert
    return REFERENCES.get(task_id)


def available(task_id: str, tier: str) -> str | None:
    """The policy id that would generate (task, tier), or None when nothing can build it."""
    b = behaviour_for(task_id, tier)
    if b is not None:
        return b.policy_id
    if tier == "mixed":
        halves = [behaviour_for(task_id, t) for t in ("medium", "expert")]
        if None not in halves:
            return f"mixed({halves[0].policy_id}|{halves[1].policy_id})"
    return None


def stale(entry: dict | None, task_id: str, tier: str) -> str | None:
    """Why a built dataset's manifest entry no longer matches what this code would build (its
    behaviour-policy id changed, e.g. a new collection recipe), or None. Imported datasets (their
    entry names a ``source``) and tiers nothing can build are never stale. The old file stays
    usable: runs are keyed by its sha256, so their results remain valid for that data."""
    if not entry or entry.get("source"):
        return None
    now = available(task_id, tier)
    old = entry.get("behaviour_policy_id")
    if now is None or old is None or old == now:
        return None
    return f"built from {old!r}; this code builds {now!r}"

"""Behaviour policies per task and tier, and the reference policies used for normalisation.

For now every behaviour policy is scripted (datasets/scripted.py): CN uses a landmark assignment
+ PD controller, PP and World a predator chase heuristic; the medium tiers run the same
controllers with heavy action noise, and the random tier is uniform. Trained MATD3 behaviour
policies replace them with the tasks-and-datasets work. Tiers without a behaviour policy
(medium-replay for now) are listed as unavailable by `datasets list`.
"""

from __future__ import annotations

from dataclasses import dataclass
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


def _random() -> Behaviour:
    return Behaviour("uniform-random-v1", scripted.random_policy, "uniform actions in [-1, 1]")


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


def behaviour_for(task_id: str, tier: str) -> Behaviour | None:
    return BEHAVIOURS.get((task_id, tier))

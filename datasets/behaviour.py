"""Behaviour policies per task and tier, and the reference policies used for normalisation.

Issue-2 scope: CN has a scripted expert (an assignment + PD controller, see scripted.py), a medium
tier that runs the same controller with heavy action noise, and a uniform-random tier. Tiers
without a behaviour policy yet are reported as unavailable by `datasets list`.
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


# (task, tier) -> behaviour policy that generates that tier's data.
BEHAVIOURS: dict[tuple[str, str], Behaviour] = {
    ("mpe-cn", "expert"): _cn_scripted(0.2),
    ("mpe-cn", "medium"): _cn_scripted(1.5),
    ("mpe-cn", "random"): _random(),
}

# task -> (random reference, expert reference). Both are measured with the evaluation protocol.
REFERENCES: dict[str, tuple[Behaviour, Behaviour]] = {
    "mpe-cn": (_random(), _cn_scripted(0.0)),
}


def behaviour_for(task_id: str, tier: str) -> Behaviour | None:
    return BEHAVIOURS.get((task_id, tier))

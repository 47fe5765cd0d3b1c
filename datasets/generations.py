"""Dataset generations: which recipes build the continuous tasks' tiers (MPE, Half-Cheetah).

A generation fixes everything about how a continuous task's tiers are made that is not the task
itself, so two generations' tiers are never mixed (their files, sha256s and run keys differ, and a
profile names the one it trains on: `datasets: {generation: v2}`):

* ``v1``: this suite's first recipes. Random = a freshly initialised MATD3 actor with noise 0.1;
  PP/World against the suite's own prey (datasets/assets/PREY.md); medium-replay = the training
  replay up to the medium checkpoint; team reward only (format v1). Kept for the smoke and nightly
  profiles and the archived results (leaderboard/archive/datasets-v1/).
* ``v2``: the originals' recipes, checked tier by tier against OMAR's published statistics
  (datasets/originals.json, `datasets cards --compare originals`). Random = uniform U(-1, 1) joint
  actions; PP/World against OMAR's pretrained prey (suite/envs/prey.py); expert and medium checkpoints
  and their noise chosen by the statistics; medium-replay at the originals' sizes; per-agent rewards
  (format v2). docs/datasets.md gives the evidence for each choice.

SMAX's tiers have one recipe (datasets/smax_tiers.py) and are the same in both generations.
"""

from __future__ import annotations

from dataclasses import dataclass

from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.envs.tasks import PREY_TASKS


@dataclass(frozen=True)
class Generation:
    name: str
    prey: str  # PP/World's prey: "suite" or "omar"
    index_file: str  # the behaviour index under datasets/assets/behaviour/<task>/
    uniform_random: bool  # random tier = uniform actions (else the step-0 MATD3 actor)
    agent_rewards: bool  # store per-agent rewards (dataset format v2)


GENERATIONS: dict[str, Generation] = {
    "v1": Generation("v1", prey="suite", index_file="index.json", uniform_random=False, agent_rewards=False),
    "v2": Generation("v2", prey="omar", index_file="index-v2.json", uniform_random=True, agent_rewards=True),
}
DEFAULT_GENERATION = "v1"


def generation(name: str | None) -> Generation:
    """The generation called `name` (None: the default); BenchError naming the known ones otherwise."""
    name = name or DEFAULT_GENERATION
    if name not in GENERATIONS:
        raise BenchError(f"unknown dataset generation {name!r} (known: {', '.join(GENERATIONS)})")
    return GENERATIONS[name]


def prey_for(task_id: str, gen: str | None) -> str:
    """The prey a generation's data of `task_id` is collected and evaluated against."""
    return generation(gen).prey if task_id in PREY_TASKS else "suite"

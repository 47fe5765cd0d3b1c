"""A unit-test profile with its dataset built: what the runner, stack, resume and stop tests start from."""

from __future__ import annotations

from pathlib import Path

from plcql_bench.datasets.build import build_dataset
from plcql_bench.suite.runs.profiles import load_profile


def profile_with_dataset(tmp: Path, profile_text: str, task: str = "mpe-cn", tier: str = "random",
                         episodes: int = 6):
    """Write `profile_text` to tmp/p.yaml, build `task`/`tier` for it under tmp/data; returns (tmp, profile)."""
    (tmp / "p.yaml").write_text(profile_text)
    profile = load_profile(str(tmp / "p.yaml"))
    build_dataset(task, tier, episodes, tmp / "data" / profile.name, profile=profile.name)
    return tmp, profile

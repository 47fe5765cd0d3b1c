"""What every importer shares (datasets/importers.py, datasets/vault.py): tier names, the paper-convention
reference returns, the attributes of an imported dataset, and its write (file, manifest entry, card)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from plcql_bench.datasets import format as fmt
from plcql_bench.datasets import manifest
from plcql_bench.datasets.cards import write_card
from plcql_bench.suite.core.spec import TaskSpec

IMPORTER_VERSION = "plcql-bench-import-1"

# task -> (expert, random, where the numbers come from)
PAPER_REFERENCES: dict[str, tuple[float, float, str]] = {
    "mpe-cn": (516.8, 159.8, "paper convention: MADiff App. G.1 (OMAR's MPE references)"),
    "mpe-pp": (185.6, -4.1, "paper convention: MADiff App. G.1 (OMAR's MPE references)"),
    "mpe-world": (79.5, -6.8, "paper convention: MADiff App. G.1 (OMAR's MPE references)"),
    "mamujoco-halfcheetah-2x3": (3568.81, -283.97,
                                 "paper convention: unattributed public script (omar_score '2half'),"
                                 " unconfirmed"),
}


def normalise_tier(tier: str) -> str:
    return tier.replace("_", "-")


def _episode_next_actions(actions: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """next_actions[t] = actions[t+1] inside an episode; zero and invalid at its last step."""
    nxt = np.zeros_like(actions)
    nxt[:-1] = actions[1:]
    nxt[last] = 0
    return nxt, (~last).astype(np.uint8)


def _write(arrays: dict[str, np.ndarray], attrs: dict[str, Any], spec: TaskSpec, data_dir: Path,
           tier: str, profile: str, source: str, extra_files: dict[str, Path] | None = None) -> dict:
    path = manifest.dataset_path(data_dir, spec.task_id, tier)
    path.parent.mkdir(parents=True, exist_ok=True)
    sha = fmt.write_dataset(path, arrays, attrs, spec=spec)
    fmt.load_dataset(path, spec=spec, expected_sha256=sha)
    entry = manifest.make_entry(data_dir, path.relative_to(data_dir), sha, profile, source=source,
                                **{k: str(v) for k, v in (extra_files or {}).items()})
    manifest.record(data_dir, entry)
    write_card(data_dir, entry)
    return entry


def _base_attrs(spec: TaskSpec, tier: str, source_id: str, source: str,
                env_versions: dict[str, str]) -> dict[str, Any]:
    ref = PAPER_REFERENCES.get(spec.task_id)
    return {
        "task_id": spec.task_id, "quality": tier,
        "behaviour_policy_id": f"imported:{source_id}",
        "generator_version": IMPORTER_VERSION, "generator_seed": -1,
        "env_versions": json.dumps(env_versions, sort_keys=True),
        "ref_return_expert": ref[0] if ref else float("nan"),
        "ref_return_random": ref[1] if ref else float("nan"),
        "ref_return_source": ref[2] if ref else "none (win-rate task)",
        "source": source,
    }

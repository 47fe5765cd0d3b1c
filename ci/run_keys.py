"""Print the full run key of every cell of a profile's matrix (and of a few sweep variants), one line per
cell, for a refactor that must not re-key finished runs: save the output before the change and diff it
after (byte-identical). Reads the built datasets' manifests (a cell whose dataset is not built is keyed on
its committed card); writes nothing.

    python ci/run_keys.py --profile paper --data-dir /work/campaign/data > before.txt
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from plcql_bench.suite.runs.matrix import expand_sweeps, parse_sweeps, resolve, select_cells
from plcql_bench.suite.runs.profiles import load_profile

# variants made from a name alone (algorithms/base.py: sweeps), one per action kind and value type
SWEEPS = ("plcql.temperature=0.5,2", "cfcql.cql_alpha=0.1", "plcql.fixed_k=uniform")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="paper")
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    args = parser.parse_args()
    profile = load_profile(args.profile)
    cells = expand_sweeps(select_cells(profile), parse_sweeps(SWEEPS))
    with tempfile.TemporaryDirectory() as results:
        for item in resolve(cells, profile, args.data_dir, Path(results)):
            c = item.cell
            key = item.plan.run_key if item.plan is not None else f"unresolved: {item.error}"
            print(f"{c.algo} {c.task} {c.tier} {c.seed} {key}")


if __name__ == "__main__":
    main()

"""Every file the documentation names exists: relative Markdown links in docs/ and README.md, and every
path of ours (under suite/, algorithms/, datasets/, leaderboard/, docs/, ci/, containers/, tests/, .ci/)
written in docs/, README.md or a source file's comments. A renamed or deleted file shows up here, not in
a reader's 404. Also: the algorithm tables of docs/algorithms/README.md list every registered algorithm."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
SOURCES = [p for top in ("suite", "algorithms", "datasets", "leaderboard", "ci", "tests")
           for p in sorted((ROOT / top).rglob("*")) if p.suffix in (".py", ".yaml") and p.is_file()]
# Paths that look like ours but name another repository's file or a placeholder.
NOT_OURS = {
    "algorithms/maddpg.py",  # ling-pan/OMAR's
    "suite/runs/calibrations/MACHINE.json",  # bench-speed --calibrate MACHINE writes suite/runs/calibrations/<MACHINE>.json
    "docs/dataset_cards/cfcql.md",  # og-marl@f4eb8f0's (OG-MARL's cards of CFCQL's datasets)
}
# The research note cites other repositories' files throughout; its links are still checked.
NOTES = ROOT / "docs" / "reference-implementations.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# a path of ours: one of our folders, then path characters, ending in a file extension (no placeholders)
PATH = re.compile(r"(?<![\w./-])((?:suite|algorithms|datasets|leaderboard|docs|ci|containers|tests|\.ci)"
                  r"/[\w./-]*\.(?:py|md|yaml|yml|json|toml|sh|txt|html|j2|css))(?![\w*<{])")


def test_markdown_links_resolve():
    missing = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#")[0]
            if path and not (doc.parent / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}: ({target})")
    assert not missing, "links to missing files:\n" + "\n".join(missing)


def test_named_paths_exist():
    missing = []
    for f in [d for d in DOCS if d != NOTES] + SOURCES:
        for path in PATH.findall(f.read_text(encoding="utf-8")):
            if path not in NOT_OURS and not (ROOT / path).exists():
                missing.append(f"{f.relative_to(ROOT)}: {path}")
    assert not missing, "named files that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_the_path_pattern_finds_paths():
    text = "see `suite/core/spec.py: Task`, docs/runner.md \"Identity\" and thu-rllab/CFCQL:continuous/x.py"
    assert PATH.findall(text) == ["suite/core/spec.py", "docs/runner.md"]


def test_algorithm_tables_list_every_registered_algorithm():
    from plcql_bench.algorithms.base import IMPLEMENTATIONS, load_all

    load_all()
    text = (ROOT / "docs" / "algorithms" / "README.md").read_text(encoding="utf-8")
    continuous, discrete = text.split("# Discrete-action algorithms", 1)
    for kind, section in ((False, continuous), (True, discrete)):
        for name, cls in IMPLEMENTATIONS[kind].items():
            if getattr(cls, "variant_of", None) is None:
                assert f"`{name}`" in section, (name, "discrete" if kind else "continuous")
                assert f"`algorithms/{cls.__module__.rpartition('.')[2]}.py`" in section, name

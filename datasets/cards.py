"""Dataset cards: a short, human-readable record of what a built dataset contains.

A card is written next to every dataset (`<data>/<profile>/<task>/<tier>.card.md`) when it is built
or imported, from its manifest entry alone, so it states exactly what the manifest records: size,
episodes, return mean ± std / min / max, the normalised mean return, win rate (SMAX/SMAC), the
behaviour policy, the reference returns, environment versions and the file's sha256.

`plcql-bench datasets cards --profile P` copies the cards of every dataset in data/P/ to
`datasets/cards/P/` (committed: the datasets themselves are too large) with an index README that
checks the tier ordering expert > medium > random per task.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from plcql_bench.datasets import manifest
from plcql_bench.datasets.format import normalised_score
from plcql_bench.suite.core.store import atomic_write_bytes
from plcql_bench.datasets.smax_tiers import card_rows
from plcql_bench.suite.core.errors import BenchError

CARDS_DIR = Path(__file__).resolve().parent / "cards"
TIER_ORDER = ("expert", "mixed", "medium", "medium-replay", "random")


def _num(x: Any, digits: int = 1) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{float(x):.{digits}f}"


def normalised_mean(entry: dict[str, Any]) -> float | None:
    """The dataset's mean return on the normalised scale, or None without reference returns."""
    try:
        return float(normalised_score(entry["return_mean"], entry))
    except (KeyError, ValueError, ZeroDivisionError):
        return None


def card_markdown(entry: dict[str, Any]) -> str:
    """The card of one manifest entry, as Markdown."""
    env = entry.get("env_versions", {})
    if isinstance(env, str):
        env = json.loads(env)
    rows = [
        ("task", entry["task_id"]), ("tier", entry["quality"]), ("profile", entry.get("profile", "—")),
        ("transitions", f"{entry['n_transitions']:,}"), ("episodes", f"{entry['n_episodes']:,}"),
        ("return mean ± std", f"{_num(entry['return_mean'], 2)} ± {_num(entry['return_std'], 2)}"),
        ("return min / max", f"{_num(entry['return_min'], 2)} / {_num(entry['return_max'], 2)}"),
        ("normalised mean return", _num(normalised_mean(entry))),
    ]
    if entry.get("win_rate") is not None:
        rows.append(("win rate", f"{float(entry['win_rate']):.3f}"))
    rows += [
        ("reference returns (random / expert)",
         f"{_num(entry.get('ref_return_random'), 2)} / {_num(entry.get('ref_return_expert'), 2)}"),
        ("behaviour policy", f"`{entry.get('behaviour_policy_id', '—')}`"),
        ("source", entry.get("source", "built by `plcql-bench datasets build`")),
        ("generator", f"{entry.get('generator_version', '—')}, seed {entry.get('generator_seed', '—')}"),
        ("environment", ", ".join(f"{k} {v}" for k, v in sorted(env.items())) or "—"),
        ("file", f"`{entry['file']}` ({entry.get('size_bytes', 0) / 2**20:.1f} MiB)"),
        ("sha256", f"`{entry['sha256']}`"),
    ]
    built = entry.get("built_on")
    if isinstance(built, dict):  # the bytes depend on the CPU's instruction set (dataset_identity)
        rows.append(("built on", f"{built.get('cpu', '?')} ({built.get('cpu_isa') or 'instruction set not recorded'})"))
    if str(entry.get("task_id", "")).startswith("smax-"):  # how the tier was chosen, the reference's

        rows += card_rows(entry)
    lines = [f"# Dataset card: {entry['task_id']} / {entry['quality']}", "", "| field | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines) + "\n"


def write_card(data_dir: str | Path, entry: dict[str, Any]) -> Path:
    """Write `<tier>.card.md` next to the dataset file; returns its path."""
    path = (Path(data_dir) / entry["file"]).with_suffix(".card.md")
    atomic_write_bytes(path, card_markdown(entry).encode())
    return path


def committed_entry(profile: str, task_id: str, tier: str) -> dict[str, Any] | None:
    """The manifest entry recorded in a committed card (datasets/cards/<profile>/<task>/<tier>.json), or None."""
    path = CARDS_DIR / profile / task_id / f"{tier}.json"
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and "file" in entry else None


# A rebuild of a committed card's dataset on another machine: the same recipe (every field below equal), but
# bytes that differ because the floating-point kernels do. torch, numpy and XLA choose their kernels by the
# CPU's instruction set (AVX2 and AVX-512 sum in different orders), so a policy's actions differ in the
# last bits and the sha256 with them (measured 2026-11-28: CN random rebuilt on an AVX2-only EPYC, returns
# within 5e-8 relative of its card; PP expert, whose prey is a learned policy too, within 1e-4).
RECIPE_FIELDS = ("task_id", "quality", "profile", "file", "format_version", "behaviour_policy_id",
                 "generator_version", "generator_seed", "env_versions", "n_episodes", "source", "input_sha256")
# The transition count is the episodes' total length, an outcome of the rollouts like the returns: SMAX's
# float32 physics can end an episode a step later on another CPU (6h_vs_8z expert, built 2026-11-28 on an
# AVX2 EPYC: 149,475 transitions against the card's 149,474, every return statistic within 5e-9).
REBUILD_STATS = ("return_mean", "return_std", "return_min", "return_max", "win_rate", "n_transitions")
REBUILD_RTOL = 1e-3  # far below a recipe change's effect (a policy, seed or tier moves these by > 1 %)
# The reference returns are statistics of the expert and random policies' evaluation, so they drift in the
# last bits too (measured: 5e-8 relative on CN random, 1.04e-7 on World expert) and take the same tolerance.
# A run on a rebuild is scored with its card's reference returns (card_scoring), never the build's, so its
# score follows from the card's exactly (the leaderboard checks it to 1e-6) and matches the card's other runs.
REBUILD_REFS = ("ref_return_random", "ref_return_expert")


# The return statistics are compared on the returns' scale, which takes the spread in: a mean near zero of
# returns spread over +-15 drifts relative to the spread, not to itself (World medium-replay, rebuilt on an
# AVX2 EPYC: mean 2.8060 against 2.8078, 6.4e-4 of the mean, 1.2e-4 of the std 14.68).
RETURN_STATS = ("return_mean", "return_std", "return_min", "return_max")


def _rel(a: float, b: float, scale: float = 1.0) -> float:
    return abs(a - b) / max(1.0, abs(a), abs(b), scale)


def rebuild_difference(entry: dict[str, Any], card: dict[str, Any]) -> float | None:
    """How far a built dataset's summary statistics are from a committed card of the same recipe: the
    largest of |a - b| / max(1, |a|, |b|) over REBUILD_STATS and REBUILD_REFS, with the return statistics'
    denominator at least the larger return_std (RETURN_STATS). None when it is not a rebuild
    of that card: the recipe differs (any RECIPE_FIELDS value) or a statistic is recorded on one side only."""
    if any(entry.get(f) != card.get(f) for f in RECIPE_FIELDS):
        return None
    worst = 0.0
    spread = max(abs(entry.get("return_std") or 0.0), abs(card.get("return_std") or 0.0))
    for stat in REBUILD_STATS + REBUILD_REFS:
        a, b = entry.get(stat), card.get(stat)
        if (a is None) != (b is None) or (a is not None and math.isnan(a) != math.isnan(b)):
            return None
        if a is None or math.isnan(a):  # NaN on both sides: not defined for this task (SMAX references)
            continue
        worst = max(worst, _rel(a, b, spread if stat in RETURN_STATS else 1.0))
    return worst


def dataset_identity(entry: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """The sha256 that names a built dataset in run identities, and the rebuild record when it is not the
    file's own. A file whose sha256 is its committed card's is that card's dataset. A rebuild of the card's
    recipe whose statistics and reference returns are within REBUILD_RTOL of the card's takes the card's
    sha256, so the committed runs on that card stay this dataset's runs on any machine; the record
    ({"card_sha256", "file_sha256", "max_rel_diff", "card_refs", "file_refs"}) goes into each run's
    final.json, and its runs are scored with card_refs. Anything else is a dataset of its own."""
    card = committed_entry(str(entry.get("profile")), str(entry.get("task_id")), str(entry.get("quality")))
    if card is None or card["sha256"] == entry["sha256"]:
        return entry["sha256"], None
    diff = rebuild_difference(entry, card)
    if diff is None or diff > REBUILD_RTOL:
        return entry["sha256"], None
    return card["sha256"], {"card_sha256": card["sha256"], "file_sha256": entry["sha256"], "max_rel_diff": diff,
                            "card_refs": _refs(card), "file_refs": _refs(entry)}


def off_card(entry: dict[str, Any]) -> str | None:
    """Why a built dataset is not its committed card's dataset (so its runs are not the board's runs of that
    tier), or None: it is the card's file, a rebuild of it (dataset_identity), or has no committed card."""
    card = committed_entry(str(entry.get("profile")), str(entry.get("task_id")), str(entry.get("quality")))
    if card is None or dataset_identity(entry)[0] == card["sha256"]:
        return None
    diff = rebuild_difference(entry, card)
    how = moved_references(entry) or (
        "another recipe than the card's" if diff is None else
        f"its statistics or reference returns are up to {diff:.1e} relative from the card's, beyond {REBUILD_RTOL:g}")
    return (f"sha256 {entry['sha256'][:12]}, the card's {card['sha256'][:12]} ({how}); "
            "its runs will not count as the board's runs of this tier")


def moved_references(entry: dict[str, Any]) -> str | None:
    """Why a build of its committed card's recipe is not that card's data, though its behaviour policy is the
    same: its reference returns are not the card's (the reference policy changed since it was built, e.g. a new
    expert checkpoint; the tier's own episodes may be identical), or None."""
    card = committed_entry(str(entry.get("profile")), str(entry.get("task_id")), str(entry.get("quality")))
    if card is None or card["sha256"] == entry["sha256"] or any(entry.get(f) != card.get(f) for f in RECIPE_FIELDS):
        return None
    moved = [k for k in REBUILD_REFS if isinstance(entry.get(k), (int, float)) and isinstance(card.get(k), (int, float))
             and _rel(entry[k], card[k]) > REBUILD_RTOL]
    if not moved:
        return None
    return "reference returns " + ", ".join(f"{k.removeprefix('ref_return_')} {entry[k]:.2f}" for k in moved) \
        + " where its card has " + ", ".join(f"{card[k]:.2f}" for k in moved)


def _refs(entry: dict[str, Any]) -> dict[str, float | None]:
    return {k: entry.get(k) for k in REBUILD_REFS}


def card_scoring(dataset, rebuild: dict[str, Any] | None):
    """The dataset as its runs score it: a rebuild with its card's reference returns in place of its own
    (the card names the dataset; the build's own stay in the rebuild record's file_refs)."""
    if rebuild:
        dataset.attrs.update(rebuild["card_refs"])
    return dataset


def reference_disagreements(by_task: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """One line per task whose tiers' cards carry different reference returns (beyond REBUILD_RTOL). A task's
    tiers are normalised on one scale: a tier built before its reference policy changed (CN random kept the
    first v2 expert's 531.66 after the expert moved to 578.72, found 2026-12-06) is scored on another."""
    lines = []
    for task, tiers in sorted(by_task.items()):
        for ref in REBUILD_REFS:
            vals = {t: e[ref] for t, e in tiers.items() if isinstance(e.get(ref), (int, float)) and not math.isnan(e[ref])}
            first = next(iter(vals.values()), None)
            if any(_rel(v, first) > REBUILD_RTOL for v in vals.values()):
                listed = ", ".join(f"{t} {v:.2f}" for t, v in sorted(vals.items()))
                lines.append(f"{task}: the tiers' cards disagree on {ref} ({listed}); rebuild the odd tier with "
                             f"`plcql-bench datasets build {task} TIER --force` and export its card")
    return lines


TIER_ORDER = ("expert", "medium", "random")  # by mean return, best first


def tier_order_ok(entries: dict[str, dict[str, Any]]) -> bool | None:
    """expert > medium > random by mean return (tiers present among the three); None if < 2."""
    means = [entries[t]["return_mean"] for t in TIER_ORDER if t in entries]
    if len(means) < 2:
        return None
    return all(a > b for a, b in zip(means, means[1:]))


def export_cards(data_dir: str | Path, out_dir: str | Path, profile: str, echo=lambda line: None) -> list[Path]:
    """Write every manifest entry's card (`<task>/<tier>.md`) and entry (`<task>/<tier>.json`)
    to out_dir, plus an index README. Returns the files written. A card already in out_dir that the built
    dataset is a rebuild of (another CPU's bytes, dataset_identity) is kept: replacing it would orphan
    every run named by it."""
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    entries = manifest.read_manifest(data_dir)
    if not entries:
        raise BenchError(f"{manifest.manifest_path(data_dir)}: no datasets built for profile {profile!r}")
    written: list[Path] = []
    by_task: dict[str, dict[str, dict[str, Any]]] = {}
    for entry in entries.values():
        base = out_dir / entry["task_id"] / entry["quality"]
        kept = _card_it_rebuilds(entry, base.with_suffix(".json"))
        by_task.setdefault(entry["task_id"], {})[entry["quality"]] = kept or entry
        if kept is not None:
            echo(f"kept {base.with_suffix('.json')}: {entry['task_id']}/{entry['quality']} here is a rebuild of it "
                 f"(sha256 {entry['sha256'][:12]}, the card's {kept['sha256'][:12]})")
            continue
        base.parent.mkdir(parents=True, exist_ok=True)
        record = {k: v for k, v in entry.items() if k != "created"}  # stable across rebuilds
        atomic_write_bytes(base.with_suffix(".md"), card_markdown(entry).encode())
        atomic_write_bytes(base.with_suffix(".json"), (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
        written += [base.with_suffix(".md"), base.with_suffix(".json")]
    for card_file in sorted(out_dir.glob("*/*.json")):  # committed cards of datasets not built here stay listed
        card = _read_card(card_file)
        if card and card.get("quality") not in by_task.get(card.get("task_id"), {}):
            by_task.setdefault(card["task_id"], {})[card["quality"]] = card
    for line in reference_disagreements(by_task):
        echo(f"warning: {line}")
    index = out_dir / "README.md"
    atomic_write_bytes(index, _index(by_task, profile).encode())
    return written + [index]


def _read_card(card_file: Path) -> dict[str, Any] | None:
    try:
        card = json.loads(card_file.read_text())
    except (OSError, ValueError):
        return None
    return card if isinstance(card, dict) and "task_id" in card and "quality" in card else None


def _card_it_rebuilds(entry: dict[str, Any], card_file: Path) -> dict[str, Any] | None:
    try:
        card = json.loads(card_file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(card, dict) or card.get("sha256") == entry["sha256"]:
        return None
    diff = rebuild_difference(entry, card)
    return card if diff is not None and diff <= REBUILD_RTOL else None


def _index(by_task: dict[str, dict[str, dict[str, Any]]], profile: str) -> str:
    lines = [f"# Dataset cards: profile `{profile}`", "",
             "Written by `plcql-bench datasets cards --profile " + profile + "` from `data/" + profile +
             "/manifest.json`. The datasets are not committed (rebuild them with `plcql-bench datasets "
             "build --all --profile " + profile + "`; the sha256 in each card identifies the file).", "",
             "| task | tier | transitions | episodes | return mean ± std | min / max | normalised | win rate |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    order_lines = []
    for task in sorted(by_task):
        tiers = by_task[task]
        for tier in sorted(tiers, key=lambda t: TIER_ORDER.index(t) if t in TIER_ORDER else 99):
            e = tiers[tier]
            wr = "—" if e.get("win_rate") is None else f"{float(e['win_rate']):.3f}"
            lines.append(f"| {task} | [{tier}]({task}/{tier}.md) | {e['n_transitions']:,} | {e['n_episodes']:,} | "
                         f"{_num(e['return_mean'], 2)} ± {_num(e['return_std'], 2)} | "
                         f"{_num(e['return_min'], 1)} / {_num(e['return_max'], 1)} | "
                         f"{_num(normalised_mean(e))} | {wr} |")
        ok = tier_order_ok(tiers)
        if ok is not None:
            chain = " > ".join(t for t in TIER_ORDER if t in tiers)  # the tiers it compared
            order_lines.append(f"- {task}: {chain} by mean return: **{'yes' if ok else 'NO'}**")
    return "\n".join(lines + [""] + order_lines) + "\n"

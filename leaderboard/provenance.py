"""Where the numbers come from: the committed dataset cards, every run's provenance (seed,
score, commit, budget, hardware, wall time, dataset sha and card) and the build's summary for
the footer (commits, packages, environment settings)."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path

from plcql_bench.leaderboard import paper as pp
from plcql_bench.leaderboard.cells import Cell, format_score
from plcql_bench.leaderboard.scoring import DEFAULT_VIEW, View
from plcql_bench.suite.core.schema import device_kind, run_seconds
from plcql_bench.datasets.cards import CARDS_DIR
from plcql_bench.suite.runs.versions import TRACKED

__all__ = ["load_cards", "dataset_cards", "run_rows", "build_provenance", "short_commit"]


def cards_dir() -> Path:
    return CARDS_DIR


def load_cards(root: Path | None = None) -> list[dict]:
    """The committed dataset cards (``datasets/cards/<profile>/<task>/<tier>.json``)."""
    root = cards_dir() if root is None else Path(root)
    out = []
    for path in sorted(root.glob("*/*/*.json")):
        try:
            card = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        if isinstance(card, dict) and isinstance(card.get("sha256"), str):
            card.setdefault("task_id", path.parent.name)
            card.setdefault("quality", path.stem)
            card.setdefault("profile", path.parent.parent.name)
            out.append(card)
    return out


def card_anchor(card: dict) -> str:
    return f"card-{card['profile']}-{card['task_id']}-{card['quality']}"


def _num(v, fmt: str) -> str:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return format(v, fmt) if ok else "\u2014"


def dataset_cards(cards: list[dict], runs: list, paper: dict | None) -> list[dict]:
    """The cards of the profiles that have runs, with how many runs used each dataset (same sha)."""
    profiles = {r.rec.profile for r in runs}
    by_sha = Counter(r.rec.dataset_sha256 for r in runs)
    out = []
    for c in cards:
        if c["profile"] not in profiles:
            continue
        domain = c["task_id"].partition("-")[0]
        out.append({"anchor": card_anchor(c), "profile": c["profile"], "task": c["task_id"], "tier": c["quality"],
                    "n_transitions": _num(c.get("n_transitions"), ","), "n_episodes": _num(c.get("n_episodes"), ","),
                    "return": f"{_num(c.get('return_mean'), '.2f')} \u00b1 {_num(c.get('return_std'), '.2f')}",
                    "range": f"[{_num(c.get('return_min'), '.2f')}, {_num(c.get('return_max'), '.2f')}]",
                    "win_rate": _num(c.get("win_rate"), ".2f"), "behaviour": str(c.get("behaviour_policy_id", "\u2014")),
                    "ref": f"{_num(c.get('ref_return_random'), '.2f')} / {_num(c.get('ref_return_expert'), '.2f')}",
                    "sha256": c["sha256"], "n_runs": by_sha.get(c["sha256"], 0),
                    "_rank": (pp.task_rank(paper, c["task_id"]), pp.tier_rank(domain, c["quality"]))})
    out.sort(key=lambda c: c.pop("_rank"))
    return out


def short_commit(commit: str) -> str:
    """First 12 hex digits, keeping a "-dirty" marker."""
    dirty = commit.endswith("-dirty")
    base = commit[: -len("-dirty")] if dirty else commit
    return base[:12] + ("-dirty" if dirty else "")


def _hardware(rec) -> str:
    h = rec.hardware or {}
    if h:
        where = h.get("gpu") or h.get("cpu") or "?"
        where += f" ({h['cpu_isa']})" if h.get("cpu_isa") and not h.get("gpu") else ""
        label = f"{h.get('device', '?')}: {where}" + (f", {h['torch_threads']} torch thread(s)" if h.get("torch_threads") else "")
        if isinstance(h.get("kernels"), dict):  # older runs did not record their kernels
            label += f", kernels {h['kernels'].get('choice', '?')}"
        return label + _device_changes(rec.train.get("devices") or [])
    torch = rec.versions.get("torch", "")
    return f"not recorded (torch {torch})" if torch else "not recorded"


def _device_changes(devices: list[dict]) -> str:
    """A run that resumed on another kind of device (runner.fresh_state): where its earlier rounds ran."""
    if len(devices) < 2:
        return ""
    spans = [f"{d['device']} from update {d['from_update']}" for d in devices]
    return f" (resumed across devices: {'; '.join(spans)})"


def run_rows(cells: list[Cell], cards: list[dict], label) -> list[dict]:
    """Per cell (anchor), its runs' provenance rows, in table order of the cells."""
    by_sha = {c["sha256"]: c for c in cards}
    out = []
    for cell in cells:
        rows = []
        for r in cell.runs:
            x, card = r.rec, by_sha.get(r.rec.dataset_sha256)
            b = x.budget or {}
            rows.append({
                "anchor": r.anchor, "seed": x.seed, "path": r.path, "run_key": x.run_key,
                "values": {k: format_score(v, x.score_name) for k, v in r.values.items()},
                "score": format_score(r.values[DEFAULT_VIEW.key], x.score_name),
                "last10": format_score(r.values[View("last10", DEFAULT_VIEW.norm).key], x.score_name),
                "best": format_score(r.values[View("best", DEFAULT_VIEW.norm).key], x.score_name),
                "commit": x.git_commit or "unknown", "dirty": x.dirty,
                "budget": (f"{b['updates']:,} rounds, eval {b.get('eval_episodes', '?')} ep every "
                           f"{b.get('eval_every', '?')}, final {b.get('final_eval_episodes', '?')} ep") if "updates" in b else "not recorded",
                "hardware": _hardware(x), "wall_s": x.train.get("wall_clock_s"),
                "sha": x.dataset_sha256, "card": card_anchor(card) if card else None,
                "rebuild": x.extra.get("dataset_rebuild"),  # trained on another CPU's rebuild of the card
                "source": x.extra.get("dataset_source"),  # an imported dataset's origin (e.g. vault:<path>#<uid>)
                "warnings": list(x.warnings), "collapse": x.par_collapse, "finished_at": x.finished_at,
            })
        out.append({"anchor": cell.anchor, "label": f"{label(cell.algo)} \u00b7 {cell.task} \u00b7 {cell.dataset} \u00b7 {cell.profile}",
                     "runs": rows})
    return out


def build_provenance(runs: list, now: datetime) -> dict:
    """Footer summary: build date, profiles, protocol/schema versions, commits (dirty flagged),
    package versions and the environment settings (per task: episode limits, physics variants)."""

    packages: dict[str, Counter] = defaultdict(Counter)
    settings: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for r in runs:
        for k, v in r.rec.versions.items():
            if k in TRACKED or k == "python":
                packages[k][str(v)] += 1
            else:
                settings[r.rec.task][k].add(str(v))
    commits = Counter(r.rec.git_commit or "unknown" for r in runs)
    return {
        "build_date_utc": now.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "n_runs": len(runs),
        "profiles": dict(sorted(Counter(r.rec.profile for r in runs).items())),
        "protocol_versions": dict(sorted(Counter(str(r.rec.protocol_version) for r in runs).items())),
        "schema_versions": sorted({r.rec.schema_version for r in runs}),
        "git_commits": dict(sorted(commits.items())),
        "n_dirty": sum(r.rec.dirty for r in runs),
        "packages": {k: dict(sorted(v.items())) for k, v in sorted(packages.items())},
        "env_settings": {t: {k: sorted(v) for k, v in sorted(s.items())} for t, s in sorted(settings.items())},
        "images": sorted({json.dumps(r.rec.image, sort_keys=True) for r in runs if r.rec.image}),
        "compute": compute_spent(runs),
    }


def hardware_label(hardware: dict | None) -> str:
    """One name per kind of machine a run trained on: the GPU's name on CUDA, else the CPU model with its
    core count and torch threads; runs written before results recorded their hardware are "unrecorded"."""
    if not hardware:
        return "unrecorded"
    if device_kind(hardware.get("device", "cpu")) == "cuda":
        return f"GPU {hardware.get('gpu', 'unknown')}"
    return (f"CPU {hardware.get('cpu', 'unknown')}, {hardware.get('cpu_count', '?')} cores, "
            f"{hardware.get('torch_threads', '?')} torch thread(s) per run")


def compute_spent(runs: list) -> list[dict]:
    """The compute behind the board, from the runs' own records: per kind of machine, runs and hours of
    training (`run_seconds`, summed over runs; runs that shared a machine overlap in time, so this is
    run-hours, not machine-hours)."""
    hours: dict[str, float] = defaultdict(float)
    count: Counter = Counter()
    for r in runs:
        kind = hardware_label(r.rec.hardware)
        hours[kind] += run_seconds(r.rec.train) / 3600.0
        count[kind] += 1
    return [{"hardware": k, "runs": count[k], "run_hours": round(hours[k], 2)}
            for k in sorted(count, key=lambda k: (-hours[k], k))]

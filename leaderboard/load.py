"""Loading a results folder: valid runs, unfinished runs, and every file that was skipped.

Runs come from ``final.json`` files through the one result schema (suite/core/schema.py: types,
score = final evaluation, finite numbers, run key = hash of the identity, file in the run
directory its key names). On top of that the leaderboard skips, with the reason:

* a repeated seed of the same cell (the later ``finished_at``, then path, is kept);
* runs on an older build of their dataset (per profile, task and tier only the runs on the sha256
  of the most recently finished run count, so a cell never mixes two datasets);
* runs under an older config of their algorithm (per profile, algorithm, task and tier only the runs
  with the config of the most recently finished run count, so a cell never mixes two configs, e.g.
  seeds trained before and after a default changed; an absent key-neutral field reads as its neutral
  value, as in the run key);
* a normalised score that does not follow from the mean return and the committed dataset card's
  reference returns (when a card for the run's dataset sha256 exists).

Run directories without final.json are *unfinished*: ``failed``, ``running`` or ``interrupted``
per their status.json; a status.json that cannot be read makes the run *damaged* (listed and
counted as skipped, never dropped silently).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from plcql_bench.leaderboard.cells import DIVERGED, Run, critic_diverged
from plcql_bench.suite.core.schema import Damaged, RunRecord, scan_records
from plcql_bench.suite.core.store import link_leaving
from plcql_bench.algorithms.base import implementations
from plcql_bench.algorithms.plcql import par_collapse
from plcql_bench.leaderboard.analysis import run_metrics

__all__ = ["Loaded", "Unfinished", "load"]


@dataclass(frozen=True)
class Unfinished:
    """A run directory with no final.json."""

    path: str  # its status.json, relative to the results folder
    state: str  # failed | running | interrupted | damaged
    algo: str
    task: str
    dataset: str
    seed: int | None
    profile: str
    error: str


@dataclass(frozen=True)
class Loaded:
    runs: list  # of Run, by path
    skipped: list  # of Damaged, by path
    unfinished: list  # of Unfinished, by path


def load(results_dir: Path, cards: dict | None = None) -> Loaded:
    """Everything the page needs from ``results_dir``. ``cards``: {sha256: card dict} of the
    committed dataset cards, for the reference-return check."""
    records, skipped = scan_records(results_dir)
    records = _one_per_seed(records, skipped)
    records = _newest_dataset_build(records, skipped)
    records = _newest_config(records, skipped)
    runs = []
    for path, rec in records:
        rec = with_par_collapse(Path(results_dir), path, rec)
        rec = with_critic_check(Path(results_dir), path, rec)
        problem = _card_mismatch(rec, (cards or {}).get(rec.dataset_sha256))
        if problem:
            skipped.append(Damaged(path, problem))
        else:
            runs.append(Run.of(path, rec))
    unfinished = _unfinished(Path(results_dir), skipped)
    runs.sort(key=lambda r: r.path)
    skipped.sort(key=lambda s: s.path)
    return Loaded(runs, skipped, unfinished)


@dataclass(frozen=True)
class Archive:
    """A folder of superseded results next to the results folder (``<parent>/archive/<name>/``, with a
    README.md saying why): the page names it, no number on it comes from it."""

    path: str  # as shown: <parent folder name>/archive/<name>
    title: str  # the README's first heading
    n_runs: int  # final.json files in it
    n_checks: int = 0  # official-code check files in it (suite/core/official.py: .../seed<S>.json)

    @property
    def contents(self) -> str:
        """What it holds, e.g. "2 runs" or "9 official-code checks" (both when it holds both)."""
        parts = [f"{self.n_runs} run{'' if self.n_runs == 1 else 's'}"] if self.n_runs or not self.n_checks else []
        if self.n_checks:
            parts.append(f"{self.n_checks} official-code check{'' if self.n_checks == 1 else 's'}")
        return ", ".join(parts)


def archives(results_dir: Path) -> list[Archive]:
    """The archives beside ``results_dir`` (leaderboard/results -> leaderboard/archive/*), by name."""
    root = Path(results_dir).resolve().parent / "archive"
    out = []
    for readme in sorted(root.glob("*/README.md")) if root.is_dir() else []:
        heading = next((ln.lstrip("#").strip() for ln in readme.read_text(encoding="utf-8").splitlines()
                        if ln.startswith("#")), readme.parent.name)
        checks = sum(1 for f in readme.parent.rglob("seed*.json") if f.stem[4:].isdigit())
        out.append(Archive(f"{root.parent.name}/archive/{readme.parent.name}", heading,
                           sum(1 for _ in readme.parent.rglob("final.json")), checks))
    return out


def learns_par(rec: RunRecord) -> bool:
    """A PLCQL run (or variant) whose pi_par is learned, i.e. not an ablation with a fixed k."""
    return rec.algo.startswith("plcql") and rec.config.get("fixed_k", "absent") is None


def with_par_collapse(results_dir: Path, path: str, rec: RunRecord, history: list[dict] | None = None) -> RunRecord:
    """The record, with `par_collapse` recomputed from the run's metrics.jsonl under the current rule
    (algorithms/plcql.py `par_collapse`) when its final.json has none: runs finished before that rule
    was fixed (2026-11-26: one evaluation point above the entropy threshold used to hide a collapse).
    A recomputed entry says so ("source"). `history`: the run's metrics.jsonl rows when the caller has
    read them already."""
    if rec.par_collapse or not learns_par(rec):
        return rec

    info = par_collapse(_history(results_dir, path, history), learned=True)
    if info is None:
        return rec
    return dataclasses.replace(rec, par_collapse={**info, "source": "metrics.jsonl (recomputed by the leaderboard)"})


DIVERGENCE_KEY = "train/critic/td_loss"  # the critic's TD loss, as every critic-based algorithm logs it
DIVERGENCE_FACTOR = 100.0  # ended diverged: late TD loss this many times the early one
DIVERGENCE_SHARE = 0.2  # early = the first 20 % of the logged points, late = the last 20 %
DIVERGENCE_PEAK_FACTOR = 3000.0  # diverged on the way: a stretch of TD loss this many times the early one
DIVERGENCE_WINDOW = 5  # a stretch = the median of this many consecutive logged points (one spike is not one)
# The rule in words, for the page's badge and banner (the template reads these, never its own numbers)
DIVERGENCE_RULE = {"factor": f"{DIVERGENCE_FACTOR:,.0f}", "share": f"{DIVERGENCE_SHARE:.0%}".replace("%", " %"),
                   "peak_factor": f"{DIVERGENCE_PEAK_FACTOR:,.0f}", "window": DIVERGENCE_WINDOW}


def critic_divergence(history: list[dict]) -> dict | None:
    """{"early", "late", "ratio", "peak", "peak_ratio", "peak_update", "rule"} when the critic's TD loss
    shows a divergence, else None. Early and late are the medians of the first and the last
    DIVERGENCE_SHARE of the logged points; peak is the highest median of DIVERGENCE_WINDOW consecutive
    points (medians, so one spike neither raises nor hides either). Two rules, either flags:
      * "ended": late > DIVERGENCE_FACTOR x early (the critic is still diverged at the end);
      * "peaked": peak > DIVERGENCE_PEAK_FACTOR x early (it ran away during training and came partly
        back, as PLCQL's CN medium seed 2: TD loss 126 early, 3.1e6 around round 1,710, 79x at the end;
        its Q at the data fell from 133 to -25 and its score from 67 to 4).
    Runs without a TD loss, or with fewer than 10 points of it, are not judged. Measured on the committed
    paper runs (2026-11-27, 109 runs judged): CFCQL on CN medium-replay ends at 2.6-3.1x its early median
    and no run that trained normally above 39x (OMAR, PP medium); the three PLCQL CN medium-replay runs
    with Algorithm 1's defaults at 135x, 13,000x and 452,000x, and MACQL on CN expert at 267x (score 45.7)
    and 11,000,000x (score -17.2) (docs/reproduction.md). Peaks (2026-11-29, 280 runs judged): every run
    the "ended" rule leaves alone peaks at most 690x (`plcql-k1`, CN medium-replay seed 1, score 55.9)
    except that PLCQL run (24,900x); of the runs it flags, those whose score collapsed peak at 11,000x and
    above."""
    info = td_loss_trend(history)
    if info is None:
        return None
    if info["late"] > DIVERGENCE_FACTOR * info["early"]:
        return {**info, "rule": "ended"}
    if info["peak"] > DIVERGENCE_PEAK_FACTOR * info["early"]:
        return {**info, "rule": "peaked"}
    return None


def td_loss_trend(history: list[dict]) -> dict | None:
    """{"early", "late", "ratio", "peak", "peak_ratio", "peak_update"} of the critic's TD loss, as
    `critic_divergence` judges it, for any run (diverged or not); None for runs without a TD loss, with fewer
    than 10 points of it, or with no positive early median."""
    rows = [h for h in history if isinstance(h.get(DIVERGENCE_KEY), (int, float))]
    losses = [float(h[DIVERGENCE_KEY]) for h in rows]
    if len(losses) < 10:
        return None
    n = max(1, int(len(losses) * DIVERGENCE_SHARE))
    early, late = statistics.median(losses[:n]), statistics.median(losses[-n:])
    if not early > 0:
        return None
    w = DIVERGENCE_WINDOW
    stretches = [statistics.median(losses[i:i + w]) for i in range(len(losses) - w + 1)]
    start = max(range(len(stretches)), key=stretches.__getitem__)  # the first of equal peaks
    peak = stretches[start]
    return {"early": early, "late": late, "ratio": late / early, "peak": peak, "peak_ratio": peak / early,
        "peak_update": rows[start + w // 2].get("update")}


def with_critic_check(results_dir: Path, path: str, rec: RunRecord, history: list[dict] | None = None) -> RunRecord:
    """The record with a "critic diverged" warning added when its metrics.jsonl shows one
    (`critic_divergence`); the leaderboard computes it, the result file is left as written. `history` as
    in `with_par_collapse`."""
    if critic_diverged(rec):
        return rec
    info = critic_divergence(_history(results_dir, path, history))
    if info is None:
        return rec
    if info["rule"] == "ended":
        note = (f"{DIVERGED}: TD loss {info['late']:.3g} over the last {DIVERGENCE_SHARE:.0%} of training, "
                f"{info['ratio']:.0f}x its early {info['early']:.3g} (metrics.jsonl, checked by the leaderboard)")
    else:
        at = f" around round {info['peak_update']}" if info["peak_update"] is not None else ""
        note = (f"{DIVERGED} during training: TD loss {info['peak']:.3g}{at} (median of {DIVERGENCE_WINDOW} "
                f"logged points), {info['peak_ratio']:.0f}x its early {info['early']:.3g}; "
                f"{info['ratio']:.0f}x at the end (metrics.jsonl, checked by the leaderboard)")
    return dataclasses.replace(rec, warnings=(*rec.warnings, note))


def _history(results_dir: Path, path: str, history: list[dict] | None) -> list[dict]:
    """A run's metrics.jsonl rows: `history` when given, else read from beside its final.json."""
    if history is not None:
        return history

    return run_metrics(results_dir, path)


def _one_per_seed(records: list, skipped: list) -> list:
    by_seed: dict[tuple, list[tuple[str, RunRecord]]] = defaultdict(list)
    for path, r in records:
        by_seed[(r.domain, r.task, r.dataset, r.algo, r.score_name, r.profile, r.protocol_version, r.seed)].append((path, r))
    kept = []
    for group in by_seed.values():
        group.sort(key=lambda pr: (pr[1].finished_at, pr[0]))
        kept.append(group[-1])
        for path, r in group[:-1]:
            skipped.append(Damaged(path, f"duplicate of seed {r.seed} in the same cell; kept {group[-1][0]}"))
    return kept


def _newest(records: list, group) -> dict[tuple, tuple[str, RunRecord]]:
    """Per group (``group(record)``), the most recently finished (path, record) (ties: the later path)."""
    newest: dict[tuple, tuple[str, RunRecord]] = {}
    for path, r in records:
        key = group(r)
        if key not in newest or (r.finished_at, path) > (newest[key][1].finished_at, newest[key][0]):
            newest[key] = (path, r)
    return newest


def _newest_dataset_build(records: list, skipped: list) -> list:
    newest = _newest([(p, r) for p, r in records if r.dataset_sha256], lambda r: (r.profile, r.task, r.dataset))
    kept = []
    for path, r in records:
        ref = newest.get((r.profile, r.task, r.dataset))
        if ref is not None and r.dataset_sha256 and r.dataset_sha256 != ref[1].dataset_sha256:
            skipped.append(Damaged(path, f"trained on an older build of {r.task}/{r.dataset} (sha256 "
                                         f"{r.dataset_sha256[:12]}; the newest runs use {ref[1].dataset_sha256[:12]})"))
        else:
            kept.append((path, r))
    return kept


def _key_neutral(algo: str) -> dict:
    """The algorithm's key-neutral fields and their neutral values (algorithms/base.py `identity_config`)."""

    neutral: dict = {}
    for cls in implementations(algo).values():
        neutral.update(getattr(cls.Config, "key_neutral", {}))
    return neutral


def _comparable_config(config: dict, neutral: dict) -> dict:
    """The config with every key-neutral field at its neutral value dropped, so a run recorded before a
    field existed equals one that records its neutral value."""
    return {k: v for k, v in config.items() if not (k in neutral and v == neutral[k])}


def _newest_config(records: list, skipped: list) -> list:
    """Per (profile, algorithm, task, tier), the runs whose config is that of the most recently finished
    run; the others are skipped with the fields that differ."""
    newest = _newest(records, lambda r: (r.profile, r.algo, r.task, r.dataset))
    neutral_of = {algo: _key_neutral(algo) for algo in {r.algo for _, r in records}}
    kept = []
    for path, r in records:
        ref_path, ref = newest[(r.profile, r.algo, r.task, r.dataset)]
        neutral = neutral_of[r.algo]
        mine, theirs = _comparable_config(r.config, neutral), _comparable_config(ref.config, neutral)
        if mine == theirs:
            kept.append((path, r))
            continue
        full_mine, full_theirs = {**neutral, **mine}, {**neutral, **theirs}
        diff = ", ".join(f"{k} {full_mine.get(k, '(absent)')!r} -> {full_theirs.get(k, '(absent)')!r}"
                         for k in sorted(set(full_mine) | set(full_theirs)) if full_mine.get(k) != full_theirs.get(k))
        skipped.append(Damaged(path, f"trained under an older config of {r.algo} ({diff}; the newest run of "
                                     f"{r.task}/{r.dataset} is {ref_path})"))
    return kept


def _card_mismatch(rec: RunRecord, card: dict | None) -> str | None:
    """Why the run's normalised score does not follow from its card's reference returns."""
    if card is None or rec.is_win_rate:
        return None
    lo, hi, ret = card.get("ref_return_random"), card.get("ref_return_expert"), rec.final_eval.get("return_mean")
    if not all(isinstance(v, (int, float)) for v in (lo, hi, ret)) or hi == lo:
        return None
    expected = 100.0 * (ret - lo) / (hi - lo)
    if not math.isclose(expected, rec.score, rel_tol=1e-6, abs_tol=1e-6):
        return (f"score {rec.score:.6g} does not follow from final_eval.return_mean {ret:.6g} and the dataset "
                f"card's reference returns ({expected:.6g})")
    return None


def _read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def _unfinished(results_dir: Path, skipped: list) -> list[Unfinished]:
    """Run directories with a status.json and no final.json. Identity from config.json (written
    before training), else from the path ``<profile>/<algo>/<task>/<tier>/seed<k>-<key>/``."""
    out = []
    for status_file in sorted(results_dir.rglob("status.json")):
        run_dir = status_file.parent
        if (run_dir / "final.json").exists() or link_leaving(status_file, results_dir):  # (scan_records names it)
            continue
        rel = status_file.relative_to(results_dir).as_posix()
        try:
            status = _read_json(status_file)
            if not isinstance(status, dict) or not isinstance(status.get("status"), str):
                raise ValueError("no 'status' string")
            state, error = status["status"], status.get("error")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            state, error = "damaged", f"status.json unreadable: {type(exc).__name__}: {exc}"
            skipped.append(Damaged(rel, error))
        if state == "done":
            state, error = "damaged", "status.json says done but final.json is missing"
            skipped.append(Damaged(rel, error))
        ident = _identity(results_dir, run_dir)
        if ident is None:
            continue
        first = error.splitlines()[0][:300] if isinstance(error, str) and error else ""
        out.append(Unfinished(rel, state, *ident, error=first or f"status {state}"))
    return out


def _identity(results_dir: Path, run_dir: Path) -> tuple | None:
    try:
        raw = _read_json(run_dir / "config.json")
        raw = raw if isinstance(raw, dict) else {}
    except (OSError, UnicodeDecodeError, ValueError):
        raw = {}
    parts = run_dir.relative_to(results_dir).parts
    guess = dict(zip(("profile", "algo", "task", "dataset"), parts[-5:-1])) if len(parts) >= 5 else {}
    vals = {k: raw[k] if isinstance(raw.get(k), str) and raw[k] else guess.get(k) for k in ("profile", "algo", "task", "dataset")}
    if not all(vals.values()):
        return None
    seed = raw.get("seed")
    return vals["algo"], vals["task"], vals["dataset"], seed if isinstance(seed, int) and not isinstance(seed, bool) else None, vals["profile"]

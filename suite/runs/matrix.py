"""The run matrix: which cells a command covers, and what state each one is in.

    parse_only(["algo=bc,cfcql,seed=0"]) -> {"algo": ["bc", "cfcql"], "seed": ["0"]}
    parse_shard("2/8") -> (2, 8)                      0-based shard index i of N
    select_cells(profile, only, shard) -> [Cell]      canonical order, filtered, then sharded
    resolve(cells, profile, data_dir, results_dir) -> [Resolved]   plan or error per cell
    cell_state(plan) -> "done" | "partial" | "failed" | "running" | "todo"
    estimate_cells(resolved, results_dir, profile, calib) -> [Estimate]   seconds per cell not done

Run identity stays in runner.plan_run (content hash); this module only enumerates and reads the
files a run directory holds, so it is cheap enough for `plan` and `status` on thousands of cells.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.runs.profiles import Profile
from plcql_bench.suite.core.store import read_json
from plcql_bench.suite.core.validate import did_you_mean
from plcql_bench.algorithms.base import implementations, load_all, parse_sweep_value, sweep_name
from plcql_bench.datasets import manifest
from plcql_bench.datasets.cards import committed_entry
from plcql_bench.datasets.format import DatasetError
from plcql_bench.suite.runs.calibration import cell_cost
from plcql_bench.suite.core.schema import (
    RecordError,
    check_location,
    device_kind,
    device_kinds,
    read_record,
    run_seconds,
    scan_records,
)
from plcql_bench.suite.core.validate import check_config, unknown_key
from plcql_bench.suite.runs.runner import Cell, data_profile_dir, plan_run, resolve_config
from plcql_bench.suite.envs.tasks import task_tiers

# --only keys, with the aliases users type (`dataset`: the tier's old spelling).
_KEYS = {"algo": "algo", "algos": "algo", "task": "task", "tasks": "task", "dataset": "tier",
         "datasets": "tier", "tier": "tier", "tiers": "tier", "seed": "seed", "seeds": "seed"}
STATES = ("done", "partial", "running", "failed", "todo")
LOCK_NAME = ".lock"


def parse_only(specs: Iterable[str], flag: str = "--only") -> dict[str, list[str]]:
    """`algo=bc,cfcql,task=mpe-cn,seed=0,1`: a token with '=' starts a key, plain tokens extend
    the previous key's list. Several --only options merge (lists of the same key are joined). An empty
    selection (``""``, ``","``), a ``key=`` without a value and an empty value between commas are errors:
    none of them may mean "every cell"."""
    out: dict[str, list[str]] = {}
    for spec in specs:
        tokens = [t.strip() for t in spec.split(",")]
        if not any(tokens):
            raise BenchError(f"{flag} {spec!r}: empty selection (expected key=value[,value...], e.g. algo=bc)")
        current = None
        for i, token in enumerate(tokens):
            if not token:
                raise BenchError(f"{flag} {spec!r}: empty value at position {i + 1} (a stray comma?)")
            if "=" in token:
                key, value = (part.strip() for part in token.split("=", 1))
                if key not in _KEYS:
                    raise BenchError(f"{flag}: unknown key {key!r} (use algo, task, tier, seed)"
                                     f"{did_you_mean(key, _KEYS)}")
                if not value:  # `seed=` must not mean "every seed", nor be dropped after `seed=0`
                    raise BenchError(f"{flag} {spec!r}: {key}= has no value (expected {key}=V[,V...])")
                current, token = _KEYS[key], value
            if current is None:
                raise BenchError(f"{flag} {spec!r}: expected key=value[,value...]")
            out.setdefault(current, []).append(token)
    return out


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise BenchError(f"--shard {text!r}: expected i/N, e.g. 0/4") from None
    if n < 1 or not 0 <= i < n:
        raise BenchError(f"--shard {text!r}: need 0 <= i < N")
    return i, n


def matrix_blocks(profile: Profile) -> list[dict[str, list[str]]]:
    """The matrix as cross-product blocks: the main one (algos x tasks x tiers x seeds) and the
    optional `extra` blocks (e.g. algorithms that exist for one action kind only, or the paper's
    ablation cells), each with the same four keys."""
    m = profile.matrix
    blocks = [{k: m[k] for k in ("algos", "tasks", "tiers", "seeds")}, *m.get("extra", [])]
    return [{k: [str(v) for v in b[k]] for k in ("algos", "tasks", "tiers", "seeds")} for b in blocks]


def select_cells(profile: Profile, only: dict[str, list[str]] | None = None,
                 shard: tuple[int, int] | None = None, sweeps: list | None = None):
    """The profile's matrix in canonical order (block by block; within a block task, tier, algo,
    seed), filtered by `only`, each cell of a swept algorithm followed by its variants' cells
    (`sweeps`: parse_sweeps), then every N-th cell from i for shard i/N (shards are disjoint and
    cover the selection). Task x tier pairs the task does not have (SMAC random, MPE mixed) are not
    cells; a cell listed by two blocks appears once."""

    blocks = matrix_blocks(profile)
    axes = {key: list(dict.fromkeys(v for b in blocks for v in b[key + "s"])) for key in ("algo", "task", "tier", "seed")}
    only = only or {}
    for key, wanted in only.items():
        missing = [w for w in wanted if w not in axes[key]]
        if missing:
            raise BenchError(f"--only {key}={','.join(missing)}: not in profile {profile.name!r} "
                             f"matrix ({key}s: {', '.join(axes[key])})")
    keep = {k: set(only.get(k, axes[k])) for k in axes}
    cells = []
    for b in blocks:
        cells += [Cell(a, t, q, int(s)) for t in b["tasks"] for q in b["tiers"] for a in b["algos"] for s in b["seeds"]
                  if t in keep["task"] and q in keep["tier"] and a in keep["algo"] and s in keep["seed"]
                  and q in task_tiers(t)]
    return _shard(expand_sweeps(list(dict.fromkeys(cells)), sweeps or []), shard)


def _shard(cells: list, shard: tuple[int, int] | None) -> list:
    """Every N-th cell from i for shard i/N (disjoint shards that cover the list); all cells without one."""
    if not shard:
        return cells
    i, n = shard
    return cells[i::n]


def select_queue(profile: Profile, specs: Iterable[str], shard: tuple[int, int] | None = None,
                 sweeps: list | None = None):
    """The union of several --only selections in the order given (each selection in canonical order,
    a cell already queued by an earlier one not repeated), then shard i/N as in select_cells. A
    campaign runs its stages as one queue, so a core freed at the end of one stage starts the next
    stage's first cell instead of idling until the stage's last run ends."""
    cells = []
    for spec in specs:
        cells += select_cells(profile, parse_only([spec], flag="--queue"))
    return _shard(expand_sweeps(list(dict.fromkeys(cells)), sweeps or []), shard)


@dataclass(frozen=True)
class Sweep:
    """`--set ALGO.FIELD=V1,V2,...`: one variant of ALGO per value (algorithms/base.py: sweep_name)."""

    algo: str
    field: str
    names: tuple[str, ...]


def parse_sweeps(specs: Iterable[str]) -> list[Sweep]:
    """Each `ALGO.FIELD=V1[,V2...]`, its values read as `run --set` reads them (JSON, else a string) and
    checked as `--set` values are (the field's type and range) for every implementation of ALGO that has the
    field; BenchError naming the option otherwise."""

    out = []
    for spec in specs:
        target, eq, raw = spec.partition("=")
        algo, dot, field = target.strip().rpartition(".")  # algorithm names may hold a dot (plcql-t0.1)
        if not (eq and dot and algo and field and raw.strip()):
            raise BenchError(f"--set {spec!r}: expected ALGO.FIELD=V1[,V2...], e.g. plcql.temperature=0.5,2")
        if algo not in load_all():
            raise BenchError(f"--set {spec!r}: unknown algorithm {algo!r}{did_you_mean(algo, load_all())}")
        classes = [c for c in implementations(algo).values() if field in _config_fields(c)]
        if not classes:
            known = {f for c in implementations(algo).values() for f in _config_fields(c)}
            raise unknown_key(f"--set {spec}", field, known, what=f"unknown config field of {algo}")
        values = list(dict.fromkeys(parse_sweep_value(v.strip()) for v in raw.split(",") if v.strip()))
        names = []
        for value in values:
            for cls in classes:
                check_config(cls, {field: value}, f"--set {spec}")
            try:
                names.append(sweep_name(algo, field, value))
            except ValueError as exc:
                raise BenchError(f"--set {spec}: {exc}") from None
        out.append(Sweep(algo, field, tuple(names)))
    return out


def _config_fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls.Config)}


def expand_sweeps(cells: list, sweeps: list[Sweep]) -> list:
    """Each cell of a swept algorithm followed by the same cell of each of its variants; BenchError when a
    sweep's algorithm has no cell in the selection (a sweep that trains nothing is a mistake)."""

    if not sweeps:
        return cells
    for sweep in sweeps:
        if not any(c.algo == sweep.algo for c in cells):
            raise BenchError(f"--set {sweep.algo}.{sweep.field}: no {sweep.algo} cell in the selection "
                             f"(add {sweep.algo} to --only algo=, or to the profile's matrix)")
    out = []
    for cell in cells:
        out.append(cell)
        out += [Cell(name, cell.task, cell.tier, cell.seed) for s in sweeps if s.algo == cell.algo for name in s.names]
    return list(dict.fromkeys(out))


def matrix_datasets(profile: Profile) -> list[tuple[str, str]]:
    """The (task, tier) datasets the profile's matrix trains on, in matrix order."""

    pairs = [(t, q) for b in matrix_blocks(profile) for t in b["tasks"] for q in b["tiers"] if q in task_tiers(t)]
    return list(dict.fromkeys(pairs))


@dataclass
class Resolved:
    cell: object
    plan: object | None  # runner.RunPlan, or None when the cell does not resolve
    error: str | None = None  # why it does not resolve (bad config, dataset not built, ...)
    dataset_missing: bool = False  # `all --build-missing` would build it


def resolve(cells, profile: Profile, data_dir: Path, results_dir: Path) -> list[Resolved]:
    out = []
    root = data_profile_dir(data_dir, profile)
    for cell in cells:
        try:
            resolve_config(cell, profile)
        except (BenchError, DatasetError) as exc:
            out.append(Resolved(cell, None, " ".join(str(exc).split())))
            continue
        try:
            out.append(Resolved(cell, plan_run(cell, profile, data_dir, results_dir)))
        except (BenchError, DatasetError) as exc:
            try:
                missing = manifest.lookup(root, cell.task, cell.tier) is None
            except (BenchError, DatasetError):
                missing = False
            out.append(Resolved(cell, plan_on_card(cell, profile, data_dir, results_dir) if missing else None,
                                " ".join(str(exc).split()), missing))
    return out


def plan_on_card(cell, profile: Profile, data_dir: Path, results_dir: Path):
    """A cell whose dataset is not built here, planned on its committed card's sha256 (the dataset a
    build reproduces), so the runs already done on it count; None without a card."""

    entry = committed_entry(profile.data_profile, cell.task, cell.tier)
    return plan_run(cell, profile, data_dir, results_dir, entry=entry) if entry else None


def lock_held(run_dir: Path) -> bool:
    """True when a live process holds the run's lock (it is training right now). The probe takes a
    shared lock for an instant (probes never block each other); a trainer that starts at that
    instant waits for it (runner.LOCK_GRACE_S) instead of reporting the run busy."""
    path = Path(run_dir) / LOCK_NAME
    if not path.exists():
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock we may have taken
    return False


def run_record(run_dir: Path) -> dict:
    """What a run directory says about itself: state, update reached, runtime, failure reason, and
    `damaged`: [(file, why)] for each file it holds that cannot be used (a final.json that is not
    a valid result of the run in this directory, an unreadable status.json or config.json). A run
    whose final.json is rejected is not done: its state comes from its other files."""

    run_dir = Path(run_dir)
    damaged: list[tuple[Path, str]] = []
    status = _read_checked(run_dir / "status.json", damaged) or {}
    config = _read_checked(run_dir / "config.json", damaged) or {}
    final_path = run_dir / "final.json"
    if final_path.exists():
        try:
            final = read_record(final_path)
            check_location(final, "/".join(run_dir.parts[-5:] + ("final.json",)))
            return {"state": "done", "update": final.train.get("updates"), "updates": final.train.get("updates"),
                    "runtime_s": final.train.get("wall_clock_s"), "reason": "", "score": final.score,
                    "damaged": damaged}
        except RecordError as exc:
            damaged.append((final_path, f"not a valid result of this run: {exc}"))
    updates = (config.get("budget") or {}).get("updates") if isinstance(config.get("budget"), dict) else None
    rec = {"update": status.get("update", 0), "updates": updates, "runtime_s": status.get("runtime_s"),
           "reason": "", "score": None, "damaged": damaged}
    if lock_held(run_dir):
        rec["state"] = "running"
    elif status.get("status") == "failed":
        rec.update(state="failed", reason=str(status.get("error", "")))
    elif (run_dir / "ckpt.pt").exists() or status:
        rec["state"] = "partial"  # interrupted; `all` resumes it from ckpt.pt
        if status.get("status") == "interrupted":
            rec["reason"] = (f"interrupted at update {status.get('reached', rec['update'])}; resumes from "
                             f"the checkpoint at {rec['update']}")
    else:
        rec["state"] = "todo"
    if final_path.exists() and rec["state"] != "failed":
        rec["reason"] = "final.json rejected (not this run's valid result); `all` or `run` trains the run again"
    return rec


def _read_checked(path: Path, damaged: list) -> dict | None:
    """A JSON object file, or None when absent; an unreadable one is None and noted in ``damaged``."""
    if not path.exists():
        return None
    try:
        value = read_json(path)
    except (OSError, ValueError) as exc:
        damaged.append((path, f"unreadable: {type(exc).__name__}: {' '.join(str(exc).split())}"))
        return None
    if not isinstance(value, dict):
        damaged.append((path, f"not a JSON object ({type(value).__name__})"))
        return None
    return value


def cell_state(plan) -> str:
    if plan is None or not Path(plan.run_dir).exists():
        return "todo"
    return run_record(plan.run_dir)["state"]


def recorded_runtimes(results_dir: Path) -> list[dict]:
    """(algo, task, tier, profile, updates, seconds, devices) of every valid finished run under results_dir:
    seconds as schema.run_seconds counts them (every process of a resumed run), devices the kinds it trained
    on (damaged files are skipped: the read commands report them)."""

    out = []
    records, _damaged = scan_records(Path(results_dir)) if Path(results_dir).is_dir() else ([], [])
    for _path, rec in records:
        updates = rec.train.get("updates")
        if not isinstance(updates, int):
            continue
        out.append({"algo": rec.algo, "task": rec.task, "tier": rec.dataset, "profile": rec.profile,
                    "updates": updates, "seconds": run_seconds(rec.train), "devices": device_kinds(rec)})
    return out


def _recorded_rates(results_dir: Path, profile_name: str, device: str = "cpu") -> dict[tuple, list[float]]:
    """Seconds per update of the profile's finished runs trained wholly on this kind of device (another
    profile's batch sizes and evaluation budgets differ; a run trained partly on a GPU says nothing about a
    CPU's cost, nor one whose device was not recorded), keyed (algo, task, tier), (algo, task), (algo,), ()."""
    per_update: dict[tuple, list[float]] = {}
    for r in recorded_runtimes(results_dir):
        if r["profile"] != profile_name or r["devices"] != {device}:
            continue
        rate = r["seconds"] / max(r["updates"], 1)
        for key in ((r["algo"], r["task"], r["tier"]), (r["algo"], r["task"]), (r["algo"],), ()):
            per_update.setdefault(key, []).append(rate)
    return per_update


# The recorded runtimes a "recorded" estimate can come from, closest first: runs of the same cell
# (algo, task, tier), of the algorithm on the task, of the algorithm on any task, of anything.
RECORDED_BASES = ("cell", "task", "algo", "any")
# Bases too far from the cell to bet a session's deadline on: one algorithm's per-update cost on MPE
# says little about it on SMAX (IQL on smax-6h_vs_8z was priced at a minute from its MPE runs).
WEAK_BASES = ("algo", "any")


@dataclass
class Estimate:
    cell: object
    seconds: float | None  # None: nothing to estimate from
    source: str  # "calibration" | "proxy" (a stand-in measurement) | "recorded" | "none"
    rounds_s: float = 0.0
    eval_s: float = 0.0
    basis: str | None = None  # for "recorded": which runs it came from (RECORDED_BASES)

    @property
    def weak(self) -> bool:
        """Priced only from other tasks' runs: good enough for a total, not to start a job under a deadline."""
        return self.source == "recorded" and self.basis in WEAK_BASES


def estimate_cells(items: list[Resolved], results_dir: Path, profile: Profile,
                   calib: dict | None = None) -> list[Estimate]:
    """Seconds each cell not done yet still needs: from the machine calibration (measured round
    and evaluation costs per algo x task, suite/runs/calibration.py) when it has the cell's algo x task,
    else from recorded runtimes: the median seconds per update of the profile's finished runs trained
    wholly on the calibration's kind of device, with the same (algo, task, tier), else (algo, task),
    else algo, else any run, times the updates left (the level used is the estimate's `basis`).
    A calibration of another kind of machine (a GPU) sets `"recorded_fallback": false`: runtimes
    recorded here say nothing about it, so its unmeasured cells are not counted."""

    fallback = calib is None or calib.get("recorded_fallback", True)
    device = device_kind((calib or {}).get("device", "cpu"))
    per_update = _recorded_rates(results_dir, profile.name, device) if fallback else {}
    out = []
    for item in items:
        c = item.cell
        state = cell_state(item.plan)
        if state == "done":
            continue
        updates = profile.updates_for(c.task, c.tier)
        reached = 0
        if state in ("partial", "running") and item.plan is not None:  # the update of its last checkpoint
            reached = min(int(run_record(item.plan.run_dir).get("update") or 0), updates)
        cost = cell_cost(c, profile, calib, reached) if calib else None
        if cost is not None and cost.seconds is not None:
            out.append(Estimate(c, cost.seconds, "proxy" if cost.proxy else "calibration", cost.rounds_s,
                                cost.eval_s))
            continue
        keys = ((c.algo, c.task, c.tier), (c.algo, c.task), (c.algo,), ())
        basis, key = next(((b, k) for b, k in zip(RECORDED_BASES, keys) if k in per_update), (None, None))
        out.append(Estimate(c, None, "none") if key is None else
                   Estimate(c, statistics.median(per_update[key]) * max(updates - reached, 1), "recorded",
                            basis=basis))
    return out


def parse_duration(text: str) -> float:
    """Seconds in a duration such as 90m, 2h30m, 1.5h or 45s (units s, m, h; at least one); ValueError otherwise."""

    parts = re.findall(r"(\d+(?:\.\d+)?)([smh])", text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"{text!r}: expected a duration such as 90m, 2h30m, 1.5h or 45s")
    return sum(float(n) * {"s": 1, "m": 60, "h": 3600}[u] for n, u in parts)


def format_seconds(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"

"""The result schema: one finished run's ``final.json``, written by the runner and read by the
export and the leaderboard through :class:`RunRecord`.

``RunRecord.from_json`` checks the fields' types and the record's internal consistency (the
headline score equals the final evaluation's, numbers are finite, the run key is the hash of
the identity the record states); :func:`check_location` checks that the file sits in the run
directory its key names. Both raise :class:`RecordError` with one line naming the field.
:func:`scan_records` reads every final.json under a folder and returns the good records and
the damaged files; :func:`enforce_strict` turns the damaged list into a user error under
``--strict`` (any command that reads results can share it).
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import platform
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.core.store import METRICS, links_leaving, read_metrics_text

__all__ = [
    "RESULT_SCHEMA_VERSION", "RecordError", "RunRecord", "Damaged", "DamagedResults", "run_key_of",
    "read_record", "check_location", "scan_records", "links_out", "enforce_strict", "compact_metrics_row",
    "compact_metrics_text",
]

RESULT_SCHEMA_VERSION = 1
SCORE_NAMES = ("normalised", "win_rate")
WIN_RATE_DOMAINS = ("smax", "smac")
# What a run key hashes (suite/runs/runner.py: plan_run builds the same dict).
IDENTITY_FIELDS = ("algo", "config", "task", "dataset", "dataset_sha256", "seed", "profile", "budget",
                   "protocol_version")
RUN_DIR = re.compile(r"seed(\d+)-([0-9a-f]+)")


class RecordError(ValueError):
    """A final.json that is not a valid finished run; the message is one line naming the field."""


def run_key_of(identity: dict) -> str:
    """The content address of a run: sha256 of its identity as sorted JSON, first 16 hex digits."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


# The largest magnitudes a result may hold: a normalised score of a million percent of the expert-random gap, or
# a return of a billion, comes from a damaged or edited file, not from a policy (and 1e308 overflowed the board).
PLAUSIBLE_SCORE = 1e6
PLAUSIBLE_RETURN = 1e9


def _plausible(field_name: str, value: float, limit: float) -> None:
    if abs(value) > limit:
        raise RecordError(f"{field_name} {value!r} is outside the plausible range \u00b1{limit:g} (a damaged or edited file?)")


@dataclass(frozen=True)
class RunRecord:
    """One finished run. Field names are final.json's keys; unknown keys are kept in ``extra``
    so a record read and written again loses nothing."""

    algo: str
    task: str
    dataset: str
    seed: int
    profile: str
    score: float
    score_name: str = "normalised"
    domain: str = ""
    run_key: str = ""
    status: str = "done"
    schema_version: int = RESULT_SCHEMA_VERSION
    protocol_version: int | None = None
    dataset_sha256: str = ""
    config: dict = field(default_factory=dict, compare=False)
    budget: dict = field(default_factory=dict, compare=False)
    final_eval: dict = field(default_factory=dict, compare=False)
    curve: list = field(default_factory=list, compare=False)
    train: dict = field(default_factory=dict, compare=False)
    versions: dict = field(default_factory=dict, compare=False)
    image: dict = field(default_factory=dict, compare=False)
    git_commit: str = ""
    finished_at: str = ""
    # Written by newer runners; absent in older files.
    warnings: tuple = ()
    par_collapse: dict | None = field(default=None, compare=False)
    hardware: dict | None = field(default=None, compare=False)
    extra: dict = field(default_factory=dict, compare=False)

    # ------------------------------------------------------------------ reading and writing

    @classmethod
    def from_json(cls, raw: Any) -> "RunRecord":
        """Validate a decoded final.json; raises RecordError naming the first bad field."""
        if not isinstance(raw, dict):
            raise RecordError(f"top level is {type(raw).__name__}, not an object")
        if raw.get("status") != "done":
            raise RecordError(f"status is {raw.get('status')!r}, not 'done'")
        if raw.get("schema_version") != RESULT_SCHEMA_VERSION:
            raise RecordError(f"unsupported schema_version {raw.get('schema_version')!r} "
                              f"(this version reads {RESULT_SCHEMA_VERSION})")
        known = {f.name for f in fields(cls)} - {"extra"}
        values = {k: raw[k] for k in known if k in raw}
        for key in ("algo", "task", "dataset", "profile"):
            if not isinstance(values.get(key), str) or not values[key].strip():
                raise RecordError(f"missing or empty string field {key!r}")
        for key in ("run_key", "dataset_sha256", "git_commit", "finished_at"):
            if values.get(key) is None:
                values.pop(key, None)
            elif not isinstance(values[key], str):
                raise RecordError(f"field {key!r} is not a string")
        if not _int(values.get("seed")):
            raise RecordError(f"seed {values.get('seed')!r} is not an integer")
        values["seed"] = int(values["seed"])
        domain = values.get("domain") or values["task"].split("-", 1)[0]
        if not isinstance(domain, str):
            raise RecordError("field 'domain' is not a string")
        values["domain"] = domain
        values.setdefault("score_name", "win_rate" if domain in WIN_RATE_DOMAINS else "normalised")
        if values["score_name"] not in SCORE_NAMES:
            raise RecordError(f"unknown score_name {values['score_name']!r} (expected one of {', '.join(SCORE_NAMES)})")
        if values.get("protocol_version") is not None and not _int(values["protocol_version"]):
            raise RecordError(f"protocol_version {values['protocol_version']!r} is not an integer")
        for key in ("config", "budget", "final_eval", "train", "versions", "image"):
            if values.get(key) is None:
                values.pop(key, None)
            elif not isinstance(values[key], dict):
                raise RecordError(f"field {key!r} is not an object")
        if values.get("curve") is None:
            values.pop("curve", None)
        elif not isinstance(values["curve"], list) or not all(isinstance(p, dict) for p in values["curve"]):
            raise RecordError("field 'curve' is not a list of objects")
        warnings = values.get("warnings") or []
        if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
            raise RecordError("field 'warnings' is not a list of strings")
        values["warnings"] = tuple(warnings)
        for key in ("par_collapse", "hardware"):
            if values.get(key) is not None and not isinstance(values[key], dict):
                raise RecordError(f"field {key!r} is not an object")
        record = cls(**values, extra={k: v for k, v in raw.items() if k not in known})
        record.check()
        return record

    def to_json(self) -> dict:
        """The final.json object (optional fields only when set)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        out["warnings"] = list(self.warnings)
        out["curve"] = list(self.curve)
        for key in ("warnings", "par_collapse", "hardware"):
            if not out[key]:
                del out[key]
        return {**self.extra, **out}

    # ------------------------------------------------------------------ consistency

    def identity(self) -> dict | None:
        """The dict the run key hashes, or None when the record lacks part of it (old files)."""
        raw = {"algo": self.algo, "config": self.config, "task": self.task, "dataset": self.dataset,
               "dataset_sha256": self.dataset_sha256, "seed": self.seed, "profile": self.profile,
               "budget": self.budget, "protocol_version": self.protocol_version}
        if not self.config or not self.budget or not self.dataset_sha256 or self.protocol_version is None:
            return None
        return raw

    def check(self) -> None:
        """Internal consistency; raises RecordError naming the field."""
        if not _real(self.score) or not math.isfinite(self.score):
            raise RecordError(f"score {self.score!r} is not a finite number")
        if self.score_name == "win_rate" and not 0.0 <= self.score <= 1.0:
            raise RecordError(f"win_rate score {self.score!r} is outside [0, 1]")
        key = "win_rate" if self.score_name == "win_rate" else "normalised_score"
        stated = self.final_eval.get(key)
        if not _real(stated) or not math.isfinite(stated):
            raise RecordError(f"final_eval.{key} {stated!r} is not a finite number")
        if not _close(float(self.score), float(stated)):
            raise RecordError(f"score {self.score!r} differs from final_eval.{key} {stated!r}")
        _plausible("score", self.score, PLAUSIBLE_SCORE)
        returns = self.final_eval.get("episode_returns")
        if returns is not None:
            if not isinstance(returns, list) or not returns or not all(_real(r) and math.isfinite(r) for r in returns):
                raise RecordError("final_eval.episode_returns is not a non-empty list of finite numbers")
            for i, r in enumerate(returns):
                _plausible(f"final_eval.episode_returns[{i}]", r, PLAUSIBLE_RETURN)
            mean = self.final_eval.get("return_mean")
            if not _real(mean) or not math.isclose(sum(returns) / len(returns), mean, rel_tol=1e-6, abs_tol=1e-6):
                raise RecordError(f"final_eval.return_mean {mean!r} is not the mean of final_eval.episode_returns")
        if _real(self.final_eval.get("return_mean")):
            _plausible("final_eval.return_mean", self.final_eval["return_mean"], PLAUSIBLE_RETURN)
        for i, point in enumerate(self.curve):
            for k, limit in (("update", math.inf), ("score", PLAUSIBLE_SCORE), ("return_mean", PLAUSIBLE_RETURN)):
                v = point.get(k)
                if v is not None and (not _real(v) or not math.isfinite(v)):
                    raise RecordError(f"curve[{i}].{k} {v!r} is not a finite number")
                if v is not None:
                    _plausible(f"curve[{i}].{k}", v, limit)
        ident = self.identity()
        if ident is not None and self.run_key and run_key_of(ident) != self.run_key:
            raise RecordError(f"run_key {self.run_key!r} is not the hash of the record's identity "
                              f"({run_key_of(ident)}): the file was edited or belongs to another run")

    # ------------------------------------------------------------------ conveniences

    @property
    def dirty(self) -> bool:
        """Trained from a working tree with uncommitted changes."""
        return self.git_commit.endswith("-dirty")

    @property
    def is_win_rate(self) -> bool:
        return self.score_name == "win_rate"


CURVE_KEYS = ("update", "return_mean", "score")  # one learning-curve point; metrics.jsonl rows carry them too
FLOAT32_MAX = 3.4028234663852886e38


def float32_digits(value):
    """A float at float32 precision, as the fewest decimal digits that give that float32 back (at most 9
    significant); anything else (ints, None, non-finite floats, floats beyond float32's range) unchanged.
    The training metrics and diagnostics are float32 computations (or means of them), so their 17-digit
    float64 forms carried ~8 digits of noise: dropping them makes a PLCQL run's published metrics ~35 %
    smaller, which is what keeps the committed results within what a GPU loan can carry."""
    if type(value) is not float or not math.isfinite(value) or abs(value) > FLOAT32_MAX:
        return value
    return float(str(np.float32(value)))


def compact_metrics_row(row: dict) -> dict:
    """One metrics.jsonl row with its training and diagnostic values at float32 precision
    (`float32_digits`); the learning-curve point (CURVE_KEYS) is kept exactly as evaluated. Idempotent."""
    return {k: (v if k in CURVE_KEYS else float32_digits(v)) for k, v in row.items()}


def compact_metrics_text(text: str) -> str:
    """A metrics.jsonl text with every row compacted (`compact_metrics_row`), one sorted-key JSON object
    per line as the runner writes them; a line that is not a JSON object is kept as it is."""
    out = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        out.append(json.dumps(compact_metrics_row(row), sort_keys=True) if isinstance(row, dict) else line)
    return "".join(f"{line}\n" for line in out)


def curve_from_metrics(run_dir: Path) -> list[dict] | None:
    """A run's learning curve rebuilt from its metrics.jsonl (or the published metrics.jsonl.gz): the runner
    writes one row per evaluation point, holding that point's update, return_mean and score. None when no
    readable metrics file is there (a damaged one leaves the curve unknown, not the record invalid)."""

    try:
        text = read_metrics_text(Path(run_dir) / METRICS)
        if text is None:
            return None
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not all(isinstance(r, dict) and all(k in r for k in CURVE_KEYS) for r in rows):
        return None
    return [{k: r[k] for k in CURVE_KEYS} for r in rows]


def read_record(path: Path) -> RunRecord:
    """Read and validate one final.json; RecordError (one line) when it is not a valid run. A published
    final.json without its curve (`campaign publish` drops it where metrics.jsonl.gz holds the same points)
    gets it back from the metrics beside it."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"unreadable: {type(exc).__name__}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise RecordError(f"invalid JSON: {exc}") from None
    if isinstance(raw, dict) and "curve" not in raw:
        curve = curve_from_metrics(Path(path).parent)
        if curve is not None:
            raw["curve"] = curve
    return RunRecord.from_json(raw)


def check_location(record: RunRecord, rel_path: str) -> None:
    """A final.json in the runner's layout ``<profile>/<algo>/<task>/<tier>/seed<k>-<key>/``
    must sit in the directory its seed and run key name, under its own cell. Files outside that
    layout (hand-made folders) are only checked for what their path states."""
    parts = Path(rel_path).parts[:-1]
    if not parts:
        return
    m = RUN_DIR.fullmatch(parts[-1])
    if m is None:
        return
    seed, key = int(m.group(1)), m.group(2)
    if seed != record.seed:
        raise RecordError(f"seed {record.seed} does not match its directory {parts[-1]}")
    if not record.run_key or not record.run_key.startswith(key):
        raise RecordError(f"run_key {record.run_key!r} does not match its directory {parts[-1]}")
    if len(parts) >= 5:
        stated = (record.profile, record.algo, record.task, record.dataset)
        if tuple(parts[-5:-1]) != stated:
            raise RecordError(f"run {'/'.join(stated)} is filed under {'/'.join(parts[-5:-1])}")


@dataclass(frozen=True)
class Damaged:
    """A result file that no number may use, and why (one line)."""

    path: str
    reason: str


def scan_records(results_dir: Path) -> tuple[list[tuple[str, RunRecord]], list[Damaged]]:
    """Every final.json under ``results_dir``: ([(path relative to results_dir, record)],
    [damaged files]), both in path order."""
    results_dir = Path(results_dir)
    good: list[tuple[str, RunRecord]] = []
    bad = links_out(results_dir)
    leaving = {Path(results_dir) / d.path for d in bad}
    for file in sorted(results_dir.rglob("final.json")):
        if not file.is_file() or file in leaving:
            continue
        rel = file.relative_to(results_dir).as_posix()
        try:
            record = read_record(file)
            check_location(record, rel)
        except RecordError as exc:
            bad.append(Damaged(rel, str(exc)))
            continue
        good.append((rel, record))
    return good, bad


def links_out(results_dir: Path) -> list[Damaged]:
    """Symbolic links under the results folder that lead outside it, as skipped entries: runs are read (and
    written: runner.plan_run refuses such a run directory) only inside the results folder."""

    return [Damaged(link.relative_to(results_dir).as_posix(), f"a symbolic link to {target}, outside the results "
                    "directory: skipped (runs are read and written only inside it)")
            for link, target in links_leaving(results_dir)]


class DamagedResults(BenchError):
    """``--strict`` found result files it had to skip."""


def enforce_strict(damaged: Iterable[Damaged], strict: bool, echo=None) -> None:
    """Write one line per skipped file to ``echo`` (e.g. ``click.echo(..., err=True)``), then,
    under ``strict``, raise DamagedResults (exit status 2) when any file was skipped."""
    damaged = list(damaged)
    if echo is not None:
        for d in damaged:
            echo(f"skipped {d.path}: {d.reason}")
    if not strict or not damaged:
        return
    raise DamagedResults(f"{len(damaged)} result file{'s' if len(damaged) != 1 else ''} skipped "
                         f"(--strict); first: {damaged[0].path}: {damaged[0].reason}")


def run_seconds(train: dict) -> float:
    """A run's time: `train_s`, its training time summed over every process that trained it (a resumed
    run's earlier sessions included), or `wall_clock_s`, the last process's wall clock (which also holds
    the final evaluation), whichever is longer."""
    return max(float(train.get("train_s") or 0.0), float(train.get("wall_clock_s") or 0.0))


def device_kind(device: object) -> str:
    """The kind of a device name as runs record it: "cuda:0" and "cuda (NVIDIA H200)" are "cuda", "cpu" is "cpu"."""
    return str(device).split(":")[0].split(" ")[0]


def device_kinds(record: RunRecord) -> set[str]:
    """The kinds of device ("cpu", "cuda") a run trained on: each process of a resumed run
    (train.devices), else its hardware record's; empty for a run written before either was recorded."""
    devices = [d.get("device", "") for d in record.train.get("devices") or [] if isinstance(d, dict)]
    if not devices and record.hardware:
        devices = [record.hardware.get("device", "")]
    return {device_kind(d) for d in devices if d}


def cpu_isa() -> str | None:
    """The instruction set torch's CPU kernels use here (e.g. AVX2, AVX512), or None where torch cannot say."""
    import torch

    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        return None


def hardware_info(device: str) -> dict:
    """Where a run trained (the ``hardware`` field): device, CPU model and count, torch threads,
    and the GPU's name on CUDA."""

    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"device": device, "cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    isa = cpu_isa()
    if isa:  # torch's kernels by instruction set: AVX2 and AVX-512 round differently (docs/datasets.md)
        info["cpu_isa"] = isa
    if str(device).startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info

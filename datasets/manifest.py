"""The manifest of built datasets: ``<data_dir>/manifest.json``.

    {"<task_id>/<tier>": {"file": "<task_id>/<tier>.h5", "sha256": ..., ...}, ...}

    read_manifest(data_dir) -> {key: entry}
    make_entry(data_dir, file, sha256, profile, **extra) -> entry   (from the file's attributes)
    record(data_dir, entry) -> key        (locked, atomic read-modify-write)
    lookup(data_dir, task_id, tier) -> entry | None
    require(data_dir, task_id, tier) -> entry   (ManifestError when absent)
    dataset_path(data_dir, task_id, tier) -> default file location
    load(data_dir, task_id, tier, spec=None, verify=True) -> Dataset

Errors are DatasetError (one line, ``<path>: <field>: <problem>``), so the CLI handles dataset
and manifest problems the same way.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
from pathlib import Path
from typing import Any, Iterator

from plcql_bench.datasets.format import (
    FORMAT_VERSION,
    Dataset,
    DatasetError,
    load_dataset,
    read_attrs,
)
from plcql_bench.suite.core.spec import TaskSpec
from plcql_bench.suite.core.store import atomic_write_json

MANIFEST_NAME = "manifest.json"
LOCK_NAME = ".manifest.lock"

# Fields every entry has (record() fills "created" and "key" itself).
REQUIRED_FIELDS = ("file", "sha256", "size_bytes", "task_id", "quality", "format_version",
                   "n_transitions", "n_episodes")  # fmt: skip
# Attributes copied from the dataset file into its entry by make_entry().
_COPIED_ATTRS = (
    "task_id", "quality", "format_version", "n_transitions", "n_episodes", "behaviour_policy_id",
    "generator_version", "generator_seed", "return_mean", "return_std", "return_min",
    "return_max", "win_rate", "ref_return_random", "ref_return_expert", "env_versions", "source", "generation",
)  # fmt: skip


class ManifestError(DatasetError):
    """A manifest problem (bad JSON, missing entry, bad entry)."""


def manifest_path(data_dir: str | os.PathLike) -> Path:
    return Path(data_dir) / MANIFEST_NAME


def key(task_id: str, tier: str) -> str:
    return f"{task_id}/{tier}"


def dataset_path(data_dir: str | os.PathLike, task_id: str, tier: str) -> Path:
    """Where a built dataset lives by convention: ``<data_dir>/<task_id>/<tier>.h5``."""
    return Path(data_dir) / task_id / f"{tier}.h5"


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ManifestError(path, "file", f"cannot be read ({e.strerror})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ManifestError(path, "json", f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    if not isinstance(doc, dict):
        raise ManifestError(path, "json", 'must be a JSON object {"<task_id>/<tier>": {entry}, ...}')
    for k, entry in doc.items():
        if not isinstance(entry, dict):
            raise ManifestError(path, k, "entry must be a JSON object")
        for f in ("file", "sha256"):
            if not isinstance(entry.get(f), str):
                raise ManifestError(path, f"{k}.{f}", "missing or not a string")
        if not _inside(entry["file"]):
            raise ManifestError(path, f"{k}.file", f"must be a path relative to the data directory and inside "
                                f"it, got {entry['file']!r}")
    return doc


def _inside(file: str) -> bool:
    """A relative path that stays inside the folder it is relative to."""
    p = Path(file)
    return bool(file) and not p.is_absolute() and ".." not in p.parts


def read_manifest(data_dir: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """All entries, keyed ``"<task_id>/<tier>"``; {} when there is no manifest yet."""
    return _read(manifest_path(data_dir))


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / LOCK_NAME, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def make_entry(
    data_dir: str | os.PathLike,
    file: str | os.PathLike,
    sha256: str,
    profile: str,
    **extra: Any,
) -> dict[str, Any]:
    """Build a manifest entry for a written dataset from its attributes and size.

    ``file`` may be absolute or relative to data_dir; the entry stores it relative.
    ``extra`` adds or overrides fields (e.g. ``source``, ``mirrors``, ``input_sha256``)."""
    data_dir = Path(data_dir)
    full = Path(file) if Path(file).is_absolute() else data_dir / file
    attrs = read_attrs(full)
    entry: dict[str, Any] = {k: attrs[k] for k in _COPIED_ATTRS if k in attrs}
    entry.update(
        file=os.path.relpath(full, data_dir),
        sha256=sha256,
        size_bytes=full.stat().st_size,
        profile=profile,
    )
    entry.update(extra)
    return entry


def record(data_dir: str | os.PathLike, entry: dict[str, Any]) -> str:
    """Add or replace the entry for ``(entry["task_id"], entry["quality"])``; returns its key.

    Read-modify-write under an exclusive ``fcntl.flock`` on ``<data_dir>/.manifest.lock`` and
    an atomic replace, so parallel builds never lose each other's entries."""
    data_dir = Path(data_dir)
    path = manifest_path(data_dir)
    missing = [f for f in REQUIRED_FIELDS if f not in entry]
    if missing:
        raise ManifestError(path, f"entry.{missing[0]}", f"required field missing (fields: {', '.join(REQUIRED_FIELDS)})")
    if not _inside(str(entry["file"])):
        raise ManifestError(path, "entry.file", f"must be relative to the data directory and inside it, "
                            f"got {entry['file']!r}")
    k = key(entry["task_id"], entry["quality"])
    entry = dict(entry)
    entry.setdefault("created", _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat())
    with _locked(data_dir):
        datasets = _read(path)
        datasets[k] = entry
        atomic_write_json(path, datasets)
    return k


def lookup(data_dir: str | os.PathLike, task_id: str, tier: str) -> dict[str, Any] | None:
    """The entry for task_id/tier, or None when it is not recorded (or there is no manifest)."""
    return _read(manifest_path(data_dir)).get(key(task_id, tier))


def built(data_dir: str | os.PathLike, task_id: str, tier: str) -> dict[str, Any] | None:
    """The entry for task_id/tier when its file is there too; None when it is not recorded or its file is gone
    (deleted to free space, or moved): `datasets build` and `all` then build it again."""
    entry = lookup(data_dir, task_id, tier)
    return entry if entry is not None and file_present(data_dir, entry) else None


def file_present(data_dir: str | os.PathLike, entry: dict[str, Any]) -> bool:
    return (Path(data_dir) / entry["file"]).exists()


def require(data_dir: str | os.PathLike, task_id: str, tier: str) -> dict[str, Any]:
    """The entry for task_id/tier; ManifestError naming the manifest when it is absent."""
    path = manifest_path(data_dir)
    datasets = _read(path)
    k = key(task_id, tier)
    if k not in datasets:
        where = "no manifest yet" if not path.exists() else f"{len(datasets)} datasets recorded"
        raise ManifestError(path, k, f"dataset not built ({where}); build it with "
                            f"`plcql-bench datasets build {task_id} {tier}`")
    return datasets[k]


def load(
    data_dir: str | os.PathLike,
    task_id: str,
    tier: str,
    spec: TaskSpec | None = None,
    verify: bool = True,
    check_episodes: bool = True,
) -> Dataset:
    """Load a recorded dataset; with verify=True its sha256 must equal the manifest's."""
    entry = require(data_dir, task_id, tier)
    return load_dataset(
        Path(data_dir) / entry["file"],
        spec=spec,
        expected_sha256=entry["sha256"] if verify else None,
        check_episodes=check_episodes,
    )


__all__ = [
    "FORMAT_VERSION", "MANIFEST_NAME", "ManifestError", "built", "dataset_path", "file_present", "key", "load", "lookup",
    "make_entry", "manifest_path", "read_manifest", "record", "require",
]  # fmt: skip

"""The datasets `all` trains on. Before anything runs, `all` checks the datasets already built
(`prepare_datasets`); a missing one is built by the job of its first cell, just before that cell trains
(`ensure_dataset`, in the worker). A dataset that cannot be built fails only the cells that train on
it; every other cell trains.

    problems, to_build = prepare_datasets(pairs, profile, data_root, build_missing, echo)
    problems: {(task, tier): DatasetProblem(cause, fix)} for each dataset that cannot be trained on;
    to_build: the missing (task, tier) pairs, which the jobs build
    problem = ensure_dataset(task, tier, profile, data_root, token, echo)   # None once it is built

A cell without its dataset has no run key (the key holds the dataset's sha256), so its failure is
recorded in a stand-in run directory, `<results>/<profile>/<algo>/<task>/<tier>/seed<k>-no-dataset/`
(config.json + status.json naming the cause and the fix), which `status` lists and which `all`
removes once the dataset exists.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from plcql_bench.suite.core.store import atomic_write_json
from plcql_bench.datasets import manifest
from plcql_bench.datasets.behaviour import stale, unavailable
from plcql_bench.datasets.cards import off_card
from plcql_bench.datasets.build import DatasetUnavailable, build_dataset
from plcql_bench.datasets.format import DatasetError
from plcql_bench.datasets.importers import import_dataset
from plcql_bench.suite.runs.runner import _now, check_dataset_identity, profile_dir
from plcql_bench.suite.envs.tasks import get_task

NO_DATASET_DIR = "no-dataset"

# Task id prefix -> the pip extra that installs its env stack.
_EXTRAS = {"mpe-": "mpe", "mamujoco-": "mamujoco", "smax-": "smax"}


# Seconds to build one tier at the paper size on one core, about twice what was measured on the 2-core
# development machine under a running campaign (2026-11-28/29: an MPE tier ~26 s, SMAX 2s3z medium 120 s,
# Half-Cheetah ~17 s + 0.07 s an episode, ~90 s for 1,000): `all --finish-within` adds it to a job whose
# dataset is still to be built when the job would start, so the build does not carry a run past the deadline.
BUILD_ESTIMATE_S = {"mpe-": 60.0, "mamujoco-": 180.0, "smax-": 300.0}
BUILD_ESTIMATE_OTHER_S = 600.0  # a task family not measured (SMAC in its container)


def _for_task(table: dict, task: str, default=None):
    """The value of `table` (task id prefix -> value) for the task's family."""
    return next((v for prefix, v in table.items() if task.startswith(prefix)), default)


def build_estimate(task: str) -> float:
    """Seconds a build of one of the task's tiers is expected to take (BUILD_ESTIMATE_S)."""
    return _for_task(BUILD_ESTIMATE_S, task, BUILD_ESTIMATE_OTHER_S)


@dataclass(frozen=True)
class DatasetProblem:
    task: str
    tier: str
    cause: str  # one line
    fix: str  # the command (or step) that fixes it
    user_error: bool = False  # a damaged dataset file (exit status 2), not a missing extra or a failed build

    def message(self) -> str:
        return f"dataset {self.task}/{self.tier} could not be built: {self.cause} (fix: {self.fix})"


def diagnose(task: str, tier: str, exc: Exception, profile_name: str) -> DatasetProblem:
    """Cause and fix of a failed dataset build."""

    cause = " ".join(f"{type(exc).__name__}: {exc}".split())
    if isinstance(exc, DatasetUnavailable):
        return DatasetProblem(task, tier, exc.reason, exc.fix)
    if isinstance(exc, ImportError):
        extra = _for_task(_EXTRAS, task)
        if extra:
            return DatasetProblem(task, tier, cause, f"pip install 'plcql-bench[{extra}]' "
                                                     f"(in a clone: pip install -e '.[{extra}]')")
    return DatasetProblem(task, tier, cause, f"plcql-bench datasets build {task} {tier} --profile "
                                             f"{profile_name} (shows the traceback)")


def prepare_datasets(pairs, profile, data_root: Path, build_missing: bool, echo) -> tuple[dict, set]:
    """Check each (task, tier) dataset before `all` trains; builds nothing. Returns (problems, to_build):
    the problems of the datasets that cannot be trained on (damaged; missing with --no-build-missing),
    and the missing ones that their cells' jobs build when the queue reaches them (`ensure_dataset`)."""

    problems, to_build = {}, set()
    for task, tier in pairs:
        entry = manifest.lookup(data_root, task, tier)
        if entry is not None and build_missing and not manifest.file_present(data_root, entry):
            echo(f"dataset {task}/{tier}: {manifest.manifest_path(data_root)} records it but {entry['file']} is "
                 "missing: it is built again")
            entry = None
        if entry is None and build_missing:
            to_build.add((task, tier))
            continue
        if entry is None:
            problems[(task, tier)] = DatasetProblem(
                task, tier, f"not built in {data_root} (--no-build-missing)",
                f"plcql-bench datasets build {task} {tier} --profile {profile.name}")
            continue
        damage = check_built(data_root, entry, task, tier)
        if damage:
            problems[(task, tier)] = DatasetProblem(
                task, tier, damage, f"plcql-bench datasets build {task} {tier} --profile {profile.name} --force "
                                    f"(or import it again)", user_error=True)
            echo(f"error: {problems[(task, tier)].message()}", err=True)
            continue
        say_if_not_the_cards(entry, task, tier, profile, echo)
    return problems, to_build


def say_if_not_the_cards(entry: dict, task: str, tier: str, profile, echo, built_now: bool = False) -> None:
    """Warn when a built dataset is not what its committed card describes: stale (built by older code: a
    rebuild helps), or of its own sha256 (just built by this code, so the card is what differs). Its runs
    stay valid for that data (keyed by sha256), but they are not the board's runs of the tier: say so before
    hours of training."""
    why = None if built_now else stale(entry, task, tier, profile.generation)
    if why:
        echo(f"warning: dataset {task}/{tier} is stale ({why}); rebuild it with "
             f"`plcql-bench datasets build {task} {tier} --profile {profile.name} --force`", err=True)
    elif (why := off_card(entry)) is not None:
        echo(f"warning: dataset {task}/{tier}{', just built,' if built_now else ''} is not its committed card's "
             f"dataset: {why}", err=True)


BUILD_FAILED_DIR = ".build-failed"  # under the data root: a dataset build that failed during one `all`


def ensure_dataset(task: str, tier: str, profile, data_root: Path, token: str, echo, build=None) -> DatasetProblem | None:
    """Build task/tier in a run's worker just before its first cell trains (`all` defers building to here,
    so the queue's first cells train while later datasets are built). Under an exclusive lock per dataset:
    of several workers that need it, one builds and the others wait, then find it in the manifest. A build
    that fails is recorded under `.build-failed/` with the `all` invocation's `token`, so the dataset's other
    cells in the same `all` fail at once instead of building again; a later `all` tries again. Returns the
    problem, or None once the dataset is there. `build`: the builder (datasets.build.build_dataset)."""

    source = profile.import_for(task, tier)
    if build is None:
        build = importer(source) if source else None
    if build is None:
        build = build_dataset
    root = Path(data_root)
    root.mkdir(parents=True, exist_ok=True)
    failed = root / BUILD_FAILED_DIR / f"{task}--{tier}.json"
    with open(root / f".build-{task}--{tier}.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            if manifest.built(root, task, tier) is not None:
                return None
            try:
                earlier = json.loads(failed.read_text())
                if earlier.get("token") == token:
                    return DatasetProblem(task, tier, earlier["cause"], earlier["fix"])
            except (OSError, ValueError, KeyError):
                pass
            echo(f"building dataset {task}/{tier}")
            started = time.monotonic()
            try:
                build(task, tier, 0 if source else profile.episodes_for(task, tier), root, profile=profile.data_profile,
                      generation_name=profile.generation)
            except Exception as exc:  # noqa: BLE001 - isolated: only this dataset's cells fail
                problem = diagnose(task, tier, exc, profile.name)
                echo(f"error: {problem.message()}", err=True)
                failed.parent.mkdir(exist_ok=True)
                atomic_write_json(failed, {"token": token, "cause": problem.cause, "fix": problem.fix})
                return problem
            failed.unlink(missing_ok=True)
            # Said, since the next line a worker prints is its run's score, an hour later on World.
            echo(f"built dataset {task}/{tier} in {time.monotonic() - started:.0f}s; its cells train now")
            say_if_not_the_cards(manifest.lookup(root, task, tier) or {}, task, tier, profile, echo, built_now=True)
            return None
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def forget_build_failures(data_root: Path, token: str) -> None:
    """Drop the failure records of one `all` invocation (ensure_dataset's `.build-failed/` files)."""

    for f in (Path(data_root) / BUILD_FAILED_DIR).glob("*.json"):
        try:
            if json.loads(f.read_text()).get("token") == token:
                f.unlink()
        except (OSError, ValueError):
            pass


def check_built(data_root: Path, entry: dict, task: str, tier: str) -> str | None:
    """Why a recorded dataset cannot be trained on (missing, not a file, not the size recorded,
    attributes of another task or tier), or None. Cheap (no checksum: each run verifies the
    sha256 when it loads the file)."""

    path = Path(data_root) / entry["file"]
    if not path.is_file():
        return f"{path}: file: {'is a directory' if path.is_dir() else 'does not exist'}"
    size = entry.get("size_bytes")
    if isinstance(size, int) and path.stat().st_size != size:
        return f"{path}: file: {path.stat().st_size} bytes, the manifest records {size} (truncated or replaced?)"
    try:
        check_dataset_identity(path, task, tier)
    except DatasetError as exc:
        return str(exc)
    return None


def no_dataset_dir(cell, profile, results_dir: Path) -> Path:
    return (profile_dir(results_dir, profile) / cell.algo / cell.task / cell.tier
            / f"seed{cell.seed}-{NO_DATASET_DIR}")


def record_failure(cell, profile, results_dir: Path, problem: DatasetProblem) -> Path:
    """config.json + status.json (failed, with cause and fix) for a cell whose dataset is missing."""

    d = no_dataset_dir(cell, profile, results_dir)
    d.mkdir(parents=True, exist_ok=True)
    atomic_write_json(d / "config.json", {
        "run_key": None, "algo": cell.algo, "task": cell.task, "dataset": cell.tier, "seed": cell.seed,
        "profile": profile.name, "dataset_sha256": None,
        "budget": profile.train_budget(cell.task, cell.tier)})
    atomic_write_json(d / "status.json", {
        "status": "failed", "run_key": None, "updated_at": _now(), "update": 0,
        "error": problem.message(), "cause": problem.cause, "fix": problem.fix})
    return d


def clear_failure(cell, profile, results_dir: Path) -> None:
    """The dataset exists now: drop the stand-in directory of an earlier missing-dataset failure."""
    d = no_dataset_dir(cell, profile, results_dir)
    if d.is_dir():
        shutil.rmtree(d, ignore_errors=True)


def importer(source: dict):
    """A builder (build_dataset's signature) that imports a profile's `datasets.import` source instead."""
    def build(task: str, tier: str, _episodes: int, root: Path, profile: str, **_) -> dict:
        return import_dataset(source["format"], source["path"], get_task(task).spec, tier, root, profile=profile,
                              seed=source.get("seed", 0), uid=source.get("uid"))

    return build


def check_buildable(task: str, tier: str, profile_name: str, profile=None) -> DatasetProblem | None:
    """Why `all` could not build task/tier here (no behaviour policy, a missing extra, a profile's import
    source that is not there), or None. Cheap: looks up the behaviour policy without collecting anything."""

    source = profile.import_for(task, tier) if profile is not None else None
    if source:
        if Path(source["path"]).exists():
            return None
        return DatasetProblem(task, tier, f"the profile imports it from {source['path']}, which is not there",
                              f"download it there (OG-MARL vaults: og_marl.vault_utils.download_vault), or change "
                              f"datasets.import in {profile.source}")

    try:
        found = unavailable(task, tier, profile.generation if profile is not None else None)
    except Exception as exc:  # noqa: BLE001 - e.g. the task's env stack is not installed
        return diagnose(task, tier, exc, profile_name)
    return DatasetProblem(task, tier, *found) if found else None

"""The suite from Python: load a dataset tier as arrays, train one run, read every result as a DataFrame.

    from plcql_bench.suite.runs import api

    data = api.load_dataset("mpe-cn", "random", profile="smoke")    # built first when missing
    data.arrays["obs"]                                              # numpy, [transitions, agents, obs_dim]
    batch = api.as_tensors(data)                                    # the same arrays as torch tensors
    final = api.train("bc", "mpe-cn", "random", seed=0, profile="smoke")   # final.json's record, as a dict
    runs = api.results_frame()                                      # pandas: one row per finished run
    curves = api.results_frame(curves=True)                         # tidy: one row per run, step and metric

Folders default as on the command line: $PLCQL_DATA_DIR else ``data``, $PLCQL_RESULTS_DIR else ``results``.
The functions run what the CLI runs (the same dataset checks, run identity, resume and result files), so a
run trained here is a run `plan`, `export` and the leaderboard see. Bad input raises BenchError or
DatasetError with the CLI's one-line message. Example: docs/python-api.md (run by tests/test_api.py).
"""

from __future__ import annotations

import os
import uuid
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from plcql_bench.datasets import format as fmt, manifest
from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.core.schema import run_seconds
from plcql_bench.suite.core.settings import DATA_ENV, RESULTS_ENV  # noqa: F401 - the API reads the CLI's variables
from plcql_bench.suite.core.store import read_json
from plcql_bench.suite.runs.executors import _RunLog
from plcql_bench.suite.runs.export import COLUMNS, select_runs, tidy_rows
from plcql_bench.suite.runs.matrix import parse_only
from plcql_bench.suite.runs.preflight import ensure_dataset, forget_build_failures
from plcql_bench.suite.runs.profiles import load_profile
from plcql_bench.suite.runs.runner import Cell, check_dataset_identity, data_profile_dir, execute, plan_run, resolve_config
from plcql_bench.suite.envs.tasks import get_task
from plcql_bench.suite.runs.tracking import check_available


def data_dir(path: str | os.PathLike | None = None) -> Path:
    """``path``, else $PLCQL_DATA_DIR, else ``data`` (the CLI's --data-dir default)."""
    return Path(path if path is not None else os.environ.get(DATA_ENV, "data"))


def results_dir(path: str | os.PathLike | None = None) -> Path:
    """``path``, else $PLCQL_RESULTS_DIR, else ``results`` (the CLI's --results-dir default)."""
    return Path(path if path is not None else os.environ.get(RESULTS_ENV, "results"))


def load_dataset(task: str, tier: str, profile: str = "smoke", data: str | os.PathLike | None = None,
                 build: bool = True, log: Callable[[str], Any] = print):
    """The task's tier as the profile trains on it (datasets/format.py: Dataset; ``.arrays`` holds every
    array of the file as numpy, ``.attrs`` its attributes), loaded with the runner's checks (sha256, the
    task and tier it states). Built first, at the profile's size, when it is missing and ``build``."""

    prof = load_profile(profile)
    spec = get_task(task).spec
    if tier not in spec.tiers:
        raise BenchError(f"unknown dataset tier {tier!r} for {task} (tiers: {', '.join(spec.tiers)})")
    root = data_profile_dir(data_dir(data), prof)
    if build:
        _ensure_built(task, tier, prof, root, log)
    entry = manifest.lookup(root, task, tier)
    if entry is None:
        raise BenchError(f"dataset {task}/{tier} is not built in {root} (build=True builds it)")
    path = root / entry["file"]
    check_dataset_identity(path, task, tier)
    return fmt.load_dataset(path, spec=spec, expected_sha256=entry["sha256"])


def _ensure_built(task: str, tier: str, prof, root: Path, log) -> None:
    """Build task/tier under the same per-dataset lock `all` takes; BenchError with the cause and fix."""

    token = uuid.uuid4().hex
    try:
        problem = ensure_dataset(task, tier, prof, root, token, lambda msg, err=False: log(msg))
    finally:
        forget_build_failures(root, token)
    if problem is not None:
        raise BenchError(problem.message())


def as_tensors(dataset, device: str = "cpu") -> dict:
    """Every array of a loaded dataset as a torch tensor on ``device`` (flags stay uint8, as stored)."""

    return {name: torch.as_tensor(array, device=device) for name, array in dataset.arrays.items()}


def train(algo: str, task: str, dataset: str, seed: int = 0, profile: str = "smoke",
          data: str | os.PathLike | None = None, results: str | os.PathLike | None = None,
          overrides: dict | None = None, device: str = "cpu", threads: int | None = None,
          log: Callable[[str], Any] | None = None, trackers: tuple = ()) -> dict:
    """Train and evaluate one cell, as `plcql-bench run` does (its dataset built first when missing); a
    finished run is not trained again. Returns the run's final.json record. ``overrides``: config fields,
    as `run --set` (checked the same way); ``log``: each line of the run's log (run.log gets them too);
    ``trackers``: ("tensorboard", "wandb"), as `run --log` (suite/runs/tracking.py)."""

    prof = load_profile(profile)
    cell = Cell(algo, task, dataset, int(seed))
    resolve_config(cell, prof, overrides)  # a bad algorithm, value or tracker fails before anything is built
    trackers = check_available(trackers)
    _ensure_built(task, dataset, prof, data_profile_dir(data_dir(data), prof), log or (lambda _msg: None))
    plan = plan_run(cell, prof, data_dir(data), results_dir(results), overrides)
    plan.trackers = trackers
    if plan.is_done():
        return read_json(plan.final_path)
    if threads is not None:
        torch.set_num_threads(threads)
    run_log = _RunLog(plan.run_dir, echo=False)

    def both(msg: str) -> None:
        run_log(msg)
        if log is not None:
            log(msg)

    return execute(plan, device=device, log=both)


RUN_COLUMNS = ("profile", "domain", "algo", "task", "dataset", "seed", "run_key", "score", "score_name",
               "return_mean", "return_std", "normalised_score", "win_rate", "updates", "train_s", "finished_at",
               "dataset_source", "path")


def results_frame(results: str | os.PathLike | None = None, profile: str | None = None,
                  only: dict | str | None = None, curves: bool = False):
    """Every valid finished run under the results folder as a pandas DataFrame: one row per run
    (RUN_COLUMNS), or with ``curves`` the tidy rows of `export --format csv` (one per run, step and
    metric). ``only``: `--only`'s text ("algo=bc,cfcql,seed=0") or its parsed dict. A damaged run file
    is left out with a warning naming it, as the CLI does."""
    import pandas as pd

    root = results_dir(results)
    if not root.is_dir():
        raise BenchError(f"results directory not found: {root}")
    only = parse_only([only]) if isinstance(only, str) else only
    damaged: list = []
    if curves:
        frame = pd.DataFrame(tidy_rows(root, profile, damaged, only), columns=list(COLUMNS))
    else:
        rows = []
        for run_dir, rec in select_runs(root, profile, only, damaged):
            final = rec.final_eval
            rows.append({"profile": rec.profile, "domain": rec.domain, "algo": rec.algo, "task": rec.task,
                         "dataset": rec.dataset, "seed": rec.seed, "run_key": rec.run_key, "score": rec.score,
                         "score_name": rec.score_name, "return_mean": final.get("return_mean"),
                         "return_std": final.get("return_std"), "normalised_score": final.get("normalised_score"),
                         "win_rate": final.get("win_rate"), "updates": rec.train.get("updates"),
                         "train_s": run_seconds(rec.train), "finished_at": rec.finished_at,
                         "dataset_source": rec.extra.get("dataset_source", ""),
                         "path": run_dir.relative_to(root).as_posix()})
        frame = pd.DataFrame(rows, columns=list(RUN_COLUMNS))
    for d in damaged:
        warnings.warn(f"skipped {d.path}: {d.reason}", stacklevel=2)
    return frame

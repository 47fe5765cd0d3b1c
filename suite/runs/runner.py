"""Training and evaluation of one run (algo x task x tier x seed under a profile).

Layout of a run directory, results/<profile>/<algo>/<task>/<tier>/seed<k>-<key>/:
  config.json    the resolved run identity and config (written first)
  status.json    running | done | failed (+ traceback), update reached
  metrics.jsonl  one line per evaluation point: training metrics averaged since the last one
  ckpt.pt        periodic checkpoint (model, optimisers, RNG states, curve) for resuming
  final.json     the result, written atomically and last; its presence means "done"
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from plcql_bench.algorithms.base import batch_kind, get_algorithm, identity_config, make_config, reward_kind
from plcql_bench.algorithms.common import kernels, native
from plcql_bench.datasets import format as fmt
from plcql_bench.datasets import manifest
from plcql_bench.datasets.cards import card_scoring, dataset_identity
from plcql_bench.suite.envs import protocol
from plcql_bench.suite.core import stop
from plcql_bench.suite.core.batch import Batch
from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.core.schema import (RESULT_SCHEMA_VERSION, RecordError, RunRecord, compact_metrics_row,
                                           hardware_info, read_record, run_key_of)
from plcql_bench.suite.core.store import atomic_write_bytes, atomic_write_json, link_leaving, read_json
from plcql_bench.suite.core.validate import check_config, config_fields, did_you_mean
from plcql_bench.suite.runs.profiles import Profile
from plcql_bench.suite.envs.tasks import get_task
from plcql_bench.suite.runs.versions import git_commit, image_labels, package_versions
from plcql_bench.datasets.episodes import EpisodeSampler
from plcql_bench.suite.envs.prey import prey_kind
from plcql_bench.suite.runs.tracking import Session


@dataclass(frozen=True)
class Cell:
    algo: str
    task: str
    tier: str
    seed: int

    def label(self) -> str:
        return f"{self.algo} {self.task}/{self.tier} seed {self.seed}"


@dataclass
class RunPlan:
    cell: Cell
    profile: Profile
    config: Any
    dataset_path: Path
    dataset_sha256: str  # what names the dataset in the run's identity (its committed card's, for a rebuild)
    run_key: str
    run_dir: Path
    file_sha256: str = ""  # the file's own, checked when it loads (the same but for a rebuild)
    dataset_rebuild: dict | None = None  # datasets.cards.dataset_identity's record of a rebuild
    dataset_source: str = ""  # an imported dataset's origin (its `source` attribute), recorded in final.json
    trackers: tuple = ()  # `--log`: experiment trackers that mirror the run's metrics (suite/runs/tracking.py)
    tracking: Any = field(default=None, repr=False, compare=False)  # their open Session while it trains

    @property
    def final_path(self) -> Path:
        return self.run_dir / "final.json"

    def is_done(self) -> bool:
        """final.json holds a valid result of this very run (suite/core/schema.py, and its run key is
        this run's: a file copied from another run or edited is not "done")."""
        return self.final_problem() is None and self.final_path.is_file()

    def final_problem(self) -> str | None:
        """Why the final.json present is not this run's valid result (one line); None when it is,
        or when there is none."""
        if not self.final_path.exists():
            return None
        try:
            record = read_record(self.final_path)
        except RecordError as exc:
            return str(exc)
        if record.run_key != self.run_key:
            return (f"run_key {record.run_key!r} is not this run's ({self.run_key}): the file belongs to "
                    f"another run")
        return None


def profile_dir(root: Path, profile: Profile) -> Path:
    """Where a profile's results live: <root>/<profile name>."""
    return Path(root) / profile.name


def data_profile_dir(root: Path, profile: Profile) -> Path:
    """Where a profile's datasets live: <root>/<data profile> (a profile may reuse another's
    datasets, e.g. paper-cpu trains on the paper datasets)."""
    return Path(root) / profile.data_profile


def plan_run(cell: Cell, profile: Profile, data_dir: Path, results_dir: Path,
             overrides: dict[str, Any] | None = None, entry: dict[str, Any] | None = None) -> RunPlan:
    """Resolve a cell to its config, dataset and content-addressed run directory. `entry` stands in for
    the dataset's manifest entry when it is not built here (its committed card: `plan` and `campaign
    status` then find the runs already done on it)."""
    config = resolve_config(cell, profile, overrides)
    data_root = data_profile_dir(data_dir, profile)
    entry = entry or manifest.lookup(data_root, cell.task, cell.tier)
    if entry is None:
        raise BenchError(f"dataset {cell.task}/{cell.tier} is not built in {data_root} (run: "
                         f"plcql-bench datasets build {cell.task} {cell.tier} --profile {profile.name})")
    # A rebuild of a committed card's dataset on another CPU keeps the card's name (datasets/cards.py)
    dataset_sha256, rebuild = dataset_identity(entry)
    key = run_key_of(run_identity(cell, profile, config, dataset_sha256))
    run_dir = (profile_dir(results_dir, profile) / cell.algo / cell.task / cell.tier
               / f"seed{cell.seed}-{key[:10]}")
    _refuse_link_leaving(run_dir, Path(results_dir))
    return RunPlan(cell, profile, config, data_root / entry["file"], dataset_sha256, key, run_dir,
                   file_sha256=entry["sha256"], dataset_rebuild=rebuild)


def _refuse_link_leaving(run_dir: Path, results_dir: Path) -> None:
    """A run directory (or a folder above it) that is a symbolic link out of the results folder is refused:
    `all --force` followed such a link and wrote outside, while `status`, `export` and `leaderboard` skip it."""
    leaving = link_leaving(run_dir, results_dir)
    if leaving is not None:
        raise BenchError(f"{leaving[0]}: a symbolic link to {leaving[1]}, outside the results directory "
                         f"{results_dir}: refused (runs are read and written only inside it; remove the link)")


def run_identity(cell: Cell, profile: Profile, config: Any, dataset_sha256: str) -> dict:
    """What identifies a run (its run key is `run_key_of` of this): the algorithm, its identity config,
    the task, tier and dataset build, the seed, the profile and its budget, the protocol version."""
    return {
        "algo": cell.algo, "config": identity_config(config), "task": cell.task,
        "dataset": cell.tier, "dataset_sha256": dataset_sha256, "seed": cell.seed,
        "profile": profile.name, "budget": profile.train_budget(cell.task, cell.tier),
        "protocol_version": protocol.PROTOCOL_VERSION,
    }


def resolve_config(cell: Cell, profile: Profile, overrides: dict[str, Any] | None = None):
    """The cell's algorithm config (task defaults < profile overrides < a sweep variant's value < --set), each
    layer checked against the config's schema (suite/core/validate.py: field names, types, ranges); BenchError naming
    the file or flag and the field when the task, tier, algorithm or a config value is not valid."""
    task = get_task(cell.task)
    if cell.tier not in task.spec.tiers:
        raise BenchError(f"unknown dataset tier {cell.tier!r} for {cell.task} "
                         f"(tiers: {', '.join(task.spec.tiers)}){did_you_mean(cell.tier, task.spec.tiers)}")
    try:
        cls = get_algorithm(cell.algo, discrete=task.spec.discrete)
    except KeyError as exc:
        raise BenchError(exc.args[0]) from None
    fields = config_fields(cls)
    defaults = cls.task_overrides(task.spec, cell.tier)
    check_config(cls, defaults, f"{cell.algo} defaults for {cell.task}/{cell.tier} (algorithms/configs)")
    from_profile = {k: v for k, v in profile.algo_overrides.items() if k in fields}
    check_config(cls, from_profile, profile.source, path="algo_overrides.")
    check_config(cls, overrides or {}, "--set")
    # A sweep variant's value (all --set ALGO.FIELD=V, algorithms/base.py) wins over the task's and the
    # profile's values of its field, as --set does; a --set of the same field still wins over it.
    swept = cls.sweep
    check_config(cls, swept, f"--set {cell.algo}")
    try:
        return make_config(cls, {**defaults, **from_profile, **swept, **(overrides or {})})
    except (KeyError, TypeError) as exc:
        raise BenchError(str(exc).strip("'\"")) from None


def select_rewards(arrays: dict[str, np.ndarray], reward: str = "team") -> np.ndarray:
    """The reward column an algorithm trains on (algorithms/base.py: reward_kind): the team reward [N], agent
    0's [N] or every agent's [N, n] from a v2 dataset's `agent_rewards`; the team reward [N] for every choice
    when the dataset has no per-agent rewards (format v1)."""
    if reward == "team" or fmt.AGENT_REWARDS not in arrays:
        return arrays["rewards"]
    per_agent = arrays[fmt.AGENT_REWARDS]
    return per_agent[:, 0] if reward == "agent0" else per_agent


class Sampler:
    """Uniform minibatches from an in-memory dataset, with its own seeded generator."""

    def __init__(self, arrays: dict[str, np.ndarray], discrete: bool, seed: int, device: str, reward: str = "team"):
        def t(name, dtype):
            return torch.as_tensor(arrays[name]).to(device=device, dtype=dtype)

        act_dtype = torch.int64 if discrete else torch.float32
        self.tensors = {
            "obs": t("obs", torch.float32), "state": t("state", torch.float32),
            "actions": t("actions", act_dtype),
            "rewards": torch.as_tensor(select_rewards(arrays, reward)).to(device=device, dtype=torch.float32),
            "next_obs": t("next_obs", torch.float32), "next_state": t("next_state", torch.float32),
            "next_actions": t("next_actions", act_dtype),
            "next_actions_valid": t("next_actions_valid", torch.float32),
            "terminals": t("terminals", torch.float32),
        }
        if discrete:
            self.tensors["avail"] = t("avail_actions", torch.float32)
            self.tensors["next_avail"] = t("next_avail_actions", torch.float32)
        self.size = len(arrays["rewards"])
        self.device = device
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, batch_size: int) -> Batch:
        idx = torch.randint(self.size, (batch_size,), generator=self.generator).to(self.device)
        # index_select copies whole rows (the same values as v[idx], ~4x faster on CPU for a 1024-row batch)
        return Batch(**{k: v.index_select(0, idx) for k, v in self.tensors.items()})


def make_sampler(cls, arrays: dict[str, np.ndarray], discrete: bool, seed: int, device: str):
    """The sampler the algorithm class asks for (`batch_kind`): uniform transitions (Sampler) or
    whole padded episodes (datasets/episodes.py: EpisodeSampler). Both expose `.generator`."""
    if batch_kind(cls) == "episodes":
        return EpisodeSampler(arrays, seed, device)
    return Sampler(arrays, discrete, seed, device, reward=reward_kind(cls))


def load_run_dataset(plan: RunPlan):
    spec = get_task(plan.cell.task).spec
    check_dataset_identity(plan.dataset_path, plan.cell.task, plan.cell.tier)  # cheap, before the big read
    # One open file: the sha256 checked (and recorded in the run key) is of the bytes the arrays come from
    dataset = fmt.load_dataset(plan.dataset_path, spec=spec, expected_sha256=plan.file_sha256 or plan.dataset_sha256)
    check_dataset_identity(plan.dataset_path, plan.cell.task, plan.cell.tier, dataset.attrs)  # of those bytes
    plan.dataset_source = str(dataset.attrs.get("source") or "")  # results on imported data say where it came from
    return card_scoring(dataset, plan.dataset_rebuild)  # a rebuild scores with its card's reference returns


def dataset_task(task_id: str, dataset):
    """The task a dataset's runs train and are evaluated on: PP and World against the prey the data was
    collected with (its env_versions name it: OMAR's pretrained prey, or the suite's own), so a policy
    learned from OMAR-prey data is never scored against another prey."""

    versions = dataset.attrs.get("env_versions") or {}
    return get_task(task_id, prey=prey_kind(versions, task_id if "prey" in versions else None))


def check_dataset_identity(path: Path, task: str, tier: str, attrs: dict | None = None) -> None:
    """The task and tier a dataset file states (its attrs, or the `attrs` already loaded from it) are the
    cell's: a file copied over another tier's (with the manifest's sha256 fixed to match) must not train as
    that tier. Cheap: reads the attributes only. DatasetError naming the file and attribute otherwise."""
    attrs = fmt.read_attrs(path) if attrs is None else attrs
    for name, want in (("task_id", task), ("quality", tier)):
        if attrs.get(name) != want:
            raise fmt.DatasetError(path, f"attrs.{name}", f"is {attrs.get(name)!r}, but the manifest files it as "
                                   f"{task}/{tier} (a dataset copied over another?); rebuild or re-import it")


class RunBusy(BenchError):
    """Another live process holds this run's lock (it is training it right now)."""


KERNELS_ENV = "PLCQL_KERNELS"  # "fused" (default) or "plain": the networks' kernels
FLUSH_DENORMALS_ENV = "PLCQL_FLUSH_DENORMALS"  # "1" (default) or "0": CPU float denormals flushed to zero


def configure_process(device: str = "cpu", discrete: bool = False) -> None:
    """Process-wide settings, made here once per process before an algorithm is built, never by an
    algorithm: the networks' kernels (PLCQL_KERNELS=fused|plain, algorithms/common/kernels.py and
    kernels_discrete.py; not part of the run key, like the device and the thread count, which also move
    the last bits) and, on CPU, glibc's allocator keeping freed memory (kernels.keep_freed_memory),
    for a discrete task serving large allocations from the heap (kernels.large_allocations_from_heap:
    a discrete ensemble round's GRU tensors are re-faulted page by page otherwise), and denormal floats
    flushed to zero (kernels.flush_denormals; PLCQL_FLUSH_DENORMALS=0 turns it off; not part of the run key
    either: only values below float32's normal range change)."""
    choice = os.environ.get(KERNELS_ENV, "fused")
    if choice not in ("fused", "plain"):
        raise BenchError(f"{KERNELS_ENV}: must be 'fused' or 'plain', got {choice!r}")
    flush = os.environ.get(FLUSH_DENORMALS_ENV, "1")
    if flush not in ("0", "1"):
        raise BenchError(f"{FLUSH_DENORMALS_ENV}: must be '1' (flush denormals to zero) or '0', got {flush!r}")
    kernels.use_fused(choice == "fused")
    if torch.device(device).type == "cpu":
        kernels.keep_freed_memory()
        kernels.large_allocations_from_heap(discrete)
        kernels.flush_denormals(flush == "1")


KERNEL_CHOICES = ("native", "fused", "plain")


def use_kernels(choice: str | None) -> None:
    """Make `choice` (native, fused or plain: `run`/`all --kernels`) this process's kernels, and those of the runs
    it spawns, through the two variables configure_process and native.enabled() read. None: leave them."""
    if choice is None:
        return
    if choice not in KERNEL_CHOICES:
        raise BenchError(f"--kernels: must be one of {', '.join(KERNEL_CHOICES)}, got {choice!r}")
    os.environ[KERNELS_ENV] = "plain" if choice == "plain" else "fused"
    os.environ[native.ENV] = "1" if choice == "native" else "0"


def kernel_choice(stacked: bool = False) -> dict:
    """The kernels a run used, as its log line and final.json (`hardware.kernels`) record them: `choice` plain,
    fused, or native (fused, with the C kernels allowed), from PLCQL_KERNELS and PLCQL_NATIVE (a seed stack's
    critic takes the plain kernels); `native_loaded`: the C kernels this process loaded (none where no compiler
    is present: the torch form then runs, with one warning); `flush_denormals`: whether CPU denormals were
    flushed to zero (configure_process). Not part of the run key, like the device and the thread count: the
    forms agree within tests/test_speed_equivalence.py's and tests/test_native.py's tolerances."""
    if stacked or not kernels.fused_default():
        choice = "plain"
    else:
        choice = "native" if native.enabled() else "fused"
    return {"choice": choice, "native_loaded": native.loaded(), "flush_denormals": kernels.denormals_flushed()}


def execute(plan: RunPlan, device: str = "cpu", log=print, fresh: bool = False) -> dict:
    """The run's result: trained here (execute_here) or, when it is done already, read from final.json."""
    return execute_here(plan, device, log, fresh)[1]


def execute_here(plan: RunPlan, device: str = "cpu", log=print, fresh: bool = False) -> tuple[bool, dict]:
    """(whether this process trained the run, its result). Train (resuming from a checkpoint when one
    exists), evaluate, write final.json; a run found done (before, or by another process while this one
    waited for its lock) is not trained again, and says so: two `all` at once each count what they trained.

    Crash safety: every file is replaced atomically (store.py), the checkpoint is written before
    status.json names it and final.json is written last, so a SIGKILL at any instant leaves the
    run either done (final.json), resumable (ckpt.pt at an evaluation point), or not started. A
    per-run lock (`.lock`, flock, released by the kernel when the process dies) keeps two
    processes from training the same run at once. `fresh` discards earlier results (--force).
    """
    if plan.is_done() and not fresh:
        return False, read_json(plan.final_path)
    configure_process(device, discrete=get_task(plan.cell.task).spec.discrete)
    dataset = load_run_dataset(plan)  # validate before touching the run directory
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    with _run_lock(plan):
        if fresh:
            for name in ("final.json", "ckpt.pt", "metrics.jsonl", "status.json"):
                (plan.run_dir / name).unlink(missing_ok=True)
        elif plan.is_done():  # finished by another process while this one waited for the lock
            return False, read_json(plan.final_path)
        _remove_stale_temp_files(plan.run_dir)
        atomic_write_json(plan.run_dir / "config.json", _identity_record(plan))
        log(f"start {plan.cell.label()} run {plan.run_key} pid {os.getpid()} device {device} "
            f"torch threads {torch.get_num_threads()} kernels {kernel_choice()['choice']}")
        _set_aside_rejected_final(plan, log)
        started = time.time()
        progress = {"update": 0, "reached": 0, "runtime_s": 0.0}
        open_tracking(plan, log)
        try:
            result = _validated(_train_and_evaluate(plan, dataset, device, log, progress), device)
        except BaseException as exc:
            close_tracking(plan)
            # Exceptions are failures (kept until --rerun-failed); Ctrl-C and SystemExit leave
            # the run interrupted, so the next `all` resumes it like a killed run. `update` is
            # the checkpoint a resume starts from, `reached` the last round completed.
            state = "failed" if isinstance(exc, Exception) else "interrupted"
            _write_status(plan, state, error=f"{type(exc).__name__}: {exc}",
                          traceback=traceback.format_exc(), **progress)
            log(f"{state}: {type(exc).__name__}: {exc} (at update {progress['reached']}; checkpoint at "
                f"{progress['update']})\n{traceback.format_exc()}")
            raise
        result["train"]["wall_clock_s"] += time.time() - started
        atomic_write_json(plan.final_path, result)  # last: its presence means done
        _write_status(plan, "done", update=result["train"]["updates"],
                      runtime_s=result["train"]["wall_clock_s"])
        finish_tracking(plan, result)
        log(f"done {plan.cell.label()}: score {result['score']} in {result['train']['wall_clock_s']:.1f}s")
        return True, result


def open_tracking(plan: RunPlan, log) -> None:
    """The run's `--log` trackers (suite/runs/tracking.py), opened lazily at its first logged point."""
    if plan.trackers:
        plan.tracking = Session(plan.trackers, plan.run_dir, _identity_record(plan), log)


def finish_tracking(plan: RunPlan, result: dict) -> None:
    """Log the final evaluation to the run's trackers and close them."""
    if plan.tracking is not None:
        plan.tracking.final(result)
    close_tracking(plan)


def close_tracking(plan: RunPlan) -> None:
    if plan.tracking is not None:
        plan.tracking.close()
        plan.tracking = None


def _set_aside_rejected_final(plan: RunPlan, log) -> None:
    """A final.json that is not this run's valid result (copied from another run, edited, damaged)
    is kept as final.json.rejected, never counted, and the run trains."""
    problem = plan.final_problem()
    if problem is not None:
        plan.final_path.replace(plan.run_dir / "final.json.rejected")
        log(f"final.json is not a valid result of this run ({problem}); kept as final.json.rejected, training")


def _validated(result: dict, device: str, stacked: bool = False) -> dict:
    """The result as the one schema (suite/core/schema.py) states it, with the hardware and the kernels it ran
    on; an inconsistent result raises here, so it is recorded as failed, never as done."""
    hardware = {**hardware_info(device), "kernels": kernel_choice(stacked)}
    return RunRecord.from_json({**result, "hardware": hardware}).to_json()


LOCK_GRACE_S = 2.0  # how long a starting run waits for a lock held by someone else


class _run_lock:
    def __init__(self, plan: RunPlan):
        self.path = plan.run_dir / ".lock"
        self.plan = plan

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + LOCK_GRACE_S
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                # `status`/`plan`/`all` probe liveness by taking the lock for an instant
                # (matrix.lock_held): only a lock held past the grace period is a live trainer.
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    raise RunBusy(f"{self.plan.cell.label()}: another process is training it "
                                  f"({self.plan.run_dir})") from None
                time.sleep(0.02)

    def __exit__(self, *exc):
        os.close(self.fd)  # releases the lock
        return False


def _remove_stale_temp_files(run_dir: Path) -> None:
    """Half-written temp files of a killed process (never read; atomic replace ignores them)."""
    for tmp in run_dir.glob(".*.tmp"):
        tmp.unlink(missing_ok=True)


def _train_and_evaluate(plan: RunPlan, dataset, device: str, log, progress: dict | None = None) -> dict:
    """Train from the checkpoint (if any) to the budget, then the final evaluation. ``progress``
    follows the checkpoint round, the last round done and the training time (for status.json
    when the run stops early)."""
    progress = {} if progress is None else progress
    cell, profile = plan.cell, plan.profile
    task = dataset_task(cell.task, dataset)
    budget = profile.train_budget(cell.task, cell.tier)
    torch.manual_seed(cell.seed)
    np.random.seed(cell.seed)
    cls = get_algorithm(cell.algo, discrete=task.spec.discrete)
    algo = cls(task.spec, plan.config, cell.seed, device)
    sampler = make_sampler(cls, dataset.arrays, task.spec.discrete, cell.seed, device)
    probe = _probe_batch(sampler)
    state = _resume(plan, algo, sampler, log, device) or fresh_state(device)
    progress.update(update=state["update"], reached=state["update"], runtime_s=state["train_s"])
    if state["update"] > 0:
        log(f"resuming {cell.label()} from update {state['update']}")
    _write_status(plan, "running", update=state["update"], runtime_s=state["train_s"])
    # A round's training metrics, averaged into the next evaluation point; a stop's checkpoint keeps them.
    pending: list[dict[str, float]] = state.pop("pending", [])
    rounds, clock = budget["updates"], time.time()
    if state["update"] == 0:
        _record_eval(plan, task, algo, dataset, 0, pending, state, budget["eval_episodes"], probe)
    with stop.at_round_end():  # a SIGINT/SIGTERM stops after the round, checkpointed there
        for done in range(state["update"] + 1, rounds + 1):
            pending.append(algo.update(sampler))
            progress["reached"] = done
            if done % budget["eval_every"] == 0 or done == rounds:
                _record_eval(plan, task, algo, dataset, done, pending, state, budget["eval_episodes"], probe)
                point = state["curve"][-1]
                log(f"update {done}/{rounds}: return {point['return_mean']:.3f} score {point['score']}")
            stopping = stop.requested()
            if (done % profile.checkpoint_every_for(cell.task, cell.tier) == 0 and done < rounds) or stopping:
                # Periodic checkpoints fall on evaluation points (checked by the profile loader); a stop's
                # may not, so it carries the rounds' metrics not yet averaged (`pending`).
                state["train_s"] += time.time() - clock
                clock = time.time()
                state["update"] = done
                _checkpoint(plan, algo, sampler, state, pending)
                progress.update(update=done, runtime_s=state["train_s"])
                _write_status(plan, "running", update=done, runtime_s=state["train_s"])
            if stopping:
                raise stop.stopped(done)
    state["train_s"] += time.time() - clock
    final = _timed_eval(state, task, algo, dataset, budget["final_eval_episodes"])
    result = _result(plan, task, final, state, budget)
    return with_run_warnings(result, algo, state["history"], cell, log)


def with_run_warnings(result: dict, algo, history: list[dict], cell: Cell, log) -> dict:
    """The result with the algorithm's warnings and their fields (e.g. PLCQL: "PAR collapsed to k = n"), each
    warning also in the run log (empty ones are left out of final.json: RunRecord.to_json)."""
    warnings, extra = algo.run_warnings(history)
    for w in warnings:
        log(f"WARNING {cell.label()}: {w}")
    result.update(warnings=warnings, **extra)
    return result


PROBE_SEED = 20261126  # the probe's rows are fixed per dataset, whatever the run's seed
PROBE_SIZE = {"transitions": 1024, "episodes": 16}


def _probe_batch(sampler):
    """A fixed batch for the algorithm's diagnostics at every evaluation point (the same rows at every
    point and after a resume), drawn without touching the sampler's training random stream."""

    saved = sampler.generator.get_state()
    sampler.generator.manual_seed(PROBE_SEED)
    batch = sampler(PROBE_SIZE["episodes" if isinstance(sampler, EpisodeSampler) else "transitions"])
    sampler.generator.set_state(saved)
    return batch


def evaluate_policy(task, algo, dataset, episodes: int) -> dict:
    """The suite's evaluation of a policy (an Algorithm's `act(obs, avail)`, `begin_episodes(num_envs)` and
    `evaluating()`) on the first `episodes` evaluation seeds: returns, normalised score, win rate. Runs, stacked
    runs and the reference-code scorer (suite/runs/reference_score.py) all evaluate through it."""
    with algo.evaluating():  # evaluation mode once, not at every step
        out = protocol.rollout_returns(task, lambda s: algo.act(s.obs, s.avail), protocol.eval_seeds(episodes),
                                       begin=algo.begin_episodes)
    returns = out["returns"]
    return {
        "episodes": int(len(returns)),
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std(ddof=1)) if len(returns) > 1 else 0.0,
        "normalised_score": _normalised(float(returns.mean()), dataset.attrs),
        "win_rate": float(out["won"].mean()) if task.spec.score == "win_rate" else None,
        # Per-episode values (for exports such as marl-eval's absolute metrics).
        "episode_returns": [float(r) for r in returns],
        "episode_scores": [_normalised(float(r), dataset.attrs) for r in returns],
    }


def _normalised(ret: float, attrs: dict) -> float | None:
    """Normalised score, or None for tasks without reference returns (win-rate tasks)."""
    try:
        return fmt.normalised_score(ret, attrs)
    except ValueError:
        return None


def _timed_eval(state: dict, task, algo, dataset, episodes: int) -> dict:
    """evaluate_policy, its seconds added to the run's `eval_s` (kept only by runs that counted it from update
    0: a run resumed from an older checkpoint has none, and records none)."""
    t0 = time.time()
    ev = evaluate_policy(task, algo, dataset, episodes)
    if "eval_s" in state:
        state["eval_s"] += time.time() - t0
    return ev


def _record_eval(plan, task, algo, dataset, update, pending, state, episodes, probe) -> None:
    ev = _timed_eval(state, task, algo, dataset, episodes)
    point = {"update": update, "return_mean": ev["return_mean"], "score": _score(task, ev)}
    means = {k: float(np.mean([m[k] for m in pending])) for k in (pending[0] if pending else {})}
    diag = algo.diagnostics(probe)
    state["curve"].append(point)
    # float32 precision for the training and diagnostic values (the curve point stays exact): the row in the
    # checkpoint and the file are the same, so a resumed run writes what an uninterrupted one does
    state["history"].append(compact_metrics_row({**point, **{f"train/{k}": v for k, v in means.items()}, **diag}))
    pending.clear()
    lines = "".join(json.dumps(h, sort_keys=True) + "\n" for h in state["history"])
    atomic_write_bytes(plan.run_dir / "metrics.jsonl", lines.encode())
    if plan.tracking is not None:  # the record is written first; trackers mirror it
        plan.tracking.point(state["history"][-1])


def _score(task, ev: dict) -> float:
    return ev["win_rate"] if task.spec.score == "win_rate" else ev["normalised_score"]


def _checkpoint(plan: RunPlan, algo, sampler, state: dict, pending: list) -> None:
    """The run's state at its current round, with the training metrics not yet averaged into an evaluation
    point (`pending`: empty on an evaluation point; a stop's checkpoint may fall between them)."""
    payload = {
        "run_key": plan.run_key, "state": {**state, "pending": list(pending)}, "algo": algo.state_dict(),
        "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(),
        "sampler_rng": sampler.generator.get_state(),
    }
    buf = io.BytesIO()
    torch.save(payload, buf)
    atomic_write_bytes(plan.run_dir / "ckpt.pt", buf.getvalue())


def fresh_state(device: str) -> dict:
    """A run's training state at update 0. `devices` lists where it trains: {"from_update", "device"}, one
    entry more each time it resumes on another kind of device (a GPU loan's run finished on a CPU)."""
    return {"update": 0, "curve": [], "history": [], "train_s": 0.0, "eval_s": 0.0,
            "devices": [{"from_update": 0, "device": device}]}


def _resume(plan: RunPlan, algo, sampler, log=lambda _msg: None, device: str = "cpu") -> dict | None:
    path = plan.run_dir / "ckpt.pt"
    if not path.exists():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
        if not isinstance(payload, dict):
            raise TypeError(f"holds a {type(payload).__name__}, not a checkpoint")
    except Exception as exc:  # unreadable (written atomically, so only by outside damage): start over
        path.replace(path.with_name("ckpt.pt.unreadable"))
        log(f"discarded unreadable checkpoint {path} ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
            f"kept as ckpt.pt.unreadable, training from update 0")
        return None
    if payload.get("run_key") != plan.run_key:
        log(f"discarded checkpoint {path}: it belongs to run {payload.get('run_key')!r}, not {plan.run_key}; "
            f"training from update 0")
        return None
    algo.load_state_dict(payload["algo"])
    torch.set_rng_state(payload["torch_rng"])
    np.random.set_state(payload["numpy_rng"])
    sampler.generator.set_state(payload["sampler_rng"])
    return _note_device(payload["state"], list(algo.reseeded_generators), device, log)


def _note_device(state: dict, reseeded: list[str], device: str, log) -> dict:
    """Extend a resumed state's `devices` when this process trains on another kind of device than the one
    that wrote the checkpoint, and say in the run log what that changes (floating point, and the streams of
    `reseeded`: algorithms/common/checkpoint.py, restore_generator)."""
    kind = torch.device(device).type
    if "devices" not in state:  # checkpoints written before `devices`: a stream that did not fit came from the other kind
        other = "cpu" if kind != "cpu" else "cuda"
        state["devices"] = [{"from_update": 0, "device": f"{other} (inferred)" if reseeded else device}]
    previous = state["devices"][-1]["device"]
    if torch.device(previous.split(" ")[0]).type != kind:
        state["devices"].append({"from_update": state["update"], "device": device})
        log(f"resuming on {device} a checkpoint written on {previous}: the rest of the run trains with this "
            f"device's arithmetic" + (f"; random streams {', '.join(reseeded)} continue from seeds derived from "
                                      f"their saved states" if reseeded else "") + " (recorded in train.devices)")
    return state


def _identity_record(plan: RunPlan) -> dict:
    return {"run_key": plan.run_key, **run_identity(plan.cell, plan.profile, plan.config, plan.dataset_sha256)}


def _result(plan: RunPlan, task, final: dict, state: dict, budget: dict) -> dict:
    record = _identity_record(plan)
    record.update(
        schema_version=RESULT_SCHEMA_VERSION, status="done", domain=task.spec.domain,
        score_name=task.spec.score, score=_score(task, final), final_eval=final,
        curve=state["curve"],
        train={"updates": budget["updates"], "wall_clock_s": 0.0, "train_s": state["train_s"],
               "updates_per_s": budget["updates"] / max(state["train_s"], 1e-9),
               # seconds of evaluation: every evaluation point (inside train_s) and the final one
               **({"eval_s": state["eval_s"]} if "eval_s" in state else {}),
               **({"devices": state["devices"]} if len(state.get("devices", [])) > 1 else {})},
        versions={**package_versions(), **task.spec.env_versions()}, image=image_labels(),
        git_commit=git_commit(), finished_at=_now(),
        **({"dataset_rebuild": plan.dataset_rebuild} if plan.dataset_rebuild else {}),
        **({"dataset_source": plan.dataset_source} if plan.dataset_source else {}),
    )
    return record


def _write_status(plan: RunPlan, status: str, **extra) -> None:
    atomic_write_json(plan.run_dir / "status.json", {"status": status, "run_key": plan.run_key,
                                                    "updated_at": _now(), **extra})


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")

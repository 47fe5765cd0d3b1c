"""Where runs execute: in this process, in a local pool of spawned processes, or on Ray.

Every executor runs the same picklable `Job` through `run_job`, which trains one cell and returns
an outcome dict; it never raises. A run's own log goes to `<run_dir>/run.log`.

    run_jobs(jobs, executor="local"|"ray", workers=N, threads=1, device=..., per_gpu=k, on_outcome=cb)

Devices: the parent never initialises CUDA (no torch.cuda call here). GPUs are counted with
`nvidia-smi -L` (or CUDA_VISIBLE_DEVICES); each job gets a device string such as "cuda:1" and
its own process creates the CUDA context. `per_gpu` jobs share one GPU.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from plcql_bench.suite.core.stop import restore_interrupts
from plcql_bench.suite.core.errors import BenchError
from plcql_bench.datasets import manifest
from plcql_bench.datasets.format import DatasetError
from plcql_bench.suite.runs import preflight
from plcql_bench.suite.core.store import read_json
from plcql_bench.suite.runs.runner import RunBusy, data_profile_dir, execute_here, plan_run
from plcql_bench.suite.runs.stacking import execute_stack


@dataclass
class Job:
    cell: Any  # runner.Cell
    profile: Any  # profiles.Profile
    data_dir: Path
    results_dir: Path
    device: str = "cpu"  # "cpu", "cuda", "cuda:<i>" or "auto" (resolved in the worker)
    threads: int | None = None  # torch intra-op threads in the worker (None: leave as is)
    fresh: bool = False  # --force: discard earlier results of this run
    echo: bool = False  # also print the run's log lines (in-process runs)
    overrides: dict = field(default_factory=dict)
    stack: list = field(default_factory=list)  # more seeds of `cell`'s cell, trained with it as one stack
    build_dataset: bool = False  # the cell's dataset was missing when `all` started: build it first (preflight)
    build_token: str = ""  # the `all` invocation, for preflight.ensure_dataset's failure records
    estimate_s: float | None = None  # seconds it still needs (`plan`'s estimate), read under a deadline
    trackers: tuple = ()  # `all --log`: experiment trackers mirroring each run's metrics (suite/runs/tracking.py)

    def cells(self) -> list:
        return [self.cell, *self.stack]


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


DEFAULT_THREADS = 1  # torch intra-op threads per run (`all --threads`)


def default_jobs(device: str, n_gpus: int, per_gpu: int, executor: str, ray_address: str | None) -> int:
    """Runs at once when `--jobs` is not given: one per core on CPU (each with DEFAULT_THREADS
    torch threads, so jobs x threads = cores), GPUs x per_gpu on CUDA, and as many as the cluster
    schedules (0) on an existing Ray cluster. Small runs gain nothing from intra-op threads, and
    on a busy machine a multi-threaded pool waits for busy cores (docs/runner.md, "Scaling")."""
    if executor == "ray" and ray_address:
        return 0
    if device == "cuda":
        return n_gpus * per_gpu
    return cpu_count()


def gpu_count() -> int:
    """GPUs visible to this process, without initialising CUDA."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"])
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def resolve_device(device: str) -> tuple[str, int]:
    """("cpu" | "cuda", number of GPUs) for --device auto|cpu|cuda, decided in the parent."""
    if device == "cpu":
        return "cpu", 0
    n = gpu_count()
    if device == "auto":
        return ("cuda", n) if n else ("cpu", 0)
    if device.startswith("cuda"):
        if not n:
            raise BenchError("--device cuda: no GPU visible (nvidia-smi -L lists none)")
        return "cuda", n
    raise BenchError(f"--device {device!r}: expected auto, cpu or cuda")


# ----------------------------------------------------------------------------- the worker
def run_job(job: Job) -> dict:
    """Train one cell; returns {"cell", "state": trained|skipped|busy|failed, ...}. Never raises.
    A job with a `stack` trains its cells as one seed stack (suite/runs/stacking.py) and returns
    {"stack_outcomes": one outcome per cell}."""
    if job.stack:
        return _run_stack_job(job)
    started = time.time()
    out: dict[str, Any] = {"cell": job.cell, "state": "failed", "score": None, "error": "",
                           "traceback": "", "run_dir": None, "seconds": 0.0, "pid": os.getpid()}
    try:
        device = _worker_device(job)
        if _missing_dataset(job, [out]):
            return out
        plan = plan_run(job.cell, job.profile, job.data_dir, job.results_dir, job.overrides)
        plan.trackers = job.trackers
        out["run_dir"] = str(plan.run_dir)
        if plan.is_done() and not job.fresh:
            out.update(state="skipped", score=_score(plan))
            return out
        log = _RunLog(plan.run_dir, echo=job.echo)
        out["resumed"] = _resumable(plan, job)
        try:
            trained, result = execute_here(plan, device=device, log=log, fresh=job.fresh)
        except RunBusy as exc:
            out.update(state="busy", error=str(exc))
            return out
        if not trained:  # another process finished it meanwhile: done, but not by this one
            out.update(state="skipped", score=result.get("score"))
            return out
        out.update(state="trained", score=result["score"], run_seconds=result["train"]["train_s"])
    except Exception as exc:  # isolate: the caller records it and goes on with the others
        out.update(state="failed", error=" ".join(f"{type(exc).__name__}: {exc}".split()),
                   traceback=traceback.format_exc(), user_error=_user_error(exc))
    finally:
        out["seconds"] = time.time() - started
    return out


def _user_error(exc: BaseException) -> bool:
    """Whether a failure is the user's to fix (exit status 2): bad input, or a file or folder that cannot be
    read or written (a read-only results folder, a full disk), as the CLI treats them."""

    return isinstance(exc, (BenchError, DatasetError, OSError))


def _missing_dataset(job: Job, outs: list[dict]) -> bool:
    """For a job whose dataset `all` left to be built (`build_dataset`): build it now (preflight.ensure_dataset).
    When it cannot be built, each cell's outcome says why and its stand-in run directory records the cause
    and the fix, as `all` records an unbuildable dataset; returns True then."""
    if not job.build_dataset:
        return False

    def say(line: str, err: bool = False) -> None:  # the console: a pool worker's lines go to stderr
        print(line, file=sys.stderr if err or not job.echo else sys.stdout, flush=True)

    cell = job.cell
    problem = preflight.ensure_dataset(cell.task, cell.tier, job.profile,
                                       data_profile_dir(job.data_dir, job.profile), job.build_token, say)
    for c, o in zip(job.cells(), outs):
        if problem is None:
            preflight.clear_failure(c, job.profile, job.results_dir)
            continue
        stand_in = preflight.record_failure(c, job.profile, job.results_dir, problem)
        o.update(state="failed", error=problem.message(), run_dir=str(stand_in), no_dataset=True,
                 problem={"cause": problem.cause, "fix": problem.fix})
    return problem is not None


def _worker_device(job: Job) -> str:
    """Set the worker's torch threads and resolve the job's device ("auto": CUDA when there is one)."""

    if job.threads:
        torch.set_num_threads(job.threads)
    if job.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return job.device


def _run_stack_job(job: Job) -> dict:
    """run_job for the cells of a seed stack: one outcome per cell. A failure fails every seed of the stack
    (each status.json holds the traceback)."""
    started = time.time()
    cells = job.cells()
    outs = [{"cell": c, "state": "failed", "score": None, "error": "", "traceback": "", "run_dir": None,
             "seconds": 0.0, "pid": os.getpid()} for c in cells]
    try:
        device = _worker_device(job)
        if _missing_dataset(job, outs):
            return {"stack_outcomes": outs}
        plans = [plan_run(c, job.profile, job.data_dir, job.results_dir, job.overrides) for c in cells]
        for o, plan in zip(outs, plans):
            plan.trackers = job.trackers
            o.update(run_dir=str(plan.run_dir), resumed=_resumable(plan, job))
        logs = [_RunLog(plan.run_dir, echo=job.echo) for plan in plans]
        for o, plan, res in zip(outs, plans, execute_stack(plans, device=device, logs=logs, fresh=job.fresh)):
            o.update(state=res["state"], error=res.get("error", ""),
                     score=res["result"]["score"] if res["result"] else None,
                     run_seconds=res["result"]["train"]["train_s"] if res["result"] else None)
    except Exception as exc:  # isolate, as run_job
        for o in outs:
            if o["state"] == "failed":
                o.update(error=" ".join(f"{type(exc).__name__}: {exc}".split()), traceback=traceback.format_exc(),
                         user_error=_user_error(exc))
    finally:
        for o in outs:
            o["seconds"] = time.time() - started
    return {"stack_outcomes": outs}


def _resumable(plan, job: Job) -> bool:
    """Whether the run picks up from a checkpoint an earlier process wrote (for `all`'s outcome line)."""
    return not job.fresh and (plan.run_dir / "ckpt.pt").exists()


def _score(plan) -> float | None:
    try:
        return read_json(plan.final_path).get("score")
    except (OSError, ValueError):
        return None


class _RunLog:
    """Appends timestamped lines to <run_dir>/run.log (created with the run directory)."""

    def __init__(self, run_dir: Path, echo: bool):
        self.path = Path(run_dir) / "run.log"
        self.echo = echo

    def __call__(self, msg: str) -> None:
        if self.echo:
            print(msg.splitlines()[0] if msg else msg, flush=True)
        if self.path.parent.exists():
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            with open(self.path, "a") as fh:
                fh.write(f"{stamp} {msg}\n")


def _init_worker(threads: int | None) -> None:
    restore_interrupts()
    if threads:
        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- executors
def run_jobs(jobs: list[Job], executor: str = "local", workers: int = 1, device: str = "cpu",
             n_gpus: int = 0, per_gpu: int = 1, ray_address: str | None = None,
             on_outcome: Callable[[dict], None] = lambda o: None, echo: bool = True,
             threads: int = DEFAULT_THREADS, deadline: float | None = None) -> list[dict]:
    """Run every job, each with `threads` torch threads; calls on_outcome as each finishes;
    returns the outcomes in finish order. Under a deadline (time.monotonic() seconds) a job starts only
    when it is expected to finish before it (next_job); the others get a "deferred" outcome."""
    if not jobs:
        return []
    for job in jobs:
        job.threads = threads
    on_outcome = _per_cell(on_outcome)
    if executor == "ray":
        if deadline is not None:
            raise BenchError("--finish-within: works with the local executor (Ray schedules the jobs itself)")
        return _flat(_run_ray(jobs, workers, device, per_gpu, ray_address, on_outcome))
    if executor != "local":
        raise BenchError(f"--executor {executor!r}: expected local or ray")
    slots = _device_slots(device, n_gpus, per_gpu, workers)[: len(jobs)]  # no idle workers
    queue = list(jobs)
    if len(slots) == 1 and device == "cpu":
        outcomes = []
        while (job := next_job(queue, deadline)) is not None:  # in this process: no start-up cost,
            job.echo = echo                                      # log lines also on the console
            outcome = run_job(job)
            outcomes.append(outcome)
            on_outcome(outcome)
    else:
        outcomes = _run_pool(queue, slots, on_outcome, threads, deadline)
    for job in queue:  # what the deadline left for a later `all`
        outcomes.append(_deferred(job))
        on_outcome(outcomes[-1])
    return _flat(outcomes)


# A job starts under a deadline only if FINISH_MARGIN x its estimate fits in the time left: the estimates
# (suite/runs/calibration.py) are within ~15 % of measured runs on a quiet machine, and a run cut off by the
# deadline's end of session is worth nothing there.
FINISH_MARGIN = 1.2


def next_job(queue: list[Job], deadline: float | None, now: Callable[[], float] = time.monotonic,
             build_left: Callable[[Job], float] | None = None) -> Job | None:
    """Take the next job to start from queue: the first, without a deadline; under one, the first in queue
    order expected to finish before it, its dataset's build included while that is still to be done
    (`build_left`, default build_left_s); a job without an estimate never is. None when none can start."""
    if deadline is None:
        return queue.pop(0) if queue else None
    build_left = build_left or build_left_s
    left = deadline - now()
    for i, job in enumerate(queue):
        if job.estimate_s is None or job.estimate_s * FINISH_MARGIN > left:
            continue  # does not fit even without a build: no need to read the manifest
        if (job.estimate_s + build_left(job)) * FINISH_MARGIN <= left:
            return queue.pop(i)
    return None


def build_left_s(job: Job) -> float:
    """The seconds the job's dataset build still costs: its estimate (preflight.build_estimate) when `all`
    left the dataset to be built and no worker has built it yet, else 0."""
    if not job.build_dataset:
        return 0.0

    try:
        if manifest.built(data_profile_dir(job.data_dir, job.profile), job.cell.task, job.cell.tier) is not None:
            return 0.0
    except Exception:  # an unreadable manifest: the worker's build reports it; here, price the build
        pass
    return preflight.build_estimate(job.cell.task)


def _deferred(job: Job) -> dict:
    """Outcome of a job not started because it would not finish before the deadline (one per seed)."""
    est = "no estimate" if job.estimate_s is None else f"estimate {job.estimate_s:.0f} s"
    outcomes = [{"cell": c, "state": "deferred", "score": None, "seconds": 0.0,
                 "error": f"not started: would not finish before the deadline ({est})"} for c in job.cells()]
    return outcomes[0] if len(outcomes) == 1 else {**outcomes[0], "stack_outcomes": outcomes}


def _flat(outcomes: list[dict]) -> list[dict]:
    return [o for outcome in outcomes for o in outcome.get("stack_outcomes", [outcome])]


def _per_cell(on_outcome: Callable[[dict], None]) -> Callable[[dict], None]:
    """on_outcome called once per cell: a seed stack's job reports one outcome per seed."""
    def report(outcome: dict) -> None:
        for o in outcome.get("stack_outcomes", [outcome]):
            on_outcome(o)
    return report


def _device_slots(device: str, n_gpus: int, per_gpu: int, workers: int) -> list[str]:
    """One device string per concurrent job: cpu x workers, or cuda:i x per_gpu per GPU."""
    if device == "cuda":
        slots = [f"cuda:{g}" for _ in range(max(1, per_gpu)) for g in range(n_gpus)]
        return slots[: workers] if workers else slots
    return ["cpu"] * max(1, workers)


def _run_pool(queue: list[Job], slots: list[str], on_outcome, threads: int, deadline: float | None = None) -> list[dict]:
    """Spawned worker processes (never fork: no inherited torch/CUDA/thread state), at most
    len(slots) jobs in flight, each with its slot's device. A worker that dies (SIGKILL, OOM,
    segfault) fails only the jobs it was running; the pool is rebuilt for the rest. Takes the jobs
    from queue (next_job); what is left in it when nothing more can start is the caller's."""
    ctx = multiprocessing.get_context("spawn")
    free = list(slots)
    outcomes: list[dict] = []
    pool = ProcessPoolExecutor(max_workers=len(slots), mp_context=ctx, initializer=_init_worker,
                               initargs=(threads,))
    running: dict = {}
    try:
        while queue or running:
            while queue and free and (job := next_job(queue, deadline)) is not None:
                slot = free.pop(0)
                job.device = slot
                running[pool.submit(run_job, job)] = (job, slot)
            if not running:  # nothing left that can start before the deadline
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            broken = False
            for fut in done:
                job, slot = running.pop(fut)
                free.append(slot)
                try:
                    outcome = fut.result()
                except BrokenProcessPool:
                    broken = True
                    outcome = _worker_died(job)
                outcomes.append(outcome)
                on_outcome(outcome)
            if broken:
                for fut, (job, slot) in list(running.items()):
                    running.pop(fut)
                    free.append(slot)
                    outcome = _worker_died(job)
                    outcomes.append(outcome)
                    on_outcome(outcome)
                pool.shutdown(wait=False, cancel_futures=True)
                pool = ProcessPoolExecutor(max_workers=len(slots), mp_context=ctx,
                                           initializer=_init_worker, initargs=(threads,))
    except KeyboardInterrupt:
        _interrupt_workers(pool)  # a signal sent to this process alone: the runs stop too
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return outcomes


def _interrupt_workers(pool: ProcessPoolExecutor) -> None:
    for proc in list((getattr(pool, "_processes", None) or {}).values()):  # no public accessor
        try:
            os.kill(proc.pid, signal.SIGINT)
        except (ProcessLookupError, OSError):
            pass


def _worker_died(job: Job) -> dict:
    """Outcome of a job whose process died without reporting; it resumes from its checkpoint
    on the next `all` (its status.json still says running or interrupted). A seed stack: one per seed."""

    if job.stack:
        return {"stack_outcomes": [_worker_died(Job(c, job.profile, job.data_dir, job.results_dir,
                                                    overrides=job.overrides)) for c in job.cells()]}

    run_dir = None
    try:
        plan = plan_run(job.cell, job.profile, job.data_dir, job.results_dir, job.overrides)
        run_dir = str(plan.run_dir)
        if plan.is_done():
            return {"cell": job.cell, "state": "trained", "score": _score(plan), "error": "",
                    "traceback": "", "run_dir": run_dir, "seconds": 0.0}
    except Exception:  # noqa: BLE001 - reported below
        pass
    return {"cell": job.cell, "state": "failed", "score": None, "run_dir": run_dir, "seconds": 0.0,
            "error": "worker process died (killed or crashed); `all` resumes it from its checkpoint",
            "traceback": ""}


def _run_ray(jobs: list[Job], workers: int, device: str, per_gpu: int, address: str | None,
             on_outcome) -> list[dict]:
    """Submit every job as a Ray task to the cluster at `address`, or to a local Ray started on
    loopback with `workers` CPUs. Paths must be visible to every node (a shared filesystem)."""
    try:
        import ray
    except ImportError:
        raise BenchError("--executor ray needs Ray: pip install 'plcql-bench[ray]'") from None
    started_here = False
    threads = jobs[0].threads or 1  # each task reserves as many CPUs as it uses threads
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        else:
            ray.init(num_cpus=max(1, workers) * threads, include_dashboard=False, log_to_driver=False,
                     configure_logging=False, _node_ip_address="127.0.0.1")
            started_here = True
    try:
        gpus = (1.0 / max(1, per_gpu)) if device == "cuda" else 0
        remote = ray.remote(run_job).options(num_cpus=1 if device == "cuda" else threads, num_gpus=gpus,
                                             max_retries=0)
        cap = workers if workers else len(jobs)  # 0: as many as the cluster schedules
        queue, running, outcomes = list(jobs), {}, []
        while queue or running:
            while queue and len(running) < cap:
                job = queue.pop(0)
                job.device = "cuda" if device == "cuda" else "cpu"
                running[remote.remote(job)] = job
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                job = running.pop(ref)
                try:
                    outcome = ray.get(ref)
                except Exception as exc:  # worker crashed or task errored outside run_job
                    outcome = _worker_died(job)
                    for o in outcome.get("stack_outcomes", [outcome]):
                        if o["state"] == "failed":
                            o["error"] = " ".join(f"ray: {type(exc).__name__}: {exc}".split())[:500]
                outcomes.append(outcome)
                on_outcome(outcome)
        return outcomes
    finally:
        if started_here:
            ray.shutdown()

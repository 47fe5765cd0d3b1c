"""The `plcql-bench` commands that train and read runs: run, all, plan, status, export, leaderboard, version
(suite/commands/main.py holds the root group and loads these only when one of them is called)."""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
import warnings
from pathlib import Path

import click
import torch
from tqdm import tqdm

from plcql_bench.suite.core.settings import RESULTS_ENV
from plcql_bench.suite.commands.clitypes import DURATION
from plcql_bench.suite.commands.options import dir_option
from plcql_bench.suite.core.errors import BenchError, RunFailed
from plcql_bench.algorithms.common import native
from plcql_bench.datasets.format import DatasetError
from plcql_bench.leaderboard.build import build
from plcql_bench.leaderboard.site import (
    COMMITTED_RESULTS,
    YOUR_RUNS,
    build_boards,
    committed_hint,
    committed_results,
    shown,
)
from plcql_bench.suite.runs import preflight
from plcql_bench.suite.runs.calibration import calibration_for, makespan
from plcql_bench.suite.core.schema import Damaged, enforce_strict, links_out
from plcql_bench.suite.core.store import link_leaving, read_json
from plcql_bench.suite.runs.executors import (
    Job,
    _RunLog,
    cpu_count,
    default_jobs,
    resolve_device,
    run_jobs,
)
from plcql_bench.suite.runs.export import export
from plcql_bench.suite.runs.matrix import (
    cell_state,
    estimate_cells,
    format_seconds,
    parse_only,
    parse_shard,
    parse_sweeps,
    plan_on_card,
    resolve,
    run_record,
    select_cells,
    select_queue,
)
from plcql_bench.suite.runs.preflight import check_buildable
from plcql_bench.suite.runs.profiles import load_profile
from plcql_bench.suite.runs.runner import (
    KERNEL_CHOICES,
    Cell,
    data_profile_dir,
    execute,
    plan_run,
    resolve_config,
    use_kernels,
)
from plcql_bench.suite.runs.stacking import stack_groups
from plcql_bench.suite.runs.tracking import check_available


def _user_errors() -> tuple[type[BaseException], ...]:
    return (BenchError, DatasetError)


def _results_root(obj) -> Path:
    """The results folder a read command reads; BenchError when it does not exist (a typo in
    --results-dir must not look like "no runs")."""
    root = Path(obj["results_dir"])
    if not root.is_dir():
        raise BenchError(f"results directory not found: {root} (--results-dir or ${RESULTS_ENV})")
    return root


def _reading(obj) -> None:
    """The first line of a command that reads results: which folder, and how it was chosen."""

    click.echo(f"results: {shown(obj['results_dir'])} ({obj['results_from']})")


def _hint(obj, command: str, profile: str | None = None) -> None:
    """For a command that found nothing in the results folder: where the committed results are
    and the command that reads them (nothing when there are none, or they are what it read)."""

    hint = committed_hint(obj["results_dir"], command, profile)
    if hint:
        click.echo(f"hint: {hint}")


# ----------------------------------------------------------------------------- runs
def _parse_sets(pairs: tuple[str, ...]) -> dict:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise BenchError(f"--set {pair!r}: expected key=value")
        key, raw = pair.split("=", 1)
        if not key.strip():
            raise BenchError(f"--set {pair!r}: empty key (expected key=value)")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


_LOG = click.option("--log", "trackers", multiple=True, type=click.Choice(["tensorboard", "wandb"]),
                    help="Also log each run's metrics to an experiment tracker (extras [tensorboard], [wandb]; "
                         "W&B offline unless WANDB_MODE says otherwise); metrics.jsonl stays the record. Repeatable.")


def _kernels_option(f):
    """`run` and `all`: which kernels the runs use (recorded in each final.json, outside the run key)."""
    return click.option(
        "--kernels", type=click.Choice(KERNEL_CHOICES), default=None,
        help="The networks' kernels: native (fused, with the C kernels where a compiler is found), fused (torch "
             "only) or plain (the reference form). Results agree within the equivalence tests' tolerance; the "
             "choice is recorded in final.json (hardware.kernels), not in the run key. Default: "
             "$PLCQL_KERNELS / $PLCQL_NATIVE, else native.")(f)


@click.command()
@click.option("--algo", required=True)
@click.option("--task", required=True)
@click.option("--tier", "--dataset", "tier", required=True, help="Dataset tier, e.g. expert (--dataset: the old "
              "spelling, still accepted).")
@click.option("--seed", default=0, show_default=True)
@click.option("--profile", default="smoke", show_default=True)
@click.option("--set", "sets", multiple=True, help="Config override key=value (JSON value).")
@click.option("--device", default="cpu", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True, help="torch threads.")
@_kernels_option
@_LOG
@click.pass_obj
def run(obj, algo, task, tier, seed, profile, sets, device, threads, trackers, kernels) -> None:
    """Train and evaluate one cell; skips it if already finished."""

    use_kernels(kernels)
    trackers = check_available(trackers)
    plan = plan_run(Cell(algo, task, tier, seed), load_profile(profile), obj["data_dir"],
                    obj["results_dir"], _parse_sets(sets))
    plan.trackers = trackers
    if plan.is_done():
        click.echo(f"{plan.cell.label()}: already done -> {plan.final_path}")
        return
    torch.set_num_threads(threads)
    try:
        result = execute(plan, device=device, log=_RunLog(plan.run_dir, echo=True))
    except Exception as exc:
        if not (plan.run_dir / "status.json").exists() or isinstance(exc, _user_errors() + (OSError,)):
            raise  # before training started: a user error or an unwritable folder
        raise RunFailed(f"{plan.cell.label()} failed: {type(exc).__name__}: {exc} (traceback in "
                        f"{plan.run_dir / 'status.json'} and run.log; nothing recorded as done)") from None
    click.echo(f"{plan.cell.label()}: score {result['score']:.2f} ({result['score_name']}) "
               f"in {result['train']['wall_clock_s']:.1f}s -> {plan.final_path}")


# Options shared by `all` and `plan`: which cells.
def _matrix_options(f):
    f = click.option("--shard", default=None, metavar="I/N",
                     help="Only shard I of N (0-based) of the selected cells, for CI matrices and "
                          "Slurm arrays (e.g. --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT).")(f)
    f = click.option("--only", multiple=True, metavar="KEY=V[,V..][,KEY=V..]",
                     help="Filter the matrix: algo=, task=, tier=, seed= with comma lists, "
                          "e.g. --only algo=bc,cfcql,seed=0,1.")(f)
    f = click.option("--queue", multiple=True, metavar="KEY=V[,V..][,KEY=V..]",
                     help="Like --only, but several --queue options add up in the order given (a "
                          "priority queue: the first selection's cells run first). Not with --only.")(f)
    f = click.option("--set", "sets", multiple=True, metavar="ALGO.FIELD=V1[,V2..]",
                     help="A sweep: one variant of ALGO per value (named ALGO-FIELD-V, its own run key), "
                          "trained beside ALGO on each of its cells; checked as run --set values are.")(f)
    return click.option("--profile", default="smoke", show_default=True)(f)


def _select(obj, profile, only, shard, queue=(), sets=()):
    if only and queue:
        raise click.UsageError("--only and --queue select cells in different ways: use one of them")
    prof = load_profile(profile)
    sweeps = parse_sweeps(sets)
    if queue:
        return prof, select_queue(prof, queue, parse_shard(shard), sweeps)
    return prof, select_cells(prof, parse_only(only), parse_shard(shard), sweeps)


class _Progress:
    """A progress bar with ETA on a terminal (tqdm); plain lines, no bar, when piped."""

    def __init__(self, total: int, desc: str):
        self.bar = None
        if total and sys.stdout.isatty():
            self.bar = tqdm(total=total, desc=desc, unit="run", file=sys.stdout, dynamic_ncols=True)

    def echo(self, msg: str, err: bool = False) -> None:
        if self.bar is not None and not err:
            self.bar.write(msg)
        else:
            click.echo(msg, err=err)

    def step(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@click.command("all")
@_matrix_options
@click.option("--build-missing/--no-build-missing", default=True, show_default=True,
              help="Build datasets the selected cells need when they are missing.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Runs at once (default: the number of cores on CPU; GPUs x --per-gpu on CUDA; on an "
                   "existing Ray cluster, as many as it schedules). "
                   "With more than one, each run trains in a spawned process; its log in run.log.")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="torch threads per run (jobs x threads should not exceed the cores).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--per-gpu", type=click.IntRange(min=1), default=1, show_default=True,
              help="Runs sharing one GPU (with --device cuda/auto).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--ray-address", default=None, help="Existing Ray cluster (default: start a local one on 127.0.0.1).")
@click.option("--rerun-failed", is_flag=True, help="Run failed cells again (default: report and skip them).")
@click.option("--force", is_flag=True, help="Retrain the selected cells from scratch, even finished ones.")
@click.option("--stack", type=click.IntRange(min=1), default=1, show_default=True,
              help="Train up to this many seeds of a cell in one process as stacked models (continuous "
                   "CFCQL, MACQL, SPaCQL, PLCQL; others alone). Each seed keeps its own run (docs/runner.md).")
@click.option("--finish-within", "finish_within", type=DURATION, default=None, metavar="DURATION",
              help="Start a cell only if `plan` expects it to finish within this time of the start "
                   "(e.g. 2h30m, with a 20 % margin), taking the first such cell in queue order; the others "
                   "are left for a later `all`. For a session or CI window whose end loses unfinished runs.")
@_kernels_option
@_LOG
@click.pass_obj
def run_all(obj, profile, only, queue, sets, shard, build_missing, jobs, threads, device, per_gpu, executor,
            ray_address, rerun_failed, force, stack, finish_within, kernels, trackers) -> None:
    """Run the profile's matrix: build each missing dataset when the queue reaches its first cell (in that
    cell's job), skip finished cells, resume partial ones
    from their checkpoint, isolate failures (a dataset that cannot be built fails only its cells;
    a run's traceback goes to its status.json); exit 1 if any selected cell is failed, 2 if a
    dataset is damaged or a config does not resolve."""

    deadline = None if finish_within is None else time.monotonic() + finish_within
    use_kernels(kernels)
    trackers = check_available(trackers)
    prof, cells = _select(obj, profile, only, shard, queue, sets)
    for cell in cells:  # every config resolves before any dataset is built or anything is written
        resolve_config(cell, prof)
    dev, n_gpus = resolve_device(device)
    if jobs is None:
        jobs = default_jobs(dev, n_gpus, per_gpu, executor, ray_address)
    if dev == "cpu" and jobs * threads > cpu_count():
        click.echo(f"note: {jobs} jobs x {threads} threads > {cpu_count()} cores", err=True)
    if dev == "cpu" and stack > 1:
        click.echo(f"note: --stack {stack} on a CPU: a stacked round of S seeds is slower than S separate runs' "
                   "rounds there (docs/runner.md, 'Speed, CPU'); stacking is for GPUs", err=True)
    data_root = data_profile_dir(obj["data_dir"], prof)
    # A missing dataset is built by the job of its first cell, just before it trains (preflight.ensure_dataset):
    # the queue's first cells do not wait for every dataset of the selection.
    _build_native_kernels(cells)
    problems, deferred = preflight.prepare_datasets(dict.fromkeys((c.task, c.tier) for c in cells), prof, data_root,
                                                    build_missing, click.echo)
    token = uuid.uuid4().hex
    counts = {"trained": 0, "skipped": 0, "failed": 0, "busy": 0, "failed_skipped": 0, "no_dataset": 0,
              "user_error": 0, "deferred": 0}
    todo = []
    for cell in cells:
        if (cell.task, cell.tier) in deferred:
            # Done on its committed card's dataset (what a build here reproduces, or rebuilds to rounding:
            # datasets/cards.py): skipped without building it. Else done or not is known once it is built.
            on_card = None if force else plan_on_card(cell, prof, obj["data_dir"], obj["results_dir"])
            if on_card is not None and cell_state(on_card) == "done":
                counts["skipped"] += 1
            else:
                todo.append(cell)
            continue
        problem = problems.get((cell.task, cell.tier))
        if problem is not None:  # fails alone: recorded now, retried by the next `all`
            preflight.record_failure(cell, prof, obj["results_dir"], problem)
            counts["failed"] += 1
            counts["no_dataset"] += 1
            continue
        preflight.clear_failure(cell, prof, obj["results_dir"])
        plan = plan_run(cell, prof, obj["data_dir"], obj["results_dir"])  # resolves before any run
        state = cell_state(plan)
        if force:
            todo.append(cell)
        elif state == "done":
            counts["skipped"] += 1
        elif state == "failed" and not rerun_failed:
            counts["failed_skipped"] += 1
            click.echo(f"failed earlier, skipped (--rerun-failed to retry): {cell.label()} "
                       f"({plan.run_dir / 'status.json'})", err=True)
        else:
            todo.append(cell)
    to_build = {(c.task, c.tier) for c in todo} & set(deferred)
    if to_build:
        click.echo(f"{len(to_build)} dataset(s) not built yet: each is built just before its first cell trains")

    job_list = [Job(g[0], prof, obj["data_dir"], obj["results_dir"], device=dev, fresh=force, stack=g[1:],
                    build_dataset=(g[0].task, g[0].tier) in deferred, build_token=token, trackers=trackers)
                for g in stack_groups(todo, stack)]
    if deadline is not None:
        _set_estimates(job_list, prof, obj)
    progress = _Progress(len(todo), f"all ({prof.name})")

    def report(o: dict) -> None:
        progress.step()
        cell = o["cell"]
        if o["state"] in ("trained", "skipped"):
            counts["trained" if o["state"] == "trained" else "skipped"] += 1
            progress.echo(outcome_line(o))
        elif o["state"] == "busy":
            counts["busy"] += 1
            progress.echo(f"busy, skipped: {o['error']}", err=True)
        elif o["state"] == "deferred":  # the first few named; a long queue's rest only counted
            counts["deferred"] += 1
            if counts["deferred"] <= DEFERRED_SHOWN:
                progress.echo(f"left for later: {cell.label()}: {o['error']}", err=True)
            elif counts["deferred"] == DEFERRED_SHOWN + 1:
                progress.echo("left for later: more cells (counted below)", err=True)
        else:
            counts["failed"] += 1
            counts["user_error"] += bool(o.get("user_error"))
            if o.get("no_dataset"):  # its dataset could not be built (preflight.ensure_dataset)
                counts["no_dataset"] += 1
                problems[(cell.task, cell.tier)] = preflight.DatasetProblem(cell.task, cell.tier, **o["problem"])
            status_file = Path(o["run_dir"]) / "status.json" if o.get("run_dir") else None
            where = f" (see {status_file})" if _records_failure(status_file) else ""
            progress.echo(f"FAILED {cell.label()}: {o['error']}{where}", err=True)

    try:
        run_jobs(job_list, executor=executor, workers=jobs, device=dev, n_gpus=n_gpus, per_gpu=per_gpu,
                 ray_address=ray_address, on_outcome=report, echo=progress.bar is None, threads=threads,
                 deadline=deadline)
    finally:
        progress.close()
        preflight.forget_build_failures(data_root, token)
    _all_summary(prof, cells, counts, problems, cells_per=lambda key: sum(
        (c.task, c.tier) == key for c in cells))


DEFERRED_SHOWN = 10  # cells left for later by --finish-within named one per line


def _build_native_kernels(cells) -> None:
    """The native (C) kernels (the discrete networks' and the continuous CF-CQL penalty's), built here once before
    any run starts, not inside a training process; where they cannot be built, one line says the torch form runs
    instead. Cached by source and compiler (algorithms/common/native.py): only a first `all` compiles."""
    if not native.enabled() or not cells:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # said once below instead of once per kernel
        built = native.build_all()
    missing = [name for name in built if name not in native.loaded()]
    if missing:
        click.echo(f"note: native kernels {', '.join(missing)} {built[missing[0]]}", err=True)


def _records_failure(status_file: Path | None) -> bool:
    """Whether a run's status.json records a failure (a FAILED line points to it only then: one that could
    not be written, in a read-only folder, still says done)."""

    try:
        return status_file is not None and read_json(status_file).get("status") in ("failed", "interrupted")
    except (OSError, ValueError, AttributeError):
        return False


def outcome_line(o: dict) -> str:
    """A trained or skipped cell's line in `all`'s output. A resumed run's line gives its training time in all
    (final.json's train_s) too: this process's seconds are only the part after the checkpoint."""
    score = f"{o['score']:.2f}" if o["score"] is not None else "n/a"
    took = f"{o['seconds']:.1f}s"
    if o["state"] == "trained" and o.get("resumed") and o.get("run_seconds") is not None:
        took += f"; resumed, {o['run_seconds']:.1f}s training in all"
    return f"{o['cell'].label()}: score {score} ({took})"


def _set_estimates(job_list, prof, obj) -> None:
    """Each job's estimate for --finish-within: `plan`'s seconds for its cell (a seed stack: its slowest
    seed's). An estimate priced only from the algorithm's runs on other tasks (Estimate.weak) counts as
    none: such a job never starts under a deadline, rather than being cut off by the session's end."""

    cells = [c for job in job_list for c in job.cells()]
    left = {e.cell: None if e.weak else e.seconds
            for e in estimate_cells(resolve(cells, prof, obj["data_dir"], obj["results_dir"]),
                                    obj["results_dir"], prof, calibration_for())}
    for job in job_list:
        secs = [left[c] for c in job.cells() if c in left]  # a cell not in left is done
        job.estimate_s = None if None in secs else max(secs, default=0.0)


def _all_summary(prof, cells, counts: dict, problems: dict, cells_per) -> None:
    """The last lines of `all`: counts, then one line per dataset that could not be built; exit 1
    if any cell is failed."""
    failed = counts["failed"] + counts["failed_skipped"]
    extra = f" ({counts['no_dataset']} without their dataset)" if counts["no_dataset"] else ""
    extra += f", failed earlier and skipped {counts['failed_skipped']}" if counts["failed_skipped"] else ""
    extra += f", busy elsewhere {counts['busy']}" if counts["busy"] else ""
    extra += f", left for later {counts['deferred']} (--finish-within)" if counts.get("deferred") else ""
    click.echo(f"all ({prof.name}): {len(cells)} cells: trained {counts['trained']}, "
               f"skipped {counts['skipped']} (done), failed {counts['failed']}{extra}")
    for key, problem in problems.items():
        click.echo(f"  {cells_per(key)} cell(s) failed: {problem.message()}")
    if counts.get("user_error") or any(p.user_error for p in problems.values()):
        sys.exit(2)  # a damaged dataset: the user's to fix (docs/runner.md)
    if failed:
        sys.exit(1)


@click.command()
@_matrix_options
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Parallel runs for the wall-clock estimate (default: the calibrated machine's cores "
                   "on CPU, 1 on a GPU).")
@click.option("--machine", default=None, metavar="NAME|FILE",
              help="Calibration to estimate from: a committed machine (suite/runs/calibrations/) or a file "
                   "written by `bench-speed --calibrate` (default: " + "cpu-dev-2core" + ").")
@click.option("--cells/--no-cells", "show_cells", default=True, show_default=True,
              help="List every cell, or only the summary.")
@click.option("--strict", is_flag=True,
              help="Exit with status 2 when any run file is damaged (every cell is still shown).")
@click.pass_obj
def plan(obj, profile, only, queue, sets, shard, jobs, machine, show_cells, strict) -> None:
    """Resolve the matrix (configs, datasets), show each cell's state and a wall-clock estimate
    from measured costs: per task, per algorithm, serial and with --jobs. Exit 2 if a config does
    not resolve; datasets not built yet are listed (`all` builds them), with the fix when nothing
    here can build them."""

    prof, cells = _select(obj, profile, only, shard, queue, sets)
    items = resolve(cells, prof, obj["data_dir"], obj["results_dir"])
    _reading(obj)
    counts = dict.fromkeys(("done", "partial", "running", "failed", "todo"), 0)
    bad, unbuildable, done_seeds, damaged = [], {}, {}, []
    if show_cells:
        click.echo(f"{'algo':<12} {'task':<24} {'tier':<13} {'seed':>4}  {'state':<8} {'step':>11}  run / note")
    for item in items:
        c = item.cell
        state = cell_state(item.plan)
        counts[state] += 1
        row = done_seeds.setdefault((c.algo, c.task, c.tier), [0])
        row[0] += state == "done"
        step, note = "", ""
        if item.plan is not None:  # (planned on the committed card's sha256 when the dataset is not built)
            rec = run_record(item.plan.run_dir) if item.plan.run_dir.exists() else {}
            damaged += [Damaged(str(p), why) for p, why in rec.get("damaged", [])]
            updates = prof.updates_for(c.task, c.tier)
            step = f"{rec.get('update') or 0}/{updates}"
            note = item.plan.run_key[:10]
            if state == "failed":
                note += f"  {rec.get('reason', '')}"
        if item.dataset_missing:
            key = (c.task, c.tier)
            if key not in unbuildable:
                unbuildable[key] = check_buildable(c.task, c.tier, prof.name, prof)
            problem = unbuildable[key]
            if state != "done":  # runs done on the committed card's dataset need no build
                why = (f"dataset cannot be built here: {problem.cause} (fix: {problem.fix})" if problem
                       else "dataset not built yet (all builds it)")
                note = f"{note} {why}".strip()
        elif item.plan is None:
            note = f"ERROR {item.error}"
            bad.append(item)
        if show_cells:
            click.echo(f"{c.algo:<12} {c.task:<24} {c.tier:<13} {c.seed:>4}  {state:<8} {step:>11}  {note}")
    calib = calibration_for(machine) or {"machine": "(no calibration)", "costs": {}}
    rows = estimate_cells(items, obj["results_dir"], prof, calib)
    summary = ", ".join(f"{k} {v}" for k, v in counts.items())
    click.echo(f"plan ({prof.name}): {len(items)} cells: {summary}")
    if counts["todo"] == len(items):
        _hint(obj, "plan", prof.name)
    _print_coverage(done_seeds)
    if rows:
        if jobs is None:
            jobs = int(calib.get("default_jobs", 1))
        _print_estimate(rows, jobs, calib, format_seconds)
    _finish(damaged, strict and not bad)
    if bad:
        raise BenchError(f"{len(bad)} cell(s) do not resolve; first: {bad[0].cell.label()}: {bad[0].error}")


def coverage_table(c_algo: str, task: str) -> str:
    """Which of the paper's tables a cell belongs to: SMAC (SMAX/SC2 maps), the ablations (PAR
    variants, `plcql-*`), or the MPE + MaMuJoCo table."""
    if c_algo.startswith("plcql-"):
        return "ablation"
    return "smac" if task.startswith(("smax-", "smac-")) else "mpe+mamujoco"


def _print_coverage(done_seeds: dict) -> None:
    """Rows (algo x task x tier) with >= 3 finished seeds, with 1-2, and with none, per table and
    per algorithm: how much of the matrix the results cover."""
    groups: dict[tuple[str, str], list[int]] = {}
    for (algo, task, _tier), (n,) in done_seeds.items():
        for key in (("table", coverage_table(algo, task)), ("algo", algo)):
            counts = groups.setdefault(key, [0, 0, 0])
            counts[0 if n >= 3 else 1 if n else 2] += 1
    click.echo(f"  {'coverage (rows = algo x task x tier)':<38} {'>=3 seeds':>9} {'1-2 seeds':>9} {'not run':>8}")
    for axis in ("table", "algo"):
        for (a, name), (full, some, none) in groups.items():
            if a == axis:
                click.echo(f"  {axis + ' ' + name:<38} {full:>9} {some:>9} {none:>8}")


def _print_estimate(rows, jobs: int, calib: dict, fmt) -> None:
    """Per-task and per-algorithm totals, serial and with `jobs` parallel runs (longest first)."""

    known = [r for r in rows if r.seconds is not None]
    about = "; ".join(x for x in (calib.get("description"), calib.get("source"),
                                  calib.get("measured_at") and f"measured {calib['measured_at']}") if x)
    click.echo(f"estimate on {calib['machine']}" + (f" ({about})" if about else "") + ":")
    for axis in ("task", "algo"):
        groups: dict[str, list] = {}
        for r in known:
            groups.setdefault(getattr(r.cell, axis), []).append(r)
        click.echo(f"  {'per ' + axis:<26} {'cells':>5} {'serial':>10} {'updates':>10} {'evaluation':>10} "
                   f"{'with ' + str(jobs) + ' job(s)':>14}")
        for key, rs in groups.items():
            secs = [r.seconds for r in rs]
            click.echo(f"  {key:<26} {len(rs):>5} {fmt(sum(secs)):>10} {fmt(sum(r.rounds_s for r in rs)):>10} "
                       f"{fmt(sum(r.eval_s for r in rs)):>10} {fmt(makespan(secs, jobs)):>14}")
    total = [r.seconds for r in known]
    est = f"~{fmt(makespan(total, jobs))} with {jobs} job(s) ({fmt(sum(total))} serial)"
    proxies = sum(r.source == "proxy" for r in known)
    if proxies:
        est += f"; {proxies} cell(s) from stand-in measurements (the calibration's \"proxy\" entries)"
    recorded = sum(r.source == "recorded" for r in known)
    if recorded:
        weak = sum(r.weak for r in known)
        est += (f"; {recorded} cell(s) from recorded runtimes (no calibration for their algo x task"
                + (f"; {weak} only from other tasks' runs, which --finish-within does not start" if weak else "")
                + ")")
    missing = [r for r in rows if r.seconds is None]
    if missing:
        pairs = sorted({f"{r.cell.algo}/{r.cell.task}" for r in missing})
        est += (f"; {len(missing)} cell(s) not counted: no measured cost on {calib['machine']} and no recorded "
                f"runtime ({', '.join(pairs[:6])}{', ...' if len(pairs) > 6 else ''})")
    click.echo(f"estimate: {est}")


_STRICT = click.option("--strict", is_flag=True,
                       help="Exit with status 2 when any run file is damaged (healthy runs are still shown).")


def _finish(damaged, strict: bool) -> None:
    """One warning line per damaged file (on stderr); exit status 2 under --strict if any."""

    enforce_strict(damaged, strict, echo=lambda line: click.echo(f"warning: {line}", err=True))


@click.command()
@click.option("--profile", default=None, help="Only this profile's runs (default: every profile).")
@click.option("--state", "states", multiple=True,
              type=click.Choice(["done", "partial", "running", "failed", "todo"]), help="Only runs in this state.")
@_STRICT
@click.pass_obj
def status(obj, profile, states, strict) -> None:
    """Table of the runs under the results folder: state, step, runtime, failure reason. A damaged
    file (a final.json that is not the run's valid result, an unreadable status.json or config.json)
    is named in a warning line; its run is listed by what its other files say."""

    if obj["results_default"] and not Path(obj["results_dir"]).is_dir():
        _reading(obj)
        click.echo("0 runs: none")  # nothing trained yet here: not a typo in --results-dir
        _hint(obj, "status")
        return
    root = _results_root(obj)
    _reading(obj)
    rows, damaged = [], links_out(root)  # a run directory linked outside the results folder: named, skipped
    for run_dir in _run_dirs(root):
        rec = run_record(run_dir)
        ident = _run_identity(root, run_dir, rec)
        if profile and ident.get("profile") != profile:
            continue
        damaged += [Damaged(p.relative_to(root).as_posix(), why) for p, why in rec["damaged"]]
        if states and rec["state"] not in states:
            continue
        rows.append((ident, rec))
    click.echo(f"{'profile':<8} {'algo':<12} {'task':<24} {'tier':<13} {'seed':>4}  {'state':<8} "
               f"{'step':>11} {'runtime':>8}  reason")
    counts: dict[str, int] = {}
    for ident, rec in rows:
        counts[rec["state"]] = counts.get(rec["state"], 0) + 1
        step = f"{rec.get('update') or 0}/{rec.get('updates') or '?'}"
        runtime = format_seconds(rec["runtime_s"]) if isinstance(rec.get("runtime_s"), (int, float)) else "-"
        reason = rec.get("reason") or ""
        if len(reason) > 100:
            reason = reason[:97] + "..."
        click.echo(f"{ident.get('profile', ''):<8} {ident.get('algo', ''):<12} {ident.get('task', ''):<24} "
                   f"{ident.get('dataset', ''):<13} {ident.get('seed', ''):>4}  {rec['state']:<8} "
                   f"{step:>11} {runtime:>8}  {reason}")
    click.echo(f"{len(rows)} runs: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
    if not _run_dirs(root):
        _hint(obj, "status")
    _finish(damaged, strict)


def _run_dirs(root: Path) -> list[Path]:
    """Every folder under root holding a run's files (not through a link out of root: schema.links_out)."""

    return sorted({p.parent for name in ("config.json", "status.json", "final.json") for p in root.rglob(name)
                   if p.is_file() and not link_leaving(p, root)})


def _run_identity(root: Path, run_dir: Path, rec: dict) -> dict:
    """profile/algo/task/dataset/seed of a run folder: config.json when readable, else the
    layout <profile>/<algo>/<task>/<tier>/seed<k>-<key>/."""

    ident: dict = {}
    if not any(p.name == "config.json" for p, _ in rec["damaged"]):
        try:
            raw = read_json(run_dir / "config.json")
            ident = raw if isinstance(raw, dict) else {}
        except (OSError, ValueError):
            ident = {}
    parts = run_dir.relative_to(root).parts
    guess = dict(zip(("profile", "algo", "task", "dataset"), parts[-5:-1])) if len(parts) >= 5 else {}
    m = re.match(r"seed(\d+)-", parts[-1]) if parts else None
    if m:
        guess["seed"] = int(m.group(1))
    return {k: ident.get(k) if ident.get(k) not in (None, "") else guess.get(k, "")
            for k in ("profile", "algo", "task", "dataset", "seed")}


@click.command("export")
@click.option("--format", "fmt", type=click.Choice(["csv", "parquet", "marl-eval"]), default="csv",
              show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Output file (default: results.csv / results.parquet / marl_eval.json).")
@click.option("--profile", default=None, help="Only this profile's runs (default: every profile).")
@click.option("--only", multiple=True, metavar="KEY=V[,V..][,KEY=V..]",
              help="Only these runs: algo=, task=, tier=, seed= with comma lists, as for `all`.")
@click.option("--consistent", is_flag=True,
              help="marl-eval: cut the export to what marl-eval's matrices accept (per env the tasks with the "
                   "same evaluation steps, the algorithms all of them have, the seeds all of those have); "
                   "says what it dropped.")
@_STRICT
@click.pass_obj
def export_cmd(obj, fmt, out, profile, only, consistent, strict) -> None:
    """Tidy table of finished runs (one row per algo/task/tier/seed/step/metric; the tier's column is named
    `dataset`, as in final.json), or marl-eval JSON.
    A damaged run (final.json or metrics.jsonl) is left out with a warning line naming the file."""

    root = _results_root(obj)
    out = out or Path({"csv": "results.csv", "parquet": "results.parquet", "marl-eval": "marl_eval.json"}[fmt])
    damaged, notes = [], []
    n = export(root, out, fmt, profile, damaged, parse_only(only), consistent, notes)
    for line in notes:
        click.echo(f"note: {line}", err=True)
    click.echo(f"export {fmt}: {n} {'runs' if fmt == 'marl-eval' else 'rows'} from {root} -> {out}")
    _finish(damaged, strict)


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default="site", show_default=True)
@click.option("--front", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Render DIR's board as the front page (e.g. leaderboard/results, the committed results) and the "
                   "results folder's one click away, in OUT/your-runs/ (make all, make board).")
@click.option("--strict", is_flag=True, help="Exit with status 2 when any result file is skipped (the site is still written).")
@click.pass_obj
def leaderboard(obj, out, front, strict) -> None:
    """Render the static leaderboard from result files (--results-dir; --results is the same option); with
    --front DIR, DIR's board is the front page and the results folder's one click away."""

    own = Path(obj["results_dir"])
    try:
        if front is None:
            built = [build(own, out)]
        else:
            built = _boards(obj, front, own, out, explicit=not obj["results_default"])
    except FileNotFoundError as exc:
        raise BenchError(str(exc)) from None
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM: the site is swapped in whole or not at all
        click.echo(f"error: leaderboard stopped before the new site was complete; {out} is unchanged", err=True)
        sys.exit(130)
    except OSError as exc:  # a full disk, a read-only folder: named, and the old site kept
        raise BenchError(f"{exc.filename or out}: {exc.strerror or exc} ({type(exc).__name__}); the site "
                         f"in {out} is unchanged") from None
    folders = [front, own] if front is not None else [own]
    for b, folder in zip(built, folders):
        skipped = f", {len(b.skipped)} result file(s) skipped" if b.skipped else ""
        click.echo(f"leaderboard -> {b.index} ({b.n_runs} runs from {folder}{skipped})")
    _finish([s for b in built for s in b.skipped], strict)


def _boards(obj, front: Path, own: Path, out: Path, explicit: bool) -> list:
    """`leaderboard --front`: the front board and, when the results folder holds runs, its own. A
    results folder named on the command line must exist; the default one may not yet."""

    if not Path(front).is_dir():
        raise BenchError(f"results directory not found: {front} (--front)")
    if (explicit or not obj["results_default"]) and not Path(own).is_dir():
        raise BenchError(f"results directory not found: {own} (--results-dir or ${RESULTS_ENV})")
    committed = committed_results()
    if committed and committed.resolve() == Path(front).resolve():
        site = build_boards(front, own, out, front_name="Committed results", front_shown=f"{COMMITTED_RESULTS.as_posix()}/")
    else:
        site = build_boards(front, own, out, front_name=f"Results in {shown(front)}")
    if site.yours is None and Path(own).resolve() != Path(front).resolve():
        click.echo(f"no runs in {shown(own)} yet: {Path(out) / YOUR_RUNS} not written (make all trains the smoke matrix)")
    return [site.front] + ([site.yours] if site.yours else [])


leaderboard.params.insert(0, dir_option("--results-dir", "results_dir", "--results"))

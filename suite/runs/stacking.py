"""Several seeds of one cell trained in one process as stacked models (`all --stack S`; issue 19, item 2).

Stacking is an execution detail, like `--jobs` or the device: every seed keeps its own run, under the
run key and in the run directory its separate run has (config.json, status.json, metrics.jsonl, ckpt.pt,
run.log, final.json), and a stacked seed's numbers are its separate run's up to float summation order
(algorithms/common/stacked.py, tests/test_stacked.py). Here:

  * `stack_groups(cells, S)`: the cells of each (algo, task, tier) whose algorithm has a stacked round
    (`stackable`: the continuous CFCQL family), in groups of up to S seeds; every other cell alone;
  * `execute_stack(plans)`: `runner.execute` for a group. Finished seeds are skipped; a seed another
    process holds is reported busy and left to it; each seed resumes from its own checkpoint. The seeds at
    the same round train as one stack; seeds at different rounds (say one resumed at round 400 and two
    fresh ones) train as one stack per round reached, one after the other (not mixed: a stack advances
    all its seeds together).
  * Every seed is evaluated, checkpointed and logged as in its separate run, at the same rounds, with its
    own global torch/numpy random state around evaluation (swapped in and out), so its evaluation draws
    are its separate run's. A failure or Ctrl-C during the stack's training stops every seed of that stack
    (each status.json says failed or interrupted, with its own checkpoint round).
"""

from __future__ import annotations

import os
import time
import traceback
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from plcql_bench.algorithms.base import get_algorithm
from plcql_bench.algorithms.common.stacked import SeedStack, stackable
from plcql_bench.suite.runs import runner as R
from plcql_bench.suite.core import stop
from plcql_bench.suite.core.store import atomic_write_json, read_json
from plcql_bench.suite.envs.tasks import get_task


def can_stack(cell) -> bool:
    """Whether a cell's algorithm (for its task's action kind) trains in a seed stack."""
    spec = get_task(cell.task).spec
    return stackable(get_algorithm(cell.algo, discrete=spec.discrete))


def stack_groups(cells: list, size: int) -> list[list]:
    """Cells in groups to train together: the stackable cells of one (algo, task, tier) in groups of at most
    `size` seeds (in the order given), every other cell alone. Order: the first cell of each group in the
    order of `cells`."""
    if size <= 1:
        return [[c] for c in cells]
    groups: list[list] = []
    open_group: dict[tuple, list] = {}
    for c in cells:
        if not can_stack(c):
            groups.append([c])
            continue
        key = (c.algo, c.task, c.tier)
        g = open_group.get(key)
        if g is None or len(g) >= size:
            g = open_group[key] = []
            groups.append(g)
        g.append(c)
    return groups


@dataclass
class _Run:
    """One seed of a stack: its plan, log, algorithm, sampler and the state `runner` keeps for a run."""

    plan: Any
    log: Callable[[str], None]
    algo: Any = None
    sampler: Any = None
    probe: Any = None
    state: dict = field(default_factory=dict)
    progress: dict = field(default_factory=dict)
    pending: list = field(default_factory=list)
    rng: tuple = ()  # its global torch and numpy random states while another seed's code runs

    @contextmanager
    def global_rng(self):
        """This seed's global random state in place (evaluation, checkpoint), then put aside again."""
        torch.set_rng_state(self.rng[0])
        np.random.set_state(self.rng[1])
        try:
            yield
        finally:
            self.rng = (torch.get_rng_state(), np.random.get_state())


def execute_stack(plans: list, device: str = "cpu", logs: list | None = None, fresh: bool = False
                  ) -> list[dict]:
    """`runner.execute` for the seeds of one cell: returns one outcome per plan, {"state": trained |
    skipped | busy, "result"} (trained: the final.json written; skipped: already done). Raises on a failure
    (each seed's status.json then says why)."""
    logs = logs or [print] * len(plans)
    cells = {(p.cell.algo, p.cell.task, p.cell.tier, p.profile.name) for p in plans}
    if len(cells) != 1 or len({p.cell.seed for p in plans}) != len(plans):
        raise ValueError("execute_stack: the plans must be different seeds of one cell (algo, task, tier, profile)")
    outcomes: list[dict] = [{"state": "skipped", "result": None} for _ in plans]
    todo = []
    for i, plan in enumerate(plans):
        if plan.is_done() and not fresh:
            outcomes[i]["result"] = read_json(plan.final_path)
        else:
            todo.append(i)
    if not todo:
        return outcomes
    first = plans[todo[0]]
    R.configure_process(device, discrete=get_task(first.cell.task).spec.discrete)
    dataset = R.load_run_dataset(first)  # one dataset for the cell's seeds
    for plan in plans:
        plan.dataset_source = first.dataset_source
    with ExitStack() as held:
        runs: list[tuple[int, _Run]] = []
        for i in todo:
            plan = plans[i]
            plan.run_dir.mkdir(parents=True, exist_ok=True)
            try:
                held.enter_context(R._run_lock(plan))
            except R.RunBusy as exc:
                outcomes[i] = {"state": "busy", "result": None, "error": str(exc)}
                continue
            if fresh:
                for name in ("final.json", "ckpt.pt", "metrics.jsonl", "status.json"):
                    (plan.run_dir / name).unlink(missing_ok=True)
            elif plan.is_done():  # finished by another process meanwhile
                outcomes[i]["result"] = read_json(plan.final_path)
                continue
            try:
                runs.append((i, _start(plan, logs[i], dataset, device, [plans[j].cell.seed for j in todo])))
                R.open_tracking(plan, logs[i])
                held.callback(R.close_tracking, plan)  # closed however the stack ends (finish_tracking first)
            except BaseException as exc:  # as `runner.execute`: the run's status says why (the others stop too)
                _stopped([_Run(plan, logs[i], progress={"update": 0, "reached": 0, "runtime_s": 0.0})], exc)
                _stopped([run for _, run in runs], KeyboardInterrupt(f"{plan.cell.label()} of its stack did not start"))
                raise
        by_round: dict[int, list[tuple[int, _Run]]] = {}
        for i, run in runs:
            by_round.setdefault(run.state["update"], []).append((i, run))
        groups = [group for _, group in sorted(by_round.items())]
        for g, group in enumerate(groups):
            try:
                results = _train_stack([run for _, run in group], dataset, device)
            except BaseException:
                later = [run for grp in groups[g + 1:] for _, run in grp]
                _stopped(later, KeyboardInterrupt("an earlier stack of this cell stopped"))
                raise
            for (i, _), result in zip(group, results):
                outcomes[i] = {"state": "trained", "result": result}
    return outcomes


def _start(plan, log, dataset, device: str, seeds: list[int]) -> _Run:
    """What `runner.execute` and `_train_and_evaluate` do before the first round, for one seed."""
    R._remove_stale_temp_files(plan.run_dir)
    atomic_write_json(plan.run_dir / "config.json", R._identity_record(plan))
    log(f"start {plan.cell.label()} run {plan.run_key} pid {os.getpid()} device {device} "
        f"torch threads {torch.get_num_threads()} kernels plain (stacked with seeds {', '.join(map(str, seeds))})")
    R._set_aside_rejected_final(plan, log)
    cell = plan.cell
    task = get_task(cell.task)
    torch.manual_seed(cell.seed)
    np.random.seed(cell.seed)
    cls = get_algorithm(cell.algo, discrete=task.spec.discrete)
    run = _Run(plan, log)
    run.algo = cls(task.spec, plan.config, cell.seed, device)
    run.sampler = R.make_sampler(cls, dataset.arrays, task.spec.discrete, cell.seed, device)
    run.probe = R._probe_batch(run.sampler)
    run.state = R._resume(plan, run.algo, run.sampler, log, device) or R.fresh_state(device)
    run.pending = run.state.pop("pending", [])  # a stop's checkpoint: the rounds since the last evaluation
    run.rng = (torch.get_rng_state(), np.random.get_state())
    u = run.state["update"]
    run.progress = {"update": u, "reached": u, "runtime_s": run.state["train_s"]}
    if u > 0:
        log(f"resuming {cell.label()} from update {u}")
    R._write_status(plan, "running", update=u, runtime_s=run.state["train_s"])
    return run


def _stopped(runs: list[_Run], exc: BaseException) -> None:
    """Every run of a stack that stops on `exc`: failed (an exception) or interrupted (Ctrl-C, SystemExit),
    with its checkpoint round and the last round reached, as `runner.execute` records one run."""
    state = "failed" if isinstance(exc, Exception) else "interrupted"
    for r in runs:
        R._write_status(r.plan, state, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(),
                        **r.progress)
        r.log(f"{state}: {type(exc).__name__}: {exc} (at update {r.progress['reached']}; checkpoint at "
              f"{r.progress['update']})\n{traceback.format_exc()}")


def _train_stack(runs: list[_Run], dataset, device: str) -> list[dict]:
    """`runner._train_and_evaluate` for seeds at the same round, as one SeedStack; then each seed's final
    evaluation and final.json (`runner.execute`'s last steps)."""
    plan0 = runs[0].plan
    task = R.dataset_task(plan0.cell.task, dataset)
    profile = plan0.profile
    budget = profile.train_budget(plan0.cell.task, plan0.cell.tier)
    ckpt_every = profile.checkpoint_every_for(plan0.cell.task, plan0.cell.tier)
    rounds, start = budget["updates"], runs[0].state["update"]
    started = clock = time.time()
    for r in runs:
        r.log(f"stack of seeds {', '.join(str(x.plan.cell.seed) for x in runs)} from update {start}")
    try:
        stack = SeedStack([r.algo for r in runs])
        if start == 0:
            for r in runs:
                with r.global_rng():
                    R._record_eval(r.plan, task, r.algo, dataset, 0, r.pending, r.state, budget["eval_episodes"],
                                   r.probe)
        with stop.at_round_end():  # a SIGINT/SIGTERM stops after the round, every seed checkpointed there
            for done in range(start + 1, rounds + 1):
                for r, metrics in zip(runs, stack.update([r.sampler for r in runs])):
                    r.pending.append(metrics)
                    r.progress["reached"] = done
                evaluate = done % budget["eval_every"] == 0 or done == rounds
                stopping = stop.requested()
                checkpoint = (done % ckpt_every == 0 and done < rounds) or stopping
                if evaluate or checkpoint:
                    stack.sync()
                if evaluate:
                    for r in runs:
                        with r.global_rng():
                            R._record_eval(r.plan, task, r.algo, dataset, done, r.pending, r.state,
                                           budget["eval_episodes"], r.probe)
                        point = r.state["curve"][-1]
                        r.log(f"update {done}/{rounds}: return {point['return_mean']:.3f} score {point['score']}")
                if checkpoint:
                    elapsed, clock = time.time() - clock, time.time()
                    for r in runs:
                        r.state["train_s"] += elapsed
                        r.state["update"] = done
                        with r.global_rng():
                            R._checkpoint(r.plan, r.algo, r.sampler, r.state, r.pending)
                        r.progress.update(update=done, runtime_s=r.state["train_s"])
                        R._write_status(r.plan, "running", update=done, runtime_s=r.state["train_s"])
                if stopping:
                    raise stop.stopped(done)
        elapsed = time.time() - clock
        stack.sync()
        results = []
        for r in runs:
            r.state["train_s"] += elapsed
            with r.global_rng():
                final = R._timed_eval(r.state, task, r.algo, dataset, budget["final_eval_episodes"])
            result = R.with_run_warnings(R._result(r.plan, task, final, r.state, budget), r.algo,
                                         r.state["history"], r.plan.cell, r.log)
            results.append(R._validated(result, device, stacked=True))
    except BaseException as exc:
        _stopped(runs, exc)
        raise
    wall = time.time() - started
    for r, result in zip(runs, results):
        result["train"]["wall_clock_s"] += wall
        atomic_write_json(r.plan.final_path, result)  # last: its presence means done
        R._write_status(r.plan, "done", update=result["train"]["updates"], runtime_s=result["train"]["wall_clock_s"])
        R.finish_tracking(r.plan, result)
        r.log(f"done {r.plan.cell.label()}: score {result['score']} in {result['train']['wall_clock_s']:.1f}s")
    return results

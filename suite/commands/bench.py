"""`plcql-bench bench-speed`: update rounds per second for each algorithm on a task."""

from __future__ import annotations

import datetime
import functools
import os
import platform
import statistics
from pathlib import Path

import click
import numpy as np
import torch

from plcql_bench.algorithms.base import get_algorithm, implementations, load_all
from plcql_bench.algorithms.common import native
from plcql_bench.algorithms.common.kernels import fused_kernels
from plcql_bench.algorithms.common.speed import (
    batch_size_of,
    matmul_rate,
    paired_ratio,
    time_evaluation,
    time_interleaved,
    time_on_dataset_episodes,
    time_packings,
    time_rounds_within,
    time_stacked,
    time_targets_interleaved,
    time_update_rounds,
    time_variants,
)
from plcql_bench.algorithms.common.stacked import stackable
from plcql_bench.datasets.format import DatasetError, load_dataset
from plcql_bench.leaderboard.analysis import append_cost_measurement, check_cost_file
from plcql_bench.suite.runs.calibration import calibrations_dir, save_calibration
from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.core.validate import did_you_mean
from plcql_bench.suite.runs import reference_speed
from plcql_bench.suite.runs.profiles import load_profile
from plcql_bench.suite.runs.runner import configure_process
from plcql_bench.suite.envs.tasks import get_task, task_tiers


@click.command("build-kernels")
def build_kernels() -> None:
    """Build the native (C) kernels now, outside any training run (`all` also builds them before its first run);
    prints each kernel's library, or why the torch form will run instead."""
    for name, where in native.build_all().items():
        click.echo(f"{name}: {where}")


@click.command("bench-speed")
@click.option("--algo", "algos", multiple=True, help="Algorithm(s); default: all registered.")
@click.option("--task", "tasks", multiple=True, default=("mpe-cn",), show_default=True)
@click.option("--tier", default="medium", show_default=True, help="Tier whose reference config is used.")
@click.option("--rounds", default=20, show_default=True)
@click.option("--warmup", default=3, show_default=True, help="Untimed rounds before the timed ones.")
@click.option("--batch", type=int, default=None,
              help="Override the batch (transitions, or episodes for episode-batch algorithms).")
@click.option("--threads", default=1, show_default=True,
              help="torch.set_num_threads (runs train with 1 by default: `all --threads`)")
@click.option("--device", default="cpu", show_default=True)
@click.option("--clock", type=click.Choice(["wall", "cpu"]), default="wall", show_default=True,
              help="cpu = this process's CPU time (stable on a shared machine; use with --threads 1).")
@click.option("--calibrate", "machine", default=None, metavar="MACHINE",
              help="Measure round and evaluation costs of every algorithm x task of --profile's matrix "
                   "(or --algo/--task) and write the calibration `plan` reads: "
                   "suite/runs/calibrations/MACHINE.json, or --out.")
@click.option("--profile", default="paper", show_default=True, help="With --calibrate: whose matrix.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="With --calibrate: the file.")
@click.option("--description", default="", help="With --calibrate or --record-cost: what machine this is.")
@click.option("--seconds", default=20.0, show_default=True,
              help="With --calibrate: timed rounds per algorithm x task (3 to --rounds of them).")
@click.option("--floor/--no-floor", "floor", default=True, show_default=True,
              help="Count each round's matmul FLOPs (one extra round) and print the floor: FLOPs / the "
                   "measured rate of a 2048x2048 fp32 matmul at these threads and clock.")
@click.option("--compare-plain", is_flag=True,
              help="Time each algorithm with the fused kernels against the plain torch path "
                   "(PLCQL_KERNELS=plain; algorithms/common/kernels*.py) in alternation, with the paired ratio.")
@click.option("--compare-native", is_flag=True,
              help="Time each algorithm with the native C kernels against their torch form (PLCQL_NATIVE=0; "
                   "algorithms/common/native.py: the discrete CF-CQL term) in alternation, with the paired ratio.")
@click.option("--stack", "stack", type=click.IntRange(min=2), default=None, metavar="S",
              help="Also time S separate runs' rounds against one round of the S seeds as stacked models "
                   "(`all --stack`; the continuous CFCQL family), in alternation, with the paired ratio.")
@click.option("--episodes-from", type=click.Path(exists=True, dir_okay=False), default=None, metavar="FILE",
              help="Episode-batch (SMAX/SMAC) algorithms time on this dataset's episodes, with their real "
                   "lengths (default: synthetic episodes all of the task's episode limit, the worst case).")
@click.option("--packing", "packing", type=click.IntRange(min=2), default=None, metavar="S",
              help="On the CPU: advance S runs by a round packed three ways (S separate runs at 1 thread; one "
                   "stacked round of S seeds at 1 thread, `all --stack`; S runs at S threads), CPU time, in "
                   "alternation; prints each packing's finished runs per core-hour against separate runs.")
@click.option("--eval-share", is_flag=True,
              help="Measure the share of a run of --profile (tier --tier) spent in evaluation, per --algo x --task: "
                   "its rounds' cost and its evaluations' (every eval_every rounds and the final one, at the "
                   "profile's episode counts), each timed here.")
@click.option("--record-cost", "record_to", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Append the PLCQL/SPaCQL measurement (whole round and target construction, each paired) to the "
                   "board's compute-cost file, e.g. leaderboard/bench_speed.yaml, with machine, date and command.")
@click.option("--official-cfcql", type=click.Path(exists=True, file_okay=False), default=None, metavar="PATH",
              help="Time the official CFCQL round (your checkout of thu-rllab/CFCQL at PATH, never copied) against "
                   "ours on the same shapes, in alternation, with the ratio ours/official and its 95% interval "
                   "(--task mpe-cn, mamujoco-halfcheetah-2x3; suite/runs/reference_speed.py). Use --rounds 80.")
@click.option("--official-omar", type=click.Path(exists=True, file_okay=False), default=None, metavar="PATH",
              help="As --official-cfcql, for the official OMAR round (ling-pan/OMAR at 0e52ad6; --task mpe-cn).")
def bench_speed(algos, tasks, tier, rounds, warmup, batch, threads, device, clock, machine, profile, out,
                description, seconds, floor, compare_plain, compare_native, stack, episodes_from, packing,
                eval_share, record_to, official_cfcql, official_omar) -> None:
    """Median milliseconds per update round on a synthetic 100k-transition buffer, and (for the
    CFCQL family) the median time of building one update's target alone, and how far each round is
    from its floor (matmul FLOPs / the machine's matmul rate). Prints the load average: on a shared
    machine compare numbers taken in the same minute only. With --calibrate, writes the per-machine
    costs that `plan` estimates from."""

    configure_process(device)  # the runner's process settings (allocator, kernels): rounds time as in runs
    time_on_dataset_episodes(None)  # synthetic episodes unless --episodes-from says otherwise (below)
    if official_cfcql or official_omar:
        compare_official({"cfcql": official_cfcql, "omar": official_omar}, tasks, rounds, warmup, threads, clock,
                         device)
        return
    if eval_share:
        torch.set_num_threads(threads)
        check_algo_names(algos)
        evaluation_share(list(algos) or ["bc", "cfcql", "plcql"], tasks, tier, profile, rounds, device, clock,
                         seconds)
        return
    if machine:
        torch.set_num_threads(threads)
        given = click.get_current_context().get_parameter_source("tasks") != click.core.ParameterSource.DEFAULT
        calibrate(machine, algos, tasks if given else (), tier, profile, rounds, threads, device, clock, out,
                  description, seconds)
        return

    torch.set_num_threads(threads)
    names = list(algos) or sorted(load_all())
    check_algo_names(names)
    if record_to:  # before minutes of timing: what it records and where
        if not {"plcql", "spacql"} <= set(names):
            raise BenchError(f"--record-cost {record_to}: records PLCQL against SPaCQL; give --algo plcql --algo "
                             "spacql (or no --algo)")
        try:
            check_cost_file(record_to)
        except ValueError as exc:
            raise BenchError(f"--record-cost {exc}") from None
    results = {}

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    click.echo(f"# torch threads {threads}, device {device}, clock {clock}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    episodes_note = use_dataset_episodes(episodes_from, tasks)
    if episodes_note:
        click.echo(episodes_note)
    elif any(get_task(t).spec.discrete for t in tasks):
        click.echo("# episode batches: synthetic episodes, every one as long as the task's episode limit (the "
                   "worst case; --episodes-from FILE times a dataset's own episode lengths)")
    rate = None
    if floor:
        rate = matmul_rate(device, clock)
        click.echo(f"# matmul 2048x2048 fp32: {rate:.0f} GFLOP/s here; floor ms = the round's matmul GFLOP "
                   f"(forward, backward, recomputation) / this rate; x floor = ms/round / floor ms")
    click.echo(f"{'algo':<12} {'task':<14} {'batch':>6} {'ms/round':>9} {'rounds/s':>9} {'target ms':>9}"
               + (f" {'GFLOP':>8} {'floor ms':>9} {'x floor':>7}" if floor else ""))
    for task_id in tasks:
        spec = get_task(task_id).spec
        configure_process(device, discrete=spec.discrete)  # as a run of this task: kernels, allocator
        kind = "discrete" if spec.discrete else "continuous"
        for name in names:
            if kind not in implementations(name):
                if algos:  # asked for by name: say why it is skipped
                    click.echo(f"# {name}: no {kind}-action implementation, skipped on {task_id}")
                continue
            cls = get_algorithm(name, discrete=spec.discrete)
            overrides = cls.task_overrides(spec, tier)
            t = time_update_rounds(name, spec, overrides, rounds=rounds, batch_size=batch, warmup=warmup,
                                   device=device, clock=clock, flops=floor)
            bsz = batch if batch is not None else batch_size_of(cls, overrides)
            tgt = f"{t['target_median_ms']:>9.2f}" if "target_median_ms" in t else f"{'-':>9}"
            fl = ""
            if floor:
                floor_ms = t["flops"] / 1e9 / rate * 1e3
                fl = f" {t['flops'] / 1e9:>8.2f} {floor_ms:>9.1f} {t['median_ms'] / max(floor_ms, 1e-9):>7.2f}"
            click.echo(f"{name:<12} {task_id:<14} {bsz:>6} {t['median_ms']:>9.1f} "
                       f"{1000 / t['median_ms']:>9.2f} {tgt}{fl}")
            results[(name, task_id)] = t
            if compare_plain:
                compare_fused_plain(name, spec, task_id, overrides, rounds, warmup, batch, device, clock)
            if compare_native:
                compare_native_torch(name, spec, task_id, overrides, rounds, warmup, batch, device, clock)
            if stack:
                compare_stacked(name, cls, spec, task_id, overrides, stack, rounds, warmup, batch, device, clock)
            if packing:
                compare_packings(name, spec, task_id, overrides, packing, rounds, warmup, batch, device)
        if ("plcql", task_id) in results and ("spacql", task_id) in results:
            measured = compare_plcql_spacql(spec, task_id, tier, rounds, warmup, batch, device, clock)
            if record_to:
                command = (f"plcql-bench bench-speed --algo plcql --algo spacql --task {task_id} --tier {tier} "
                           f"--rounds {rounds} --warmup {warmup} --threads {threads} --clock {clock} --device {device}"
                           + (f" --batch {batch}" if batch is not None else ""))
                record_cost(record_to, measured, command, threads, clock, description)


def evaluation_share(algos, tasks, tier, profile, max_rounds, device, clock, seconds) -> None:
    """--eval-share: per algorithm x task, a run's evaluation time against its training time under the
    profile's budget, both measured here: rounds (`time_rounds_within`) and evaluations of the untrained policy
    at the profile's two episode counts (`time_evaluation`: during training and final). MPE and Half-Cheetah
    episodes have a fixed length, so the untrained policy's evaluation costs what a trained one's does;
    SMAX episodes end when a side is eliminated, so there the share is an estimate."""
    prof = load_profile(profile)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    click.echo(f"# evaluation share of a {prof.name} run: torch threads {torch.get_num_threads()}, device {device}, clock "
               f"{clock}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; untrained policies")
    click.echo(f"{'algo':<10} {'task':<26} {'tier':<8} {'rounds':>7} {'ms/round':>9} {'eval points':>15} "
               f"{'s/point':>8} {'final':>12} {'train h':>8} {'eval h':>7} {'eval %':>7}")
    for task_id in tasks:
        task = get_task(task_id)
        spec = task.spec
        configure_process(device, discrete=spec.discrete)
        t = tier if tier in task_tiers(task_id) else task_tiers(task_id)[0]
        b = prof.train_budget(task_id, t)
        points = len(range(0, b["updates"] + 1, b["eval_every"])) + (1 if b["updates"] % b["eval_every"] else 0)
        total = {"train": 0.0, "eval": 0.0, "runs": 0}
        for name in algos:
            if ("discrete" if spec.discrete else "continuous") not in implementations(name):
                continue
            ov = get_algorithm(name, discrete=spec.discrete).task_overrides(spec, t)
            r = time_rounds_within(name, spec, ov, max_rounds=max_rounds, seconds=seconds, device=device, clock=clock)
            a, per_episode = time_evaluation(name, task, ov, episodes=(b["eval_episodes"], b["final_eval_episodes"]),
                                             device=device, clock=clock)
            point_s, final_s = a + per_episode * b["eval_episodes"], a + per_episode * b["final_eval_episodes"]
            train_s = b["updates"] * r["median_ms"] / 1e3
            eval_s = points * point_s + final_s
            click.echo(f"{name:<10} {task_id:<26} {t:<8} {b['updates']:>7} {r['median_ms']:>9.1f} "
                       f"{points:>6} x {b['eval_episodes']:>3} ep {point_s:>8.4f} {b['final_eval_episodes']:>4} ep "
                       f"{final_s:>7.4f}s {train_s / 3600:>8.3f} {eval_s / 3600:>7.3f} "
                       f"{100 * eval_s / (train_s + eval_s):>6.1f}%")
            total.update(train=total["train"] + train_s, eval=total["eval"] + eval_s, runs=total["runs"] + 1)
        if total["runs"] > 1:
            click.echo(f"# {task_id}: one run of each of the {total['runs']} algorithms above together: evaluation "
                       f"{total['eval']:.3f} s of {total['train'] + total['eval']:.3f} s = "
                       f"{100 * total['eval'] / (total['train'] + total['eval']):.2f} %")


def compare_official(checkouts: dict, tasks, rounds, warmup, threads, clock, device) -> None:
    """--official-cfcql / --official-omar: each official round against ours (suite/runs/reference_speed.py), task by
    task; a checkout that is not the reference code, or a task it is not timed on, is a BenchError."""
    if device != "cpu":
        raise BenchError(f"--device {device}: the official rounds are timed on the CPU only (their CUDA shims)")
    given = {code: path for code, path in checkouts.items() if path}
    for code, path in given.items():  # every option's tasks and checkout, before minutes of timing
        try:
            reference_speed.check(code, Path(path), tasks)
        except reference_speed.CheckoutError as exc:
            raise BenchError(f"--official-{code}: {exc}") from None
    for code, path in given.items():
        try:
            for line in reference_speed.run(code, Path(path), tasks, rounds, warmup, threads, clock):
                click.echo(line)
        except reference_speed.CheckoutError as exc:
            raise BenchError(f"--official-{code}: {exc}") from None


def use_dataset_episodes(path: str | None, tasks) -> str:
    """`--episodes-from`: load the dataset (checked against the task: one task only) and make the timing
    helpers sample its episodes; returns the header line saying so ('' without a file)."""

    if path is None:
        return ""

    if len(tasks) != 1:
        raise BenchError(f"--episodes-from {path}: give exactly one --task (the dataset's)")
    spec = get_task(tasks[0]).spec
    try:
        ds = load_dataset(path, spec)
    except DatasetError as exc:
        raise BenchError(str(exc)) from None
    if not spec.discrete:
        raise BenchError(f"--episodes-from {path}: {tasks[0]} is not an episode-batch (discrete) task")
    lens = ds.arrays["episode_ids"]

    counts = np.bincount(lens)
    time_on_dataset_episodes(ds.arrays)
    return (f"# episodes from {path}: {len(counts)} episodes, length mean {counts.mean():.1f}, max {counts.max()} "
            f"(synthetic episodes would all be {spec.episode_limit})")


def compare_fused_plain(name, spec, task_id, overrides, rounds, warmup, batch, device, clock) -> None:
    """One algorithm built with the fused kernels against one built with the plain torch path (both in
    this process, same process settings), timed in alternation: the median per-round ratio fused/plain."""

    _compare_switch(name, task_id, spec, overrides, fused_kernels, ("fused", "plain"), ("fused", "plain"),
                    rounds, warmup, batch, device, clock)


def compare_native_torch(name, spec, task_id, overrides, rounds, warmup, batch, device, clock) -> None:
    """The algorithm with the native C kernels allowed against the same algorithm with their torch form
    (two instances in this process), timed in alternation: the median per-round ratio native/torch. Says so
    when the kernels cannot be built here (the two would be the same)."""

    if not native.enabled() or native.library("cf_negative") is None:
        click.echo(f"# {name} {task_id}: native kernels off or not buildable here (PLCQL_NATIVE, cc), "
                   "--compare-native skipped")
        return
    _compare_switch(name, task_id, spec, overrides, native.native_kernels, ("native", "torch"),
                    ("native", "torch form"), rounds, warmup, batch, device, clock)


def _compare_switch(name, task_id, spec, overrides, switch, labels, shown, rounds, warmup, batch, device,
                    clock) -> None:
    """The algorithm built and run inside switch(True) (labels[0]) and inside switch(False) (labels[1]), timed
    in alternation (A B, B A, ...): both medians and the median per-round ratio with its 95% bootstrap interval."""

    on, off = labels
    variants = {on: (name, overrides, functools.partial(switch, True)),
                off: (name, overrides, functools.partial(switch, False))}
    inter = time_variants(variants, spec,
                          rounds=rounds, warmup=min(warmup, 2), device=device, clock=clock, batch_size=batch)
    ratio, lo, hi = paired_ratio(inter[on], inter[off])
    med = {k: statistics.median(v) for k, v in inter.items()}
    click.echo(f"# {name} {task_id}, {rounds} interleaved rounds: {shown[0]} {med[on]:.1f} ms, {shown[1]} "
               f"{med[off]:.1f} ms, median per-round ratio {on}/{off} {ratio:.3f} (95% CI {lo:.3f}-{hi:.3f})")


def compare_stacked(name, cls, spec, task_id, overrides, n_seeds, rounds, warmup, batch, device, clock) -> None:
    """S separate runs' rounds against one stacked round of S seeds (`time_stacked`): medians, and the median
    per-pair ratio separate/stacked (the gain in runs per hour) with its 95% bootstrap interval."""

    if not stackable(cls):
        click.echo(f"# {name} {task_id}: no stacked round (the continuous CFCQL family only), --stack skipped")
        return
    t = time_stacked(name, spec, overrides, n_seeds, rounds=rounds, warmup=min(warmup, 2), device=device,
                     clock=clock, batch_size=batch, count_ops=True)
    ops = t.pop("ops")
    ratio, lo, hi = paired_ratio(t["separate"], t["stacked"])
    med = {k: statistics.median(v) for k, v in t.items()}
    click.echo(f"# {name} {task_id}, {rounds} interleaved pairs: {n_seeds} separate rounds {med['separate']:.1f} ms, "
               f"one stacked round of {n_seeds} seeds {med['stacked']:.1f} ms; runs per hour stacked/separate "
               f"{ratio:.2f} (95% CI {lo:.2f}-{hi:.2f})")
    click.echo(f"# {name} {task_id}: operators dispatched (non-view; ~ kernel launches on a GPU): {n_seeds} separate "
               f"rounds {ops['separate']}, one stacked round {ops['stacked']} (ratio {ops['separate'] / ops['stacked']:.2f})")


def compare_packings(name, spec, task_id, overrides, n_runs, rounds, warmup, batch, device) -> None:
    """--packing S: S runs advanced by one round, packed as S separate 1-thread runs, one 1-thread stack of S
    seeds, or S runs at S threads (`time_packings`), CPU time; each packing's runs per core-hour against
    separate runs (the median paired ratio separate/packing with its 95% interval; above 1: more runs)."""
    if device != "cpu":
        raise BenchError(f"--packing on --device {device}: it measures CPU core-hours (--stack times GPU stacks)")
    t = time_packings(name, spec, overrides, n_runs, rounds=rounds, warmup=min(warmup, 1), device=device,
                      batch_size=batch)
    med = {k: statistics.median(v) for k, v in t.items()}
    parts = [f"{n_runs} separate runs at 1 thread {med['separate']:.0f} ms"]
    for label, shown in (("stacked", f"one stack of {n_runs} seeds at 1 thread"),
                         ("threads", f"{n_runs} runs at {n_runs} threads")):
        if label not in t:
            parts.append(f"no stack ({name} on {task_id} is not stackable)")
            continue
        r, lo, hi = paired_ratio(t["separate"], t[label])
        parts.append(f"{shown} {med[label]:.0f} ms: runs per core-hour x{r:.2f} (95% CI {lo:.2f}-{hi:.2f})")
    click.echo(f"# {name} {task_id}, CPU ms to advance {n_runs} runs one round, {rounds} interleaved: " + "; ".join(parts))


def check_algo_names(names) -> None:
    """BenchError (exit 2) for a name no algorithm is registered under."""

    known = load_all()
    for name in names:
        if name not in known:
            raise BenchError(f"--algo {name}: unknown algorithm{did_you_mean(name, known)} (known: {', '.join(sorted(known))})")


def compare_plcql_spacql(spec, task_id, tier, rounds, warmup, batch, device, clock) -> dict:
    """PLCQL's round against SPaCQL's, timed in alternation: the median per-round ratio with its 95%
    bootstrap interval (an interval below 1 means PLCQL's round is measurably cheaper); then their target
    construction alone (the part that PLCQL cuts from n joint actions to 1), on the same batches, in
    alternation, with its own ratio and interval. Returns the measurement (`--record-cost`)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")  # as the measurement starts
    pair = ["plcql", "spacql"]
    overrides = {a: get_algorithm(a, discrete=spec.discrete).task_overrides(spec, tier) for a in pair}
    inter = time_interleaved(pair, spec, overrides, rounds=rounds, warmup=min(warmup, 2), device=device,
                             clock=clock, batch_size=batch)
    ratio, lo, hi = paired_ratio(inter["plcql"], inter["spacql"])
    kind, unit = ("discrete", "episodes") if spec.discrete else ("continuous", "transitions")
    pl = get_algorithm("plcql", discrete=spec.discrete)
    bsz = batch if batch is not None else batch_size_of(pl, overrides["plcql"])
    med = {a: statistics.median(v) for a, v in inter.items()}
    click.echo(f"# {task_id} (n={spec.n_agents}, {kind}, batch {bsz} {unit}), {rounds} interleaved rounds: "
               f"PLCQL {med['plcql']:.1f} ms, SPaCQL {med['spacql']:.1f} ms, "
               f"median per-round ratio PLCQL/SPaCQL {ratio:.3f} (95% CI {lo:.3f}-{hi:.3f})")
    tgt = time_targets_interleaved(pair, spec, overrides, rounds=max(rounds, 10), warmup=min(warmup, 2),
                                   device=device, clock=clock, batch_size=batch)
    t_ratio, t_lo, t_hi = paired_ratio(tgt["plcql"], tgt["spacql"])
    t_med = {a: statistics.median(v) for a, v in tgt.items()}
    click.echo(f"# {task_id}: target construction PLCQL/SPaCQL alone, {len(tgt['plcql'])} interleaved batches: "
               f"PLCQL {t_med['plcql']:.2f} ms, SPaCQL {t_med['spacql']:.2f} ms, median per-batch ratio "
               f"{t_ratio:.3f} (95% CI {t_lo:.3f}-{t_hi:.3f}); of the round: PLCQL "
               f"{share(t_med['plcql'], med['plcql'], overrides['plcql'], pl)}, SPaCQL "
               f"{share(t_med['spacql'], med['spacql'], overrides['spacql'], get_algorithm('spacql', discrete=spec.discrete))}")
    return {"task": task_id, "n_agents": spec.n_agents, "load_average": round(load, 2), "device": device,
            "rounds": rounds, "batch": bsz,
            "batch_unit": unit, "plcql_ms": round(med["plcql"], 1), "spacql_ms": round(med["spacql"], 1),
            "ratio": round(ratio, 3), "ratio_ci": [round(lo, 3), round(hi, 3)],
            "target_ms": {a: round(v, 2) for a, v in t_med.items()}, "target_batches": len(tgt["plcql"]),
            "target_ratio": round(t_ratio, 3), "target_ratio_ci": [round(t_lo, 3), round(t_hi, 3)]}


def share(target_ms: float, round_ms: float, overrides: dict, cls) -> str:
    """The share of a round its target construction takes: one target per critic update (`ca_ratio` a
    round in the continuous family, one in the discrete)."""
    per_round = int(overrides.get("ca_ratio", getattr(cls.Config(), "ca_ratio", 1)))
    return f"{per_round} x {target_ms:.2f} ms = {100 * per_round * target_ms / round_ms:.0f} %"


def record_cost(path: str, measurement: dict, command: str, threads: int, clock: str, description: str) -> None:
    """`--record-cost FILE`: the measurement, with this machine, the date, the command that repeats it and the
    load, appended to the board's compute-cost file (leaderboard/bench_speed.yaml) so that no number in it is
    typed by hand."""
    machine = description or f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    rec = {"task": measurement["task"], "n_agents": measurement["n_agents"],
           "machine": f"{machine}, {threads} torch thread(s), {clock} clock, load average "
                      f"{measurement['load_average']:.2f}",
           "date": datetime.date.today().isoformat(),
           "command": command,
           "threads": threads, "clock": clock,
           **{k: v for k, v in measurement.items() if k not in ("task", "n_agents")}}
    try:  # the file was checked before the timing; it may have changed since
        append_cost_measurement(path, rec)
    except ValueError as exc:
        raise BenchError(f"--record-cost {exc}; not recorded") from None
    click.echo(f"# recorded in {path}: {rec['task']} (n={rec['n_agents']})")


def calibrate(machine, algos, tasks, tier, profile, max_rounds, threads, device, clock, out, description,
              seconds) -> None:
    """bench-speed --calibrate: round and evaluation costs per algorithm x task, written (merged)
    into a calibration file (suite/runs/calibration.py)."""

    prof = load_profile(profile)
    check_algo_names(algos)
    algos = list(algos) or [str(a) for a in prof.matrix["algos"]]
    tasks = list(tasks) or [str(t) for t in prof.matrix["tasks"]]
    path = out or str(calibrations_dir() / f"{machine}.json")
    existed = Path(path).exists()
    load = os.getloadavg()
    click.echo(f"# calibrating {machine}: torch threads {threads}, device {device}, clock {clock}, "
               f"load average {load[0]:.2f} -> {path}")
    click.echo(f"{'algo':<12} {'task':<26} {'rounds':>6} {'ms/round':>9} {'eval s (a + b*E)':>18}")
    costs: dict = {}
    for task_id in tasks:
        task = get_task(task_id)
        spec = task.spec
        configure_process(device, discrete=spec.discrete)
        t = tier if tier in task_tiers(task_id) else task_tiers(task_id)[0]
        for name in algos:
            if ("discrete" if spec.discrete else "continuous") not in implementations(name):
                continue
            ov = get_algorithm(name, discrete=spec.discrete).task_overrides(spec, t)
            r = time_rounds_within(name, spec, ov, max_rounds=max_rounds, seconds=seconds, device=device,
                                   clock=clock)
            ev = time_evaluation(name, task, ov, device=device, clock=clock)
            costs.setdefault(name, {})[task_id] = {"round_ms": round(r["median_ms"], 3), "rounds": r["rounds"],
                                                   "eval_s": [round(ev[0], 4), round(ev[1], 5)]}
            click.echo(f"{name:<12} {task_id:<26} {r['rounds']:>6} {r['median_ms']:>9.1f} "
                       f"{ev[0]:>8.3f} + {ev[1]:.4f}*E")
            save_calibration({"machine": machine, "costs": {name: {task_id: costs[name][task_id]}}}, path)
    # a re-measurement of some cells merges into an existing file: keep its description unless a new one is given
    about = {} if existed and not description else {
        "description": description or f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"}
    save_calibration({
        "machine": machine, **about,
        "device": device, "torch_threads": threads, "clock": clock,
        # plan's default --jobs: one run per `threads` cores on a CPU; one run per GPU
        "default_jobs": max(1, (os.cpu_count() or 1) // threads) if device == "cpu" else 1,
        "source": f"plcql-bench bench-speed --calibrate {machine} --clock {clock} --threads {threads} "
                  f"(tier {tier}, synthetic 100k buffer, untrained policies for evaluation)",
        "measured_at": datetime.date.today().isoformat(), "load_average_at_start": round(load[0], 2),
        "costs": costs}, path)

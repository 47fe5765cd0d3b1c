"""`plcql-bench campaign`: run a campaign file's stages as one priority queue, show their state, adopt and publish
runs (the campaign itself: suite/runs/campaign.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from plcql_bench.suite.commands.clitypes import DURATION
from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.runs import campaign as campaigns
from plcql_bench.suite.runs.calibration import calibration_for, makespan
from plcql_bench.suite.runs.matrix import cell_state, estimate_cells, format_seconds, resolve


@click.group("campaign")
def campaign() -> None:
    """Run a prioritised list of matrix selections (a campaign file) and publish finished runs."""


@campaign.command("run")
@click.argument("file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Runs at once, passed to `all` (default: all's default).")
@click.option("--stage", "only_stages", multiple=True, help="Only these stages (by name), in file order.")
@click.option("--publish-to", type=click.Path(path_type=Path), default=Path("leaderboard/results"),
              show_default=True, help="Where finished runs are copied, as they finish and at the end.")
@click.option("--publish-every", type=click.FloatRange(min=1), default=120, show_default=True,
              help="Seconds between two looks for newly finished runs to publish.")
@click.option("--no-publish", is_flag=True, help="Do not copy finished runs anywhere.")
@click.option("--finish-within", type=DURATION, default=None, metavar="DURATION",
              help="Passed to `all`: start only the cells expected to finish within this time (e.g. 2h30m), "
                   "the first that fits in queue order; the rest wait for the next campaign.")
@click.pass_obj
def run_campaign(obj, file, jobs, only_stages, publish_to, publish_every, no_publish, finish_within) -> None:
    """Run the stages as one priority queue (resumable); publish finished runs as they land."""
    camp = campaigns.load_campaign(file)
    known = {s.name for s in camp.stages}
    unknown = sorted(set(only_stages) - known)
    if unknown:
        raise BenchError(f"{file}: no stage named {', '.join(unknown)} (stages: {', '.join(s.name for s in camp.stages)})")
    stages = [s for s in camp.stages if not only_stages or s.name in only_stages]
    prof = None
    for s in stages:  # validate every selection before running anything
        prof, _ = campaigns.stage_cells(camp, s)
    click.echo(f"== campaign {file}: {len(stages)} stage(s) as one queue: {', '.join(s.name for s in stages)}",
               err=True)
    if not no_publish and Path(publish_to).exists():  # a fresh clone: the committed runs are done, not to do
        n = campaigns.adopt_published(publish_to, obj["results_dir"], prof.name)
        if n:
            click.echo(f"== {n} published run(s) from {publish_to} count as done", err=True)

    def publish_new() -> None:
        n = campaigns.publish(obj["results_dir"], prof.name, publish_to)  # results live under the profile's name
        if n:
            click.echo(f"== published {n} new run(s) to {publish_to}", err=True)

    rc = campaigns.run_queue(campaigns.all_command(obj["data_dir"], obj["results_dir"], camp.profile, [s.only for s in stages], jobs,
                                 finish_within),
                    publish_every, None if no_publish else publish_new)
    if not no_publish:  # the ticker has stopped: one last look
        n = campaigns.publish(obj["results_dir"], prof.name, publish_to)
        click.echo(f"== published {n} new run(s) to {publish_to}", err=True)
    click.echo(f"campaign {file}: {len(stages)} stage(s)" + (f", exit {rc} (failed cells: see above)" if rc else ""))
    if rc:
        sys.exit(1)


@campaign.command("status")
@click.argument("file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Parallel runs for the estimate (default: the calibrated machine's).")
@click.option("--machine", default=None, metavar="NAME|FILE",
              help="Calibration to estimate from, as `plan --machine` (default: plan's).")
@click.pass_obj
def campaign_status(obj, file, jobs, machine) -> None:
    """Per stage: how many of its cells are done, partial, running, failed or still to do, and the
    time its cells still need (serial, as `plan` estimates it); then the whole queue's wall clock with
    --jobs runs taking the cells in queue order."""

    camp = campaigns.load_campaign(file)
    calib = calibration_for(machine)
    total: dict[str, int] = {}
    stages = []  # (stage, its cells, their states)
    first: dict = {}  # cell -> its resolved item, at the first stage that selects it (the queue's order)
    prof = None
    for s in camp.stages:
        prof, cells = campaigns.stage_cells(camp, s)
        items = resolve(cells, prof, obj["data_dir"], obj["results_dir"])
        stages.append((s, cells, [cell_state(item.plan) for item in items]))
        for item in items:
            first.setdefault(item.cell, item)
    # priced once for the whole queue (recorded runtimes are read once, not per stage)
    queue = {e.cell: e for e in estimate_cells(list(first.values()), obj["results_dir"], prof, calib)} if prof else {}
    click.echo(f"campaign {file}: runs in {obj['results_dir']}, datasets in {obj['data_dir']}")
    click.echo(f"{'stage':<32} {'cells':>5}  {'done':>5} {'partial':>7} {'running':>7} {'failed':>6} {'todo':>5} "
               f"{'left':>8}")
    for s, cells, states in stages:
        counts = {k: states.count(k) for k in ("done", "partial", "running", "failed", "todo")}
        for k, v in counts.items():
            total[k] = total.get(k, 0) + v
        left = [queue[c] for c in cells if c in queue]
        known = [e.seconds for e in left if e.seconds is not None]
        shown = "?" if left and not known else format_seconds(sum(known)) + ("+?" if len(known) < len(left) else "")
        shown += "*" if any(e.weak for e in left) else ""
        click.echo(f"{s.name:<32} {len(cells):>5}  {counts['done']:>5} {counts['partial']:>7} "
                   f"{counts['running']:>7} {counts['failed']:>6} {counts['todo']:>5} {shown:>8}")
    click.echo(f"{'total':<32} {sum(total.values()):>5}  " + " ".join(
        f"{total.get(k, 0):>{w}}" for k, w in (("done", 5), ("partial", 7), ("running", 7), ("failed", 6), ("todo", 5))))
    secs = [e.seconds for e in queue.values() if e.seconds is not None]
    if jobs is None:
        jobs = int((calib or {}).get("default_jobs", 1))
    machine_name = calib["machine"] if calib else "(no calibration: recorded runtimes only)"
    unknown = len(queue) - len(secs)
    click.echo(f"left: ~{format_seconds(makespan(secs, jobs, in_order=True))} with {jobs} job(s) in queue order "
               f"({format_seconds(sum(secs))} serial, {len(queue)} cell(s); estimated on {machine_name}"
               + (f"; {unknown} cell(s) without an estimate" if unknown else "") + ")")
    _say_weak([e for e in queue.values() if e.weak], calib)


def _say_weak(weak: list, calib: dict | None) -> None:
    """The stages marked * hold cells priced only from other tasks' or algorithms' runs (Estimate.weak): one
    algorithm's per-update cost on MPE says little about it on SMAX (AWAC on the SMAX maps was priced at a minute a
    cell, measured at about an hour), so name the pairs and the command that measures them."""
    if not weak:
        return
    pairs = sorted({(e.cell.algo, e.cell.task) for e in weak})
    shown = ", ".join(f"{a}/{t}" for a, t in pairs[:6]) + (", ..." if len(pairs) > 6 else "")
    machine = calib["machine"] if calib else "MACHINE"
    algos = " ".join(f"--algo {a}" for a in sorted({a for a, _ in pairs}))
    tasks = " ".join(f"--task {t}" for t in sorted({t for _, t in pairs}))
    click.echo(f"* {len(weak)} cell(s) priced only from other tasks' or algorithms' runs ({shown}): a guess, "
               f"not a measurement; `plcql-bench bench-speed --calibrate {machine} {algos} {tasks}` measures them")


@campaign.command("adopt")
@click.option("--profile", default="paper", show_default=True)
@click.option("--from", "source", type=click.Path(path_type=Path, exists=True, file_okay=False),
              default=Path("leaderboard/results"), show_default=True)
@click.pass_obj
def adopt_cmd(obj, profile, source) -> None:
    """Copy the published runs into the results folder, so `all` skips their cells (a fresh clone)."""
    n = campaigns.adopt_published(source, obj["results_dir"], profile)
    click.echo(f"adopted {n} published run(s) of profile {profile} from {source} into {obj['results_dir']}")


@campaign.command("publish")
@click.option("--profile", default="paper", show_default=True)
@click.option("--to", "dest", type=click.Path(path_type=Path), default=Path("leaderboard/results"), show_default=True)
@click.pass_obj
def publish_cmd(obj, profile, dest) -> None:
    """Copy finished runs' small files (final, config, metrics) into the committed results folder."""
    n = campaigns.publish(obj["results_dir"], profile, dest)
    click.echo(f"published {n} new run(s) of profile {profile} to {dest}")

"""The `plcql-bench` command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from plcql_bench.suite.errors import BenchError

DATA_ENV, RESULTS_ENV = "PLCQL_DATA_DIR", "PLCQL_RESULTS_DIR"


def _user_errors() -> tuple[type[BaseException], ...]:
    from plcql_bench.datasets.format import DatasetError

    return (BenchError, DatasetError)


def main() -> None:
    """Entry point: user errors become one line on stderr and exit status 2."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except _user_errors() as exc:
        click.echo(f"error: {_one_line(exc)}", err=True)
        sys.exit(2)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--data-dir", type=click.Path(path_type=Path), envvar=DATA_ENV, default="data",
              show_default=True, help=f"Where datasets live (env {DATA_ENV}).")
@click.option("--results-dir", type=click.Path(path_type=Path), envvar=RESULTS_ENV,
              default="results", show_default=True, help=f"Where run results live (env {RESULTS_ENV}).")
@click.pass_context
def cli(ctx: click.Context, data_dir: Path, results_dir: Path) -> None:
    """Offline multi-agent RL benchmark: PLCQL and its baselines."""
    ctx.obj = {"data_dir": data_dir, "results_dir": results_dir}


@cli.command()
@click.option("--all", "show_all", is_flag=True, help="Also list resolved package versions.")
def version(show_all: bool) -> None:
    """Print the suite version (and, with --all, every tracked package and the git commit)."""
    from plcql_bench import __version__
    from plcql_bench.suite.versions import git_commit, package_versions

    click.echo(f"plcql-bench {__version__}")
    if show_all:
        for name, ver in package_versions().items():
            click.echo(f"  {name:<20} {ver}")
        click.echo(f"  {'git commit':<20} {git_commit()}")


# ----------------------------------------------------------------------------- runs
def _parse_sets(pairs: tuple[str, ...]) -> dict:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise BenchError(f"--set {pair!r}: expected key=value")
        key, raw = pair.split("=", 1)
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


@cli.command()
@click.option("--algo", required=True)
@click.option("--task", required=True)
@click.option("--dataset", "tier", required=True, help="Dataset tier, e.g. expert.")
@click.option("--seed", default=0, show_default=True)
@click.option("--profile", default="smoke", show_default=True)
@click.option("--set", "sets", multiple=True, help="Config override key=value (JSON value).")
@click.option("--device", default="cpu", show_default=True)
@click.pass_obj
def run(obj, algo, task, tier, seed, profile, sets, device) -> None:
    """Train and evaluate one cell; skips it if already finished."""
    from plcql_bench.suite.profiles import load_profile
    from plcql_bench.suite.runner import Cell, execute, plan_run

    plan = plan_run(Cell(algo, task, tier, seed), load_profile(profile), obj["data_dir"],
                    obj["results_dir"], _parse_sets(sets))
    if plan.is_done():
        click.echo(f"{plan.cell.label()}: already done -> {plan.final_path}")
        return
    result = execute(plan, device=device, log=click.echo)
    click.echo(f"{plan.cell.label()}: score {result['score']:.2f} ({result['score_name']}) "
               f"in {result['train']['wall_clock_s']:.1f}s -> {plan.final_path}")


@cli.command("all")
@click.option("--profile", default="smoke", show_default=True)
@click.option("--build-missing/--no-build-missing", default=True, show_default=True,
              help="Build datasets the matrix needs when they are missing.")
@click.option("--device", default="cpu", show_default=True)
@click.pass_obj
def run_all(obj, profile, build_missing, device) -> None:
    """Run the profile's matrix, skipping finished cells; nonzero exit if any run failed."""
    from plcql_bench.datasets import manifest
    from plcql_bench.datasets.build import build_dataset
    from plcql_bench.suite.profiles import load_profile
    from plcql_bench.suite.runner import Cell, execute, plan_run, profile_dir

    prof = load_profile(profile)
    m = prof.matrix
    root = profile_dir(obj["data_dir"], prof)
    if build_missing:
        for task_id in m["tasks"]:
            for tier in m["tiers"]:
                if not manifest.lookup(root, task_id, tier):
                    click.echo(f"building dataset {task_id}/{tier}")
                    build_dataset(task_id, tier, prof.episodes_for(task_id, tier), root, profile=prof.name)
    cells = [Cell(a, t, q, s) for t in m["tasks"] for q in m["tiers"] for a in m["algos"] for s in m["seeds"]]
    counts = {"trained": 0, "skipped": 0, "failed": 0}
    for cell in cells:
        plan = plan_run(cell, prof, obj["data_dir"], obj["results_dir"])
        if plan.is_done():
            counts["skipped"] += 1
            continue
        try:
            result = execute(plan, device=device, log=click.echo)
        except Exception as exc:  # isolate failures: record, report, continue
            counts["failed"] += 1
            click.echo(f"FAILED {cell.label()}: {_one_line(exc)} (see {plan.run_dir / 'status.json'})", err=True)
            continue
        counts["trained"] += 1
        click.echo(f"{cell.label()}: score {result['score']:.2f} ({result['train']['wall_clock_s']:.1f}s)")
    click.echo(f"all ({prof.name}): {len(cells)} cells: trained {counts['trained']}, "
               f"skipped {counts['skipped']} (done), failed {counts['failed']}")
    if counts["failed"]:
        sys.exit(1)


@cli.command()
@click.option("--results", "results", type=click.Path(path_type=Path), default=None,
              help="Results folder (default: the global --results-dir).")
@click.option("--out", type=click.Path(path_type=Path), default="site", show_default=True)
@click.pass_obj
def leaderboard(obj, results, out) -> None:
    """Render the static leaderboard from result files."""
    from plcql_bench.leaderboard.build import build_site

    index = build_site(results or obj["results_dir"], out, data_dir=obj["data_dir"])
    click.echo(f"leaderboard -> {index}")


def _register_subcommands() -> None:
    """Command groups that live next to what they drive."""
    from plcql_bench.algorithms.cli import bench_speed
    from plcql_bench.datasets.cli import datasets

    cli.add_command(datasets)
    cli.add_command(bench_speed)


_register_subcommands()

if __name__ == "__main__":
    main()

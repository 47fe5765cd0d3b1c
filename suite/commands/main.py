"""The `plcql-bench` command line: the root group, its global options and the error handling of every command.

Commands are loaded when called, not at start-up: each lives in a module that imports torch and the rest of the
suite (~2 s), so `plcql-bench --help`, a typo or `version` would otherwise wait for all of them. COMMANDS names
where each is and its one-line help for the command list (tests/test_cli_startup.py checks both against the
commands themselves, and that `--help` imports none of the heavy modules).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import click

from plcql_bench.suite.commands.options import accept_dir_options
from plcql_bench.suite.core.errors import BenchError, RunFailed
from plcql_bench.suite.core.settings import DATA_ENV, OMAR_PREY_ENV, RESULTS_ENV
from plcql_bench.suite.core.stop import restore_interrupts

# name -> (module under plcql_bench.suite.commands, attribute, one-line help as the command's own)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "all": ("runs", "run_all", "Run the profile's matrix: build each missing dataset when the queue reaches its first "
            "cell (in that cell's job), skip finished cells, resume partial ones from their checkpoint, isolate failures "
            "(a dataset that cannot be built fails only its cells; a run's traceback goes to its status.json); exit 1 if "
            "any selected cell is failed, 2 if a dataset is damaged or a config does not resolve."),
    "bench-speed": ("bench", "bench_speed", "Median milliseconds per update round on a synthetic 100k-transition buffer, "
                    "and (for the CFCQL family) the median time of building one update's target alone, and how far each "
                    "round is from its floor (matmul FLOPs / the machine's matmul rate)."),
    "build-kernels": ("bench", "build_kernels", "Build the native (C) kernels now, outside any training run (`all` also "
                      "builds them before its first run); prints each kernel's library, or why the torch form will run "
                      "instead."),
    "campaign": ("campaign", "campaign", "Run a prioritised list of matrix selections (a campaign file) and publish "
                 "finished runs."),
    "datasets": ("datasets", "datasets", "Build, list and inspect datasets."),
    "export": ("runs", "export_cmd", "Tidy table of finished runs (one row per algo/task/tier/seed/step/metric; the "
               "tier's column is named `dataset`, as in final.json), or marl-eval JSON."),
    "leaderboard": ("runs", "leaderboard", "Render the static leaderboard from result files (--results-dir; --results is "
                    "the same option); with --front DIR, DIR's board is the front page and the results folder's one "
                    "click away."),
    "plan": ("runs", "plan", "Resolve the matrix (configs, datasets), show each cell's state and a wall-clock estimate "
             "from measured costs: per task, per algorithm, serial and with --jobs."),
    "regress": ("regress", "regress", "Compare PROFILE's results with a reference band; exit 1 on a significant drop."),
    "run": ("runs", "run", "Train and evaluate one cell; skips it if already finished."),
    "status": ("runs", "status", "Table of the runs under the results folder: state, step, runtime, failure reason."),
    "version": ("version", "version", "Print the suite version (and, with --all, every tracked package and the git commit)."),
}


class LazyGroup(click.Group):
    """A group whose commands are imported on first use (COMMANDS); the command list is written from the table."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in COMMANDS:
            module, attr, _ = COMMANDS[name]
            cmd = getattr(importlib.import_module(f"plcql_bench.suite.commands.{module}"), attr)
            self.add_command(accept_dir_options(cmd), name)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        # a command not loaded yet: its one-line help shortened as click shortens the loaded command's
        rows = [(n, (self.commands.get(n) or click.Command(n, help=COMMANDS[n][2])).get_short_help_str(limit))
                for n in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--data-dir", type=click.Path(path_type=Path), envvar=DATA_ENV, default="data",
              show_default=True, help=f"Where datasets live (env {DATA_ENV}).")
@click.option("--results-dir", type=click.Path(path_type=Path), envvar=RESULTS_ENV,
              default="results", show_default=True, help=f"Where run results live (env {RESULTS_ENV}).")
@click.option("--omar-prey", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Folder holding OMAR's pretrained prey files (env PLCQL_OMAR_PREY_DIR; default: "
                   "../shared/data/omar-prey/ beside the checkout or the working directory). The v2 datasets "
                   "of PP and World are collected and evaluated against it (docs/datasets.md).")
@click.pass_context
def cli(ctx: click.Context, data_dir: Path, results_dir: Path, omar_prey: Path | None) -> None:
    """Offline multi-agent RL benchmark: PLCQL and its baselines."""

    restore_interrupts()
    if omar_prey is not None:  # through the environment, so worker processes find it too
        os.environ[OMAR_PREY_ENV] = str(omar_prey.resolve())
    source = ctx.get_parameter_source("results_dir")
    # Where the results folder came from: a missing default one is "nothing trained yet", a missing
    # named one a typo; `plan` and `status` say which folder they read.
    ctx.obj = {"data_dir": data_dir, "results_dir": results_dir,
               "results_default": source == click.core.ParameterSource.DEFAULT,
               "results_from": {click.core.ParameterSource.DEFAULT: "the default --results-dir",
                                click.core.ParameterSource.ENVIRONMENT: f"${RESULTS_ENV}"}.get(source, "--results-dir")}


def _user_errors() -> tuple[type[BaseException], ...]:
    """BenchError, and DatasetError once its module is loaded: a command that can raise it has imported it, and
    importing it here (h5py, numpy) would cost every command's start-up."""
    fmt = sys.modules.get("plcql_bench.datasets.format")
    return (BenchError,) + ((fmt.DatasetError,) if fmt is not None else ())


def main() -> None:
    """Entry point: user errors become one line on stderr and exit status 2; so does a file or
    folder that cannot be written or read (read-only, full disk, a directory in a file's place),
    named with its path."""
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
    except RunFailed as exc:
        click.echo(f"error: {_one_line(exc)}", err=True)
        sys.exit(1)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        click.echo(f"error: {where}{exc.strerror or _one_line(exc)} ({type(exc).__name__})", err=True)
        sys.exit(2)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


if __name__ == "__main__":
    main()

"""Options every command shares: `--data-dir` / `--results-dir` after a command's name too (the root group
takes them before it). Light on purpose: the entry point (main.py) uses it before any command is loaded."""

from __future__ import annotations

from pathlib import Path

import click

from plcql_bench.suite.core.settings import DATA_ENV, RESULTS_ENV


def dir_option(flag: str, key: str, *aliases: str) -> click.Option:
    """`--data-dir` / `--results-dir` after a subcommand: the same setting as before it (one spelling,
    either place; given in both, the one after the subcommand wins)."""
    def store(ctx: click.Context, _param, value):
        if value is not None:
            ctx.obj[key] = value
            if key == "results_dir":  # named on the command line: `plan`/`status` say so, a typo is an error
                ctx.obj.update(results_default=False, results_from="--results-dir")

    return click.Option([flag, *aliases], type=click.Path(path_type=Path), default=None, expose_value=False,
                        callback=store, help=f"As the global {flag} (default: ${DATA_ENV if key == 'data_dir' else RESULTS_ENV}, "
                                             f"else {'data' if key == 'data_dir' else 'results'}).")


def accept_dir_options(cmd: click.Command) -> click.Command:
    """`cmd` (and, for a group, every command under it) takes --data-dir and --results-dir after its name too."""
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            accept_dir_options(sub)
        return cmd
    flags = {opt for param in cmd.params for opt in getattr(param, "opts", ())}
    for flag, key in (("--data-dir", "data_dir"), ("--results-dir", "results_dir")):
        if flag not in flags:
            cmd.params.append(dir_option(flag, key))
    return cmd

"""`plcql-bench version`: light, like the entry point (no torch), so it answers at once."""

from __future__ import annotations

import click

from plcql_bench import __version__
from plcql_bench.suite.runs.versions import git_commit, package_versions


@click.command()
@click.option("--all", "show_all", is_flag=True, help="Also list resolved package versions.")
def version(show_all: bool) -> None:
    """Print the suite version (and, with --all, every tracked package and the git commit)."""

    click.echo(f"plcql-bench {__version__}")
    if show_all:
        for name, ver in package_versions().items():
            click.echo(f"  {name:<20} {ver}")
        click.echo(f"  {'git commit':<20} {git_commit()}")

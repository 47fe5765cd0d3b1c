"""`plcql-bench --help` and `version` answer without importing torch and the rest of the suite: the root group
loads a command only when it is called (suite/commands/main.py's COMMANDS). The table's one-line helps are the
commands' own, so the lazy command list reads exactly as the loaded one."""

from __future__ import annotations

import subprocess
import sys

import click

from plcql_bench.suite.commands import main as entry

HEAVY = ("torch", "matplotlib", "h5py", "jax", "plcql_bench.suite.runs.runner", "plcql_bench.algorithms")


def _imported_after(*argv: str) -> list[str]:
    code = ("import sys\nfrom plcql_bench.suite.commands.main import main\n"
            f"sys.argv = ['plcql-bench', *{list(argv)!r}]\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return eval(out.strip().splitlines()[-1])


def test_help_and_version_import_nothing_heavy():
    assert _imported_after("--help") == []
    assert _imported_after("version") == []
    assert "torch" in _imported_after("plan", "--help")  # a real command is loaded when called


def test_the_table_is_the_commands_own():
    for name, (module, attr, short) in entry.COMMANDS.items():
        cmd = getattr(__import__(f"plcql_bench.suite.commands.{module}", fromlist=[attr]), attr)
        assert isinstance(cmd, click.Command) and cmd.name == name, name
        assert cmd.get_short_help_str(10_000) == short, f"COMMANDS[{name!r}]'s help differs from the command's"


def test_the_lazy_command_list_reads_as_clicks_own():
    """The root's --help before any command is loaded equals a plain click group's with every command in it."""
    def help_of(group: click.Group) -> str:
        return group.get_help(click.Context(group, info_name="plcql-bench", terminal_width=80))

    lazy = entry.LazyGroup(name="plcql-bench", params=entry.cli.params, help=entry.cli.help)
    before = help_of(lazy)
    assert not lazy.commands  # nothing was loaded to write it
    ctx = click.Context(lazy)
    plain = click.Group(name="plcql-bench", params=entry.cli.params, help=entry.cli.help,
                        commands={n: lazy.get_command(ctx, n) for n in entry.COMMANDS})
    assert before == help_of(plain) == help_of(lazy)
    assert "bench-speed" in before and "Train and evaluate one cell" in before


def test_an_unknown_command_is_one_usage_error():
    proc = subprocess.run([sys.executable, "-m", "plcql_bench.suite.commands.main", "trian"], capture_output=True, text=True)
    assert proc.returncode == 2 and "No such command 'trian'" in proc.stderr

"""The CLI's real entry point, run in process, for the tests that drive `plcql-bench` end to end."""

from __future__ import annotations

import sys


def run_cli(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    """`plcql-bench ARGS...` through `main()`: (exit status, stdout, stderr)."""
    from plcql_bench.suite.commands.main import main

    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["plcql-bench", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err

"""Click parameter types shared by the commands of `plcql-bench` and `plcql-bench campaign`."""

from __future__ import annotations

import click

from plcql_bench.suite.runs.matrix import parse_duration


class Duration(click.ParamType):
    """A duration such as 90m, 2h30m, 1.5h or 45s, as seconds (a float); a bad one is a usage error
    (exit 2) naming the option."""

    name = "duration"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()

"""Rendering: the Jinja environment (autoescaping, strict undefined), its number filters, the
inlined stylesheet, and the pages of one board: index.html, and the figures that would make it slow
to load (learning curves, PAR diagnostics) on pages of their own."""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from plcql_bench.leaderboard.cells import format_interval, format_mean_std, format_score, format_spread
from plcql_bench.leaderboard.provenance import short_commit

__all__ = ["PAGES", "render_pages"]

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"


def _p(p: float | None) -> str:
    if p is None:
        return "\u2014"
    return "< 0.001" if p < 0.001 else f"{p:.3f}" if p < 0.01 else f"{p:.2f}"


def _signed(v: float | None, score_name: str) -> str:
    text = format_score(v, score_name)
    return text if text.startswith(("-", "\u2014")) or text.strip("0.") == "" else "+" + text


def _interval_signed(ci, score_name: str) -> str:
    return "\u2014" if ci is None else f"[{_signed(ci[0], score_name)}, {_signed(ci[1], score_name)}]"


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(str(TEMPLATES_DIR)),
                      autoescape=select_autoescape(enabled_extensions=("html", "j2"), default_for_string=True),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(score=format_score, mean_std=format_mean_std, interval=format_interval, spread=format_spread,
                       short_commit=short_commit, p=_p, signed=_signed, interval_signed=_interval_signed)
    return env


def _css() -> Markup:
    css = (TEMPLATES_DIR / "style.css").read_text(encoding="utf-8")
    if "</" in css:
        raise ValueError("style.css must not contain '</' (it is inlined into a <style> element)")
    return Markup(css)


PAGES = ("index", "curves", "par")  # <name>.html.j2 -> <name>.html, each self-contained


def render_pages(context: dict) -> dict[str, str]:
    """{file name: HTML} of every page of a board."""
    env, css = _environment(), _css()
    return {f"{name}.html": env.get_template(f"{name}.html.j2").render(css=css, page=name, **context) for name in PAGES}

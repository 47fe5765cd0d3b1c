"""`plcql-bench regress`: compare a profile's results with the reference band (the comparison itself:
suite/runs/regress.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from plcql_bench.suite.runs.regress import collect, compare, failed, make_band, report


@click.command("regress")
@click.option("--profile", default="nightly", show_default=True)
@click.option("--band", "band_path", type=click.Path(path_type=Path), default=Path("ci/reference_band.json"),
              show_default=True, help="Reference band (JSON).")
@click.option("--report", "report_path", type=click.Path(path_type=Path), default=None,
              help="Write the markdown report here (it is always printed).")
@click.option("--update-band", is_flag=True, help="Write the band from these results instead of comparing.")
@click.option("--note", default="", help="With --update-band: a note stored in the band (how it was made).")
@click.pass_obj
def regress(obj, profile, band_path, report_path, update_band, note) -> None:
    """Compare PROFILE's results with a reference band; exit 1 on a significant drop."""
    cells = collect(obj["results_dir"], profile)
    if update_band:
        if not cells:
            raise click.ClickException(f"no finished {profile} runs under {obj['results_dir']}")
        band = make_band(cells, profile, note)
        band_path.parent.mkdir(parents=True, exist_ok=True)
        band_path.write_text(json.dumps(band, indent=2, sort_keys=True) + "\n")
        click.echo(f"wrote {band_path}: {len(band['cells'])} cells from {sum(map(len, cells.values()))} runs")
        return
    band = json.loads(band_path.read_text())
    if band.get("profile") != profile:
        raise click.ClickException(f"{band_path} is a band for profile {band.get('profile')!r}, not {profile!r}")
    rows = compare(band, cells)
    click.echo(f"regress: {profile} runs in {obj['results_dir']} against {band_path}")
    text = report(rows, band, sorted(set(cells) - set(band["cells"])))
    if report_path:
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(text)
    click.echo(text, nl=False)
    if failed(rows, band):
        raise SystemExit(1)

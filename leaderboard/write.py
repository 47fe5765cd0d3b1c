"""The site's files: its pages (index.html and the figure pages it links), results.json / results.csv
(every cell under every view) and a CSV and JSON per table in ``tables/`` (the page links each), written as
one folder swapped in atomically."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from plcql_bench.leaderboard.cells import Cell, cell_stats
from plcql_bench.leaderboard.scoring import VIEWS
from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.core.store import named_errors, staged_directory

__all__ = ["OUTPUT_SCHEMA_VERSION", "SITE_MARKER", "cell_json", "write_outputs"]

OUTPUT_SCHEMA_VERSION = 2  # of results.json / results.csv / tables/*


def cell_json(cell: Cell, paper_ref) -> dict:
    out = {"domain": cell.domain, "task": cell.task, "dataset": cell.dataset, "algo": cell.algo,
           "profile": cell.profile, "protocol_version": cell.protocol_version, "score_name": cell.score_name,
           "n": len(cell.runs), "seeds": cell.seeds, "run_keys": [r.rec.run_key for r in cell.runs],
           "files": [r.path for r in cell.runs], "n_dirty": cell.n_dirty, "n_par_collapsed": len(cell.collapsed),
           "views": {}}
    for v in VIEWS:
        s = cell_stats(cell.values(v))
        out["views"][v.key] = {"n": s.n, "mean": s.mean, "std": s.std, "ci_low": s.ci[0] if s.ci else None,
                               "ci_high": s.ci[1] if s.ci else None, "values": list(s.values)}
    out["paper"] = None if paper_ref is None else {"mean": paper_ref.mean, "std": paper_ref.std, "table": paper_ref.table,
                                                   "task": paper_ref.task, "tier": paper_ref.tier, "sc2": paper_ref.sc2}
    return out


def _flat(c: dict) -> dict:
    row = {k: c[k] for k in ("domain", "task", "dataset", "algo", "profile", "protocol_version", "score_name", "n")}
    row["seeds"] = " ".join(str(s) for s in c["seeds"])
    for key, s in c["views"].items():
        for f in ("mean", "std", "ci_low", "ci_high"):
            row[f"{f}_{key}"] = s[f]
    row["paper_mean"] = None if c["paper"] is None else c["paper"]["mean"]
    row["paper_std"] = None if c["paper"] is None else c["paper"]["std"]
    row["n_dirty"], row["n_par_collapsed"] = c["n_dirty"], c["n_par_collapsed"]
    return row


def csv_text(records: list[dict], fields: list[str] | None = None) -> str:
    fields = fields or list(dict.fromkeys(k for r in records for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in records:
        w.writerow({k: "" if r.get(k) is None else (int(r[k]) if isinstance(r[k], bool) else r[k]) for k in fields})
    return buf.getvalue()


def _json(obj) -> str:
    return json.dumps(obj, indent=2, default=str) + "\n"


SITE_MARKER = ".plcql-site"  # in every site folder this writes: it is replaced as a whole by the next build
# what sites held before the marker (your-runs/ and the figure pages: a --front site's)
LEGACY_SITE = {"index.html", "results.json", "results.csv", "tables", "your-runs", "curves.html", "par.html"}


def write_outputs(out_dir: Path, pages: dict[str, str], results: dict, downloads: dict[str, list[dict]]) -> Path:
    """The pages ({file name: HTML}: index.html and the figure pages it links), results.json/.csv and
    tables/<name>.csv/.json; returns the index path. The site is
    written to a folder beside ``out_dir`` and swapped in whole (suite/core/store.py, staged_directory):
    a reader sees the old site or the new one, never a mix, and a build stopped or failing on the way
    (Ctrl-C, SIGTERM, a full disk) leaves the old site as it was."""
    out_dir = Path(out_dir)
    _check_replaceable(out_dir)
    with staged_directory(out_dir) as stage:
        (stage / "tables").mkdir()
        _write(stage / SITE_MARKER, f"a plcql-bench leaderboard site (schema {OUTPUT_SCHEMA_VERSION}); "
                                    "`plcql-bench leaderboard` replaces this folder as a whole\n")
        for name, html in pages.items():
            _write(stage / name, html)
        _write(stage / "results.json", _json({"schema_version": OUTPUT_SCHEMA_VERSION, **results}))
        _write(stage / "results.csv", csv_text([_flat(c) for c in results["cells"]]))
        for name, records in downloads.items():
            _write(stage / "tables" / f"{name}.csv", csv_text(records))
            _write(stage / "tables" / f"{name}.json", _json({"schema_version": OUTPUT_SCHEMA_VERSION, "rows": records}))
    return out_dir / "index.html"


def _write(path: Path, text: str) -> None:
    with named_errors(path):
        path.write_text(text, encoding="utf-8")


def _check_replaceable(out_dir: Path) -> None:
    """The folder a build replaces is new, empty or a site (it holds the marker, or only what a site held
    before the marker): replacing it deletes whatever else it holds."""
    if not out_dir.is_dir() or (out_dir / SITE_MARKER).is_file():
        return
    foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in LEGACY_SITE)
    if foreign:
        raise BenchError(f"{out_dir}: holds files that are not part of a leaderboard site ({', '.join(foreign[:3])}"
                         f"{', ...' if len(foreign) > 3 else ''}); a build replaces its folder as a whole, so give "
                         "--out a new or empty folder, or a site folder")

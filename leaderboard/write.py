"""The site's files: its pages, results.json / results.csv (every cell under every view) and a CSV
and JSON per table in ``tables/`` (the page links each)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from plcql_bench.leaderboard.cells import Cell, cell_stats
from plcql_bench.leaderboard.scoring import VIEWS

__all__ = ["OUTPUT_SCHEMA_VERSION", "cell_json", "write_outputs"]

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


def write_outputs(out_dir: Path, pages: dict[str, str], results: dict, downloads: dict[str, list[dict]]) -> Path:
    """The pages ({file name: HTML}: index.html and the figure pages it links), results.json/.csv
    and tables/<name>.csv/.json; returns the index path."""
    out_dir = Path(out_dir)
    (out_dir / "tables").mkdir(parents=True, exist_ok=True)
    for name, html in pages.items():
        (out_dir / name).write_text(html, encoding="utf-8")
    index = out_dir / "index.html"
    (out_dir / "results.json").write_text(_json({"schema_version": OUTPUT_SCHEMA_VERSION, **results}), encoding="utf-8")
    (out_dir / "results.csv").write_text(csv_text([_flat(c) for c in results["cells"]]), encoding="utf-8")
    for name, records in downloads.items():
        (out_dir / "tables" / f"{name}.csv").write_text(csv_text(records), encoding="utf-8")
        (out_dir / "tables" / f"{name}.json").write_text(_json({"schema_version": OUTPUT_SCHEMA_VERSION, "rows": records}),
                                                         encoding="utf-8")
    return index

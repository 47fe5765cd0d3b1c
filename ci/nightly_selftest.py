"""Self-test of the nightly band (`make nightly-selftest`; slow: four nightly-sized runs).

The band (ci/reference_band.json) is only useful if it fails on a learning regression and passes
on seed noise. This script measures both with real runs of the nightly profile:

* noise: the profile with two other sets of training seeds (disjoint from the band's and from
  each other), each compared with the band: both must PASS;
* injected: the profile at the band's own seeds with a learning regression injected by config
  (default: cql_alpha x 100 for every algorithm that has the field, i.e. CFCQL and PLCQL): it must
  FAIL, and only cells of injected algorithms may be flagged (an untouched algorithm's cell flagged
  would be a false alarm). Which injected algorithms' cells caught it is reported: not every one
  need (measured: CFCQL's do, PLCQL's stay within their wider tolerance; ci/README.md).

Each variant is a copy of the nightly profile (same name, so results land under `nightly/` in the
variant's own results folder; same datasets) with its seeds or algo_overrides changed. Every run's
score goes to --record (ci/band_evidence.json), which tests/test_regress.py checks against the
committed band in CI (fast). Exit 0 when every expectation holds, 1 otherwise.

    python ci/nightly_selftest.py --jobs 2 --record ci/band_evidence.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent / "plcql-bench"
NOISE_SEED_SETS = (100, 200)  # first seed of each noise variant (as many seeds as the band has)
INJECTIONS = {
    # name: (config field, function of the cell's own value, description)
    "cql_alpha_x100": ("cql_alpha", lambda v: 100.0 * v, "cql_alpha x 100 (CQL term 100 times too strong)"),
    "no_cql": ("cql_alpha", lambda v: 0.0, "cql_alpha = 0 (CQL term dropped, as a sign slip in its guard would)"),
}


def nightly_raw() -> dict:
    from plcql_bench.suite.runs.profiles import load_profile

    prof = load_profile("nightly")
    if not prof.source.startswith("builtin:"):
        raise SystemExit("the nightly profile must be the built-in one")
    return yaml.safe_load((ROOT / "suite" / "runs" / "profiles" / "nightly.yaml").read_text())


def noise_variant(raw: dict, first_seed: int) -> list[tuple[dict, list[str]]]:
    """The profile with n other seeds first_seed..first_seed+n-1; one `all` call."""
    out = copy.deepcopy(raw)
    out["matrix"]["seeds"] = list(range(first_seed, first_seed + len(raw["matrix"]["seeds"])))
    return [(out, [])]


def injected_variant(raw: dict, field: str, change) -> list[tuple[dict, list[str]]]:
    """One profile per (algo, tier) that has `field`, with field = change(its own value) in
    algo_overrides; the algorithms without the field run unchanged. -> [(profile, --only)]."""
    from plcql_bench.suite.runs.profiles import _parse
    from plcql_bench.suite.runs.runner import Cell, resolve_config

    prof = _parse(raw, "nightly-selftest")
    m = raw["matrix"]
    plain, calls = [], []
    for algo in m["algos"]:
        for tier in m["tiers"]:
            for task in m["tasks"]:
                cfg = resolve_config(Cell(algo, task, tier, 0), prof)
                if not hasattr(cfg, field):
                    plain.append((algo, task, tier))
                    continue
                out = copy.deepcopy(raw)
                out["algo_overrides"] = {**(raw.get("algo_overrides") or {}), field: change(getattr(cfg, field))}
                calls.append((out, [f"algo={algo},task={task},dataset={tier}"]))
    calls += [(copy.deepcopy(raw), [f"algo={a},task={t},dataset={q}"]) for a, t, q in plain]
    return calls


def run_variant(name: str, calls: list[tuple[dict, list[str]]], work: Path, data_dir: Path, jobs: int,
                band_path: Path) -> dict:
    """Run every call of a variant into work/name/results, then compare with the band."""
    from plcql_bench.suite.runs.regress import collect, compare, failed, failing, report

    vdir = work / name
    results = vdir / "results"
    t0 = time.time()
    for i, (raw, only) in enumerate(calls):
        prof_path = vdir / f"profile-{i}.yaml"
        prof_path.parent.mkdir(parents=True, exist_ok=True)
        prof_path.write_text(yaml.safe_dump(raw, sort_keys=False))
        cmd = [str(BIN), "--data-dir", str(data_dir), "--results-dir", str(results), "all",
               "--profile", str(prof_path), "--jobs", str(jobs)]
        for o in only:
            cmd += ["--only", o]
        print(f"[{name}] {' '.join(cmd[1:])}", flush=True)
        subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})  # as make nightly-band
    band = json.loads(band_path.read_text())
    cells = collect(results, band["profile"])
    rows = compare(band, cells)
    text = report(rows, band, sorted(set(cells) - set(band["cells"])))
    (vdir / "report.md").write_text(text)
    print(text, flush=True)
    return {"cells": {k: [round(s, 4) for s in v] for k, v in sorted(cells.items())},
            "verdict": "fail" if failed(rows, band) else "pass",
            "flagged": {r.cell: r.verdict for r in rows if r.verdict in failing(band)},
            "minutes": round((time.time() - t0) / 60, 1)}


def check(name: str, expect: str, got: dict, injected_algos: set[str]) -> list[str]:
    """The expectations; returns the failed ones (empty: all hold)."""
    bad = []
    if got["verdict"] != expect:
        bad.append(f"{name}: expected {expect.upper()}, got {got['verdict'].upper()} ({got['flagged']})")
    if expect == "fail":
        hit = {c.split("/")[0] for c in got["flagged"]}
        if hit - injected_algos:
            bad.append(f"{name}: cells of algorithms without the injection flagged: {sorted(hit - injected_algos)}")
    return bad


def missed_by(got: dict, injected_algos: set[str]) -> list[str]:
    """Injected algorithms none of whose cells was flagged (the band would miss the injection in
    them alone)."""
    return sorted(injected_algos - {c.split("/")[0] for c in got["flagged"]})


def algos_with(raw: dict, field: str) -> set[str]:
    """The profile's algorithms whose config has `field` (those an injection changes)."""
    return {only[0].split(",")[0].removeprefix("algo=")
            for prof, only in injected_variant(raw, field, lambda v: v)
            if field in (prof.get("algo_overrides") or {})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "nightly-selftest")
    ap.add_argument("--data-dir", type=Path, default=ROOT / "build" / "nightly" / "data")
    ap.add_argument("--band", type=Path, default=ROOT / "ci" / "reference_band.json")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--injection", choices=sorted(INJECTIONS), default="cql_alpha_x100")
    ap.add_argument("--only-variant", choices=["noise", "injected"], default=None,
                    help="Run one kind of variant only.")
    ap.add_argument("--record", type=Path, default=None, help="Write every run's score here (JSON).")
    args = ap.parse_args(argv)

    raw = nightly_raw()
    field, change, desc = INJECTIONS[args.injection]
    variants = []  # (name, expect, calls)
    if args.only_variant in (None, "noise"):
        variants += [(f"noise-seeds{s}", "pass", noise_variant(raw, s)) for s in NOISE_SEED_SETS]
    if args.only_variant in (None, "injected"):
        variants.append((f"injected-{args.injection}", "fail", injected_variant(raw, field, change)))
    algos = algos_with(raw, field)

    band = json.loads(args.band.read_text())
    out = {"band_note": band["note"], "injection": {"name": args.injection, "what": desc, "algos": sorted(algos)},
           "variants": {}}
    problems = []
    for name, expect, calls in variants:
        got = run_variant(name, calls, args.work, args.data_dir, args.jobs, args.band)
        got["expect"] = expect
        out["variants"][name] = got
        problems += check(name, expect, got, algos if expect == "fail" else set())
    if args.record:
        args.record.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
        print(f"wrote {args.record}")
    for name, got in out["variants"].items():
        print(f"{name}: {got['verdict'].upper()} (expected {got['expect'].upper()}), flagged {got['flagged']}, "
              f"{got['minutes']} min")
        missed = missed_by(got, algos) if got["expect"] == "fail" else []
        if missed:
            print(f"  NOTE: no cell of {missed} moved beyond its tolerance: the band would not catch this "
                  f"injection in {'that algorithm' if len(missed) == 1 else 'those algorithms'} alone")
    print("NIGHTLY-SELFTEST " + ("OK" if not problems else "FAILED:\n  " + "\n  ".join(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

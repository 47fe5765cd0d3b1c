"""Sweeps from the command line: `all --set ALGO.FIELD=V1,V2` trains one labelled variant per value, each
with its own run key and config, checked like `run --set`, and shown in the ablation table."""

from __future__ import annotations

import json

import pytest

from plcql_bench.algorithms.base import get_algorithm, implementations, load_all, parse_sweep_name, sweep_name
from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.runs.matrix import parse_sweeps
from cli_main import run_cli

PROFILE = """
name: sweeptest
description: sweep tests
datasets: {episodes: {default: 6}}
train: {updates: {default: 2}, eval_every: 2, eval_episodes: 1, final_eval_episodes: 2, checkpoint_every: 2}
matrix: {algos: [bc, plcql], tasks: [mpe-cn], tiers: [random], seeds: [0]}
algo_overrides: {batch_size: 32, hidden: 32, temperature: 1.5}
"""


def test_a_sweep_name_stands_for_its_variant_in_any_process():
    plcql = get_algorithm("plcql")
    variant = get_algorithm("plcql-temperature-0.5")  # made on first use, as in a spawned worker
    assert issubclass(variant, plcql) and variant.sweep == {"temperature": 0.5}
    assert set(implementations("plcql-temperature-0.5")) == {"continuous", "discrete"}
    assert parse_sweep_name("plcql-k1-temperature-2") == ("plcql-k1", "temperature", 2)  # longest base first
    assert parse_sweep_name("plcql-fixed_k-n") == ("plcql", "fixed_k", "n")
    assert parse_sweep_name("plcql-nosuchfield-1") is None and not implementations("plcql-temperature-0.50")
    assert "plcql-temperature-0.5" not in load_all()  # not an algorithm of the suite: not listed, not documented
    with pytest.raises(ValueError, match="cannot name a variant"):  # a value that is no path component
        sweep_name("plcql", "fixed_k", "a/b")


@pytest.mark.parametrize("spec, says", [
    ("plcql.temperature=abc", "--set plcql.temperature=abc: temperature: must be a number, got 'abc'"),
    ("plcql.gamma=0.9,1.5", "gamma: must be in (0, 1], got 1.5"),
    ("plcql.batch_size=0", "batch_size: must be >= 1, got 0"),
    ("plcql.temprature=1", "temprature: unknown config field of plcql (did you mean 'temperature'?)"),
    ("plcqll.temperature=1", "unknown algorithm 'plcqll' (did you mean 'plcql'?)"),
    ("temperature=1", "expected ALGO.FIELD=V1[,V2...]"),
])
def test_bad_sweeps_are_refused(spec, says):
    with pytest.raises(BenchError, match=None) as err:
        parse_sweeps([spec])
    assert says in str(err.value), str(err.value)


def test_all_trains_one_labelled_variant_per_value(tmp_path, monkeypatch, capsys):
    (tmp_path / "p.yaml").write_text(PROFILE)
    base = ["--data-dir", str(tmp_path / "data"), "--results-dir", str(tmp_path / "res")]
    sweep = ["--profile", str(tmp_path / "p.yaml"), "--only", "algo=plcql", "--set", "plcql.temperature=0.5,2"]

    # a bad value is refused before anything is written
    code, _, err = run_cli(monkeypatch, capsys, *base, "all", "--profile", str(tmp_path / "p.yaml"),
                           "--set", "plcql.temperature=0.5,x")
    assert code == 2 and err.count("\n") == 1 and "temperature: must be a number, got 'x'" in err
    assert not (tmp_path / "res").exists() and not (tmp_path / "data").exists()
    code, _, err = run_cli(monkeypatch, capsys, *base, "all", "--profile", str(tmp_path / "p.yaml"),
                           "--only", "algo=bc", "--set", "plcql.temperature=2")
    assert code == 2 and "no plcql cell in the selection" in err

    code, out, err = run_cli(monkeypatch, capsys, *base, "all", *sweep, "--jobs", "2")  # spawned workers
    assert code == 0, out + err
    assert "3 cells: trained 3" in out
    finals = {p.parent.parent.parent.parent.name: json.loads(p.read_text())
              for p in (tmp_path / "res" / "sweeptest").glob("*/mpe-cn/random/seed0-*/final.json")}
    assert set(finals) == {"plcql", "plcql-temperature-0.5", "plcql-temperature-2"}
    # the sweep's value wins over the profile's algo_overrides (temperature 1.5), as --set does
    assert [finals[a]["config"]["temperature"] for a in sorted(finals)] == [1.5, 0.5, 2]
    assert len({f["run_key"] for f in finals.values()}) == 3
    for f in finals.values():
        assert {k: v for k, v in f["config"].items() if k != "temperature"} == \
            {k: v for k, v in finals["plcql"]["config"].items() if k != "temperature"}

    code, out, _ = run_cli(monkeypatch, capsys, *base, "all", *sweep)
    assert code == 0 and "3 cells: trained 0, skipped 3 (done)" in out
    code, out, _ = run_cli(monkeypatch, capsys, *base, "plan", *sweep)
    assert code == 0 and "3 cells: done 3" in out and "plcql-temperature-0.5" in out

    # the leaderboard's ablation table has a row per variant, described as a sweep
    from plcql_bench.leaderboard.build import build

    build(tmp_path / "res", tmp_path / "site", bootstrap_reps=20, poi_reps=20)
    rows = json.loads((tmp_path / "site" / "tables" / "ablation.json").read_text())["rows"]
    swept = {r["algo"]: r for r in rows if r["view"] == "final-ours" and (r["task"], r["dataset"]) == ("mpe-cn", "random")}
    for algo in ("plcql-temperature-0.5", "plcql-temperature-2"):
        assert swept[algo]["n"] == 1 and swept[algo]["mean"] == pytest.approx(finals[algo]["score"])
    page = (tmp_path / "site" / "index.html").read_text()
    assert "sweep of plcql: temperature = 0.5" in page and "sweep of plcql: temperature = 2" in page

"""`export`: tidy CSV / Parquet rows and marl-eval's nested JSON."""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from plcql_bench.datasets.build import build_dataset
from plcql_bench.suite.cli import cli
from plcql_bench.suite.profiles import load_profile
from plcql_bench.suite.runner import Cell, execute, plan_run

PROFILE = """
name: exporttest
description: export tests
datasets: {episodes: {default: 6}}
train: {updates: {default: 2}, eval_every: 2, eval_episodes: 1, final_eval_episodes: 3, checkpoint_every: 2}
matrix: {algos: [bc, cfcql], tasks: [mpe-cn], tiers: [random], seeds: [0, 1]}
algo_overrides: {batch_size: 32, hidden: 32}
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    (tmp / "p.yaml").write_text(PROFILE)
    profile = load_profile(str(tmp / "p.yaml"))
    build_dataset("mpe-cn", "random", 6, tmp / "data" / profile.name, profile=profile.name)
    finals = []
    for algo, seed in (("bc", 0), ("bc", 1), ("cfcql", 0)):
        plan = plan_run(Cell(algo, "mpe-cn", "random", seed), profile, tmp / "data", tmp / "results")
        finals.append(execute(plan, log=lambda *_: None))
    return tmp, finals


def _export(tmp, fmt, name):
    out = tmp / name
    res = CliRunner().invoke(cli, ["--results-dir", str(tmp / "results"), "export", "--format", fmt,
                                   "--out", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return out


def test_csv_is_tidy_one_row_per_run_step_metric(results):
    tmp, finals = results
    rows = list(csv.DictReader(_export(tmp, "csv", "r.csv").open()))
    assert list(rows[0]) == ["profile", "domain", "algo", "task", "dataset", "seed", "run_key", "step",
                             "metric", "value"]
    keys = [(r["algo"], r["seed"], r["step"], r["metric"]) for r in rows]
    assert len(keys) == len(set(keys))  # tidy: one row per algo/task/dataset/seed/step/metric
    by_key = {(r["algo"], int(r["seed"]), int(r["step"]), r["metric"]): float(r["value"]) for r in rows}
    for f in finals:
        assert by_key[(f["algo"], f["seed"], f["train"]["updates"], "final/score")] == f["score"]
        assert by_key[(f["algo"], f["seed"], f["train"]["updates"], "final/return_mean")] == f["final_eval"]["return_mean"]
        for point in f["curve"]:
            assert by_key[(f["algo"], f["seed"], point["update"], "score")] == point["score"]
            assert by_key[(f["algo"], f["seed"], point["update"], "return_mean")] == point["return_mean"]
    assert any(m.startswith("train/") for (_, _, _, m) in by_key)  # training metrics too
    assert {r["domain"] for r in rows} == {"mpe"} and {r["dataset"] for r in rows} == {"random"}


def test_parquet_matches_csv(results):
    pq = pytest.importorskip("pyarrow.parquet")
    tmp, _ = results
    table = pq.read_table(_export(tmp, "parquet", "r.parquet")).to_pylist()
    rows = list(csv.DictReader(_export(tmp, "csv", "r2.csv").open()))
    assert len(table) == len(rows)
    assert {(t["algo"], t["seed"], t["step"], t["metric"], t["value"]) for t in table} == \
        {(r["algo"], int(r["seed"]), int(r["step"]), r["metric"], float(r["value"])) for r in rows}


def test_marl_eval_json_follows_its_schema(results):
    tmp, finals = results
    data = json.loads(_export(tmp, "marl-eval", "m.json").read_text())
    # {env_name: {task_name: {algo_name: {run_k: {step_i: {step_count, metric: [..]}, absolute_metrics}}}}}
    assert list(data) == ["mpe"] and list(data["mpe"]) == ["mpe-cn_random"]
    algos = data["mpe"]["mpe-cn_random"]
    assert sorted(algos) == ["bc", "cfcql"]
    assert sorted(algos["bc"]) == ["run_0", "run_1"] and list(algos["cfcql"]) == ["run_0"]
    for f in finals:
        run = algos[f["algo"]][f"run_{f['seed']}"]
        steps = sorted((k for k in run if k.startswith("step_")), key=lambda k: int(k.split("_")[1]))
        assert steps == [f"step_{i}" for i in range(len(f["curve"]))]
        for key, point in zip(steps, f["curve"]):
            entry = run[key]
            assert entry["step_count"] == point["update"] and isinstance(entry["step_count"], int)
            assert entry["return"] == [point["return_mean"]]
            assert entry["normalised_score"] == [point["score"]]
            assert all(isinstance(v, list) for k, v in entry.items() if k != "step_count")
        absolute = run["absolute_metrics"]
        assert len(absolute["return"]) == f["final_eval"]["episodes"] == 3
        assert sum(absolute["return"]) / 3 == pytest.approx(f["final_eval"]["return_mean"])
        assert sum(absolute["normalised_score"]) / 3 == pytest.approx(f["score"])

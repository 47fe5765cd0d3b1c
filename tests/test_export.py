"""`export`: tidy CSV / Parquet rows and marl-eval's nested JSON, checked with marl-eval's own code."""

from __future__ import annotations

import csv
import json
import sys

import numpy as np

import pytest
from click.testing import CliRunner

from plcql_bench.datasets.build import build_dataset
from plcql_bench.suite.commands.main import cli
from plcql_bench.suite.runs.profiles import load_profile
from plcql_bench.suite.runs.runner import Cell, execute, plan_run

PROFILE = """
name: exporttest
description: export tests
datasets: {episodes: {default: 6}}
train: {updates: {default: 20, mpe-pp: 10}, eval_every: 2, eval_episodes: 1, final_eval_episodes: 3,
        checkpoint_every: 10}
matrix: {algos: [bc, cfcql], tasks: [mpe-cn, mpe-pp], tiers: [random], seeds: [0, 1, 2]}
algo_overrides: {batch_size: 32, hidden: 32}
"""
# Not what marl-eval's matrices accept as a whole: BC has 3 seeds on CN and CFCQL 2; PP has 6 evaluation
# steps (10 rounds), CN 11 (20 rounds: more than 10, so steps sorted as strings would be out of order);
# CFCQL has no PP run.
RUNS = (("bc", "mpe-cn", 0), ("bc", "mpe-cn", 1), ("bc", "mpe-cn", 2), ("cfcql", "mpe-cn", 0),
        ("cfcql", "mpe-cn", 1), ("bc", "mpe-pp", 0))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    (tmp / "p.yaml").write_text(PROFILE)
    profile = load_profile(str(tmp / "p.yaml"))
    for task in ("mpe-cn", "mpe-pp"):
        build_dataset(task, "random", 6, tmp / "data" / profile.name, profile=profile.name)
    finals = []
    for algo, task, seed in RUNS:
        plan = plan_run(Cell(algo, task, "random", seed), profile, tmp / "data", tmp / "results")
        finals.append(execute(plan, log=lambda *_: None))
    return tmp, finals


def _export(tmp, fmt, name, *args):
    out = tmp / name
    res = CliRunner().invoke(cli, ["--results-dir", str(tmp / "results"), "export", "--format", fmt,
                                                   "--out", str(out), *args], catch_exceptions=False)
    assert res.exit_code == 0, res.output + res.stderr
    return out


def _export_notes(tmp, name, *args):
    res = CliRunner().invoke(cli, ["--results-dir", str(tmp / "results"), "export", "--format",
                                                   "marl-eval", "--out", str(tmp / name), *args],
                                             catch_exceptions=False)
    assert res.exit_code == 0, res.output + res.stderr
    return json.loads((tmp / name).read_text()), res.stderr


def test_csv_is_tidy_one_row_per_run_step_metric(results):
    tmp, finals = results
    rows = list(csv.DictReader(_export(tmp, "csv", "r.csv").open()))
    assert list(rows[0]) == ["profile", "domain", "algo", "task", "dataset", "seed", "run_key", "step",
                             "metric", "value"]
    keys = [(r["algo"], r["task"], r["seed"], r["step"], r["metric"]) for r in rows]
    assert len(keys) == len(set(keys))  # tidy: one row per algo/task/dataset/seed/step/metric
    by_key = {(r["algo"], r["task"], int(r["seed"]), int(r["step"]), r["metric"]): float(r["value"]) for r in rows}
    for f in finals:
        run = (f["algo"], f["task"], f["seed"])
        assert by_key[(*run, f["train"]["updates"], "final/score")] == f["score"]
        assert by_key[(*run, f["train"]["updates"], "final/return_mean")] == f["final_eval"]["return_mean"]
        for point in f["curve"]:
            assert by_key[(*run, point["update"], "score")] == point["score"]
            assert by_key[(*run, point["update"], "return_mean")] == point["return_mean"]
    assert any(m.startswith("train/") for *_, m in by_key)  # training metrics too
    assert {r["domain"] for r in rows} == {"mpe"} and {r["dataset"] for r in rows} == {"random"}


def test_parquet_matches_csv(results):
    pq = pytest.importorskip("pyarrow.parquet")
    tmp, _ = results
    table = pq.read_table(_export(tmp, "parquet", "r.parquet")).to_pylist()
    rows = list(csv.DictReader(_export(tmp, "csv", "r2.csv").open()))
    assert len(table) == len(rows)
    assert {(t["algo"], t["task"], t["seed"], t["step"], t["metric"], t["value"]) for t in table} == \
        {(r["algo"], r["task"], int(r["seed"]), int(r["step"]), r["metric"], float(r["value"])) for r in rows}


def test_marl_eval_json_follows_its_schema(results):
    tmp, finals = results
    data = json.loads(_export(tmp, "marl-eval", "m.json").read_text())
    # {env_name: {task_name: {algo_name: {run_k: {step_i: {step_count, metric: [..]}, absolute_metrics}}}}}
    assert list(data) == ["mpe"] and list(data["mpe"]) == ["mpe-cn_random", "mpe-pp_random"]
    algos = data["mpe"]["mpe-cn_random"]
    assert list(algos) == ["bc", "cfcql"]
    assert list(algos["bc"]) == ["run_0", "run_1", "run_2"] and list(algos["cfcql"]) == ["run_0", "run_1"]
    for f in finals:
        run = data["mpe"][f"{f['task']}_random"][f["algo"]][f"run_{f['seed']}"]
        # marl-eval reads steps in key order: numeric order, absolute_metrics last (not sorted as strings)
        assert list(run) == [f"step_{i}" for i in range(len(f["curve"]))] + ["absolute_metrics"]
        for i, point in enumerate(f["curve"]):
            entry = run[f"step_{i}"]
            assert entry["step_count"] == point["update"] and isinstance(entry["step_count"], int)
            assert entry["return"] == [point["return_mean"]]
            assert entry["normalised_score"] == [point["score"]]
            assert all(isinstance(v, list) for k, v in entry.items() if k != "step_count")
        absolute = run["absolute_metrics"]
        assert len(absolute["return"]) == f["final_eval"]["episodes"] == 3
        assert sum(absolute["return"]) / 3 == pytest.approx(f["final_eval"]["return_mean"])
        assert sum(absolute["normalised_score"]) / 3 == pytest.approx(f["score"])


def test_marl_eval_accepts_the_consistent_export(results, tmp_path, monkeypatch):
    """marl-eval's own validator and aggregation on `--consistent`: PP (other steps) and BC's third seed
    are cut, with notes; the evaluation interval marl-eval infers is the profile's, and its matrices hold
    our curves and final scores in step order."""
    pytest.importorskip("marl_eval", reason="dev setup installs id-marl-eval (make test)")
    from marl_eval.utils.data_processing_utils import create_matrices_for_rliable, data_process_pipeline
    from marl_eval.utils.diagnose_data_errors import DiagnoseData

    tmp, finals = results
    data, notes = _export_notes(tmp, "consistent.json", "--consistent")
    assert "dropped mpe/mpe-pp_random runs with 6 evaluation steps (kept: 11 steps, 0..20)" in notes
    assert "dropped mpe seeds not run by every algorithm on every task: bc seed 2" in notes
    assert "would reject" not in notes
    assert list(data["mpe"]) == ["mpe-cn_random"]
    assert all(list(runs) == ["run_0", "run_1"] for runs in data["mpe"]["mpe-cn_random"].values())

    checks = DiagnoseData(data).check_data()["mpe"]
    assert all(checks.values()), checks
    processed = data_process_pipeline(json.loads(json.dumps(data)), ["normalised_score"])
    assert processed["extra"]["evaluation_interval"]["mpe"] == 2  # eval_every (string order gave 5 for 10 on paper)
    absolute, curves = create_matrices_for_rliable(processed, "mpe", ["normalised_score"])
    kept = {(f["algo"], f["seed"]): f for f in finals if f["task"] == "mpe-cn" and f["seed"] < 2}
    for algo in ("bc", "cfcql"):
        tensor = curves["mean_normalised_score"][algo]  # [runs, tasks, steps]
        assert tensor.shape == (2, 1, 11)
        for seed in (0, 1):
            f = kept[(algo, seed)]
            assert np.allclose(tensor[seed, 0], [p["score"] for p in f["curve"]])
            assert absolute["mean_normalised_score"][algo][seed, 0] == pytest.approx(f["score"])

    import matplotlib

    matplotlib.use("Agg")
    from marl_eval.plotting_tools import plotting

    bootstrap = plotting.rly.get_interval_estimates  # marl-eval asks for 50,000 resamples: 40 s here
    monkeypatch.setattr(plotting.rly, "get_interval_estimates", lambda *a, **k: bootstrap(*a, **{**k, "reps": 500}))
    _, scores, _ = plotting.aggregate_scores(absolute, "normalised_score", [],
                                             tabular_results_file_path=str(tmp_path / "agg"))
    for algo in ("bc", "cfcql"):  # marl-eval returns its table's strings here: "<mean> [<ci low>, <ci high>]"
        mean = np.mean([kept[(algo, s)]["score"] for s in (0, 1)])
        assert scores[algo.upper()]["Mean"].startswith(f"{round(mean, 2)} ["), scores


def test_marl_eval_export_of_everything_says_why_marl_eval_rejects_it(results):
    """The whole, inconsistent export is written, with a note per problem; marl-eval's matrix step does
    fail on it, as the notes say."""
    pytest.importorskip("marl_eval", reason="dev setup installs id-marl-eval (make test)")
    from marl_eval.utils.data_processing_utils import create_matrices_for_rliable, data_process_pipeline

    tmp, _ = results
    data, notes = _export_notes(tmp, "all.json")
    assert "mpe: the algorithms have different seeds (--consistent cuts it)" in notes
    assert "mpe: the runs have different evaluation steps" in notes and "mpe: the tasks have different algorithms" in notes
    with pytest.raises(KeyError):
        create_matrices_for_rliable(data_process_pipeline(data, ["normalised_score"]), "mpe", ["normalised_score"])


def test_export_only_selects_runs(results):
    tmp, _ = results
    data, notes = _export_notes(tmp, "only.json", "--only", "algo=bc,seed=0,1", "--only", "task=mpe-cn")
    assert list(data["mpe"]) == ["mpe-cn_random"] and list(data["mpe"]["mpe-cn_random"]) == ["bc"]
    assert list(data["mpe"]["mpe-cn_random"]["bc"]) == ["run_0", "run_1"]
    assert notes == ""  # one algorithm, one task, equal steps: nothing for marl-eval to reject
    rows = list(csv.DictReader(_export(tmp, "csv", "only.csv", "--only", "algo=cfcql,seed=1").open()))
    assert rows and {(r["algo"], r["seed"]) for r in rows} == {("cfcql", "1")}


def _main(monkeypatch, *args) -> int:
    from plcql_bench.suite.commands.main import main

    monkeypatch.setattr(sys, "argv", ["plcql-bench", *args])
    try:
        main()
    except SystemExit as exc:
        return int(exc.code)
    return 0


def test_export_user_errors_are_one_line(results, monkeypatch, capsys):
    tmp, _ = results
    base = ["--results-dir", str(tmp / "results"), "export", "--out", str(tmp / "bad.json")]
    for args, says in ((["--only", "algo=cfqcl"], "--only algo=cfqcl: no finished run has it (algos: bc, cfcql) "
                                                  "(did you mean 'cfcql'?)"),
                       (["--only", "seed=7"], "--only seed=7: no finished run has it (seeds: 0, 1, 2)"),
                       (["--format", "csv", "--consistent"], "--consistent cuts a marl-eval export")):
        capsys.readouterr()
        assert _main(monkeypatch, *base, "--format", "marl-eval", *args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
    assert not (tmp / "bad.json").exists()

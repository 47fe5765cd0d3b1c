"""`bench-speed`: the paired PLCQL/SPaCQL comparison and its interval."""

from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

from plcql_bench.algorithms.common.speed import paired_ratio
from plcql_bench.suite.commands.main import cli


def test_paired_ratio_recovers_a_known_ratio_and_brackets_it():
    rng = np.random.default_rng(1)
    load = rng.uniform(0.8, 1.6, size=200)  # a machine whose load drifts: pairs share it
    b = 100 * load * rng.normal(1, 0.01, size=200)
    a = 0.95 * 100 * load * rng.normal(1, 0.01, size=200)
    ratio, lo, hi = paired_ratio(list(a), list(b))
    assert lo < ratio < hi
    assert lo < 0.95 < hi
    assert hi < 1.0  # a 5 % saving is resolved at this noise


def test_paired_ratio_interval_covers_one_when_there_is_no_difference():
    rng = np.random.default_rng(2)
    b = rng.normal(100, 5, size=50)
    a = rng.normal(100, 5, size=50)
    _, lo, hi = paired_ratio(list(a), list(b))
    assert lo < 1.0 < hi


def test_paired_ratio_rejects_unpaired_lists():
    with pytest.raises(ValueError, match="equal"):
        paired_ratio([1.0, 2.0], [1.0])


def test_bench_speed_prints_the_plcql_spacql_comparison():
    out = CliRunner().invoke(cli, ["bench-speed", "--algo", "plcql", "--algo", "spacql", "--rounds", "3",
                                   "--warmup", "1", "--batch", "32", "--threads", "1"])
    assert out.exit_code == 0, out.output
    rows = {line.split()[0]: line.split() for line in out.output.splitlines() if line.startswith(("plcql", "spacql"))}
    assert set(rows) == {"plcql", "spacql"}
    assert all(float(r[3]) > 0 for r in rows.values())  # ms per round
    m = re.search(r"ratio PLCQL/SPaCQL (\d+\.\d+) \(95% CI (\d+\.\d+)-(\d+\.\d+)\)", out.output)
    assert m, out.output
    ratio, lo, hi = map(float, m.groups())
    assert lo <= ratio <= hi
    # the target construction alone, paired on the same batches: its own ratio and interval, and its share
    t = re.search(r"target construction PLCQL/SPaCQL alone, (\d+) interleaved batches: PLCQL ([\d.]+) ms, SPaCQL "
                  r"([\d.]+) ms, median per-batch ratio ([\d.]+) \(95% CI ([\d.]+)-([\d.]+)\); of the round: PLCQL "
                  r"5 x [\d.]+ ms = \d+ %, SPaCQL 5 x [\d.]+ ms = \d+ %", out.output)
    assert t, out.output
    batches, pl, sp, t_ratio, t_lo, t_hi = map(float, t.groups())
    assert batches == 10 and pl > 0 and sp > 0 and t_lo <= t_ratio <= t_hi


def test_record_cost_appends_the_printed_measurement_to_the_cost_file(tmp_path):
    """--record-cost: the measurement the command printed, with machine, date, command and load, appended to
    the board's compute-cost file; the file's comments and earlier rows are kept, and the board reads it."""
    import shutil

    import yaml

    from plcql_bench.leaderboard import analysis

    cost = tmp_path / "bench_speed.yaml"
    shutil.copy(analysis.BENCH_SPEED, cost)
    before = cost.read_text()
    out = CliRunner().invoke(cli, ["bench-speed", "--algo", "plcql", "--algo", "spacql", "--rounds", "3",
                                   "--warmup", "1", "--batch", "32", "--threads", "1", "--no-floor",
                                   "--record-cost", str(cost), "--description", "test box"])
    assert out.exit_code == 0, out.output
    after = cost.read_text()
    assert after.startswith(before.rstrip("\n"))  # comments and earlier rows kept as they were
    rows = yaml.safe_load(after)["measurements"]
    assert rows[:-1] == yaml.safe_load(before)["measurements"]
    rec = rows[-1]
    assert (rec["task"], rec["n_agents"], rec["batch"], rec["rounds"], rec["threads"]) == ("mpe-cn", 3, 32, 3, 1)
    assert rec["machine"].startswith("test box, 1 torch thread(s), wall clock, load average ")
    assert rec["command"] == ("plcql-bench bench-speed --algo plcql --algo spacql --task mpe-cn --tier medium --rounds 3 "
                              "--warmup 1 --threads 1 --clock wall --device cpu --batch 32")
    m = re.search(r"ratio PLCQL/SPaCQL (\d+\.\d+) \(95% CI (\d+\.\d+)-(\d+\.\d+)\)", out.output)
    assert [rec["ratio"], *rec["ratio_ci"]] == [round(float(x), 3) for x in m.groups()]
    t = re.search(r"median per-batch ratio ([\d.]+) \(95% CI ([\d.]+)-([\d.]+)\)", out.output)
    assert [rec["target_ratio"], *rec["target_ratio_ci"]] == [round(float(x), 3) for x in t.groups()]
    assert f"# recorded in {cost}: mpe-cn (n=3)" in out.output
    board = analysis.compute_cost(cost)["rows"][-1]
    assert board["target_paired"] and board["target_ratio"] == rec["target_ratio"]


@pytest.mark.parametrize("args, content, message", [
    (["--algo", "plcql"], "measurements: []\n", "--record-cost {f}: records PLCQL against SPaCQL; give --algo plcql "
                                                "--algo spacql (or no --algo)"),
    (["--algo", "plcql", "--algo", "spacql"], "- a\n- b\n", "--record-cost {f}: not a compute-cost file (expected a "
                                                           "mapping with a 'measurements' list)"),
    (["--algo", "plcql", "--algo", "spacql"], "measurements:\n  - task: x\nsource: s\n",
     "--record-cost {f}: 'measurements' must be the file's last key, a block list indented by 2 spaces (as "
     "leaderboard/bench_speed.yaml)"),
])
def test_record_cost_refuses_before_timing_and_leaves_the_file(tmp_path, monkeypatch, capsys, args, content, message):
    import sys

    from plcql_bench.suite.commands.main import main

    f = tmp_path / "cost.yaml"
    f.write_text(content)
    monkeypatch.setattr(sys, "argv", ["plcql-bench", "bench-speed", *args, "--rounds", "2", "--record-cost", str(f)])
    with pytest.raises(SystemExit) as stop:
        main()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.strip().splitlines() == [f"error: {message.format(f=f)}"]
    assert f.read_text() == content


def test_the_board_separates_target_construction_from_the_round(tmp_path):
    """The compute-cost table: the whole round's ratio and the target construction's, each with its interval,
    per task and n; a row measured before the paired target timing shows its medians' ratio, marked unpaired."""
    import yaml

    from plcql_bench.leaderboard import analysis

    f = tmp_path / "cost.yaml"
    f.write_text("measurements: []\n")
    base = {"machine": "m", "date": "2026-12-05", "command": "c", "rounds": 20, "device": "cpu"}
    analysis.append_cost_measurement(f, {"task": "mpe-cn", "n_agents": 3, **base, "plcql_ms": 100.0,
                                         "spacql_ms": 104.0, "ratio": 0.96, "ratio_ci": [0.94, 0.98],
                                         "target_ms": {"plcql": 3.0, "spacql": 9.0}, "target_ratio": 0.33,
                                         "target_ratio_ci": [0.31, 0.35]})
    data = yaml.safe_load(f.read_text())
    data["measurements"].append({"task": "smax-2s3z", "n_agents": 5, **base, "plcql_ms": 2000.0, "spacql_ms": 2100.0,
                                 "ratio": 0.95, "ratio_ci": [0.9, 1.0], "target_ms": {"plcql": 100.0, "spacql": 400.0}})
    f.write_text(yaml.safe_dump(data))
    cost = analysis.compute_cost(f)
    paired, old = cost["rows"]
    assert (paired["target_paired"], paired["target_ratio"], paired["target_ratio_ci"]) == (True, 0.33, [0.31, 0.35])
    assert (old["target_paired"], old["target_ratio"], old["target_ratio_ci"]) == (False, 0.25, None)
    assert cost["svg"].count("target construction") == 1 and "whole round" in cost["svg"]
    from jinja2 import Environment, FileSystemLoader

    env = Environment(loader=FileSystemLoader(str(analysis.BENCH_SPEED.parent / "templates")))
    tpl = env.from_string("{% set compute = c %}{% set target_label = 'PLCQL' %}{% set rival_label = 'SPaCQL' %}"
                          "{% macro dl(x) %}{% endmacro %}" + section_of(env, "compute"))
    html = tpl.render(c=cost)
    assert "0.330 [0.310, 0.350]" in html and "0.960 [0.940, 0.980]" in html
    assert "0.25 <span" in html and "unpaired" in html and "smax-2s3z (5)" in html and "mpe-cn (3)" in html


def section_of(env, name: str) -> str:
    """The template's <section id=name> source."""
    src = env.loader.get_source(env, "index.html.j2")[0]
    start = src.index(f'<section id="{name}">')
    return src[start: src.index("</section>", start) + len("</section>")]


def test_calibrate_writes_costs_that_plan_reads(tmp_path):
    """bench-speed --calibrate measures round and evaluation costs into a file; plan estimates from it."""
    import json

    out = tmp_path / "box.json"
    res = CliRunner().invoke(cli, ["bench-speed", "--calibrate", "box", "--out", str(out), "--algo", "bc",
                                   "--task", "mpe-cn", "--rounds", "3", "--seconds", "0.1", "--clock", "cpu"])
    assert res.exit_code == 0, res.output
    calib = json.loads(out.read_text())
    entry = calib["costs"]["bc"]["mpe-cn"]
    assert entry["round_ms"] > 0 and entry["rounds"] == 3 and len(entry["eval_s"]) == 2
    assert calib["machine"] == "box" and calib["torch_threads"] == 1 and calib["default_jobs"] >= 1
    plan = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "d"), "--results-dir", str(tmp_path / "r"),
                                    "plan", "--profile", "smoke", "--machine", str(out), "--no-cells",
                                    "--only", "algo=bc"])
    assert plan.exit_code == 0, plan.output
    assert "estimate on box" in plan.output and "per algo" in plan.output
    assert re.search(r"^  bc\s+6\s", plan.output, re.M)  # 6 bc cells of the smoke matrix, all costed
    calib["description"] = "the box under my desk"
    out.write_text(json.dumps(calib))
    again = CliRunner().invoke(cli, ["bench-speed", "--calibrate", "box", "--out", str(out), "--algo", "iql",
                                     "--task", "mpe-cn", "--rounds", "3", "--seconds", "0.1", "--clock", "cpu"])
    assert again.exit_code == 0, again.output
    merged = json.loads(out.read_text())  # a re-measurement merges: new cells added, the old kept with the description
    assert set(merged["costs"]) == {"bc", "iql"} and merged["description"] == "the box under my desk"


def test_bench_speed_stack_times_separate_against_stacked_rounds():
    out = CliRunner().invoke(cli, ["bench-speed", "--algo", "cfcql", "--algo", "bc", "--rounds", "2", "--warmup", "1",
                                   "--batch", "32", "--threads", "1", "--stack", "2", "--no-floor"])
    assert out.exit_code == 0, out.output
    m = re.search(r"cfcql mpe-cn, 2 interleaved pairs: 2 separate rounds (\d+\.\d) ms, one stacked round of 2 seeds "
                  r"(\d+\.\d) ms; runs per hour stacked/separate (\d+\.\d+) \(95% CI (\d+\.\d+)-(\d+\.\d+)\)", out.output)
    assert m, out.output
    sep, stk, ratio, lo, hi = map(float, m.groups())
    assert sep > 0 and stk > 0 and lo <= ratio <= hi
    ops = re.search(r"2 separate rounds (\d+), one stacked round (\d+)", out.output)
    assert ops and int(ops.group(2)) < int(ops.group(1)), out.output  # one stacked round dispatches fewer ops
    assert "bc mpe-cn: no stacked round" in out.output


def test_bench_speed_times_episode_algorithms_on_a_dataset_s_episodes(tmp_path):
    """--episodes-from: the header gives the file's episode lengths, the round is timed on its batches;
    a file of another task, or several tasks, is refused in one line."""
    from plcql_bench.datasets.format import synthetic_dataset, write_dataset
    from plcql_bench.suite.envs.tasks import get_task

    spec = get_task("smax-2s3z").spec
    arrays, attrs = synthetic_dataset(spec, n_episodes=6, episode_len=7)
    path = tmp_path / "d.h5"
    write_dataset(path, arrays, attrs, spec)
    out = CliRunner().invoke(cli, ["bench-speed", "--task", "smax-2s3z", "--algo", "bc", "--rounds", "2", "--warmup",
                                   "1", "--batch", "4", "--no-floor", "--episodes-from", str(path)])
    assert out.exit_code == 0, out.output
    assert f"# episodes from {path}: 6 episodes, length mean 7.0, max 7 (synthetic episodes would all be " \
           f"{spec.episode_limit})" in out.output
    assert any(line.startswith("bc ") for line in out.output.splitlines())
    two = CliRunner().invoke(cli, ["bench-speed", "--task", "smax-2s3z", "--task", "mpe-cn", "--algo", "bc",
                                   "--episodes-from", str(path)])
    assert two.exit_code != 0 and "give exactly one --task" in str(two.exception) + two.output
    other = CliRunner().invoke(cli, ["bench-speed", "--task", "smax-3s_vs_5z", "--algo", "bc",
                                     "--episodes-from", str(path)])
    assert other.exit_code != 0 and str(path) in str(other.exception) + other.output


def test_bench_speed_compare_native_pairs_the_c_kernels_with_their_torch_form(monkeypatch):
    """--compare-native times one algorithm with the native kernels against the same with their torch form
    (paired, with an interval) and, where they are switched off, says it skipped."""
    import shutil

    from plcql_bench.algorithms.common import native

    args = ["bench-speed", "--task", "smax-2s3z", "--algo", "cfcql", "--rounds", "2", "--warmup", "0", "--batch", "4",
            "--threads", "1", "--no-floor", "--compare-native"]
    if shutil.which("cc") is not None and native.library("cf_negative") is not None:
        out = CliRunner().invoke(cli, args)
        assert out.exit_code == 0, out.output
        m = re.search(r"cfcql smax-2s3z, 2 interleaved rounds: native (\d+\.\d) ms, torch form (\d+\.\d) ms, median "
                      r"per-round ratio native/torch (\d+\.\d+) \(95% CI (\d+\.\d+)-(\d+\.\d+)\)", out.output)
        assert m, out.output
        nat, tor, ratio, lo, hi = map(float, m.groups())
        assert nat > 0 and tor > 0 and lo <= ratio <= hi
    monkeypatch.setenv("PLCQL_NATIVE", "0")
    off = CliRunner().invoke(cli, args)
    assert off.exit_code == 0 and "--compare-native skipped" in off.output, off.output


def test_packing_prints_runs_per_core_hour_of_each_packing():
    """--packing S: S separate 1-thread runs against one 1-thread stack of S seeds (stackable algorithms only)
    and S runs at S threads, CPU time, each ratio inside its interval."""
    out = CliRunner().invoke(cli, ["bench-speed", "--algo", "cfcql", "--algo", "bc", "--packing", "2", "--rounds", "3",
                                   "--warmup", "1", "--batch", "32", "--no-floor"])
    assert out.exit_code == 0, out.output
    lines = {line.split()[1]: line for line in out.output.splitlines() if "CPU ms to advance 2 runs" in line}
    assert set(lines) == {"cfcql", "bc"}
    found = re.findall(r"runs per core-hour x(\d+\.\d+) \(95% CI (\d+\.\d+)-(\d+\.\d+)\)", lines["cfcql"])
    assert len(found) == 2 and all(float(lo) <= float(r) <= float(hi) for r, lo, hi in found)
    assert "one stack of 2 seeds at 1 thread" in lines["cfcql"] and "2 runs at 2 threads" in lines["cfcql"]
    assert "no stack (bc on mpe-cn is not stackable)" in lines["bc"] and "2 runs at 2 threads" in lines["bc"]


def test_eval_share_is_the_evaluations_part_of_the_profiles_budget():
    """--eval-share: a run's evaluation points (every eval_every rounds, update 0 and the last included) and its
    final evaluation, against its rounds, under the profile's budget (smoke: 20 rounds, every 10, 5 episodes)."""
    out = CliRunner().invoke(cli, ["bench-speed", "--eval-share", "--algo", "bc", "--algo", "iql", "--task", "mpe-cn",
                                   "--profile", "smoke", "--rounds", "3", "--seconds", "0.1", "--clock", "cpu"])
    assert out.exit_code == 0, out.output
    row = next(line.split() for line in out.output.splitlines() if line.startswith("bc "))
    # algo task tier rounds ms/round points x E ep s/point F ep final train_h eval_h eval%
    assert row[:4] == ["bc", "mpe-cn", "medium", "20"] and row[5:9] == ["3", "x", "5", "ep"]
    ms_round, per_point, final = float(row[4]), float(row[9]), float(row[12].rstrip("s"))
    train_s, eval_s = 20 * ms_round / 1e3, 3 * per_point + final
    assert float(row[15].rstrip("%")) == pytest.approx(100 * eval_s / (train_s + eval_s), abs=1.0)
    # the task's line: both algorithms' runs together
    together = re.search(r"# mpe-cn: one run of each of the 2 algorithms above together: evaluation ([\d.]+) s of "
                         r"([\d.]+) s = ([\d.]+) %", out.output)
    assert together, out.output
    assert float(together.group(3)) == pytest.approx(100 * float(together.group(1)) / float(together.group(2)), abs=1.0)

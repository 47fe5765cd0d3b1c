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
    assert "target construction PLCQL/SPaCQL" in out.output


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

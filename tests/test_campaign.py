"""Campaigns: file validation, stage selection, publishing finished runs, and an end-to-end run that
trains, publishes, and trains nothing the second time."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from lb_fixtures import write_run

from plcql_bench.suite.runs.campaign import load_campaign, publish
from plcql_bench.suite.commands.main import cli
from plcql_bench.suite.core.errors import BenchError

PROFILE = """
name: unitcamp
description: campaign tests
datasets: {episodes: {default: 4}}
train: {updates: {default: 2}, eval_every: 2, eval_episodes: 1, final_eval_episodes: 1, checkpoint_every: 2}
matrix: {algos: [bc, cfcql], tasks: [mpe-cn], tiers: [random, expert], seeds: [0, 1]}
algo_overrides: {batch_size: 16, hidden: 8}
"""


def _write(tmp: Path, stages: str) -> Path:
    (tmp / "p.yaml").write_text(PROFILE)
    f = tmp / "camp.yaml"
    f.write_text(f"profile: {tmp / 'p.yaml'}\nstages:\n{stages}")
    return f


@pytest.mark.parametrize("text, msg", [
    ("stages: []\n", "needs 'profile'"),
    ("profile: paper\nstages: [{name: a}]\n", r"stages\[0\] needs 'name' and 'only'"),
    ("profile: paper\nstages: [{name: a, only: algo=bc}, {name: a, only: algo=cfcql}]\n", "duplicate stage name"),
    ("profile: [\n", "cannot read campaign"),
])
def test_bad_campaign_files_name_the_field(tmp_path, text, msg):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(BenchError, match=msg):
        load_campaign(f)


def test_publish_copies_finished_runs_once(tmp_path):
    done = write_run(tmp_path / "results", "bc", "mpe-cn", "random", 0, 1.0)
    (done / "metrics.jsonl").write_text("{}\n")
    partial = done.parent / "seed1-bbb"
    partial.mkdir()
    (partial / "config.json").write_text("{}")
    (partial / "ckpt.pt").write_bytes(b"x")
    copied = write_run(tmp_path / "results", "bc", "mpe-cn", "random", 2, 3.0)
    (copied / "final.json").write_bytes((done / "final.json").read_bytes())  # seed 0's result in seed 2's folder
    dest, warnings = tmp_path / "board", []
    assert publish(tmp_path / "results", "paper", dest, warn=warnings.append) == 1
    out = dest / "paper" / "bc" / "mpe-cn" / "random"
    assert sorted(p.name for p in (out / done.name).iterdir()) == ["config.json", "final.json", "metrics.jsonl.gz"]
    assert not (out / "seed1-bbb").exists()  # unfinished: nothing published
    assert not (out / copied.name).exists() and len(warnings) == 1 and copied.name in warnings[0]  # not its result
    assert publish(tmp_path / "results", "paper", dest, warn=warnings.append) == 0  # already there


def test_runs_moved_to_an_archive_are_not_published_again(tmp_path):
    """A results folder that adopted the board's runs before some moved to an archive (a new dataset
    generation) publishes only the others: the archived ones stay out of the board."""
    old = write_run(tmp_path / "results", "bc", "mpe-cn", "random", 0, 1.0)
    new = write_run(tmp_path / "results", "bc", "mpe-pp", "random", 0, 2.0)
    board = tmp_path / "leaderboard" / "results"
    rel = old.relative_to(tmp_path / "results")
    archived = tmp_path / "leaderboard" / "archive" / "datasets-v1" / "results" / rel
    archived.mkdir(parents=True)
    (archived / "final.json").write_bytes((old / "final.json").read_bytes())
    assert publish(tmp_path / "results", "paper", board) == 1
    assert (board / new.relative_to(tmp_path / "results") / "final.json").exists() and not (board / rel).exists()


def test_adopt_copies_published_runs_into_an_empty_results_folder_only(tmp_path):
    from plcql_bench.suite.runs.campaign import adopt_published

    done = write_run(tmp_path / "results", "bc", "mpe-cn", "random", 0, 1.0)
    (done / "metrics.jsonl").write_text('{"update": 0}\n')
    publish(tmp_path / "results", "paper", tmp_path / "board")
    rel = done.relative_to(tmp_path / "results")
    fresh = tmp_path / "fresh"
    assert adopt_published(tmp_path / "board", fresh, "paper") == 1
    assert sorted(f.name for f in (fresh / rel).iterdir()) == ["config.json", "final.json", "metrics.jsonl.gz"]
    assert (fresh / rel / "final.json").read_bytes() == (done / "final.json").read_bytes()
    assert adopt_published(tmp_path / "board", fresh, "paper") == 0  # already there
    (fresh / rel / "final.json").unlink()  # a run directory that exists is left alone, whatever it holds
    assert adopt_published(tmp_path / "board", fresh, "paper") == 0 and not (fresh / rel / "final.json").exists()


def test_published_metrics_are_gzipped_reproducibly_and_read_back(tmp_path):
    """metrics.jsonl is published as metrics.jsonl.gz (the committed results stay small enough for a GPU
    loan's 64 MiB trip); the same run published twice gives the same bytes, and every reader of a run's
    metrics (leaderboard, export) reads the published file as it reads the runner's."""
    from plcql_bench.leaderboard.analysis import read_metrics
    from plcql_bench.suite.runs.export import _BadHistory, _history

    done = write_run(tmp_path / "results", "bc", "mpe-cn", "random", 0, 1.0)
    lines = "".join(f'{{"update": {u}, "score": {u / 10}, "train/actor/loss": 0.5}}\n' for u in range(0, 200, 10))
    (done / "metrics.jsonl").write_text(lines)
    first, second = tmp_path / "a", tmp_path / "b"
    publish(tmp_path / "results", "paper", first)
    publish(tmp_path / "results", "paper", second)
    rel = done.relative_to(tmp_path / "results")
    packed = first / rel / "metrics.jsonl.gz"
    assert packed.read_bytes() == (second / rel / "metrics.jsonl.gz").read_bytes()
    assert len(packed.read_bytes()) < len(lines) / 3
    assert read_metrics(first / rel / "metrics.jsonl") == read_metrics(done / "metrics.jsonl")
    assert _history(first / rel) == _history(done) and len(_history(done)) == 20
    whole = packed.read_bytes()
    packed.write_bytes(whole[:20])  # a damaged published file reads as nothing, not a crash
    assert read_metrics(first / rel / "metrics.jsonl") == []
    packed.write_bytes(whole[:15] + bytes(b ^ 0xFF for b in whole[15:40]) + whole[40:])  # corrupt inside
    assert read_metrics(first / rel / "metrics.jsonl") == []
    with pytest.raises(_BadHistory, match="unreadable"):
        _history(first / rel)


def test_publishing_stores_training_values_at_float32_precision(tmp_path):
    """A run written before the runner compacted its rows (17-digit training values) is published with
    them at float32 precision; the learning-curve point is copied exactly, and a row that is already
    compact is published byte for byte."""
    import gzip
    import json

    import numpy as np

    done = write_run(tmp_path / "results", "plcql", "mpe-cn", "random", 0, 1.0)
    rows = [{"update": u, "return_mean": 164.0269636154175 + u, "score": 4.281438287909321 + u,
             "train/critic/loss": 497.1030450439454 * (u + 1), "diag/p_k1": float(np.float32(0.1))} for u in range(3)]
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    (done / "metrics.jsonl").write_text(text)
    publish(tmp_path / "results", "paper", tmp_path / "board")
    packed = tmp_path / "board" / done.relative_to(tmp_path / "results") / "metrics.jsonl.gz"
    out = [json.loads(line) for line in gzip.decompress(packed.read_bytes()).decode().splitlines()]
    for r, o in zip(rows, out, strict=True):
        assert {k: o[k] for k in ("update", "return_mean", "score")} == {k: r[k] for k in ("update", "return_mean", "score")}
        assert o["diag/p_k1"] == 0.1 and np.float32(o["train/critic/loss"]) == np.float32(r["train/critic/loss"])
        assert o["train/critic/loss"] != r["train/critic/loss"]  # the float64 noise digits are gone
    compact = gzip.decompress(packed.read_bytes())
    (done / "metrics.jsonl").write_bytes(compact)
    publish(tmp_path / "results", "paper", tmp_path / "again")
    assert gzip.decompress((tmp_path / "again" / packed.relative_to(tmp_path / "board")).read_bytes()) == compact


def test_campaign_runs_stages_and_publishes(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    f = _write(tmp_path, "  - {name: bc-first, only: 'algo=bc,dataset=random,seed=0'}\n"
                         "  - {name: then-cfcql, only: 'algo=cfcql,dataset=random,seed=0'}\n")
    base = ["--data-dir", str(tmp_path / "data"), "--results-dir", str(tmp_path / "results")]
    runner = CliRunner()
    bad = runner.invoke(cli, base + ["campaign", "run", str(f), "--stage", "nope"])
    assert bad.exit_code != 0 and "no stage named nope" in str(bad.exception)
    r = runner.invoke(cli, base + ["campaign", "run", str(f), "--jobs", "1", "--publish-to", str(tmp_path / "board")])
    assert r.exit_code == 0, r.output
    finals = sorted((tmp_path / "board" / "unitcamp").rglob("final.json"))
    assert [p.parts[-5] for p in finals] == ["bc", "cfcql"]
    status = runner.invoke(cli, base + ["campaign", "status", str(f)])
    assert status.exit_code == 0
    rows = {line.split()[0]: line.split()[1:] for line in status.output.splitlines()[1:]}
    assert rows["bc-first"][:2] == ["1", "1"] and rows["total"][:2] == ["2", "2"]
    assert rows["bc-first"][-1] == "0s" and "0s serial, 0 cell(s)" in status.output  # nothing left to run
    again = runner.invoke(cli, base + ["campaign", "run", str(f), "--jobs", "1", "--publish-to", str(tmp_path / "board")])
    assert again.exit_code == 0 and "published 0 new run(s)" in again.output + (again.stderr if again.stderr_bytes else "")
    # a fresh clone: the results folder is gone, the committed (published) runs are done, nothing retrains
    shutil.rmtree(tmp_path / "results")
    fresh = runner.invoke(cli, base + ["campaign", "run", str(f), "--jobs", "1", "--publish-to", str(tmp_path / "board")])
    assert fresh.exit_code == 0 and "2 published run(s)" in fresh.output
    adopted = sorted((tmp_path / "results" / "unitcamp").rglob("final.json"))
    assert len(adopted) == 2 and not any((d.parent / "run.log").exists() for d in adopted)  # copied, not trained


def test_a_queue_keeps_the_order_of_its_selections(tmp_path):
    from plcql_bench.suite.runs.matrix import parse_only, select_cells, select_queue
    from plcql_bench.suite.runs.profiles import load_profile

    (tmp_path / "p.yaml").write_text(PROFILE)
    prof = load_profile(str(tmp_path / "p.yaml"))
    canonical = select_cells(prof, parse_only(["algo=cfcql,bc,dataset=random,seed=0"]))
    assert [c.algo for c in canonical] == ["bc", "cfcql"]  # --only: the profile's order, not the spec's
    queued = select_queue(prof, ["algo=cfcql,dataset=random,seed=0", "algo=bc,dataset=random",
                                 "algo=cfcql,dataset=random"])
    assert [(c.algo, c.seed) for c in queued] == [("cfcql", 0), ("bc", 0), ("bc", 1), ("cfcql", 1)]
    assert select_queue(prof, ["algo=cfcql,dataset=random,seed=0", "algo=bc,dataset=random"], (1, 2)) == queued[1:3:2]


def test_all_refuses_only_with_queue(tmp_path):
    (tmp_path / "p.yaml").write_text(PROFILE)
    r = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "d"), "--results-dir", str(tmp_path / "r"), "plan",
                                 "--profile", str(tmp_path / "p.yaml"), "--only", "algo=bc", "--queue", "algo=cfcql"])
    assert r.exit_code == 2 and "--only and --queue" in r.output


def test_the_campaign_is_one_queue_and_publishes_while_it_runs(tmp_path, monkeypatch):
    """One `all` gets every stage, in file order, so a free core never waits for a stage's last run;
    the publisher runs on a timer while `all` runs, and stops with it."""
    from plcql_bench.suite.runs import campaign as camp

    f = _write(tmp_path, "  - {name: first, only: 'algo=cfcql,dataset=random,seed=0'}\n"
                         "  - {name: second, only: 'algo=bc,dataset=random'}\n")
    seen, ticks = [], []

    def fake_queue(cmd, every_s, on_tick):
        seen.append(cmd)
        on_tick()
        ticks.append(every_s)
        return 0

    monkeypatch.setattr(camp, "run_queue", fake_queue)
    published = iter([2, 0])
    monkeypatch.setattr(camp, "publish", lambda *a, **k: next(published))
    r = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "d"), "--results-dir", str(tmp_path / "r"),
                                 "campaign", "run", str(f), "--jobs", "2", "--publish-every", "5"])
    assert r.exit_code == 0, r.output
    (cmd,) = seen
    queues = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--queue"]
    assert queues == ["algo=cfcql,dataset=random,seed=0", "algo=bc,dataset=random"] and "--only" not in cmd
    assert cmd[cmd.index("--jobs") + 1] == "2" and ticks == [5.0]
    assert "published 2 new run(s)" in r.output and "published 0 new run(s)" in r.output


def test_run_queue_ticks_until_the_command_ends():
    import time

    from plcql_bench.suite.runs.campaign import run_queue

    ticks = []
    start = time.monotonic()
    rc = run_queue([sys.executable, "-c", "import time; time.sleep(1.0); raise SystemExit(3)"], 0.2,
                    lambda: ticks.append(time.monotonic()))
    end = time.monotonic()
    assert rc == 3 and len(ticks) >= 2 and all(t <= end for t in ticks)
    n = len(ticks)
    time.sleep(0.5)
    assert len(ticks) == n  # the ticker stopped with the command
    assert ticks[0] - start >= 0.2


def test_campaign_status_estimates_what_is_left_in_queue_order(tmp_path):
    """Each stage's cells still to run are priced as `plan` prices them (the committed calibration), a cell
    that two stages select counts once, and the queue's wall clock takes them in queue order on --jobs slots."""
    from plcql_bench.suite.runs.calibration import makespan

    assert makespan([1.0, 1.0, 5.0], 2, in_order=True) == 6.0 and makespan([1.0, 1.0, 5.0], 2) == 5.0
    f = _write(tmp_path, "  - {name: bc-first, only: 'algo=bc,dataset=random,seed=0'}\n"
                         "  - {name: bc-again, only: 'algo=bc,dataset=random'}\n")
    base = ["--data-dir", str(tmp_path / "data"), "--results-dir", str(tmp_path / "results")]
    r = CliRunner().invoke(cli, base + ["campaign", "status", str(f), "--jobs", "1"])
    assert r.exit_code == 0, r.output
    rows = {line.split()[0]: line.split()[1:] for line in r.output.splitlines()[1:]}
    assert rows["bc-first"][-1] != "?" and rows["bc-again"][-1] != "?"  # priced (a few seconds: 2 updates)
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("left: ~") and "with 1 job(s) in queue order" in last and "2 cell(s)" in last


def test_campaign_status_marks_stages_priced_only_from_other_tasks(tmp_path):
    """A stage whose cells have no calibrated cost and are priced from the algorithm's runs on another task (BC's
    on PP for BC's CN cells) or from any run (CFCQL's, from that BC run) is marked *, and a last line names the
    pairs and the command that measures them; a stage priced from the calibration is not marked."""
    f = _write(tmp_path, "  - {name: bc-guessed, only: 'algo=bc'}\n  - {name: cfcql-guessed, only: 'algo=cfcql'}\n")
    results = tmp_path / "results"
    write_run(results, "bc", "mpe-pp", "random", 0, 1.0, profile="unitcamp", hardware={"device": "cpu"})
    base = ["--data-dir", str(tmp_path / "data"), "--results-dir", str(results)]
    empty = tmp_path / "empty.json"  # knows no costs: recorded runtimes only
    empty.write_text('{"machine": "empty", "costs": {}}')
    r = CliRunner().invoke(cli, base + ["campaign", "status", str(f), "--machine", str(empty)])
    assert r.exit_code == 0, r.output
    rows = {line.split()[0]: line.split()[1:] for line in r.output.splitlines()[1:]}
    assert rows["bc-guessed"][-1].endswith("*") and rows["cfcql-guessed"][-1].endswith("*")
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("* 8 cell(s) priced only from other tasks' or algorithms' runs (bc/mpe-cn, "
                           "cfcql/mpe-cn)"), last
    assert "bench-speed --calibrate empty --algo bc --algo cfcql --task mpe-cn" in last
    calibrated = CliRunner().invoke(cli, base + ["campaign", "status", str(f)])  # the committed calibration has BC on CN
    assert calibrated.exit_code == 0 and "*" not in calibrated.output, calibrated.output


def test_published_final_json_drops_the_curve_its_metrics_hold_and_reads_back_the_same(tmp_path):
    """The committed results stay within a GPU loan's 64 MiB: a published final.json leaves out the learning
    curve that metrics.jsonl.gz holds point for point, and every reader gets it back from there."""
    import json

    from plcql_bench.suite.core.schema import read_record, scan_records

    done = write_run(tmp_path / "results", "plcql", "mpe-cn", "random", 0, 50.0, diag_n=3)
    assert publish(tmp_path / "results", "paper", tmp_path / "board") == 1
    out = tmp_path / "board" / done.relative_to(tmp_path / "results")
    assert "curve" not in json.loads((out / "final.json").read_text())
    assert read_record(out / "final.json").to_json() == read_record(done / "final.json").to_json()
    assert len(read_record(out / "final.json").curve) == 12
    (good, bad), = [scan_records(tmp_path / "board")]
    assert [r.curve for _, r in good] == [read_record(done / "final.json").curve] and not bad
    (out / "metrics.jsonl.gz").unlink()  # without its metrics the record stays valid, its curve unknown
    assert read_record(out / "final.json").curve in ((), [])


def test_a_curve_the_metrics_do_not_reproduce_is_published_as_it_is(tmp_path):
    import json

    from plcql_bench.suite.runs.campaign import _without_curve

    differs = write_run(tmp_path / "results", "plcql", "mpe-cn", "random", 0, 50.0, diag_n=3)
    rows = (differs / "metrics.jsonl").read_text().splitlines()
    last = json.loads(rows[-1])
    last["score"] += 1.0  # one point disagrees with the curve
    (differs / "metrics.jsonl").write_text("\n".join(rows[:-1] + [json.dumps(last)]) + "\n")
    bare = write_run(tmp_path / "results", "plcql", "mpe-cn", "random", 1, 40.0)  # no metrics at all
    assert publish(tmp_path / "results", "paper", tmp_path / "board") == 2
    for run in (differs, bare):
        out = tmp_path / "board" / run.relative_to(tmp_path / "results") / "final.json"
        assert out.read_bytes() == (run / "final.json").read_bytes()
        assert _without_curve(out) is None  # nothing it could leave out


def test_durations_parse_to_seconds_and_bad_ones_are_refused():
    from plcql_bench.suite.runs.matrix import parse_duration

    assert [parse_duration(t) for t in ("90m", "2h30m", "1.5h", "45s", "1h0m30s")] == [5400, 9000, 5400, 45, 3630]
    for bad in ("90", "m", "2x", "", "2h 30m", "-5m"):
        with pytest.raises(ValueError, match="expected a duration"):
            parse_duration(bad)


def test_under_a_deadline_the_first_job_that_fits_starts_in_queue_order():
    """A job starts only if 1.2 x its estimate fits in the time left; a longer one ahead of it waits (it is not
    dropped: a later call, with more time, takes it first); a job without an estimate never starts."""
    from plcql_bench.suite.runs.executors import FINISH_MARGIN, Job, next_job

    def job(name, est):
        return Job(cell=name, profile=None, data_dir=Path("."), results_dir=Path("."), estimate_s=est)

    assert FINISH_MARGIN == 1.2
    queue = [job("long", 100.0), job("fits", 10.0), job("unknown", None), job("edge", 20.0)]
    clock = lambda: 1000.0  # noqa: E731
    assert next_job(queue, 1030.0, clock).cell == "fits"
    assert next_job(queue, 1023.9, clock) is None  # 1.2 x 20 s does not fit in 23.9 s
    assert next_job(queue, 1024.1, clock).cell == "edge"
    assert next_job(queue, 1030.0, clock) is None and [j.cell for j in queue] == ["long", "unknown"]
    assert next_job(queue, 1200.0, clock).cell == "long"
    assert next_job(queue, 1e9, clock) is None  # "unknown" never fits a deadline
    assert next_job(queue, None).cell == "unknown" and next_job(queue, None) is None  # no deadline: in order


def test_under_a_deadline_a_dataset_still_to_be_built_is_priced_with_its_job(tmp_path):
    """A job whose dataset `all` left to be built needs the build's time too, until a worker has built it
    (the manifest has it); its other jobs then need only their own."""
    from types import SimpleNamespace

    from plcql_bench.datasets import manifest
    from plcql_bench.suite.runs import preflight
    from plcql_bench.suite.runs.executors import Job, build_left_s, next_job
    from plcql_bench.suite.runs.runner import Cell

    profile = SimpleNamespace(data_profile="paper")
    cell = Cell("bc", "smax-2s3z", "medium", 0)
    job = Job(cell=cell, profile=profile, data_dir=tmp_path, results_dir=tmp_path, estimate_s=100.0, build_dataset=True)
    assert build_left_s(job) == preflight.build_estimate("smax-2s3z") == 300.0
    assert preflight.build_estimate("mpe-world") == 60.0 and preflight.build_estimate("smac-2s3z") == 600.0
    clock = lambda: 0.0  # noqa: E731
    assert next_job([job], 1.2 * 399.0, clock) is None  # 100 s + the 300 s build do not fit
    assert next_job([job], 1.2 * 400.0, clock) is job
    assert build_left_s(Job(cell=cell, profile=profile, data_dir=tmp_path, results_dir=tmp_path)) == 0.0  # built before `all`
    manifest.record(tmp_path / "paper", {"task_id": "smax-2s3z", "quality": "medium", "file": "smax-2s3z/medium.h5",
                                         "sha256": "0" * 64, "size_bytes": 1, "format_version": 1,
                                         "n_transitions": 1, "n_episodes": 1})
    assert build_left_s(job) == 300.0  # recorded, but its file is not there (deleted): still to be built
    (tmp_path / "paper" / "smax-2s3z").mkdir(parents=True)
    (tmp_path / "paper" / "smax-2s3z" / "medium.h5").write_bytes(b"0")
    assert build_left_s(job) == 0.0  # another worker built it meanwhile
    assert next_job([job], 1.2 * 100.0, clock) is job


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_all_leaves_what_cannot_finish_for_later_and_trains_what_can(tmp_path, monkeypatch, jobs):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (tmp_path / "p.yaml").write_text(PROFILE)
    base = ["--data-dir", str(tmp_path / "data"), "--results-dir", str(tmp_path / "results"), "all", "--profile",
            str(tmp_path / "p.yaml"), "--only", "algo=bc,dataset=random", "--jobs", jobs]
    runner = CliRunner()
    none = runner.invoke(cli, base + ["--finish-within", "0s"])
    assert none.exit_code == 0, none.output
    assert none.output.count("left for later: bc mpe-cn/random seed") == 2 and "would not finish before the deadline" in none.output
    assert "trained 0" in none.output and "left for later 2 (--finish-within)" in none.output
    assert not list((tmp_path / "results").rglob("final.json"))
    both = runner.invoke(cli, base + ["--finish-within", "1h"])
    assert both.exit_code == 0 and "trained 2" in both.output and "left for later" not in both.output, both.output
    bad = runner.invoke(cli, base + ["--finish-within", "soon"])
    assert bad.exit_code == 2 and "--finish-within" in bad.output and "expected a duration" in bad.output


def test_the_campaign_passes_its_deadline_to_all(tmp_path, monkeypatch):
    from plcql_bench.suite.runs import campaign as camp

    f = _write(tmp_path, "  - {name: first, only: 'algo=bc,dataset=random,seed=0'}\n")
    seen = []
    monkeypatch.setattr(camp, "run_queue", lambda cmd, every_s, on_tick: seen.append(cmd) or 0)
    base = ["--data-dir", str(tmp_path / "d"), "--results-dir", str(tmp_path / "r"), "campaign", "run", str(f),
            "--no-publish"]
    r = CliRunner().invoke(cli, base + ["--finish-within", "2h30m"])
    assert r.exit_code == 0, r.output
    assert seen[0][seen[0].index("--finish-within") + 1] == "9000s"  # 2h30m, as all parses it again
    bad = CliRunner().invoke(cli, base + ["--finish-within", "150"])
    assert bad.exit_code == 2 and "expected a duration" in bad.output and len(seen) == 1

"""Campaigns: file validation, stage selection, publishing finished runs, and an end-to-end run that
trains, publishes, and trains nothing the second time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from lb_fixtures import write_run

from plcql_bench.suite.campaign import load_campaign, publish
from plcql_bench.suite.cli import cli
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
    assert sorted(p.name for p in (out / done.name).iterdir()) == ["config.json", "final.json", "metrics.jsonl"]
    assert not (out / "seed1-bbb").exists()  # unfinished: nothing published
    assert not (out / copied.name).exists() and len(warnings) == 1 and copied.name in warnings[0]  # not its result
    assert publish(tmp_path / "results", "paper", dest, warn=warnings.append) == 0  # already there


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
    again = runner.invoke(cli, base + ["campaign", "run", str(f), "--jobs", "1", "--publish-to", str(tmp_path / "board")])
    assert again.exit_code == 0 and "published 0 new run(s)" in again.output + (again.stderr if again.stderr_bytes else "")

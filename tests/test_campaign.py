"""Campaigns: file validation, stage selection, publishing finished runs, and an end-to-end run that
trains, publishes, and trains nothing the second time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from plcql_bench.suite.campaign import load_campaign, publish
from plcql_bench.suite.cli import cli
from plcql_bench.suite.errors import BenchError

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
    res = tmp_path / "results" / "paper" / "bc" / "mpe-cn" / "random"
    done, partial = res / "seed0-aaa", res / "seed1-bbb"
    for d in (done, partial):
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
        (d / "metrics.jsonl").write_text("{}\n")
        (d / "ckpt.pt").write_bytes(b"x")
    (done / "final.json").write_text(json.dumps({"status": "done", "score": 1.0}))
    dest = tmp_path / "board"
    assert publish(tmp_path / "results", "paper", dest) == 1
    out = dest / "paper" / "bc" / "mpe-cn" / "random"
    assert sorted(p.name for p in (out / "seed0-aaa").iterdir()) == ["config.json", "final.json", "metrics.jsonl"]
    assert not (out / "seed1-bbb").exists()  # unfinished: nothing published
    assert publish(tmp_path / "results", "paper", dest) == 0  # already there


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

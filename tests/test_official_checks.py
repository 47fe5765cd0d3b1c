"""Official-code checks (suite/core/official.py, leaderboard/official.py): the reference's own code trained on
this suite's data, recorded by suite/runs/reference_score.py and shown beside our cells, never ranked."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lb_fixtures import NOW, write_run
from plcql_bench.leaderboard.build import build
from plcql_bench.suite.core import official


def check(seed: int, score: float, *, code: str = "cfcql", task: str = "mpe-pp", tier: str = "random",
          profile: str = "paper", return_mean: float | None = None, finished_at: str = "2026-11-27T22:00:00Z") -> dict:
    return {"schema": official.SCHEMA, "code": code, "repo": official.CODES[code][0], "commit": "3441019" + "0" * 33,
            "task": task, "tier": tier, "seed": seed, "profile": profile, "rounds": 110,
            "dataset_sha256": "ab" * 32, "final_episodes": 100, "score": score,
            "return_mean": score if return_mean is None else return_mean,
            "curve": [{"update": 0, "score": 0.0, "return_mean": 0.0}], "cql_alpha": 0.5, "settings": {"lr": 0.001},
            "finished_at": finished_at, "runtime_s": 900.0}


def put(root, rec: dict):
    path = official.check_path(root, rec["profile"], rec["code"], rec["task"], rec["tier"], rec["seed"])
    official.write_check(path, rec)
    return path


def test_a_check_round_trips_and_a_damaged_one_names_its_file_and_field(tmp_path):
    path = put(tmp_path, check(1, -3.0))
    assert path == tmp_path / "paper" / "cfcql" / "mpe-pp" / "random" / "seed1.json"
    assert official.read_check(path)["score"] == -3.0
    rec = json.loads(path.read_text())
    del rec["dataset_sha256"]
    path.write_text(json.dumps(rec))
    with pytest.raises(ValueError, match=r"seed1\.json: field 'dataset_sha256' missing"):
        official.read_check(path)
    path.write_text(json.dumps({**check(1, -3.0), "seed": "1"}))
    with pytest.raises(ValueError, match=r"field 'seed' is str, expected int"):
        official.read_check(path)
    path.write_text(json.dumps({**check(1, -3.0), "schema": "other/9"}))
    with pytest.raises(ValueError, match=r"field 'schema' is 'other/9'"):
        official.read_check(path)
    path.write_text("{")
    with pytest.raises(ValueError, match=r"seed1\.json: unreadable"):
        official.read_check(path)
    with pytest.raises(ValueError, match=r"field 'score' is float, expected float"):  # NaN is refused on write
        official.write_check(tmp_path / "x.json", check(2, float("nan")))
    assert not (tmp_path / "x.json").exists()
    checks, damaged = official.load_checks(tmp_path)
    assert checks == [] and damaged == [("paper/cfcql/mpe-pp/random/seed1.json", "unreadable (Expecting property name "
                                         "enclosed in double quotes: line 1 column 2 (char 1))")]
    assert official.load_checks(tmp_path / "none") == ([], [])


def test_the_board_shows_the_official_code_beside_our_cell_and_never_ranks_it(tmp_path):
    res = tmp_path / "leaderboard" / "results"
    for seed, score in enumerate([6.0, -4.0, -3.5]):
        write_run(res, "cfcql", "mpe-pp", "random", seed, score)
    checks = tmp_path / "leaderboard" / "official"
    put(checks, check(0, -3.0, return_mean=-9.5))
    put(checks, check(1, 50.0, finished_at="2026-11-27T20:00:00Z"))
    put(checks, check(1, -2.0, return_mean=-8.5, finished_at="2026-11-27T23:00:00Z"))  # a rerun: the newest counts
    put(checks, check(0, 70.0, code="omar", task="mpe-cn", tier="expert"))  # no run of ours there
    put(checks, {**check(0, 9.0, code="omar"), "dataset_sha256": "cd" * 32})  # another build than our runs'
    for seed, score in enumerate([3.0, 4.0, 5.0]):
        write_run(res, "omar", "mpe-pp", "random", seed, score)
        write_run(res, "macql", "mpe-pp", "random", seed, score + 10.0)
    put(checks, check(0, 1.5, code="macql"))  # the CFCQL repository's code run as MACQL: beside our MACQL
    built = build(res, tmp_path / "site", now=NOW, bootstrap_reps=50, poi_reps=20)
    assert built.skipped == []
    text = " ".join(built.index.read_text().split())
    section = text[text.index('id="official"'):text.index("Coverage of the paper's rows")]
    # the list is in the board's default view: final policy, the paper's reference returns (PP: 185.6 / -4.1)
    off = [100 * (r + 4.1) / (185.6 + 4.1) for r in (-9.5, -8.5)]
    mine = [100 * (r + 4.1) / (185.6 + 4.1) for r in (6.0, -4.0, -3.5)]
    assert ('CFCQL · mpe-pp · random</th> <td><code>thu-rllab/CFCQL@3441019000000000000000000000000000000000</code></td> '
            f'<td class="num">{np.mean(off):.1f} ± {np.std(off, ddof=1):.1f} <span class="meta-inline">n=2</span></td> '
            f'<td class="num">{off[0]:.1f}, {off[1]:.1f}</td>') in section
    assert f"{np.mean(mine):.1f} ± {np.std(mine, ddof=1):.1f}</a>" in section  # our cell beside it
    assert "OMAR · mpe-cn · expert" in section and "not run" in section
    rows = json.loads((tmp_path / "site" / "tables" / "comparisons.json").read_text())["rows"]
    ours = {r["view"]: r for r in rows if (r["algo"], r["task"], r["dataset"]) == ("cfcql", "mpe-pp", "random")}
    assert ours["final-ours"]["official_n"] == 2 and ours["final-ours"]["official_mean"] == pytest.approx(-2.5)
    assert ours["final-ours"]["verdict"] == "below"  # the verdict is ours against the paper, as without the check
    assert ours["final-omar"]["official_mean"] is not None and ours["final-omar"]["official_mean"] != pytest.approx(-2.5)
    assert ours["last10-ours"]["official_n"] is None  # the official loop's curve is not comparable
    omar = next(r for r in rows if (r["view"], r["algo"], r["task"], r["dataset"]) == ("final-ours", "omar", "mpe-pp", "random"))
    assert omar["official_n"] is None  # trained on another build of the dataset: not beside our cell
    macql = next(r for r in rows if (r["view"], r["algo"], r["task"], r["dataset"]) == ("final-ours", "macql", "mpe-pp", "random"))
    assert (macql["official_n"], macql["official_mean"]) == (1, pytest.approx(1.5))
    assert macql["official_code"].startswith("thu-rllab/CFCQL@") and "MACQL · mpe-pp · random" in section
    assert "OMAR · mpe-pp · random" in section and "(another build of the dataset: not compared)" in section
    # a damaged check is in no number and is listed like a damaged run (--strict fails on it)
    (checks / "paper" / "cfcql" / "mpe-pp" / "random" / "seed0.json").write_text("{}")
    built = build(res, tmp_path / "site2", now=NOW, bootstrap_reps=50, poi_reps=20)
    assert [s.path for s in built.skipped] == ["official/paper/cfcql/mpe-pp/random/seed0.json"]
    assert "field 'schema' missing" in built.skipped[0].reason
    text = " ".join(built.index.read_text().split())
    section = text[text.index('id="official"'):text.index("Coverage of the paper's rows")]
    assert f'n=1</span></td> <td class="num">{off[1]:.1f}</td>' in section  # seed 1 alone is left

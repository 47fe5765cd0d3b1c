"""The one result schema (suite/core/schema.py): RunRecord round trip, consistency checks, location
checks, scanning and --strict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lb_fixtures import final_record, run_dir, write_run
from plcql_bench.suite.core.schema import (DamagedResults, RecordError, RunRecord, check_location, curve_from_metrics,
                                      enforce_strict, read_record, run_key_of, scan_records)

COMMITTED = Path(__file__).resolve().parents[1] / "leaderboard" / "results"


def test_committed_results_round_trip_and_pass_every_check():
    """Every committed record, on the board (leaderboard/results) and in the v1 generation's archive."""
    roots = [COMMITTED, COMMITTED.parent / "archive" / "datasets-v1" / "results"]
    tasks = {f.relative_to(root).parts[2] for root in roots for f in root.rglob("final.json")}
    assert "mpe-cn" in tasks and "smax-2s3z" in tasks, tasks  # both kinds of record are checked
    for root in roots:
        files = sorted(root.rglob("final.json"))
        for f in files:
            raw = json.loads(f.read_text())
            if "curve" not in raw:  # published compact: the metrics beside it hold the curve (campaign._without_curve)
                raw["curve"] = curve_from_metrics(f.parent)
                assert raw["curve"], f
            rec = read_record(f)
            assert rec.to_json() == raw, f  # nothing lost or added
            check_location(rec, f.relative_to(root).as_posix())
        good, bad = scan_records(root)
        assert bad == [] and len(good) == len(files)


def test_runner_identity_hash_is_the_schema_key():
    rec = final_record("plcql", "mpe-cn", "expert", 3, 50.0)
    ident = {k: rec[k] for k in ("algo", "config", "task", "dataset", "dataset_sha256", "seed", "profile", "budget", "protocol_version")}
    assert RunRecord.from_json(rec).run_key == run_key_of(ident)
    assert RunRecord.from_json(rec).identity() == ident


@pytest.mark.parametrize("change, field", [
    ({"score": 1e9}, "differs from final_eval.normalised_score"),
    ({"score": float("nan")}, "finite"),
    ({"score": True}, "finite"),
    ({"seed": "0"}, "seed"),
    ({"status": "failed"}, "status"),
    ({"schema_version": 7}, "schema_version"),
    ({"algo": ""}, "'algo'"),
    ({"score_name": "elo"}, "score_name"),
    ({"curve": [{"update": 0, "score": float("inf")}]}, "curve[0].score"),
    ({"warnings": "collapsed"}, "warnings"),
])
def test_invalid_records_name_the_field(change, field):
    rec = {**final_record("plcql", "mpe-cn", "expert", 0, 50.0), **change}
    with pytest.raises(RecordError, match=field.replace("[", r"\[").replace("]", r"\]")):
        RunRecord.from_json(rec)


def test_episode_returns_must_average_to_the_return_mean():
    rec = final_record("plcql", "mpe-cn", "expert", 0, 50.0)
    rec["final_eval"]["return_mean"] = 51.0
    with pytest.raises(RecordError, match="return_mean"):
        RunRecord.from_json(rec)


def test_win_rate_must_match_and_lie_in_0_1():
    rec = final_record("bc", "smax-2s3z", "medium", 0, 0.5)
    assert RunRecord.from_json(rec).is_win_rate
    with pytest.raises(RecordError, match=r"outside \[0, 1\]"):
        RunRecord.from_json({**rec, "score": 1.5})
    rec["final_eval"]["win_rate"] = 0.25
    with pytest.raises(RecordError, match="final_eval.win_rate"):
        RunRecord.from_json(rec)


def test_edited_identity_breaks_the_run_key():
    rec = final_record("plcql", "mpe-cn", "expert", 0, 50.0)
    rec["config"]["lr"] = 0.5  # same key, other content
    with pytest.raises(RecordError, match="run_key"):
        RunRecord.from_json(rec)


def test_location_must_match_seed_key_and_cell():
    rec = RunRecord.from_json(final_record("plcql", "mpe-cn", "expert", 2, 50.0))
    good = run_dir(Path("."), rec.to_json()).as_posix() + "/final.json"
    check_location(rec, good)
    check_location(rec, "hand/made/folder/final.json")  # outside the runner's layout: nothing to check
    with pytest.raises(RecordError, match="does not match its directory"):
        check_location(rec, good.replace(f"-{rec.run_key[:10]}", "-0123456789"))
    with pytest.raises(RecordError, match="seed 2 does not match"):
        check_location(rec, good.replace("seed2-", "seed1-"))
    with pytest.raises(RecordError, match="filed under"):
        check_location(rec, good.replace("/plcql/", "/cfcql/"))


def test_scan_and_strict(tmp_path):
    write_run(tmp_path, "plcql", "mpe-cn", "expert", 0, 50.0)
    d = write_run(tmp_path, "plcql", "mpe-cn", "expert", 1, 60.0)
    (d / "final.json").write_text((d / "final.json").read_text()[:200])  # truncated
    good, bad = scan_records(tmp_path)
    assert len(good) == 1 and len(bad) == 1 and "invalid JSON" in bad[0].reason
    enforce_strict(bad, strict=False)  # non-strict: no error
    lines = []
    with pytest.raises(DamagedResults, match="1 result file skipped"):
        enforce_strict(bad, strict=True, echo=lines.append)
    assert lines == [f"skipped {bad[0].path}: {bad[0].reason}"]
    enforce_strict([], strict=True)


def test_optional_fields_kept_and_omitted():
    rec = final_record("plcql", "mpe-cn", "expert", 0, 50.0, warnings=["PAR collapsed to k = 3"],
                       par_collapse={"k": 3, "entropy": 0.001, "p_k": 0.99}, futurefield=[1, 2])
    r = RunRecord.from_json(rec)
    assert r.warnings == ("PAR collapsed to k = 3",) and r.par_collapse["k"] == 3
    assert r.to_json() == rec  # unknown keys survive
    plain = final_record("plcql", "mpe-cn", "expert", 0, 50.0, par_collapse=None, warnings=[])
    assert "par_collapse" not in RunRecord.from_json(plain).to_json()


def test_runner_validates_before_writing_and_records_hardware():
    from plcql_bench.suite.runs.runner import _validated

    out = _validated(final_record("plcql", "mpe-cn", "expert", 0, 50.0), "cpu")
    assert out["hardware"]["device"] == "cpu" and out["hardware"]["cpu_count"] >= 1
    with pytest.raises(RecordError, match="differs"):
        _validated(final_record("plcql", "mpe-cn", "expert", 0, 50.0) | {"score": 1e9}, "cpu")


def test_metrics_rows_keep_float32_digits_and_the_curve_point_exactly():
    """Training and diagnostic values are stored at float32 precision in the fewest digits that give the
    same float32 back; the curve point (update, return_mean, score) is kept as evaluated."""
    import numpy as np

    from plcql_bench.suite.core.schema import compact_metrics_row, compact_metrics_text, float32_digits

    f32 = float(np.float32(0.1))  # what tensor.item() returns: 0.10000000149011612
    assert float32_digits(f32) == 0.1 and float32_digits(203.57684478759765) == 203.57684
    for v in (f32, 203.57684478759765, 4.435069472719988e-05, -1e-40, 3e38, 123456789.0):
        short = float32_digits(v)
        assert np.float32(short) == np.float32(v)  # the same float32 ...
        assert len(repr(short).lstrip("-").replace(".", "").split("e")[0].strip("0")) <= 9  # ... in ≤ 9 digits
        assert float32_digits(short) == short  # idempotent
    for v in (float("inf"), float("nan"), 1e300, 7, None, True, "x"):  # left as they are
        assert float32_digits(v) is v
    row = {"update": 10, "return_mean": 164.0269636154175, "score": 4.281438287909321,
           "train/critic/loss": 497.1030450439454, "diag/p_k1": 7.164431008277461e-05}
    out = compact_metrics_row(row)
    assert {k: out[k] for k in ("update", "return_mean", "score")} == {k: row[k] for k in ("update", "return_mean", "score")}
    assert out["train/critic/loss"] == 497.10306 and out["diag/p_k1"] == 7.164431e-05
    text = json.dumps(row, sort_keys=True) + "\nnot json\n"
    once = compact_metrics_text(text)
    assert once.splitlines()[1] == "not json" and json.loads(once.splitlines()[0]) == out
    assert compact_metrics_text(once) == once and len(once) < len(text)

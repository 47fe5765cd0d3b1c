"""`run`/`all --log tensorboard|wandb` (suite/runs/tracking.py): the trackers get every value metrics.jsonl holds,
at its round, plus the final evaluation, with the run key and config; read back with TensorBoard's own event
reader and from W&B's offline run directory. metrics.jsonl stays the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plcql_bench.suite.core.errors import BenchError
from cli_main import run_cli

PROFILE = """
name: trackertest
description: tracker tests
datasets: {episodes: {default: 6}}
train: {updates: {default: 6}, eval_every: 1, eval_episodes: 1, final_eval_episodes: 2, checkpoint_every: 2}
matrix: {algos: [bc, cfcql], tasks: [mpe-cn], tiers: [random], seeds: [0]}
algo_overrides: {batch_size: 32, hidden: 32}
"""


@pytest.fixture
def setup(tmp_path, monkeypatch):
    for var in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    (tmp_path / "p.yaml").write_text(PROFILE)
    return tmp_path, ["--data-dir", str(tmp_path / "data"), "--results-dir", str(tmp_path / "res")]


def _run_dir(tmp_path, algo: str) -> Path:
    (found,) = (tmp_path / "res" / "trackertest" / algo / "mpe-cn" / "random").glob("seed0-*")
    return found


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _expected(run_dir: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}}: every number of metrics.jsonl at its update, and final.json's final/*."""
    out: dict[str, dict[int, float]] = {}
    for row in _metrics(run_dir):
        for key, value in row.items():
            if key != "update" and isinstance(value, (int, float)):
                out.setdefault(key, {})[row["update"]] = value
    final = json.loads((run_dir / "final.json").read_text())
    last = final["train"]["updates"]
    out["final/score"] = {last: final["score"]}
    for key in ("return_mean", "return_std", "normalised_score"):
        out[f"final/{key}"] = {last: final["final_eval"][key]}
    return out


def _tensorboard(run_dir: Path) -> tuple[dict[str, dict[int, float]], str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    scalars = {}
    for tag in events.Tags()["scalars"]:
        points = events.Scalars(tag)
        assert len({p.step for p in points}) == len(points), f"{tag}: a step logged twice"
        scalars[tag] = {p.step: p.value for p in points}
    text = events.Tensors("run/text_summary")[-1].tensor_proto.string_val[0].decode()
    return scalars, text


def _wandb_records(path: Path):
    """The records of a W&B transaction log (.wandb): a 7-byte header, then LevelDB-log chunks in 32 KiB
    blocks, each a W&B Record protobuf (wandb.proto)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, chunk, block = 7, b"", 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            rec = pb.Record()
            rec.ParseFromString(chunk)
            chunk = b""
            yield rec


def _close(got: dict[str, dict[int, float]], want: dict[str, dict[int, float]]) -> None:
    assert set(got) == set(want)
    for tag, points in want.items():
        assert set(got[tag]) == set(points), tag
        for step, value in points.items():
            assert got[tag][step] == pytest.approx(value, rel=1e-6, abs=1e-7), (tag, step)


def test_tensorboard_mirrors_metrics_and_a_resume_purges_what_the_crash_left(setup, monkeypatch, capsys):
    pytest.importorskip("tensorboard")
    tmp_path, base = setup
    from plcql_bench.algorithms.bc import BC

    real, calls = BC.update, {"n": 0}

    def crash_in_round_4(self, sample):
        calls["n"] += 1
        if calls["n"] == 4:  # after the checkpoint at 2 and the points at 3 logged: those must go
            raise RuntimeError("crash")
        return real(self, sample)

    run = ["run", "--algo", "bc", "--task", "mpe-cn", "--dataset", "random", "--profile", str(tmp_path / "p.yaml"),
           "--log", "tensorboard"]
    assert run_cli(monkeypatch, capsys, *base, "datasets", "build", "mpe-cn", "random", "--profile",
                   str(tmp_path / "p.yaml"))[0] == 0
    monkeypatch.setattr(BC, "update", crash_in_round_4)
    code, _, err = run_cli(monkeypatch, capsys, *base, *run)
    assert code == 1 and "crash" in err, err
    run_dir = _run_dir(tmp_path, "bc")
    crashed, _ = _tensorboard(run_dir)
    assert sorted(crashed["score"]) == [0, 1, 2, 3]  # logged beyond the checkpoint at 2
    monkeypatch.setattr(BC, "update", real)
    code, out, err = run_cli(monkeypatch, capsys, *base, *run)
    assert code == 0, err
    scalars, text = _tensorboard(run_dir)
    _close(scalars, _expected(run_dir))  # every value once, the resumed run's (the record's)
    assert any(k.startswith("train/") for k in scalars)
    identity = json.loads(text.removeprefix("```json\n").removesuffix("\n```"))
    assert identity == json.loads((run_dir / "config.json").read_text())  # run key, algorithm, config, ...


def test_wandb_offline_run_holds_the_metrics_key_and_config(setup, monkeypatch, capsys):
    pytest.importorskip("wandb")
    tmp_path, base = setup
    code, out, err = run_cli(monkeypatch, capsys, *base, "all", "--profile", str(tmp_path / "p.yaml"),
                             "--log", "wandb", "--log", "tensorboard", "--jobs", "2")
    assert code == 0, out + err
    for algo in ("bc", "cfcql"):
        run_dir = _run_dir(tmp_path, algo)
        identity = json.loads((run_dir / "config.json").read_text())
        (log,) = (run_dir / "wandb").glob(f"offline-run-*-{identity['run_key']}/run-{identity['run_key']}.wandb")
        history: dict[str, dict[int, float]] = {}
        run = None
        for rec in _wandb_records(log):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                run = rec.run
            elif kind == "history":
                step = rec.history.step.num
                for item in rec.history.item:
                    key = item.key or "/".join(item.nested_key)  # W&B stores some keys split at "/"
                    if not key.startswith("_"):
                        history.setdefault(key, {})[step] = json.loads(item.value_json)
        _close(history, _expected(run_dir))
        assert run.run_id == identity["run_key"] and run.project == "plcql-bench"
        assert run.display_name == f"{algo}/mpe-cn/random/seed0"
        config = {item.key: json.loads(item.value_json) for item in run.config.update if item.key != "_wandb"}
        assert config == identity
        _close(_tensorboard(run_dir)[0], _expected(run_dir))  # both trackers at once


def test_a_failing_tracker_leaves_the_run_and_its_record_whole(setup, monkeypatch, capsys):
    pytest.importorskip("tensorboard")
    tmp_path, base = setup
    from plcql_bench.suite.runs import tracking

    def broken(self, values, step):
        raise OSError("disk full")

    monkeypatch.setattr(tracking._TensorBoard, "scalars", broken)
    assert run_cli(monkeypatch, capsys, *base, "datasets", "build", "mpe-cn", "random", "--profile",
                   str(tmp_path / "p.yaml"))[0] == 0
    code, _, err = run_cli(monkeypatch, capsys, *base, "run", "--algo", "bc", "--task", "mpe-cn", "--dataset", "random",
                           "--profile", str(tmp_path / "p.yaml"), "--log", "tensorboard")
    assert code == 0, err
    run_dir = _run_dir(tmp_path, "bc")
    assert [row["update"] for row in _metrics(run_dir)] == list(range(7)) and (run_dir / "final.json").exists()
    assert "warning: --log tensorboard failed and is off for this run: OSError: disk full" in (run_dir / "run.log").read_text()


def test_a_tracker_that_is_not_installed_is_a_user_error(setup, monkeypatch, capsys):
    tmp_path, base = setup
    import importlib.util

    from plcql_bench.suite.runs.tracking import check_available

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(BenchError, match=r"--log wandb needs the wandb package: pip install 'plcql-bench\[wandb\]'"):
        check_available(["wandb"])
    code, _, err = run_cli(monkeypatch, capsys, *base, "all", "--profile", str(tmp_path / "p.yaml"), "--log", "wandb")
    assert code == 2 and err.count("\n") == 1 and "plcql-bench[wandb]" in err
    assert not (tmp_path / "res").exists() and not (tmp_path / "data").exists()

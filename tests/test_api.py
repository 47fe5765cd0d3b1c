"""The Python API (suite/runs/api.py): docs/python-api.md's example runs as written, and what it prints and
returns is the suite's own data and results."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _example() -> str:
    text = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1
    return blocks[0]


def test_the_documented_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default folders: data/ and results/ here
    monkeypatch.delenv("PLCQL_DATA_DIR", raising=False)
    monkeypatch.delenv("PLCQL_RESULTS_DIR", raising=False)
    scope: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_example(), "docs/python-api.md", "exec"), scope)
    printed = out.getvalue()
    data, batch, final, runs, curves = (scope[k] for k in ("data", "batch", "final", "runs", "curves"))

    # the tier is the one the runner trains on, and the tensors are its arrays
    from plcql_bench.datasets.manifest import read_manifest

    assert data.sha256 == read_manifest(tmp_path / "data" / "smoke")["mpe-cn/random"]["sha256"]
    assert data.n_transitions == 1000 and data.attrs["task_id"] == "mpe-cn" and data.attrs["quality"] == "random"
    assert set(batch) == set(data.arrays)
    for name, array in data.arrays.items():
        assert np.array_equal(batch[name].numpy(), array), name
    # the run is the CLI's: its final.json in the results folder, with the override in its config
    finals = list((tmp_path / "results" / "smoke" / "bc" / "mpe-cn" / "random").glob("seed0-*/final.json"))
    assert len(finals) == 1 and json.loads(finals[0].read_text())["run_key"] == final["run_key"]
    assert final["config"]["batch_size"] == 64
    # the frames hold it
    assert len(runs) == 1 and runs.loc[0, "run_key"] == final["run_key"] and runs.loc[0, "score"] == final["score"]
    scores = curves[curves.metric == "score"].sort_values("step")
    assert list(scores.step) == [p["update"] for p in final["curve"]]
    assert list(scores.value) == [p["score"] for p in final["curve"]]
    assert f"score {round(final['score'], 2)} run {final['run_key'][:10]}" in printed
    assert "1000 transitions:" in printed

    # a second call reads the finished run back instead of training it again
    from plcql_bench.suite.runs import api

    again = api.train("bc", "mpe-cn", "random", seed=0, profile="smoke", overrides={"batch_size": 64})
    assert again == json.loads(finals[0].read_text())


def test_bad_input_is_one_line(tmp_path):
    from plcql_bench.suite.runs import api
    from plcql_bench.suite.core.errors import BenchError

    with pytest.raises(BenchError, match="unknown dataset tier 'expret' for mpe-cn"):
        api.load_dataset("mpe-cn", "expret", data=tmp_path)
    with pytest.raises(BenchError, match="unknown algorithm 'bcc'"):
        api.train("bcc", "mpe-cn", "random", data=tmp_path, results=tmp_path / "r")
    assert not (tmp_path / "smoke").exists()  # nothing built for a bad call
    with pytest.raises(BenchError, match="results directory not found"):
        api.results_frame(tmp_path / "nowhere")
    with pytest.raises(BenchError, match="not built"):
        api.load_dataset("mpe-cn", "random", data=tmp_path, build=False)

"""A run checkpointed on one kind of device and resumed on another (a GPU loan's run finished on a CPU):
the generator states that cannot carry over are re-derived deterministically, and the result records
where the run trained (train.devices)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from crash import interrupt_on_call
from unit_runs import profile_with_dataset
import torch

from plcql_bench.algorithms.common.checkpoint import restore_generator
from plcql_bench.suite.runs import runner
from plcql_bench.suite.runs.runner import Cell, execute, plan_run

CUDA_STATE = torch.arange(16, dtype=torch.uint8)  # the shape of a CUDA (Philox) generator's state


def _draws(g: torch.Generator) -> torch.Tensor:
    return torch.rand(5, generator=g)


def test_restore_generator_same_kind_continues_bitwise():
    g = torch.Generator().manual_seed(3)
    saved = g.get_state()
    expected = _draws(g)
    h = torch.Generator().manual_seed(99)
    assert restore_generator(h, saved) is True
    assert torch.equal(_draws(h), expected)


def test_restore_generator_foreign_state_is_reseeded_deterministically():
    a, b = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    assert restore_generator(a, CUDA_STATE) is False
    assert restore_generator(b, CUDA_STATE) is False
    assert torch.equal(_draws(a), _draws(b))  # the same checkpoint resumes the same way
    c = torch.Generator()
    restore_generator(c, CUDA_STATE.flip(0))
    d = torch.Generator()
    restore_generator(d, CUDA_STATE)
    assert not torch.equal(_draws(c), _draws(d))  # derived from the saved state, not a constant


def test_restore_generator_damaged_state_of_the_right_size_is_an_error():
    g = torch.Generator()
    bad = torch.full_like(g.get_state(), 255)
    with pytest.raises(RuntimeError):
        restore_generator(g, bad)


PROFILE = """
name: unit
description: device-change resume tests
datasets: {episodes: {default: 6}}
train: {updates: {default: 6}, eval_every: 2, eval_episodes: 2, final_eval_episodes: 2, checkpoint_every: 2}
matrix: {algos: [cfcql], tasks: [mpe-cn], tiers: [random], seeds: [0]}
algo_overrides: {batch_size: 64}
"""


@pytest.fixture()
def interrupted(tmp_path: Path, monkeypatch):
    """A CFCQL run interrupted after its checkpoint at update 4."""
    _, profile = profile_with_dataset(tmp_path, PROFILE)
    plan = plan_run(Cell("cfcql", "mpe-cn", "random", 0), profile, tmp_path / "data", tmp_path / "results", {})
    cls = runner.get_algorithm("cfcql")
    real_update = interrupt_on_call(monkeypatch, cls, "update", 5, "simulated stop")
    with pytest.raises(KeyboardInterrupt):
        execute(plan, log=lambda *_: None)
    monkeypatch.setattr(cls, "update", real_update)
    return plan


def _rewrite_checkpoint(plan, edit) -> None:
    path = plan.run_dir / "ckpt.pt"
    payload = torch.load(path, weights_only=False)
    edit(payload)
    buf = io.BytesIO()
    torch.save(payload, buf)
    path.write_bytes(buf.getvalue())


def _as_if_written_on_cuda(payload, devices=True):
    payload["algo"]["gen"] = CUDA_STATE.clone()
    if devices:
        payload["state"]["devices"] = [{"from_update": 0, "device": "cuda:0"}]
    else:  # a checkpoint from before `devices` was recorded
        payload["state"].pop("devices", None)


def test_same_device_resume_records_no_device_change(interrupted):
    result = execute(interrupted, log=lambda *_: None)
    assert "devices" not in result["train"]


def test_run_resumed_from_a_gpu_checkpoint_finishes_and_records_both_devices(interrupted):
    _rewrite_checkpoint(interrupted, _as_if_written_on_cuda)
    logs: list[str] = []
    result = execute(interrupted, log=logs.append)
    assert result["status"] == "done"
    assert result["train"]["devices"] == [{"from_update": 0, "device": "cuda:0"},
                                          {"from_update": 4, "device": "cpu"}]
    assert any("written on cuda:0" in line and "gen" in line for line in logs)
    final = json.loads(interrupted.final_path.read_text())
    assert final["train"]["devices"][1] == {"from_update": 4, "device": "cpu"}


def test_legacy_gpu_checkpoint_is_recognised_by_its_generator_state(interrupted):
    _rewrite_checkpoint(interrupted, lambda p: _as_if_written_on_cuda(p, devices=False))
    result = execute(interrupted, log=lambda *_: None)
    assert result["train"]["devices"] == [{"from_update": 0, "device": "cuda (inferred)"},
                                          {"from_update": 4, "device": "cpu"}]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU loan)")
@pytest.mark.parametrize("algo", ["cfcql", "plcql"])
def test_cpu_checkpoint_finishes_on_cuda_and_records_both_devices(tmp_path: Path, monkeypatch, algo):
    """The other direction, for real: a run interrupted on the CPU resumes on the GPU (its CPU generator
    states re-derived for CUDA) and finishes with both devices recorded."""
    _, profile = profile_with_dataset(tmp_path, PROFILE)
    plan = plan_run(Cell(algo, "mpe-cn", "random", 0), profile, tmp_path / "data", tmp_path / "results", {})
    cls = runner.get_algorithm(algo)
    real_update = interrupt_on_call(monkeypatch, cls, "update", 5, "simulated stop")
    with pytest.raises(KeyboardInterrupt):
        execute(plan, device="cpu", log=lambda *_: None)
    monkeypatch.setattr(cls, "update", real_update)
    logs: list[str] = []
    result = execute(plan, device="cuda", log=logs.append)
    assert result["status"] == "done"
    assert result["train"]["devices"] == [{"from_update": 0, "device": "cpu"},
                                          {"from_update": 4, "device": "cuda"}]
    assert any("written on cpu" in line for line in logs)


def test_board_provenance_names_both_devices():
    from types import SimpleNamespace

    from plcql_bench.leaderboard.provenance import _hardware

    hw = {"device": "cpu", "cpu": "EPYC", "torch_threads": 1}
    moved = SimpleNamespace(hardware=hw, train={"devices": [{"from_update": 0, "device": "cuda:0"},
                                                            {"from_update": 1000, "device": "cpu"}]},
                            versions={})
    assert _hardware(moved) == ("cpu: EPYC, 1 torch thread(s) (resumed across devices: cuda:0 from update 0; "
                                "cpu from update 1000)")
    assert _hardware(SimpleNamespace(hardware=hw, train={}, versions={})) == "cpu: EPYC, 1 torch thread(s)"

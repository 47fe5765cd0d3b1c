"""docs/algorithms/ADDING.md, walked with its toy algorithm: the file (the code block read from the doc)
dropped into the algorithms package registers itself, its YAML table supplies the per-task values, a
FIELD_RULES entry bounds its own field, and the runner trains, evaluates and resumes it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

import plcql_bench.algorithms as algorithms_pkg
from plcql_bench.algorithms import base
from plcql_bench.algorithms.common import configs
from plcql_bench.datasets.build import build_dataset
from plcql_bench.suite.core import validate
from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.runs.profiles import load_profile
from plcql_bench.suite.runs.runner import Cell, execute, plan_run, resolve_config
from plcql_bench.suite.envs.tasks import get_task

ADDING = Path(__file__).resolve().parent.parent / "docs" / "algorithms" / "ADDING.md"
PROFILE = """
name: toy
description: ADDING.md walk-through
datasets: {episodes: {default: 6}}
train: {updates: {default: 4}, eval_every: 2, eval_episodes: 1, final_eval_episodes: 2, checkpoint_every: 2}
matrix: {algos: [toy], tasks: [mpe-cn], tiers: [random], seeds: [0]}
"""


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", ADDING.read_text(encoding="utf-8"), re.S)


@pytest.fixture
def toy_package(tmp_path, monkeypatch):
    """The toy's file and table in a folder added to the algorithms package; the registry and the
    table cache as they were afterwards."""
    base.load_all()  # the suite's own registered before saving: a module imported once never registers again
    (tmp_path / "algos").mkdir()
    (tmp_path / "algos" / "toy.py").write_text(blocks("python")[0])
    cfg_dir = tmp_path / "configs"
    cfg_dir.mkdir()
    for table in configs.CONFIG_DIR.glob("*.yaml"):
        (cfg_dir / table.name).write_text(table.read_text())
    (cfg_dir / "toy.yaml").write_text(blocks("yaml")[0])
    monkeypatch.setattr(algorithms_pkg, "__path__", [*algorithms_pkg.__path__, str(tmp_path / "algos")])
    monkeypatch.setattr(configs, "CONFIG_DIR", cfg_dir)
    monkeypatch.setitem(validate.FIELD_RULES, "toy_weight", validate.Rule(lambda v: v > 0, "> 0"))
    saved = dict(base.REGISTRY), {k: dict(v) for k, v in base.IMPLEMENTATIONS.items()}
    configs.load_table.cache_clear()
    try:
        yield tmp_path
    finally:
        base.REGISTRY.clear()
        base.REGISTRY.update(saved[0])
        for k, v in saved[1].items():
            base.IMPLEMENTATIONS[k].clear()
            base.IMPLEMENTATIONS[k].update(v)
        sys.modules.pop("plcql_bench.algorithms.toy", None)
        configs.load_table.cache_clear()


def test_adding_md_walkthrough(toy_package):
    tmp = toy_package
    # step 4: the new file registers itself
    assert "toy" in base.algorithm_modules() and "toy" in base.load_all()
    cls = base.get_algorithm("toy", discrete=False)
    # step 2: the per-task value comes from the table, the rest from the Config defaults
    spec = get_task("mpe-cn").spec
    assert cls.task_overrides(spec, "random") == {"hidden": 32}
    (tmp / "p.yaml").write_text(PROFILE)
    profile = load_profile(str(tmp / "p.yaml"))
    cell = Cell("toy", "mpe-cn", "random", 0)
    assert resolve_config(cell, profile).hidden == 32
    # step 3: the toy's own field is range-checked with one line naming the flag and the field
    with pytest.raises(BenchError, match=r"--set: toy_weight: must be > 0, got -1"):
        resolve_config(cell, profile, {"toy_weight": -1})
    # step 1: the protocol; the runner trains, evaluates, checkpoints and resumes it
    build_dataset("mpe-cn", "random", 6, tmp / "data" / profile.name, profile=profile.name)
    plan = plan_run(cell, profile, tmp / "data", tmp / "results")
    result = execute(plan, log=lambda *_: None)
    assert result["algo"] == "toy" and result["train"]["updates"] == 4 and len(result["curve"]) == 3
    assert execute(plan, log=lambda *_: None) == result  # done: a second call trains nothing
    algo = cls(spec, base.make_config(cls, {"hidden": 8}), 0)
    state = algo.state_dict()
    again = cls(spec, base.make_config(cls, {"hidden": 8}), 1)
    again.load_state_dict(state)
    obs = torch.randn(4, spec.n_agents, spec.obs_dim).numpy()
    assert (algo.act(obs) == again.act(obs)).all()


def test_the_registry_is_restored_after_the_walkthrough():
    assert "toy" not in base.load_all() and "plcql_bench.algorithms.toy" not in sys.modules

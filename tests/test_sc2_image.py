"""What the StarCraft II image adds to the suite, checked without SC2: the smac-* tasks are
registered only under PLCQL_SMAC_TASKS=1, its smoke profile resolves, and its smoke script plays
an episode per map through the adapter (against the fake SMAC env of test_smac_adapter)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_smac_adapter import FakeSC2

from plcql_bench.suite.envs import tasks
from plcql_bench.suite.envs import smac
from plcql_bench.suite.commands.main import cli

ROOT = Path(__file__).resolve().parent.parent
SMAC_IDS = ["smac-2s3z", "smac-3s_vs_5z", "smac-5m_vs_6m", "smac-6h_vs_8z"]


def _smoke_module():
    spec = importlib.util.spec_from_file_location("sc2_smoke", ROOT / "containers" / "sc2_smoke.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_smac_tasks_only_with_the_image_flag(monkeypatch):
    monkeypatch.delenv(tasks.SMAC_TASKS_ENV, raising=False)
    assert not set(SMAC_IDS) & set(tasks.task_ids())
    with pytest.raises(tasks.UnknownTaskError, match="unknown task 'smac-2s3z'"):
        tasks.get_task("smac-2s3z")
    monkeypatch.setenv(tasks.SMAC_TASKS_ENV, "1")
    assert set(SMAC_IDS) <= set(tasks.task_ids())
    spec = tasks.get_task("smac-3s_vs_5z").spec  # builds the spec without importing smac
    assert (spec.task_id, spec.n_agents, spec.discrete) == ("smac-3s_vs_5z", 3, True)


def test_sc2_smoke_profile_resolves_every_cell(monkeypatch, tmp_path):
    monkeypatch.setenv(tasks.SMAC_TASKS_ENV, "1")
    res = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "d"), "--results-dir", str(tmp_path / "r"),
                                   "plan", "--profile", str(ROOT / "containers" / "sc2-smoke.yaml")])
    assert res.exit_code == 0, res.output
    assert "12 cells" in res.output and "do not resolve" not in res.output
    assert all(t in res.output for t in SMAC_IDS)


def test_sc2_smoke_script_plays_each_map(capsys):
    smoke = _smoke_module()
    made = []

    def factory(map_name, seed, **smac_kwargs):  # the adapter passes SMAC_KWARGS (difficulty, ...)
        made.append(FakeSC2(map_name, seed, ends=((4, True, False),), **smac_kwargs))
        return made[-1]

    assert smoke.main(list(smoke.MAPS), factory) == 0
    out = capsys.readouterr().out
    assert "SC2-SMOKE OK" in out and out.count(": ok, 4 steps") == 4
    assert all(env.closed for env in made) and len(made) == 4
    # the suite's SMAC settings reach SC2 (FakeSC2 keeps continuing_episode apart)
    assert all({**env.kwargs, "continuing_episode": env.continuing_episode} == smac.SMAC_KWARGS for env in made)
    for env in made:  # only available actions were sent
        assert all(a < 6 for acts in env.steps_taken[1::2] for a in acts)


def test_sc2_smoke_script_fails_on_a_broken_map(capsys):
    smoke = _smoke_module()

    def factory(map_name, seed, **smac_kwargs):
        return FakeSC2(map_name, seed, shapes=(1, 2, 3, 4), **smac_kwargs)  # wrong shapes: the adapter refuses

    assert smoke.main(["2s3z"], factory) == 1
    assert "SC2-SMOKE FAILED (1 of 1 maps)" in capsys.readouterr().out

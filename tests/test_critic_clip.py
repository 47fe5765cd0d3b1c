"""critic_clip: the critic ensemble's gradient norm clipped once over all members ("joint", the
references' clip of their twin critic, CFCQL's and MACQL's default) or per member ("per-member", the
default of the 10-member ensembles PLCQL and SPaCQL); and the field is key-neutral at "joint" (runs
finished before it existed keep their run keys)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from plcql_bench.algorithms.base import get_algorithm, identity_config, make_config
from plcql_bench.suite.core.schema import run_key_of
from plcql_bench.suite.envs.tasks import get_task

SPEC = get_task("mpe-cn").spec


def _with_grads(clip: str, norms: list[float]):
    """A 2-member CFCQL critic whose gradient is member j's unit direction times norms[j]."""
    cls = get_algorithm("cfcql", discrete=False)
    algo = cls(SPEC, make_config(cls, {"critic_clip": clip, "grad_clip": 0.5}), 0)
    params = list(algo.critic.parameters())
    total = sum(p[0].numel() for p in params)
    for p in params:  # every entry of member j equal, so member j's norm is norms[j]
        p.grad = torch.stack([torch.full_like(p[j], n / total ** 0.5) for j, n in enumerate(norms)])
    return algo, params


def _member_norms(params) -> list[float]:
    return [float(torch.stack([p.grad[j].norm() for p in params]).norm()) for j in range(2)]


@pytest.mark.parametrize("clip, want", [("per-member", [0.5, 0.1]),  # the big member alone is scaled
                                        ("joint", [3.0 * 0.5 / 3.0017, 0.1 * 0.5 / 3.0017])])  # both, by one factor
def test_critic_step_clips_as_configured(clip, want, monkeypatch):
    algo, params = _with_grads(clip, [3.0, 0.1])
    monkeypatch.setattr(torch.Tensor, "backward", lambda self, *a, **k: None)  # keep the hand-set gradients
    monkeypatch.setattr(algo.critic_opt, "step", lambda: None)
    monkeypatch.setattr(algo.critic_opt, "zero_grad", lambda set_to_none=True: None)
    gn = algo.critic_step(torch.zeros(()))
    assert float(gn) == pytest.approx((3.0 ** 2 + 0.1 ** 2) ** 0.5, rel=1e-5)  # logged: the whole critic's norm
    assert _member_norms(params) == pytest.approx(want, rel=1e-3)


def test_an_unknown_critic_clip_is_refused():
    from plcql_bench.suite.core.errors import BenchError
    from plcql_bench.suite.runs.profiles import load_profile
    from plcql_bench.suite.runs.runner import Cell, resolve_config

    with pytest.raises(BenchError, match="critic_clip: must be one of 'joint', 'per-member', got 'per-agent'"):
        resolve_config(Cell("cfcql", "mpe-cn", "expert", 0), load_profile("smoke"), {"critic_clip": "per-agent"})
    cls = get_algorithm("cfcql", discrete=False)
    with pytest.raises(ValueError, match="critic_clip must be one of"):  # built directly, past the schema
        cls(SPEC, make_config(cls, {"critic_clip": "per-agent"}), 0)


def test_critic_clip_is_key_neutral_at_joint_only():
    cls = get_algorithm("plcql", discrete=False)
    joint, member = make_config(cls, {"critic_clip": "joint"}), make_config(cls, {})
    before = {k: v for k, v in dataclasses.asdict(joint).items() if k != "critic_clip"}  # the config before the field
    assert identity_config(joint) == before
    assert identity_config(member) == {**before, "critic_clip": "per-member"}
    ident = {"algo": "plcql", "task": "mpe-cn", "seed": 0}
    assert run_key_of({**ident, "config": identity_config(joint)}) == run_key_of({**ident, "config": before})
    assert run_key_of({**ident, "config": identity_config(member)}) != run_key_of({**ident, "config": before})
    variant = get_algorithm("plcql-member-clip", discrete=False)
    assert identity_config(make_config(variant, {}))["critic_clip"] == "per-member"
    assert "critic_clip" not in identity_config(make_config(get_algorithm("plcql-joint-clip", discrete=False), {}))


@pytest.mark.parametrize("name, clip", [("cfcql", "joint"), ("macql", "joint"), ("spacql", "per-member"),
                                        ("plcql", "per-member"), ("plcql-lcb", "per-member"), ("plcql-k1", "per-member")])
def test_default_critic_clip_per_algorithm(name, clip):
    """Twin critics clip jointly, as the references; the 10-member ensembles clip each member."""
    cls = get_algorithm(name, discrete=False)
    assert make_config(cls, {}).critic_clip == clip


def test_archived_joint_clip_runs_are_the_old_default_under_critic_clip_joint():
    """leaderboard/archive/joint-clip/ holds the PLCQL-family runs from before the per-member default:
    each re-plans to its run key with `--set critic_clip=joint` (so its README's claim holds), and
    not without it (so none of them belongs on the board under today's defaults)."""
    import json
    from pathlib import Path

    from plcql_bench.suite.runs.profiles import load_profile
    from plcql_bench.suite.runs.runner import Cell, resolve_config, run_identity

    finals = sorted((Path(__file__).resolve().parent.parent / "leaderboard" / "archive" / "joint-clip").rglob("final.json"))
    assert len(finals) >= 19
    for path in finals:
        rec = json.loads(path.read_text())
        prof = load_profile(rec["profile"])
        cell = Cell(rec["algo"], rec["task"], rec["dataset"], rec["seed"])

        def key(over):
            return run_key_of(run_identity(cell, prof, resolve_config(cell, prof, over), rec["dataset_sha256"]))

        assert key({"critic_clip": "joint"}) == rec["run_key"], path
        assert key({}) != rec["run_key"], path

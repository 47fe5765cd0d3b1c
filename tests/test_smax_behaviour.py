"""SMAX behaviour policies: tier selection and the committed checkpoints (no training here)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jaxmarl")

from plcql_bench.datasets import smax_behaviour as sb  # noqa: E402
from plcql_bench.suite.envs import smax  # noqa: E402


def test_select_tiers():
    log = [{"ckpt": f"c{i}", "win_rate": w} for i, w in enumerate([0.0, 0.2, 0.45, 0.7, 0.9, 0.9])]
    t = sb.select_tiers(log)
    assert t["expert"] == "c5" and t["medium"] == "c2"
    assert t["medium-replay"] == ["c0", "c1", "c2"]


def test_parse_budget():
    assert sb.parse_budget("3M") == 3_000_000 and sb.parse_budget("500k") == 500_000
    assert sb.parse_budget(1234) == 1234


@pytest.mark.parametrize("m", smax.MAPS)
def test_committed_checkpoints_load(m):
    tid = "smax-" + m
    card = sb.read_card(tid)
    n, obs_dim, _, n_act = smax.SHAPES[m]
    assert card["expert"]["win_rate"] >= card["medium"]["win_rate"]
    for tier in ("expert", "medium"):
        policy, params = sb.load_policy(tid, tier)
        assert params[0]["w"].shape == (obs_dim + n, params[0]["w"].shape[1])
        assert params[-1]["w"].shape[1] == n_act
        avail = np.zeros((n, n_act), np.uint8)
        avail[:, smax.STOP_ACTION] = 1
        a = np.asarray(policy(params, np.zeros((n, obs_dim), np.float32), avail, None))
        assert (a == smax.STOP_ACTION).all()  # masked argmax respects avail
    src = sb.replay_sources(tid)
    assert src and src[-1][0] == card["tiers"]["medium"]
    with pytest.raises(ValueError):
        sb.load_policy(tid, "mixed")

"""Timeouts are terminal for the discrete TD learners by default, as in the references (CFCQL's
sc2.yaml: continuing_episode False, so PyMARL stores terminated=True at the limit), bootstrapped
with `bootstrap_timeouts`; the same on SMAX and SC2 data, which both keep the two flags apart
(the envs' own reports are tested in test_smax.py and test_smac_adapter.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from plcql_bench.algorithms.base import get_algorithm, make_config
from plcql_bench.datasets.episodes import EpisodeSampler

from test_discrete_machinery import SPEC, ragged

torch.set_num_threads(1)
TD_LEARNERS = ["cfcql", "macql", "maicq", "omar", "iql", "awac", "spacql", "plcql"]


@pytest.fixture(scope="module")
def batch():
    # lens 3 / 2 / 4 / 1: episodes 0 and 2 end in a timeout, 1 and 3 in a terminal (ragged())
    s = EpisodeSampler(ragged(lens=(3, 2, 4, 1)), seed=0)
    return s.episodes(torch.arange(4))


def test_sampler_keeps_timeouts_apart(batch):
    last = batch.lengths - 1
    at_end = lambda x: x[torch.arange(4), last].tolist()  # noqa: E731
    assert at_end(batch.timeouts) == [1.0, 0.0, 1.0, 0.0]
    assert at_end(batch.terminals) == [0.0, 1.0, 0.0, 1.0]
    assert batch.timeouts.sum() == 2 and batch.terminals.sum() == 2  # only at the ends


@pytest.mark.parametrize("name", TD_LEARNERS)
def test_td_learners_count_timeouts_as_terminal(name, batch):
    cls = get_algorithm(name, discrete=True)
    assert cls.Config().bootstrap_timeouts is False  # the references' convention by default
    algo = cls(SPEC, make_config(cls, {"hidden": 8}), 0)
    seen = algo.scaled(batch)
    torch.testing.assert_close(seen.terminals, batch.terminals + batch.timeouts)
    algo.cfg = dataclasses.replace(algo.cfg, bootstrap_timeouts=True)
    torch.testing.assert_close(algo.scaled(batch).terminals, batch.terminals)


def test_cfcql_target_at_a_timeout(batch):
    """λ = 0: y_t = r_t + γ (1 - d_t) Q'(s_{t+1}); at the timeout of episode 0 (t = 2) the default
    gives y = r, bootstrapping gives r + γ Q'(final observation)."""
    cls = get_algorithm("cfcql", discrete=True)
    cfg = make_config(cls, {"hidden": 8, "td_lambda": 0.0, "softmax_temp": 0.0})
    algo = cls(SPEC, cfg, 0)
    ys = {}
    for boot in (False, True):
        algo.cfg = dataclasses.replace(cfg, bootstrap_timeouts=boot)
        ys[boot] = algo.compute_target(algo.scaled(batch))
    r = batch.rewards[0, 2] * cfg.reward_scale
    torch.testing.assert_close(ys[False][0, 2], r)
    assert not torch.isclose(ys[True][0, 2], r)
    torch.testing.assert_close(ys[False][:, :2], ys[True][:, :2])  # only the cut step differs

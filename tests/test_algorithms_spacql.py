"""SPaCQL: the all-k PAR target by hand (anchored agents, weights per sample / per batch)."""

from __future__ import annotations

import math

import pytest
import torch

from plcql_bench.algorithms.base import Batch, load_all, make_config
from plcql_bench.algorithms.spacql import inverse_std_weights, par_masks_all_k
from plcql_bench.suite.core.spec import TaskSpec

torch.set_num_threads(1)
TOY = TaskSpec("toy", "mpe", n_agents=3, obs_dim=2, state_dim=1, act_dim=1, discrete=False,
               episode_limit=5, tiers=("expert",))


def _algo(**over):
    cls = load_all()["spacql"]
    algo = cls(TOY, make_config(cls, {"n_critics": 2, "hidden": 8, "target_noise": 0.0, "gamma": 0.5, **over}), 0)
    # replaced agents take the current actors' action (0.5) by default, the target actors' (0.25) as an option
    algo.actors = lambda obs: torch.full((obs.shape[0], 3, 1), 0.5)
    algo.target_actors = lambda obs: torch.full((obs.shape[0], 3, 1), 0.25)
    coefs = torch.tensor([1.0, 2.0])
    # member j: c_j * (sum of the joint action + 4): depends only on how many agents were replaced
    algo.target_critic = lambda s, a, members=None: coefs.view(2, 1, 1) * (a.sum(-1).unsqueeze(0) + 4.0)
    # online members (0, x^2), x = sum + 4: their std differs from the target members' in shape, so the
    # weights show which ensemble gave u_k
    algo.critic = lambda s, a, members=None: torch.stack([torch.zeros_like(a.sum(-1)), (a.sum(-1) + 4.0) ** 2])
    return algo


def _batch():
    B = 2
    return Batch(obs=torch.zeros(B, 3, 2), state=torch.zeros(B, 1), actions=torch.zeros(B, 3, 1),
                 rewards=torch.tensor([1.0, 2.0]), next_obs=torch.zeros(B, 3, 2), next_state=torch.zeros(B, 1),
                 next_actions=-torch.ones(B, 3, 1), next_actions_valid=torch.tensor([1.0, 0.0]),
                 terminals=torch.zeros(B))


def test_masks_exactly_k_and_uniform():
    g = torch.Generator().manual_seed(0)
    m = par_masks_all_k(5, 3, torch.tensor([1.0, 1, 1, 1, 0]), g)
    assert m[:4].sum(-1).tolist() == [[1, 2, 3]] * 4 and m[4].all()
    big = par_masks_all_k(30000, 3, torch.ones(30000), g).float().mean(0)  # P(agent i replaced | k) = k/3
    assert torch.allclose(big, torch.tensor([1 / 3, 2 / 3, 1.0]).view(3, 1).expand(3, 3), atol=0.02)


@pytest.mark.parametrize("replace_with, pi", [("online", 0.5), ("target", 0.25)])
def test_anchored_agents_keep_dataset_actions(replace_with, pi):
    algo = _algo(replace_with=replace_with)
    joint, masks = algo.par_joint_actions(_batch())
    assert joint.shape == (2, 3, 3)
    assert torch.equal(joint, torch.where(masks, torch.tensor(pi), torch.tensor(-1.0)))
    assert masks[0].sum(-1).tolist() == [1, 2, 3] and masks[1].all()


@pytest.mark.parametrize("source", ["online", "target"])
def test_target_hand_computed_per_sample(source):
    algo = _algo(uncertainty_from=source)
    y, _ = algo.compute_target(_batch())
    # row 0 (valid): k replaced -> sum = 0.5k - (3 - k); +4 -> x = 2.5, 4, 5.5; target members (x, 2x):
    # min x, std x/sqrt2; online members (0, x^2): std x^2/sqrt2
    mins = torch.tensor([2.5, 4.0, 5.5])
    u = mins ** 2 / math.sqrt(2) if source == "online" else mins / math.sqrt(2)
    inv = 1 / u
    w = inv / inv.sum()
    y0 = 1.0 + 0.5 * float((w * mins).sum())
    # row 1 (a' unknown): every k replaces all agents -> 5.5 for each k, equal weights
    y1 = 2.0 + 0.5 * 5.5
    assert torch.allclose(y, torch.tensor([y0, y1]), atol=1e-5)


def test_target_per_batch_weights():
    algo = _algo(weights_per="batch", uncertainty_from="target")
    y, st = algo.compute_target(_batch())
    u = torch.tensor([[2.5, 4.0, 5.5], [5.5, 5.5, 5.5]]) / math.sqrt(2)
    inv = 1 / u.mean(0)
    w = inv / inv.sum()
    exp = torch.tensor([1.0, 2.0]) + 0.5 * (w * torch.tensor([[2.5, 4.0, 5.5], [5.5, 5.5, 5.5]])).sum(-1)
    assert torch.allclose(y, exp, atol=1e-5)
    assert abs(float(st["spacql/w_k1"]) - float(w[0])) < 1e-6


def test_inverse_std_weights():
    w = inverse_std_weights(torch.tensor([[1.0, 2.0, 4.0]]), "sample", 0.0)
    assert torch.allclose(w, torch.tensor([[4 / 7, 2 / 7, 1 / 7]]))


def test_online_undetached_weights_carry_gradient():
    cls = load_all()["spacql"]
    algo = cls(TOY, make_config(cls, {"n_critics": 3, "hidden": 8, "uncertainty_from": "online",
                                      "detach_weights": False}), 0)
    b = _batch()
    y, _ = algo.compute_target(b)
    assert y.requires_grad
    algo_d = cls(TOY, make_config(cls, {"n_critics": 3, "hidden": 8, "uncertainty_from": "online"}), 0)
    assert not algo_d.compute_target(b)[0].requires_grad

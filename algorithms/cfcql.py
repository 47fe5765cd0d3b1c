"""CFCQL, continuous actions (Shao et al. 2023, "Counterfactual Conservative Q Learning").

Follows the reference `thu-rllab/CFCQL` `continuous/algorithms/maddpg_cc.py` class MATD3CC run with
`--cql --cf_cql --central_critic` (MPE branch), see reference-implementations.md §4.3:

  critic:  y = r + gamma * (1 - terminal) * min(Q1', Q2')(s', clip(pi'(o') + N(0, 0.05), -1, 1))
           L = sum_j MSE(Q_j(s, a), y) + cql_alpha * sum_j pen_j
           pen_j = mean_b [ sum_i (1/n) * logsumexp_m (Q_j(s, a_i^m, a_-i) - log p_unif) - Q_j(s, a) ]
           with a_i^m ~ U[-1,1]^A, 10 samples per agent, other agents at their dataset actions.
  actor:   per agent i, -Q_1(s, a_i = pi_i(o_i), a_-i from the dataset), averaged, + 1e-3 * mean(pi^2)
  round:   one critic+actor update, then (ca_ratio - 1) = 4 critic-only updates, each on a fresh
           batch, then Polyak target updates (main.py with --ca_ratio 5).

The HalfCheetah branch of the reference also samples noisy current- and next-policy actions for the
penalty (`sample_action_class="1-1-1"`, set for the mamujoco tasks; docs/algorithms/cfcql.md).

CFCQL is the backbone of its family (MACQL, SPaCQL, PLCQL), so its losses, written out in plain torch,
are in algorithms/common/continuous.py (`CentralCriticAlgorithm`: `td_target`, `critic_loss` with
`cf_cql_penalty`, `actor_loss`, `update`); this file registers them as `cfcql` with CFCQL's tables. With
the critic's fused kernels on (the default, algorithms/common/kernels.py) the penalty's critic part runs
cache-blocked, with the same numbers up to float summation order (tests/test_speed_equivalence.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from plcql_bench.algorithms.base import register
from plcql_bench.algorithms.common.continuous import CentralCriticConfig, CentralCriticAlgorithm


@dataclass
class Config(CentralCriticConfig):
    """CFCQL's settings are the backbone's (algorithms/common/continuous.py, `CentralCriticConfig`)."""


@register
class CFCQL(CentralCriticAlgorithm):
    """The backbone as it is: TD target `td_target`, CF-CQL critic loss, cf_pol actors, --ca_ratio 5 rounds."""

    name = "cfcql"
    Config = Config

"""The official OMAR, CFCQL or MACQL code trained on this suite's CN, PP or World dataset and scored with this
suite's protocol.

    python -m plcql_bench.suite.runs.reference_score --omar PATH --tier expert [--task mpe-cn] [--seed 0] [--rounds N]
    python -m plcql_bench.suite.runs.reference_score --cfcql PATH --tier expert [--task mpe-pp] [--seed 0] [--rounds N]
    python -m plcql_bench.suite.runs.reference_score --macql PATH --tier medium     (PATH: the thu-rllab/CFCQL checkout)

It answers one question about a gap to the paper: is it our implementation's or the data's? PATH is a
checkout of ling-pan/OMAR at 0e52ad6 or of thu-rllab/CFCQL (its `continuous/` code), imported from PATH
with the CPU shims of `reference_speed` (nothing of it is copied into this project). The official agent
is built by its own `init_from_env` for the task's scenario (mpe-cn: simple_spread, mpe-pp: simple_tag,
mpe-world: simple_world) and the tier, so cql_alpha (and OMAR's omar_coe) come from its `env_config_map`
and every other setting is its main.py's default or README command (OMAR_SETTINGS, CFCQL_SETTINGS
in reference_speed, with main.py's per-scenario overrides), not this suite's configs. It trains as its main.py loop does,
on minibatches of 1,024 transitions drawn from the tier's dataset by its own `ReplayBuffer.sample`:

  OMAR   per round, each agent updates on its own minibatch, then all targets;
  CFCQL  per round, one critic + actor update and `ca_ratio - 1` = 4 critic-only updates, each on its
         own minibatch, then the targets (README: `--cql --cf_cql --central_critic`);
  MACQL  CFCQL's code and loop without `--cf_cql` (`--cql --central_critic`): its CQL term samples whole
         joint actions, the baseline this suite's MACQL follows (algorithms/macql.py);

for the profile's number of rounds (the suite's runs use the same count). Its deterministic actors are
evaluated on the suite's evaluation seeds and normalised by the dataset's reference returns, as a run's
final.json is. Each agent's buffer holds that agent's own reward, as the original datasets' per-agent files do
(`rews_<i>.npy`; OMAR learns agent i's critic from agent i's, CFCQL's central critic from agent 0's): a v2
dataset's `agent_rewards`. On simple_spread they differ at collision steps (each agent pays for its own); on
simple_tag and simple_world every predator's is the team reward. A v1 dataset stores the team reward only, and
every agent gets it. The check file records which (`settings.rewards`).
At the profile's full budget (rounds and final episodes) the result is recorded as a check file the
leaderboard shows beside our cell (`--record-to`, default leaderboard/official; suite/core/official.py).

Predator-prey (mpe-pp, and World, its 3 predators against 1 prey): the official code trains only the
predators, offline, and never queries its pretrained prey while training (its main.py loads the prey for its
own evaluation rollouts). So it trains here on this suite's PP and World data as on CN, and is scored in this
suite's task against the prey the data was collected with (OMAR's pretrained prey for v2 data; docs/datasets.md):
the same environment and prey as every run of this suite on that tier. Its prey
networks are built by `init_from_env` (one prey, as simple_tag and simple_world) and never used.
CFCQL's main.py also sets steps_per_update 20 for simple_world (100 otherwise): that sets how many updates
its run makes for its env-step count, not what an update does (its `t` only times its logging), and the
check trains the profile's rounds like every other.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import time
import types
from pathlib import Path

import numpy as np
import torch

from plcql_bench.suite.core import official
from plcql_bench.suite.runs.reference_speed import (BATCH, CFCQL_CA_RATIO, CFCQL_SETTINGS, OMAR_SETTINGS, SCENARIOS,
                                                    CheckoutError, load_official_cfcql, load_official_omar)
from plcql_bench.datasets import manifest
from plcql_bench.datasets.cards import card_scoring, dataset_identity
from plcql_bench.datasets.format import load_dataset
from plcql_bench.suite.runs.profiles import load_profile
from plcql_bench.suite.runs.runner import (configure_process, data_profile_dir, dataset_task, evaluate_policy,
                                          select_rewards)
from plcql_bench.suite.envs.tasks import get_task


def official_agent(kind: str, path: Path, task_id: str, tier: str, n: int, obs_dim: int, act_dim: int):
    """The official agent for the task's scenario with `n` trained agents (the predators on simple_tag and
    simple_world, listed first as in its environments, then its prey), built by its own `init_from_env`."""
    sc = SCENARIOS[task_id]
    box = types.SimpleNamespace
    m = n + sc["preys"]
    env = box(action_space=[box(shape=(act_dim,), high=np.ones(act_dim))] * m,
              observation_space=[box(shape=(obs_dim,))] * m,
              agent_types=["agent"] * n if not sc["preys"] else ["adversary"] * n + ["agent"] * sc["preys"])
    if kind == "omar":
        cls, buffer = load_official_omar(path)
        return cls.init_from_env(env, sc["env_id"], tier, **official_settings(kind, task_id)), buffer
    cls, buffer = load_official_cfcql(path)
    return cls.init_from_env(env, sc["env_id"], tier, **official_settings(kind, task_id)), buffer


def official_settings(kind: str, task_id: str) -> dict:
    """What the official main.py passes to init_from_env for this code and task (MACQL: CFCQL's without cf_cql)."""
    if kind == "omar":
        return dict(OMAR_SETTINGS)
    return {**CFCQL_SETTINGS, "lr": SCENARIOS[task_id]["cfcql_lr"], "cf_cql": kind == "cfcql"}


def train_round(kind: str, agent, rb, n: int, r: int) -> None:
    """One round of the official main.py loop (module docstring); `t` = its env-step counter."""
    agent.prep_training(device="cpu")
    if kind == "omar":
        for i in range(n):
            agent.update(rb.sample(BATCH), i)
    else:
        t = 100 * r  # main.py's env-step clock (steps_per_update 100); only its logging reads it
        agent.update(rb.sample(BATCH), t)
        for j in range(CFCQL_CA_RATIO - 1):
            agent.update(rb.sample(BATCH), t + j + 1, only_critic=True)
    agent.update_all_targets()


def buffer_rewards(arrays: dict) -> tuple[str, np.ndarray]:
    """Which rewards the official buffer gets, and the [N, n] array of them: every agent's own (a v2 dataset's
    `agent_rewards`, as the original per-agent files), else the team reward broadcast to every agent (a
    read-only view; v1 data has no other)."""
    rewards = select_rewards(arrays, "per_agent")  # the runner's column choice: [N, n], or the team's [N] on v1
    if rewards.ndim == 2:
        return "per-agent", rewards
    return "team", np.broadcast_to(rewards[:, None], (len(rewards), arrays["obs"].shape[1]))


def fill_buffer(ReplayBuffer, arrays: dict, n: int, obs_dim: int, act_dim: int):
    """The official per-agent ReplayBuffer holding a dataset's transitions in their stored (episode) order, each
    agent's own reward in its buffer (`buffer_rewards`; CFCQL's buffer takes a row's next actions from the row
    after it)."""
    size = len(arrays["rewards"])
    rewards = buffer_rewards(arrays)[1]
    rb = ReplayBuffer(size, n, [obs_dim] * n, [act_dim] * n)
    for i in range(n):
        rb.obs_buffs[i][:] = arrays["obs"][:, i]
        rb.next_obs_buffs[i][:] = arrays["next_obs"][:, i]
        rb.ac_buffs[i][:] = arrays["actions"][:, i]
        rb.rew_buffs[i][:] = rewards[:, i]
        rb.done_buffs[i][:] = arrays["terminals"]
    rb.filled_i = size
    return rb


class OfficialPolicy:
    """`act()` over the official deterministic actors (`step(..., explore=False)`)."""

    def __init__(self, agent, n: int, obs_dim: int, act_dim: int) -> None:
        self.agent, self.n, self.obs_dim, self.act_dim = agent, n, obs_dim, act_dim

    @torch.no_grad()
    def act(self, obs: np.ndarray, avail: np.ndarray | None = None) -> np.ndarray:
        x = torch.as_tensor(np.asarray(obs, dtype=np.float32))
        lead = x.shape[:-2]
        x = x.reshape(-1, self.n, self.obs_dim)
        acts = self.agent.step([x[:, i] for i in range(self.n)], explore=False)
        out = torch.stack([a.reshape(-1, self.act_dim) for a in acts], 1)
        return out.reshape(*lead, self.n, self.act_dim).clamp(-1.0, 1.0).numpy()

    def begin_episodes(self, num_envs: int) -> None:
        """Feed-forward actors keep no state between steps: nothing to reset (the evaluation calls it)."""

    def evaluating(self) -> contextlib.AbstractContextManager:
        """Nothing to switch for the evaluation: the loop puts the official agent in its rollout mode
        (`prep_rollouts`) before it (the evaluation calls it)."""
        return contextlib.nullcontext()


def score(task, policy, dataset, episodes: int) -> tuple[float, float]:
    """(normalised score, mean return) of `policy` on the suite's first `episodes` evaluation seeds, as a
    run of this suite is evaluated (runner.evaluate_policy)."""

    ev = evaluate_policy(task, policy, dataset, episodes)
    return float(ev["normalised_score"]), float(ev["return_mean"])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--omar", type=Path, help="checkout of ling-pan/OMAR (0e52ad6)")
    which.add_argument("--cfcql", type=Path, help="checkout of thu-rllab/CFCQL")
    which.add_argument("--macql", type=Path, help="checkout of thu-rllab/CFCQL, run without --cf_cql")
    p.add_argument("--tier", required=True, choices=["random", "medium-replay", "medium", "expert"])
    p.add_argument("--task", default="mpe-cn", choices=sorted(SCENARIOS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", default="paper", help="whose dataset and round count (default: paper)")
    p.add_argument("--data-dir", type=Path, default=Path("data"))
    p.add_argument("--rounds", type=int, default=None, help="default: the profile's updates for the cell")
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--final-episodes", type=int, default=None, help="default: the profile's")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--record-to", type=Path, default=Path("leaderboard/official"),
                   help="where the check's result file goes (suite/core/official.py; default: leaderboard/official, "
                        "which the leaderboard reads); a run of fewer rounds or final episodes than the profile's is "
                        "not recorded")
    p.add_argument("--no-record", action="store_true", help="print only, write no result file")
    args = p.parse_args(argv)
    kind, checkout = next((k, getattr(args, k)) for k in ("omar", "cfcql", "macql") if getattr(args, k))
    torch.set_num_threads(args.threads)
    configure_process("cpu")
    prof = load_profile(args.profile)
    task_id = args.task
    task = get_task(task_id)
    n, o, a = task.spec.n_agents, task.spec.obs_dim, task.spec.act_dim
    path = data_profile_dir(args.data_dir, prof) / task_id / f"{args.tier}.h5"
    if not path.exists():
        raise SystemExit(f"{path}: dataset not built (plcql-bench datasets build {task_id} {args.tier} "
                         f"--profile {prof.name})")
    dataset = load_dataset(path)
    task = dataset_task(task_id, dataset)  # PP/World: against the prey the data was collected with
    # named as the suite's runs name it: a rebuild of the committed card's dataset by the card's sha256
    entry = manifest.lookup(data_profile_dir(args.data_dir, prof), task_id, args.tier)
    dataset_sha256, rebuild = dataset_identity(entry) if entry and entry["sha256"] == dataset.sha256 else (dataset.sha256, None)
    dataset = card_scoring(dataset, rebuild)  # scored as the suite's runs on it are: with the card's references
    rounds = args.rounds if args.rounds is not None else prof.updates_for(task_id, args.tier)
    final_episodes = args.final_episodes or prof.train_budget(task_id, args.tier)["final_eval_episodes"]
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)  # the official buffers sample with np.random (their main.py seeds it the same way)
    try:
        agent, ReplayBuffer = official_agent(kind, checkout.resolve(), task_id, args.tier, n, o, a)
    except CheckoutError as exc:
        raise SystemExit(str(exc)) from None
    rb = fill_buffer(ReplayBuffer, dataset.arrays, n, o, a)
    policy = OfficialPolicy(agent, n, o, a)
    print(f"# official {kind.upper()} ({checkout}) on this suite's {task_id} {args.tier} ({path}), seed {args.seed}, "
          f"{rounds} rounds; its env_config_map: cql_alpha {agent.cql_alpha}", flush=True)
    t0 = time.time()
    curve = []
    for r in range(rounds + 1):
        if r == rounds or r % args.eval_every == 0:
            agent.prep_rollouts(device="cpu")
            rng = np.random.get_state()  # evaluating must not move the buffer's sampling (np.random)
            s, ret = score(task, policy, dataset, final_episodes if r == rounds else args.eval_episodes)
            np.random.set_state(rng)
            curve.append({"update": r, "score": s, "return_mean": ret})
            print(f"round {r}: normalised score {s:.1f} (return {ret:.1f}, {time.time() - t0:.0f} s)", flush=True)
        if r == rounds:
            break
        train_round(kind, agent, rb, n, r)
    print(f"final (round {rounds}, {final_episodes} episodes): normalised score {s:.1f}")
    full = (rounds, final_episodes) == (prof.updates_for(task_id, args.tier),
                                        prof.train_budget(task_id, args.tier)["final_eval_episodes"])
    if args.no_record or not full:
        print("not recorded" + ("" if args.no_record else ": fewer rounds or final episodes than the profile's"))
        return
    rec = {"schema": official.SCHEMA, "code": kind, "repo": official.CODES[kind][0], "commit": checkout_commit(checkout),
           "task": task_id, "tier": args.tier, "seed": args.seed, "profile": prof.name, "rounds": rounds,
           "dataset_sha256": dataset_sha256, **({"dataset_rebuild": rebuild} if rebuild else {}),
           "final_episodes": final_episodes, "score": s, "return_mean": ret,
           "curve": curve, "cql_alpha": float(agent.cql_alpha),
           "settings": {**official_settings(kind, task_id), "rewards": buffer_rewards(dataset.arrays)[0],
                        "eval_every": args.eval_every, "eval_episodes": args.eval_episodes, "threads": args.threads},
           "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runtime_s": time.time() - t0}
    out = official.check_path(args.record_to, prof.name, kind, task_id, args.tier, args.seed)
    official.write_check(out, rec)
    print(f"recorded: {out}")


def checkout_commit(checkout: Path) -> str | None:
    """The checkout's git commit (None when it is not a git checkout), '+dirty' when its tracked files differ."""

    def git(*a):
        return subprocess.run(["git", "-C", str(checkout), *a], capture_output=True, text=True, timeout=60)

    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + ("+dirty" if dirty else "")


if __name__ == "__main__":
    main()

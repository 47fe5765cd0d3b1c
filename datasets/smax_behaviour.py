"""SMAX behaviour policies: MAPPO (shared actor + one-hot agent id, centralised V(state)) in JAX,
trained online in the vmapped SMAX env, with small checkpoints and a card per map.

    card = train("smax-2s3z", Path("datasets/assets/behaviour/smax-2s3z"), budget="3M", seed=0)
    policy, params = load_policy("smax-2s3z", "expert")   # jittable policy + its params
    arrays, meta = collect_smax("smax-2s3z", policy, seeds, params=params)

Algorithm (standard MAPPO choices, written from the papers' description, no code copied):
* actor: MLP 128-128 ReLU on [obs, one-hot agent id] -> logits, unavailable actions masked;
  parameters shared by all agents. Critic: MLP 128-128 on the SMAX world state -> V(s) of the
  team reward (x REWARD_SCALE).
* rollouts: NUM_ENVS envs x ROLLOUT steps with auto-reset; GAE(gamma 0.99, lambda 0.95) that
  bootstraps through time-limit cuts from V(final next state) and not through terminals.
* PPO: 4 epochs x 4 minibatches, clip 0.2, entropy 0.01, value coefficient 0.5, Adam 5e-4,
  global-norm clip 0.5, advantages normalised per minibatch.

Checkpoints: every ``ckpt_every`` env steps the actor is saved as ``ckpt_<steps>.npz`` and
evaluated greedily on CKPT_EVAL_EPISODES episodes (seeds CKPT_EVAL_SEED_BASE + i, disjoint from
the protocol's evaluation and collection seeds); ``log.jsonl`` records each checkpoint.
``resume.pkl`` (not committed) lets an interrupted run continue where it stopped.

Tiers: ``datasets/smax_tiers.py`` picks, per map, which checkpoints play expert, medium and
medium-replay (by the reference's yardstick) and writes the map's ``card.json``; a training run
writes its own card (``card.json`` in its output folder, the map's ``expert_run.json`` for the
expert run) with its best checkpoint. Medium-replay plays ``replay_sources``: one part per
checkpoint up to medium, in training order, acting epsilon-greedily with epsilon falling linearly
from 1 (uniform) to 0.05 (QMIX's final epsilon); CFCQL's SMAC medium-replay is the replay buffer of
an epsilon-greedy QMIX learner, and sampling the stochastic MAPPO checkpoints instead gave
near-uniform play without a single win (docs/smax.md, "Medium-replay"). Expert and medium act
greedily, as CFCQL's QMIX collections did.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np

from plcql_bench.suite.envs import smax as smax_env
from plcql_bench.datasets.smax_collect import collect_smax, random_policy

ASSETS = Path(__file__).resolve().parent / "assets" / "behaviour"
CKPT_EVAL_EPISODES = 128
CKPT_EVAL_SEED_BASE = 5_000_000
REWARD_SCALE = 10.0
ALGO_VERSION = "mappo-smax-2"  # 2: the critic sees the SMAC-scaled state (suite/envs/smax.py)
REPLAY_EPS = (1.0, 0.05)  # first and last part's epsilon; 0.05 = QMIX's final epsilon


def default_config() -> dict[str, Any]:
    return dict(num_envs=64, rollout=128, epochs=4, minibatches=4, lr=5e-4, gamma=0.99,
                gae_lambda=0.95, clip=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5,
                hidden=128, ckpt_every=100_000, eval_episodes=CKPT_EVAL_EPISODES,
                max_wall_s=None, stop_win_rate=None)


def parse_budget(budget: str | int) -> int:
    """'3M' / '500k' / '1e6' / 20000 -> env steps; 'smoke' = 20k."""
    if isinstance(budget, int):
        return budget
    b = str(budget).strip().lower()
    if b == "smoke":
        return 20_000
    if b == "paper":
        return 5_000_000
    mult = {"k": 1_000, "m": 1_000_000}.get(b[-1:], 1)
    return int(float(b[:-1] if b[-1:] in "km" else b) * mult)


# --------------------------------------------------------------------------- networks


def _init_mlp(key, sizes, last_scale):
    import jax
    import jax.numpy as jnp

    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        key, k = jax.random.split(key)
        scale = last_scale if i == len(sizes) - 2 else float(np.sqrt(2))
        w = jax.nn.initializers.orthogonal(scale)(k, (a, b), jnp.float32)
        layers.append({"w": w, "b": jnp.zeros((b,), jnp.float32)})
    return layers


def _mlp(layers, x):
    """ReLU MLP; a hidden layer with "ln_g"/"ln_b" is layer-normalised before its ReLU (the
    value-based learner's networks, datasets/smax_pqn.py; MAPPO's have none)."""
    import jax

    for layer in layers[:-1]:
        x = x @ layer["w"] + layer["b"]
        if "ln_g" in layer:
            mu = x.mean(-1, keepdims=True)
            var = ((x - mu) ** 2).mean(-1, keepdims=True)
            x = (x - mu) * jax.lax.rsqrt(var + 1e-6) * layer["ln_g"] + layer["ln_b"]
        x = jax.nn.relu(x)
    return x @ layers[-1]["w"] + layers[-1]["b"]


def actor_logits(actor, obs, avail):
    """obs [..., n, obs_dim], avail [..., n, A] -> masked logits [..., n, A]."""
    import jax.numpy as jnp

    n = obs.shape[-2]
    ids = jnp.broadcast_to(jnp.eye(n, dtype=obs.dtype), obs.shape[:-1] + (n,))
    logits = _mlp(actor, jnp.concatenate([obs, ids], axis=-1))
    return jnp.where(avail > 0, logits, -1e9)


def greedy_policy(params, obs, avail, key):
    """Jittable: argmax of the masked logits (params = actor layers)."""
    import jax.numpy as jnp

    return jnp.argmax(actor_logits(params, obs, avail), axis=-1).astype(jnp.int32)


def epsilon_greedy_policy(params, obs, avail, key):
    """Jittable: params = (actor layers, epsilon). Each agent independently takes a uniform
    available action with probability epsilon, else its greedy action (QMIX's exploration).
    Epsilon is a traced value, so every level shares one compiled runner."""
    import jax
    import jax.numpy as jnp

    actor, eps = params
    k_explore, k_uniform = jax.random.split(key)
    uniform = random_policy(None, obs, avail, k_uniform)
    explore = jax.random.uniform(k_explore, uniform.shape) < eps
    return jnp.where(explore, uniform, greedy_policy(actor, obs, avail, key))


def sample_policy(params, obs, avail, key):
    """Jittable: sample from the masked softmax (params = actor layers)."""
    import jax
    import jax.numpy as jnp

    return jax.random.categorical(key, actor_logits(params, obs, avail), axis=-1).astype(jnp.int32)


def init_params(key, core, hidden: int):
    import jax

    ka, kc = jax.random.split(key)
    return {
        "actor": _init_mlp(ka, [core.obs_dim + core.n_agents, hidden, hidden, core.n_actions], 0.01),
        "critic": _init_mlp(kc, [core.state_dim, hidden, hidden, 1], 1.0),
    }


# --------------------------------------------------------------------------- learners


@dataclass(frozen=True)
class Learner:
    """What `train` needs from an online learner. Its params hold the greedy policy's network
    under "actor" (checkpointed and evaluated as `greedy_policy`: argmax of the masked outputs,
    logits for MAPPO, Q-values for a value-based learner)."""
    name: str
    version: str
    defaults: Callable[[], dict]
    init: Callable  # (key, core, cfg) -> params
    make_update: Callable  # (core, cfg, optimizer) -> jitted (params, opt, env, ep_ret, key, frac)
    optimizer: Callable  # (cfg, total_updates) -> optax transformation


def _mappo_optimizer(cfg, total_updates):
    import optax

    return optax.chain(optax.clip_by_global_norm(cfg["max_grad_norm"]), optax.adam(cfg["lr"]))


# --------------------------------------------------------------------------- training step


def make_update(core, cfg, optimizer):
    """One jitted MAPPO iteration: rollout (NUM_ENVS x ROLLOUT) + PPO epochs. `frac` (the share
    of the budget done) is unused: MAPPO has no schedule."""
    import jax
    import jax.numpy as jnp

    nenv, T = cfg["num_envs"], cfg["rollout"]
    gamma, lam = cfg["gamma"], cfg["gae_lambda"]
    env_step = jax.vmap(core.step_autoreset)

    def value(critic, state):
        return _mlp(critic, state)[..., 0]

    def rollout(params, env_c, ep_ret, key):
        def body(c, _):
            env_c, ep_ret, key = c
            key, k = jax.random.split(key)
            o = env_c.last
            logits = actor_logits(params["actor"], o.obs, o.avail)
            a = jax.random.categorical(k, logits, axis=-1)
            logp = jnp.take_along_axis(jax.nn.log_softmax(logits), a[..., None], -1)[..., 0]
            v = value(params["critic"], o.state)
            env_c2, out = env_step(env_c, a.astype(jnp.int32))
            v_next = value(params["critic"], out.next.state)
            done = out.terminal | out.timeout
            ep_ret = ep_ret + out.reward
            tr = dict(obs=o.obs, avail=o.avail, state=o.state, a=a, logp=logp, v=v,
                      r=out.reward * REWARD_SCALE, term=out.terminal, done=done, v_next=v_next)
            stats = dict(ended=done, won=out.won & done, ret=jnp.where(done, ep_ret, 0.0))
            return (env_c2, jnp.where(done, 0.0, ep_ret), key), (tr, stats)

        (env_c, ep_ret, key), (traj, stats) = jax.lax.scan(body, (env_c, ep_ret, key), None, T)
        return env_c, ep_ret, traj, stats

    def gae(traj):
        delta = traj["r"] + gamma * (1.0 - traj["term"]) * traj["v_next"] - traj["v"]

        def f(adv_next, x):
            d, done = x
            adv = d + gamma * lam * (1.0 - done) * adv_next
            return adv, adv

        _, adv = jax.lax.scan(f, jnp.zeros(nenv), (delta, traj["done"].astype(jnp.float32)),
                              reverse=True)
        return adv, adv + traj["v"]

    def loss_fn(params, mb):
        logits = actor_logits(params["actor"], mb["obs"], mb["avail"])
        logp_all = jax.nn.log_softmax(logits)
        logp = jnp.take_along_axis(logp_all, mb["a"][..., None], -1)[..., 0]
        ratio = jnp.exp(logp - mb["logp"])
        adv = (mb["adv"] - mb["adv"].mean()) / (mb["adv"].std() + 1e-8)
        adv = adv[:, None]
        pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - cfg["clip"], 1 + cfg["clip"]) * adv).mean()
        probs = jax.nn.softmax(logits)
        ent = -(probs * jnp.where(mb["avail"] > 0, logp_all, 0.0)).sum(-1).mean()
        v = value(params["critic"], mb["state"])
        vloss = 0.5 * jnp.square(v - mb["ret"]).mean()
        total = pg + cfg["vf_coef"] * vloss - cfg["ent_coef"] * ent
        return total, dict(pg=pg, vloss=vloss, ent=ent)

    def update(params, opt_state, env_c, ep_ret, key, frac):
        key, kr, ks = jax.random.split(key, 3)
        env_c, ep_ret, traj, stats = rollout(params, env_c, ep_ret, kr)
        adv, ret = gae(traj)
        flat = {k: traj[k].reshape((T * nenv,) + traj[k].shape[2:])
                for k in ("obs", "avail", "state", "a", "logp")}
        flat["adv"], flat["ret"] = adv.reshape(-1), ret.reshape(-1)
        nmb = cfg["minibatches"]
        size = T * nenv // nmb

        def epoch(c, k):
            params, opt_state = c
            perm = jax.random.permutation(k, T * nenv)

            def mb_step(c, idx):
                params, opt_state = c
                mb = {kk: v[idx] for kk, v in flat.items()}
                (_, info), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, mb)
                upd, opt_state = optimizer.update(grads, opt_state, params)
                import optax

                return (optax.apply_updates(params, upd), opt_state), info

            (params, opt_state), info = jax.lax.scan(mb_step, (params, opt_state),
                                                      perm.reshape(nmb, size))
            return (params, opt_state), info

        (params, opt_state), info = jax.lax.scan(epoch, (params, opt_state),
                                                  jax.random.split(ks, cfg["epochs"]))
        metrics = {k: v.mean() for k, v in info.items()}
        metrics.update(ended=stats["ended"].sum(), won=stats["won"].sum(), ret_sum=stats["ret"].sum())
        return params, opt_state, env_c, ep_ret, key, metrics

    return jax.jit(update)


MAPPO = Learner("MAPPO (shared actor + agent id, centralised V(s))", ALGO_VERSION, default_config,
                lambda key, core, cfg: init_params(key, core, cfg["hidden"]), make_update, _mappo_optimizer)


# --------------------------------------------------------------------------- checkpoints


def _flatten(actor) -> dict[str, np.ndarray]:
    return {f"l{i}_{k}": np.asarray(v) for i, layer in enumerate(actor) for k, v in layer.items()}


def _unflatten(z) -> list[dict[str, Any]]:
    import jax.numpy as jnp

    layers: dict[int, dict[str, Any]] = {}
    for k in z.files:  # l<i>_<name>: w, b, and ln_g / ln_b where a layer is normalised
        i, name = k.split("_", 1)
        layers.setdefault(int(i[1:]), {})[name] = jnp.asarray(z[k])
    return [layers[i] for i in range(len(layers))]


def save_actor(path: Path, actor) -> None:
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **_flatten(actor))
    os.replace(tmp, path)


def load_actor(path: str | Path):
    with np.load(path) as z:
        return _unflatten(z)


def evaluate(task_id: str, actor, episodes: int = CKPT_EVAL_EPISODES, greedy: bool = True):
    seeds = CKPT_EVAL_SEED_BASE + np.arange(episodes)
    _, meta = collect_smax(task_id, greedy_policy if greedy else sample_policy, seeds,
                           params=actor, batch=min(episodes, 128))
    return {"win_rate": meta["win_rate"], "return_mean": float(meta["returns"].mean()),
            "len_mean": float(meta["lengths"].mean())}


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def train(task_id: str, out_dir: Path, budget: str | int = "3M", seed: int = 0,
          log: Callable[[str], None] = print, config: dict | None = None, learner: Learner = MAPPO) -> dict:
    """Train `learner` (MAPPO by default) on a SMAX task for `budget` env steps; resumable.
    Returns the card."""
    import jax

    map_name = smax_env.map_of(task_id)
    cfg = learner.defaults() | (config or {})
    total = parse_budget(budget)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    core = smax_env._core(map_name)
    per_update = cfg["num_envs"] * cfg["rollout"]
    optimizer = learner.optimizer(cfg, max(1, -(-total // per_update)))
    update = learner.make_update(core, cfg, optimizer)

    resume = out_dir / "resume.pkl"
    if resume.exists():
        with open(resume, "rb") as f:
            st = pickle.load(f)
        params, opt_state, steps, key = st["params"], st["opt_state"], st["steps"], st["key"]
        ckpts, wall0 = st["ckpts"], st["wall"]
        log(f"{task_id}: resuming at {steps} env steps")
    else:
        key = jax.random.PRNGKey(seed)
        key, kp = jax.random.split(key)
        params = learner.init(kp, core, cfg)
        opt_state = optimizer.init(params)
        steps, ckpts, wall0 = 0, [], 0.0
    key, ke = jax.random.split(key)
    env_c = jax.vmap(core.reset)(jax.random.split(ke, cfg["num_envs"]))
    ep_ret = jax.numpy.zeros(cfg["num_envs"])
    t_start = time.time()
    next_ckpt = (steps // cfg["ckpt_every"] + 1) * cfg["ckpt_every"]
    acc = dict(ended=0, won=0, ret_sum=0.0)

    def checkpoint():
        name = f"ckpt_{steps:09d}"
        save_actor(out_dir / f"{name}.npz", params["actor"])
        ev = evaluate(task_id, params["actor"], cfg["eval_episodes"])
        train_wr = acc["won"] / max(acc["ended"], 1)
        entry = dict(ckpt=name, env_steps=steps, wall_s=round(wall0 + time.time() - t_start, 1),
                     train_win_rate=round(train_wr, 4),
                     train_return=round(acc["ret_sum"] / max(acc["ended"], 1), 4), **ev)
        ckpts.append(entry)
        with open(out_dir / "log.jsonl", "a") as f:
            f.write(json.dumps(entry) + "\n")
        with open(resume.with_suffix(".tmp"), "wb") as f:
            pickle.dump(dict(params=jax.device_get(params), opt_state=jax.device_get(opt_state),
                             steps=steps, key=jax.device_get(key), ckpts=ckpts,
                             wall=wall0 + time.time() - t_start), f)
        os.replace(resume.with_suffix(".tmp"), resume)
        log(f"{task_id}: {steps} steps, greedy win {ev['win_rate']:.3f} return "
            f"{ev['return_mean']:.3f}; train win {train_wr:.3f} ({acc['ended']} episodes), "
            f"{entry['wall_s']:.0f}s")
        acc.update(ended=0, won=0, ret_sum=0.0)
        return ev["win_rate"]

    def reached(win_rate: float) -> bool:  # a ladder run stops once it is past the tier it serves
        return cfg["stop_win_rate"] is not None and win_rate >= cfg["stop_win_rate"]

    stopped = bool(ckpts) and reached(ckpts[-1]["win_rate"])  # resumed after the stop rule fired
    while steps < total and not stopped:
        params, opt_state, env_c, ep_ret, key, m = update(params, opt_state, env_c, ep_ret, key,
                                                          jax.numpy.float32(steps / total))
        steps += per_update
        acc["ended"] += int(m["ended"])
        acc["won"] += int(m["won"])
        acc["ret_sum"] += float(m["ret_sum"])
        out_of_time = cfg["max_wall_s"] is not None and time.time() - t_start > cfg["max_wall_s"]
        if steps >= next_ckpt or steps >= total or out_of_time:
            if reached(checkpoint()):
                log(f"{task_id}: greedy win rate reached {cfg['stop_win_rate']}; stopping")
                break
            next_ckpt = (steps // cfg["ckpt_every"] + 1) * cfg["ckpt_every"]
        if out_of_time:
            log(f"{task_id}: stopping at the wall-clock cap ({cfg['max_wall_s']}s)")
            break

    best = max(reversed(ckpts), key=lambda e: e["win_rate"])  # latest on ties
    card = {
        "task_id": task_id, "algorithm": learner.name,
        "algo_version": learner.version, "config": cfg, "seed": seed, "budget_env_steps": total,
        "env_steps": steps, "wall_clock_s": ckpts[-1]["wall_s"],
        "env_versions": smax_env.env_versions(map_name),
        "eval": {"episodes": cfg["eval_episodes"], "seeds": f"{CKPT_EVAL_SEED_BASE} + i",
                 "policy": "greedy"},
        "best": best, "checkpoints": len(ckpts),
        "note": "SMAX (JaxMARL) numbers; not comparable with StarCraft II / SMAC.",
    }
    _write_json(out_dir / "card.json", card)
    log(f"{task_id}: {len(ckpts)} checkpoints, best {best['ckpt']} greedy win {best['win_rate']:.3f}; "
        f"tiers: python -m plcql_bench.datasets.smax_tiers {task_id}")
    return card


# --------------------------------------------------------------------------- loading


def behaviour_dir(task_id: str) -> Path:
    smax_env.map_of(task_id)
    return ASSETS / task_id


def read_card(task_id: str) -> dict:
    path = behaviour_dir(task_id) / "card.json"
    if not path.exists():
        raise FileNotFoundError(f"no SMAX behaviour card at {path}; train it with "
                                f"`python -m plcql_bench.datasets.smax_behaviour {task_id}`")
    return json.loads(path.read_text())


def load_policy(task_id: str, tier: str):
    """(jittable policy, params) for tier "expert" or "medium" (greedy, as CFCQL collected)."""
    if tier not in ("expert", "medium"):
        raise ValueError(f"load_policy serves 'expert' and 'medium'; for 'medium-replay' use "
                         f"replay_sources(), for 'mixed' combine medium and expert (got {tier!r})")
    card = read_card(task_id)
    return greedy_policy, load_actor(behaviour_dir(task_id) / f"{card['tiers'][tier]}.npz")


def replay_levels(checkpoints: list[str]) -> int:
    """Parts of a medium-replay: one per checkpoint up to medium (at least 2: the ramp's ends)."""
    return max(2, len(checkpoints))


def replay_schedule(checkpoints: list[str], levels: int | None = None) -> list[tuple[str, float]]:
    """[(checkpoint, epsilon)] per medium-replay part: epsilon falls linearly from REPLAY_EPS[0]
    to REPLAY_EPS[1]; part i uses checkpoint round(i (m-1) / (levels-1)) of the m up to medium,
    so the first part uses the first checkpoint (irrelevant at epsilon 1) and the last medium.
    The default ``levels`` is one part per checkpoint (``replay_levels``)."""
    levels = replay_levels(checkpoints) if levels is None else levels
    hi, lo = REPLAY_EPS
    m = len(checkpoints)
    if m == 0 or levels < 2:
        raise ValueError(f"replay_schedule needs checkpoints and >= 2 levels (got {m}, {levels})")
    return [(checkpoints[round(i * (m - 1) / (levels - 1))], hi - (hi - lo) * i / (levels - 1))
            for i in range(levels)]


def policy_id(card: dict, tier: str) -> str:
    """The behaviour-policy id of a tier (one place for the builder hook and the collector): task,
    tier recipe, input version, checkpoints, and the card's label (5m_vs_6m's expert says it is
    the best reachable on SMAX, not an expert in the reference's sense)."""
    t = card["tiers"]
    expert = f"{t['expert']}:greedy"
    if card.get("labels", {}).get("expert"):
        expert += f"[{card['labels']['expert']}]"
    desc = {"expert": expert, "medium": f"{t['medium']}:greedy",
            "mixed": f"mixed({t['medium']}:greedy+{expert})",
            "medium-replay": replay_description(card)}[tier]
    return f"{card['task_id']}:{card['algo_version']}:{smax_env.INPUTS_VERSION}:{desc}"


def replay_description(card: dict) -> str:
    """The medium-replay part of the behaviour-policy id (one place for builder and hook)."""
    ck = card["tiers"]["medium-replay"]
    return (f"replay({ck[0]}..{ck[-1]}):eps-greedy({REPLAY_EPS[0]:g}->{REPLAY_EPS[1]:g},"
            f"{replay_levels(ck)} parts)")


def replay_sources(task_id: str) -> list[tuple[str, Callable, Any]]:
    """medium-replay: [(label, epsilon-greedy policy, (actor, epsilon))], one per part of
    ``replay_schedule`` (the seeds are split equally among them, in order)."""
    import jax.numpy as jnp

    card = read_card(task_id)
    d = behaviour_dir(task_id)
    actors = {c: load_actor(d / f"{c}.npz") for c in card["tiers"]["medium-replay"]}
    return [(f"{c}@eps{eps:.3f}", epsilon_greedy_policy, (actors[c], jnp.float32(eps)))
            for c, eps in replay_schedule(card["tiers"]["medium-replay"])]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Train a SMAX MAPPO behaviour policy")
    p.add_argument("task_id")
    p.add_argument("--budget", default="3M")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument("--config", default="{}", help="JSON overrides of default_config()")
    a = p.parse_args(argv)
    out = Path(a.out) if a.out else behaviour_dir(a.task_id)
    train(a.task_id, out, a.budget, a.seed, log=partial(print, flush=True),
          config=json.loads(a.config))


if __name__ == "__main__":
    main()

"""A value-based SMAX behaviour learner: PQN-VDN (feed-forward), for maps where MAPPO stalls.

    python -m plcql_bench.datasets.smax_pqn smax-5m_vs_6m --budget 3M --out DIR [--config JSON]

Issue 17 asks for a value-based try on 5m_vs_6m, where MAPPO reached a greedy win rate of 0.125 in
78M steps. PQN (Gallici et al. 2024, "Simplifying deep temporal difference learning") is Q-learning
without a replay buffer or target network: many vectorised envs, short rollouts, LayerNorm in the
Q-network, Q(lambda) returns, several epochs over each rollout. PQN-VDN (JaxMARL's
`pqn_vdn_rnn_smax`) learns Q_tot = sum of the agents' Q_i on the team reward. Written from that
description; settings from JaxMARL's `baselines/QLearning/config/alg/pqn_vdn_rnn_smax.yaml` where
they apply (16-step rollouts, epsilon 0.1 -> 0.01 over the first 10 % of updates, 4 epochs x 4
minibatches, RAdam with linear decay, gradient-norm clip 10, gamma 0.99, rewards x 10).

Differences from JaxMARL's, for a CPU budget: no GRU (one shared MLP over [obs, one-hot agent id],
so a checkpoint is an ordinary SMAX behaviour policy: `smax_behaviour.greedy_policy` takes the
argmax of the masked Q-values), 2 x 256 units instead of 512 + GRU, 128 envs instead of 512, and the
lambda-returns are computed once per rollout with the network that collected it. As for MAPPO here,
returns bootstrap through time-limit cuts and not through terminals.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import numpy as np

from plcql_bench.datasets import smax_behaviour as sb
from plcql_bench.datasets.smax_collect import random_policy

ALGO_VERSION = "pqn-vdn-smax-1"


def default_config() -> dict:
    return dict(num_envs=128, rollout=16, epochs=4, minibatches=4, lr=1e-4, gamma=0.99, q_lambda=0.85,
                eps_start=0.1, eps_finish=0.01, eps_decay=0.1, max_grad_norm=10.0, hidden=256,
                ckpt_every=250_000, eval_episodes=sb.CKPT_EVAL_EPISODES, max_wall_s=None, stop_win_rate=None)


def init_params(key, core, cfg):
    """Q-network [obs, one-hot id] -> Q per action: hidden layers with LayerNorm (gain 1, bias 0)."""
    import jax.numpy as jnp

    layers = sb._init_mlp(key, [core.obs_dim + core.n_agents, cfg["hidden"], cfg["hidden"], core.n_actions], 1.0)
    for layer in layers[:-1]:
        layer["ln_g"] = jnp.ones_like(layer["b"])
        layer["ln_b"] = jnp.zeros_like(layer["b"])
    return {"actor": layers}


def optimizer(cfg, total_updates):
    import optax

    steps = total_updates * cfg["epochs"] * cfg["minibatches"]
    return optax.chain(optax.clip_by_global_norm(cfg["max_grad_norm"]),
                       optax.radam(optax.linear_schedule(cfg["lr"], 1e-10, steps)))


def epsilon(cfg, frac):
    """Linear from eps_start to eps_finish over the first eps_decay of the budget, then flat."""
    import jax.numpy as jnp

    t = jnp.clip(frac / cfg["eps_decay"], 0.0, 1.0)
    return cfg["eps_start"] + (cfg["eps_finish"] - cfg["eps_start"]) * t


def lambda_returns(r, term, done, q_next, gamma, lam):
    """Q(lambda) targets over a rollout [T, B]: G_t = r_t + gamma (1 - term_t) B_t, where B_t is
    max Q_tot(s_{t+1}) when the episode ends at t (its next state is a time-limit cut or terminal)
    or t is the rollout's last step, and (1 - lam) max Q_tot(s_{t+1}) + lam G_{t+1} otherwise."""
    import jax
    import jax.numpy as jnp

    def step(g_next, x):
        r_t, term_t, done_t, qn_t = x
        boot = jnp.where(done_t, qn_t, (1.0 - lam) * qn_t + lam * g_next)
        g = r_t + gamma * (1.0 - term_t) * boot
        return g, g

    _, g = jax.lax.scan(step, q_next[-1], (r, term, done, q_next), reverse=True)
    return g


def make_update(core, cfg, opt):
    """One jitted PQN-VDN iteration: an epsilon-greedy rollout (num_envs x rollout), Q(lambda)
    targets on the VDN sum, then epochs x minibatches of squared TD error on Q_tot."""
    import jax
    import jax.numpy as jnp
    import optax

    nenv, T = cfg["num_envs"], cfg["rollout"]
    env_step = jax.vmap(core.step_autoreset)

    def q_masked(q, obs, avail):
        return sb.actor_logits(q, obs, avail)  # unavailable actions at -1e9

    def rollout(params, env_c, ep_ret, key, eps):
        def body(c, _):
            env_c, ep_ret, key = c
            key, ke, ku = jax.random.split(key, 3)
            o = env_c.last
            greedy = jnp.argmax(q_masked(params["actor"], o.obs, o.avail), -1)
            uniform = random_policy(None, o.obs, o.avail, ku)
            a = jnp.where(jax.random.uniform(ke, greedy.shape) < eps, uniform, greedy).astype(jnp.int32)
            env_c2, out = env_step(env_c, a)
            q_next = q_masked(params["actor"], out.next.obs, out.next.avail).max(-1).sum(-1)
            done = out.terminal | out.timeout
            ep_ret = ep_ret + out.reward
            tr = dict(obs=o.obs, avail=o.avail, a=a, r=out.reward * sb.REWARD_SCALE,
                      term=out.terminal.astype(jnp.float32), done=done, q_next=q_next)
            stats = dict(ended=done, won=out.won & done, ret=jnp.where(done, ep_ret, 0.0))
            return (env_c2, jnp.where(done, 0.0, ep_ret), key), (tr, stats)

        (env_c, ep_ret, key), (traj, stats) = jax.lax.scan(body, (env_c, ep_ret, key), None, T)
        return env_c, ep_ret, traj, stats

    def loss_fn(params, mb):
        q = q_masked(params["actor"], mb["obs"], mb["avail"])
        q_tot = jnp.take_along_axis(q, mb["a"][..., None], -1)[..., 0].sum(-1)
        td = q_tot - mb["g"]
        return 0.5 * jnp.square(td).mean(), dict(td_abs=jnp.abs(td).mean(), q_tot=q_tot.mean())

    def update(params, opt_state, env_c, ep_ret, key, frac):
        key, kr, ks = jax.random.split(key, 3)
        env_c, ep_ret, traj, stats = rollout(params, env_c, ep_ret, kr, epsilon(cfg, frac))
        g = lambda_returns(traj["r"], traj["term"], traj["done"], traj["q_next"], cfg["gamma"], cfg["q_lambda"])
        flat = {k: traj[k].reshape((T * nenv,) + traj[k].shape[2:]) for k in ("obs", "avail", "a")}
        flat["g"] = jax.lax.stop_gradient(g).reshape(-1)
        nmb = cfg["minibatches"]
        size = T * nenv // nmb

        def epoch(c, k):
            def mb_step(c, idx):
                params, opt_state = c
                mb = {kk: v[idx] for kk, v in flat.items()}
                (_, info), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, mb)
                upd, opt_state = opt.update(grads, opt_state, params)
                return (optax.apply_updates(params, upd), opt_state), info

            return jax.lax.scan(mb_step, c, jax.random.permutation(k, T * nenv).reshape(nmb, size))

        (params, opt_state), info = jax.lax.scan(epoch, (params, opt_state), jax.random.split(ks, cfg["epochs"]))
        metrics = {k: v.mean() for k, v in info.items()}
        metrics.update(ended=stats["ended"].sum(), won=stats["won"].sum(), ret_sum=stats["ret"].sum())
        return params, opt_state, env_c, ep_ret, key, metrics

    return jax.jit(update)


PQN_VDN = sb.Learner("PQN-VDN (shared MLP Q-network + agent id, LayerNorm, Q(lambda), no target network)",
                     ALGO_VERSION, default_config, init_params, make_update, optimizer)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Train a SMAX PQN-VDN behaviour policy")
    p.add_argument("task_id")
    p.add_argument("--budget", default="3M")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--config", default="{}", help="JSON overrides of default_config()")
    a = p.parse_args(argv)
    sb.train(a.task_id, Path(a.out), a.budget, a.seed, log=partial(print, flush=True),
             config=json.loads(a.config), learner=PQN_VDN)


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()

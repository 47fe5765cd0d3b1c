"""Make the shipped prey networks datasets/assets/prey_mpe-{pp,world}.pt.

OMAR's pretrained DDPG prey (pretrained_adv_model.pt) ships only inside its dataset archives, so we
build our own stand-in, reproducibly and in seconds on a CPU:

1. A scripted "flee" heuristic acts from the prey's own observation: it scores 16 headings by the
   distances from a look-ahead point to the three predators (sum of logs, so the nearest predator
   dominates), minus penalties for leaving [-0.8, 0.8]^2 and for running into obstacles, and
   moves at full speed along the softmax-weighted mean heading.
2. Prey observations are gathered by rolling out the numpy env with that heuristic (plus noise)
   as the prey, against three predator behaviours: chasing with little noise, chasing with
   much noise, and uniform random.
3. The heuristic's clean actions on those observations are distilled by behaviour cloning (MSE,
   Adam) into OMAR's MLPNetwork (BatchNorm input, 64-64 ReLU, tanh output), saved in OMAR's
   `agent_params` layout (3 placeholder predator entries, then the prey).

Usage: python -m plcql_bench.datasets.make_prey [--out datasets/assets] [--seed 0]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from plcql_bench.datasets import scripted
from plcql_bench.suite.envs import mpe, prey

HEURISTIC = "flee-v1"
# prey obs layout: task -> (predator rel-pos start, [(obstacle rel-pos start, size), ...])
LAYOUT = {"mpe-pp": (8, [(4, 0.2), (6, 0.2)]), "mpe-world": (14, [(4, 0.2)])}
_ANGLES = np.linspace(-np.pi, np.pi, 16, endpoint=False)
HEADINGS = np.stack([np.cos(_ANGLES), np.sin(_ANGLES)], axis=1)  # [16, 2]
LOOK, BOUND, TEMP, SPEED = 0.3, 0.8, 0.1, 0.95
ROLLOUT_SEED_BASE = 500_000  # disjoint from evaluation and collection seeds (suite.protocol)


def flee_action(task_id: str, obs: np.ndarray) -> np.ndarray:
    """The scripted prey: obs [N, d] -> action [N, 2] with norm SPEED (< 1, learnable by tanh)."""
    obs = np.asarray(obs, dtype=np.float64)
    pred_at, obstacles = LAYOUT[task_id]
    pos = obs[:, 2:4]
    ahead = pos[:, None] + LOOK * HEADINGS[None]  # [N, 16, 2]
    preds = pos[:, None] + obs[:, pred_at:pred_at + 6].reshape(-1, 3, 2)
    d_pred = np.linalg.norm(ahead[:, :, None] - preds[:, None], axis=-1)  # [N, 16, 3]
    score = np.log(d_pred + 0.05).sum(axis=-1)
    score -= 10.0 * np.maximum(np.abs(ahead) - BOUND, 0.0).sum(axis=-1)
    for start, size in obstacles:
        d_obs = np.linalg.norm(ahead - (pos + obs[:, start:start + 2])[:, None], axis=-1)
        score -= 5.0 * np.maximum(size + 0.1 - d_obs, 0.0)
    w = np.exp((score - score.max(axis=1, keepdims=True)) / TEMP)
    heading = (w[..., None] * HEADINGS).sum(axis=1)
    norm = np.linalg.norm(heading, axis=1, keepdims=True)
    return (SPEED * heading / np.maximum(norm, 1e-8)).astype(np.float32)


def collect_obs(task_id: str, seed: int, envs: int = 512, batches: int = 2) -> np.ndarray:
    """Prey observations visited by the noisy heuristic prey against three predator behaviours."""
    rng = np.random.default_rng(seed)
    task = mpe.make_task(task_id)
    sc = mpe.SCENARIOS[task_id]

    def noisy_flee(o: np.ndarray) -> np.ndarray:
        return np.clip(flee_action(task_id, o) + rng.normal(0, 0.3, (len(o), 2)), -1, 1)

    predators = [scripted.chase_policy(task_id, 0.1, rng), scripted.chase_policy(task_id, 0.6, rng),
                 scripted.random_policy(rng)]
    out, seed_at = [], ROLLOUT_SEED_BASE
    for policy in predators:
        for _ in range(batches):
            env = task.make_env(envs, prey=noisy_flee)
            step = env.reset(seed_at + np.arange(envs))
            seed_at += envs
            for _ in range(mpe.EPISODE_LIMIT):
                out.append(step.state[:, mpe.N_LEARNERS * sc.obs_dim:])
                step = env.step(policy(step))
    return np.concatenate(out).astype(np.float32)


def distill(obs: np.ndarray, target: np.ndarray, seed: int, iters: int = 3000) -> torch.nn.Module:
    """Behaviour cloning into OMAR's MLPNetwork layout; returns the net in eval mode."""
    torch.manual_seed(seed)
    net = prey.prey_network(obs.shape[1])
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x, y = torch.from_numpy(obs), torch.from_numpy(target)
    gen = torch.Generator().manual_seed(seed)
    for it in range(iters):
        idx = torch.randint(0, len(x), (1024,), generator=gen)
        loss = torch.mean((net(x[idx]) - y[idx]) ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if it % 1000 == 0 or it == iters - 1:
            print(f"  iter {it:5d}  bc mse {loss.item():.4f}")
    return net.eval()


def predator_return(task_id: str, prey_fn, episodes: int = 200) -> float:
    """Mean return of the noiseless chase predators against a given prey (for the card)."""
    env = mpe.make_task(task_id).make_env(episodes, prey=prey_fn)
    step, total = env.reset(np.arange(episodes)), np.zeros(episodes)
    chase = scripted.chase_policy(task_id)
    for _ in range(mpe.EPISODE_LIMIT):
        step = env.step(chase(step))
        total += step.reward
    return float(total.mean())


def make(task_id: str, out_dir: Path, seed: int) -> Path:
    start = time.perf_counter()
    torch.set_num_threads(2)
    obs = collect_obs(task_id, seed)
    net = distill(obs, flee_action(task_id, obs), seed)
    path = out_dir / f"prey_{task_id}.pt"
    meta = {"task_id": task_id, "made_by": "plcql_bench.datasets.make_prey", "seed": seed,
            "heuristic": HEURISTIC, "bc_samples": len(obs),
            "note": "behaviour-cloned scripted flee prey; NOT OMAR's pretrained DDPG prey"}
    prey.save_prey_file(path, net.state_dict(), n_predators=mpe.N_LEARNERS, meta=meta)
    loaded = prey.load_prey(path)
    with torch.no_grad():
        gap = np.abs(loaded(obs[:4096]) - net(torch.from_numpy(obs[:4096])).numpy()).max()
    print(f"{task_id}: {len(obs)} samples, numpy/torch max diff {gap:.2e}, "
          f"{time.perf_counter() - start:.1f}s -> {path}")
    for name, fn in [("heuristic", lambda o: flee_action(task_id, o)), ("distilled", loaded),
                     ("still", lambda o: np.zeros((len(o), 2), np.float32))]:
        print(f"  chase predators vs {name:9s} prey: return {predator_return(task_id, fn):7.2f}")
    return path


def main() -> None:
    p = argparse.ArgumentParser(description="Make the shipped MPE prey networks.")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "datasets" / "assets")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    for task_id in LAYOUT:
        make(task_id, args.out, args.seed)


if __name__ == "__main__":
    main()

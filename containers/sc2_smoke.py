"""StarCraft II image smoke test: one episode of uniformly random available actions on each SMAC
map, through the suite's own smac-* adapter (suite/envs/smac.py), so it checks SC2 4.10, the
SMAC maps, the smac package and the adapter's shape checks together. No dataset needed.

    docker run --rm --entrypoint python plcql-bench:sc2 /opt/plcql-bench/containers/sc2_smoke.py [MAP ...]

Prints one line per map and exits 1 if any map fails (the error is printed)."""

from __future__ import annotations

import sys
import traceback

import numpy as np

MAPS = ("2s3z", "3s_vs_5z", "5m_vs_6m", "6h_vs_8z")


def random_episode(map_name: str, env_factory=None, seed: int = 0) -> dict:
    """Play one episode with random available actions; return steps, return and the end flags."""
    from plcql_bench.suite.envs.smac import EPISODE_LIMITS, make_task

    env = make_task(map_name, env_factory).make_env(num_envs=1)
    rng = np.random.default_rng(seed)
    try:
        step = env.reset(np.array([seed]))
        total, steps = 0.0, 0
        while not (step.terminal[0] or step.timeout[0]):
            if steps > EPISODE_LIMITS[map_name]:
                raise RuntimeError(f"{map_name}: no end after {steps} steps")
            actions = [rng.choice(np.flatnonzero(avail)) for avail in step.avail[0]]
            step = env.step(np.array([actions]))
            total, steps = total + float(step.reward[0]), steps + 1
        return {"steps": steps, "return": total, "won": bool(step.info["won"][0]),
                "timeout": bool(step.timeout[0])}
    finally:
        env.close()


def main(maps: list[str], env_factory=None) -> int:
    failed = 0
    for m in maps:
        try:
            r = random_episode(m, env_factory)
            print(f"smac-{m}: ok, {r['steps']} steps, return {r['return']:.2f}, won {r['won']}, "
                  f"timeout {r['timeout']}", flush=True)
        except Exception:  # report every map, then fail
            failed += 1
            print(f"smac-{m}: FAILED", flush=True)
            traceback.print_exc()
    print("SC2-SMOKE OK" if not failed else f"SC2-SMOKE FAILED ({failed} of {len(maps)} maps)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(MAPS)))

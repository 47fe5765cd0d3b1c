"""Our OMAR round against the official code's, in one process, timed in alternation (A B, B A, ...).

    python -m plcql_bench.suite.runs.reference_speed --omar PATH [--rounds 80] [--threads 2] [--clock wall]

PATH is a checkout of ling-pan/OMAR at 0e52ad6 (reference-implementations.md §4.0); nothing of it is
copied into this project: its `algorithms/maddpg.py` and `utils/` are imported from PATH. The
reference runs on CUDA only; three shims let it run on the CPU without changing its arithmetic:
`torch.cuda.FloatTensor(...)` -> `torch.FloatTensor(...)`, `Tensor.cuda()` -> the tensor itself, and
one `.view(-1, A)` of a permuted tensor -> `.reshape(-1, A)` (a copy the torch of its time made
implicitly), with distribution argument validation off (also that torch's default).

Both sides on MPE Cooperative Navigation with OMAR's settings (`task_overrides`, tier medium):
  official  one round = for each of the 3 agents: its ReplayBuffer's sample(1024) (100k random
            transitions) and MATD3.update(sample, agent); then update_all_targets()
  ours      one round = OMAR.update(sampler) on a 100k-transition SyntheticBuffer
The printed statistic is the median of the per-round ratios ours/official with its 95% bootstrap
interval (algorithms/common/speed.py: paired_ratio), with the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types
import warnings
from pathlib import Path

import numpy as np
import torch

from plcql_bench.algorithms.base import get_algorithm, make_config
from plcql_bench.algorithms.common.speed import SyntheticBuffer, paired_ratio
from plcql_bench.suite.runs.runner import configure_process
from plcql_bench.suite.envs.tasks import get_task


def cpu_shims() -> None:
    """Let CUDA-only reference code (OMAR, and CFCQL's continuous code built on it) run on the CPU
    without changing its arithmetic: `torch.cuda.FloatTensor(...)` -> `torch.FloatTensor(...)`,
    `Tensor.cuda()` -> the tensor itself, distribution argument validation off (that torch's default).
    Process-wide."""
    torch.cuda.FloatTensor = lambda *shape: torch.FloatTensor(*shape)  # type: ignore[assignment]
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.distributions.Distribution.set_default_validate_args(False)
    warnings.filterwarnings("ignore", category=FutureWarning)  # their clip_grad_norm (deprecated alias)


def load_official_omar(path: Path):
    """MATD3 and ReplayBuffer from a ling-pan/OMAR checkout, with the CPU shims (module docstring)."""
    cpu_shims()
    sys.path.insert(0, str(path))
    from utils.buffer import ReplayBuffer  # noqa: E402  (from the checkout)

    src = (path / "algorithms" / "maddpg.py").read_text()
    old = "cem_sampled_acs.view(-1, cem_sampled_acs.shape[-1])"
    if old not in src:
        raise SystemExit(f"{path}: algorithms/maddpg.py is not ling-pan/OMAR@0e52ad6 (no {old!r})")
    module = types.ModuleType("omar_official_maddpg")
    module.__file__ = str(path / "algorithms" / "maddpg.py")
    exec(compile(src.replace(old, "cem_sampled_acs.reshape(-1, cem_sampled_acs.shape[-1])"), module.__file__, "exec"),
         module.__dict__)
    return module.MATD3, ReplayBuffer


def build(path: Path, seed: int = 0):
    MATD3, ReplayBuffer = load_official_omar(path)
    spec = get_task("mpe-cn").spec
    n, o, a = spec.n_agents, spec.obs_dim, spec.act_dim
    cls = get_algorithm("omar")
    cfg = make_config(cls, cls.task_overrides(spec, "medium"))
    torch.manual_seed(seed)
    np.random.seed(seed)
    ours = cls(spec, cfg, seed, "cpu")
    buf = SyntheticBuffer(spec, 100_000, "cpu", seed)
    ref = MATD3([{"num_in_pol": o, "num_out_pol": a, "num_in_critic": o + a}] * n, ["MATD3"] * n, gamma=cfg.gamma,
                tau=cfg.tau, lr=cfg.lr, hidden_dim=cfg.hidden, agent_max_actions=[1.0] * n, cql=True,
                cql_alpha=cfg.cql_alpha, lse_temp=cfg.lse_temp, num_sampled_actions=cfg.n_sampled_actions,
                omar=True, omar_coe=cfg.omar_coe, omar_mu=cfg.omar_mu, omar_sigma=cfg.omar_sigma,
                omar_num_samples=cfg.omar_num_samples, omar_num_elites=cfg.omar_num_elites,
                omar_iters=cfg.omar_iters, batch_size=cfg.batch_size, env_id="simple_spread")
    ref.prep_training(device="cpu")
    rb = ReplayBuffer(100_000, n, [o] * n, [a] * n)
    rng = np.random.default_rng(seed)
    for i in range(n):
        rb.obs_buffs[i][:] = rng.normal(size=(100_000, o))
        rb.next_obs_buffs[i][:] = rng.normal(size=(100_000, o))
        rb.ac_buffs[i][:] = rng.uniform(-1, 1, size=(100_000, a))
        rb.rew_buffs[i][:] = rng.normal(size=100_000)
        rb.done_buffs[i][:] = rng.uniform(size=100_000) > 0.98
    rb.filled_i = 100_000

    def official_round():
        for i in range(n):
            ref.update(rb.sample(cfg.batch_size), i)
        ref.update_all_targets()

    return {"ours": lambda: ours.update(buf), "official": official_round}, cfg


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--omar", type=Path, required=True, help="checkout of ling-pan/OMAR (0e52ad6)")
    p.add_argument("--rounds", type=int, default=80)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    configure_process("cpu")  # a run's process settings (kernels, allocator), for both sides
    rounds, cfg = build(args.omar.resolve())
    timer = time.process_time if args.clock == "cpu" else time.perf_counter
    names = list(rounds)
    times: dict[str, list[float]] = {k: [] for k in names}
    for i in range(args.warmup + args.rounds):
        for k in names if i % 2 == 0 else names[::-1]:
            t0 = timer()
            rounds[k]()
            dt = (timer() - t0) * 1e3
            if i >= args.warmup:
                times[k].append(dt)
    r, lo, hi = paired_ratio(times["ours"], times["official"])
    load = os.getloadavg()
    print(f"# OMAR mpe-cn batch {cfg.batch_size}, {args.threads} threads, {args.clock} clock, load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {args.rounds} interleaved rounds: ours "
          f"{statistics.median(times['ours']):.1f} ms, official {statistics.median(times['official']):.1f} ms, "
          f"median per-round ratio ours/official {r:.3f} (95% CI {lo:.3f}-{hi:.3f})")


if __name__ == "__main__":
    main()

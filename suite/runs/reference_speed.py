"""Our update round against the official code's, in one process, timed in alternation (A B, B A, ...).

    plcql-bench bench-speed --official-cfcql PATH [--task mpe-cn] [--task mamujoco-halfcheetah-2x3] [--rounds 80]
    plcql-bench bench-speed --official-omar PATH [--rounds 80] [--threads 2] [--clock wall]
    python -m plcql_bench.suite.runs.reference_speed --cfcql PATH | --omar PATH [--task T] [--rounds 80] ...

PATH is the user's checkout of the reference code: thu-rllab/CFCQL (its `continuous/` code, reference-
implementations.md §4.3) or ling-pan/OMAR at 0e52ad6 (§4.0). Nothing of it is copied into this project: its
modules are imported from PATH. The reference runs on CUDA only; shims let it run on the CPU without
changing its arithmetic: `torch.cuda.FloatTensor(...)` -> `torch.FloatTensor(...)`, `Tensor.cuda()` -> the
tensor itself, distribution argument validation off (that torch's default), and in OMAR one `.view(-1, A)`
of a permuted tensor -> `.reshape(-1, A)` (a copy the torch of its time made implicitly).

Both sides get the same shapes: our algorithm's config for the task (`task_overrides`, tier medium), and the
official agent built for those sizes (CFCQL: by its own `init_from_env` with its main.py's settings for the
scenario; OMAR: `MATD3(...)` with our config's values), each with a random buffer of --buffer-size
transitions of its own kind:

  CFCQL   official  one round = `update(sample)` + (ca_ratio - 1) = 4 x `update(sample, only_critic=True)`,
                    each on its own `ReplayBuffer.sample(B)`, then `update_all_targets()` (main.py's loop)
          ours      one round = CFCQL.update(sampler): the same 5 batches and updates
  OMAR    official  one round = for each of the n agents: its own `ReplayBuffer.sample(B)` and
                    `MATD3.update(sample, agent)`; then `update_all_targets()`
          ours      one round = OMAR.update(sampler): ONE batch that every agent's update shares

The rounds include each side's own sampling, as in training. The printed statistic is the median of the
per-round ratios ours/official with its 95% bootstrap interval (algorithms/common/speed.py: paired_ratio),
with the load average; the sampling of one batch is also timed alone, interleaved, and the lines after the
ratio say where the two sides' rounds differ (sampling, batches per round, logging).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import time
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from plcql_bench.algorithms.base import get_algorithm, make_config
from plcql_bench.algorithms.common.speed import SyntheticBuffer, paired_ratio
from plcql_bench.suite.runs.runner import configure_process
from plcql_bench.suite.envs.tasks import get_task

# The official settings, shared by the official-code scorer (suite/runs/reference_score.py) and the timing here.
# main.py's argparse defaults for MPE (ling-pan/OMAR@0e52ad6), passed to init_from_env as its main.py does
OMAR_SETTINGS = dict(tau=0.01, lr=0.01, hidden_dim=64, cql=1, lse_temp=1.0, batch_size=1024,
                     num_sampled_actions=10, omar=1, omar_iters=3, omar_mu=0.0, omar_sigma=2.0,
                     omar_num_samples=10, omar_num_elites=10)
# thu-rllab/CFCQL continuous/main.py: its argparse defaults with the README's `--cql --cf_cql --central_critic`
# (lr 0.01: main.py's simple_spread override), passed to MATD3CC.init_from_env as its main.py does
CFCQL_SETTINGS = dict(tau=0.01, lr=0.01, hidden_dim=64, cql=True, lse_temp=1.0, batch_size=1024,
                      num_sampled_actions=10, omar=False, omar_iters=3, omar_mu=0.0, omar_sigma=2.0,
                      omar_num_samples=10, omar_num_elites=10, env_info=None, logging_interval=100, no_log=True,
                      cf_cql=True, soft_q=True, action_noise_scale=0.05, cf_omar=True, cf_tau=1.0,
                      no_action_reg=False, bc_tau=0.0, sample_action_class="1-1-1", beta_action_noise=1e-5,
                      cf_pol=True, cf_target=False)
CFCQL_CA_RATIO = 5  # --ca_ratio 5
BATCH = 1024
# The suite's tasks the official code runs on: its scenario name, its prey count, and the lr its main.py sets
# per scenario (CFCQL: simple_spread overrides --lr 0.001 with 0.01; OMAR keeps 0.01 on all three).
SCENARIOS = {
    "mpe-cn": dict(env_id="simple_spread", preys=0, cfcql_lr=0.01),
    "mpe-pp": dict(env_id="simple_tag", preys=1, cfcql_lr=0.001),
    "mpe-world": dict(env_id="simple_world", preys=1, cfcql_lr=0.001),
}
# Which suite tasks each official code is timed on, and its scenario name there.
OFFICIAL_TASKS = {
    "cfcql": {"mpe-cn": "simple_spread", "mamujoco-halfcheetah-2x3": "HalfCheetah-v2"},
    "omar": {"mpe-cn": "simple_spread"},
}
# thu-rllab/CFCQL continuous/main.py's Half-Cheetah settings (it overrides its MPE defaults with these)
CFCQL_HALFCHEETAH = dict(batch_size=256, hidden_dim=256, lr=0.0003, tau=0.005, omar_iters=2, omar_num_samples=50,
                         omar_num_elites=5)


class CheckoutError(ValueError):
    """PATH is not the reference checkout the loader expects; the message names the missing file."""


def cpu_shims() -> None:
    """Let CUDA-only reference code (OMAR, and CFCQL's continuous code built on it) run on the CPU
    without changing its arithmetic: `torch.cuda.FloatTensor(...)` -> `torch.FloatTensor(...)`,
    `Tensor.cuda()` -> the tensor itself, distribution argument validation off (that torch's default).
    Process-wide."""
    torch.cuda.FloatTensor = lambda *shape: torch.FloatTensor(*shape)  # type: ignore[assignment]
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.distributions.Distribution.set_default_validate_args(False)
    warnings.filterwarnings("ignore", category=FutureWarning)  # their clip_grad_norm (deprecated alias)


def _load_module(name: str, source: Path, text: str | None = None) -> types.ModuleType:
    """Execute a checkout's source file as module `name` (its text, or `text` when patched)."""
    module = types.ModuleType(name)
    module.__file__ = str(source)
    exec(compile(text if text is not None else source.read_text(), module.__file__, "exec"), module.__dict__)
    return module


def _use_checkout(code: Path) -> None:
    """Make `import utils...` load `code`'s package: both reference codes name their helpers `utils`, so one
    loaded before (the other checkout's) is dropped from sys.modules first; modules already built from it keep
    theirs."""
    for name in [m for m in sys.modules if m == "utils" or m.startswith("utils.")]:
        del sys.modules[name]
    sys.path[:] = [str(code)] + [p for p in sys.path if p != str(code)]


def load_official_omar(path: Path):
    """MATD3 and ReplayBuffer from a ling-pan/OMAR checkout, with the CPU shims (module docstring)."""
    source = path / "algorithms" / "maddpg.py"
    if not source.is_file() or not (path / "utils" / "buffer.py").is_file():
        raise CheckoutError(f"{path}: not a ling-pan/OMAR checkout (no algorithms/maddpg.py or utils/buffer.py)")
    src = source.read_text()
    old = "cem_sampled_acs.view(-1, cem_sampled_acs.shape[-1])"
    if old not in src:
        raise CheckoutError(f"{path}: algorithms/maddpg.py is not ling-pan/OMAR@0e52ad6 (no {old!r})")
    cpu_shims()
    _use_checkout(path)
    from utils.buffer import ReplayBuffer  # noqa: E402  (from the checkout)

    module = _load_module("omar_official_maddpg", source,
                          src.replace(old, "cem_sampled_acs.reshape(-1, cem_sampled_acs.shape[-1])"))
    return module.MATD3, ReplayBuffer


def load_official_cfcql(path: Path):
    """MATD3CC and ReplayBuffer from a thu-rllab/CFCQL checkout (`continuous/`), with the CPU shims. Its
    logging module imports tensorboard_logger, which its training with no_log never calls: a stand-in."""
    code = path / "continuous"
    source = code / "algorithms" / "maddpg_cc.py"
    if not source.is_file() or not (code / "utils" / "buffer.py").is_file():
        raise CheckoutError(f"{path}: not a thu-rllab/CFCQL checkout (no continuous/algorithms/maddpg_cc.py "
                            "or continuous/utils/buffer.py)")
    cpu_shims()
    if "tensorboard_logger" not in sys.modules:
        stub = types.ModuleType("tensorboard_logger")
        stub.configure = stub.log_value = lambda *a, **k: None
        sys.modules["tensorboard_logger"] = stub
    _use_checkout(code)
    from utils.buffer import ReplayBuffer  # noqa: E402  (from the checkout)

    return _load_module("cfcql_official_maddpg_cc", source).MATD3CC, ReplayBuffer


@dataclass
class PairedRounds:
    """Our round and the official round on the same shapes, and each side's sampling of one batch."""

    code: str                                   # "cfcql" | "omar"
    task: str
    rounds: dict[str, Callable[[], object]]     # {"ours": ..., "official": ...}
    sample: dict[str, Callable[[], object]]     # one batch of each side's buffer
    batches: dict[str, int]                     # batches each side samples per round
    shapes: str                                 # what both sides run: batch, hidden, agents
    differences: list[str] = field(default_factory=list)
    official_agent: object = None               # the official code's agent object


def random_official_buffer(ReplayBuffer, size: int, n: int, obs_dim: int, act_dim: int, rng,
                           state_dim: int | None = None):
    """The official per-agent ReplayBuffer filled with `size` random transitions (its float64 arrays)."""
    kw = dict(is_mamujoco=True, state_dims=[state_dim] * n) if state_dim else {}
    rb = ReplayBuffer(size, n, [obs_dim] * n, [act_dim] * n, **kw)
    for i in range(n):
        rb.obs_buffs[i][:] = rng.normal(size=(size, obs_dim))
        rb.next_obs_buffs[i][:] = rng.normal(size=(size, obs_dim))
        rb.ac_buffs[i][:] = rng.uniform(-1, 1, size=(size, act_dim))
        rb.rew_buffs[i][:] = rng.normal(size=size)
        rb.done_buffs[i][:] = rng.uniform(size=size) > 0.98
        if state_dim:
            rb.state_buffs[i][:] = rng.normal(size=(size, state_dim))
            rb.next_state_buffs[i][:] = rng.normal(size=(size, state_dim))
    rb.filled_i = size
    return rb


def _ours(code: str, task_id: str, seed: int, buffer_size: int):
    """(our algorithm, its config, its synthetic buffer, the task spec) for the pair."""
    spec = get_task(task_id).spec
    cls = get_algorithm(code)
    cfg = make_config(cls, cls.task_overrides(spec, "medium"))
    torch.manual_seed(seed)
    np.random.seed(seed)
    return cls(spec, cfg, seed, "cpu"), cfg, SyntheticBuffer(spec, buffer_size, "cpu", seed), spec


def sampling_note(buffer_size: int) -> str:
    return (f"sampling: the official ReplayBuffer.sample draws without replacement (np.random.choice over all "
            f"{buffer_size:,} indices: its cost grows with the buffer; the paper's tiers hold 1M) and copies each "
            "agent's float64 arrays to float32 tensors; ours draws with replacement (torch.randint) from float32 "
            "tensors")


def cfcql_pair(path: Path, task_id: str, seed: int = 0, buffer_size: int = 100_000) -> PairedRounds:
    """Our CFCQL round and the official MATD3CC round (module docstring) on `task_id`'s shapes."""
    MATD3CC, ReplayBuffer = load_official_cfcql(path)
    ours, cfg, buf, spec = _ours("cfcql", task_id, seed, buffer_size)
    n, o, a, s = spec.n_agents, spec.obs_dim, spec.act_dim, spec.state_dim
    box = types.SimpleNamespace
    space = box(shape=(a,), high=np.ones(a))
    scenario = OFFICIAL_TASKS["cfcql"][task_id]
    if scenario == "HalfCheetah-v2":
        settings = {**CFCQL_SETTINGS, **CFCQL_HALFCHEETAH,
                    "env_info": {"n_agents": n, "action_spaces": [space] * n, "obs_shape": o, "state_shape": s}}
        env = box(action_space=[space] * n, observation_space=[box(shape=(o,))] * n)
    else:
        settings = {**CFCQL_SETTINGS, "lr": SCENARIOS[task_id]["cfcql_lr"]}
        env = box(action_space=[space] * n, observation_space=[box(shape=(o,))] * n, agent_types=["agent"] * n)
    torch.manual_seed(seed)
    ref = MATD3CC.init_from_env(env, scenario, "medium", **settings)
    ref.prep_training(device="cpu")
    if (settings["batch_size"], settings["hidden_dim"]) != (cfg.batch_size, cfg.hidden):
        raise CheckoutError(f"{task_id}: the official settings (batch {settings['batch_size']}, hidden "
                            f"{settings['hidden_dim']}) differ from ours ({cfg.batch_size}, {cfg.hidden})")
    rb = random_official_buffer(ReplayBuffer, buffer_size, n, o, a, np.random.default_rng(seed),
                                s if scenario == "HalfCheetah-v2" else None)
    bsz = cfg.batch_size
    counter = {"t": 0}

    def official_round():
        t = counter["t"] = counter["t"] + 100  # main.py's env-step clock; only its (off) logging reads it
        ref.update(rb.sample(bsz), t)
        for j in range(CFCQL_CA_RATIO - 1):
            ref.update(rb.sample(bsz), t + j + 1, only_critic=True)
        ref.update_all_targets()

    return PairedRounds(
        "cfcql", task_id, {"ours": lambda: ours.update(buf), "official": official_round},
        {"ours": lambda: buf(bsz), "official": lambda: rb.sample(bsz)},
        {"ours": cfg.ca_ratio, "official": CFCQL_CA_RATIO},
        f"n={n}, batch {bsz}, hidden {cfg.hidden}, {cfg.n_sampled_actions} sampled actions per agent, "
        f"{cfg.ca_ratio} critic updates a round",
        [sampling_note(buffer_size),
         f"batches per round: both {CFCQL_CA_RATIO} (one critic + actor update and {CFCQL_CA_RATIO - 1} critic-only "
         "updates, each on its own batch)",
         "logging: the official update runs with no_log (its main.py logs every 100 env steps: .item() host "
         "copies); ours returns its round's metrics every round (one host copy)",
         "arithmetic: ours runs the runner's kernels (fused, cache-blocked CF-CQL penalty; "
         "docs/algorithms/cfcql.md, 'Speed'), the official code plain torch; the same losses (tests/test_speed_equivalence.py)"],
        ref)


def omar_pair(path: Path, task_id: str = "mpe-cn", seed: int = 0, buffer_size: int = 100_000) -> PairedRounds:
    """Our OMAR round and the official MATD3 round (module docstring) on CN's shapes."""
    MATD3, ReplayBuffer = load_official_omar(path)
    ours, cfg, buf, spec = _ours("omar", task_id, seed, buffer_size)
    n, o, a = spec.n_agents, spec.obs_dim, spec.act_dim
    torch.manual_seed(seed)
    ref = MATD3([{"num_in_pol": o, "num_out_pol": a, "num_in_critic": o + a}] * n, ["MATD3"] * n, gamma=cfg.gamma,
                tau=cfg.tau, lr=cfg.lr, hidden_dim=cfg.hidden, agent_max_actions=[1.0] * n, cql=True,
                cql_alpha=cfg.cql_alpha, lse_temp=cfg.lse_temp, num_sampled_actions=cfg.n_sampled_actions,
                omar=True, omar_coe=cfg.omar_coe, omar_mu=cfg.omar_mu, omar_sigma=cfg.omar_sigma,
                omar_num_samples=cfg.omar_num_samples, omar_num_elites=cfg.omar_num_elites,
                omar_iters=cfg.omar_iters, batch_size=cfg.batch_size, env_id=OFFICIAL_TASKS["omar"][task_id])
    ref.prep_training(device="cpu")
    rb = random_official_buffer(ReplayBuffer, buffer_size, n, o, a, np.random.default_rng(seed))
    bsz = cfg.batch_size

    def official_round():
        for i in range(n):
            ref.update(rb.sample(bsz), i)
        ref.update_all_targets()

    return PairedRounds(
        "omar", task_id, {"ours": lambda: ours.update(buf), "official": official_round},
        {"ours": lambda: buf(bsz), "official": lambda: rb.sample(bsz)},
        {"ours": 1, "official": n},
        f"n={n}, batch {bsz}, hidden {cfg.hidden}, {cfg.omar_iters} CEM iterations x {cfg.omar_num_samples} samples",
        [sampling_note(buffer_size),
         f"batches per round: the official code draws one batch per agent ({n} a round, each agent's update on its "
         "own); ours draws ONE that all agents' updates share, so it samples n times less",
         "logging: the official update logs nothing here (no logger passed); ours returns its round's metrics "
         "every round (one host copy)"],
        ref)


CHECKOUT_FILES = {"cfcql": ("thu-rllab/CFCQL", ("continuous/algorithms/maddpg_cc.py", "continuous/utils/buffer.py")),
                  "omar": ("ling-pan/OMAR", ("algorithms/maddpg.py", "utils/buffer.py"))}


def check(code: str, path: Path, tasks) -> None:
    """CheckoutError, before anything is timed, for a task the official code is not timed on or a PATH without
    the checkout's files."""
    for task_id in tasks:
        if task_id not in OFFICIAL_TASKS[code]:
            raise CheckoutError(f"--task {task_id}: the official {code.upper()} round is timed on "
                                f"{', '.join(OFFICIAL_TASKS[code])} only")
    repo, files = CHECKOUT_FILES[code]
    if not all((Path(path) / f).is_file() for f in files):
        raise CheckoutError(f"{path}: not a {repo} checkout (no {' or '.join(files)})")


def make_pair(code: str, path: Path, task_id: str, seed: int = 0, buffer_size: int = 100_000) -> PairedRounds:
    """The pair for `code` on `task_id`; CheckoutError names an unsupported task or a wrong checkout."""
    check(code, path, [task_id])
    build = cfcql_pair if code == "cfcql" else omar_pair
    with contextlib.redirect_stdout(io.StringIO()):  # the official constructors print their settings
        return build(Path(path).resolve(), task_id, seed, buffer_size)


def time_alternating(fns: dict[str, Callable[[], object]], rounds: int, warmup: int, clock: str) -> dict[str, list]:
    """Milliseconds of each call of each fn, called in alternation (A B, then B A, ...); warm-up calls untimed."""
    timer = time.process_time if clock == "cpu" else time.perf_counter
    names = list(fns)
    times: dict[str, list[float]] = {k: [] for k in names}
    for i in range(warmup + rounds):
        for k in names if i % 2 == 0 else names[::-1]:
            t0 = timer()
            fns[k]()
            dt = (timer() - t0) * 1e3
            if i >= warmup:
                times[k].append(dt)
    return times


def compare(pair: PairedRounds, rounds: int = 80, warmup: int = 3, threads: int | None = None,
            clock: str = "wall", sample_rounds: int = 50) -> dict:
    """Time the pair's rounds and its sampling, each interleaved; returns the medians, the paired ratio
    ours/official with its 95% interval and the load average at the start."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    times = time_alternating(pair.rounds, rounds, warmup, clock)
    samples = time_alternating(pair.sample, sample_rounds, 2, clock)
    ratio, lo, hi = paired_ratio(times["ours"], times["official"])
    return {"load": load, "rounds": rounds, "clock": clock, "threads": threads or torch.get_num_threads(),
            "ms": {k: statistics.median(v) for k, v in times.items()},
            "sample_ms": {k: statistics.median(v) for k, v in samples.items()},
            "ratio": ratio, "ci": (lo, hi)}


def report(pair: PairedRounds, r: dict) -> list[str]:
    """The comparison's lines: the ratio line, then the sampling line and the differences."""
    load, ms, smp = r["load"], r["ms"], r["sample_ms"]
    lines = [f"# official {pair.code.upper()} vs ours, {pair.task} ({pair.shapes}), {r['threads']} torch thread(s), "
             f"{r['clock']} clock, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {r['rounds']} interleaved "
             f"rounds: ours {ms['ours']:.1f} ms, official {ms['official']:.1f} ms, median per-round ratio "
             f"ours/official {r['ratio']:.3f} (95% CI {r['ci'][0]:.3f}-{r['ci'][1]:.3f})"]
    per_round = {k: smp[k] * pair.batches[k] for k in smp}
    lines.append(f"#   sampling one batch, interleaved: ours {smp['ours']:.2f} ms, official {smp['official']:.2f} ms; "
                 f"per round ({pair.batches['ours']} vs {pair.batches['official']} batches) ours "
                 f"{per_round['ours']:.1f} ms, official {per_round['official']:.1f} ms, inside the rounds above")
    lines += [f"#   differs: {d}" for d in pair.differences]
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--omar", type=Path, help="checkout of ling-pan/OMAR (0e52ad6)")
    which.add_argument("--cfcql", type=Path, help="checkout of thu-rllab/CFCQL")
    p.add_argument("--task", action="append", default=None, help="default: mpe-cn")
    p.add_argument("--rounds", type=int, default=80)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    p.add_argument("--buffer-size", type=int, default=100_000)
    args = p.parse_args(argv)
    code, path = ("omar", args.omar) if args.omar else ("cfcql", args.cfcql)
    for line in run(code, path, args.task or ["mpe-cn"], args.rounds, args.warmup, args.threads, args.clock,
                    args.buffer_size):
        print(line, flush=True)


def run(code: str, path: Path, tasks, rounds: int, warmup: int, threads: int, clock: str,
        buffer_size: int = 100_000):
    """Yield the report lines of each task's comparison (bench-speed --official-cfcql / --official-omar).
    Both sides run with the runner's process settings (`configure_process`: allocator, kernels)."""
    torch.set_num_threads(threads)
    configure_process("cpu")
    for task_id in tasks:
        pair = make_pair(code, path, task_id, buffer_size=buffer_size)
        yield from report(pair, compare(pair, rounds, warmup, threads, clock))


if __name__ == "__main__":
    try:
        main()
    except CheckoutError as exc:
        raise SystemExit(str(exc)) from None

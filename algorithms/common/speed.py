"""Timing helper: median wall-clock milliseconds per update round on a synthetic in-memory buffer.

    from plcql_bench.algorithms.common.speed import time_update_rounds
    time_update_rounds("cfcql", spec, {"hidden": 64, "batch_size": 1024, "lr": 0.01}, rounds=20)
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from plcql_bench.algorithms.base import Batch, batch_kind, get_algorithm, make_config
from plcql_bench.suite.core.spec import TaskSpec
from plcql_bench.algorithms.common import kernels
from plcql_bench.algorithms.common.stacked import SeedStack, stackable
from plcql_bench.datasets.episodes import EpisodeSampler
from plcql_bench.datasets.format import synthetic_dataset
from plcql_bench.suite.envs import protocol


class SyntheticBuffer:
    """N random transitions held as tensors on `device`; calling it samples a Batch."""

    def __init__(self, spec: TaskSpec, size: int = 100_000, device: str = "cpu", seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        n, o, s, a = spec.n_agents, spec.obs_dim, spec.state_dim, spec.act_dim
        self.size, self.spec, self.device = size, spec, torch.device(device)
        self.g = torch.Generator(device=self.device).manual_seed(seed)

        def r(*shape):
            return torch.randn(*shape, generator=g)

        def act():
            if spec.discrete:
                return torch.randint(0, a, (size, n), generator=g)
            return torch.rand(size, n, a, generator=g) * 2 - 1

        d = dict(obs=r(size, n, o), state=r(size, s), actions=act(), rewards=r(size),
                 next_obs=r(size, n, o), next_state=r(size, s), next_actions=act(),
                 next_actions_valid=(torch.rand(size, generator=g) > 0.04).float(),
                 terminals=(torch.rand(size, generator=g) > 0.98).float())
        self.data = {k: v.to(self.device) for k, v in d.items()}

    def __call__(self, batch_size: int) -> Batch:
        idx = torch.randint(0, self.size, (batch_size,), generator=self.g, device=self.device)
        return Batch(**{k: v.index_select(0, idx) for k, v in self.data.items()})  # as the runner's Sampler


def synthetic_episodes(spec: TaskSpec, n_episodes: int = 128, seed: int = 0, device: str = "cpu"):
    """An EpisodeSampler over random SMAX-shaped episodes of the task's episode limit (for timing
    episode-batch algorithms: every batch is padded to the full limit, the worst case)."""

    arrays, _ = synthetic_dataset(spec, n_episodes=n_episodes, episode_len=spec.episode_limit, seed=seed)
    return EpisodeSampler(arrays, seed, device)


# Episodes that episode-batch algorithms time on instead of synthetic full-length ones
# (`bench-speed --episodes-from FILE`): a dataset's arrays, so batches have its episodes' real lengths.
_EPISODE_ARRAYS: dict[str, Any] | None = None


def time_on_dataset_episodes(arrays: dict[str, Any] | None) -> None:
    """Episode-batch algorithms time on these dataset arrays (None: synthetic episodes, every one of the
    task's full episode limit, the worst case)."""
    global _EPISODE_ARRAYS
    _EPISODE_ARRAYS = arrays


def make_buffer(cls: type, spec: TaskSpec, size: int, device: str, seed: int):
    """SyntheticBuffer (transitions) or episodes (synthetic, or a dataset's: `time_on_dataset_episodes`),
    as the algorithm's batch_kind asks."""
    if batch_kind(cls) == "episodes":
        if _EPISODE_ARRAYS is not None:
            return EpisodeSampler(_EPISODE_ARRAYS, seed, device)
        return synthetic_episodes(spec, max(8, min(128, size // max(spec.episode_limit, 1))), seed, device)
    return SyntheticBuffer(spec, size, device, seed)


# The discrete CFCQL family trains its behaviour model on 10M sampled timesteps before its first round
# (a one-time cost of minutes on SMAX that no round repeats); timing stops it after this many updates.
TIMING_BEHAVIOUR_UPDATES = 20


def timing_config(cls: type, overrides: dict[str, Any]):
    """The algorithm's config for timing: `overrides`, with the behaviour model's one-time training
    capped at TIMING_BEHAVIOUR_UPDATES updates (a round's cost does not depend on it)."""
    ov = dict(overrides)
    if "behaviour_max_updates" in getattr(cls.Config, "__dataclass_fields__", {}):
        cap = int(ov.get("behaviour_max_updates", cls.Config.behaviour_max_updates))  # 0 = no cap
        ov["behaviour_max_updates"] = TIMING_BEHAVIOUR_UPDATES if cap <= 0 else min(cap, TIMING_BEHAVIOUR_UPDATES)
    return make_config(cls, ov)


def batch_field(cls: type) -> str:
    """The config field that holds the batch: transitions, or episodes for episode-batch algorithms."""
    return "batch_episodes" if batch_kind(cls) == "episodes" else "batch_size"


def batch_size_of(cls: type, overrides: dict[str, Any]) -> int:
    field = batch_field(cls)
    return int(overrides.get(field, getattr(cls.Config(), field)))


def time_update_rounds(algo_name: str, spec: TaskSpec, overrides: dict[str, Any] | None = None,
                       rounds: int = 20, batch_size: int | None = None, warmup: int = 3,
                       device: str = "cpu", seed: int = 0, buffer_size: int = 100_000,
                       clock: str = "wall", flops: bool = False) -> dict[str, float]:
    """Build `algo_name` on `spec` with `overrides` (batch_size overrides the config's), run `warmup`
    untimed rounds and then `rounds` timed rounds; returns median/mean/min/max ms per round (and, with
    `flops`, the FLOPs of one more round: `round_flops`).
    clock="cpu" measures this process's CPU time instead of wall time: on a shared, oversubscribed
    machine it is the stable number, and with 1 torch thread it equals the quiet-machine wall time."""
    timer = time.process_time if clock == "cpu" else time.perf_counter
    cls = get_algorithm(algo_name, discrete=spec.discrete)
    ov = dict(overrides or {})
    if batch_size is not None:
        ov[batch_field(cls)] = batch_size
    torch.manual_seed(seed)
    np.random.seed(seed)
    algo = cls(spec, timing_config(cls, ov), seed, device)
    buf = make_buffer(cls, spec, buffer_size, device, seed)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(warmup):
        algo.update(buf)
    sync()
    times = []
    for _ in range(rounds):
        t0 = timer()
        algo.update(buf)
        sync()
        times.append((timer() - t0) * 1e3)
    out = {"median_ms": statistics.median(times), "mean_ms": statistics.fmean(times),
           "min_ms": min(times), "max_ms": max(times), "rounds": rounds}
    if flops:
        out["flops"] = round_flops(algo, buf)
    if hasattr(algo, "compute_target"):  # target construction alone (the PAR part that PLCQL cuts from n to 1)
        bs = batch_size_of(cls, ov)
        tt = []
        # episode batches (discrete, ~seconds per target at n = 6): as many as the timed rounds
        for _ in range(rounds if batch_kind(cls) == "episodes" else max(rounds, 10)):
            batch = buf(bs)
            t0 = timer()
            algo.compute_target(batch)
            sync()
            tt.append((timer() - t0) * 1e3)
        out["target_median_ms"] = statistics.median(tt)
    return out


def time_interleaved(names: list[str], spec: TaskSpec, overrides: dict[str, dict[str, Any]], rounds: int = 20,
                     warmup: int = 2, device: str = "cpu", seed: int = 0, clock: str = "wall",
                     batch_size: int | None = None) -> dict[str, list[float]]:
    """Milliseconds of each timed round of several algorithms run in alternation, so that a shared
    machine's changing load hits all of them alike. The order alternates too (A B, then B A, ...), so
    neither always runs right after the other. Use it, with `paired_ratio`, to compare."""
    return time_variants({n: (n, overrides.get(n, {}), None) for n in names}, spec, rounds, warmup, device,
                         seed, clock, batch_size)


def time_variants(variants: dict[str, tuple[str, dict[str, Any], Callable[[], Any] | None]], spec: TaskSpec,
                  rounds: int = 20, warmup: int = 2, device: str = "cpu", seed: int = 0, clock: str = "wall",
                  batch_size: int | None = None) -> dict[str, list[float]]:
    """`time_interleaved` for labelled variants {label: (algorithm, overrides, context)}: a variant is
    built and each of its rounds runs inside `context()` when one is given (e.g. kernels.fused_kernels(False),
    to time the plain torch path against the fused kernels of the same algorithm)."""
    labels = list(variants)
    algos, contexts = {}, {}
    buf = make_buffer(get_algorithm(variants[labels[0]][0], discrete=spec.discrete), spec, 100_000, device, seed)
    for label, (name, overrides, context) in variants.items():
        cls = get_algorithm(name, discrete=spec.discrete)
        ov = dict(overrides)
        if batch_size is not None:
            ov[batch_field(cls)] = batch_size
        contexts[label] = context or contextlib.nullcontext
        torch.manual_seed(seed)
        with contexts[label]():
            algos[label] = cls(spec, timing_config(cls, ov), seed, device)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {n: [] for n in labels}
    timer = time.process_time if clock == "cpu" else time.perf_counter
    for i in range(warmup + rounds):
        order = labels if i % 2 == 0 else labels[::-1]
        for label in order:
            with contexts[label]():
                t0 = timer()
                algos[label].update(buf)
                sync()
                dt = (timer() - t0) * 1e3
            if i >= warmup:
                times[label].append(dt)
    return times


def time_targets_interleaved(names: list[str], spec: TaskSpec, overrides: dict[str, dict[str, Any]],
                             rounds: int = 20, warmup: int = 2, device: str = "cpu", seed: int = 0,
                             clock: str = "wall", batch_size: int | None = None) -> dict[str, list[float]]:
    """Milliseconds of each algorithm's target construction alone (`compute_target`), all of them on the SAME
    batch each time, in alternation (A B, then B A, ...): the part of a round where PLCQL builds 1 PAR target
    and SPaCQL n. Use it, with `paired_ratio`, to compare; whole rounds: `time_interleaved`."""
    cls0 = get_algorithm(names[0], discrete=spec.discrete)
    buf = make_buffer(cls0, spec, 100_000, device, seed)
    algos = {}
    for name in names:
        cls = get_algorithm(name, discrete=spec.discrete)
        ov = dict(overrides.get(name, {}))
        if batch_size is not None:
            ov[batch_field(cls)] = batch_size
        torch.manual_seed(seed)
        algos[name] = cls(spec, timing_config(cls, ov), seed, device)
    sizes = {batch_size_of(type(a), overrides.get(n, {}) if batch_size is None else {batch_field(type(a)): batch_size})
             for n, a in algos.items()}
    if len(sizes) != 1:
        raise ValueError(f"time_targets_interleaved: {names} train on different batches ({sorted(sizes)})")
    bs = sizes.pop()
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    timer = time.process_time if clock == "cpu" else time.perf_counter
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(warmup + rounds):
        batch = buf(bs)  # one draw, shared by the algorithms of this pair
        for name in names if i % 2 == 0 else names[::-1]:
            t0 = timer()
            algos[name].compute_target(batch)
            sync()
            if i >= warmup:
                times[name].append((timer() - t0) * 1e3)
    return times


def _seed_runs(algo_name: str, spec: TaskSpec, overrides: dict[str, Any], n: int, device: str,
               batch_size: int | None):
    """(class, timing config, one synthetic buffer per seed 0..n-1): what the multi-run timers share."""
    cls = get_algorithm(algo_name, discrete=spec.discrete)
    ov = dict(overrides)
    if batch_size is not None:
        ov[batch_field(cls)] = batch_size
    cfg = timing_config(cls, ov)
    return cls, cfg, [make_buffer(cls, spec, 100_000, device, s) for s in range(n)]


def time_stacked(algo_name: str, spec: TaskSpec, overrides: dict[str, Any], n_seeds: int, rounds: int = 20,
                 warmup: int = 2, device: str = "cpu", clock: str = "wall", batch_size: int | None = None,
                 count_ops: bool = False) -> dict[str, Any]:
    """Milliseconds of `n_seeds` separate runs' rounds (one round each, back to back, the runner's default
    kernels) against one round of the same seeds as a SeedStack (algorithms/common/stacked.py), in
    alternation (A B, then B A, ...): {"separate": [...], "stacked": [...]}, one entry per timed pair. Their
    ratio separate/stacked is the stack's gain in runs per hour, for runs sharing one process's device.
    `count_ops`: also {"ops": {"separate": n, "stacked": m}}, the operators each dispatches (`dispatched_ops`)."""

    cls, cfg, bufs = _seed_runs(algo_name, spec, overrides, n_seeds, device, batch_size)
    seeds = range(n_seeds)
    separate = [cls(spec, cfg, s, device) for s in seeds]
    stack = SeedStack([cls(spec, cfg, s, device) for s in seeds])
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    timer = time.process_time if clock == "cpu" else time.perf_counter

    def separate_rounds():
        for algo, buf in zip(separate, bufs):
            algo.update(buf)

    variants = {"separate": separate_rounds, "stacked": lambda: stack.update(bufs)}
    times: dict[str, Any] = {k: [] for k in variants}
    for i in range(warmup + rounds):
        for label in (list(variants) if i % 2 == 0 else list(variants)[::-1]):
            t0 = timer()
            variants[label]()
            sync()
            if i >= warmup:
                times[label].append((timer() - t0) * 1e3)
    if count_ops:
        times["ops"] = {label: dispatched_ops(fn) for label, fn in variants.items()}
    return times


def time_packings(algo_name: str, spec: TaskSpec, overrides: dict[str, Any], n_runs: int, rounds: int = 10,
                  warmup: int = 1, device: str = "cpu", batch_size: int | None = None) -> dict[str, list[float]]:
    """CPU milliseconds (this process's CPU time, all its threads) to advance `n_runs` runs by one round each,
    packed three ways, timed in alternation (A B C, then C B A, ...):
      "separate"  n_runs separate runs' rounds at 1 torch thread each (`all --threads 1`, the CPU default);
      "stacked"   one round of the n_runs seeds as a SeedStack at 1 thread (`all --stack`; only where the
                  algorithm is stackable, else absent);
      "threads"   n_runs separate runs' rounds at n_runs torch threads each (fewer, fatter runs).
    CPU time is what a run costs in core-hours, whatever the other jobs on the machine do, so the ratio
    separate/other is the other packing's gain in finished runs per core-hour."""
    cls, cfg, bufs = _seed_runs(algo_name, spec, overrides, n_runs, device, batch_size)
    seeds = range(n_runs)
    sep = [cls(spec, cfg, s, device) for s in seeds]
    fat = [cls(spec, cfg, s, device) for s in seeds]
    threads = torch.get_num_threads()

    def rounds_at(algos, n_threads):
        def go():
            torch.set_num_threads(n_threads)
            try:
                for algo, buf in zip(algos, bufs):
                    algo.update(buf)
            finally:
                torch.set_num_threads(threads)
        return go

    variants = {"separate": rounds_at(sep, 1)}
    if stackable(cls):
        stack = SeedStack([cls(spec, cfg, s, device) for s in seeds])

        def stacked():
            torch.set_num_threads(1)
            try:
                stack.update(bufs)
            finally:
                torch.set_num_threads(threads)
        variants["stacked"] = stacked
    variants["threads"] = rounds_at(fat, n_runs)
    names = list(variants)
    times: dict[str, list[float]] = {k: [] for k in names}
    for i in range(warmup + rounds):
        for label in names if i % 2 == 0 else names[::-1]:
            t0 = time.process_time()
            variants[label]()
            if i >= warmup:
                times[label].append((time.process_time() - t0) * 1e3)
    return times


# Operators that only make a view or an empty tensor (no kernel on a GPU), left out of `dispatched_ops`.
_VIEW_OPS = frozenset(
    "view reshape _reshape_alias _unsafe_view expand expand_as view_as transpose t permute movedim slice select "
    "narrow unsqueeze squeeze flatten unflatten as_strided alias detach detach_ unbind split chunk contiguous "
    "empty empty_like empty_strided resolve_conj resolve_neg lift_fresh result_type to item "
    "_local_scalar_dense is_nonzero".split())


def dispatched_ops(fn: Callable[[], Any]) -> int:
    """The aten operators `fn()` dispatches that are not views or empty allocations, counted at the leaves of
    the profiler's call tree: on a GPU each is about one kernel launch, so for rounds bound by the host
    issuing kernels this count is a proxy for their cost. (A matmul whose work runs in child operators is
    counted by its children.) The fused CF-CQL penalty runs as one block, as on a GPU (kernels.block_bytes)."""

    cpu_blocks = kernels.BLOCK_BYTES
    kernels.BLOCK_BYTES = kernels.GPU_BLOCK_BYTES
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
    finally:
        kernels.BLOCK_BYTES = cpu_blocks
    return sum(1 for e in prof.events() if e.name.startswith("aten::") and e.name[6:] not in _VIEW_OPS
               and not any(c.name.startswith("aten::") for c in e.cpu_children))


# -- how far from the floor ---------------------------------------------------------------------

def matmul_rate(device: str = "cpu", clock: str = "wall", n: int = 2048, reps: int = 5) -> float:
    """GFLOP/s of an n x n fp32 matmul on `device` with the current torch threads (best of `reps`,
    after one warm-up), on `clock`: the reference rate that `bench-speed`'s floor divides by."""
    timer = time.process_time if clock == "cpu" else time.perf_counter
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=g, device=device)
    b = torch.randn(n, n, generator=g, device=device)
    out = torch.empty(n, n, device=device)
    torch.mm(a, b, out=out)
    sync()
    best = float("inf")
    for _ in range(reps):
        t0 = timer()
        torch.mm(a, b, out=out)
        sync()
        best = min(best, timer() - t0)
    return 2 * n ** 3 / max(best, 1e-9) / 1e9


def round_flops(algo, sample) -> float:
    """Floating-point operations of one update round, counted by torch's FlopCounterMode over the
    matrix products it executes (mm, bmm, addmm, baddbmm and their in-place forms, forward and
    backward, recomputations included); elementwise work is not counted, so FLOPs / matmul_rate is
    a floor no implementation of the same arithmetic can beat on that machine."""

    def bmm_(self_shape, b1, b2, *args, out_shape=None, **kwargs) -> int:
        return 2 * b1[0] * b1[1] * b1[2] * b2[2]

    def mm_(self_shape, m1, m2, *args, out_shape=None, **kwargs) -> int:
        return 2 * m1[0] * m1[1] * m2[1]

    aten = torch.ops.aten  # the in-place forms are not in torch's table
    with FlopCounterMode(display=False, custom_mapping={aten.baddbmm_: bmm_, aten.addmm_: mm_}) as counter:
        algo.update(sample)
    return float(counter.get_total_flops())


def paired_ratio(a: list[float], b: list[float], n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """The median of the per-round ratios a_i / b_i and its 95% percentile-bootstrap interval. Round i of
    a was timed next to round i of b, so a load change that hits both cancels in their ratio."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape or x.size == 0:
        raise ValueError(f"paired_ratio needs two equal, non-empty lists; got {x.size} and {y.size} rounds")
    r = x / y
    boot = np.median(r[np.random.default_rng(seed).integers(0, r.size, size=(n_boot, r.size))], axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(np.median(r)), float(lo), float(hi)


def time_evaluation(algo_name: str, task, overrides: dict[str, Any] | None = None,
                    episodes: tuple[int, int] = (4, 32), device: str = "cpu", seed: int = 0,
                    clock: str = "wall") -> list[float]:
    """Seconds of one evaluation (suite.protocol.rollout_returns on the evaluation seeds) with the
    untrained policy of `algo_name`, at two episode counts, fitted as a + b * episodes. Each count
    is run once untimed first (env construction, JAX compilation happen once per run too). An
    untrained policy's episodes can be shorter or longer than a trained one's where episodes end
    early (SMAX); MPE and Half-Cheetah episodes have a fixed length."""

    timer = time.process_time if clock == "cpu" else time.perf_counter
    spec = task.spec
    cls = get_algorithm(algo_name, discrete=spec.discrete)
    torch.manual_seed(seed)
    algo = cls(spec, make_config(cls, dict(overrides or {})), seed, device)
    begin = algo.begin_episodes

    def once(n: int) -> float:
        t0 = timer()
        with algo.evaluating():  # as runner.evaluate_policy
            protocol.rollout_returns(task, lambda s: algo.act(s.obs, s.avail), protocol.eval_seeds(n), begin=begin)
        return timer() - t0

    times = []
    for n in episodes:
        once(n)
        times.append(once(n))
    (n1, n2), (t1, t2) = episodes, times
    b = max((t2 - t1) / (n2 - n1), 0.0)
    return [max(t1 - b * n1, 0.0), b]


def time_rounds_within(algo_name: str, spec: TaskSpec, overrides: dict[str, Any] | None = None,
                       max_rounds: int = 20, min_rounds: int = 3, seconds: float = 20.0,
                       device: str = "cpu", seed: int = 0, clock: str = "cpu") -> dict[str, float]:
    """Median ms per update round (after one warm-up round) over as many rounds as fit in about
    `seconds`: at least min_rounds, at most max_rounds. For calibrations, where SMAX's ensemble
    rounds take ~20 s each on a CPU and MPE's a few ms."""
    timer = time.process_time if clock == "cpu" else time.perf_counter
    cls = get_algorithm(algo_name, discrete=spec.discrete)
    torch.manual_seed(seed)
    np.random.seed(seed)
    algo = cls(spec, timing_config(cls, dict(overrides or {})), seed, device)
    buf = make_buffer(cls, spec, 100_000, device, seed)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    algo.update(buf)
    sync()
    times: list[float] = []
    while len(times) < max_rounds and (len(times) < min_rounds or sum(times) < seconds * 1e3):
        t0 = timer()
        algo.update(buf)
        sync()
        times.append((timer() - t0) * 1e3)
    return {"median_ms": statistics.median(times), "rounds": len(times)}

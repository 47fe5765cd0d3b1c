"""Fast SMAX dataset collection: `jax.vmap` over envs + `lax.scan` over time, jitted once per map.

    arrays, meta = collect_smax("smax-2s3z", policy, seeds, params=params)

* ``policy(params, obs, avail, key) -> actions`` is a jittable function of ONE env: obs float32
  [n, obs_dim], avail uint8 [n, n_actions], a PRNG key; it returns int [n] actions that must be
  available under ``avail``. ``random_policy`` draws uniformly among the available actions.
* One episode per seed, in seed order (episode-major). Env b is reset from
  ``PRNGKey(seeds[b])`` exactly as ``SmaxEnv.reset`` does, and its policy key is
  ``fold_in(PRNGKey(seeds[b]), POLICY_STREAM)``, so the output is a deterministic function of
  (task, policy, params, seeds) on a given jax version and device.
* ``batch`` env slots run in jitted scans of ``chunk`` steps that only step (no reset inside
  the scan). Between chunks the host looks at which slots are done and restarts them on the next
  seeds of the queue (one batched reset per chunk, not one per slot and step), so a finished slot
  idles at most ``chunk`` - 1 steps. Once no seed is left, the batch shrinks to the running slots
  (powers of two, at least ``min_batch``), so the tail of long episodes does not pay for the
  whole batch; each slot count compiles once per (map, policy). Frozen slots' rows are dropped
  with a mask; rows are then grouped by episode. Which slot plays an episode does not change
  its random streams; the floats can differ in the last bits between batch sizes (XLA
  vectorises differently), which the chaotic battle may amplify, so a dataset is reproducible
  for a given (seeds, batch, chunk).
* ``next_actions`` is the policy's action at the next observation, including the final next obs
  of each episode, so ``next_actions_valid`` is 1 everywhere. ``terminals``/``timeouts`` are kept
  apart (terminal = battle over; timeout = the SMAC episode limit).

``meta`` holds per-episode results (which are not format-v1 arrays, their length is E):
``won`` bool [E], ``returns`` float64 [E], ``lengths`` int64 [E], plus ``win_rate``,
``env_steps`` and ``seconds``.

Workers: ``smax_tiers.collect_smax_tier(..., workers=N)`` (and ``bench(..., workers=N)``) splits the seed
list into N contiguous chunks and collects each in its own spawned process (one intra-op thread
each: ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``); the parts
are concatenated in seed order. Children load the tier's policies themselves (JAX closures do not
pickle) and hand their arrays back through .npz files in a temporary directory. The tier's own
split (mixed: medium/expert halves; medium-replay: one part per source) then happens inside each
chunk, so a dataset is reproducible for a given (seeds, batch, chunk, workers); ``workers=1`` (the
default) runs in-process and gives exactly the single-process output. ``PLCQL_SMAX_WORKERS`` sets
the workers of the ``datasets build`` hook (suite/envs/smax.py).

Benchmark: ``python -m plcql_bench.datasets.smax_collect --bench [--workers N]`` prints
env-steps/s per map.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue as queue_mod
import tempfile
import time
import traceback
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any, Callable

import numpy as np

from plcql_bench.suite.envs import smax as smax_env

GENERATOR_VERSION = "smax-collect-1"
POLICY_STREAM = 0x5EED
WORKERS_ENV = "PLCQL_SMAX_WORKERS"  # workers of the datasets-build hook (default 1)
CHILD_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

PolicyFn = Callable[[Any, Any, Any, Any], Any]


def random_policy(params, obs, avail, key):
    """Uniform over each agent's available actions (params ignored)."""
    import jax
    import jax.numpy as jnp

    logits = jnp.where(avail > 0, 0.0, -jnp.inf)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


@cache
def _runner(map_name: str, policy: PolicyFn, chunk: int):
    """Jitted (start, refill, advance, take) over a batch of env slots (the batch size is taken
    from the arguments, so each slot count compiles once).

    * ``start(params, seeds[B])``: fresh slots, plus their first observations;
    * ``refill(params, c, seeds[B], mask[B])``: slots with ``mask`` restart on their seed (the
      reset is computed once per chunk, not at every step);
    * ``advance(params, c)``: ``chunk`` steps of every slot; a finished slot stays frozen and its
      rows come back with ``valid`` = 0;
    * ``take(c, idx)``: keep the slots ``idx`` (to shrink the batch once no seed is left)."""
    import jax
    import jax.numpy as jnp

    core = smax_env._core(map_name)

    def start_one(params, seed):
        base = jax.random.PRNGKey(seed)
        carry = core.reset(base)
        pkey, k = jax.random.split(jax.random.fold_in(base, POLICY_STREAM))
        a0 = policy(params, carry.last.obs, carry.last.avail, k).astype(jnp.int32)
        return carry, a0, pkey

    start_b = jax.vmap(start_one, in_axes=(None, 0))
    step_b = jax.vmap(core.step)
    policy_b = jax.vmap(policy, in_axes=(None, 0, 0, 0))

    def start(params, seeds):
        c = start_b(params, seeds)
        return c, c[0].last

    def refill(params, c, seeds, mask):
        fresh = start_b(params, seeds)
        sel = lambda u, v: jnp.where(mask.reshape(mask.shape + (1,) * (u.ndim - 1)), u, v)  # noqa: E731
        return jax.tree.map(sel, fresh, c), fresh[0].last

    def advance(params, c):
        def body(c, _):
            carry, a, pkey = c
            carry2, out = step_b(carry, a)
            ks = jax.vmap(jax.random.split)(pkey)
            pkey, kk = ks[:, 0], ks[:, 1]
            a_fin = policy_b(params, out.next.obs, out.next.avail, kk).astype(jnp.int32)
            ys = (a, a_fin, out.next.obs, out.next.state, out.next.avail, out.reward,
                  out.terminal & out.valid, out.timeout & out.valid, out.won & out.valid,
                  out.valid)
            return (carry2, a_fin, pkey), ys

        return jax.lax.scan(body, c, None, length=chunk)

    def take(c, idx):
        return jax.tree.map(lambda x: x[idx], c)

    return jax.jit(start), jax.jit(refill), jax.jit(advance), jax.jit(take)


def _pow2_at_least(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def warm_up(task_id: str, policy: PolicyFn, seeds, params=None, batch: int = 256,
            chunk: int = 2, min_batch: int = 16) -> None:
    """Compile everything ``collect_smax`` can call for ``len(seeds)`` episodes (the seeds'
    values do not matter): start, refill and advance at ``min(batch, len(seeds))`` slots, and
    advance/take at every slot count the tail shrink can pick, so a timed run compiles nothing
    whatever its episode lengths. Mirrors the call sequence of ``collect_smax`` (carries from
    start, advance, refill and take), so the jit caches see the same argument types."""
    import jax

    seeds = np.asarray(seeds, dtype=np.int64).reshape(-1)
    b = int(min(batch, len(seeds)))
    s32 = seeds[:b].astype(np.uint32)
    start, refill, advance, take = _runner(smax_env.map_of(task_id), policy, int(chunk))
    c, _ = start(params, s32)
    c, _ = advance(params, c)
    c, _ = refill(params, c, s32, np.ones(b, bool))
    c, _ = advance(params, c)
    c, _ = advance(params, c)
    sizes = [b] + [1 << k for k in range(b.bit_length() - 1, -1, -1)
                   if min_batch <= (1 << k) < b]
    for size in sizes:
        cs = c if size == b else take(c, np.arange(size))
        cs, _ = advance(params, cs)
        cs, _ = advance(params, cs)
        for smaller in sizes:
            if smaller < size:
                take(cs, np.arange(smaller))
    jax.block_until_ready(c)


def collect_smax(task_id: str, policy: PolicyFn, seeds, params=None, batch: int = 256,
                 chunk: int = 2, log: Callable[[str], None] | None = None,
                 min_batch: int = 16) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Collect one episode per seed; returns (format-v1 arrays, meta). See the module docstring."""
    import jax

    map_name = smax_env.map_of(task_id)
    seeds = np.asarray(seeds, dtype=np.int64).reshape(-1)
    n_ep = len(seeds)
    if n_ep == 0:
        raise ValueError("no seeds")
    if (seeds < 0).any() or (seeds >= 2**32).any():
        raise ValueError("SMAX seeds must be in [0, 2**32)")
    seeds32 = seeds.astype(np.uint32)
    b = int(min(batch, n_ep))
    start, refill, advance, take = _runner(map_name, policy, int(chunk))
    limit = smax_env.EPISODE_LIMITS[map_name]

    t0, c0 = time.perf_counter(), time.process_time()
    c, first = start(params, seeds32[:b])
    slot_ep = np.arange(b, dtype=np.int64)  # episode played by each slot (-1: none)
    first_parts = [(slot_ep.copy(), jax.device_get(first))]
    nxt = b  # next episode to start
    active = np.ones(b, bool)  # slot's episode still running
    parts, n_chunks = [], 0
    max_chunks = (-(-n_ep // b) + 2) * (limit // chunk + 2)
    while active.any():
        c, ys = advance(params, c)
        ys = jax.device_get(ys)
        valid = ys[-1]  # [chunk, B]
        tt, bb = np.nonzero(valid)  # time-major: rows of a slot in time order
        parts.append((slot_ep[bb],) + tuple(y[tt, bb] for y in ys[:-1]))
        n_chunks += 1
        if n_chunks > max_chunks:
            raise RuntimeError("collection ended before every episode finished")
        active = ~np.asarray(c[0].done)
        free = np.flatnonzero(~active)
        if nxt < n_ep and len(free):
            use = free[: n_ep - nxt]
            eps = np.arange(nxt, nxt + len(use))
            nxt += len(use)
            mask = np.zeros(len(slot_ep), bool)
            mask[use] = True
            new_seeds = np.zeros(len(slot_ep), np.uint32)
            new_seeds[use] = seeds32[eps]
            c, first = refill(params, c, new_seeds, mask)
            slot_ep[use] = eps
            first = jax.device_get(first)
            first_parts.append((eps, jax.tree.map(lambda x: x[use], first)))
            active[use] = True
        elif nxt >= n_ep:
            # no seed left: shrink the batch to the running slots (powers of two)
            size = max(min_batch, _pow2_at_least(active.sum()))
            if size < len(slot_ep) and active.any():
                keep = np.flatnonzero(active)
                idx = np.concatenate([keep, np.flatnonzero(~active)[: size - len(keep)]])
                c = take(c, idx)
                slot_ep, active = slot_ep[idx], active[idx]
        if log is not None and n_chunks % 50 == 0:
            log(f"{task_id}: {nxt}/{n_ep} episodes started, {n_chunks} chunks")
    pos, a, a_fin, nobs, nstate, navail, rew, term, tout, won_step = (
        np.concatenate([p[i] for p in parts]) for i in range(len(parts[0])))
    order = np.argsort(pos, kind="stable")  # rows of one episode are in time order
    pos, a, a_fin, nobs, nstate, navail, rew, term, tout, won_step = (
        x[order] for x in (pos, a, a_fin, nobs, nstate, navail, rew, term, tout, won_step))
    lengths = np.bincount(pos, minlength=n_ep).astype(np.int64)
    if (lengths == 0).any():
        raise RuntimeError("collection ended before every episode finished")
    n = int(lengths.sum())
    starts = np.cumsum(lengths) - lengths
    steps = np.arange(n) - np.repeat(starts, lengths)
    ep_first = np.concatenate([e for e, _ in first_parts])
    f_order = np.argsort(ep_first, kind="stable")
    first = smax_env.Obs(*(np.concatenate([np.asarray(f[i]) for _, f in first_parts])[f_order]
                           for i in range(3)))

    def shifted(nxt: np.ndarray, init_rows: np.ndarray) -> np.ndarray:
        cur = np.empty_like(nxt)
        cur[1:] = nxt[:-1]
        cur[starts] = init_rows
        return cur

    arrays = {
        "obs": shifted(nobs, first.obs).astype(np.float32),
        "state": shifted(nstate, first.state).astype(np.float32),
        "actions": a.astype(np.int64),
        "avail_actions": shifted(navail, first.avail).astype(np.uint8),
        "rewards": rew.astype(np.float32),
        "next_obs": nobs.astype(np.float32),
        "next_state": nstate.astype(np.float32),
        "next_actions": a_fin.astype(np.int64),
        "next_avail_actions": navail.astype(np.uint8),
        "next_actions_valid": np.ones(n, np.uint8),
        "terminals": term.astype(np.uint8),
        "timeouts": tout.astype(np.uint8),
        "episode_ids": np.repeat(np.arange(n_ep, dtype=np.int64), lengths),
        "steps": steps.astype(np.int32),
    }
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    ends = starts + lengths - 1
    won = won_step[ends].astype(bool)
    returns = np.bincount(arrays["episode_ids"], weights=rew.astype(np.float64), minlength=n_ep)
    meta = {"won": won, "returns": returns, "lengths": lengths, "win_rate": float(won.mean()),
            "env_steps": n, "seconds": seconds, "cpu_seconds": cpu_seconds}
    if log is not None:
        log(f"{task_id}: {n_ep} episodes, {n} steps in {seconds:.1f}s, win rate {won.mean():.3f}")
    return arrays, meta


def concat_collections(parts: list[tuple[dict[str, np.ndarray], dict[str, Any]]]):
    """Concatenate (arrays, meta) pairs in order; episode ids are renumbered."""
    arrays: dict[str, list[np.ndarray]] = {k: [] for k in parts[0][0]}
    offset = 0
    for arr, meta in parts:
        for k, v in arr.items():
            arrays[k].append(v + offset if k == "episode_ids" else v)
        offset += len(meta["lengths"])
    out = {k: np.concatenate(v) for k, v in arrays.items()}
    won = np.concatenate([m["won"] for _, m in parts])
    meta = {"won": won, "returns": np.concatenate([m["returns"] for _, m in parts]),
            "lengths": np.concatenate([m["lengths"] for _, m in parts]),
            "win_rate": float(won.mean()), "env_steps": int(sum(m["env_steps"] for _, m in parts)),
            "seconds": float(sum(m["seconds"] for _, m in parts)),
            "cpu_seconds": float(sum(m["cpu_seconds"] for _, m in parts))}
    return out, meta


# --------------------------------------------------------------------------- workers


def workers_from_env(default: int = 1) -> int:
    """``PLCQL_SMAX_WORKERS`` as a positive int (``default`` when unset or empty)."""
    v = os.environ.get(WORKERS_ENV, "").strip()
    if not v:
        return default
    try:
        n = int(v)
    except ValueError:
        raise ValueError(f"{WORKERS_ENV} must be a positive integer, got {v!r}") from None
    if n < 1:
        raise ValueError(f"{WORKERS_ENV} must be a positive integer, got {v!r}")
    return n


@contextmanager
def _child_environ():
    """Environment inherited by the children started inside the block: one intra-op thread
    (set before the child imports jax; os.environ is copied when a spawned process starts)."""
    new = {"XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + CHILD_XLA_FLAGS).strip(),
           "OMP_NUM_THREADS": "1"}
    old = {k: os.environ.get(k) for k in new}
    os.environ.update(new)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _bench_child(task_id, warm_seeds, seeds, batch, chunk, repeats, barrier=None):
    t0 = time.perf_counter()
    warm_up(task_id, random_policy, warm_seeds, batch=batch, chunk=chunk)  # compile
    warm = time.perf_counter() - t0
    metas = []
    for _ in range(repeats):
        barrier.wait(timeout=600)  # every child starts each timed run together
        _, meta = collect_smax(task_id, random_policy, seeds, batch=batch, chunk=chunk)
        meta["warmup_s"] = warm
        metas.append(meta)
    return None, metas


def _child_main(target, index, args, out_dir, results, barrier):
    """Runs in a spawned child: target(*args) -> (arrays or None, small result); the arrays go
    to <out_dir>/part<index>.npz, the result through the queue."""
    try:
        arrays, res = target(*args, barrier=barrier)
        if arrays is not None:
            np.savez(Path(out_dir) / f"part{index}.npz", **arrays)
        results.put((index, res, None))
    except BaseException:  # noqa: BLE001 - reported to the parent
        if barrier is not None:
            barrier.abort()
        results.put((index, None, traceback.format_exc()))


def _run_children(target, arg_list, barrier: bool = False):
    """target(*args) in one spawned process per args (all running at once); returns
    [(arrays or None, result)] in the order of ``arg_list``. With ``barrier``, the children
    share a multiprocessing.Barrier (passed as ``barrier=``)."""

    ctx = mp.get_context("spawn")
    n = len(arg_list)
    results = ctx.Queue()
    bar = ctx.Barrier(n) if barrier else None
    got: dict[int, Any] = {}
    with tempfile.TemporaryDirectory(prefix="smax_workers_") as tmp:
        procs = [ctx.Process(target=_child_main, args=(target, i, args, tmp, results, bar),
                             daemon=True) for i, args in enumerate(arg_list)]
        try:
            with _child_environ():
                for p in procs:
                    p.start()
            while len(got) < n:
                try:
                    i, res, err = results.get(timeout=1.0)
                except queue_mod.Empty:
                    dead = [i for i, p in enumerate(procs) if i not in got
                            and p.exitcode is not None and p.exitcode != 0]
                    if dead:
                        raise RuntimeError(f"SMAX worker {dead[0]} died (exit code "
                                           f"{procs[dead[0]].exitcode})") from None
                    continue
                if err is not None:
                    raise RuntimeError(f"SMAX worker {i} failed:\n{err}")
                got[i] = res
            for p in procs:
                p.join()
            out = []
            for i in range(n):
                f = Path(tmp) / f"part{i}.npz"
                if f.exists():
                    with np.load(f) as z:
                        arrays = {k: z[k] for k in z.files}
                else:
                    arrays = None
                out.append((arrays, got[i]))
            return out
        finally:
            if bar is not None:
                bar.abort()
            for p in procs:
                if p.is_alive():
                    p.terminate()
                p.join()


def bench(maps=smax_env.MAPS, episodes: int = 512, batch: int = 256, chunk: int = 2,
          log=print, workers: int = 1, repeats: int = 1) -> dict[str, dict[str, float]]:
    """Env-steps/s of random-policy collection per map (compile excluded: ``warm_up`` compiles
    every slot count first, on other seeds). The timed collection runs ``repeats`` times; the
    run with the median wall rate is reported (``rates`` lists them all).

    ``workers`` > 1: the episodes are split into that many contiguous chunks, one per spawned
    single-threaded process; each warms up (compiles) on other seeds, waits on a barrier, then
    collects its chunk. The rate is total env steps / the longest child's timed wall time; per
    CPU-second divides by the children's summed collection CPU time."""
    results = {}
    workers, repeats = max(1, int(workers)), max(1, int(repeats))
    for m in maps:
        tid = smax_env.PREFIX + m
        seeds = 1000 + np.arange(episodes)
        if workers == 1:
            t0 = time.perf_counter()
            # every shape the timed run can use, so the timed run does not compile
            warm_up(tid, random_policy, 10**6 + np.arange(episodes), batch=batch, chunk=chunk)
            warm = time.perf_counter() - t0
            runs = [[collect_smax(tid, random_policy, seeds, batch=batch, chunk=chunk)[1]]
                    for _ in range(repeats)]
        else:
            chunks = np.array_split(seeds, workers)
            outs = _run_children(_bench_child,
                                 [(tid, 10**6 + c, c, batch, chunk, repeats) for c in chunks],
                                 barrier=True)
            runs = [[r[i] for _, r in outs] for i in range(repeats)]  # [repeat][worker]
            warm = max(r[0]["warmup_s"] for _, r in outs)
        timed = []
        for metas in runs:
            steps = int(sum(mm["env_steps"] for mm in metas))
            secs = max(mm["seconds"] for mm in metas)
            cpu = sum(mm["cpu_seconds"] for mm in metas)
            timed.append((steps / secs, steps, secs, cpu))
        rates = [t[0] for t in timed]
        rate, steps, secs, cpu = sorted(timed)[(len(timed) - 1) // 2]  # median (lower)
        lengths = np.concatenate([mm["lengths"] for mm in runs[0]])
        cpu_rate = steps / max(cpu, 1e-9)
        results[tid] = {"env_steps_per_s": rate, "env_steps_per_cpu_s": cpu_rate,
                        "env_steps": steps, "seconds": secs, "warmup_s": warm,
                        "mean_len": float(lengths.mean()), "workers": workers, "rates": rates}
        if log is not None:
            spread = (f", {repeats} runs {min(rates):.0f}..{max(rates):.0f}"
                      if repeats > 1 else "")
            log(f"{tid:16s} {rate:9.0f} env-steps/s wall, {cpu_rate:9.0f} per CPU-second "
                f"({steps} steps in {secs:.2f}s, workers {workers}{spread}, mean episode "
                f"{lengths.mean():.1f}, warm-up/compile {warm:.1f}s)")
    return results


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bench", action="store_true", help="report env-steps/s per map")
    p.add_argument("--maps", nargs="*", default=list(smax_env.MAPS))
    p.add_argument("--episodes", type=int, default=512)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--chunk", type=int, default=2)
    p.add_argument("--workers", type=int, default=1,
                   help="spawned single-threaded collector processes (default 1: in-process)")
    p.add_argument("--repeats", type=int, default=1,
                   help="timed runs after the warm-up; the median is reported")
    a = p.parse_args(argv)
    if not a.bench:
        p.error("nothing to do (use --bench)")
    bench(a.maps, a.episodes, a.batch, a.chunk, workers=a.workers, repeats=a.repeats)


if __name__ == "__main__":
    main()

"""SMAX tiers by the reference's yardstick: which behaviour checkpoint plays which tier, and why.

    python -m plcql_bench.datasets.smax_tiers smax-2s3z      # writes the map's card.json

The reference's SMAC tiers (CFCQL) are QMIX checkpoints on StarCraft II: expert a converged
policy, medium an earlier checkpoint, medium-replay the replay buffer of a QMIX learner, mixed
half medium and half expert. SMAX is not SC2 (docs/smax.md, "the differences"), so a tier keeps
its *relative* quality, measured by the benchmark's metric, the greedy win rate:

* **Yardstick.** The only per-tier win rates the references give are BC's in the paper's SMAC table
  (BC on greedy data recovers about the data's policy). Relative to BC on expert they are, per map,
  the quality of medium, medium-replay and mixed that ``REFERENCE`` records. The reference *returns*
  (OG-MARL's cards of CFCQL's datasets) are shown beside ours but are not the yardstick: on SC2 a
  win is only 2.7-7.5 of a return of 20 and damage to regenerating shields counts again (3s_vs_5z's
  medium averages 20.9 of expert's 21.2 while BC on it wins 8 %), on SMAX a win is half the return.
* **expert:** the best greedy win rate any run reached (latest on ties).
* **medium:** the checkpoint whose greedy win rate is closest to
  ``expert win rate x BC(medium) / BC(expert)`` (ties: the earlier), taken from a *ladder* run (a
  MAPPO run at a small learning rate with a checkpoint after every update; the greedy win rate of
  a MAPPO policy jumps within a few updates, datasets/assets/behaviour/<task>/ladder/) or, where the
  expert run already has it, from the expert run.
  When the target lies between two consecutive ladder checkpoints that are both far from it
  (more than ``REFINE_TOLERANCE``), ``refine`` adds policies on the straight line between their
  parameters (``interp_<a>_<b>_<alpha>``, one PPO update apart, evaluated like checkpoints) and the
  closest of all is medium; the card says so.
* **medium-replay:** the learner's replay up to medium: one part per checkpoint of that run up to
  medium, in training order, each acting epsilon-greedily with epsilon falling linearly from 1 to
  QMIX's final 0.05 (``smax_behaviour.replay_schedule``), so early parts are near-uniform play and
  the last is medium with QMIX's exploration. Its size is the reference's (``REFERENCE``
  "episodes": 1,976 on 2s3z, 5,000 elsewhere), set by the paper profile.
* **mixed:** half medium, half expert (the dataset builder).

``card.json`` (one per map) records the tiers, the yardstick, the targets and what was reached,
the runs the checkpoints come from, and labels (5m_vs_6m's expert is "best reachable on SMAX",
not an expert in the reference's sense).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from plcql_bench.datasets import smax_behaviour as sb
from plcql_bench.datasets import manifest
from plcql_bench.datasets.smax_collect import _run_children, collect_smax, concat_collections, random_policy

TIERS_VERSION = "smax-tiers-2"  # 1: mappo-smax-1 cards (medium = half expert's win rate)

# The reference's tiers per map. bc_win: BC's test win rate on each dataset (the PLCQL paper's SMAC
# table, which repeats CFCQL's); return / episodes / transitions: OG-MARL's cards of CFCQL's
# datasets (og-marl@f4eb8f0:docs/dataset_cards/cfcql.md; docs/reference-implementations.md).
REFERENCE: dict[str, dict[str, dict[str, float]]] = {
    "2s3z": {"bc_win": {"medium": 0.16, "medium-replay": 0.33, "expert": 0.97, "mixed": 0.44},
             "return": {"medium": 12.76, "medium-replay": 7.94, "expert": 19.97, "mixed": 16.39},
             "episodes": {"medium": 5000, "medium-replay": 1976, "expert": 5000, "mixed": 5000}},
    "3s_vs_5z": {"bc_win": {"medium": 0.08, "medium-replay": 0.01, "expert": 0.98, "mixed": 0.21},
                 "return": {"medium": 20.86, "medium-replay": 18.85, "expert": 21.19, "mixed": 21.04},
                 "episodes": {"medium": 5000, "medium-replay": 5000, "expert": 5000, "mixed": 5000}},
    "5m_vs_6m": {"bc_win": {"medium": 0.28, "medium-replay": 0.13, "expert": 0.82, "mixed": 0.21},
                 "return": {"medium": 12.05, "medium-replay": 9.02, "expert": 18.17, "mixed": 15.11},
                 "episodes": {"medium": 5000, "medium-replay": 5000, "expert": 5000, "mixed": 5000}},
    "6h_vs_8z": {"bc_win": {"medium": 0.40, "medium-replay": 0.11, "expert": 0.60, "mixed": 0.27},
                 "return": {"medium": 16.63, "medium-replay": 12.97, "expert": 19.01, "mixed": 17.81},
                 "episodes": {"medium": 5000, "medium-replay": 5000, "expert": 5000, "mixed": 5000}},
}
REFERENCE_SOURCES = ("PLCQL paper, SMAC table (BC column), as in CFCQL's paper; "
                     "og-marl@f4eb8f0:docs/dataset_cards/cfcql.md (returns, episodes)")


def relative(map_name: str, tier: str, what: str = "bc_win") -> float:
    """The reference's tier quality relative to its expert (BC win rates or returns)."""
    ref = REFERENCE[map_name][what]
    return ref[tier] / ref["expert"]


def read_log(run_dir: Path, prefix: str = "", name: str = "log.jsonl") -> list[dict[str, Any]]:
    """A run's checkpoint log with checkpoint names relative to the map's behaviour directory
    (``prefix`` = the run's subfolder, e.g. "ladder/"), plus its interpolated policies
    (``refine.jsonl``), in training order (by env steps)."""
    rows = []
    for f in (name, REFINE_LOG):
        path = Path(run_dir) / f
        if path.exists():
            rows += [json.loads(line) for line in path.read_text().splitlines() if line]
    rows.sort(key=lambda r: r["env_steps"])
    confirmed = Path(run_dir) / CONFIRM_LOG  # longer re-evaluations replace a checkpoint's numbers
    if confirmed.exists():
        again = {c["ckpt"]: c for c in map(json.loads, confirmed.read_text().splitlines()) if c}
        rows = [{**r, **again[r["ckpt"]]} if r["ckpt"] in again else r for r in rows]
    return [{**r, "ckpt": prefix + r["ckpt"]} for r in rows]


REFINE_LOG = "refine.jsonl"
CONFIRM_LOG = "confirm.jsonl"
CONFIRM_CANDIDATES = 5  # policies nearest the target that get a longer evaluation
REFINE_TOLERANCE = 0.03  # refine when no policy's greedy win rate is this close to the target
REFINE_ALPHAS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875)
# Episodes per evaluation of an interpolated policy: at the jump a policy's greedy win rate is
# fragile, and 128 episodes (the checkpoints') put 2s3z's first pick at 0.148 where its 5,000-episode
# dataset won 0.087; 512 give a standard error of about 0.015 at 0.15.
REFINE_EVAL_EPISODES = 512


def bracket(log: list[dict], target: float) -> tuple[int, int] | None:
    """The first consecutive pair whose greedy win rates straddle ``target`` (a < target <= b), or
    None when some policy is already within REFINE_TOLERANCE of it or none straddles it."""
    if any(abs(e["win_rate"] - target) <= REFINE_TOLERANCE for e in log):
        return None
    for i in range(len(log) - 1):
        if log[i]["win_rate"] < target <= log[i + 1]["win_rate"]:
            return i, i + 1
    return None


def interpolate(actor_a, actor_b, alpha: float):
    """Parameters (1 - alpha) a + alpha b, layer by layer."""
    return [{k: (1 - alpha) * la[k] + alpha * lb[k] for k in la} for la, lb in zip(actor_a, actor_b)]


def refine(task_id: str, run: str = "ladder", rounds: int = 2, log=print) -> list[dict]:
    """Add interpolated policies between the run's two checkpoints that bracket the medium target
    (see the module docstring), up to ``rounds`` times (each round narrows the bracket); they are
    saved next to the run's checkpoints and logged in its refine.jsonl. Returns the new entries."""
    d = sb.behaviour_dir(task_id)
    run_dir = d / run
    expert_log = [e for e in read_log(d) if (d / f"{e['ckpt']}.npz").exists()]
    added: list[dict] = []
    for _ in range(rounds):
        ladder = read_log(run_dir)
        target = pick_expert(ladder + expert_log)["win_rate"] * relative(task_id.split("-", 1)[1], "medium")
        pair = bracket(ladder, target)
        if pair is None:
            break
        a, b = (ladder[i] for i in pair)
        actor_a, actor_b = (sb.load_actor(run_dir / f"{e['ckpt']}.npz") for e in (a, b))
        for alpha in REFINE_ALPHAS:
            name = f"interp_{a['env_steps']:09d}_{b['env_steps']:09d}_{alpha:.3f}"
            steps = a["env_steps"] + alpha * (b["env_steps"] - a["env_steps"])
            actor = interpolate(actor_a, actor_b, alpha)
            sb.save_actor(run_dir / f"{name}.npz", actor)
            entry = {"ckpt": name, "env_steps": steps, "interpolated": [a["ckpt"], b["ckpt"], alpha],
                     "eval_episodes": REFINE_EVAL_EPISODES,
                     **sb.evaluate(task_id, actor, REFINE_EVAL_EPISODES)}
            with open(run_dir / REFINE_LOG, "a") as f:
                f.write(json.dumps(entry) + "\n")
            added.append(entry)
            log(f"{task_id}: {name} greedy win {entry['win_rate']:.3f} (target {target:.3f})")
    return added


def confirm(task_id: str, run: str = "ladder", log=print, rounds: int = 6) -> list[dict]:
    """Re-evaluate the policies of the run nearest the medium target on REFINE_EVAL_EPISODES
    episodes (checkpoints were evaluated on 128 or 256), CONFIRM_CANDIDATES at a time, until the
    nearest one has the longer evaluation (at most ``rounds`` times: the first numbers of the
    nearest are biased towards the target); logged in the run's confirm.jsonl, which ``read_log``
    then uses. Returns the new evaluations."""
    d = sb.behaviour_dir(task_id)
    run_dir = d / run if run else d
    expert_log = [e for e in read_log(d) if (d / f"{e['ckpt']}.npz").exists()]
    out = []
    for _ in range(rounds):
        runs_log = [e for e in read_log(run_dir) if (run_dir / f"{e['ckpt']}.npz").exists()]
        expert = pick_expert(runs_log + expert_log) if run else pick_expert(expert_log)
        target = expert["win_rate"] * relative(task_id.split("-", 1)[1], "medium")
        pool = runs_log if run else [e for e in runs_log if e["env_steps"] < expert["env_steps"]]
        near = sorted(pool, key=lambda e: abs(e["win_rate"] - target))
        if not near or near[0].get("eval_episodes", 0) >= REFINE_EVAL_EPISODES:
            break
        out += _confirm_batch(task_id, run_dir, [e for e in near if e.get("eval_episodes", 0)
                                                 < REFINE_EVAL_EPISODES][:CONFIRM_CANDIDATES], target, log)
    return out


def _confirm_batch(task_id: str, run_dir: Path, entries: list[dict], target: float, log) -> list[dict]:
    out = []
    for e in entries:
        ev = {"ckpt": e["ckpt"], "eval_episodes": REFINE_EVAL_EPISODES, "win_rate_first": e["win_rate"],
              **sb.evaluate(task_id, sb.load_actor(run_dir / f"{e['ckpt']}.npz"), REFINE_EVAL_EPISODES)}
        with open(run_dir / CONFIRM_LOG, "a") as f:
            f.write(json.dumps(ev) + "\n")
        out.append(ev)
        log(f"{task_id}: {e['ckpt']} greedy win {e['win_rate']:.3f} -> {ev['win_rate']:.3f} on "
            f"{REFINE_EVAL_EPISODES} episodes (target {target:.3f})")
    return out


def pick_expert(log: list[dict]) -> dict:
    """The best greedy win rate, the latest checkpoint on ties."""
    return max(reversed(log), key=lambda e: e["win_rate"]) if log else _no_checkpoints()


def pick_medium(log: list[dict], target: float) -> int:
    """Index of the checkpoint whose greedy win rate is closest to ``target`` (ties: the earlier)."""
    if not log:
        _no_checkpoints()
    return min(range(len(log)), key=lambda i: (abs(log[i]["win_rate"] - target), i))


def _no_checkpoints():
    raise ValueError("no checkpoints")


def select(map_name: str, expert_log: list[dict], ladder_log: list[dict]) -> dict[str, Any]:
    """Tiers from the expert run's and the ladder run's logs (checkpoint names relative to the
    map's directory). The medium comes from the ladder; the replay is the ladder up to medium. An
    empty ladder uses the expert run's checkpoints before its expert as the ladder."""
    expert = pick_expert(ladder_log + expert_log)  # ties: the expert run's
    target = expert["win_rate"] * relative(map_name, "medium")
    ladder = ladder_log or [e for e in expert_log if e["env_steps"] < expert["env_steps"]]
    on_disk = [e for e in ladder if e.get("saved", True)]
    m = pick_medium(on_disk, target)
    return {"expert": expert, "medium": on_disk[m], "replay": spread(on_disk[: m + 1]), "target": target}


REPLAY_MAX_PARTS = 40  # a long ladder (3s_vs_5z: ~900 checkpoints) replays this many, evenly spaced


def spread(run: list[dict], most: int = REPLAY_MAX_PARTS) -> list[dict]:
    """At most ``most`` entries evenly spaced over the run, the first and the last kept."""
    if len(run) <= most:
        return run
    idx = sorted({round(i * (len(run) - 1) / (most - 1)) for i in range(most)})
    return [run[i] for i in idx]


def labels(map_name: str, expert: dict) -> dict[str, str]:
    """What each tier is, in words (used on the card and in the behaviour-policy id)."""
    ref_expert = REFERENCE[map_name]["bc_win"]["expert"]
    out = {}
    if expert["win_rate"] < 0.5 * ref_expert:  # not an expert in the reference's sense
        out["expert"] = f"best reachable on SMAX, greedy win rate {expert['win_rate']:.3f}"
    return out


def card(task_id: str, expert_log: list[dict], ladder_log: list[dict], runs: dict[str, Any],
         note: str = "") -> dict[str, Any]:
    """The map's card.json: tiers, yardstick, targets, what was reached, runs, labels."""
    map_name = task_id.split("-", 1)[1]
    sel = select(map_name, expert_log, ladder_log)
    expert, medium = sel["expert"], sel["medium"]
    ref = REFERENCE[map_name]
    ours_rel = medium["win_rate"] / expert["win_rate"] if expert["win_rate"] > 0 else float("nan")
    return {
        "task_id": task_id, "algo_version": TIERS_VERSION,
        "tiers": {"expert": expert["ckpt"], "medium": medium["ckpt"],
                  "medium-replay": [e["ckpt"] for e in sel["replay"]]},
        "expert": expert, "medium": medium, "medium_replay_checkpoints": len(sel["replay"]),
        "selection": {
            "yardstick": "greedy win rate relative to expert, matched to BC's win rate on the "
                         "reference's tier relative to BC's on its expert (datasets/smax_tiers.py)",
            "medium_target_win_rate": round(sel["target"], 4),
            "medium_interpolated": medium.get("interpolated"),  # [a, b, alpha] or None
            "medium_relative": {"ours": round(ours_rel, 4),
                                "reference_bc": round(relative(map_name, "medium"), 4)},
            "reference": {**ref, "source": REFERENCE_SOURCES},
            "replay": f"one part per checkpoint up to medium ({len(sel['replay'])}, at most "
                      f"{REPLAY_MAX_PARTS} evenly spaced), epsilon "
                      f"{sb.REPLAY_EPS[0]:g} -> {sb.REPLAY_EPS[1]:g} linearly",
        },
        "labels": labels(map_name, expert),
        "runs": runs,
        "note": ("SMAX (JaxMARL) numbers; not comparable with StarCraft II / SMAC. " + note).strip(),
    }


def run_summary(run_card: dict[str, Any]) -> dict[str, Any]:
    """The parts of a training run's own card that say where its checkpoints come from."""
    keep = ("algorithm", "algo_version", "config", "seed", "env_steps", "wall_clock_s", "env_versions",
            "eval", "trained_on")
    return {k: run_card[k] for k in keep if k in run_card}


def build_card(task_id: str, note: str = "") -> dict[str, Any]:
    """card.json from the expert run (``expert_run.json`` + ``log.jsonl`` in the map's directory)
    and the ladder run (``ladder/``, if any); checkpoints missing on disk are never chosen."""
    d = sb.behaviour_dir(task_id)
    expert_log = [{**e, "saved": (d / f"{e['ckpt']}.npz").exists()} for e in read_log(d)]
    runs = {"expert": run_summary(json.loads((d / "expert_run.json").read_text()))}
    ladder_log = []
    if (d / "ladder" / "log.jsonl").exists():
        ladder_log = [{**e, "saved": (d / f"{e['ckpt']}.npz").exists()} for e in read_log(d / "ladder", "ladder/")]
        runs["ladder"] = run_summary(json.loads((d / "ladder" / "card.json").read_text()))
    c = card(task_id, [e for e in expert_log if e["saved"]] or expert_log, ladder_log, runs, note)
    for tier in ("expert", "medium"):
        if not (d / f"{c['tiers'][tier]}.npz").exists():
            raise FileNotFoundError(f"{task_id}: the {tier} checkpoint {c['tiers'][tier]} is not on disk")
    return c


def prune(task_id: str, run: str = "ladder") -> list[Path]:
    """Delete the run's checkpoint files that the map's card does not use (their evaluations stay
    in the logs), so a long ladder commits only its replay and medium. Returns the deleted paths."""
    d = sb.behaviour_dir(task_id)
    used = {d / f"{c}.npz" for c in [*sb.read_card(task_id)["tiers"]["medium-replay"],
                                     sb.read_card(task_id)["tiers"]["medium"]]}
    gone = [p for p in sorted((d / run).glob("*.npz")) if p not in used]
    for p in gone:
        p.unlink()
    return gone


# --------------------------------------------------------------------------- collecting a tier


def collect_smax_tier(task_id: str, tier: str, seeds, batch: int = 256,
                      log: Callable[[str], None] | None = None, workers: int = 1):
    """One SMAX dataset tier from the committed behaviour checkpoints (smax_behaviour.py):

    * expert / medium: that checkpoint, greedy, one episode per seed;
    * medium-replay: the seeds split into equal consecutive parts, one per source of
      ``smax_behaviour.replay_sources`` (epsilon-greedy, epsilon falling from 1 to 0.05 with
      checkpoints up to medium, in training order);
    * mixed: the first half of the seeds with medium, the second half with expert;
    * random: uniform over available actions.

    ``workers`` > 1: the seeds are split into that many contiguous chunks, each collected by this
    function in a spawned single-threaded process (so the tier split above happens per chunk),
    and concatenated in seed order; ``meta["seconds"]`` is then the wall time of the whole call
    (spawn and compile included) and ``meta["cpu_seconds"]`` the children's collection CPU time.

    Returns (arrays, meta, behaviour_policy_id)."""

    seeds = np.asarray(seeds, dtype=np.int64).reshape(-1)
    workers = max(1, min(int(workers), len(seeds)))
    if workers > 1:
        t0 = time.perf_counter()
        chunks = np.array_split(seeds, workers)
        outs = _run_children(_tier_child, [(task_id, tier, c, batch) for c in chunks])
        arrays, meta = concat_collections([(a, r[0]) for a, r in outs])
        meta["seconds"], meta["workers"] = time.perf_counter() - t0, workers
        if log is not None:
            log(f"{task_id}/{tier}: {len(seeds)} episodes in {workers} workers, "
                f"{meta['env_steps']} steps in {meta['seconds']:.1f}s")
        return arrays, meta, outs[0][1][1]
    if tier == "random":
        arrays, meta = collect_smax(task_id, random_policy, seeds, batch=batch, log=log)
        return arrays, meta, "random-uniform-avail"
    card = sb.read_card(task_id)
    if tier in ("expert", "medium"):
        policy, params = sb.load_policy(task_id, tier)
        arrays, meta = collect_smax(task_id, policy, seeds, params=params, batch=batch, log=log)
        return arrays, meta, sb.policy_id(card, tier)
    if tier == "mixed":
        half = len(seeds) // 2
        parts = []
        for t, chunk in (("medium", seeds[:half]), ("expert", seeds[half:])):
            policy, params = sb.load_policy(task_id, t)
            parts.append(collect_smax(task_id, policy, chunk, params=params, batch=batch, log=log))
        arrays, meta = concat_collections(parts)
        return arrays, meta, sb.policy_id(card, tier)
    if tier == "medium-replay":
        sources = sb.replay_sources(task_id)
        chunks = _replay_parts(seeds, len(sources))
        parts = [collect_smax(task_id, pol, c, params=p, batch=batch, log=log)
                 for (_, pol, p), c in zip(sources, chunks) if len(c)]
        arrays, meta = concat_collections(parts)
        return arrays, meta, sb.policy_id(card, tier)
    raise ValueError(f"unknown SMAX tier {tier!r}")


def _replay_parts(seeds: np.ndarray, levels: int) -> list[np.ndarray]:
    """Seeds per medium-replay level, in order: equal consecutive parts; with fewer seeds than
    levels (small profiles), one seed per level spread evenly over the levels, so the first still
    plays epsilon 1 and the last the medium checkpoint at the final epsilon."""
    if len(seeds) >= levels or len(seeds) < 2:
        return np.array_split(seeds, levels)
    which = np.round(np.arange(len(seeds)) * (levels - 1) / (len(seeds) - 1)).astype(int)
    return [seeds[which == lv] for lv in range(levels)]


def _tier_child(task_id, tier, seeds, batch, barrier=None):
    arrays, meta, policy_id = collect_smax_tier(task_id, tier, seeds, batch=batch)
    return arrays, (meta, policy_id)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Write a SMAX map's tier card (card.json)")
    p.add_argument("task_id", nargs="?", help="the map to write card.json for")
    p.add_argument("--prune", action="store_true",
                   help="after writing the card, delete the ladder checkpoints it does not use")
    p.add_argument("--table", metavar="DATA_DIR",
                   help="print the tier table of the SMAX datasets in DATA_DIR/manifest.json instead")
    p.add_argument("--note", default="")
    p.add_argument("--refine", action="store_true",
                   help="first add interpolated policies where the ladder jumps over the medium target, "
                        "then re-evaluate the policies nearest the target on more episodes")
    a = p.parse_args(argv)
    if a.table:
        print(tier_table(manifest.read_manifest(Path(a.table))), end="")
        return
    if not a.task_id:
        p.error("a task id or --table")
    if a.refine:
        run = "ladder" if (sb.behaviour_dir(a.task_id) / "ladder").exists() else ""
        if run:
            refine(a.task_id)
        confirm(a.task_id, run)
    c = build_card(a.task_id, a.note)
    sb._write_json(sb.behaviour_dir(a.task_id) / "card.json", c)
    if a.prune:
        print(f"{a.task_id}: deleted {len(prune(a.task_id))} unused ladder checkpoints")
    print(f"{a.task_id}: expert {c['tiers']['expert']} (win {c['expert']['win_rate']:.3f}), medium "
          f"{c['tiers']['medium']} (win {c['medium']['win_rate']:.3f}, target "
          f"{c['selection']['medium_target_win_rate']:.3f}), {c['medium_replay_checkpoints']} replay checkpoints")



# --------------------------------------------------------------------------- dataset cards

TABLE_TIERS = ("expert", "mixed", "medium", "medium-replay")


def tier_table(entries: dict[str, dict[str, Any]]) -> str:
    """Markdown table of built SMAX tiers (manifest entries, any keys) with the reference's tier
    beside each: episodes, return (and / expert's), win rate (and / expert's); the reference's
    episodes, return (and / its expert's) and BC's win rate (and / BC on its expert)."""
    by = {(e["task_id"], e["quality"]): e for e in entries.values() if str(e.get("task_id", "")).startswith("smax-")}
    lines = ["| map | tier | episodes | return (/ expert's) | win rate (/ expert's) | reference: episodes | "
             "reference: return (/ expert's) | reference: BC win rate (/ BC on expert) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for task in sorted({t for t, _ in by}):
        m = task.split("-", 1)[1]
        ref, exp = REFERENCE[m], by.get((task, "expert"))
        for tier in TABLE_TIERS:
            e = by.get((task, tier))
            if e is None:
                continue
            rel_r = f" ({e['return_mean'] / exp['return_mean']:.2f})" if exp else ""
            rel_w = (f" ({e['win_rate'] / exp['win_rate']:.2f})" if exp and exp.get("win_rate") else "")
            lines.append(
                f"| {m} | {tier} | {e['n_episodes']:,} | {e['return_mean']:.2f}{rel_r} | "
                f"{e['win_rate']:.3f}{rel_w} | {ref['episodes'][tier]:,} | {ref['return'][tier]:.2f} "
                f"({relative(m, tier, 'return'):.2f}) | {ref['bc_win'][tier]:.2f} ({relative(m, tier):.2f}) |")
    return "\n".join(lines) + "\n"


def card_rows(entry: dict[str, Any]) -> list[tuple[str, str]]:
    """Rows for a SMAX dataset's card (datasets/cards.py): how its tier was chosen and the
    reference's tier beside it. Empty when the entry was built by another recipe than the
    committed card's (its behaviour-policy id differs), so a card never explains other data."""
    task_id, tier = entry["task_id"], entry["quality"]
    map_name = task_id.split("-", 1)[1]
    try:
        c = sb.read_card(task_id)
    except FileNotFoundError:
        return []
    if c.get("algo_version") != TIERS_VERSION or entry.get("behaviour_policy_id") != sb.policy_id(c, tier):
        return []
    ref = REFERENCE[map_name]
    e, m = c["expert"], c["medium"]
    target = c["selection"]["medium_target_win_rate"]
    chosen = {
        "expert": f"the best greedy win rate reached: `{e['ckpt']}` ({e['win_rate']:.3f})",
        "medium": (f"`{m['ckpt']}`, the {'policy' if m.get('interpolated') else 'checkpoint'} whose greedy "
                   f"win rate ({m['win_rate']:.3f}) is closest "
                   f"to expert's {e['win_rate']:.3f} x {ref['bc_win']['medium']:.2f} / "
                   f"{ref['bc_win']['expert']:.2f} (BC on the reference's medium / expert) = {target:.3f}"
                   + (f"; it interpolates the parameters of `{m['interpolated'][0]}` and `{m['interpolated'][1]}` "
                      f"(one PPO update apart) at {m['interpolated'][2]:g}, because the greedy win rate jumps "
                      f"over the target within that update" if m.get("interpolated") else "")),
        "medium-replay": (f"the learner's replay up to medium: {c['medium_replay_checkpoints']} checkpoints "
                          f"(`{c['tiers']['medium-replay'][0]}` .. `{m['ckpt']}`), one part each, "
                          f"epsilon-greedy with epsilon {sb.REPLAY_EPS[0]:g} -> {sb.REPLAY_EPS[1]:g}"),
        "mixed": "half medium, half expert episodes",
    }[tier]
    label = c.get("labels", {}).get("expert") if tier in ("expert", "mixed") else None
    rel = (f"BC wins {ref['bc_win'][tier]:.2f} on it ({relative(map_name, tier):.2f} of BC on its expert); "
           f"return {ref['return'][tier]:.2f} ({relative(map_name, tier, 'return'):.2f} of its expert's "
           f"{ref['return']['expert']:.2f} of 20); {ref['episodes'][tier]:,} episodes")
    rows = [("tier chosen as", chosen + " (datasets/smax_tiers.py, docs/smax.md)"),
            ("the reference's tier (CFCQL, SC2)", rel)]
    if entry.get("win_rate") is not None and tier != "expert":
        rows.append(("win rate / expert's (this map's expert checkpoint)",
                     f"{float(entry['win_rate']) / e['win_rate']:.2f}" if e["win_rate"] > 0 else "—"))
    if label:
        rows.append(("note", f"the expert here is the {label}, not an expert in the reference's sense"))
    return rows


if __name__ == "__main__":
    main()

"""`plcql-bench datasets ...`: build, list and inspect datasets."""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import click
import numpy as np

from plcql_bench.datasets import manifest, matd3, originals
from plcql_bench.datasets.behaviour import _random, available, stale, unavailable
from plcql_bench.datasets.build import _collect_tier, build_dataset
from plcql_bench.datasets.cards import CARDS_DIR, export_cards, off_card
from plcql_bench.datasets.importers import import_dataset, normalise_tier
from plcql_bench.datasets.recipes import recipe_for
from plcql_bench.datasets.smax_collect import WORKERS_ENV
from plcql_bench.datasets.tiers_v2 import publish_v2, republish_tier
from plcql_bench.datasets.train import train_behaviour
from plcql_bench.datasets.vault import export_vault
from plcql_bench.suite.envs import protocol
from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.runs.matrix import matrix_datasets
from plcql_bench.suite.runs.preflight import importer
from plcql_bench.suite.runs.profiles import load_profile
from plcql_bench.suite.runs.runner import check_dataset_identity, data_profile_dir
from plcql_bench.suite.envs.tasks import get_task, task_ids


@click.group()
def datasets() -> None:
    """Build, list and inspect datasets."""


@datasets.command("list")
@click.option("--profile", default="smoke", show_default=True)
@click.pass_obj
def datasets_list(obj: dict, profile: str) -> None:
    """Every task x tier with its status under the profile's data directory ("stale": built by an
    older collection recipe; `datasets build --force` rebuilds it; "unavailable": nothing here can
    build it, with the reason and the command that fixes it)."""

    prof = load_profile(profile)
    gen = prof.generation
    root = data_profile_dir(obj["data_dir"], prof)
    entries = manifest.read_manifest(root)
    click.echo(f"{'task':<26} {'tier':<14} {'status':<12} {'transitions':>11} {'return':>18}  source")
    counts = {"listed": 0, "built": 0}
    for task_id in task_ids():
        for tier in get_task(task_id).spec.tiers:
            entry = entries.get(f"{task_id}/{tier}")
            if entry and not manifest.file_present(root, entry):  # recorded, but the file was deleted or moved
                click.echo(f"{task_id:<26} {tier:<14} {'missing':<12} {'':>11} {'':>18}  {entry['file']} is gone; "
                           f"run: plcql-bench datasets build {task_id} {tier} --profile {prof.name}")
                counts["listed"] += 1
                continue
            if entry:
                status = "stale" if stale(entry, task_id, tier, gen) else "built"
                lacks = [k for k in ("n_transitions", "return_mean", "return_std") if not _number(entry.get(k))]
                if lacks:  # hand-made or damaged entry: list it, say what is missing
                    status = "incomplete"
                    click.echo(f"warning: {manifest.manifest_path(root)}: {task_id}/{tier}: entry lacks "
                               f"{', '.join(lacks)} (rebuild or re-import the dataset to record them)", err=True)
                n = entry.get("n_transitions", "?") if _number(entry.get("n_transitions")) else "?"
                ret = (f"{entry['return_mean']:.1f} ± {entry['return_std']:.1f}"
                       if not {"return_mean", "return_std"} & set(lacks) else "?")
            else:
                status = "not built" if available(task_id, tier, gen) else "unavailable"
                n, ret = "", ""
            src = (entry.get("behaviour_policy_id") or entry.get("source") or "?") if entry else available(task_id, tier, gen)
            if not src:
                why, fix = unavailable(task_id, tier, gen)
                src = f"{why}; run: {fix}"
            click.echo(f"{task_id:<26} {tier:<14} {status:<12} {n:>11} {ret:>18}  {src}")
            counts["listed"] += 1
            counts["built"] += status == "built"
    click.echo(f"{counts['built']} of {counts['listed']} datasets built in {root} (profile {prof.name})")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@datasets.command("build")
@click.argument("task", required=False)
@click.argument("tier", required=False)
@click.option("--profile", default="smoke", show_default=True)
@click.option("--all", "build_all", is_flag=True, help="Every task x tier that has a behaviour policy.")
@click.option("--matrix", is_flag=True, help="The datasets the profile's default matrix needs.")
@click.option("--seed", "generator_seed", default=0, show_default=True, help="Generator seed.")
@click.option("--force", is_flag=True, help="Rebuild even if the manifest has it.")
@click.option("--workers", default=None, type=click.IntRange(min=1),
              help="SMAX tasks: collect in N spawned single-threaded processes (sets "
                   "PLCQL_SMAX_WORKERS; default 1). The dataset then depends on N (docs/smax.md).")
@click.pass_obj
def datasets_build(obj, task, tier, profile, build_all, matrix, generator_seed, force, workers) -> None:
    """Build TASK TIER (or --all / --matrix) at the profile's size."""

    prof = load_profile(profile)
    if build_all:
        todo = [(t, q) for t in task_ids() for q in get_task(t).spec.tiers if available(t, q, prof.generation)]
    elif matrix:
        todo = matrix_datasets(prof)
    elif task and tier:
        todo = [(task, tier)]
    else:
        raise click.UsageError("give TASK TIER, or --all, or --matrix")
    root = data_profile_dir(obj["data_dir"], prof)
    if workers is not None:
        os.environ[WORKERS_ENV] = str(workers)  # read by the SMAX collect hook
    for task_id, q in todo:
        spec = get_task(task_id).spec  # unknown task or tier -> clear error before any work
        if q not in spec.tiers:
            raise BenchError(f"unknown tier {q!r} for {task_id} (tiers: {', '.join(spec.tiers)})")
        entry = manifest.lookup(root, task_id, q)
        if entry and not manifest.file_present(root, entry):  # recorded, but its file was deleted or moved
            click.echo(f"{task_id}/{q}: recorded in {manifest.manifest_path(root)} but {entry['file']} is missing: "
                       "building it")
            entry = None
        if not force and entry:
            why = stale(entry, task_id, q, prof.generation)
            click.echo(f"{task_id}/{q}: already built (use --force to rebuild)"
                       + (f"; STALE: {why}" if why else ""))
            continue
        source = prof.import_for(task_id, q)
        if source:  # the profile imports this tier (datasets.import)

            entry = importer(source)(task_id, q, 0, root, profile=prof.data_profile)
        else:
            entry = build_dataset(task_id, q, prof.episodes_for(task_id, q), root,
                                  profile=prof.data_profile, generator_seed=generator_seed,
                                  generation_name=prof.generation)
        click.echo(f"{task_id}/{q}: {entry['n_transitions']} transitions, return "
                   f"{entry['return_mean']:.1f} ± {entry['return_std']:.1f} "
                   f"(refs: random {entry['ref_return_random']:.1f}, expert "
                   f"{entry['ref_return_expert']:.1f}) -> {root / entry['file']}")
        if (why := off_card(entry)) is not None:
            click.echo(f"warning: {task_id}/{q}, just built, is not its committed card's dataset: {why}", err=True)


@datasets.command("cards")
@click.option("--profile", default="paper", show_default=True)
@click.option("--out", default=None, type=click.Path(path_type=str),
              help="Default: datasets/cards/<profile>/ (committed with the code).")
@click.option("--compare", "compare_with", type=click.Choice(["originals"]), default=None,
              help="Print the profile's committed cards beside the original datasets' statistics "
                   "(datasets/originals.json) with an in/out-of-tolerance verdict per tier; writes nothing.")
@click.option("--strict", is_flag=True, help="With --compare: exit 1 when a tier is out of tolerance.")
@click.pass_obj
def datasets_cards(obj, profile, out, compare_with, strict) -> None:
    """Export the cards of every built dataset of a profile (plus an index) for committing; or, with
    --compare originals, compare the committed cards with the originals."""

    prof = load_profile(profile)
    if compare_with:
        folder = Path(out) if out else CARDS_DIR / prof.data_profile
        rows = originals.compare(originals.committed_cards(folder))
        click.echo(f"cards: {folder}; originals: {originals.ORIGINALS}")
        click.echo(originals.render(rows))
        if strict and not all(r.holds for r in rows):
            raise SystemExit(1)
        return
    dest = out or str(CARDS_DIR / prof.data_profile)
    files = export_cards(data_profile_dir(obj["data_dir"], prof), dest, prof.data_profile, echo=click.echo)
    click.echo(f"{len(files)} files written to {dest} (index: {dest}/README.md)")


@datasets.command("import")
@click.argument("task")
@click.argument("tier")
@click.argument("source", type=click.Path(path_type=str))
@click.option("--format", "fmt_name", default="auto", show_default=True,
              type=click.Choice(["auto", "omar-npy", "cfcql-h5", "vault"]),
              help="auto: a <name>.vlt folder is an OG-MARL vault (extra [vault]), another directory OMAR's "
                   ".npy layout, an .h5 file CFCQL's SMAC format.")
@click.option("--uid", default=None, help="vault: the dataset's uid in the vault (default: the one that names TIER, "
                                          "e.g. Medium-Replay for medium-replay).")
@click.option("--profile", default="paper", show_default=True,
              help="Profile whose data directory receives the file (official data is paper-sized).")
@click.option("--seed", "omar_seed", default=0, show_default=True,
              help="OMAR: which seed_<k>_data directory to import.")
@click.option("--prey", "prey_file", default=None, type=click.Path(path_type=str),
              help="PP/World: OMAR's pretrained_adv_model.pt (found next to SOURCE by default).")
@click.pass_obj
def datasets_import(obj, task, tier, source, fmt_name, uid, profile, omar_seed, prey_file) -> None:
    """Convert an official dataset (OMAR .npy, CFCQL SMAC .h5, an OG-MARL vault) to format v1 as TASK/TIER."""

    spec = get_task(task).spec
    tier = normalise_tier(tier)
    if tier not in spec.tiers:
        raise BenchError(f"unknown tier {tier!r} for {task} (tiers: {', '.join(spec.tiers)})")
    prof = load_profile(profile)
    root = data_profile_dir(obj["data_dir"], prof)
    entry = import_dataset(fmt_name, source, spec, tier, root, profile=prof.data_profile, seed=omar_seed,
                           prey_file=prey_file, uid=uid)
    click.echo(f"{task}/{tier}: imported {entry['n_transitions']} transitions "
               f"({entry['n_episodes']} episodes), return {entry['return_mean']:.2f} ± "
               f"{entry['return_std']:.2f} -> {root / entry['file']}")


@datasets.command("export")
@click.argument("task")
@click.argument("tier")
@click.option("--format", "fmt_name", type=click.Choice(["vault"]), default="vault", show_default=True,
              help="vault: an OG-MARL vault (flashbax, extra [vault]): <out>/<name>.vlt/<uid>/.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("vaults"), show_default=True,
              help="The folder the vault goes in.")
@click.option("--name", "vault_name", default=None, help="The vault's name (default: <task>.vlt: one vault per task).")
@click.option("--uid", default=None, help="The dataset's uid in the vault (default: the tier).")
@click.option("--profile", default="smoke", show_default=True, help="Profile whose dataset is exported.")
@click.option("--force", is_flag=True, help="Replace the uid when the vault has it already.")
@click.pass_obj
def datasets_export(obj, task, tier, fmt_name, out, vault_name, uid, profile, force) -> None:
    """Write the built dataset TASK/TIER as an OG-MARL vault that flashbax (and OG-MARL) read; every array of
    the file is kept, so `datasets import --format vault` gives it back exactly."""

    spec = get_task(task).spec
    tier = normalise_tier(tier)
    if tier not in spec.tiers:
        raise BenchError(f"unknown tier {tier!r} for {task} (tiers: {', '.join(spec.tiers)})")
    root = data_profile_dir(obj["data_dir"], load_profile(profile))
    entry = manifest.lookup(root, task, tier)
    if entry is None:
        raise BenchError(f"dataset {task}/{tier} is not built in {root} (run: plcql-bench datasets build {task} "
                         f"{tier} --profile {profile})")
    check_dataset_identity(root / entry["file"], task, tier)
    dest = export_vault(root / entry["file"], spec, out, uid=uid or tier, vault_name=vault_name,
                        expected_sha256=entry["sha256"], force=force)
    click.echo(f"{task}/{tier}: {entry['n_transitions']} transitions from {root / entry['file']} -> vault {dest}")


@datasets.command("train-behaviour")
@click.argument("task")
@click.option("--profile", default="smoke", show_default=True,
              help="Training budget: smoke (seconds), cpu (reduced, CPU-hours), paper (OMAR-scale).")
@click.option("--out", default=None, type=click.Path(path_type=str),
              help="Run directory (resumable); default artifacts/behaviour/<task>/<profile>/.")
@click.option("--seed", default=0, show_default=True)
@click.option("--max-seconds", default=None, type=float, help="Stop (resumably) after this long.")
@click.option("--env-steps", default=None, type=int,
              help="Override the profile's total env steps (resume with more to train longer).")
@click.option("--updates-per-step", default=None, type=click.FloatRange(min=0, min_open=True),
              help="Override the profile's gradient updates per collected transition (a run of another rate).")
@click.option("--assets", default=None, type=click.Path(path_type=str),
              help="Where to publish checkpoints+cards (default: datasets/assets/behaviour for "
                   "non-smoke profiles; smoke publishes only with --assets).")
@click.option("--no-publish", is_flag=True,
              help="Only train: publish nothing (choose from the run later with publish-v2 or publish-v2-tier).")
def datasets_train_behaviour(task, profile, out, seed, max_seconds, env_steps, updates_per_step, assets,
                             no_publish) -> None:
    """Train MATD3 behaviour policies for TASK (continuous tasks); resumes from --out."""

    spec = get_task(task).spec
    if spec.discrete:
        raise BenchError(f"{task}: MATD3 is for continuous tasks; SMAX has its own trainer")
    matd3.budget_for(task, profile)  # unknown profile -> one-line error
    if assets is None and profile != "smoke":
        assets = str(matd3.ASSETS_DIR)
    res = train_behaviour(task, profile, out=out, seed=seed, max_seconds=max_seconds, assets=assets,
                          progress=click.echo, env_steps=env_steps, updates_per_step=updates_per_step,
                          publish_tiers=not no_publish)
    if res is None or no_publish:
        return
    tiers = res["tiers"] if "tiers" in res else {t: {"return": res[t]["return"],
                                                     "env_steps": res[t]["env_steps"]}
                                                 for t in ("expert", "medium", "random")}
    for t, e in tiers.items():
        if "return" in e:  # a v2 random tier is uniform actions: no checkpoint
            click.echo(f"{task}/{t}: return {e['return']:.2f} at {e['env_steps']} env steps"
                       + (f", noise {e['noise']}" if "noise" in e else ""))


def _publish_arguments(f, tier: bool = False):
    """TASK [TIER] RUN_DIR [--assets]: what the publish commands take (a train-behaviour run, where to publish
    it; with `tier`, the one tier to choose again)."""
    f = click.option("--assets", default=None, type=click.Path(path_type=str),
                     help="Behaviour assets folder (default: datasets/assets/behaviour).")(f)
    f = click.argument("run_dir", type=click.Path(path_type=str, exists=True, file_okay=False))(f)
    if tier:
        f = click.argument("tier", type=click.Choice(["expert", "medium"]))(f)
    return click.argument("task")(f)


@datasets.command("publish-v2")
@_publish_arguments
def datasets_publish_v2(task, run_dir, assets) -> None:
    """Choose the v2 generation's expert and medium checkpoints of a finished `train-behaviour TASK --profile
    v2` run (RUN_DIR) by the originals' statistics, and write index-v2.json with its medium-replay sequence."""

    index = publish_v2(task, run_dir, assets, progress=click.echo)
    for t, e in index["tiers"].items():
        if "checkpoint" in e:
            s = e["candidate_stats"]
            click.echo(f"{task}/{t}: step {e['env_steps']}, noise {e['noise']}: {s['mean']:.1f} ± {s['std']:.1f} "
                       f"(in tolerance: {e['in_tolerance']})")
    mr = index["medium_replay"]
    click.echo(f"{task}/medium-replay: {mr['episodes']} episodes ({mr['transitions']} transitions) in {len(mr['parts'])} parts")


@datasets.command("publish-v2-tier")
@functools.partial(_publish_arguments, tier=True)
def datasets_publish_v2_tier(task, tier, run_dir, assets) -> None:
    """Choose TASK's v2 TIER again among the checkpoints of RUN_DIR (the publishing run, or another
    `train-behaviour TASK --profile v2` run of another seed or budget, recorded in the tier's entry) and
    update index-v2.json; the other tiers stay, and the previous choice is kept as evidence."""

    index = republish_tier(task, tier, run_dir, assets, progress=click.echo)
    e = index["tiers"][tier]
    s = e["candidate_stats"]
    run = f" of run {e['run']['name']}" if "run" in e else ""
    click.echo(f"{task}/{tier}: step {e['env_steps']}{run}, noise {e['noise']}: {s['mean']:.1f} ± {s['std']:.1f} "
               f"(in tolerance: {e['in_tolerance']})")


@datasets.command("publish-replay")
@_publish_arguments
def datasets_publish_replay(task, run_dir, assets) -> None:
    """Publish the checkpoint sequence of a train-behaviour run (RUN_DIR) up to TASK's published
    medium checkpoint, so medium-replay rebuilds anywhere. The run must be the one that produced
    the published tiers: same seed and budget, trained at least up to the medium step (e.g.
    `train-behaviour TASK --profile cpu --env-steps <medium step> --out RUN_DIR --assets <tmp>`)."""

    d = Path(assets or matd3.ASSETS_DIR) / task
    try:
        index = json.loads((d / "index.json").read_text())
    except (OSError, ValueError) as exc:
        raise BenchError(f"{d / 'index.json'}: no published behaviour policies ({exc})") from None
    med = index["tiers"]["medium"]
    ckpt = Path(run_dir) / f"ckpt_{med['env_steps']:09d}.pt"
    if not ckpt.is_file():
        raise BenchError(f"{ckpt}: missing; train the run up to the medium step ({med['env_steps']})")
    if not matd3._same_actors(ckpt, d / med["checkpoint"]):
        raise BenchError(f"{ckpt}: its actors differ from the published {d / med['checkpoint']}: "
                         "not the run that produced the tiers (seed, budget or torch threads differ)")
    rep = matd3.publish_replay(task, run_dir, d.parent, med["env_steps"])
    files = sorted({p["checkpoint"] for p in rep["parts"] if "checkpoint" in p})
    size = sum((d / f).stat().st_size for f in files)
    click.echo(f"{task}: medium-replay = {len(rep['parts'])} parts, {rep['episodes']} episodes up to env "
               f"step {rep['up_to_env_step']}; {len(files)} checkpoints ({size / 1e6:.2f} MB) in {d}")


@datasets.command("bench")
@click.argument("tasks", nargs=-1)
@click.option("--episodes", default=64, show_default=True, help="Episodes per task (1000-step tasks: a quarter).")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=1),
              help="SMAX tasks: spawned single-threaded collector processes (other tasks: ignored).")
def datasets_bench(tasks, episodes, workers) -> None:
    """Collection speed: env-steps/s of `datasets build`'s collector with a uniform random policy
    (SMAX: smax_collect.bench, compile excluded)."""

    for task_id in tasks or task_ids():
        task, recipe = get_task(task_id), recipe_for(task_id)
        if task.spec.discrete and recipe.collect is None:
            click.echo(f"{task_id:<26} skipped (discrete task without a collector)")
            continue
        n = max(2, episodes // 4) if task.spec.episode_limit >= 500 else episodes
        if recipe.bench is not None:  # the family's own benchmark (SMAX: warm-up, then timed)
            r = recipe.bench(task, n, workers)
            steps, dt = r["env_steps"], r["seconds"]
            click.echo(f"{task_id:<26} {steps:>8} env steps in {dt:6.2f} s: {steps / dt:>10,.0f} "
                       f"env-steps/s ({r.get('workers', 1)} workers)")
            continue
        behaviour = _random(task.spec.act_dim)
        seeds = protocol.collection_seeds(0, 0, 0, n)
        _collect_tier(task, behaviour, seeds[:2], np.random.default_rng(0))  # warm-up / compile
        start = time.perf_counter()
        arrays = _collect_tier(task, behaviour, seeds, np.random.default_rng(0))
        dt = time.perf_counter() - start
        steps = len(arrays["rewards"])
        click.echo(f"{task_id:<26} {steps:>8} env steps in {dt:6.2f} s: {steps / dt:>10,.0f} env-steps/s")

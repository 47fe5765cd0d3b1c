"""Campaigns: a named, prioritised list of matrix selections to run in the background, resumably, with
every finished run published into the committed results folder as it lands.

A campaign file (YAML):

    profile: paper
    stages:
      - name: plcql-study-cn-random
        only: algo=plcql,plcql-kn,task=mpe-cn,tier=random,seed=0,1,2
      - ...

`plcql-bench campaign run FILE` runs the stages as ONE priority queue, `plcql-bench all --profile P
--queue SPEC1 --queue SPEC2 ...` (finished cells are skipped, interrupted ones resume from their
checkpoints). A free core takes the next cell in file order, so the cores never wait for a stage's
last run. While it runs, and once at the end, the campaign copies the finished runs' small files
(final.json, config.json, metrics.jsonl as metrics.jsonl.gz) into `--publish-to` (default leaderboard/results), checking
every `--publish-every` seconds. A failed cell does not stop the campaign (exit 1 at the end).
`plcql-bench campaign status FILE` shows each stage's cells (done / partial / running / failed / todo)
and the time they still need, as `plan` estimates it. On a fresh clone the results folder is empty:
`campaign run` first adopts the runs already published in `--publish-to` (copies them into the results
folder), so their cells count as done; `campaign adopt` does that alone.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import click

from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.core.validate import load_user_yaml
from plcql_bench.suite.core.schema import (
    RecordError,
    check_location,
    compact_metrics_text,
    curve_from_metrics,
    read_record,
)
from plcql_bench.suite.core.store import METRICS, METRICS_GZ, atomic_write_json, gzip_text, read_json
from plcql_bench.suite.runs.matrix import parse_only, select_cells
from plcql_bench.suite.runs.profiles import load_profile

# metrics.jsonl is published gzipped (.gz), and final.json without its curve where the metrics hold the same points
PUBLISHED_FILES = ("final.json", "config.json", "metrics.jsonl")


@dataclass(frozen=True)
class Stage:
    name: str
    only: str


@dataclass(frozen=True)
class Campaign:
    profile: str
    stages: tuple[Stage, ...]


def load_campaign(path: Path) -> Campaign:
    """Parse a campaign file; BenchError naming the file and field on anything malformed."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchError(f"{path}: cannot read campaign: {str(exc).splitlines()[0]}") from None
    raw = load_user_yaml(text, f"{path}: cannot read campaign")
    if not isinstance(raw, dict) or not isinstance(raw.get("profile"), str) or not isinstance(raw.get("stages"), list):
        raise BenchError(f"{path}: a campaign needs 'profile' (a name) and 'stages' (a list)")
    stages, names = [], set()
    for i, st in enumerate(raw["stages"]):
        if not isinstance(st, dict) or not isinstance(st.get("name"), str) or not isinstance(st.get("only"), str):
            raise BenchError(f"{path}: stages[{i}] needs 'name' and 'only' (strings)")
        if st["name"] in names:
            raise BenchError(f"{path}: stages[{i}]: duplicate stage name {st['name']!r}")
        names.add(st["name"])
        stages.append(Stage(st["name"], st["only"]))
    return Campaign(raw["profile"], tuple(stages))


def stage_cells(campaign: Campaign, stage: Stage):
    """The profile and the cells a stage selects (validated like `all --only`)."""

    prof = load_profile(campaign.profile)
    return prof, select_cells(prof, parse_only([stage.only]))


def publish(results_dir: Path, profile: str, dest: Path, warn=lambda line: click.echo(line, err=True)) -> int:
    """Copy every finished run's small files under results_dir/profile to dest/profile (same relative
    paths); returns how many runs were newly published. Files already there are left alone; a
    final.json that is not a valid result of its run directory is not published (one warning line).
    A newly published final.json is stored without its curve where the run's metrics rebuild it exactly
    (`_without_curve`): the committed results must stay within what a GPU loan can carry."""

    src_root = Path(results_dir) / profile
    archived = archived_runs(dest)
    n = 0
    for final in sorted(src_root.rglob("final.json")):
        rel = final.parent.relative_to(Path(results_dir))
        target = Path(dest) / rel
        if (target / "final.json").exists() or rel.as_posix() in archived:  # an archived run stays archived
            continue
        try:
            check_location(read_record(final), (rel / "final.json").as_posix())
        except RecordError as exc:
            warn(f"warning: not published {final}: {exc}")
            continue
        target.mkdir(parents=True, exist_ok=True)
        for name in PUBLISHED_FILES:  # final.json last: its presence marks a complete copy
            if not (final.parent / name).exists() or name == "final.json":
                continue
            if name == METRICS:  # ~6x smaller: the committed results stay within what a GPU loan can carry
                gzip_text(compact_metrics_text((final.parent / name).read_text(encoding="utf-8")), target / METRICS_GZ)
            else:
                shutil.copyfile(final.parent / name, target / name)
        compact = _without_curve(final)
        if compact is None:
            shutil.copyfile(final, target / "final.json")
        else:
            atomic_write_json(target / "final.json", compact)
        n += 1
    return n


def _without_curve(final: Path) -> dict | None:
    """final.json's object without its curve when the metrics beside it rebuild exactly the same points
    (schema.curve_from_metrics; schema.read_record puts it back on reading); None when they do not, or
    when there are no metrics (the file is then kept as it is)."""

    try:
        raw = read_json(final)
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or not raw.get("curve") or raw["curve"] != curve_from_metrics(final.parent):
        return None
    return {k: v for k, v in raw.items() if k != "curve"}


def archived_runs(dest: Path) -> set[str]:
    """The run directories (`<profile>/<algo>/<task>/<tier>/<run>`) of the archives beside a published results
    folder (leaderboard/archive/<name>/[results/]...): runs moved out of the board on purpose (another dataset
    generation, another config), which a results folder that adopted them before the move must not publish
    again."""
    out = set()
    for final in Path(dest).resolve().parent.glob("archive/*/**/final.json"):
        parts = final.parent.parts
        if len(parts) >= 5:
            out.add("/".join(parts[-5:]))
    return out


def adopt_published(published: Path, results_dir: Path, profile: str) -> int:
    """Copy every published run under published/profile (its final.json, config.json and metrics) into
    results_dir where that run's directory does not exist yet, so `all` counts its cell as done on a
    machine that has only the committed results (a fresh clone, a GPU loan) instead of training it
    again. Run directories already there are left alone. Returns how many runs were adopted."""
    n = 0
    for final in sorted((Path(published) / profile).rglob("final.json")):
        target = Path(results_dir) / final.parent.relative_to(Path(published))
        if target.exists():
            continue
        target.mkdir(parents=True)
        for src in sorted(final.parent.iterdir(), key=lambda f: f.name == "final.json"):  # final.json last
            if src.is_file():
                shutil.copyfile(src, target / src.name)
        n += 1
    return n


def run_queue(cmd: list[str], every_s: float, on_tick) -> int:
    """Run the campaign's `all`, calling on_tick() every every_s seconds while it runs (publishing);
    a stop (SIGINT/SIGTERM) of the campaign is passed on to it, so its runs stop cleanly
    (interrupted, last checkpoint kept) instead of running on without the campaign."""
    proc = subprocess.Popen(cmd)
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(every_s):
            on_tick()

    ticker = threading.Thread(target=tick, daemon=True) if on_tick is not None else None
    if ticker is not None:
        ticker.start()
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        proc.wait()
        raise
    finally:
        stop.set()
        if ticker is not None:
            ticker.join()


def all_command(data_dir: Path, results_dir: Path, profile: str, specs: list[str], jobs: int | None,
                 finish_within: float | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "plcql_bench.suite.commands.main", "--data-dir", str(data_dir), "--results-dir",
           str(results_dir), "all", "--profile", profile]
    for spec in specs:
        cmd += ["--queue", spec]
    cmd += ["--finish-within", f"{finish_within:.0f}s"] if finish_within is not None else []
    return cmd + (["--jobs", str(jobs)] if jobs else [])

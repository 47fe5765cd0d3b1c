"""Fault injection (issue 21): every bad input and damaged file of the reliability trials,
reproduced as the user would meet it, through the real entry point (in this process, so each case
takes seconds). Each case asserts the behaviour the suite promises: one line naming the file or
field, the exit status (2 for user errors), nothing written or nothing lost, and no wrong result
ever counted as done.

BAD 1-6 and the WEAK items are named in each test's name and docstring."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest

from plcql_bench.datasets import manifest
from plcql_bench.datasets.build import build_dataset
from plcql_bench.suite.runs import runner
from plcql_bench.suite.core.errors import BenchError
from plcql_bench.suite.runs.profiles import load_profile
from plcql_bench.suite.runs.runner import Cell, RunBusy, execute, plan_run

PROFILE = """\
name: faults
description: fault-injection tests
datasets: {episodes: {default: 4}}
train: {updates: {default: 4}, eval_every: 2, eval_episodes: 1, final_eval_episodes: 2, checkpoint_every: 2}
matrix: {algos: [bc], tasks: [mpe-cn], tiers: [random, expert], seeds: [0, 1]}
algo_overrides: {batch_size: 16, hidden: 16}
"""
RUN = ("--algo", "bc", "--task", "mpe-cn", "--dataset", "random")


# ----------------------------------------------------------------------------- fixtures and helpers
@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """Datasets (mpe-cn random, expert) and two finished runs (bc random seeds 0, 1); tests copy it."""
    return make_world(tmp_path_factory.mktemp("faults"))


def make_world(root: Path) -> Path:
    """The world of `world`, in ``root`` (test_faults_v3.py builds its own)."""
    (root / "p.yaml").write_text(PROFILE)
    prof = load_profile(str(root / "p.yaml"))
    for tier in ("random", "expert"):
        build_dataset("mpe-cn", tier, 4, root / "data" / "faults", profile="faults")
    for seed in (0, 1):
        execute(plan_run(Cell("bc", "mpe-cn", "random", seed), prof, root / "data", root / "results"),
                log=lambda *_: None)
    return root


@pytest.fixture()
def ws(world, tmp_path) -> Path:
    """A private copy of the world."""
    shutil.copytree(world, tmp_path / "w")
    return tmp_path / "w"


def bench(monkeypatch, capsys, ws: Path, *args: str, results: Path | None = None) -> tuple[int, str, str]:
    """The real `plcql-bench` entry point, in process: (exit status, stdout, stderr)."""
    from plcql_bench.suite.commands.main import main

    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["plcql-bench", "--data-dir", str(ws / "data"),
                                      "--results-dir", str(results or ws / "results"), *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, *needles: str) -> str:
    """stderr is exactly one 'error: ...' line (no traceback) that contains every needle."""
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def snapshot(*roots: Path) -> dict:
    return {p: p.read_bytes() for root in roots if root.exists() for p in sorted(root.rglob("*")) if p.is_file()}


def run_dir(ws: Path, seed: int, tier: str = "random") -> Path:
    (d,) = (ws / "results" / "faults" / "bc" / "mpe-cn" / tier).glob(f"seed{seed}-*")
    return d


def profile_with(ws: Path, old: str, new: str, name: str = "bad.yaml") -> str:
    text = PROFILE if old is None else PROFILE.replace(old, new)
    assert old is None or text != PROFILE, old
    (ws / name).write_text(text)
    return str(ws / name)


# ----------------------------------------------------------------------------- BAD 1: batch 0, score nan
def test_bad1_batch_size_zero_is_refused_before_anything_is_written(ws, monkeypatch, capsys):
    """`run --set batch_size=0` used to finish with score nan, status done."""
    before = snapshot(ws / "results")
    code, _, err = bench(monkeypatch, capsys, ws, "run", *RUN, "--seed", "5", "--profile", str(ws / "p.yaml"),
                         "--set", "batch_size=0")
    assert code == 2
    one_error_line(err, "--set", "batch_size", ">= 1")
    assert snapshot(ws / "results") == before


def test_bad1_non_finite_score_marks_the_run_failed(ws, monkeypatch, capsys):
    """A run whose final evaluation is NaN is failed (no final.json), `run` says so in one line
    (exit 1), and `all` does not count it as done."""
    real = runner.evaluate_policy

    def nan_eval(*args, **kw):
        out = real(*args, **kw)
        return {**out, "return_mean": float("nan"), "normalised_score": float("nan")}

    monkeypatch.setattr(runner, "evaluate_policy", nan_eval)
    code, _, err = bench(monkeypatch, capsys, ws, "run", *RUN, "--seed", "5", "--profile", str(ws / "p.yaml"))
    assert code == 1
    one_error_line(err, "seed 5 failed", "not a finite number", "status.json")
    d = run_dir(ws, 5)
    assert not (d / "final.json").exists()
    assert json.loads((d / "status.json").read_text())["status"] == "failed"
    code, out, err = bench(monkeypatch, capsys, ws, "all", "--profile", str(ws / "p.yaml"), "--jobs", "1",
                           "--only", "dataset=random,seed=0")
    assert code == 0 and "skipped 1 (done)" in out  # the healthy seed-0 run is still done


# ----------------------------------------------------------------------------- BAD 2: negative budget
def test_bad2_negative_updates_in_a_profile_is_refused(ws, monkeypatch, capsys):
    """A profile with `updates: {default: -5}` used to record the untrained policy as done."""
    bad = profile_with(ws, "updates: {default: 4}", "updates: {default: -5}")
    before = snapshot(ws / "results")
    for cmd in (("run", *RUN, "--seed", "5"), ("all", "--jobs", "1"), ("plan",)):
        code, _, err = bench(monkeypatch, capsys, ws, *cmd, "--profile", bad)
        assert code == 2, cmd
        one_error_line(err, "bad.yaml", "train.updates.default", ">= 1", "-5")
    assert snapshot(ws / "results") == before


# ----------------------------------------------------------------------------- BAD 3: dataset identity
def test_bad3_dataset_copied_over_another_tier_is_refused(ws, monkeypatch, capsys):
    """expert.h5 copied to random.h5 with the manifest's sha256 (and size) fixed to match used to
    train on expert data as "random"."""
    from plcql_bench.datasets.format import sha256_file

    root = ws / "data" / "faults"
    shutil.copyfile(root / "mpe-cn" / "expert.h5", root / "mpe-cn" / "random.h5")
    doc = json.loads((root / "manifest.json").read_text())
    doc["mpe-cn/random"].update(sha256=sha256_file(root / "mpe-cn" / "random.h5"),
                                size_bytes=(root / "mpe-cn" / "random.h5").stat().st_size)
    (root / "manifest.json").write_text(json.dumps(doc))
    before = snapshot(ws / "results")
    code, _, err = bench(monkeypatch, capsys, ws, "run", *RUN, "--seed", "5", "--profile", str(ws / "p.yaml"))
    assert code == 2
    one_error_line(err, "random.h5", "attrs.quality", "'expert'")
    assert snapshot(ws / "results") == before
    code, out, err = bench(monkeypatch, capsys, ws, "all", "--profile", str(ws / "p.yaml"), "--jobs", "1",
                           "--only", "dataset=random,seed=0", results=ws / "r2")
    assert code == 2, out + err
    assert "attrs.quality" in out and not list((ws / "r2").rglob("final.json"))


@pytest.mark.parametrize("file", ["/etc/passwd", "../../outside.h5", "mpe-cn/../../x.h5"])
def test_bad3_manifest_path_outside_the_data_dir_is_refused_on_read(ws, monkeypatch, capsys, file):
    root = ws / "data" / "faults"
    doc = json.loads((root / "manifest.json").read_text())
    doc["mpe-cn/random"]["file"] = file
    (root / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(manifest.ManifestError, match=r"mpe-cn/random\.file: must be a path relative"):
        manifest.lookup(root, "mpe-cn", "random")
    code, _, err = bench(monkeypatch, capsys, ws, "run", *RUN, "--seed", "5", "--profile", str(ws / "p.yaml"))
    assert code == 2
    one_error_line(err, "manifest.json", "mpe-cn/random.file")


# ----------------------------------------------------------------------------- BAD 4: truncated metrics
def test_bad4_truncated_metrics_jsonl_skips_that_run_with_a_warning(ws, monkeypatch, capsys):
    """One truncated metrics.jsonl used to stop `export --format csv` with a JSONDecodeError."""
    metrics = run_dir(ws, 0) / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes()[:150])
    out_csv = ws / "out.csv"
    code, out, err = bench(monkeypatch, capsys, ws, "export", "--out", str(out_csv))
    assert code == 0
    warnings = [x for x in err.splitlines() if x.startswith("warning: ")]
    assert len(warnings) == 1 and "seed0-" in warnings[0] and "metrics.jsonl" in warnings[0]
    assert ": line " in warnings[0] and "invalid JSON" in warnings[0]
    seeds = {line.split(",")[5] for line in out_csv.read_text().splitlines()[1:]}
    assert seeds == {"1"}  # the healthy run is exported, the damaged one is not
    code, _, err = bench(monkeypatch, capsys, ws, "export", "--out", str(out_csv), "--strict")
    assert code == 2 and "error: 1 result file skipped (--strict)" in err


# ----------------------------------------------------------------------------- BAD 5: malformed final.json
MALFORMED = {
    "status-only": lambda rec: {"status": "done"},
    "a-list": lambda rec: [1, 2],
    "score-string": lambda rec: {**rec, "score": "abc"},
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_bad5_malformed_final_json_is_skipped_by_every_read_command(ws, monkeypatch, capsys, kind):
    """final.json of {"status": "done"}, [1, 2] or "score": "abc" used to crash `status`
    (KeyError 'train') and `export` (KeyError / AttributeError) without naming the file."""
    final = run_dir(ws, 0) / "final.json"
    final.write_text(json.dumps(MALFORMED[kind](json.loads(final.read_text()))))
    prof = str(ws / "p.yaml")
    for cmd in (("status",), ("export", "--out", str(ws / "o.csv")), ("plan", "--profile", prof),
                ("leaderboard", "--out", str(ws / "site"))):
        code, out, err = bench(monkeypatch, capsys, ws, *cmd)
        assert code == 0, (cmd, err)
        assert "Traceback" not in err
        warnings = [x for x in err.splitlines() if x.startswith("warning: ")]
        assert len(warnings) == 1 and "seed0-" in warnings[0] and "final.json" in warnings[0], (cmd, err)
        code, _, err = bench(monkeypatch, capsys, ws, *cmd, "--strict")
        assert code == 2, cmd
    code, out, _ = bench(monkeypatch, capsys, ws, "status")
    assert "done 1" in out.splitlines()[-1]  # seed 1 is still done; seed 0 is not
    code, out, _ = bench(monkeypatch, capsys, ws, "export", "--out", str(ws / "o.csv"))
    assert {line.split(",")[5] for line in (ws / "o.csv").read_text().splitlines()[1:]} == {"1"}


# ----------------------------------------------------------------------------- BAD 6: final.json of another run
def test_bad6_final_json_copied_from_another_seed_is_not_done(ws, monkeypatch, capsys):
    """seed 0's final.json copied into seed 1's run directory used to count as seed 1 done (the
    CSV held seed 0's score twice; seed 1 was never trained)."""
    seed0, seed1 = run_dir(ws, 0), run_dir(ws, 1)
    original = json.loads((seed1 / "final.json").read_text())
    shutil.copyfile(seed0 / "final.json", seed1 / "final.json")
    prof = load_profile(str(ws / "p.yaml"))
    plan = plan_run(Cell("bc", "mpe-cn", "random", 1), prof, ws / "data", ws / "results")
    assert plan.run_dir == seed1 and not plan.is_done()
    assert "not this run's" in plan.final_problem()

    code, out, err = bench(monkeypatch, capsys, ws, "status")
    assert code == 0 and "done 1" in out.splitlines()[-1]
    assert any("seed1-" in x and "final.json" in x for x in err.splitlines() if x.startswith("warning: "))
    code, _, _ = bench(monkeypatch, capsys, ws, "export", "--out", str(ws / "o.csv"))
    finals = [x for x in (ws / "o.csv").read_text().splitlines() if ",final/score," in x]
    assert len(finals) == 1 and finals[0].split(",")[5] == "0"  # seed 0's score once, not twice

    code, out, err = bench(monkeypatch, capsys, ws, "all", "--profile", str(ws / "p.yaml"), "--jobs", "1",
                           "--only", "dataset=random")
    assert code == 0 and "trained 1, skipped 1 (done)" in out, out + err
    retrained = json.loads((seed1 / "final.json").read_text())
    assert retrained["seed"] == 1 and retrained["run_key"] == plan.run_key
    assert retrained["score"] == original["score"]  # resumed from seed 1's own checkpoint: same result
    assert json.loads((seed1 / "final.json.rejected").read_text())["seed"] == 0  # kept, not lost
    assert "final.json.rejected" in (seed1 / "run.log").read_text()


# ----------------------------------------------------------------------------- WEAK: --set values
@pytest.mark.parametrize("setting, field, problem", [
    ("lr=abc", "lr", "must be a number"),
    ("batch_size=1.5", "batch_size", "must be an integer"),
    ("lr=-1", "lr", "must be in (0, 1]"),
    ("lr=NaN", "lr", "must be finite"),
    ("gamma=2", "gamma", "in (0, 1]"),
    ("learning_rate=0.1", "learning_rate", "unknown config field"),
    ("batch_sise=8", "batch_sise", "did you mean 'batch_size'"),
])
def test_weak_set_values_are_typed_and_ranged(ws, monkeypatch, capsys, setting, field, problem):
    """`--set lr=abc` and friends used to end in a 40-line torch traceback and a failed run
    directory (`gamma=2` was accepted)."""
    algo = "cfcql" if field == "gamma" else "bc"
    code, _, err = bench(monkeypatch, capsys, ws, "run", "--algo", algo, "--task", "mpe-cn", "--dataset", "random",
                         "--profile", str(ws / "p.yaml"), "--set", setting, results=ws / "fresh")
    assert code == 2
    one_error_line(err, "--set", field, problem)
    assert not (ws / "fresh").exists()


# ----------------------------------------------------------------------------- WEAK: profiles
BAD_PROFILES = [
    ("missing-key", "checkpoint_every: 2}", "}", "train.checkpoint_every: required key missing"),
    ("misspelled-train-key", "eval_every: 2", "evall_every: 2", "train.evall_every: unknown key (did you mean 'eval_every'?)"),
    ("misspelled-override", "batch_size: 16", "batch_sise: 16", "algo_overrides.batch_sise: not a config field of any algorithm (did you mean 'batch_size'?)"),
    ("override-type", "batch_size: 16", "batch_size: abc", "algo_overrides.batch_size: must be an integer"),
    ("empty-yaml", None, "", "must be a mapping (the file is empty)"),
    ("eval-every-0", "eval_every: 2", "eval_every: 0", "train.eval_every: must be >= 1"),
    ("checkpoint-between-evaluations", "checkpoint_every: 2}", "checkpoint_every: {default: 2, mpe-cn: 3}}",
     "train.checkpoint_every: must be a multiple of train.eval_every for mpe-cn (3 is not a multiple of 2)"),
    ("seed-not-int", "seeds: [0, 1]", "seeds: [0, one]", "matrix.seeds[1]: must be an integer"),
    ("escaping-name", "name: faults", "name: ../../escaped", "name: must be a plain identifier"),
    ("misspelled-table-key", "updates: {default: 4}", "updates: {defualt: 4}", "train.updates.defualt: unknown task (did you mean 'default'?)"),
    ("unknown-top-key", "matrix:", "matrx:", "matrx: unknown key (did you mean 'matrix'?)"),
]


@pytest.mark.parametrize("case, old, new, message", BAD_PROFILES, ids=[c[0] for c in BAD_PROFILES])
def test_weak_bad_profiles_give_one_line_naming_file_and_field(ws, monkeypatch, capsys, case, old, new, message):
    """A missing key gave a bare 'checkpoint_every'; misspelled keys were silently ignored (the run
    used batch 1024); an empty YAML gave "'NoneType' object is not subscriptable"; eval_every 0 a
    ZeroDivisionError; `seeds: [0, one]` a ValueError traceback; `name: ../../escaped` wrote
    results outside --results-dir."""
    if old is None:
        (ws / "bad.yaml").write_text(new)
        path = str(ws / "bad.yaml")
    else:
        path = profile_with(ws, old, new)
    for cmd in (("run", *RUN), ("all", "--jobs", "1"), ("plan",)):
        code, _, err = bench(monkeypatch, capsys, ws, *cmd, "--profile", path, results=ws / "fresh")
        assert code == 2, (cmd, err)
        one_error_line(err, "bad.yaml", message)
    assert not (ws / "fresh").exists() and not (ws.parent / "escaped").exists()


def test_weak_every_shipped_profile_and_algorithm_config_passes_the_schema():
    """The schema is not stricter than what ships: every built-in profile loads and every
    algorithm x task x tier config resolves through it (a bad algorithms/configs/*.yaml value
    would fail here, naming the file)."""
    from plcql_bench.algorithms.common.configs import CONFIG_DIR, load_table
    from plcql_bench.suite.runs.profiles import builtin_profiles
    from plcql_bench.suite.envs.tasks import get_task, task_ids
    from plcql_bench.algorithms.base import all_algorithm_classes
    from plcql_bench.suite.core.validate import check_config

    for name in builtin_profiles():
        load_profile(name)
    for path in CONFIG_DIR.glob("*.yaml"):
        load_table(path.stem)
    n = 0
    for task_id in task_ids():
        spec = get_task(task_id).spec
        for cls in all_algorithm_classes():
            if getattr(cls, "discrete", None) not in (None, spec.discrete):
                continue
            for tier in spec.tiers:
                check_config(cls, cls.task_overrides(spec, tier), f"{cls.name} {task_id}/{tier}")
                check_config(cls, dataclasses.asdict(cls.Config()), f"{cls.name} defaults")
                n += 1
    assert n > 100


def test_weak_algorithm_config_table_with_a_misspelled_field_is_named(tmp_path, monkeypatch):
    from plcql_bench.algorithms.common import configs

    (tmp_path / "cfcql.yaml").write_text("source: x\ntasks:\n  mpe-cn:\n    random: {cql_alpah: 1.0}\n")
    monkeypatch.setattr(configs, "CONFIG_DIR", tmp_path)
    configs.load_table.cache_clear()
    try:
        with pytest.raises(BenchError, match=r"cfcql\.yaml: tasks\.mpe-cn\.random\.cql_alpah: not a config field "
                                             r"of any algorithm \(did you mean 'cql_alpha'\?\)"):
            configs.load_table("cfcql")
    finally:
        configs.load_table.cache_clear()


def test_committed_results_keep_their_run_keys():
    """Validation changes no valid config: every committed result re-plans (profile + algorithm
    config through the schema) to the run key it was filed under."""
    from plcql_bench.suite.runs.runner import resolve_config, run_identity
    from plcql_bench.suite.core.schema import run_key_of

    finals = sorted((Path(__file__).resolve().parent.parent / "leaderboard" / "results").rglob("final.json"))
    if not finals:
        pytest.skip("no committed results")
    for path in finals:
        rec = json.loads(path.read_text())
        prof = load_profile(rec["profile"])
        cell = Cell(rec["algo"], rec["task"], rec["dataset"], rec["seed"])
        identity = run_identity(cell, prof, resolve_config(cell, prof), rec["dataset_sha256"])
        assert run_key_of(identity) == rec["run_key"], path


# ----------------------------------------------------------------------------- WEAK: matrix flags
def test_weak_only_with_an_empty_value_and_jobs_zero_are_refused(ws, monkeypatch, capsys):
    """`--only algo=` used to select every cell; `--jobs 0` was accepted."""
    before = snapshot(ws / "results")
    code, _, err = bench(monkeypatch, capsys, ws, "all", "--profile", str(ws / "p.yaml"), "--only", "algo=")
    assert code == 2
    one_error_line(err, "--only", "algo= has no value")
    code, _, err = bench(monkeypatch, capsys, ws, "all", "--profile", str(ws / "p.yaml"), "--jobs", "0")
    assert code == 2 and "--jobs" in err and "Traceback" not in err
    assert snapshot(ws / "results") == before


# ----------------------------------------------------------------------------- WEAK: files and folders
def test_weak_directory_in_place_of_a_dataset_file(ws, monkeypatch, capsys):
    h5 = ws / "data" / "faults" / "mpe-cn" / "random.h5"
    h5.unlink()
    h5.mkdir()
    code, _, err = bench(monkeypatch, capsys, ws, "run", *RUN, "--seed", "5", "--profile", str(ws / "p.yaml"))
    assert code == 2
    one_error_line(err, "random.h5", "is a directory")
    code, out, _ = bench(monkeypatch, capsys, ws, "all", "--profile", str(ws / "p.yaml"), "--jobs", "1",
                         "--only", "dataset=random", results=ws / "r2")
    assert code == 2 and "is a directory" in out


def _deny_writes_under(monkeypatch, folder: Path) -> None:
    """A read-only folder, as a non-root user meets it (root ignores permission bits, so the
    denial is injected where the suite creates files and folders)."""
    import tempfile

    real_mkstemp, real_mkdir, real_open = tempfile.mkstemp, Path.mkdir, os.open

    def inside(p) -> bool:
        return str(Path(p).resolve()).startswith(str(folder.resolve()))

    def mkstemp(*a, dir=None, **kw):
        if dir is not None and inside(dir):
            raise PermissionError(13, "Permission denied", str(dir))
        return real_mkstemp(*a, dir=dir, **kw)

    def mkdir(self, *a, **kw):
        if inside(self) and not self.exists():
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *a, **kw)

    def os_open(path, flags, *a, **kw):
        if flags & os.O_CREAT and inside(path) and not Path(path).exists():
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(Path, "mkdir", mkdir)
    monkeypatch.setattr(os, "open", os_open)


def test_weak_read_only_results_and_export_folders(ws, monkeypatch, capsys):
    """A read-only results folder used to give tracebacks from `run` and `export --out`."""
    _deny_writes_under(monkeypatch, ws / "results")
    code, _, err = bench(monkeypatch, capsys, ws, "run", *RUN, "--seed", "5", "--profile", str(ws / "p.yaml"))
    assert code == 2
    one_error_line(err, "Permission denied", str(ws / "results"))
    code, _, err = bench(monkeypatch, capsys, ws, "export", "--out", str(ws / "results" / "o.csv"))
    assert code == 2
    one_error_line(err, "Permission denied", str(ws / "results"))


def test_weak_missing_results_dir_is_an_error_for_read_commands(ws, monkeypatch, capsys):
    """A missing --results-dir used to give `status` "0 runs", an empty CSV from `export` and a
    traceback from `leaderboard`."""
    missing = ws / "no-such-results"
    for cmd in (("status",), ("export", "--out", str(ws / "o.csv")), ("leaderboard", "--out", str(ws / "site"))):
        code, _, err = bench(monkeypatch, capsys, ws, *cmd, results=missing)
        assert code == 2, cmd
        one_error_line(err, "results directory not found", str(missing))
    assert not (ws / "o.csv").exists()


def test_weak_manifest_entry_with_only_file_and_sha(ws, monkeypatch, capsys):
    """`datasets list` used to stop with KeyError 'n_transitions'."""
    path = ws / "data" / "faults" / "manifest.json"
    doc = json.loads(path.read_text())
    doc["mpe-cn/random"] = {k: doc["mpe-cn/random"][k] for k in ("file", "sha256")}
    path.write_text(json.dumps(doc))
    code, out, err = bench(monkeypatch, capsys, ws, "datasets", "list", "--profile", str(ws / "p.yaml"))
    assert code == 0, err
    assert [x for x in err.splitlines() if x.startswith("warning: ")] == [
        f"warning: {path}: mpe-cn/random: entry lacks n_transitions, return_mean, return_std (rebuild or "
        f"re-import the dataset to record them)"]
    rows = {tuple(x.split()[:3]) for x in out.splitlines()}
    assert ("mpe-cn", "random", "incomplete") in rows and ("mpe-cn", "expert", "built") in rows


def test_weak_corrupt_dataset_under_all_exits_2_and_points_to_a_written_status(ws, monkeypatch, capsys):
    """A corrupt (truncated) dataset under `all` used to exit 1 (the docs say 2) and to point to a
    status.json that was never written."""
    h5 = ws / "data" / "faults" / "mpe-cn" / "random.h5"
    h5.write_bytes(h5.read_bytes()[: h5.stat().st_size // 2])
    code, out, err = bench(monkeypatch, capsys, ws, "all", "--profile", str(ws / "p.yaml"), "--jobs", "1",
                           results=ws / "r2")
    assert code == 2, out + err
    assert "random.h5" in out and "truncated or replaced" in out
    for status in (ws / "r2").rglob("status.json"):  # every status.json named is written
        assert json.loads(status.read_text())["status"] in ("failed", "done")
    for line in err.splitlines():
        if "(see " in line:
            assert Path(line.split("(see ")[1].rstrip(")")).is_file(), line
    assert len(list((ws / "r2").rglob("final.json"))) == 2  # the expert cells trained


# ----------------------------------------------------------------------------- WEAK: status and bench-speed
def test_weak_status_lists_a_run_whose_config_json_is_unreadable(ws, monkeypatch, capsys):
    """`status` used to drop such a run silently."""
    (run_dir(ws, 0) / "config.json").write_text("{ not json")
    code, out, err = bench(monkeypatch, capsys, ws, "status")
    assert code == 0
    assert "2 runs: done 2" in out
    warnings = [x for x in err.splitlines() if x.startswith("warning: ")]
    assert len(warnings) == 1 and "config.json" in warnings[0] and "seed0-" in warnings[0]
    code, _, _ = bench(monkeypatch, capsys, ws, "status", "--strict")
    assert code == 2


def test_weak_bench_speed_unknown_algorithm(ws, monkeypatch, capsys):
    """`bench-speed --algo nope` used to exit 0 with "no continuous-action implementation, skipped"."""
    code, _, err = bench(monkeypatch, capsys, ws, "bench-speed", "--algo", "nope")
    assert code == 2
    one_error_line(err, "--algo nope: unknown algorithm")
    code, _, err = bench(monkeypatch, capsys, ws, "bench-speed", "--algo", "plcqll", "--calibrate", "x",
                         "--out", str(ws / "c.json"))
    assert code == 2 and "did you mean 'plcql'" in err and not (ws / "c.json").exists()


# ----------------------------------------------------------------------------- WEAK: interruption, checkpoints
def test_weak_interrupted_run_records_the_round_it_reached(ws, monkeypatch, capsys):
    """After Ctrl-C, `status` used to show 0/N and runtime "-" although the checkpoint was at a
    later round."""
    cls = runner.get_algorithm("bc")
    real_update, calls = cls.update, {"n": 0}

    def interrupt_at_round_3(self, sample):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_update(self, sample)

    monkeypatch.setattr(cls, "update", interrupt_at_round_3)
    code, _, _ = bench(monkeypatch, capsys, ws, "run", *RUN, "--seed", "5", "--profile", str(ws / "p.yaml"))
    assert code == 130
    status = json.loads((run_dir(ws, 5) / "status.json").read_text())
    assert status["status"] == "interrupted" and status["update"] == 2 and status["reached"] == 2
    assert status["runtime_s"] > 0
    code, out, _ = bench(monkeypatch, capsys, ws, "status", "--state", "partial")
    (row,) = [x for x in out.splitlines() if x.startswith("faults")]
    assert " 2/4 " in row and "interrupted at update 2" in row and row.split()[7] != "-"


def test_weak_discarded_checkpoint_is_logged(ws, monkeypatch, capsys):
    """An unreadable ckpt.pt was set aside without a word in run.log."""
    prof = load_profile(str(ws / "p.yaml"))
    plan = plan_run(Cell("bc", "mpe-cn", "expert", 0), prof, ws / "data", ws / "results")
    plan.run_dir.mkdir(parents=True)
    (plan.run_dir / "ckpt.pt").write_bytes(b"not a checkpoint")
    code, _, _ = bench(monkeypatch, capsys, ws, "run", "--algo", "bc", "--task", "mpe-cn", "--dataset", "expert",
                       "--profile", str(ws / "p.yaml"))
    assert code == 0
    log = (plan.run_dir / "run.log").read_text()
    assert "discarded unreadable checkpoint" in log and "ckpt.pt.unreadable" in log
    assert (plan.run_dir / "ckpt.pt.unreadable").read_bytes() == b"not a checkpoint"


def test_weak_liveness_probe_cannot_drop_a_starting_run(ws, monkeypatch):
    """`status`/`plan`/`all` probe a run's lock; a trainer starting during the probe used to print
    "busy, skipped". The probe here is held 20x longer than a real one (milliseconds)."""
    from plcql_bench.suite.runs.matrix import LOCK_NAME, lock_held

    prof = load_profile(str(ws / "p.yaml"))
    plan = plan_run(Cell("bc", "mpe-cn", "expert", 1), prof, ws / "data", ws / "results")
    plan.run_dir.mkdir(parents=True)
    lock = plan.run_dir / LOCK_NAME
    lock.touch()
    held = threading.Event()

    def probe_held_for_a_while():
        fd = os.open(lock, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_SH)
        held.set()
        time.sleep(0.3)
        os.close(fd)

    t = threading.Thread(target=probe_held_for_a_while)
    t.start()
    held.wait()
    result = execute(plan, log=lambda *_: None)  # waits out the probe instead of raising RunBusy
    t.join()
    assert result["seed"] == 1 and plan.is_done()
    assert not lock_held(plan.run_dir)

    # A real trainer (the lock held throughout) is still reported busy, after the grace period.
    monkeypatch.setattr(runner, "LOCK_GRACE_S", 0.2)
    other = plan_run(Cell("bc", "mpe-cn", "expert", 0), prof, ws / "data", ws / "results")
    other.run_dir.mkdir(parents=True)
    fd = os.open(other.run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert lock_held(other.run_dir)
        with pytest.raises(RunBusy):
            execute(other, log=lambda *_: None)
    finally:
        os.close(fd)

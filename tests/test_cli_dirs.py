"""CLI consistency: one spelling of the data and results folders, before or after the subcommand; the
commands that read them say which folder they read; the files the suite writes are as readable as the
umask allows (not mkstemp's private 0600); the README's counts are `plan`'s."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from lb_fixtures import write_run
from plcql_bench.suite.core.store import atomic_write_bytes, current_umask
from cli_main import run_cli

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def results(tmp_path):
    res = tmp_path / "res"
    write_run(res, "bc", "mpe-cn", "expert", 0, 10.0)
    return res


def test_results_dir_before_or_after_the_subcommand(results, tmp_path, monkeypatch, capsys):
    out = tmp_path / "x.csv"
    for args in (["--results-dir", str(results), "export", "--out", str(out)],
                 ["export", "--results-dir", str(results), "--out", str(out)],
                 ["--results-dir", str(tmp_path / "nowhere"), "export", "--results-dir", str(results), "--out", str(out)]):
        code, stdout, err = run_cli(monkeypatch, capsys, *args)
        assert code == 0, err
        assert f"from {results} -> {out}" in stdout  # says which folder it read
    code, _, err = run_cli(monkeypatch, capsys, "export", "--results-dir", str(tmp_path / "nowhere"), "--out", str(out))
    assert code == 2 and f"results directory not found: {tmp_path / 'nowhere'}" in err
    code, stdout, err = run_cli(monkeypatch, capsys, "status", "--results-dir", str(results))
    assert code == 0 and "1 runs: done 1" in stdout, err


def test_leaderboard_takes_results_dir_and_its_old_results_alias(results, tmp_path, monkeypatch, capsys):
    for i, args in enumerate((["--results-dir", str(results), "leaderboard"], ["leaderboard", "--results-dir", str(results)],
                              ["leaderboard", "--results", str(results)])):
        code, stdout, err = run_cli(monkeypatch, capsys, *args, "--out", str(tmp_path / f"site{i}"))
        assert code == 0, err
        assert f"(1 runs from {results})" in stdout


def test_every_command_takes_the_folders_after_its_name():
    from plcql_bench.suite.commands.main import cli

    def leaves(group, path=()):
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                yield from leaves(cmd, path + (name,))
            else:
                yield " ".join(path + (name,)), cmd

    for name, cmd in leaves(cli):
        flags = {opt for p in cmd.params for opt in getattr(p, "opts", ())}
        assert {"--data-dir", "--results-dir"} <= flags, name


def test_datasets_list_says_which_folder_it_read(tmp_path, monkeypatch, capsys):
    code, stdout, err = run_cli(monkeypatch, capsys, "datasets", "list", "--profile", "smoke",
                                "--data-dir", str(tmp_path))
    assert code == 0, err
    assert stdout.splitlines()[-1] == f"0 of 32 datasets built in {tmp_path / 'smoke'} (profile smoke)"


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_written_files_follow_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        assert current_umask() == mask
        atomic_write_bytes(tmp_path / "f.json", b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f.json").stat().st_mode) == 0o666 & ~mask


def test_an_export_is_readable_by_group_and_others(results, tmp_path, monkeypatch, capsys):
    old = os.umask(0o022)
    try:
        for fmt in ("csv", "marl-eval"):
            out = tmp_path / f"export.{fmt}"
            code, _, err = run_cli(monkeypatch, capsys, "export", "--results-dir", str(results), "--format", fmt,
                                   "--out", str(out))
            assert code == 0, err
            assert stat.S_IMODE(out.stat().st_mode) == 0o644, fmt
    finally:
        os.umask(old)


def test_readme_counts_are_plans():
    """The README's numbers of cells, runs and datasets are what `plan` and `datasets list` count."""
    from plcql_bench.suite.runs.matrix import matrix_datasets, select_cells
    from plcql_bench.suite.runs.profiles import load_profile
    from plcql_bench.suite.envs.tasks import get_task, task_ids

    readme = ROOT.joinpath("README.md").read_text(encoding="utf-8")
    paper = re.search(r"`paper` matrix's remaining cells\s+\(([\d,]+) in all\)", readme)
    assert paper and int(paper.group(1).replace(",", "")) == len(select_cells(load_profile("paper")))
    smoke = re.search(r"2 seeds: (\d+) runs", readme)
    assert smoke and int(smoke.group(1)) == len(select_cells(load_profile("smoke")))
    listed = re.search(r"datasets list --profile smoke +# all (\d+) task x tier", readme)
    assert listed and int(listed.group(1)) == sum(len(get_task(t).spec.tiers) for t in task_ids())
    combos = re.search(r"its (\d+) task/dataset combinations", readme)
    assert combos and int(combos.group(1)) == len(matrix_datasets(load_profile("paper")))

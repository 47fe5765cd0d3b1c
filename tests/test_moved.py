"""Every import path a module had before it moved (suite/_root/moved.py) still imports it: the same module
object, which keeps its own name and spec."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from plcql_bench.moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_imports_the_moved_module(old):
    module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    assert module.__name__ == module.__spec__.name == MOVED[old]
    parent, _, leaf = old.rpartition(".")
    assert getattr(importlib.import_module(parent), leaf) is module  # `from parent import leaf`


def test_python_m_runs_a_moved_module_under_its_old_name(tmp_path):
    """`python -m OLD` runs the moved module's code (here: one that only defines names, so it exits 0)."""
    old = sorted(MOVED)[0]
    out = subprocess.run([sys.executable, "-c", f"import plcql_bench, runpy; runpy.run_module({old!r}, "
                          "run_name='not_main'); print('ran')"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ran", out.stderr


def test_python_m_runs_the_cli_under_its_old_name():
    """`python -m plcql_bench.suite.cli` (the CLI module before suite/ was split by layer) still runs it."""
    out = subprocess.run([sys.executable, "-m", "plcql_bench.suite.cli", "--help"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and "Usage:" in out.stdout, out.stderr


def test_unknown_names_are_not_aliased():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("plcql_bench.algorithms.common.no_such_module")


def test_an_old_folder_left_behind_does_not_shadow_the_alias(tmp_path):
    """After a `git pull` across the move, an old module's folder can survive with only its __pycache__ (e.g.
    suite/profiles/): the old path must still import the moved module, not an empty namespace package."""
    old = "plcql_bench.suite.profiles"
    stale = tmp_path / "suite"
    (stale / "profiles" / "__pycache__").mkdir(parents=True)
    code = (f"import importlib, plcql_bench.suite as s; s.__path__.append({str(stale)!r}); "
            f"m = importlib.import_module({old!r}); print(m.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == MOVED[old], out.stderr

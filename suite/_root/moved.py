"""Import paths that moved: an old module name imports the module that holds its code now, as the same
module object (one set of globals: a monkeypatch or a registry seen through either name is one), so
users' imports, `python -m` lines and anything pickled under an old path keep working. Installed by the
package's __init__; tests/test_moved.py imports every old name."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

# old import name -> the module that holds its code now
MOVED = {
    "plcql_bench.algorithms.common.protocol": "plcql_bench.algorithms.common.checkpoint",
    # suite/ by layer (envs/, runs/, commands/), every click command under commands/ (issue 56)
    "plcql_bench.suite.tasks": "plcql_bench.suite.envs.tasks",
    "plcql_bench.suite.protocol": "plcql_bench.suite.envs.protocol",
    "plcql_bench.suite.api": "plcql_bench.suite.runs.api",
    "plcql_bench.suite.calibration": "plcql_bench.suite.runs.calibration",
    "plcql_bench.suite.campaign": "plcql_bench.suite.runs.campaign",
    "plcql_bench.suite.executors": "plcql_bench.suite.runs.executors",
    "plcql_bench.suite.export": "plcql_bench.suite.runs.export",
    "plcql_bench.suite.matrix": "plcql_bench.suite.runs.matrix",
    "plcql_bench.suite.preflight": "plcql_bench.suite.runs.preflight",
    "plcql_bench.suite.reference_score": "plcql_bench.suite.runs.reference_score",
    "plcql_bench.suite.reference_speed": "plcql_bench.suite.runs.reference_speed",
    "plcql_bench.suite.regress": "plcql_bench.suite.runs.regress",
    "plcql_bench.suite.runner": "plcql_bench.suite.runs.runner",
    "plcql_bench.suite.stacking": "plcql_bench.suite.runs.stacking",
    "plcql_bench.suite.tracking": "plcql_bench.suite.runs.tracking",
    "plcql_bench.suite.versions": "plcql_bench.suite.runs.versions",
    "plcql_bench.suite.profiles": "plcql_bench.suite.runs.profiles",
    "plcql_bench.suite.cli": "plcql_bench.suite.commands.main",
    "plcql_bench.suite.clitypes": "plcql_bench.suite.commands.clitypes",
    "plcql_bench.datasets.cli": "plcql_bench.suite.commands.datasets",
    "plcql_bench.algorithms.cli": "plcql_bench.suite.commands.bench",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name not in MOVED:
            return None
        real = importlib.util.find_spec(MOVED[name])  # its file: `python -m OLD` sets sys.argv[0] to it
        return importlib.util.spec_from_loader(name, self, origin=real.origin if real else None)

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # the import system sets the alias's spec on the module ...
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = module.__spec__.loader_state  # ... which gets its own back here

    def get_code(self, name: str):
        """`python -m <old name>` runs the moved module's code."""
        real = importlib.util.find_spec(MOVED[name])
        return real.loader.get_code(real.name)


def install() -> None:
    # First in line: after a `git pull` across the move, an old folder left behind by its __pycache__ (e.g.
    # suite/profiles/) would otherwise be found first, as an empty namespace package.
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())

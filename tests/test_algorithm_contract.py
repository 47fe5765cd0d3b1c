"""The algorithm contract (algorithms/base.py: Algorithm) declares every member the runner, the stacked
runner and the evaluation read off an algorithm, each with a default; they read nothing else and probe
nothing with hasattr/getattr."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from plcql_bench.algorithms.base import Algorithm, all_algorithm_classes, register
from plcql_bench.algorithms.common.checkpoint import Checkpointable

ROOT = Path(__file__).resolve().parent.parent
# The modules that drive algorithms, and the names an algorithm object or class has there.
DRIVERS = ("suite/runs/runner.py", "suite/runs/stacking.py")
ALGO_NAMES = {"algo", "cls"}


def _is_algo(node: ast.AST) -> bool:
    """`algo`, `cls`, or `<something>.algo` (the stacked runner's `r.algo`)."""
    return (isinstance(node, ast.Name) and node.id in ALGO_NAMES) or (
        isinstance(node, ast.Attribute) and node.attr == "algo")


def members_read(path: Path) -> dict[str, int]:
    """Attribute name -> first line, for every attribute read off an algorithm in the file."""
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and _is_algo(node.value):
            out.setdefault(node.attr, node.lineno)
    return out


def probes(path: Path) -> list[int]:
    """Lines of hasattr/getattr calls on an algorithm."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("hasattr", "getattr") and node.args and _is_algo(node.args[0])]


def test_the_runner_reads_only_what_the_contract_declares():
    declared = set(dir(Algorithm)) | set(Algorithm.__annotations__)
    read = {(driver, name): line for driver in DRIVERS for name, line in members_read(ROOT / driver).items()}
    assert {"update", "act", "diagnostics", "run_warnings"} <= {name for _, name in read}, read
    undeclared = {f"{driver}:{line}": name for (driver, name), line in read.items() if name not in declared}
    assert not undeclared, f"members read that Algorithm does not declare: {undeclared}"
    probing = {driver: probes(ROOT / driver) for driver in DRIVERS if probes(ROOT / driver)}
    assert not probing, f"hasattr/getattr on an algorithm at {probing}"


def test_the_reader_sees_a_probe(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("def f(r, cls):\n    if hasattr(r.algo, 'extra'):\n        return cls.nonsense\n")
    assert probes(src) == [2] and members_read(src) == {"nonsense": 3}


class _Minimal(Checkpointable):
    """Only the required members."""

    name = "minimal-contract-test"

    def __init__(self, spec=None, config=None, seed=0, device="cpu") -> None:
        self.rounds = 0

    def modules(self):
        return {}


def test_optional_hooks_have_defaults():
    algo = _Minimal()
    assert _Minimal.task_overrides(None, "expert") == {}
    assert algo.diagnostics(object()) == {}
    assert algo.run_warnings([{"update": 1}]) == ([], {})
    assert algo.begin_episodes(4) is None
    with algo.evaluating():  # the evaluation's context (runner.evaluate_policy): nothing by default
        pass
    assert (algo.batch_kind, algo.reward, algo.variant_of, algo.sweep, algo.legacy_keys) == (
        "transitions", "team", None, {}, {})
    assert tuple(algo.reseeded_generators) == ()
    algo.load_state_dict(algo.state_dict())
    assert list(algo.reseeded_generators) == []


def test_every_registered_algorithm_is_under_the_contract():
    for cls in all_algorithm_classes():
        assert issubclass(cls, Algorithm), cls


def test_register_refuses_a_class_outside_the_contract():
    class Loose:
        name = "loose"

    with pytest.raises(TypeError, match="does not derive from algorithms.base.Algorithm"):
        register(Loose)

"""The package layers import downward only (docs/architecture.md):

    core (suite/core) <- envs (suite/envs, suite/tasks.py, suite/protocol.py) <- datasets <- algorithms
        <- runner (the rest of suite/) <- leaderboard <- CLI (suite/cli.py, datasets/cli.py, algorithms/cli.py)

Every import of one of our modules counts, also one inside a function: a lazy import is still a
dependency. A module may import its own layer or any layer below it; no module may import a layer
above it, so no cycle can run between layers. Module-level imports form no cycle at all (within a
layer either). The graph is read from the sources (ast), so the test needs none of the optional
environment stacks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# import name -> folder (pyproject's package-dir)
PACKAGES = {"plcql_bench": ROOT / "suite" / "_root", "plcql_bench.suite": ROOT / "suite",
            "plcql_bench.algorithms": ROOT / "algorithms", "plcql_bench.datasets": ROOT / "datasets",
            "plcql_bench.leaderboard": ROOT / "leaderboard"}

# Lowest first. A module belongs to the layer of the longest prefix that names it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("plcql_bench", "plcql_bench.suite.core")),
    ("envs", ("plcql_bench.suite.envs", "plcql_bench.suite.tasks", "plcql_bench.suite.protocol")),
    ("datasets", ("plcql_bench.datasets",)),
    ("algorithms", ("plcql_bench.algorithms",)),
    ("runner", ("plcql_bench.suite",)),
    ("leaderboard", ("plcql_bench.leaderboard",)),
    ("cli", ("plcql_bench.suite.cli", "plcql_bench.datasets.cli", "plcql_bench.algorithms.cli")),
]
# Package __init__ files that only name their package (a docstring); importing a submodule runs them.
DOC_ONLY = ("plcql_bench.suite", "plcql_bench.algorithms", "plcql_bench.datasets", "plcql_bench.leaderboard")


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    assert best is not None, f"{module}: in no layer (add it to LAYERS)"
    return best


def modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            if pkg != "plcql_bench" and rel.parts[0] == "_root":
                continue
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join((pkg, *parts))] = path
    return out


MODULES = modules()


def imports(module: str, path: Path) -> list[tuple[str, int, bool]]:
    """(imported module of ours, line, at module level) for every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top_level = {id(n) for n in tree.body} | {id(n) for s in tree.body if isinstance(s, (ast.If, ast.Try))
                                              for n in ast.walk(s)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            # `from pkg import mod` imports the submodule; `from mod import name` the module
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]  # `import a.b.c` of ours names module a.b.c
            if name and name != module and name.startswith("plcql_bench"):
                out.append((name, node.lineno, id(node) in top_level))
    return out


GRAPH = {m: imports(m, p) for m, p in MODULES.items()}


def test_every_module_has_a_layer():
    for m in MODULES:
        layer_of(m)


def test_imports_go_downward_only():
    upward = []
    for m, edges in GRAPH.items():
        for target, line, _ in edges:
            if layer_of(target) > layer_of(m):
                upward.append(f"{MODULES[m].relative_to(ROOT)}:{line}: {m} ({LAYERS[layer_of(m)][0]}) imports "
                              f"{target} ({LAYERS[layer_of(target)][0]})")
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_package_inits_import_nothing_of_ours():
    for pkg in DOC_ONLY:
        assert GRAPH[pkg] == [], pkg


def test_module_level_imports_have_no_cycle():
    graph = {m: {t for t, _, top in edges if top} for m, edges in GRAPH.items()}
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                pytest.fail("module-level import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t, stack + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_the_checker_sees_an_upward_import(tmp_path):
    """The graph reader finds lazy and relative imports (a checker that reads nothing passes anything)."""
    src = tmp_path / "x.py"
    src.write_text("from . import runner\n\ndef f():\n    from plcql_bench.leaderboard import build\n")
    found = imports("plcql_bench.suite.x", src)
    assert ("plcql_bench.suite.runner", 1, True) in found
    assert ("plcql_bench.leaderboard.build", 4, False) in found
    assert layer_of("plcql_bench.leaderboard.build") > layer_of("plcql_bench.suite.runner") > layer_of(
        "plcql_bench.algorithms.cfcql") > layer_of("plcql_bench.datasets.format") > layer_of(
        "plcql_bench.suite.envs.mpe") > layer_of("plcql_bench.suite.core.spec")

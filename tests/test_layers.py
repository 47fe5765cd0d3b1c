"""The package layers import downward only (docs/architecture.md):

    core (suite/core) <- envs (suite/envs) <- datasets <- algorithms <- runner (suite/runs) <- leaderboard
        <- CLI (suite/commands)

Inside suite/ each of its four layers is one folder, and every click command is in the CLI's.

Every import of one of our modules counts, also one inside a function: a lazy import is still a
dependency. A module may import its own layer or any layer below it; no module may import a layer
above it, so no cycle can run between layers. The imports form no cycle at all (within a layer either,
those inside functions included). An import inside a function is only for a heavy or optional
third-party package, each named in LAZY with its reason: never one of our modules (it would hide a
dependency) nor the standard library. The graph is read from the sources (ast), so the test needs none
of the optional environment stacks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# import name -> folder (pyproject's package-dir)
PACKAGES = {"plcql_bench": ROOT / "suite" / "_root", "plcql_bench.suite": ROOT / "suite",
            "plcql_bench.algorithms": ROOT / "algorithms", "plcql_bench.datasets": ROOT / "datasets",
            "plcql_bench.leaderboard": ROOT / "leaderboard"}

# Lowest first. A module belongs to the layer of the longest prefix that names it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("plcql_bench", "plcql_bench.suite.core")),
    ("envs", ("plcql_bench.suite.envs",)),
    ("datasets", ("plcql_bench.datasets",)),
    ("algorithms", ("plcql_bench.algorithms",)),
    ("runner", ("plcql_bench.suite.runs",)),
    ("leaderboard", ("plcql_bench.leaderboard",)),
    ("cli", ("plcql_bench.suite.commands",)),
]
SUITE_LAYERS = ("core", "envs", "runs", "commands")  # suite/'s folders, one per layer, in order
# The only packages imported inside a function (longest dotted prefix wins), and why.
LAZY = {
    "torch": "heavy (about 1.5 s): datasets/ and suite/ modules that use it in one function stay light without it",
    "torch.utils.tensorboard": "optional extra [tensorboard]",
    "jax": "optional extra [smax]", "jaxmarl": "optional extra [smax]", "optax": "optional extra [smax]",
    "mpe2": "optional extra [mpe]",
    "gymnasium_robotics": "optional extra [mamujoco]", "mujoco": "optional extra [mamujoco]",
    "smac": "optional: SMAC on StarCraft II, installed by hand (docs/smax.md)",
    "ray": "optional extra [ray]", "pyarrow": "optional extra [export]", "flashbax": "optional extra [vault]",
    "wandb": "optional extra [wandb]",
    "pandas": "heavy: only the Python API's results_frame builds a DataFrame",
    "scipy": "heavy: only the leaderboard's statistical tests", "rliable": "heavy: only the leaderboard's intervals",
    "resource": "Unix only: datasets/format.py reads the memory limit where the module exists",
    "utils": "the official code's own module (suite/runs/reference_score.py), on sys.path only while it runs",
}
# Package __init__ files that only name their package (a docstring); importing a submodule runs them.
DOC_ONLY = ("plcql_bench.suite", "plcql_bench.suite.core", "plcql_bench.suite.envs", "plcql_bench.suite.runs",
            "plcql_bench.suite.commands", "plcql_bench.algorithms", "plcql_bench.datasets", "plcql_bench.leaderboard")


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


def test_suite_folders_are_its_layers_in_order():
    """Drawn by folder, suite/ is its four layers, each a folder of its own (no module left beside them), and
    their order is the layers' order."""
    loose = [m for m in MODULES if m.startswith("plcql_bench.suite.") and m.split(".")[2] not in SUITE_LAYERS]
    assert not loose, f"modules of suite/ in no layer folder: {loose}"
    order = [layer_of(f"plcql_bench.suite.{folder}") for folder in SUITE_LAYERS]
    assert order == sorted(order) and len(set(order)) == len(order)


def click_commands(path: Path) -> list[int]:
    """Lines of the click commands and groups a file defines (decorated with click.command/group or
    <group>.command/group)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                f = d.func if isinstance(d, ast.Call) else d
                if isinstance(f, ast.Attribute) and f.attr in ("command", "group"):
                    out.append(node.lineno)
    return out


def test_every_click_command_is_in_the_cli_layer():
    outside = [f"{path.relative_to(ROOT)}:{line}" for m, path in MODULES.items()
               if not m.startswith("plcql_bench.suite.commands") for line in click_commands(path)]
    assert not outside, "click commands outside suite/commands/: " + ", ".join(outside)
    assert click_commands(MODULES["plcql_bench.suite.commands.campaign"])  # the reader finds them


def test_package_inits_import_nothing_of_ours():
    for pkg in DOC_ONLY:
        assert GRAPH[pkg] == [], pkg


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph (module -> modules it imports), or None."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(m: str, stack: list[str]) -> list[str] | None:
        state[m] = 1
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state and (cycle := visit(t, stack + [t])):
                return cycle
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m, [m])):
            return cycle
    return None


def test_imports_have_no_cycle():
    """Over every import, those inside functions too: a cycle closed by a lazy import is still a cycle."""
    cycle = find_cycle({m: {t for t, _, _ in edges} for m, edges in GRAPH.items()})
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_sees_a_cycle_through_a_function(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from plcql_bench.datasets import build\n")
    b.write_text("def f():\n    from plcql_bench.datasets import matd3\n")
    graph = {"plcql_bench.datasets.matd3": {t for t, _, _ in imports("plcql_bench.datasets.matd3", a)},
             "plcql_bench.datasets.build": {t for t, _, _ in imports("plcql_bench.datasets.build", b)}}
    assert find_cycle(graph) == ["plcql_bench.datasets.build", "plcql_bench.datasets.matd3",
                                 "plcql_bench.datasets.build"]
    assert find_cycle({"x": {"y"}, "y": set()}) is None


def lazy_imports(path: Path) -> list[tuple[str, int]]:
    """(module named, line) for every import inside a function or class body of the file."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(n) for n in tree.body} | {id(n) for s in tree.body if isinstance(s, (ast.If, ast.Try))
                                        for n in ast.walk(s)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
            if isinstance(node, ast.ImportFrom):
                out.append(("." * node.level + (node.module or ""), node.lineno))
            else:
                out.extend((a.name, node.lineno) for a in node.names)
    return out


def lazy_reason(name: str) -> str | None:
    keys = [k for k in LAZY if name == k or name.startswith(k + ".")]
    return LAZY[max(keys, key=len)] if keys else None


def test_imports_inside_functions_are_heavy_or_optional_packages_only():
    bad = [f"{path.relative_to(ROOT)}:{line}: {name}" for path in MODULES.values()
           for name, line in lazy_imports(path) if lazy_reason(name) is None]
    assert not bad, ("imports inside functions (move them to the top of the module, or name a heavy or optional "
                     "package in LAZY with its reason):\n" + "\n".join(bad))


def test_the_lazy_checker_sees_lazy_imports(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("import json\n\ndef f():\n    import jax\n    from plcql_bench.suite.runs import runner\n"
                   "    from . import tasks\n    import os.path\n")
    found = lazy_imports(src)
    assert found == [("jax", 4), ("plcql_bench.suite.runs", 5), (".", 6), ("os.path", 7)]
    assert [lazy_reason(n) is not None for n, _ in found] == [True, False, False, False]
    assert lazy_reason("torch.utils.tensorboard") == LAZY["torch.utils.tensorboard"]


def test_the_checker_sees_an_upward_import(tmp_path):
    """The graph reader finds lazy and relative imports (a checker that reads nothing passes anything)."""
    src = tmp_path / "x.py"
    src.write_text("from . import runner\n\ndef f():\n    from plcql_bench.leaderboard import build\n")
    found = imports("plcql_bench.suite.runs.x", src)
    assert ("plcql_bench.suite.runs.runner", 1, True) in found
    assert ("plcql_bench.leaderboard.build", 4, False) in found
    assert layer_of("plcql_bench.leaderboard.build") > layer_of("plcql_bench.suite.runs.runner") > layer_of(
        "plcql_bench.algorithms.cfcql") > layer_of("plcql_bench.datasets.format") > layer_of(
        "plcql_bench.suite.envs.mpe") > layer_of("plcql_bench.suite.core.spec")

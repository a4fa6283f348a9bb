"""The strategy package's import graph: its subpackages are layers, solver <- rules <-
selection <- programs, each importing only the layers below it, and no module imports
another in a circle; imports inside functions count as much as those at the top.

The graph is read from the source with ``ast`` (every ``import`` at any depth), so an
import hidden in a function to break a circle at run time is still seen here.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYERS = ("solver", "rules", "selection", "programs")  # each may import those before it


def _module_name(path: pathlib.Path, root: pathlib.Path, package: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([package, *parts])


def import_graph(root: pathlib.Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (at any depth of its code).

    ``from X import name`` counts as an import of ``X.name`` where that is a module, else
    of ``X``; relative imports are resolved against the importing module's package.
    """
    paths = {_module_name(p, root, package): p for p in sorted(root.rglob("*.py"))}

    def known(name: str) -> str:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in paths.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        out = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                if base != package and not base.startswith(package + "."):
                    continue
                for alias in node.names:
                    whole = f"{base}.{alias.name}"
                    out.add(whole if whole in paths else known(base))
            elif isinstance(node, ast.Import):
                out |= {known(a.name) for a in node.names if a.name.startswith(package + ".")}
        graph[name] = out - {name, ""}
    return graph


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt)
            if found:
                return found
        path.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        found = visit(node)
        if found:
            return found
    return None


def subpackage_graph(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The graph between the direct subpackages of ``package`` (its own ``__init__`` and
    top-level modules left out)."""

    def sub(name: str) -> str | None:
        rest = name[len(package) + 1 :].split(".") if name.startswith(package + ".") else []
        return rest[0] if len(rest) > 1 or (rest and not rest[0].startswith("_")) else None

    out: dict[str, set[str]] = {}
    for name, targets in graph.items():
        a = sub(name)
        if a is not None:
            out.setdefault(a, set())
            out[a] |= {b for b in map(sub, targets) if b is not None and b != a}
    return out


@pytest.fixture(scope="module")
def strategy_graph():
    return import_graph(ROOT / "strategy", "meshplan.strategy")


def test_the_strategy_subpackages_are_the_layers(strategy_graph):
    subs = subpackage_graph(strategy_graph, "meshplan.strategy")
    assert set(subs) == set(LAYERS)
    for layer, targets in subs.items():
        below = set(LAYERS[: LAYERS.index(layer)])
        assert targets <= below, f"{layer} imports {sorted(targets - below)}, not below it"


def test_no_subpackage_reaches_back_into_the_package_facade(strategy_graph):
    # meshplan.strategy's __init__ imports every layer: a layer importing it is upward
    bad = {m: t for m, t in strategy_graph.items() if "meshplan.strategy" in t}
    assert bad == {}


def test_the_strategy_modules_import_each_other_without_a_circle(strategy_graph):
    assert circle(strategy_graph) is None


def test_the_strategy_subpackages_import_each_other_without_a_circle(strategy_graph):
    assert circle(subpackage_graph(strategy_graph, "meshplan.strategy")) is None


def test_the_guard_sees_a_circle_closed_inside_a_function(tmp_path):
    # a circle between two subpackages, one side an import inside a function
    for sub in ("low", "high"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "__init__.py").write_text('"""."""\n')
    (tmp_path / "low" / "_a.py").write_text("def f():\n    from ..high._b import g\n")
    (tmp_path / "high" / "_b.py").write_text("from ..low._a import f\n\n\ndef g():\n    pass\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.low._a"] == {"pkg.high._b"}
    assert circle(graph) == ["pkg.high._b", "pkg.low._a", "pkg.high._b"]
    assert subpackage_graph(graph, "pkg") == {"low": {"high"}, "high": {"low"}}
    assert circle(subpackage_graph(graph, "pkg")) == ["high", "low", "high"]


def test_the_guard_resolves_absolute_and_package_imports(tmp_path):
    (tmp_path / "low").mkdir()
    (tmp_path / "low" / "__init__.py").write_text("from . import _a\n")
    (tmp_path / "low" / "_a.py").write_text("import pkg.low\nfrom pkg.low._a import x\nx = 1\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {"pkg.low": {"pkg.low._a"}, "pkg.low._a": {"pkg.low"}}
    assert circle(graph) == ["pkg.low", "pkg.low._a", "pkg.low"]


def _absolute_imports(path: pathlib.Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_the_runtime_reads_nothing_of_the_rule_files():
    # a program's ops carry what each rank runs (ProgramOp.local, a LocalCall)
    reads = {
        p.name: sorted(m for m in _absolute_imports(p) if m.startswith("meshplan.strategy.rules"))
        for p in sorted((ROOT / "runtime").glob("*.py"))
    }
    assert {name: mods for name, mods in reads.items() if mods} == {}


def test_the_rule_file_guard_sees_a_rule_import_inside_a_function(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from meshplan.strategy.rules._aten import SIZE_ARGS\n")
    assert "meshplan.strategy.rules._aten" in _absolute_imports(bad)

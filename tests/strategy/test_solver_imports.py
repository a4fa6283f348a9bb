"""The solver package is pure: it imports nothing of meshplan outside itself (nor torch),
also counting imports inside functions, and no module of it imports another in a circle."""

import ast
import pathlib
import subprocess
import sys
import textwrap

SOLVER = pathlib.Path(__file__).resolve().parents[2] / "strategy" / "solver"


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """Every import in the module, at any depth: (level, module) pairs."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or ""))
        elif isinstance(node, ast.Import):
            out.extend((0, a.name) for a in node.names)
    return out


def _outside(path: pathlib.Path) -> list[str]:
    """The imports of ``path`` reaching past the solver package (relative or absolute)."""
    bad = []
    for level, module in _imports(path):
        if level > 1 or (level == 0 and module.split(".")[0] in ("meshplan", "torch")):
            bad.append(("." * level) + module)
    return bad


def test_the_solver_imports_nothing_of_meshplan_outside_itself():
    modules = sorted(SOLVER.glob("*.py"))
    assert len(modules) >= 8
    assert {m.name: _outside(m) for m in modules if _outside(m)} == {}


def test_the_guard_sees_an_import_inside_a_function(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from ..placement import Spec\n    import meshplan.errors\n")
    assert _outside(bad) == ["..placement", "meshplan.errors"]


def test_the_solver_modules_import_each_other_without_a_circle():
    graph = {}
    for m in SOLVER.glob("*.py"):
        graph[m.stem] = {mod.split(".")[0] for level, mod in _imports(m) if level == 1 and mod} - {
            m.stem
        }
    done = set()

    def visit(node, path):
        assert node not in path, f"import circle: {' -> '.join([*path, node])}"
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, [*path, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])


def test_the_solver_solves_with_torch_blocked():
    code = """
        import sys
        sys.modules["torch"] = None  # any import of torch now fails
        import meshplan.strategy.solver as solver
        p = solver.Problem([[1.0, 0.0], [0.0, 3.0]], {(0, 1): [[0, 5], [5, 0]]})
        s = solver.solve(p)
        print(s.cost, s.method.value)
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1.0", "exact"]

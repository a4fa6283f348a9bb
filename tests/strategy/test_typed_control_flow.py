"""Control flow in strategy/ reads typed values, not display text: no comparison of a
``method`` (a program's or a solution's words) with a string; ``Program.exact`` is the
typed fact the planner branches on."""

import ast
import pathlib

import attrs

from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec
from meshplan.strategy import plan_program

STRATEGY = pathlib.Path(__file__).resolve().parents[2] / "strategy"


def string_comparisons(path: pathlib.Path, names: set[str]) -> list[str]:
    """``path``'s comparisons of a name or attribute in ``names`` with a string."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if not any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides):
            continue
        for s in sides:
            name = s.attr if isinstance(s, ast.Attribute) else getattr(s, "id", None)
            if name in names:
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_method_is_compared_with_its_display_text():
    found = [f for p in sorted(STRATEGY.rglob("*.py")) for f in string_comparisons(p, {"method"})]
    assert found == []


def test_no_tag_is_compared_with_a_string():
    # nodes' kinds and phases, torch constants' kinds and draws' kinds are enums
    tags = {"kind", "phase", "how"}
    found = [f for p in sorted(STRATEGY.rglob("*.py")) for f in string_comparisons(p, tags)]
    assert found == []


def test_tags_given_as_strings_become_their_enums():
    from meshplan.strategy.programs._graph import ConstKind, Kind, Node, Phase, TorchConst

    node = Node("call", "mm", (), phase="backward")
    assert node.kind is Kind.CALL and node.phase is Phase.BACKWARD
    assert node == Node(Kind.CALL, "mm", (), phase=Phase.BACKWARD)
    assert TorchConst("device", "cpu").kind is ConstKind.DEVICE


def test_the_guard_sees_a_display_text_comparison(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('def f(p, method):\n    return p.method == "exact" or "op by op" != method\n')
    assert len(string_comparisons(bad, {"method"})) == 2


def test_the_planner_branches_on_exact_not_on_the_method_text():
    mesh = Mesh.create((2,))
    x = Spec(mesh, [Shard(0)], (8, 4), "float32")
    w = Spec(mesh, [Replicate()], (4, 4), "float32")
    program = plan_program(lambda a, b: (a @ b).sum(), x, w)
    assert program.exact and program.method == "exact"
    assert "lower bound" not in program.explain()
    # the same words with an unproven plan: explain gives the bound
    unproven = attrs.evolve(program, exact=False)
    assert "lower bound" in unproven.explain()

"""A whole program planned again: the planner keeps each solve under its objective's
content, and the same objective gets the very same answer from there."""

from __future__ import annotations

import warnings

import attrs
from _program_cases import arg_specs, build, meshes, programs, transformer, transformer_args
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.layout import Mesh
from meshplan.redistribute import Planner
from meshplan.strategy import ComputeModel


def _plan(graph, specs, planner, **kwargs):
    from meshplan.strategy.programs._program import plan_graph

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan_graph(graph, specs, compute=ComputeModel.cpu(), planner=planner, **kwargs)


def _answer(prog):
    return (
        prog.cost,
        prog.lower_bound,
        prog.method,
        tuple((op.input_specs, op.output_specs, op.moves) for op in prog.ops),
        prog.grad_specs,
    )


def _trace_random(data):
    from meshplan.strategy.programs._trace import trace

    mesh = data.draw(meshes(), label="mesh")
    desc = data.draw(programs(max_ops=4), label="program")
    specs = data.draw(arg_specs(mesh, 6, 4, 2), label="specs")
    return trace(build(desc, 2), specs, [True] * len(specs)), specs


@settings(max_examples=min(settings.default.max_examples, 10), deadline=None)
@given(data=st.data())
def test_a_program_planned_again_gets_the_identical_answer_from_the_planner(data):
    graph, specs = _trace_random(data)
    planner = Planner()
    cold = _plan(graph, specs, planner)
    assert len(planner.programs) == 1
    warm = _plan(graph, specs, planner)
    assert _answer(warm) == _answer(cold)
    assert len(planner.programs) == 1  # the same objective: the same entry
    planner.clear()
    assert not planner.programs
    assert _answer(_plan(graph, specs, planner)) == _answer(cold)


@settings(max_examples=min(settings.default.max_examples, 10), deadline=None)
@given(data=st.data())
def test_other_settings_or_specs_are_other_entries(data):
    graph, specs = _trace_random(data)
    planner = Planner()
    _plan(graph, specs, planner)
    _plan(graph, specs, planner, max_factor=1 << 10)
    assert len(planner.programs) == 2
    _plan(graph, specs, planner, solver="op_by_op")  # not kept: op by op is cheap
    assert len(planner.programs) == 2


def test_a_kept_answer_that_does_not_check_out_is_solved_again():
    """An entry whose cost disagrees with its choice at the exact prices is not taken."""
    from meshplan.strategy.programs._trace import trace

    mesh = Mesh.create((2, 2))
    _, specs = transformer_args(mesh, layers=1)
    graph = trace(lambda *a: transformer(*a, layers=1), specs, [s.dtype != "int64" for s in specs])
    planner = Planner()
    cold = _plan(graph, specs, planner)
    (key, (exact, sol)), = planner.programs.items()
    wrong = attrs.evolve(sol, cost=sol.cost * 2, choice=tuple(0 for _ in sol.choice))
    planner.programs[key] = (exact, wrong)
    again = _plan(graph, specs, planner)
    assert _answer(again) == _answer(cold)
    assert planner.programs[key][1] == sol  # solved again and kept


def test_pricing_every_pair_up_front_or_lazily_are_other_entries():
    """What is priced before the solve changes its path, so it is part of the key."""
    from meshplan.strategy.programs._trace import trace

    mesh = Mesh.create((2,))
    _, specs = transformer_args(mesh, layers=1)
    graph = trace(lambda *a: transformer(*a, layers=1), specs, [s.dtype != "int64" for s in specs])
    planner = Planner()
    _plan(graph, specs, planner, max_priced=0)
    _plan(graph, specs, planner, max_priced=1 << 40)
    assert len(planner.programs) == 2

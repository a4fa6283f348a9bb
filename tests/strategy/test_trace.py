"""Tracing a function once: its arguments, then one cotangent per output, then its calls.

The cotangents (the gradients arriving for the outputs) are arguments of the joint
trace whose shapes are the outputs'; they are made inside the one trace, once the
outputs are known, so the function runs once per trace (at real sizes a second run of
the forward costs seconds).
"""

from __future__ import annotations

from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec
from meshplan.strategy.programs._trace import trace
from meshplan.strategy.rules._rule import Meta

MESH = Mesh.create((2,), ("dp",))


def _specs():
    x = Spec(MESH, [Shard(0)], (8, 4), "float64")
    w = Spec(MESH, [Replicate()], (4, 3), "float64")
    return x, w


def test_trace_runs_the_function_once():
    calls = []

    def fn(x, w):
        calls.append(1)
        return (x @ w).relu().sum()

    trace(fn, _specs(), [False, True])
    assert len(calls) == 1


def test_cotangents_follow_the_arguments_one_per_output_in_order():
    def fn(x, w):
        y = x @ w
        return y.relu(), y.argmax(1), x.sum()

    g = trace(fn, _specs(), [False, True])
    kinds = [n.kind for n in g.nodes[:5]]
    assert kinds == ["arg", "arg", "cotangent", "cotangent", "cotangent"]
    assert [n.metas[0] for n in g.nodes[2:5]] == [
        Meta((8, 3), "float64"),
        Meta((8,), "int64"),
        Meta((), "float64"),
    ]
    assert [n.name for n in g.nodes[:5]] == [f"arg{i}_1" for i in range(5)]
    assert all(n.kind == "call" for n in g.nodes[5:])
    assert g.grads[0] is None and g.grads[1] is not None


def test_a_write_in_place_traces_once_and_reads_the_cotangents():
    calls = []

    def fn(x, w):
        calls.append(1)
        y = (x @ w).clone()
        y[:, 1:] = 2 * y[:, :-1]  # a write into a strided view: the functionalized path
        return y.square().sum(), y

    g = trace(fn, _specs(), [False, True])
    assert len(calls) == 1
    assert [n.kind for n in g.nodes[:4]] == ["arg", "arg", "cotangent", "cotangent"]
    assert not any(n.call.target.endswith("_") for n in g.nodes if n.call)
    assert any("scatter" in n.call.target for n in g.nodes if n.call)
    assert any(v.node == 3 for n in g.nodes for v in n.inputs)  # y's cotangent is read

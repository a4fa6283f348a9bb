"""Recompute (activation checkpointing) as a rewrite of the traced program (no torch).

A layer's forward calls make values its backward reads (its saved activations). To
*recompute* the layer is to keep only what flows into it from outside (its input, the
parameters, values shared by all layers) and run its calls again in the backward, just
before the first backward call that reads one of the values dropped: each dropped value
then lives only from its recompute to its last backward reader, as torch's
``torch.utils.checkpoint`` does per transformer block.

:func:`with_recompute` writes that into the graph itself: each recomputed call gets a
copy in the backward phase (:attr:`Graph.recomputes` pairs each copy with its original),
reading the kept values and the other copies, and the backward calls that read a dropped
value read the copy's instead. Everything else follows from the graph as for any
program: the copies are priced (their compute and the moves they repeat), the saved
values are those the backward phase still reads (the dropped ones are not), the memory
walk (:func:`._memory.step_memory`) holds a recomputed value only in its backward window,
and :func:`~meshplan.runtime.run_program` runs the copies as backward calls. A copy
shares its original's variable in the solve, so it runs the same strategy; a copy of a
random op draws from its original's generator (:mod:`._random`: draws are keyed by the
original's position), so it redraws the same values.

What may be recomputed is a *layer*: the forward calls of one repeated block
(:func:`layer_groups`, from :func:`._repeats.find_repeats`). Values a layer makes that
are read outside it (its output, read by the next layer), by the outputs or as
gradients are kept.

>>> check_recompute("auto"), check_recompute(None)
('auto', 'auto')
"""

from __future__ import annotations

from collections.abc import Sequence

from meshplan.errors import StrategyError

from ._graph import Graph, Kind, Node, Phase, Value
from ._memory import saved_values

__all__ = [
    "RECOMPUTE",
    "check_recompute",
    "layer_groups",
    "recompute_origins",
    "with_recompute",
]

#: ``recompute=`` of :func:`~meshplan.strategy.plan_program`: ``"auto"`` recomputes as
#: few layers as a ``memory_budget`` needs (none without one), ``"never"`` none,
#: ``"always"`` every layer
RECOMPUTE = ("auto", "never", "always")


def check_recompute(value) -> str:
    """``value`` (None: ``"auto"``) if it is one of :data:`RECOMPUTE`; else a StrategyError."""
    if value is None:
        return "auto"
    if not isinstance(value, str) or value not in RECOMPUTE:
        raise StrategyError(
            f"recompute={value!r} must be one of {', '.join(map(repr, RECOMPUTE))}: 'auto' "
            "recomputes as few layers as memory_budget= needs, 'never' none, 'always' every "
            "repeated layer",
            value=value,
        )
    return value


def layer_groups(graph: Graph, blocks: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """Each layer's forward calls (``blocks``: :attr:`._repeats.Repeats.blocks`), in order."""
    out = []
    for block in blocks:
        calls = tuple(sorted(n for n in block if graph.nodes[n].phase is Phase.FORWARD))
        if calls:
            out.append(calls)
    return tuple(sorted(out))


def _plan_group(graph: Graph, group: frozenset, saved, kept_reads) -> tuple:
    """(the calls to run again, the dropped values, the first backward reader) of one
    group, or None when it drops nothing."""
    dropped = {v for v in saved if v.node in group and v not in kept_reads}
    if not dropped:
        return None
    need: set[int] = set()
    stack = [v.node for v in dropped]
    while stack:
        n = stack.pop()
        if n in need:
            continue
        need.add(n)
        stack.extend(u.node for u in graph.nodes[n].inputs if u.node in group)
    first = None
    for i, node in enumerate(graph.nodes):
        if (
            node.kind is Kind.CALL
            and node.phase is Phase.BACKWARD
            and any(v in dropped for v in node.inputs)
        ):
            first = i
            break
    if first is None:
        return None
    return tuple(sorted(need)), frozenset(dropped), first


def with_recompute(graph: Graph, groups: Sequence[Sequence[int]]) -> Graph:
    """``graph`` with each group of forward calls recomputed in the backward (see the
    module docstring); a group that drops nothing is left as it is.

    The nodes are renumbered: the forward phase's calls first (the runner runs them all
    before the backward), then the backward's with the copies in their places; arguments
    and cotangents keep theirs.
    """
    return recompute_origins(graph, groups)[0]


def recompute_origins(
    graph: Graph, groups: Sequence[Sequence[int]]
) -> tuple[Graph, tuple[int, ...]]:
    """(:func:`with_recompute`'s graph, per node of it the node of ``graph`` it is or
    repeats): a copy's origin is its original's, so two rewrites of one traced graph
    (other layers recomputed) name each other's nodes through ``graph``'s."""
    if graph.recomputes:
        raise StrategyError("the graph recomputes already; rewrite the traced graph", value=graph)
    saved = saved_values(graph)
    plans = []
    for g in groups:
        group = frozenset(g)
        outside = {
            v
            for i, node in enumerate(graph.nodes)
            if node.kind is Kind.CALL and node.phase is Phase.FORWARD and i not in group
            for v in node.inputs
        }
        outside.update(graph.outputs)
        outside.update(v for v in graph.grads if v is not None)
        found = _plan_group(graph, group, saved, outside)
        if found is not None:
            plans.append(found)
    if not plans:
        return graph, tuple(range(len(graph.nodes)))
    before: dict[int, list] = {}
    for p in plans:
        before.setdefault(p[2], []).append(p)
    new: dict[int, int] = {}  # old node -> new node
    nodes: list[Node] = []
    origin: list[int] = []  # new node -> the old node it is or repeats
    reroute: dict[Value, Value] = {}  # dropped value -> its copy's
    pairs: list[tuple[int, int]] = []

    def where(v: Value) -> Value:
        return Value(new[v.node], v.index)

    # the forward phase first (the runner runs it whole before the backward), then the
    # backward with the copies in place: a copy reads forward values only
    order = [
        i for i, n in enumerate(graph.nodes) if n.phase is Phase.FORWARD or n.kind is not Kind.CALL
    ]
    order += [
        i for i, n in enumerate(graph.nodes) if n.phase is Phase.BACKWARD and n.kind is Kind.CALL
    ]
    for i in order:
        node = graph.nodes[i]
        for calls, dropped, _ in before.get(i, ()):
            local: dict[int, int] = {}
            for n in calls:
                orig = graph.nodes[n]
                ins = tuple(
                    Value(local[u.node], u.index) if u.node in local else where(u)
                    for u in orig.inputs
                )
                local[n] = len(nodes)
                pairs.append((len(nodes), new[n]))
                origin.append(n)
                nodes.append(Node(Kind.CALL, orig.name, orig.metas, ins, orig.call, Phase.BACKWARD))
            reroute.update({v: Value(local[v.node], v.index) for v in dropped})
        new[i] = len(nodes)
        origin.append(i)
        if node.phase is Phase.BACKWARD and node.kind is Kind.CALL:
            ins = tuple(reroute[v] if v in reroute else where(v) for v in node.inputs)
        else:
            ins = tuple(where(v) for v in node.inputs)
        nodes.append(Node(node.kind, node.name, node.metas, ins, node.call, node.phase))
    rewritten = Graph(
        nodes,
        tuple(where(v) for v in graph.outputs),
        tuple(None if v is None else where(v) for v in graph.grads),
        graph.writes,
        recomputes=tuple(pairs),
    )
    return rewritten, tuple(origin)

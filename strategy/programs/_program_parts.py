"""A true lower bound for a program whose repeated layers share one plan (no torch;
numpy when used).

Tying the calls of identical layers to one variable (:mod:`._repeats`) restricts the
choice, so the tied problem's own bound says nothing of the program's minimum. This one
does, in the time of a few layers: the calls are split into *parts* (each layer's calls,
and the calls around the layers), and each part is solved alone, its readers' sources in
other parts replaced by free *copies* (a variable with the source's options and no cost
of its own). Each part pays its calls' compute and its readers' moves; a value read in
``m`` parts costs each of them ``1/m`` of its moves to the layouts its readers there
want (:attr:`.solver.SharedValue.count`), which together is at most the one move per
layout the program pays. Every choice of the whole program is a choice of each part
(copies taking the sources' options), costing at least the parts' sum, so the sum of
the parts' bounds bounds the minimum. Layers whose parts are alike (equal calls, specs
and structure: every layer between the first and the last) are bounded once.

Alone, each part may choose its copies' layouts, and its own sources', as suits it
alone: on a (2, 4) mesh a transformer's layers lose 10-15% of the bound that way.
Multipliers on the links between layers (:func:`.solver.run_bound`) win most of it back.
The links around the run (the embedding to the first layer, the last layer to the head)
have none: where the sum is loose the parts alone beside the run are bounded again as one
part, the moves between them priced whole (an 8-layer Llama on (2, 4): 2.35% -> 0.47%
under the plan; a 4-layer encoder on (2, 2): 4.9% -> 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..solver import Problem, Reader, SharedValue
from ._graph import Graph, Kind, Value

__all__ = ["LP_SHARE", "REPRICE_ROUNDS", "parts_bound"]

#: the linked layer's bounds after the first that :func:`parts_bound` runs at most, each
#: with the moves the last one chose priced exactly
REPRICE_ROUNDS = 4

#: a layer alone holding at most 1/LP_SHARE of the linked run's layers is bounded
#: without the transportation LP (Llama-3 70B: the first and last layers' LPs took 15 and
#: 30 s, the 78 layers' 10 s; without them its bound is 0.07% of the plan lower. At 32
#: layers on (2, 4) that loss was 0.3%: such runs keep the LP)
LP_SHARE = 64


class _Part:
    """One part's problem, numbered locally: own calls first, then copies."""

    def __init__(self, graph: Graph, nodes: Sequence[int], tied: dict, env, layer: bool) -> None:
        self.graph, self.tied, self.env = graph, tied, env
        self.layer = layer  # a layer's calls (else the calls around the layers)
        self.own = {n: k for k, n in enumerate(nodes)}
        self.local: dict[int, int] = dict(self.own)
        self.copies: list[int] = []
        self.readers: dict[Value, list[Reader]] = {}
        self.share: dict[Value, float] = {}  # one over the number of parts reading it

    def _var(self, node: int) -> int:
        if node not in self.local:
            self.local[node] = len(self.local)
            self.copies.append(node)
        return self.local[node]

    def build(self) -> None:
        """The readers of the part's calls' inputs, its sinks and free arguments' gradients
        (a source in another part becomes a copy)."""
        graph, (fixed, sid, sinks, free_grads) = self.graph, self.env
        for n in self.own:
            if graph.nodes[n].kind is not Kind.CALL:
                continue
            for i, v in enumerate(graph.nodes[n].inputs):
                self.readers.setdefault(v, []).append(Reader(self.local[n], i))
                if v.node not in fixed:
                    self._var(v.node)
        for v, target in sinks:
            if v.node in self.own:
                self.readers.setdefault(v, []).append(Reader(-1, 0, sid(target)))
        for v, a in free_grads:
            if a in self.own:
                self.readers.setdefault(v, []).append(Reader(self.local[a], 0))
                if v.node not in fixed:
                    self._var(v.node)

    def key(self) -> tuple:
        """What makes two parts' problems equal: their calls (by tie class), copies and
        values."""
        cls = [self.tied.get(n, n) for n in (*self.own, *self.copies)]
        fixed, sid = self.env[0], self.env[1]
        values = sorted(
            (
                self.local.get(v.node, -1),
                v.index,
                sid(fixed[v.node]) if v.node in fixed else -1,
                tuple((r.op, r.i, r.layout) for r in self.readers[v]),
                share,
            )
            for v, share in self.share.items()
        )
        return (tuple(cls), tuple(values))


def parts_bound(
    graph: Graph,
    blocks: Sequence[Sequence[int]],
    tie: dict[int, int],
    tied: tuple,
    env: tuple,
    solve_part,
    price,
    node_unary: dict | None = None,
    reprice=None,
    target: float = math.inf,
) -> tuple[float, int, dict[int, int]]:
    """A lower bound of the untied program's minimum (see the module docstring), the
    number of parts solved, and the choice the linked run of alike layers' bound makes
    for one layer (its calls' options by node; empty where it makes none: the layer's
    best plan the bound proves, which the tied program can take for every layer).
    ``tied`` is ``(var, options, ins, outs, choice)``: each node's tied variable, per
    variable its options and their spec numbers, and the tied program's choice; ``env``
    is ``(fixed, sid, sinks, free_grads)``: the fixed nodes' specs, the spec numbering,
    the fixed targets ``(value, spec)`` and the free arguments' gradients ``(value,
    node)``; ``solve_part(problem, n, links=(), choice=(), lp=True)`` returns a lower
    bound of ``n`` parts alike ``problem`` (a :class:`.solver.Problem`, see
    :func:`_problem`) and, given ``links`` (their ``(copy, own)`` variable pairs) and the
    part's ``choice``, the multipliers on them and the part's choice at the bound, or None (see
    :func:`.solver.run_bound`); ``lp=False``: without the transportation LP (a layer
    alone of at most 1/:data:`LP_SHARE` of the linked run's layers: its LP would take
    as long as the run's for a small share of the bound); ``price`` prices a move of one
    spec number to another. ``reprice(problem, choice)``: prices exactly the moves the
    linked layer's choice makes in its ``problem`` and returns the new ``price`` (None
    when all were exact): the layer is bounded again until its choice is priced exactly
    (a move not yet planned is priced by a lower bound, which a layer's LP finds
    cheapest where it is loosest), at most :data:`REPRICE_ROUNDS` times. Where the sum
    falls short of ``target`` (the plan's cost less the gap the caller accepts), the
    parts alone beside the run (the first and last layers, the calls around them) are
    bounded again as one part (:func:`_merged`), and the larger of the two bounds holds."""
    in_block = {n for b in blocks for n in b}
    free_nodes = [a for _, a in env[3]]
    rest = [n for n in (*graph.calls, *free_nodes) if n not in in_block]
    # a free argument lives in the part computing its gradient
    grad_home = {a: v.node for v, a in env[3]}
    groups = [list(b) for b in blocks] + [rest]
    where = {n: k for k, g in enumerate(groups) for n in g}
    for a in free_nodes:
        if a in where and grad_home.get(a) in where and where[a] != where[grad_home[a]]:
            groups[where[a]].remove(a)
            groups[where[grad_home[a]]].append(a)
            where[a] = where[grad_home[a]]
    groups, copied = _partition(graph, [(g, g is not rest) for g in groups if g], tie, env)
    # the longest run of alike layers prices its links (see _periodic); every other
    # part takes the same multipliers on its copies and copied calls of those classes
    chain = next((g for g in groups if _links(g[0], copied)), None)
    total, lam, layer = 0.0, {}, {}
    if chain is not None:
        links = _links(chain[0], copied)
        for _ in range(1 + REPRICE_ROUNDS * (reprice is not None)):
            problem, x = _problem(chain[0], tied, price, None, node_unary)
            bound, lams, at_bound = solve_part(problem, len(chain), links=links, choice=x)
            repriced = None if at_bound is None or reprice is None else reprice(problem, at_bound)
            if repriced is None:
                break
            price = repriced
        total += bound
        if at_bound is not None:
            layer = {n: at_bound[chain[0].local[n]] for n in chain[0].own}
        lam = {
            chain[0].tied.get(q, q): m for q, m in zip(_linked(chain[0], copied), lams, strict=True)
        }
    lone = []  # the parts alone beside the run, and their bounds
    for g in groups:
        if g is not chain:
            extra = _multipliers(g[0], lam, copied)
            # a layer alone beside a long run: its LP would cost as much as the run's
            lp = chain is None or not g[0].layer or len(g) * LP_SHARE > len(chain)
            part = _problem(g[0], tied, price, extra, node_unary)[0]
            low = solve_part(part, len(g), lp=lp)[0]
            total += low
            if len(g) == 1:
                lone.append((g[0], low))
    if chain is not None and len(lone) > 1 and total < target:
        merged = _merged([p for p, _ in lone], copied)
        if merged is not None:
            # the parts alone as one: the moves between them no longer split unpriced
            # (an 8-layer Llama on (2, 4): its bound 2.35% -> 0.47% under the plan)
            ends, copied = merged
            lp = not ends.layer or len(chain) < LP_SHARE
            extra = _multipliers(ends, lam, copied)
            low = solve_part(_problem(ends, tied, price, extra, node_unary)[0], 1, lp=lp)[0]
            total += max(0.0, low - sum(b for _, b in lone))
    return total, len(groups), layer


def _merged(lone: Sequence[_Part], copied: dict[int, int]) -> tuple[_Part, dict] | None:
    """The parts ``lone`` as one part, its share of each value theirs summed (the other
    parts' shares, and so their bounds, stay as they are), with how many parts copy each
    node now; None where another part's multipliers would change (a node of another part
    that two of ``lone`` copy)."""
    first = lone[0]
    nodes = [n for p in lone for n in p.own]
    ends = _Part(first.graph, nodes, first.tied, first.env, any(p.layer for p in lone))
    ends.build()
    ends.share = {v: sum(p.share.get(v, 0.0) for p in lone) for v in ends.readers}
    now = dict(copied)
    for p in lone:
        for q in p.copies:
            now[q] -= 1
    for q in ends.copies:
        now[q] = now.get(q, 0) + 1
    if any(now.get(q, 0) != copied.get(q, 0) for p in lone for q in p.copies if q not in ends.own):
        return None
    return ends, {q: k for q, k in now.items() if k}


def _partition(graph: Graph, groups, tie, env) -> tuple[list[list[_Part]], dict[int, int]]:
    """The parts of ``groups`` (``(nodes, is a layer)`` pairs), alike ones together
    (longest first), and how many parts copy each node."""
    parts = [_Part(graph, g, tie, env, layer) for g, layer in groups]
    # how many parts read each value: each pays that share of its moves
    for p in parts:
        p.build()
    readers_of: dict[Value, int] = {}
    for p in parts:
        for v in p.readers:
            readers_of[v] = readers_of.get(v, 0) + 1
    for p in parts:
        p.share = {v: 1.0 / readers_of[v] for v in p.readers}
    alike: dict[tuple, list[_Part]] = {}
    for p in parts:
        alike.setdefault(p.key(), []).append(p)
    copied: dict[int, int] = {}
    for p in parts:
        for q in p.copies:
            copied[q] = copied.get(q, 0) + 1
    return sorted(alike.values(), key=len, reverse=True), copied


def _linked(p: _Part, copied) -> list[int]:
    """The part's copies of calls tied to one of its own, whose own call one part copies."""
    own = {p.tied.get(n, n): n for n in p.own}
    return [
        q for q in p.copies if p.tied.get(q, q) in own and copied.get(own[p.tied.get(q, q)]) == 1
    ]


def _links(p: _Part, copied) -> list[tuple[int, int]]:
    """The part's ``(copy, own)`` variable pairs: a copy of a call tied to one of the
    part's own (the same call of the next or previous layer)."""
    own = {p.tied.get(n, n): p.local[n] for n in p.own}
    return [(p.local[q], own[p.tied.get(q, q)]) for q in _linked(p, copied)]


def _multipliers(p: _Part, lam: dict, copied) -> dict[int, object]:
    """The multipliers' terms on a part's variables: ``+lam`` on a copy of a linked
    class, ``-lam`` on an own call of it, once per part copying that call."""
    extra: dict[int, object] = {}
    for q in p.copies:
        if p.tied.get(q, q) in lam:
            extra[p.local[q]] = lam[p.tied.get(q, q)]
    for n in p.own:
        if p.tied.get(n, n) in lam and copied.get(n):
            k = p.local[n]
            extra[k] = extra.get(k, 0.0) - copied[n] * lam[p.tied.get(n, n)]
    return extra


def _problem(p: _Part, tied, price, extra=None, node_unary=None) -> tuple[Problem, list[int]]:
    """The part's problem: its calls' compute (plus ``extra`` terms by variable), its
    values over its calls and copies; and the tied program's choice as the part sees it
    (copies take their calls' options)."""
    import numpy as np

    var, options, ins, outs, choice = tied
    nodes = (*p.own, *p.copies)
    opts = [options[var[n]] for n in nodes]
    unary = [
        np.array([o.compute for o in opts[k]] if k < len(p.own) else [0.0] * len(opts[k]))
        for k in range(len(nodes))
    ]
    for k, m in (extra or {}).items():
        unary[k] = unary[k] + m
    for n in p.own:
        if node_unary and n in node_unary:
            unary[p.local[n]] = unary[p.local[n]] + node_unary[n]
    values = []
    for v, rs in p.readers.items():
        if v.node in p.env[0]:
            src = (-1, 0, p.env[1](p.env[0][v.node]))
        else:
            src = (p.local[v.node], v.index, -1)
        values.append(SharedValue(*src, tuple(rs), count=p.share[v]))
    part_ins = [ins[var[n]] for n in nodes]
    part_outs = [outs[var[n]] for n in nodes]
    x = [choice[var[n]] for n in nodes]
    problem = Problem(unary, values=values, ins=part_ins, outs=part_outs, price=price)
    return problem, x

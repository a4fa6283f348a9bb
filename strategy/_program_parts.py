"""A true lower bound for a program whose repeated layers share one plan (no torch;
numpy when used).

Tying the calls of identical layers to one variable (:mod:`._repeats`) restricts the
choice, so the tied problem's own bound says nothing of the program's minimum. This one
does, in the time of a few layers: the calls are split into *parts* (each layer's calls,
and the calls around the layers), and each part is solved alone, its readers' sources in
other parts replaced by free *copies* (a variable with the source's options and no cost
of its own). Each part pays its calls' compute and its readers' moves; a value read in
``m`` parts costs each of them ``1/m`` of its moves to the layouts its readers there
want (:attr:`~._shared.SharedValue.count`), which together is at most the one move per
layout the program pays. Every choice of the whole program is a choice of each part
(copies taking the sources' options), costing at least the parts' sum, so the sum of
the parts' bounds bounds the minimum. Layers whose parts are alike (equal calls, specs
and structure: every layer between the first and the last) are bounded once.

The bound is looser than one over the untied program: each part may choose its copies'
layouts, and its own sources', as suits it alone (on a (2, 4) mesh a transformer's
layers lose 10-15% that way).
"""

from __future__ import annotations

from collections.abc import Sequence

from ._graph import Graph, Value
from ._shared import Reader, SharedValue

__all__ = ["parts_bound"]


class _Part:
    """One part's problem, numbered locally: own calls first, then copies."""

    def __init__(self, graph: Graph, nodes: Sequence[int], tied: dict, env) -> None:
        self.graph, self.tied, self.env = graph, tied, env
        self.own = {n: k for k, n in enumerate(nodes)}
        self.local: dict[int, int] = dict(self.own)
        self.copies: list[int] = []
        self.terms: list[tuple] = []
        self.readers: dict[Value, list[Reader]] = {}
        self.share: dict[Value, float] = {}  # one over the number of parts reading it

    def _var(self, node: int) -> int:
        if node not in self.local:
            self.local[node] = len(self.local)
            self.copies.append(node)
        return self.local[node]

    def build(self) -> None:
        """The terms of the part's calls' inputs, its sinks and free arguments' gradients."""
        graph, (fixed, sid, sinks, free_grads) = self.graph, self.env
        for n in self.own:
            if graph.nodes[n].kind != "call":
                continue
            for i, v in enumerate(graph.nodes[n].inputs):
                self.readers.setdefault(v, []).append(Reader(self.local[n], i))
                if v.node in fixed:
                    self.terms.append(("fixed", self.local[n], i, sid(fixed[v.node])))
                else:
                    self.terms.append(("pair", self._var(v.node), v.index, self.local[n], i))
        for v, target in sinks:
            if v.node in self.own:
                self.readers.setdefault(v, []).append(Reader(-1, 0, sid(target)))
                self.terms.append(("sink", self.local[v.node], v.index, sid(target)))
        for v, a in free_grads:
            if a in self.own:
                self.readers.setdefault(v, []).append(Reader(self.local[a], 0))
                if v.node in fixed:
                    self.terms.append(("fixed", self.local[a], 0, sid(fixed[v.node])))
                else:
                    self.terms.append(("pair", self._var(v.node), v.index, self.local[a], 0))

    def key(self) -> tuple:
        """What makes two parts' problems equal: their calls (by tie class), copies and
        terms."""
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
        return (tuple(cls), tuple(self.terms), tuple(values))


def parts_bound(
    graph: Graph,
    blocks: Sequence[Sequence[int]],
    tie: dict[int, int],
    tied: tuple,
    env: tuple,
    solve_part,
) -> tuple[float, int]:
    """A lower bound of the untied program's minimum (see the module docstring) and the
    number of parts solved. ``tied`` is ``(var, options, ins, outs)``: each node's tied
    variable, and per variable its options and their spec numbers; ``env`` is
    ``(fixed, sid, sinks, free_grads)``: the fixed nodes' specs, the spec numbering, the
    fixed targets ``(value, spec)`` and the free arguments' gradients ``(value, node)``;
    ``solve_part(unary, terms, ins, outs, values)`` returns a part's lower bound."""
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
    parts = [_Part(graph, g, tie, env) for g in groups if g]
    # how many parts read each value: each pays that share of its moves
    for p in parts:
        p.build()
    readers_of: dict[Value, int] = {}
    for p in parts:
        for v in p.readers:
            readers_of[v] = readers_of.get(v, 0) + 1
    for p in parts:
        p.share = {v: 1.0 / readers_of[v] for v in p.readers}
    seen: dict[tuple, float] = {}
    total = 0.0
    for p in parts:
        k = p.key()
        if k not in seen:
            seen[k] = _solve(p, tied, solve_part)
        total += seen[k]
    return total, len(seen)


def _solve(p: _Part, tied, solve_part) -> float:
    import numpy as np

    var, options, ins, outs = tied
    nodes = (*p.own, *p.copies)
    opts = [options[var[n]] for n in nodes]
    unary = [
        np.array([o.compute for o in opts[k]] if k < len(p.own) else [0.0] * len(opts[k]))
        for k in range(len(nodes))
    ]
    values = []
    for v, rs in p.readers.items():
        if v.node in p.env[0]:
            src = (-1, 0, p.env[1](p.env[0][v.node]))
        else:
            src = (p.local[v.node], v.index, -1)
        values.append(SharedValue(*src, tuple(rs), count=p.share[v]))
    part_ins = [ins[var[n]] for n in nodes]
    part_outs = [outs[var[n]] for n in nodes]
    return solve_part(unary, p.terms, part_ins, part_outs, values)

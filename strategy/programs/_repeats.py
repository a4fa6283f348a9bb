"""Repeated layers: the calls of identical layers found, to be planned once (no torch;
numpy when used).

A model of ``L`` identical layers traces to ``L`` copies of each layer's calls: in the
forward phase one run of ``L`` equal stretches of calls, in the backward another (and
short runs of the ops the backward prepares early, such as the transposes of saved
weights). :func:`find_repeats` finds such runs in each phase's call sequence (the
longest stretch that repeats back to back, then the same in what lies around it), and
checks each repeat against its run's first one input by input: a call is *tied* to the
call at its position in the first repeat when their aten calls are equal and every input
comes from the same place (a call tied to the same one, the same untied node, or a fixed
argument of the same spec; a free argument read in both is tied too). Tied calls have
equal candidate options, so the planner can give them one variable: the plan of every
layer is then the same, found in the time of one (AutoParallel's clustering). That is a
restriction of the choice; :mod:`._program_bound` bounds what it may cost.

:attr:`Repeats.blocks` groups the calls by layer (each repeat of every run assigned to
the layer of the main run its values flow to and from), for the lower bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from ._graph import Graph, Kind, Phase, Value

__all__ = ["Repeats", "exact_untied", "find_repeats"]

#: the shortest stretch of calls taken as a layer's
MIN_PERIOD = 4
#: the fewest layers tied: tying restricts the choice and loosens the bound (each layer
#: bounded alone, :mod:`._program_parts`), and two or three layers plan untied about as fast
MIN_LAYERS = 4
#: the least share of the calls tied for the repeats to count as layers (a layer's q, k
#: and v projections repeat too, but tying them would only restrict one layer's plan)
MIN_TIED = 0.25


@attrs.frozen
class Repeats:
    """``tie`` maps each tied node (a call, or a free argument) to the node of the first
    repeat it shares a variable with; ``blocks`` lists, per layer, its calls in every
    phase (empty when the layers could not be told apart)."""

    tie: Mapping[int, int]
    blocks: tuple[tuple[int, ...], ...] = ()

    @property
    def layers(self) -> int:
        return len(self.blocks)


def _runs(labels: Sequence[int], lo: int, hi: int, out: list) -> None:
    """Append to ``out`` the runs ``(start, period, repeats)`` in ``labels[lo:hi]``: the
    one covering the most calls past its first repeat, then those around it."""
    import numpy as np

    n = hi - lo
    if n < 2 * MIN_PERIOD:
        return
    seq = np.asarray(labels[lo:hi])
    best = None
    for m in range(MIN_PERIOD, n // 2 + 1):
        eq = seq[:-m] == seq[m:]
        if not eq.any():
            continue
        edges = np.diff(np.concatenate(([0], eq.view(np.int8), [0])))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        k = int(np.argmax(ends - starts))
        reps = int(ends[k] - starts[k]) // m + 1
        if reps >= 2 and (best is None or (reps - 1) * m > (best[2] - 1) * best[1]):
            best = (lo + int(starts[k]), m, reps)
    if best is None:
        return
    start, m, reps = best
    out.append(best)
    _runs(labels, lo, start, out)
    _runs(labels, start + m * reps, hi, out)


def _label_calls(graph: Graph, calls: Sequence[int]) -> list[int]:
    ids: dict = {}
    return [ids.setdefault(graph.nodes[c].call, len(ids)) for c in calls]


def find_repeats(
    graph: Graph, fixed: Mapping[int, object], free_args: Sequence[int] = ()
) -> Repeats | None:
    """The repeated layers of ``graph`` (None: none found). ``fixed`` gives the fixed
    nodes' specs (arguments and cotangents), ``free_args`` the free argument nodes."""
    runs: list[tuple[tuple[int, ...], ...]] = []  # per run, its repeats' calls
    # a recomputed call's copy runs its original's strategy (the planner ties the two):
    # the runs are of the other calls, where the copies would break the backward's period
    # (the last layer's backward lacks the residual gradient's sum the others have, and
    # its copies fall before that point)
    alias = dict(graph.recomputes)
    for phase in Phase:
        calls = [c for c in graph.calls if graph.nodes[c].phase is phase and c not in alias]
        found: list = []
        _runs(_label_calls(graph, calls), 0, len(calls), found)
        for start, m, reps in found:
            runs.append(
                tuple(tuple(calls[start + i * m : start + (i + 1) * m]) for i in range(reps))
            )
    if not runs:
        return None
    if max(len(r) for r in runs) < MIN_LAYERS:
        return None
    runs, blocks = _by_layer(graph, runs)
    tie = _check_ties(graph, runs, fixed, set(free_args), alias)
    if len(tie) < MIN_TIED * (len(graph.calls) - len(alias)):
        return None
    if alias:  # each copy in its original's layer, tied as its original is
        home = {n: k for k, b in enumerate(blocks) for n in b}
        grown = [list(b) for b in blocks]
        for c, o in alias.items():
            if o in home:
                grown[home[o]].append(c)
            if o in tie or o in home:
                tie[c] = tie.get(o, o)
        blocks = tuple(tuple(b) for b in grown)
    return Repeats(tie, blocks)


def _check_ties(graph: Graph, runs, fixed, free_args: set[int], alias) -> dict[int, int]:
    """Each repeat's call tied to its run's first repeat's (all of one layer), where its
    call and every input's source agree; untied until nothing changes. ``alias``: each
    recomputed call's copy's original (a copy's output is its original's value)."""
    inside = {c for repeats in runs for inst in repeats for c in inst}
    inside |= {c for c, o in alias.items() if o in inside}
    tie: dict[int, int] = {}
    for repeats in runs:
        for inst in repeats[1:]:
            for a, b in zip(inst, repeats[0], strict=True):
                if graph.nodes[a].call == graph.nodes[b].call:
                    tie[a] = b
    while True:
        args: dict[int, int] = {}
        drop = [
            a
            for a, b in tie.items()
            if not _same_sources(graph, (a, b), tie, fixed, (free_args, inside, alias), args)
        ]
        if not drop:
            break
        for a in drop:
            del tie[a]
    # free arguments read alike: one variable, once every reader agrees on it
    for a, b in _arg_ties(graph, tie, free_args, alias).items():
        tie[a] = b
    return tie


def _source(node: int, tie: Mapping[int, int], alias: Mapping[int, int]) -> int:
    node = alias.get(node, node)
    return tie.get(node, node)


def _same_sources(graph, pair, tie, fixed, sets, args) -> bool:
    """Whether tied call ``a`` reads what ``b`` reads, input by input: from one variable,
    across the edge of the repeats (one input from inside, one from outside: the first
    layer reads the embedding where the others read the layer before), from fixed
    arguments of one spec, or from free arguments paired one to one (in ``args``)."""
    (a, b), (free_args, inside, alias) = pair, sets
    na, nb = graph.nodes[a], graph.nodes[b]
    if len(na.inputs) != len(nb.inputs):
        return False
    for x, u in zip(na.inputs, nb.inputs, strict=True):
        if x.index != u.index:
            return False
        if _source(x.node, tie, alias) == _source(u.node, tie, alias):
            continue
        if (x.node in inside) != (u.node in inside):
            continue
        if x.node in free_args and u.node in free_args:
            if args.setdefault(x.node, u.node) != u.node:
                return False
            continue
        args_alike = x.node in fixed and u.node in fixed and fixed[x.node] == fixed[u.node]
        if args_alike and graph.nodes[x.node].kind is graph.nodes[u.node].kind is Kind.ARG:
            continue
        return False
    return True


def _arg_ties(graph, tie, free_args: set[int], alias) -> dict[int, int]:
    """Free arguments of a repeat paired with the first repeat's: each reader of ``x``
    tied, reading ``u`` at the same input, and no other pairing of ``x`` or ``u``."""
    pair: dict[int, set[int]] = {}
    for a, b in tie.items():
        for x, u in zip(graph.nodes[a].inputs, graph.nodes[b].inputs, strict=True):
            if x.node in free_args and x.node != u.node:
                pair.setdefault(x.node, set()).add(u.node)
    # free arguments an untied call reads: their layout is not one layer's alone
    # (a copy reads what its original does: the original decides)
    untied = {
        x.node
        for n in graph.calls
        if n not in tie and n not in alias
        for x in graph.nodes[n].inputs
    }
    out = {}
    used = set()
    for x, us in pair.items():
        if len(us) != 1 or x in untied:
            continue
        u = next(iter(us))
        if u not in free_args or u in pair or u in used:
            continue
        out[x] = u
    return out


def _by_layer(graph: Graph, runs) -> tuple[list, tuple[tuple[int, ...], ...]]:
    """The runs with each one's repeats in layer order, and per layer its calls.

    The main run (the most calls) gives the layers; of every other run with as many
    repeats, each repeat goes to the layer whose calls its values flow to and from most
    (the backward runs layer by layer in reverse). Every run's first repeat is then the
    same layer's, so all runs tie to one layer. A run whose repeats do not fall one per
    layer keeps its order and stays out of the blocks (with the calls around the layers).
    """
    main = max(runs, key=lambda r: len(r) * len(r[0]))
    layer_of = {c: i for i, inst in enumerate(main) for c in inst}
    readers = graph.consumers()
    copies: dict[int, list[int]] = {}  # a recomputed call's copies (in the backward)
    for copy, orig in graph.recomputes:
        copies.setdefault(orig, []).append(copy)
    blocks = [list(inst) for inst in main]
    ordered = []
    for repeats in runs:
        if repeats is main or len(repeats) != len(main):
            ordered.append(repeats)
            continue
        placed = [_layer_of(graph, inst, layer_of, readers, copies) for inst in repeats]
        if sorted(placed) != list(range(len(main))):
            ordered.append(repeats)
            continue
        by_layer = [inst for _, inst in sorted(zip(placed, repeats, strict=True))]
        ordered.append(tuple(by_layer))
        for i, inst in enumerate(by_layer):
            blocks[i].extend(inst)
    return ordered, tuple(tuple(b) for b in blocks)


def _layer_of(graph: Graph, inst, layer_of, readers, copies) -> int:
    """The layer of the main run a repeat's calls read from and feed most (-1: none).

    A recomputed call's copy is of its own layer whatever its values feed (a recomputed
    layer's forward feeds only the next layer and the next layer's copies): where the
    main run holds the copies, they decide."""
    own = []
    for c in inst:
        for k in copies.get(c, ()):  # a copy's layer: where its readers are
            for j in range(len(graph.nodes[k].metas)):
                own += [layer_of[n] for n, _ in readers.get(Value(k, j), ()) if n in layer_of]
    if own:
        return max(set(own), key=own.count)
    votes: dict[int, int] = {}
    for c in inst:
        near = [x.node for x in graph.nodes[c].inputs]
        for j in range(len(graph.nodes[c].metas)):
            near += [n for n, _ in readers.get(Value(c, j), ())]
        for n in near:
            if n in layer_of:
                votes[layer_of[n]] = votes.get(layer_of[n], 0) + 1
    return max(votes, key=votes.get) if votes else -1


def exact_untied(graph: Graph, sizes: Mapping[int, int], max_factor: int) -> bool:
    """Whether the untied program solves exactly (see :func:`.solver.solve_exact`):
    every value's producer and readers together, eliminated in an order whose factors
    and total work stay within ``max_factor``. ``sizes`` gives each variable node's
    number of options (the other nodes are fixed). Then tying would only lose the proof."""
    import math

    from ..solver._eliminate import _order, work

    index = {n: k for k, n in enumerate(sizes)}
    scopes: dict = {}
    for n in sizes:
        for v in graph.nodes[n].inputs:
            scope = scopes.setdefault(v, {index[v.node]} if v.node in index else set())
            scope.add(index[n])
    edges = set()
    size_list = list(sizes.values())
    for scope in scopes.values():
        if math.prod(size_list[c] for c in scope) > max_factor:
            return False
        edges |= {(a, b) for a in scope for b in scope if a < b}
    order = _order(len(size_list), size_list, edges, max_factor)
    return order is not None and work(len(size_list), size_list, edges, order) <= max_factor

"""Reading a program's moves off its solver problem, and the op-by-op baseline (no torch;
numpy when used).

The moves of a program's :class:`~.solver.Problem` are its shared values' reads: each
value read by an op input (from a fixed argument spec or a producer's output) or by a
fixed target (an output or gradient spec). :func:`reads` lists them, each with the
layouts its two ends may take; pricing (:mod:`._program_prices`) and the op-by-op
baseline (:func:`greedy`) walk them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import attrs

from ..solver import Method, Problem, Reader, SharedValue, Solution, elimination_order

__all__ = ["Read", "greedy", "order_too_wide", "pair_count", "all_pairs", "reads"]


@attrs.frozen
class Read:
    """One read of ``value`` by ``reader``: a move whenever the two layouts differ."""

    value: SharedValue
    reader: Reader

    def sources(self, problem: Problem) -> list[int]:
        """The layouts the value may be in (distinct, in option order)."""
        v = self.value
        if v.fixed:
            return [v.layout]
        return list(dict.fromkeys(row[v.j] for row in problem.outs[v.producer]))

    def targets(self, problem: Problem) -> list[int]:
        """The layouts the reader may want (distinct, in option order)."""
        r = self.reader
        if r.fixed:
            return [r.layout]
        return list(dict.fromkeys(row[r.i] for row in problem.ins[r.op]))

    def used(self, problem: Problem, choice: Sequence[int]) -> tuple[int, int]:
        """The move ``(source, target)`` at ``choice``."""
        return problem.source(self.value, choice), problem.wanted(self.reader, choice)


def reads(problem: Problem) -> Iterator[Read]:
    """Every read that may move something (not a fixed value read by a fixed target)."""
    for v in problem.values:
        for r in v.readers:
            if not (v.fixed and r.fixed):
                yield Read(v, r)


def order_too_wide(problem: Problem, max_factor: int) -> bool:
    """Whether the pairwise problems around ``problem`` are too wide to eliminate (then the
    solver bounds them instead of solving them exactly)."""
    edges = {
        (min(v.producer, r.op), max(v.producer, r.op))
        for v in problem.values
        if not v.fixed
        for r in v.readers
        if not r.fixed and r.op != v.producer
    }
    edges |= set(problem.pairs)
    return elimination_order(list(problem.sizes), edges, max_factor) is None


def greedy(problem: Problem, order: Sequence[int], exact_price) -> Solution:
    """Each variable of ``order`` (a topological order of the calls) in turn takes its
    cheapest option given its producers' choices (moves into it at ``exact_price``, out
    to fixed targets at ``problem.price``); the others keep option 0."""
    import numpy as np

    choice = [0] * len(problem.unary)
    into: dict[int, list[tuple[SharedValue, Reader]]] = {}
    out: dict[int, list[tuple[SharedValue, Reader]]] = {}
    for v in problem.values:
        for r in v.readers:
            if not r.fixed:
                into.setdefault(r.op, []).append((v, r))
            elif not v.fixed:
                out.setdefault(v.producer, []).append((v, r))
    seen: dict[int, tuple] = {}  # each variable's sources when it last chose
    for c in order:
        # a variable met again (a tied layer's) with the same sources chooses the same
        reads_c = into.get(c, ())
        sources = tuple(
            v.layout if v.fixed else problem.outs[v.producer][choice[v.producer]][v.j]
            for v, _ in reads_c
        )
        if seen.get(c) == sources:
            continue
        seen[c] = sources
        # every option at once (the same sums, term by term, as option by option); each
        # distinct layout an input may want priced once
        n = len(problem.ins[c])
        cost = np.array(problem.unary[c], dtype=float).reshape(-1)[:n].copy()
        for (v, r), a in zip(reads_c, sources, strict=True):
            memo: dict[int, float] = {}
            terms = []
            for row in problem.ins[c]:
                b = row[r.i]
                p = memo.get(b)
                if p is None:
                    p = memo[b] = exact_price(a, b)
                terms.append(p)
            cost += v.count * np.array(terms, dtype=float)
        for v, r in out.get(c, ()):
            memo = {}
            terms = []
            for row in problem.outs[c]:
                b = row[v.j]
                p = memo.get(b)
                if p is None:
                    p = memo[b] = 0.0 if b == r.layout else v.count * problem.price(b, r.layout)
                terms.append(p)
            cost += np.array(terms, dtype=float)
        choice[c] = int(np.argmin(cost)) if n else 0
    return Solution(choice, problem.evaluate(choice), 0.0, Method.OP_BY_OP)


def pair_count(problem: Problem) -> int:
    """How many moves the reads may price (each read of ``count`` values alike counted
    that many times)."""
    n = 0
    for rd in reads(problem):
        times = max(1, round(rd.value.count))
        n += times * len(rd.sources(problem)) * len(rd.targets(problem))
    return n


def all_pairs(problem: Problem) -> Iterator[tuple[int, int]]:
    """Every move a read may make, in the order of the reads."""
    for rd in reads(problem):
        targets = rd.targets(problem)
        for a in rd.sources(problem):
            for b in targets:
                yield a, b

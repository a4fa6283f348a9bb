"""A program's spec numbers and the memo of their prices (no torch; numpy when used).

Every distinct spec a program's candidates read or write gets a number once
(:meth:`Prices.sid`); the solver problem's moves price pairs of numbers. A pair's exact price
plans the redistribution with the planner's cost model; where it is not known yet the
solver sees the strategy search's cheap lower bound of it
(:func:`~meshplan.strategy.selection._price.input_bound`). :meth:`Prices.learn_used` prices
exactly the pairs a solution uses (and their neighbours): the step of lazy pricing.

A pair whose plan search the planner's budget cut has a price that is not proven the
least: the solver sees its proven lower price (every price it sees is then at most the
true one, so its bound holds), and :attr:`Prices.cut` lists it, so a program priced
with it does not claim to be exact.
"""

from __future__ import annotations

from typing import Any

from meshplan.placement import Spec

from ..selection._price import input_bound, redistribute_bound
from ..solver import Problem
from ._program_terms import all_pairs, pair_count, reads
from ._progress import Progress, report

__all__ = ["Prices"]


class Prices:
    """The spec numbering and price memo of one planning (its working memory)."""

    def __init__(self, model: Any, planner: Any) -> None:
        self.model, self.planner = model, planner
        self.ids: dict[Spec, int] = {}
        self.table: list[Spec] = []
        self.exact: dict[tuple[int, int], float] = {}
        self.bounds: dict[tuple[int, int], float] = {}
        self.known: dict[tuple[int, int], float] = {}  # what :meth:`price` answers
        # pairs whose plan the planner's budget cut -> (the plan's price, the proven lower
        # price, which ``exact`` holds)
        self.cut: dict[tuple[int, int], tuple[float, float]] = {}

    def owner(self) -> Any:
        """The planner that prices (and keeps what planning learns): the default one when
        none was given."""
        if self.planner is not None:
            return self.planner
        from meshplan.redistribute._store import default_planner

        return default_planner()

    def sid(self, spec: Spec) -> int:
        """The number of ``spec`` (a new one the first time it is seen)."""
        k = self.ids.get(spec)
        if k is None:
            k = self.ids[spec] = len(self.table)
            self.table.append(spec)
        return k

    def number(self, options) -> tuple[list, list]:
        """(``ins``, ``outs``): each option's input and output spec numbers (-1: none)."""
        ins = [[[self.sid(s) for s in o.input_specs] for o in opts] for opts in options]
        outs = [
            [[self.sid(s) if s is not None else -1 for s in o.output_specs] for o in opts]
            for opts in options
        ]
        return ins, outs

    def _plan_price(self, a: int, b: int) -> float:
        """The planned price of moving spec ``a`` to ``b``, or where the planner's budget
        cut the plan's search, the least price it proved (the pair noted in ``cut``)."""
        if a == b:
            return 0.0
        price, lower = redistribute_bound(self.table[a], self.table[b], self.model, self.planner)
        if lower < price:
            self.cut[(a, b)] = (price, lower)
        return lower

    def learn_exact(self, a: int, b: int) -> float:
        """The exact price of moving spec ``a`` to spec ``b`` (planned once)."""
        c = self.exact.get((a, b))
        if c is None:
            c = self.exact[(a, b)] = self.known[(a, b)] = self._plan_price(a, b)
        return c

    def learn(self, exact: dict[tuple[int, int], float]) -> None:
        """Take exact prices learned elsewhere (by a solve of the same program)."""
        recheck = self.owner().cut_plans > 0  # (a cut plan's pair is noted again)
        for pair, c in exact.items():
            if pair not in self.exact:
                self.exact[pair] = self.known[pair] = c
                if recheck and pair[0] != pair[1]:
                    self._plan_price(*pair)

    def price(self, a: int, b: int) -> float:
        """The exact price where known, else a lower bound of it (cheap: no planning)."""
        c = self.known.get((a, b))
        if c is None:
            c = self.bounds[(a, b)] = self.known[(a, b)] = (
                0.0 if a == b else input_bound(self.table[a], self.table[b].placements, self.model)
            )
        return c

    def frozen(self):
        """:meth:`price` as it answers now: exact prices learned later do not change it
        (a pure function for a solver :class:`~.solver.Problem` of one round)."""
        # the exact prices over the bounds known now: one lookup per call (the solver asks
        # millions of times)
        seen = dict(self.bounds)
        seen.update(self.exact)
        get = seen.get

        def price(a: int, b: int) -> float:
            c = get((a, b))
            if c is None:
                c = seen[(a, b)] = self.bounds[(a, b)] = (
                    0.0
                    if a == b
                    else input_bound(self.table[a], self.table[b].placements, self.model)
                )
                self.known.setdefault((a, b), c)
            return c

        return price

    def price_all(self, problem: Problem, max_priced: int, progress: Progress | None) -> None:
        """Price every move the problem's reads may make up front, when there are at most
        ``max_priced`` of them (else pricing stays lazy)."""
        count = pair_count(problem)
        if count > max_priced:
            return
        every = max(1, count // 20)
        for done, (a, b) in enumerate(all_pairs(problem)):
            if done % every == 0:
                report(progress, "prices", done, count)
            if (a, b) not in self.exact:
                self.exact[(a, b)] = self.known[(a, b)] = self._plan_price(a, b)
        report(progress, "prices", count, count)

    def learn_used(self, problem: Problem, choice) -> int:
        """Price exactly the moves ``choice`` makes; when some were guessed, their
        neighbourhood too (each read of an op's output: the chosen source against every
        option of the reader, and the reverse, so later rounds do not walk through ties
        one pair at a time). Returns how many pairs were newly priced."""
        new = 0

        def learn(a: int, b: int) -> None:
            nonlocal new
            if (a, b) not in self.exact:
                self.exact[(a, b)] = self.known[(a, b)] = self._plan_price(a, b)
                new += 1

        every = list(reads(problem))
        for rd in every:
            learn(*rd.used(problem, choice))
        if new:
            for rd in every:
                if rd.value.fixed or rd.reader.fixed:
                    continue
                a, b = rd.used(problem, choice)
                for d in rd.targets(problem):
                    learn(a, d)
                for e in rd.sources(problem):
                    learn(e, b)
        return new

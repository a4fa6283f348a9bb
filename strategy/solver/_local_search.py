"""Local search on the shared objective, every option of an op priced at once (numpy).

Re-choosing op ``c`` given the others changes only the values it touches: those it
produces (their source layout follows ``c``'s option) and those it reads (the layouts
it wants join the ones the value's other readers want). Per value, a price table over
its possible sources (rows) and the layouts any reader may want (columns), and a count
per column of the readers wanting it now, give the value's cost under each of ``c``'s
options as one masked row sum: the columns wanted by the others (count above ``c``'s own
part) or by ``c`` under that option, in the row of the source under that option.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["Searcher", "local_search", "repair_within"]


class _Value:
    """One value's price table (``table[source, layout]``, times the value's multiplicity),
    each option's source row (``rows``: None for a fixed source), each op reader's wanted
    column per option (``wants``: (op, columns)) and the fixed readers' columns."""

    def __init__(self, v, ins, outs, price) -> None:
        import numpy as np

        srcs = [v.layout] if v.producer < 0 else [row[v.j] for row in outs[v.producer]]
        fixed = [r.layout for r in v.readers if r.op < 0]
        wants = [(r.op, [row[r.i] for row in ins[r.op]]) for r in v.readers if r.op >= 0]
        layouts = sorted({*fixed, *(b for _, w in wants for b in w)})
        at = {b: n for n, b in enumerate(layouts)}
        us = list(dict.fromkeys(srcs))
        row_of = {a: n for n, a in enumerate(us)}
        count = getattr(v, "count", 1)  # identical values planned as one
        self.table = count * np.array(
            [[0.0 if a == b else price(a, b) for b in layouts] for a in us], dtype=float
        ).reshape(len(us), len(layouts))
        self.producer = v.producer
        self.rows = None if v.producer < 0 else np.array([row_of[a] for a in srcs])
        self.wants = [(op, np.array([at[b] for b in w])) for op, w in wants]
        self.fixed = [at[b] for b in fixed]

    def start(self, choice) -> tuple[Any, int]:
        """The count of readers wanting each column at ``choice``, and the source row."""
        import numpy as np

        count = np.zeros(self.table.shape[1], dtype=np.int64)
        for col in self.fixed:
            count[col] += 1
        for op, cols in self.wants:
            count[cols[choice[op]]] += 1
        return count, 0 if self.rows is None else int(self.rows[choice[self.producer]])

    def costs(self, state, c: int, k: int, n: int):
        """This value's cost under each of op ``c``'s ``n`` options (``c`` now at ``k``;
        ``state`` as :meth:`start` gives it)."""
        import numpy as np

        count, row = state
        mine = [cols for op, cols in self.wants if op == c]
        others = count.copy()
        for cols in mine:
            others[cols[k]] -= 1
        wanted = np.repeat((others > 0)[None, :], n, axis=0)
        for cols in mine:
            wanted[np.arange(n), cols] = True
        rows = self.table[self.rows] if self.producer == c else self.table[row][None, :]
        return (rows * wanted).sum(axis=1)

    def move(self, state, c: int, old: int, new: int):
        """``state`` after op ``c`` goes from option ``old`` to ``new``."""
        count, row = state
        for op, cols in self.wants:
            if op == c:
                count[cols[old]] -= 1
                count[cols[new]] += 1
        return count, int(self.rows[new]) if self.producer == c else row


class Searcher:
    """:func:`local_search` over one problem's shared values: their price tables are built
    once, for any number of searches (from any unary rows)."""

    def __init__(self, problem) -> None:
        values, ins, outs, price = problem.values, problem.ins, problem.outs, problem.price
        self.pairs: dict[int, list] = {}
        for (a, b), m in problem.pairs.items():
            self.pairs.setdefault(a, []).append((b, m, True))
            self.pairs.setdefault(b, []).append((a, m, False))
        self.tables: list[_Value] = []
        self.touching: dict[int, list[int]] = {}
        self.near: dict[int, set[int]] = {}
        for v in values:
            ops = {r.op for r in v.readers if r.op >= 0} | ({v.producer} - {-1})
            if not ops:
                continue
            self.tables.append(_Value(v, ins, outs, price))
            for c in ops:
                self.touching.setdefault(c, []).append(len(self.tables) - 1)
                self.near.setdefault(c, set()).update(ops)

    def option_costs(self, choice, states, unary, c: int):
        """What each option of variable ``c`` costs given the others at ``choice`` (its
        unary row, its pairwise terms, the shared values it touches)."""
        import numpy as np

        size, orig = len(unary[c]), choice[c]
        cost = np.array(unary[c], dtype=float)
        for i in self.touching.get(c, ()):
            cost += self.tables[i].costs(states[i], c, orig, size)
        for w, m, first in self.pairs.get(c, ()):
            cost += m[:, choice[w]] if first else m[choice[w], :]
        return cost

    def within(self, choice: Sequence[int], unary, weights, room: float) -> list[int] | None:
        """``choice`` brought within ``room`` bytes (``weights[v][k]``: option ``k`` of
        ``v``'s), one variable at a time, each step the one whose cost rises least per byte
        it saves (given the others); then each variable re-chosen to its cheapest option
        that keeps the choice within ``room``, until nothing improves. None when the steps
        run out of options that save bytes."""
        import numpy as np

        choice = list(choice)
        states = [t.start(choice) for t in self.tables]
        heavy = [v for v, w in enumerate(weights) if len(w) > 1 and np.ptp(w) > 0]
        held = float(sum(float(w[k]) for w, k in zip(weights, choice, strict=True)))
        costs = {v: self.option_costs(choice, states, unary, v) for v in heavy}

        def set_option(c: int, new: int) -> None:
            nonlocal held
            old = choice[c]
            held += float(weights[c][new] - weights[c][old])
            choice[c] = new
            for i in self.touching.get(c, ()):
                states[i] = self.tables[i].move(states[i], c, old, new)
            near = {*self.near.get(c, ()), *(w for w, _, _ in self.pairs.get(c, ())), c}
            for u in near & costs.keys():
                costs[u] = self.option_costs(choice, states, unary, u)

        limit = sum(len(w) for w in weights)  # each step lightens one variable
        while held > room * (1 + 1e-12) + 1e-9 and limit:
            limit -= 1
            step = None  # (cost per byte saved, bytes saved, variable, option): of equal
            # rates the smaller saving, so the last step overshoots the room least
            for v, cost in costs.items():
                w, k = weights[v], choice[v]
                saved = w[k] - w
                ok = saved > 0
                if not ok.any():
                    continue
                ratio = np.where(ok, (cost - cost[k]) / np.where(ok, saved, 1.0), np.inf)
                j = int(np.argmin(ratio))
                key = (float(ratio[j]), float(saved[j]), v, j)
                step = key if step is None or key < step else step
            if step is None:
                return None
            set_option(step[2], step[3])
        if held > room * (1 + 1e-12) + 1e-9:
            return None
        for _ in range(4):  # improve within the room
            moved = False
            for v, cost in list(costs.items()):
                k = choice[v]
                fits = held - weights[v][k] + np.asarray(weights[v]) <= room * (1 + 1e-12) + 1e-9
                best = int(np.argmin(np.where(fits, cost, np.inf)))
                if cost[best] < cost[k] - 1e-12 * max(abs(float(cost[k])), 1e-30):
                    set_option(v, best)
                    moved = True
            if not moved:
                break
        return choice

    def __call__(self, choice: Sequence[int], unary, max_visits: int | None = None) -> list[int]:
        from collections import deque

        import numpy as np

        choice = list(choice)
        n = len(unary)
        states = [t.start(choice) for t in self.tables]
        queue = deque(range(n))
        queued = [True] * n
        visits = 0
        limit = 50 * n if max_visits is None else max_visits
        while queue and visits < limit:
            c = queue.popleft()
            queued[c] = False
            visits += 1
            size = len(unary[c])
            if size < 2:
                continue
            orig = choice[c]
            mine = self.touching.get(c, ())
            cost = np.array(unary[c], dtype=float)
            for i in mine:
                cost += self.tables[i].costs(states[i], c, orig, size)
            for w, m, first in self.pairs.get(c, ()):
                cost += m[:, choice[w]] if first else m[choice[w], :]
            best = int(np.argmin(cost))
            if not cost[best] < cost[orig] - 1e-18:
                continue
            choice[c] = best
            for i in mine:
                states[i] = self.tables[i].move(states[i], c, orig, best)
            for u in sorted({*self.near.get(c, ()), *(w for w, _, _ in self.pairs.get(c, ()))}):
                if u != c and not queued[u]:
                    queued[u] = True
                    queue.append(u)
        return choice


def local_search(problem, choice: Sequence[int], max_visits: int | None = None) -> list[int]:
    """Re-choose each variable given the others, on ``problem``'s objective, until nothing
    improves.

    A worklist: every variable once, then only those sharing a term with one that changed
    (the others' best options cannot have moved); at most ``max_visits`` visits
    (default 50 per variable). A variable moves to its cheapest option (the first of
    equals) when that is cheaper than its current one. (:class:`Searcher` keeps the price
    tables for more searches over the same values and prices.)

    >>> from meshplan.strategy.solver import Problem, Reader, SharedValue
    >>> v = SharedValue(-1, 0, 2, (Reader(0, 0), Reader(1, 0)))  # fixed in layout 2
    >>> ins = [[[0], [1]], [[1]]]  # op 0 reads the value in layout 0 or 1, op 1 in 1
    >>> p = Problem([[0.0, 0.0], [0.0]], values=[v], ins=ins, outs=[[[], []], [[]]],
    ...             price=lambda a, b: 2.0)
    >>> local_search(p, [0, 0])
    [1, 0]
    """
    return Searcher(problem)(choice, problem.unary, max_visits)


def repair_within(problem, choice: Sequence[int]) -> list[int] | None:
    """``choice`` brought within ``problem.budget`` by :meth:`Searcher.within` (each step
    the variable whose cost rises least per byte saved), then improved within it; None
    when no step saves bytes, or without a budget.

    >>> from meshplan.strategy.solver import MemoryRow, Problem
    >>> p = Problem([[0.0, 1.0, 5.0], [0.0, 2.0]], budget=3.0,
    ...             memory=[MemoryRow(0, [4.0, 2.0, 0.0]), MemoryRow(1, [2.0, 1.0])])
    >>> repair_within(p, [0, 0]), p.evaluate([1, 1])
    ([1, 1], 3.0)
    """
    if problem.budget is None:
        return None
    weights = problem.weights()
    return Searcher(problem).within(choice, problem.unary, weights, float(problem.budget))

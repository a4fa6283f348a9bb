"""The solver's one input: a typed, frozen :class:`Problem` (numpy when used).

A problem chooses one option per *variable* (an op's strategy, a free argument's
layout) to minimize the sum of its terms:

* ``unary[v][k]``: what option ``k`` of variable ``v`` costs alone (its compute);
* ``pairs[(a, b)][k, l]``: a table over the options of two variables, each edge once;
* ``values``: shared moves (:class:`SharedValue`): a value is moved once to every
  distinct layout its readers want, from the layout its source chose. The layouts are
  numbers: ``ins[v][k][i]`` is the layout option ``k`` of ``v`` reads its input ``i``
  in, ``outs[v][k][j]`` the layout it writes output ``j`` in, and ``price(a, b)`` the
  price of moving layout ``a`` to layout ``b`` (0 when equal);
* ``memory``: rows of bytes per option (:class:`MemoryRow`) whose sum over the chosen
  options must stay within ``budget`` (None: no budget);
* ``limits``: more such constraints (:class:`Limit`), each its rows within its own
  budget (a step's live bytes op by op). The transportation LP and its MIP keep to every
  one; the other methods relax them (their bounds hold), and :meth:`Problem.fits` checks
  them.

:meth:`Problem.evaluate` is the objective every method minimizes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

__all__ = ["Limit", "MemoryRow", "Problem", "Reader", "SharedValue"]


@attrs.frozen
class Reader:
    """One read of a value: by input ``i`` of variable ``op`` (its options' layouts in
    ``ins[op][k][i]``), or by a fixed target ``layout`` (``op`` is -1)."""

    op: int
    i: int = 0
    layout: int = -1

    @property
    def fixed(self) -> bool:
        return self.op < 0


@attrs.frozen
class SharedValue:
    """A value: its source (``producer`` variable and output ``j``, or a fixed ``layout``
    when ``producer`` is -1) and its readers; ``count`` values alike (repeated layers
    planned as one) pay its moves ``count`` times (a fraction: a share of them)."""

    producer: int
    j: int
    layout: int
    readers: tuple[Reader, ...] = attrs.field(converter=tuple)
    count: float = 1

    @property
    def fixed(self) -> bool:
        return self.producer < 0


@attrs.frozen
class MemoryRow:
    """The bytes per rank each option of ``variable`` holds (``bytes[k]`` for option
    ``k``): parameter state, or activations a choice keeps.

    >>> MemoryRow(0, [4.0, 2.0]).bytes
    (4.0, 2.0)
    """

    variable: int
    bytes: tuple[float, ...] = attrs.field(converter=lambda b: tuple(float(x) for x in b))


@attrs.frozen
class Limit:
    """Rows of bytes per option whose sum over the chosen options must stay within
    ``budget``: one constraint beside a problem's own budget (see :class:`Problem`).

    >>> Limit([MemoryRow(0, [4.0, 2.0]), MemoryRow(1, [1.0, 3.0])], 5.0).used((1, 1))
    5.0
    """

    memory: tuple[MemoryRow, ...] = attrs.field(converter=tuple)
    budget: float = attrs.field(converter=float)

    def used(self, choice: Sequence[int]) -> float:
        """The bytes ``choice`` holds in these rows."""
        return float(sum(row.bytes[choice[row.variable]] for row in self.memory))

    def fits(self, choice: Sequence[int]) -> bool:
        return self.used(choice) <= self.budget * (1 + 1e-12)


def summed_bytes(memory: Sequence[MemoryRow], sizes: Sequence[int]) -> list:
    """Each variable's bytes per option in ``memory``'s rows, summed (zeros without any)."""
    import numpy as np

    w = [np.zeros(k) for k in sizes]
    for row in memory:
        w[row.variable] = w[row.variable] + np.asarray(row.bytes)
    return w


def _arrays(rows: Sequence[Any]) -> tuple:
    import numpy as np

    if isinstance(rows, tuple) and all(
        isinstance(u, np.ndarray) and u.dtype == float and u.ndim == 1 for u in rows
    ):
        return rows
    return tuple(np.asarray(u, dtype=float).reshape(-1) for u in rows)


def _tables(pairs: Mapping[tuple[int, int], Any]) -> dict:
    """Each edge once: ``(b, a)`` tables transposed onto ``(a, b)`` with ``a < b``."""
    import numpy as np

    out: dict[tuple[int, int], Any] = {}
    for (a, b), m in pairs.items():
        m = np.asarray(m, dtype=float)
        if a > b:
            a, b, m = b, a, m.T
        out[(a, b)] = out[(a, b)] + m if (a, b) in out else m
    return out


def _numbers(rows: Sequence) -> tuple:
    if isinstance(rows, tuple) and all(isinstance(r, tuple) for r in rows[:1]):
        return rows  # converted already (evolve runs converters again)
    return tuple(tuple(tuple(int(x) for x in opt) for opt in opts) for opts in rows)


def _no_price(a: int, b: int) -> float:
    raise ValueError(f"the problem has shared values but no price (asked for {a} -> {b})")


@attrs.frozen(eq=False)
class Problem:
    """One min-sum problem over variables with finite domains (see the module docstring).

    >>> p = Problem([[1.0, 0.0], [0.0, 3.0]], {(0, 1): [[0, 5], [5, 0]]})
    >>> p.sizes, p.evaluate((0, 0)), p.evaluate((1, 0))
    ((2, 2), 1.0, 5.0)
    """

    unary: tuple = attrs.field(converter=_arrays)
    pairs: dict = attrs.field(factory=dict, converter=_tables)
    values: tuple[SharedValue, ...] = attrs.field(default=(), converter=tuple)
    ins: tuple = attrs.field(default=(), converter=_numbers)
    outs: tuple = attrs.field(default=(), converter=_numbers)
    price: Callable[[int, int], float] = _no_price
    memory: tuple[MemoryRow, ...] = attrs.field(default=(), converter=tuple)
    budget: float | None = None
    limits: tuple[Limit, ...] = attrs.field(default=(), converter=tuple)

    def __attrs_post_init__(self) -> None:
        n = len(self.unary)
        for (a, b), m in self.pairs.items():
            if not (0 <= a < b < n) or m.shape != (len(self.unary[a]), len(self.unary[b])):
                raise ValueError(
                    f"pair table {(a, b)} of shape {m.shape} does not fit variables of sizes "
                    f"{self.sizes}"
                )
        if self.values and (len(self.ins) != n or len(self.outs) != n):
            raise ValueError(
                f"a problem with shared values needs ins and outs per variable ({n}), got "
                f"{len(self.ins)} and {len(self.outs)}"
            )
        for row in (*self.memory, *(r for lim in self.limits for r in lim.memory)):
            if not 0 <= row.variable < n or len(row.bytes) != len(self.unary[row.variable]):
                raise ValueError(f"memory row {row!r} does not fit variables of sizes {self.sizes}")

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(u) for u in self.unary)

    def evaluate(self, choice: Sequence[int]) -> float:
        """The objective at ``choice`` (one option per variable): unary terms, pair
        tables, and per shared value one move per distinct layout its readers want."""
        s = sum(float(u[k]) for u, k in zip(self.unary, choice, strict=True))
        s += sum(float(m[choice[a], choice[b]]) for (a, b), m in self.pairs.items())
        return float(s + sum(self.move_cost(v, choice) for v in self.values))

    def source(self, v: SharedValue, choice: Sequence[int]) -> int:
        """The layout value ``v`` is in at ``choice``."""
        return v.layout if v.fixed else self.outs[v.producer][choice[v.producer]][v.j]

    def wanted(self, r: Reader, choice: Sequence[int]) -> int:
        """The layout reader ``r`` wants at ``choice``."""
        return r.layout if r.fixed else self.ins[r.op][choice[r.op]][r.i]

    def move_cost(self, v: SharedValue, choice: Sequence[int]) -> float:
        """What value ``v``'s moves cost at ``choice``."""
        a = self.source(v, choice)
        dsts = dict.fromkeys(self.wanted(r, choice) for r in v.readers)
        return v.count * sum(self.price(a, b) for b in dsts if b != a)

    def weights(self) -> list:
        """Each variable's bytes per option: its memory rows summed (zeros without any)."""
        return summed_bytes(self.memory, self.sizes)

    def memory_of(self, choice: Sequence[int]) -> float:
        """The bytes ``choice`` holds (its memory rows summed)."""
        return float(sum(row.bytes[choice[row.variable]] for row in self.memory))

    def fits(self, choice: Sequence[int]) -> bool:
        """Whether ``choice`` stays within the budget (always, without one) and every
        limit."""
        if self.budget is not None and self.memory_of(choice) > self.budget * (1 + 1e-12):
            return False
        return all(lim.fits(choice) for lim in self.limits)

    def with_unary(self, unary: Sequence[Any]) -> Problem:
        """The same problem with other unary rows (a multiplier's, a branch's exclusions)."""
        return attrs.evolve(self, unary=unary)

    def without_budget(self) -> Problem:
        """The same problem without its budget and its limits."""
        return attrs.evolve(self, budget=None, limits=())

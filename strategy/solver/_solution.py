"""The solver's output and its typed knobs: :class:`Solution`, :class:`Method`,
:class:`Effort`, :class:`Options`, and :class:`Warm` (what one solve leaves the next)."""

from __future__ import annotations

import enum
from typing import Any

import attrs

__all__ = ["Effort", "Method", "Options", "Solution", "Warm"]


class Method(enum.StrEnum):
    """How a solution's bound was found (its string is the display text)."""

    EXACT = "exact"
    OP_BY_OP = "op by op"
    FOREST = "forest bound + local search"
    MESSAGES = "LP bound + local search"
    RELAXATION = "exact relaxation bound + local search"
    SHARING_DUAL = "sharing dual bound + local search"
    TRANSPORT_LP = "transportation LP bound + rounding"
    LAGRANGIAN = "lagrangian bound + branch and bound"
    TIED = "layers planned as one, bound by parts"


@attrs.frozen
class Effort:
    """The work a solve spent: message-passing ``passes``, sharing-dual ``steps``,
    relaxation ``solves`` (a budget's search), LP ``simplex`` iterations."""

    passes: int = 0
    steps: int = 0
    solves: int = 0
    simplex: int = 0

    def __add__(self, other: Effort) -> Effort:
        return Effort(
            *(a + b for a, b in zip(attrs.astuple(self), attrs.astuple(other), strict=True))
        )


@attrs.frozen
class Solution:
    """One option per variable, its cost, a true lower ``bound`` of the minimum, the
    :class:`Method` that bound it and the effort spent; under a memory budget,
    ``multiplier`` is the Lagrange multiplier (cost per byte) of the search's root bound.

    >>> Solution((0, 1), 3.0, 2.0, Method.SHARING_DUAL).gap
    0.3333333333333333
    """

    choice: tuple[int, ...] = attrs.field(converter=tuple)
    cost: float
    bound: float
    method: Method = attrs.field(converter=Method)
    effort: Effort = attrs.field(default=Effort(), repr=False)
    multiplier: float = attrs.field(default=0.0, repr=False)

    @property
    def lower_bound(self) -> float:
        return self.bound

    @property
    def gap(self) -> float:
        return 0.0 if self.cost <= 0 else max(0.0, (self.cost - self.bound) / self.cost)

    @property
    def exact(self) -> bool:
        return self.method is Method.EXACT

    def describe(self) -> str:
        """The method as a line of text (with the sharing dual's steps)."""
        if self.method is Method.SHARING_DUAL and self.effort.steps:
            return f"sharing dual bound ({self.effort.steps} steps) + local search"
        return str(self.method)


def proven(cost: float, bound: float, tol: float = 1e-12) -> bool:
    """Whether ``bound`` meets ``cost`` within ``tol`` (relative)."""
    return cost - bound <= tol * max(abs(cost), 1e-300)


@attrs.frozen
class Options:
    """A solve's knobs. ``max_factor``: the largest table exact elimination builds (and 4
    times that in all); ``steps``: the sharing dual's steps; ``draft``: a cheap, looser
    bound (no dual steps); ``prove``: run message passing to convergence for the bound;
    ``max_branches`` and ``gap``: a memory budget's branch and bound stops after that many
    relaxation solves, or once its gap is within ``gap`` of the cost; ``lp``: solve the
    transportation LP (when highspy is installed and the problem is not solved exactly;
    the sharing dual's steps run instead without it); ``max_seconds``: a memory budget's
    search (its multiplier's and its branches' solves) starts no solve past this many
    seconds of the process's CPU time, and answers with the best choice and bound it has
    (None: no limit); ``repair``: a memory budget's search also brings the cheapest
    choices it met over the budget within it a variable at a time
    (:func:`._local_search.repair_within`): where the memory rows are what binds, plans
    just within the budget the Lagrangian's jumps miss (off where the rows are a lower
    estimate of what binds, a whole step's peak: a plan at their edge may not fit)."""

    max_factor: int = 1 << 21
    steps: int = 30
    draft: bool = False
    prove: bool = True
    max_branches: int = 64
    gap: float = 0.0
    lp: bool = True
    max_seconds: float | None = None
    repair: bool = True

    def __attrs_post_init__(self) -> None:
        if not (isinstance(self.gap, int | float) and 0 <= self.gap < 1):
            raise ValueError(f"gap must be a fraction in [0, 1), got {self.gap!r}")
        if self.max_seconds is not None and not (
            isinstance(self.max_seconds, int | float) and self.max_seconds >= 0
        ):
            raise ValueError(f"max_seconds must be None or >= 0, got {self.max_seconds!r}")


@attrs.define
class Warm:
    """What one solve leaves the next over the same terms (prices may rise between them):
    the readers' shares of the sharing dual, a budget's search tree and the two sides of
    its root dual, the transportation LP (its columns and basis), the pairwise problems'
    messages (``messages["above"]``, ``messages["below"]``: see
    :func:`._eliminate.solve_pairwise`'s ``memo``). Working memory, not a value."""

    weights: list | None = None
    lp: Any = None
    search: dict | None = None
    lines: dict = attrs.field(factory=dict)
    messages: dict = attrs.field(factory=dict)

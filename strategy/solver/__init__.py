"""meshplan.strategy.solver — the discrete optimizer behind whole-program planning.

Decides one option per variable of a typed, frozen :class:`Problem` (variables and
their domains, unary costs, pair tables with each edge once, shared moves: a value
moved once to every layout its readers want, memory rows under a budget, more rows
under limits of their own) so that
:meth:`Problem.evaluate` is least, and proves how close it got: :func:`solve` returns a
:class:`Solution` (the choice, its cost, a true lower bound, the :class:`Method` that
bounded it and the :class:`Effort` spent). The methods, each a function of a problem:
exact elimination (:func:`solve_pairwise`, :func:`solve_exact`), message passing
(:func:`lp_bound`), the sharing dual (:func:`solve_shared`), local search
(:func:`local_search`), a tied layer's periodic bound (:func:`run_bound`), Lagrangian
relaxation with branch and bound under a memory budget (:func:`solve_within`), and the
transportation LP (:func:`transport_lp`, :func:`solve_lp`: per reader a transport plan
between its producer's and its own layout weights, a wanted layout paid once per value;
under a budget with its memory row, :func:`solve_lp_within`, and a MIP over its columns,
:func:`mip_choice`, :func:`mix_within`; through HiGHS when the ``meshplan[solver]``
extra, highspy, is installed, else skipped).
Options and budgets are typed values (:class:`Options`).

Knows nothing of torch, meshes, specs or ops: layouts and options are numbers, prices
a function of two layout numbers. Imports nothing of meshplan outside this package;
numpy is imported when a problem is solved.

>>> p = Problem([[1.0, 0.0], [0.0, 3.0]], {(0, 1): [[0, 5], [5, 0]]})
>>> s = solve(p)
>>> s.choice, s.cost, s.bound, s.method
((0, 0), 1.0, 1.0, <Method.EXACT: 'exact'>)
"""

from ._budget import InfeasibleBudget, budget_binds, min_memory_choice, solve_within
from ._eliminate import elimination_order, solve_pairwise, total, work
from ._local_search import Searcher, local_search
from ._messages import Relaxation, lp_bound
from ._periodic import run_bound
from ._problem import Limit, MemoryRow, Problem, Reader, SharedValue
from ._shared import Split, reader_weights, solve_exact, solve_shared, split
from ._solution import Effort, Method, Options, Solution, Warm, proven
from ._solve import solve
from ._transport import LPRelaxation, has_lp, solve_lp, transport_lp
from ._transport_mip import mip_choice, mix_within, solve_lp_within

__all__ = [
    "Effort",
    "InfeasibleBudget",
    "LPRelaxation",
    "Limit",
    "MemoryRow",
    "Method",
    "Options",
    "Problem",
    "Reader",
    "Relaxation",
    "Searcher",
    "SharedValue",
    "Solution",
    "Split",
    "Warm",
    "budget_binds",
    "elimination_order",
    "has_lp",
    "local_search",
    "lp_bound",
    "mip_choice",
    "mix_within",
    "min_memory_choice",
    "proven",
    "reader_weights",
    "run_bound",
    "solve",
    "solve_exact",
    "solve_lp",
    "solve_lp_within",
    "solve_pairwise",
    "solve_shared",
    "solve_within",
    "split",
    "total",
    "transport_lp",
    "work",
]

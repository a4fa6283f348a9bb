"""meshplan's exceptions: one base class, one subclass per package.

Every error meshplan raises for bad input derives from :class:`MeshplanError`
and from the matching builtin (``ValueError``), so ``except ValueError`` keeps
working. Errors carry the offending objects as attributes (``err.value``).

>>> from meshplan.errors import MeshError, MeshplanError
>>> issubclass(MeshError, MeshplanError) and issubclass(MeshError, ValueError)
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "MeshplanError",
    "MeshError",
    "PlacementError",
    "PlanError",
    "StrategyError",
    "MemoryBudgetError",
    "CheckpointError",
    "MissingTensorError",
    "RuntimeShellError",
    "WorkerError",
    "WorkerDied",
    "TaskTimeout",
    "RemoteError",
    "MergeWarning",
    "ProgramWarning",
    "BudgetWarning",
]


class MeshplanError(Exception):
    """Base of every meshplan error; ``value`` holds the offending object (or None)."""

    def __init__(self, message: str, *, value: Any = None) -> None:
        super().__init__(message)
        self.value = value


class MeshError(MeshplanError, ValueError):
    """A mesh, layout, rank map, name or alias is invalid."""


class PlacementError(MeshplanError, ValueError):
    """A placement or spec is invalid or inconsistent with its mesh/shape."""


class PlanError(MeshplanError, ValueError):
    """Two specs cannot be planned between, or a plan is malformed."""


class StrategyError(MeshplanError, ValueError):
    """A sharding rule or strategy request is invalid."""


class MemoryBudgetError(StrategyError):
    """No plan fits a ``memory_budget``: ``value`` is the budget asked for (bytes per
    rank), ``least`` a lower bound of the smallest feasible budget, ``most`` a budget
    known to be feasible (the peak of the lightest plan; None when it was not planned).

    >>> e = MemoryBudgetError("too small", value=1e6, least=1.9e6, most=7.2e6)
    >>> isinstance(e, StrategyError), e.least, e.most
    (True, 1900000.0, 7200000.0)
    """

    def __init__(
        self, message: str, *, value: Any = None, least: float, most: float | None = None
    ) -> None:
        super().__init__(message, value=value)
        self.least = float(least)
        self.most = None if most is None else float(most)


class CheckpointError(MeshplanError, ValueError):
    """A checkpoint file or tensor is missing, corrupt or incompatible."""


class MissingTensorError(CheckpointError, KeyError):
    """A tensor key a checkpoint does not hold: also a ``KeyError``, so ``except KeyError``
    around ``meta[key]`` keeps working (its message prints as given, unquoted)."""

    __str__ = CheckpointError.__str__


class RuntimeShellError(MeshplanError, RuntimeError):
    """A collective failed, timed out, or ranks disagreed at run time."""


class WorkerError(RuntimeShellError):
    """A worker-pool task failed on some ranks: it raised, its worker died, or it timed out.

    ``errors`` maps each failed rank to its exception (the remote one, re-raised with the
    remote traceback as ``__cause__``); ``results`` maps the other ranks to what they
    returned.
    """

    def __init__(
        self, message: str, *, errors: Mapping[int, BaseException], results: Mapping[int, Any]
    ) -> None:
        super().__init__(message, value=dict(errors))
        self.errors = dict(errors)
        self.results = dict(results)


class WorkerDied(RuntimeShellError):
    """The worker process of a rank exited while running a task."""


class TaskTimeout(RuntimeShellError):
    """A rank did not finish its task within the task timeout."""


class RemoteError(RuntimeShellError):
    """Stands for a worker-side exception that could not travel back by pickle."""


class MergeWarning(UserWarning):
    """Like-kind collectives run one after another because the mesh lacks a flattened alias."""


class ProgramWarning(UserWarning):
    """An op of a program has no sharding rule and runs replicated."""


class BudgetWarning(UserWarning):
    """A plan was made past the planner's search budget: it may cost up to ``gap`` seconds
    more than the cheapest (``lower``: a lower bound of every plan's price, ``limit``:
    the budget)."""

    def __init__(self, message: str, *, gap: float, lower: float, limit: int) -> None:
        super().__init__(message)
        self.gap = gap
        self.lower = lower
        self.limit = limit

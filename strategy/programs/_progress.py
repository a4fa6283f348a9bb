"""Progress reports of long planning: a caller's ``progress(stage, done, total)`` callable.

Planning a whole program takes seconds to minutes on big meshes; a caller that wants to
say how far it has come passes a callable, which is called with a stage name from
:data:`PROGRESS_STAGES`, the work done in that stage and its total (0 when the total is not
known ahead). Reports are side effects of the caller's choosing: planning itself reads
nothing back.
"""

from __future__ import annotations

from collections.abc import Callable

from meshplan.errors import StrategyError

__all__ = ["PROGRESS_STAGES", "Progress", "check_progress", "report"]

#: The stages of :func:`~meshplan.strategy.plan_program`, in order: ``"trace"`` (the
#: function traced on fake tensors), ``"strategies"`` (ops whose candidate strategies are
#: built), ``"prices"`` (pairs of layouts priced with the redistribution planner),
#: ``"solve"`` (rounds of the solver: ``done`` counts them, ``total`` is 0), ``"moves"``
#: (the chosen program assembled).
PROGRESS_STAGES = ("trace", "strategies", "prices", "solve", "moves")

Progress = Callable[[str, int, int], object]


def check_progress(progress: object) -> None:
    """Raise unless ``progress`` is None or callable."""
    if progress is not None and not callable(progress):
        raise StrategyError(
            f"progress must be a callable progress(stage, done, total) or None, got "
            f"{progress!r}",
            value=progress,
        )


def report(progress: Progress | None, stage: str, done: int, total: int) -> None:
    """Tell ``progress`` (if any) that ``done`` of ``total`` units of ``stage`` are done."""
    if progress is not None:
        progress(stage, done, total)

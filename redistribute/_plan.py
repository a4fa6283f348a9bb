"""The :class:`Plan` value (steps turning one Spec into another) and ``explain(plan)``."""

from __future__ import annotations

import attrs

from meshplan.errors import PlanError
from meshplan.layout._ints import brief
from meshplan.placement import Spec, same_layout

from ._explain import explain_steps
from ._profile import CostModel
from ._steps import Step

__all__ = ["Plan", "as_plan", "explain"]


def _steps(value) -> tuple:
    try:
        steps = tuple(value)
    except TypeError:
        raise PlanError(
            f"a plan's steps are a sequence of Steps, got {brief(value)}", value=value
        ) from None
    for i, step in enumerate(steps):
        if not isinstance(step, Step):
            raise PlanError(f"plan step {i} is {brief(step)}, not a Step", value=step)
    return steps


@attrs.frozen(repr=False, cache_hash=True)
class Plan:
    """A sequence of steps turning ``src`` into ``dst`` (each step's dst is the next's src;
    the last one's holds ``dst``'s layout: :func:`~meshplan.placement.same_layout`).

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard
    >>> mesh = Mesh.create(2)
    >>> a, b = Spec(mesh, [Shard(0)], (4,)), Spec(mesh, [Replicate()], (4,))
    >>> p = Plan(a, b, (Step(0, a, b, "all_gather"),))
    >>> len(p), p.collectives
    (1, ('all_gather',))
    """

    src: Spec
    dst: Spec
    steps: tuple[Step, ...] = attrs.field(converter=_steps)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.src, Spec) or not isinstance(self.dst, Spec):
            raise PlanError(
                f"a plan goes from a Spec to a Spec, got {self.src!r} and {self.dst!r}",
                value=self,
            )
        cur = self.src
        for i, step in enumerate(self.steps):
            if step.src != cur:
                raise PlanError(
                    f"step {i} ({step}) starts from {step.src}, but the plan is at {cur}",
                    value=self,
                )
            cur = step.dst
        if cur != self.dst and not same_layout(cur, self.dst):
            raise PlanError(
                f"plan ends at {cur}, which is not its target {self.dst} and gives some rank "
                "another local tensor",
                value=self,
            )

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self):
        return iter(self.steps)

    @property
    def collectives(self) -> tuple[str, ...]:
        """The collectives the plan issues, in order (local steps left out)."""
        return tuple(s.collective for s in self.steps if s.collective is not None)

    def explain(self, model: CostModel | None = None) -> str:
        """A table of the steps, their process groups, bytes per rank, peak memory and cost
        (:func:`explain`)."""
        return explain_steps(self.src, self.dst, self.steps, model)

    def __str__(self) -> str:
        """The table of :meth:`explain` under the default cost model."""
        return self.explain()

    def __repr__(self) -> str:
        return f"Plan(src={self.src!r}, dst={self.dst!r}, steps={self.steps!r})"


def as_plan(value, what: str = "plan") -> Plan:
    """``value`` if it is a :class:`Plan`, else a PlanError naming it (for public functions
    that take a plan)."""
    if not isinstance(value, Plan):
        raise PlanError(
            f"{what} needs a Plan (from meshplan.redistribute.plan), got {value!r}", value=value
        )
    return value


def explain(plan: Plan, model: CostModel | None = None) -> str:
    """A table of ``plan``'s steps: process groups, bytes per rank, peak local memory, cost.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard, Spec
    >>> from meshplan.redistribute import plan as make_plan
    >>> mesh = Mesh.create((2, 4), ("dp", "tp"))
    >>> p = make_plan(Spec(mesh, [Shard(0), Shard(1)], (8, 8)), Spec(mesh, [Replicate(), Shard(1)], (8, 8)))
    >>> print(explain(p))  # doctest: +ELLIPSIS
    Plan f32[8,8](S(0) S(1)) -> f32[8,8](R S(1)) on Mesh((2, 4), names=('dp', 'tp'))
     #  step        placements  group  size  example group  recv/rank  sent/rank  peak/rank  cost
     0  all_gather  S(0) -> R   dp     2     (0, 4)         32 B       32 B       96 B       9.0 us
    total: 1 step (1 collective), recv 32 B/rank, peak 96 B/rank, cost 9.0 us (comm 9.0 us, compute 0.0 us)
    """
    return as_plan(plan, "explain").explain(model)

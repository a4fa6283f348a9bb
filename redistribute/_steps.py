"""Steps, the transforms a plan is made of: the :class:`Step` value, the collectives a step
runs, and the facts a step's placements decide (its reduction, its avg divisor)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from meshplan.errors import PlanError
from meshplan.layout import Mesh
from meshplan.placement import Partial, Replicate, Spec, format_placements, is_shard_like

from ._collectives import COLLECTIVES, REDUCING

__all__ = ["Step", "COLLECTIVES", "reduce_op", "grad_spec"]



def _mesh_dims(value: Sequence[int] | int, mesh: Mesh) -> tuple[int, ...]:
    """``value`` (a mesh dim, or a sequence of them: names, or indices that may be negative)
    as the indices of distinct dims of ``mesh``, in the order given."""
    if type(value) is not tuple:
        if isinstance(value, str) or hasattr(value, "__index__"):
            value = (value,)
        else:
            try:
                value = tuple(value)
            except TypeError:
                raise PlanError(
                    f"a step's mesh_dims are a mesh dim (index or name) or a sequence of "
                    f"them, got {value!r}",
                    value=value,
                ) from None
    if not value:
        raise PlanError("a step needs at least one mesh dim", value=value)
    ndim = mesh.ndim
    dims = value
    for m in value:
        if type(m) is not int or not 0 <= m < ndim:  # names and negative indices too
            dims = tuple(_dim_index(mesh, m) for m in value)
            break
    if len(dims) > 1 and len(set(dims)) != len(dims):
        raise PlanError(
            f"step mesh dims {value!r} name a mesh dim twice; list each once", value=value
        )
    return dims


def _dim_index(mesh: Mesh, m) -> int:
    try:
        return mesh.dim_index(m)
    except (ValueError, TypeError):
        raise PlanError(
            f"step mesh dim {m!r} is not a dim of {mesh} (names {mesh.names!r})", value=m
        ) from None


@attrs.frozen(init=False, repr=False)
class Step:
    """One transform: ranks grouped along ``mesh_dims`` turn ``src`` into ``dst``.

    ``collective`` names the communication (``None`` for a local step). A step merged
    onto a flattened mesh lists several ``mesh_dims`` and names the ``alias`` whose
    process group it runs on. ``avg_scale`` divides a merged sum+avg reduction by the
    product of the avg dims' sizes. The data each rank sends and receives follows from
    ``src``, ``dst`` and the groups alone (see ``meshplan.redistribute.exchange``).

    Canonical: ``mesh_dims`` given by name or negative index are kept as the dims'
    indices, so steps naming the same dims either way compare equal.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard
    >>> mesh = Mesh.create(2)
    >>> s = Step((0,), Spec(mesh, [Shard(0)], (4,)), Spec(mesh, [Replicate()], (4,)), "all_gather")
    >>> print(s)
    all_gather[d0]: S(0) -> R
    >>> Step(-1, s.src, s.dst, "all_gather") == s
    True
    """

    mesh_dims: tuple[int, ...]
    src: Spec
    dst: Spec
    collective: str | None
    alias: str | None = None
    avg_scale: int = attrs.field(init=False)

    @avg_scale.default
    def _avg_scale_of(self) -> int:
        return _avg_scale(self)

    def __init__(
        self,
        mesh_dims: Sequence[int | str] | int | str,
        src: Spec,
        dst: Spec,
        collective: str | None,
        alias: str | None = None,
    ) -> None:
        if collective is not None and collective not in COLLECTIVES:
            raise PlanError(
                f"unknown collective {collective!r}; use one of {COLLECTIVES!r} or None",
                value=collective,
            )
        if not isinstance(src, Spec) or not isinstance(dst, Spec):
            raise PlanError(
                f"a step goes from a Spec to a Spec, got {src!r} and {dst!r}", value=(src, dst)
            )
        self.__attrs_init__(_mesh_dims(mesh_dims, src.mesh), src, dst, collective, alias)
        _check(self)

    @property
    def logical_shape(self) -> tuple[int, ...]:
        return self.src.shape

    @property
    def group_dims(self) -> tuple[int, ...] | str:
        """What the step's process group is: the alias name, or the mesh dims."""
        return self.alias if self.alias is not None else self.mesh_dims

    def __str__(self) -> str:
        names = self.src.mesh.names
        where = ",".join(names[m] for m in self.mesh_dims)
        if self.alias is not None:
            where = f"{self.alias}={where}"
        return f"{self.collective or 'local'}[{where}]: {placement_change(self)}"

    def __repr__(self) -> str:
        return (
            f"Step(mesh_dims={self.mesh_dims!r}, src={self.src!r}, dst={self.dst!r}, "
            f"collective={self.collective!r}, alias={self.alias!r})"
        )


def _check(step: Step) -> None:
    """Raise :class:`PlanError` unless ``step`` (of canonical mesh dims) is one transform: the
    same tensor on one mesh before and after, placements changed on its own dims only, by
    its collective, on an alias of the mesh."""
    src, dst, dims = step.src, step.dst, step.mesh_dims
    if (
        (src.mesh is not dst.mesh and src.mesh != dst.mesh)
        or src.shape != dst.shape
        or src.dtype != dst.dtype
    ):
        raise PlanError(
            f"step from {src} to {dst}: source and target differ in mesh, shape or dtype",
            value=step,
        )
    before, after = src.placements, dst.placements
    if before is not after:  # (one mesh: as many placements on either side)
        for i, a in enumerate(before):
            b = after[i]
            if a is not b and i not in dims and a != b:
                raise PlanError(
                    f"step over mesh dims {dims} changes mesh dim {i} ({a} -> {b}); "
                    "a step may only change the placements of its own mesh dims",
                    value=step,
                )
    _check_kind(step)
    if step.alias is not None and step.alias not in src.mesh.aliases:
        raise PlanError(
            f"step names alias {step.alias!r}, which mesh {src.mesh} does not have", value=step
        )


def _check_kind(step: Step) -> None:
    """Raise :class:`PlanError` unless the step's collective can make its placement change.

    Data-moving collectives (gather, all_to_all, permute) copy values, so neither side of
    their dims may be Partial; a reduction starts Partial on every dim it reduces (with
    one op, sum and avg counting as one) and ends Replicate (all_reduce) or sharded
    (reduce_scatter). Whether the group holds the data is checked per rank when the
    step runs (``exchange``); a local step's change is checked there too.
    """
    kind = step.collective
    if kind is None:
        return
    before, after = step.src.placements, step.dst.placements
    names = step.src.mesh.names
    if kind in REDUCING:
        for m in step.mesh_dims:
            a, b = before[m], after[m]
            if not isinstance(a, Partial):
                raise PlanError(
                    f"{kind} step {step} reduces over mesh dim {names[m]!r}, which is {a} in "
                    "its source; a reduction starts Partial on every dim it reduces",
                    value=step,
                )
            if kind == "all_reduce" and not isinstance(b, Replicate):
                raise PlanError(
                    f"all_reduce step {step} ends {b} on mesh dim {names[m]!r}; an "
                    "all_reduce ends Replicate (use reduce_scatter to end sharded, a local "
                    "step to change the Partial op)",
                    value=step,
                )
            if kind == "reduce_scatter" and not is_shard_like(b):
                raise PlanError(
                    f"reduce_scatter step {step} ends {b} on mesh dim {names[m]!r}; a "
                    "reduce_scatter ends sharded on every dim it reduces (use all_reduce "
                    "to end Replicate)",
                    value=step,
                )
        reduce_op(step)  # one op per step
        return
    for m in step.mesh_dims:
        a, b = before[m], after[m]
        if isinstance(a, Partial) or isinstance(b, Partial):
            raise PlanError(
                f"{kind} step {step} turns {a} into {b} on mesh dim {names[m]!r}; an {kind} "
                "copies values, so it neither reads nor makes Partial ones (reduce with "
                "all_reduce or reduce_scatter, make Partial with a local step)",
                value=step,
            )


def _avg_scale(step: Step) -> int:
    """Divisor of a sum-reduction that also covers Partial("avg") dims (1 otherwise)."""
    if step.collective not in REDUCING:
        return 1
    scale = 1
    for m in step.mesh_dims:
        p = step.src.placements[m]
        if getattr(p, "op", None) == "avg":
            scale *= step.src.mesh.shape[m]
    return scale


def reduce_op(step: Step) -> str:
    """The reduction a reducing step performs: "sum" (then divide by ``avg_scale``), "max", "min"."""
    if not isinstance(step, Step):
        raise PlanError(f"reduce_op reads a Step, got {step!r}", value=step)
    ops = {getattr(step.src.placements[m], "op", None) for m in step.mesh_dims}
    if None in ops:
        raise PlanError(
            f"{step.collective} step {step} reduces over a mesh dim that is not Partial",
            value=step,
        )
    if ops <= {"sum", "avg"}:
        return "sum"
    if len(ops) > 1:
        raise PlanError(f"step {step} mixes Partial ops {sorted(ops)!r}", value=step)
    return ops.pop()


def placement_change(step: Step) -> str:
    """The placements of the step's own mesh dims before and after (and its avg divisor).

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Partial, Replicate
    >>> mesh = Mesh.create((2, 2))
    >>> a = Spec(mesh, [Partial("avg"), Replicate()], (4,))
    >>> placement_change(Step(0, a, Spec(mesh, [Replicate(), Replicate()], (4,)), "all_reduce"))
    'P(avg) -> R /2'
    """
    dims = step.mesh_dims
    a = format_placements([step.src.placements[m] for m in dims], _orders_for(step.src, dims))
    b = format_placements([step.dst.placements[m] for m in dims], _orders_for(step.dst, dims))
    scale = f" /{step.avg_scale}" if step.avg_scale != 1 else ""
    return f"{a} -> {b}{scale}"


def _orders_for(spec: Spec, dims: tuple[int, ...]) -> dict[int, tuple[int, ...]]:
    # Shard orders restricted to the step's dims, renumbered to positions in `dims`.
    out = {}
    for d, order in spec.shard_order.items():
        inside = tuple(dims.index(m) for m in order if m in dims)
        if len(inside) == len(order):
            out[d] = inside
    return out


def grad_spec(spec: Spec) -> Spec:
    """The layout a gradient of a value in ``spec`` takes: Partial dims replicate.

    The gradient of a partial sum (or average, max, min) is the gradient of the reduced
    value, needed in full by every rank; Shard and Replicate dims keep. The backward of a
    redistribution and of a whole program both land gradients here.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Shard
    >>> print(grad_spec(Spec(Mesh.create((2, 2)), [Partial(), Shard(0)], (4,))))
    f32[4](R S(0))
    """
    if not isinstance(spec, Spec):
        raise PlanError(f"grad_spec reads a Spec, got {spec!r}", value=spec)
    if not spec.is_partial:
        return spec
    placements = [Replicate() if isinstance(p, Partial) else p for p in spec.placements]
    return Spec(spec.mesh, placements, spec.shape, spec.dtype, spec.shard_order)

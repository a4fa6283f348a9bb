"""The layout of a whole mesh: :class:`MeshLayout`, one :class:`Axis` per mesh dim."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import attrs

from meshplan.errors import MeshError

from ._axis import (
    Axis,
    Mode,
    axis_of,
    complement,
    injective,
    int_tuple,
    read_int,
    row_major_strides,
)
from ._compose import compose
from ._frozen import identity_first_eq
from ._ints import as_int

__all__ = ["MeshLayout"]


def _axes_tuple(value) -> tuple[Axis, ...]:
    if isinstance(value, Axis):
        return (value,)
    try:
        axes = tuple(value)
    except TypeError:
        raise MeshError(
            f"a mesh layout takes a sequence of Axis values, got {value!r}", value=value
        ) from None
    for a in axes:
        if not isinstance(a, Axis):
            raise MeshError(f"mesh layout axes must be Axis values, got {a!r}", value=a)
    return axes


@identity_first_eq
@attrs.frozen(repr=False, cache_hash=True)
class MeshLayout:
    """The layout of a whole mesh: one :class:`Axis` per mesh dimension.

    >>> lay = MeshLayout.row_major((2, 3))
    >>> lay.shape, lay.numel(), lay.cosize()
    ((2, 3), 6, 6)
    >>> lay.global_ranks((1,), 6)
    ((0, 1, 2), (3, 4, 5))
    """

    axes: tuple[Axis, ...] = attrs.field(converter=_axes_tuple)
    shape: tuple[int, ...] = attrs.field(init=False, eq=False)
    _all_modes: tuple[Mode, ...] = attrs.field(init=False, eq=False, repr=False)

    @shape.default
    def _shape(self) -> tuple[int, ...]:
        return tuple(a.size() for a in self.axes)

    @_all_modes.default
    def _modes(self) -> tuple[Mode, ...]:
        return tuple(m for a in self.axes for m in a.modes)

    @classmethod
    def row_major(cls, shape: Sequence[int] | int) -> MeshLayout:
        shape = int_tuple(shape)
        return cls(
            tuple(Axis.of((s,), (d,)) for s, d in zip(shape, row_major_strides(shape), strict=True))
        )

    @property
    def ndim(self) -> int:
        return len(self.axes)

    def numel(self) -> int:
        return math.prod(self.shape)

    def cosize(self) -> int:
        return self.collapse().cosize()

    def _dims(self, dims) -> tuple[int, ...]:
        """``dims`` (one dim or a sequence of them) as a tuple of dims of this layout."""
        one = as_int(dims)
        items = (dims,) if one is not None or isinstance(dims, bool) else dims
        try:
            items = tuple(items)
        except TypeError:
            raise MeshError(
                f"expected a mesh dim or a sequence of mesh dims, got {dims!r}", value=dims
            ) from None
        out = []
        for d in items:
            i = read_int(d, f"each mesh dim in {dims!r}")
            if not 0 <= i < len(self.axes):
                raise MeshError(
                    f"mesh dim {i} is out of range for a {len(self.axes)}-dim layout "
                    f"(dims 0..{len(self.axes) - 1})",
                    value=dims,
                )
            if i in out:
                raise MeshError(f"mesh dim {i} is listed twice in {dims!r}", value=dims)
            out.append(i)
        return tuple(out)

    def modes(self, dims: Sequence[int] | None = None) -> tuple[Mode, ...]:
        """The modes of all (or the chosen) axes, in dim order."""
        if dims is None:
            return self._all_modes
        return tuple(m for i in self._dims(dims) for m in self.axes[i].modes)

    def collapse(self, dims: Sequence[int] | None = None) -> Axis:
        """All (or the chosen) axes as one flattened axis, in the given dim order."""
        return axis_of(self.modes(dims))

    def complement(self, world: int) -> Axis:
        return complement(self.modes(), world)

    def is_injective(self) -> bool:
        return injective(self.modes())

    def compose(self, inner: Axis) -> Axis:
        return compose(self.collapse(), inner)

    def global_ranks(
        self, axis_or_dims: Axis | int | Sequence[int], world: int
    ) -> tuple[tuple[int, ...], ...]:
        """Every group of layout offsets along one or more dims (or along an :class:`Axis`,
        such as a flattened dim's layout) in a world of ``world`` indices.

        >>> lay = MeshLayout.row_major((2, 3))
        >>> lay.global_ranks(0, 6), lay.global_ranks(Axis.of((2, 3), (3, 1)), 6)
        (((0, 3), (1, 4), (2, 5)), ((0, 1, 2, 3, 4, 5),))
        """
        if isinstance(axis_or_dims, Axis):
            sub = axis_or_dims
        else:
            sub = self.collapse(self._dims(axis_or_dims))
        inner = sub.offsets()
        return tuple(
            tuple(base + o for o in inner) for base in complement(sub.modes, world).offsets()
        )

    def __iter__(self) -> Iterator[Axis]:
        return iter(self.axes)

    def __len__(self) -> int:
        return len(self.axes)

    def __str__(self) -> str:
        return "(" + ", ".join(str(a) for a in self.axes) + ")"

    def __repr__(self) -> str:
        return f"MeshLayout(axes={self.axes!r})"

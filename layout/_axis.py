"""CuTe-style integer layouts in lexicographic order: :class:`Axis` and :class:`MeshLayout`.

A layout maps a linear index ``i`` in ``[0, size)`` to an offset: ``i`` is split into
coordinates over ``sizes`` (last mode fastest, i.e. row-major) and the offset is the
dot product of those coordinates with ``strides``. Offsets index a mesh's rank map.

Canonical form: an :class:`Axis` is coalesced (adjacent modes that chain merge, size-1
modes vanish), so layouts that enumerate the same offsets in the same order compare
equal. A size-1 axis has no modes at all.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator, Sequence
from itertools import product

import attrs

from meshplan.errors import MeshError

from ._frozen import identity_first_eq
from ._ints import as_int, brief

__all__ = ["Axis", "MeshLayout", "coalesce", "complement", "compose", "modes_of"]

Mode = tuple[int, int]  # (size, stride)


def _index(value, what: str = "value") -> int:
    """``value`` as an int (Python or numpy ints; not bool), or a MeshError naming it."""
    i = as_int(value)
    if i is None:
        raise MeshError(f"{what} must be an int, got {brief(value)}", value=value)
    return i


def _int_tuple(value: Iterable[int] | int) -> tuple[int, ...]:
    items = value
    if not isinstance(value, tuple | list):
        i = as_int(value)  # an int, a numpy int, a 0-d array
        if i is not None:
            return (i,)
        try:
            items = None if isinstance(value, str | bytes) else tuple(value)
        except (TypeError, RecursionError):
            items = None
        if items is None:
            raise MeshError(
                f"layout sizes and strides are ints or tuples of ints, got {brief(value)}", value=value
            )
    return tuple(_index(v, "a layout size or stride") for v in items)


def _modes_tuple(modes: Iterable[Mode]) -> tuple[Mode, ...]:
    """``modes`` as ``((size, stride), ...)`` of ints (size >= 1, stride >= 0), or a
    MeshError naming the bad one."""
    try:
        items = tuple(modes)
    except TypeError:
        raise MeshError(
            f"layout modes are (size, stride) pairs, got {brief(modes)}", value=modes
        ) from None
    out = []
    for m in items:
        try:
            size, stride = m
        except (TypeError, ValueError):
            raise MeshError(
                f"a layout mode is a (size, stride) pair, got {brief(m)} in {brief(modes)}", value=m
            ) from None
        size, stride = _index(size, "a mode's size"), _index(stride, "a mode's stride")
        if size < 1 or stride < 0:
            raise MeshError(f"layout mode {brief(m)} needs a size >= 1 and a stride >= 0", value=m)
        out.append((size, stride))
    return tuple(out)


def coalesce(modes: Iterable[Mode]) -> tuple[Mode, ...]:
    """Normalize modes (lexicographic order): drop size-1 modes, merge chaining neighbours.

    Two neighbours ``(s0, d0), (s1, d1)`` chain when ``d0 == s1 * d1``: together they
    enumerate ``(s0 * s1, d1)``.

    >>> coalesce([(2, 4), (4, 1)])
    ((8, 1),)
    >>> coalesce([(2, 1), (1, 7), (2, 4)])
    ((2, 1), (2, 4))
    """
    out: list[Mode] = []
    for size, stride in _modes_tuple(modes):
        if size == 1:
            continue
        if out and out[-1][1] == size * stride:
            prev_size, _ = out.pop()
            out.append((prev_size * size, stride))
        else:
            out.append((size, stride))
    return tuple(out)


@identity_first_eq
@attrs.frozen(repr=False, cache_hash=True)
class Axis:
    """One mesh dimension as a normalized CuTe layout (last mode fastest).

    >>> Axis.of(sizes=(2, 4), strides=(4, 1))   # coalesces to one mode
    Axis(sizes=(8,), strides=(1,))
    >>> Axis.of(sizes=(2, 2), strides=(4, 1)).offsets()
    (0, 1, 4, 5)
    >>> str(Axis.of((2, 2), (4, 1)))
    '(2,2):(4,1)'
    """

    sizes: tuple[int, ...] = attrs.field(converter=_int_tuple)
    strides: tuple[int, ...] = attrs.field(converter=_int_tuple)
    modes: tuple[Mode, ...] = attrs.field(init=False, eq=False, repr=False)
    """The ``(size, stride)`` pairs, slowest first."""

    def __attrs_post_init__(self) -> None:
        if len(self.sizes) != len(self.strides):
            raise MeshError(
                f"sizes {self.sizes!r} and strides {self.strides!r} differ in length; "
                "give one stride per size",
                value=self,
            )
        if any(s < 1 for s in self.sizes) or any(d < 0 for d in self.strides):
            raise MeshError(
                f"layout {self.sizes!r}:{self.strides!r} has a size below 1 or a negative "
                "stride; sizes must be >= 1 and strides >= 0",
                value=self,
            )
        modes = coalesce(zip(self.sizes, self.strides, strict=True))
        object.__setattr__(self, "sizes", tuple(m[0] for m in modes))
        object.__setattr__(self, "strides", tuple(m[1] for m in modes))
        object.__setattr__(self, "modes", modes)

    @classmethod
    def of(cls, sizes: Iterable[int] | int, strides: Iterable[int] | int | None = None) -> Axis:
        """Build an axis; ``strides`` default to row-major (suffix products of ``sizes``)."""
        sizes = _int_tuple(sizes)
        if strides is None:
            strides = row_major_strides(sizes)
        return cls(sizes, strides)

    @classmethod
    def from_modes(cls, modes: Iterable[Mode]) -> Axis:
        """Build an axis from ``(size, stride)`` pairs, slowest first (cached for int modes).

        >>> Axis.from_modes([(2, 4), (4, 1)]) is Axis.from_modes(((2, 4), (4, 1)))
        True
        """
        return _axis_of(_modes_tuple(modes))

    def size(self) -> int:
        """Number of indices (ranks) the axis enumerates."""
        return math.prod(self.sizes)

    def cosize(self) -> int:
        """One past the largest offset."""
        return sum((s - 1) * d for s, d in self.modes) + 1

    def offset(self, index: int) -> int:
        """The offset of linear ``index`` (row-major over the modes), ``0 <= index < size``."""
        index = _index(index, "a layout index")
        if not 0 <= index < self.size():
            raise MeshError(
                f"index {index} is outside layout {self} (indices 0..{self.size() - 1})",
                value=index,
            )
        out = 0
        for size, stride in reversed(self.modes):
            index, c = divmod(index, size)
            out += c * stride
        return out

    def offsets(self, base: int = 0) -> tuple[int, ...]:
        """Every offset (plus ``base``) in index order: size of the axis, not of the world."""
        return tuple(self._offsets(_index(base, "an offsets base")))

    def _offsets(self, base: int) -> Sequence[int]:
        modes = self.modes
        if not modes:
            return (base,)
        starts: Sequence[int] = (base,)
        for size, stride in modes[:-1]:
            steps = range(0, size * stride, stride) if stride else (0,) * size
            starts = [o + c for o in starts for c in steps]
        size, stride = modes[-1]
        if not stride:
            return [o for o in starts for _ in range(size)]
        if len(starts) == 1:
            return range(base, base + size * stride, stride)
        out: list[int] = []
        for o in starts:
            out.extend(range(o, o + size * stride, stride))
        return out

    def is_injective(self) -> bool:
        """True when no two indices share an offset (the modes do not overlap)."""
        return _is_injective(self.modes)

    def __str__(self) -> str:
        if not self.sizes:
            return "1:0"
        if len(self.sizes) == 1:
            return f"{self.sizes[0]}:{self.strides[0]}"
        return f"({','.join(map(str, self.sizes))}):({','.join(map(str, self.strides))})"

    def __repr__(self) -> str:
        return f"Axis(sizes={self.sizes!r}, strides={self.strides!r})"


def _axes_tuple(value) -> tuple:
    if isinstance(value, Axis):
        return (value,)
    try:
        return tuple(value)
    except TypeError:
        raise MeshError(
            f"a mesh layout takes a sequence of Axis values, got {value!r}", value=value
        ) from None


@functools.lru_cache(maxsize=8192)
def _axis_of(modes: tuple[Mode, ...]) -> Axis:
    return Axis(tuple(m[0] for m in modes), tuple(m[1] for m in modes))


def row_major_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    """Suffix products: the strides of a row-major (lexicographic) layout.

    >>> row_major_strides((2, 3, 4))
    (12, 4, 1)
    """
    sizes = _int_tuple(sizes)
    for s in sizes:
        if s < 0:
            raise MeshError(
                f"row_major_strides: sizes {sizes!r} hold the negative size {s!r}; sizes are "
                "ints >= 0",
                value=sizes,
            )
    out = []
    acc = 1
    for s in reversed(sizes):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def _spans_nest(modes: tuple[Mode, ...]) -> bool:
    """Whether the moving modes (size > 1, stride != 0), sorted by stride, each have a
    stride that is a multiple of the span (stride times size) of the one before."""
    live = sorted((d, s) for s, d in modes if s > 1 and d != 0)
    return all(live[i + 1][0] % (live[i][0] * live[i][1]) == 0 for i in range(len(live) - 1))


@functools.lru_cache(maxsize=8192)
def _is_injective(modes: tuple[Mode, ...]) -> bool:
    if any(d == 0 for s, d in modes if s > 1):
        return False
    # Sorted by stride, each mode must start at or beyond the span of all faster modes
    # and be a multiple of it, otherwise two coordinates reach the same offset... unless
    # strides interleave without collision (e.g. 2:3 and 3:2 hit 0,2,3,4,5,7 — injective).
    return _spans_nest(modes) or _brute_injective(modes)


def _brute_injective(modes: Sequence[Mode]) -> bool:
    n = math.prod(s for s, _ in modes)
    if n > 1 << 20:
        raise MeshError(
            f"cannot decide whether layout modes {tuple(modes)!r} overlap: they interleave "
            "irregularly over more than 2**20 indices; use layouts whose sorted strides divide",
            value=tuple(modes),
        )
    seen = set()
    for coord in product(*(range(s) for s, _ in modes)):
        off = sum(c * d for c, (_, d) in zip(coord, modes, strict=True))
        if off in seen:
            return False
        seen.add(off)
    return True


def complement(modes: Iterable[Mode], world: int) -> Axis:
    """The layout that, together with ``modes``, enumerates ``range(world)`` exactly once.

    Raises :class:`MeshError` when no such layout exists (overlapping modes, or modes that
    do not tile ``world``).

    >>> complement([(2, 1)], 8)            # pairs (0,1): the other index runs 0,2,4,6
    Axis(sizes=(4,), strides=(2,))
    >>> complement([(2, 4), (2, 1)], 8)
    Axis(sizes=(2,), strides=(2,))
    """
    n = as_int(world)
    if n is None or n < 1:
        raise MeshError(f"world size must be an int >= 1, got {world!r}", value=world)
    return _complement(_modes_tuple(modes), n)


@functools.lru_cache(maxsize=8192)
def _complement(modes: tuple[Mode, ...], world: int) -> Axis:
    live = sorted((d, s) for s, d in modes if s > 1)
    out: list[Mode] = []
    current = 1
    for stride, size in live:
        if stride == 0:
            raise MeshError(
                f"layout modes {modes!r} overlap: a mode of size {size} has stride 0, so "
                "all its indices name one rank; a mesh dim must not repeat ranks",
                value=modes,
            )
        if stride % current != 0:
            raise MeshError(
                f"layout modes {modes!r} overlap or interleave (stride {stride} is not "
                f"a multiple of {current}); a mesh dim must tile the world without overlap",
                value=modes,
            )
        if stride > current:
            out.append((stride // current, current))
        current = stride * size
    if world % current != 0:
        raise MeshError(
            f"layout modes {modes!r} span {current} ranks, which does not divide the "
            f"world of {world}; pick sizes whose product divides the world size",
            value=modes,
        )
    if world > current:
        out.append((world // current, current))
    out.sort(key=lambda m: -m[1])
    return Axis.from_modes(out)


def compose(outer: Axis, inner: Axis) -> Axis:
    """``outer ∘ inner``: index ``i`` maps to ``outer.offset(inner.offset(i))``.

    Mode by mode when ``inner``'s strides and sizes divide ``outer``'s modes (CuTe's
    admissible case, O(modes)); otherwise by enumerating the ``inner.size()`` offsets.
    Raises :class:`MeshError` when the composite is not a layout.

    >>> compose(Axis.of((2, 4), (1, 2)), Axis.of(2, 4))   # every 4th index of outer
    Axis(sizes=(2,), strides=(1,))
    >>> compose(Axis.of((2, 3), (1, 2)), Axis.of(2, 2))   # offsets 0, 4: not admissible
    Axis(sizes=(2,), strides=(4,))
    """
    for value in (outer, inner):
        if not isinstance(value, Axis):
            raise MeshError(f"compose takes two Axis values, got {value!r}", value=value)
    if inner.cosize() > outer.size():
        raise MeshError(
            f"{inner} reaches index {inner.cosize() - 1}, outside {outer} (indices "
            f"0..{outer.size() - 1}); compose needs the inner layout within the outer's indices",
            value=(outer, inner),
        )
    result: list[Mode] = []
    try:
        # mode by mode only when inner's moving modes, by stride, each start at a multiple
        # of the span of the faster ones: their offsets then add up digit by digit in
        # outer's mixed radix; else two of them may carry across one of outer's mode
        # boundaries, even when inner is injective ((2,3):(3,2) reaches 3 + 4)
        if not _spans_nest(inner.modes):
            raise _NotAdmissible
        for size, stride in inner.modes:
            result.extend(_compose_mode(outer, size, stride))
    except _NotAdmissible:
        pass
    else:
        return Axis.from_modes(result)
    offsets = [outer.offset(inner.offset(i)) for i in range(inner.size())]
    modes = modes_of(offsets)
    if modes is None:
        raise MeshError(
            f"{outer} composed with {inner} is not a layout (its offsets "
            f"{_short(offsets)} are not a mixed-radix progression); choose sizes that split "
            "the layout's modes evenly",
            value=(outer, inner),
        )
    return Axis.from_modes(modes)


def modes_of(offsets: Sequence[int]) -> tuple[Mode, ...] | None:
    """The coalesced modes that enumerate ``offsets`` in order, or None if no layout does.

    >>> modes_of([0, 1, 4, 5]), modes_of([0, 1, 3])
    (((2, 4), (2, 1)), None)
    """
    out: list[Mode] = []
    offsets = list(offsets)
    while len(offsets) > 1:
        if offsets[0] != 0:
            return None
        n, d = len(offsets), offsets[1]
        run = next((i for i in range(n) if offsets[i] != i * d), n)
        if n % run or d < 0:
            return None
        for j in range(0, n, run):
            if any(offsets[j + i] != offsets[j] + i * d for i in range(run)):
                return None
        out.append((run, d))
        offsets = offsets[::run]
    if offsets and offsets[0] != 0:
        return None
    return tuple(reversed(out))


def _short(values: Sequence[int], limit: int = 8) -> str:
    if len(values) <= limit:
        return repr(tuple(values))
    return f"({', '.join(map(str, values[:limit]))}, ...)"


class _NotAdmissible(Exception):
    pass


def _compose_mode(outer: Axis, size: int, stride: int) -> list[Mode]:
    if stride == 0 or size == 1:
        return [(size, 0)]
    pieces: list[Mode] = []  # fastest first while walking
    rest_stride, rest_size = stride, size
    for osize, ostride in reversed(outer.modes):
        if rest_stride >= osize:
            if rest_stride % osize != 0:
                break
            rest_stride //= osize
            continue
        if osize % rest_stride != 0:
            break
        avail = osize // rest_stride
        if rest_size <= avail:
            pieces.append((rest_size, ostride * rest_stride))
            rest_size = 1
            break
        if rest_size % avail != 0:
            break
        pieces.append((avail, ostride * rest_stride))
        rest_size //= avail
        rest_stride = 1
    if rest_size != 1:
        raise _NotAdmissible
    return list(reversed(pieces))


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

    def __attrs_post_init__(self) -> None:
        for a in self.axes:
            if not isinstance(a, Axis):
                raise MeshError(f"mesh layout axes must be Axis values, got {a!r}", value=a)
        object.__setattr__(self, "shape", tuple(a.size() for a in self.axes))
        object.__setattr__(self, "_all_modes", tuple(m for a in self.axes for m in a.modes))

    @classmethod
    def row_major(cls, shape: Sequence[int] | int) -> MeshLayout:
        shape = _int_tuple(shape)
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
            i = _index(d, f"each mesh dim in {dims!r}")
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
        return _axis_of(self.modes(dims))

    def complement(self, world: int) -> Axis:
        return complement(self.modes(), world)

    def is_injective(self) -> bool:
        return _is_injective(self.modes())

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

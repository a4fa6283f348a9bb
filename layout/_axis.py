"""CuTe-style integer layouts in lexicographic order: the :class:`Axis` value.

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
from collections.abc import Iterable, Sequence
from itertools import product

import attrs

from meshplan.errors import MeshError

from ._frozen import identity_first_eq
from ._ints import as_int, brief

__all__ = [
    "Axis",
    "Mode",
    "axis_of",
    "coalesce",
    "complement",
    "injective",
    "int_tuple",
    "read_int",
    "row_major_strides",
    "spans_nest",
]

Mode = tuple[int, int]  # (size, stride)


def read_int(value, what: str = "value") -> int:
    """``value`` as an int (Python or numpy ints; not bool), or a MeshError naming it."""
    i = as_int(value)
    if i is None:
        raise MeshError(f"{what} must be an int, got {brief(value)}", value=value)
    return i


def int_tuple(value: Iterable[int] | int) -> tuple[int, ...]:
    """Layout sizes or strides (an int, or a sequence of ints) as a tuple of ints."""
    if type(value) is tuple and all(type(v) is int for v in value):
        return value
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
    return tuple(read_int(v, "a layout size or stride") for v in items)


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
        size, stride = read_int(size, "a mode's size"), read_int(stride, "a mode's stride")
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
    return _coalesced(_modes_tuple(modes))


def _coalesced(modes: Iterable[Mode]) -> tuple[Mode, ...]:
    """:func:`coalesce` of modes already read as ints."""
    out: list[Mode] = []
    for size, stride in modes:
        if size == 1:
            continue
        if out and out[-1][1] == size * stride:
            prev_size, _ = out.pop()
            out.append((prev_size * size, stride))
        else:
            out.append((size, stride))
    return tuple(out)


@identity_first_eq
@attrs.frozen(init=False, repr=False)
class Axis:
    """One mesh dimension as a normalized CuTe layout (last mode fastest).

    Built coalesced (see :func:`coalesce`): equal offsets in equal order give equal axes.

    >>> Axis.of(sizes=(2, 4), strides=(4, 1))   # coalesces to one mode
    Axis(sizes=(8,), strides=(1,))
    >>> Axis.of(sizes=(2, 2), strides=(4, 1)).offsets()
    (0, 1, 4, 5)
    >>> str(Axis.of((2, 2), (4, 1)))
    '(2,2):(4,1)'
    """

    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    modes: tuple[Mode, ...] = attrs.field(init=False, eq=False, repr=False)
    """The ``(size, stride)`` pairs, slowest first."""
    _hash: int = attrs.field(init=False, eq=False, repr=False)

    @modes.default
    def _modes(self) -> tuple[Mode, ...]:
        return tuple(zip(self.sizes, self.strides, strict=True))

    @_hash.default
    def _hash_of_fields(self) -> int:
        return hash((self.sizes, self.strides))

    def __init__(self, sizes: Iterable[int] | int, strides: Iterable[int] | int) -> None:
        sizes, strides = int_tuple(sizes), int_tuple(strides)
        if len(sizes) != len(strides):
            raise MeshError(
                f"sizes {sizes!r} and strides {strides!r} differ in length; "
                "give one stride per size",
                value=(sizes, strides),
            )
        if any(s < 1 for s in sizes) or any(d < 0 for d in strides):
            raise MeshError(
                f"layout {sizes!r}:{strides!r} has a size below 1 or a negative "
                "stride; sizes must be >= 1 and strides >= 0",
                value=(sizes, strides),
            )
        modes = _coalesced(zip(sizes, strides, strict=True))
        self.__attrs_init__(tuple(m[0] for m in modes), tuple(m[1] for m in modes))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        return (Axis, (self.sizes, self.strides))

    @classmethod
    def of(cls, sizes: Iterable[int] | int, strides: Iterable[int] | int | None = None) -> Axis:
        """Build an axis; ``strides`` default to row-major (suffix products of ``sizes``)."""
        sizes = int_tuple(sizes)
        if strides is None:
            strides = row_major_strides(sizes)
        return cls(sizes, strides)

    @classmethod
    def from_modes(cls, modes: Iterable[Mode]) -> Axis:
        """Build an axis from ``(size, stride)`` pairs, slowest first (cached for int modes).

        >>> Axis.from_modes([(2, 4), (4, 1)]) is Axis.from_modes(((2, 4), (4, 1)))
        True
        """
        return axis_of(_modes_tuple(modes))

    def size(self) -> int:
        """Number of indices (ranks) the axis enumerates."""
        return math.prod(self.sizes)

    def cosize(self) -> int:
        """One past the largest offset."""
        return sum((s - 1) * d for s, d in self.modes) + 1

    def offset(self, index: int) -> int:
        """The offset of linear ``index`` (row-major over the modes), ``0 <= index < size``."""
        index = read_int(index, "a layout index")
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
        return tuple(self._offsets(read_int(base, "an offsets base")))

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
        return injective(self.modes)

    def __str__(self) -> str:
        if not self.sizes:
            return "1:0"
        if len(self.sizes) == 1:
            return f"{self.sizes[0]}:{self.strides[0]}"
        return f"({','.join(map(str, self.sizes))}):({','.join(map(str, self.strides))})"

    def __repr__(self) -> str:
        return f"Axis(sizes={self.sizes!r}, strides={self.strides!r})"


@functools.lru_cache(maxsize=8192)
def axis_of(modes: tuple[Mode, ...]) -> Axis:
    """The axis of modes already read as ints (cached: equal modes give one shared axis)."""
    return Axis(tuple(m[0] for m in modes), tuple(m[1] for m in modes))


def row_major_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    """Suffix products: the strides of a row-major (lexicographic) layout.

    >>> row_major_strides((2, 3, 4))
    (12, 4, 1)
    """
    sizes = int_tuple(sizes)
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


def spans_nest(modes: tuple[Mode, ...]) -> bool:
    """Whether the moving modes (size > 1, stride != 0), sorted by stride, each have a
    stride that is a multiple of the span (stride times size) of the one before."""
    live = sorted((d, s) for s, d in modes if s > 1 and d != 0)
    return all(live[i + 1][0] % (live[i][0] * live[i][1]) == 0 for i in range(len(live) - 1))


@functools.lru_cache(maxsize=8192)
def injective(modes: tuple[Mode, ...]) -> bool:
    """Whether no two indices of the int ``modes`` reach the same offset."""
    if any(d == 0 for s, d in modes if s > 1):
        return False
    # Sorted by stride, each mode must start at or beyond the span of all faster modes
    # and be a multiple of it, otherwise two coordinates reach the same offset... unless
    # strides interleave without collision (e.g. 2:3 and 3:2 hit 0,2,3,4,5,7 — injective).
    return spans_nest(modes) or _brute_injective(modes)


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

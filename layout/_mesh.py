"""The :class:`Mesh` value: a layout over a rank map, with names and flattened aliases."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from meshplan.errors import MeshError

from ._axis import Axis, MeshLayout, complement, compose, row_major_strides
from ._frozen import FrozenMap, frozen_map

__all__ = ["Mesh", "flatten", "unflatten", "DimKey"]

DimKey = int | str
RankMap = range | tuple[int, ...]


def _rank_map(value: Iterable[int]) -> RankMap:
    if isinstance(value, range):
        return value
    return tuple(int(r) for r in value)


def _names(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    return tuple(value)


@attrs.frozen(repr=False, cache_hash=True)
class Mesh:
    """A device mesh: an N-D layout over a rank map, with dim names and flattened aliases.

    ``ranks[i]`` is the global rank at layout offset ``i``; the layout's axes pick which
    offsets form each mesh dim. A sliced mesh keeps the root's rank map and so stands for
    the whole family of such submeshes (``groups()`` lists them all);
    :meth:`submesh` picks the one instance containing a given rank.

    >>> mesh = Mesh.create((2, 2, 2), names=("a", "b", "c"))
    >>> mesh["a", "c"].groups()
    ((0, 1, 4, 5), (2, 3, 6, 7))
    >>> mesh.group_of(3, "c"), mesh.coordinate(6)
    ((2, 3), (1, 1, 0))
    >>> flat = mesh.flatten(("a", "c"), "ac")
    >>> flat["ac"].groups()
    ((0, 1, 4, 5), (2, 3, 6, 7))
    >>> print(flat)
    Mesh((2, 2, 2), names=('a', 'b', 'c'), aliases=('ac',))
    """

    layout: MeshLayout
    ranks: RankMap = attrs.field(converter=_rank_map)
    names: tuple[str, ...] = attrs.field(converter=_names)
    aliases: FrozenMap[str, Axis] = attrs.field(converter=frozen_map, factory=FrozenMap)
    device_type: str = "cpu"
    _inverse: dict[int, int] | None = attrs.field(
        default=None, init=False, eq=False, hash=False, repr=False
    )

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.layout, MeshLayout):
            raise MeshError(f"layout must be a MeshLayout, got {self.layout!r}", value=self.layout)
        ndim = self.layout.ndim
        if len(self.names) != ndim:
            raise MeshError(
                f"mesh of shape {self.layout.shape} needs {ndim} names, got {self.names!r}",
                value=self.names,
            )
        for n in self.names:
            if not isinstance(n, str) or not n:
                raise MeshError(f"mesh dim names must be non-empty strings, got {n!r}", value=n)
        if len(set(self.names)) != len(self.names):
            dup = sorted({n for n in self.names if self.names.count(n) > 1})
            raise MeshError(
                f"duplicate mesh dim names {dup!r} in {self.names!r}; give each dim its own name",
                value=self.names,
            )
        world = len(self.ranks)
        if isinstance(self.ranks, tuple):
            if len(set(self.ranks)) != world:
                seen: set[int] = set()
                dup = next(r for r in self.ranks if r in seen or seen.add(r))
                raise MeshError(
                    f"rank map repeats rank {dup}; every rank may appear once", value=self.ranks
                )
            if any(r < 0 for r in self.ranks):
                raise MeshError(f"rank map holds a negative rank: {self.ranks!r}", value=self.ranks)
        elif world and (self.ranks.start < 0 or self.ranks.stop < 0 and self.ranks.step > 0):
            raise MeshError(f"rank map holds a negative rank: {self.ranks!r}", value=self.ranks)
        modes = self.layout.modes()
        if not self.layout.is_injective():
            raise MeshError(
                f"mesh layout {self.layout} overlaps: two coordinates name the same rank; "
                "mesh dims must not share ranks",
                value=self.layout,
            )
        complement(modes, world)  # raises if the layout does not tile the rank map
        for alias, axis in self.aliases.items():
            if not isinstance(axis, Axis):
                raise MeshError(f"alias {alias!r} must map to an Axis, got {axis!r}", value=axis)
            if alias in self.names:
                raise MeshError(
                    f"alias {alias!r} clashes with a mesh dim name of {self.names!r}; "
                    "pick another name",
                    value=alias,
                )
            if not axis.is_injective():
                raise MeshError(f"alias {alias!r} layout {axis} overlaps itself", value=axis)
            complement(axis.modes, world)

    # -- construction -----------------------------------------------------------------

    @classmethod
    def create(
        cls,
        shape: Sequence[int] | int,
        names: Sequence[str] | None = None,
        ranks: Iterable[int] | None = None,
        device_type: str = "cpu",
    ) -> Mesh:
        """A row-major mesh of ``shape`` over ``ranks`` (default ``range(prod(shape))``).

        ``ranks`` may be any permutation or any slice of a bigger world.

        >>> Mesh.create((2, 3), ("dp", "tp"), ranks=range(6, 12)).groups("tp")
        ((6, 7, 8), (9, 10, 11))
        """
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        for s in shape:
            if not isinstance(s, int) or s < 1:
                raise MeshError(
                    f"mesh shape {shape!r} has size {s!r}; every size must be an int >= 1",
                    value=shape,
                )
        numel = math.prod(shape)
        if names is None:
            names = tuple(f"d{i}" for i in range(len(shape)))
        if ranks is None:
            ranks = range(numel)
        ranks = _rank_map(ranks)
        if len(ranks) != numel:
            raise MeshError(
                f"rank map has {len(ranks)} ranks but mesh shape {shape!r} needs {numel}; "
                "pass exactly prod(shape) ranks",
                value=ranks,
            )
        layout = MeshLayout(Axis.of((s,), (d,)) for s, d in zip(shape, row_major_strides(shape)))
        return cls(layout, ranks, tuple(names), FrozenMap(), device_type)

    # -- intrinsic facts --------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.shape

    @property
    def ndim(self) -> int:
        return self.layout.ndim

    @property
    def world_size(self) -> int:
        """Number of ranks in the rank map (the root world this mesh lives in)."""
        return len(self.ranks)

    def size(self, dim: DimKey | None = None) -> int:
        """Number of ranks in one instance of this mesh, or along ``dim``."""
        if dim is None:
            return self.layout.numel()
        return self.axis(dim).size()

    def dim_index(self, dim: DimKey) -> int:
        """The index of a mesh dim given by name or (possibly negative) index."""
        if isinstance(dim, bool) or not isinstance(dim, int | str):
            raise MeshError(f"mesh dims are names or ints, got {dim!r}", value=dim)
        if isinstance(dim, str):
            if dim not in self.names:
                hint = " (an alias: slice it with mesh[name])" if dim in self.aliases else ""
                raise MeshError(
                    f"unknown mesh dim {dim!r}{hint}; known dims are {self.names!r}", value=dim
                )
            return self.names.index(dim)
        if not -self.ndim <= dim < self.ndim:
            raise MeshError(
                f"mesh dim {dim} out of range for a {self.ndim}-D mesh {self.names!r}", value=dim
            )
        return dim % self.ndim

    def axis(self, dim: DimKey) -> Axis:
        """The layout of one mesh dim or alias."""
        if isinstance(dim, str) and dim in self.aliases:
            return self.aliases[dim]
        return self.layout.axes[self.dim_index(dim)]

    def _resolve(self, dims: DimKey | Sequence[DimKey] | None) -> tuple[tuple[str, Axis], ...]:
        if dims is None:
            return tuple(zip(self.names, self.layout.axes, strict=True))
        if isinstance(dims, int | str):
            dims = (dims,)
        out = []
        for d in dims:
            if isinstance(d, str) and d in self.aliases:
                out.append((d, self.aliases[d]))
            else:
                i = self.dim_index(d)
                out.append((self.names[i], self.layout.axes[i]))
        names = [n for n, _ in out]
        if len(set(names)) != len(names):
            raise MeshError(
                f"mesh dims {tuple(dims)!r} name a dim twice; each dim may appear once",
                value=tuple(dims),
            )
        if not Axis.from_modes(m for _, a in out for m in a.modes).is_injective():
            raise MeshError(
                f"mesh dims {tuple(dims)!r} overlap (an alias and one of its dims?); "
                "choose dims that share no ranks",
                value=tuple(dims),
            )
        return tuple(out)

    def alias_for(self, dims: Sequence[DimKey]) -> str | None:
        """The name of an alias that flattens exactly ``dims`` in this order, if any.

        >>> m = Mesh.create((2, 2, 2), ("a", "b", "c")).flatten(("a", "c"), "ac")
        >>> m.alias_for(("a", "c")), m.alias_for((0, 1))
        ('ac', None)
        """
        target = Axis.from_modes(m for _, a in self._resolve(dims) for m in a.modes)
        for name, axis in self.aliases.items():
            if axis == target:
                return name
        return None

    # -- slicing and flattening -------------------------------------------------------

    def __getitem__(self, dims: DimKey | Sequence[DimKey]) -> Mesh:
        """The submesh family along ``dims`` (names, indices or aliases, any order)."""
        chosen = self._resolve(dims)
        layout = MeshLayout(a for _, a in chosen)
        kept = {n: a for n, a in self.aliases.items() if n not in {c for c, _ in chosen}}
        kept = {n: a for n, a in kept.items() if _contained(a, layout)}
        return Mesh(layout, self.ranks, tuple(n for n, _ in chosen), kept, self.device_type)

    def flatten(self, dims: Sequence[DimKey] | None = None, name: str | None = None) -> Mesh:
        """This mesh with ``name`` registered as the flattened alias of ``dims``.

        Adjacent or not, in the order given. Pure: ``self`` is unchanged. ``mesh[name]``
        is then the 1-D flattened mesh.
        """
        chosen = self._resolve(dims)
        if name is None:
            name = "_".join(n for n, _ in chosen)
        if not isinstance(name, str) or not name:
            raise MeshError(f"alias names must be non-empty strings, got {name!r}", value=name)
        axis = Axis.from_modes(m for _, a in chosen for m in a.modes)
        if name in self.names:
            if len(chosen) == 1 and chosen[0][0] == name:
                return self
            raise MeshError(
                f"alias {name!r} clashes with mesh dim {name!r}; pick another alias name",
                value=name,
            )
        if name in self.aliases:
            if self.aliases[name] == axis:
                return self
            raise MeshError(
                f"alias {name!r} already flattens {self.aliases[name]}, not {axis}; "
                "pick another alias name",
                value=name,
            )
        return attrs.evolve(self, aliases=self.aliases.set(name, axis))

    def unflatten(self, dim: DimKey, sizes: Sequence[int], names: Sequence[str]) -> Mesh:
        """Split mesh dim ``dim`` into dims of ``sizes`` (row-major) named ``names``."""
        i = self.dim_index(dim)
        sizes, names = tuple(sizes), _names(names)
        if len(sizes) != len(names):
            raise MeshError(
                f"unflatten got {len(sizes)} sizes {sizes!r} but {len(names)} names {names!r}",
                value=(sizes, names),
            )
        axis = self.layout.axes[i]
        if any(not isinstance(s, int) or s < 1 for s in sizes) or math.prod(sizes) != axis.size():
            raise MeshError(
                f"unflatten sizes {sizes!r} multiply to {math.prod(sizes)}, but dim "
                f"{self.names[i]!r} has size {axis.size()}; give sizes whose product is "
                f"{axis.size()}",
                value=sizes,
            )
        inner = row_major_strides(sizes)
        parts = tuple(compose(axis, Axis.of((s,), (d,))) for s, d in zip(sizes, inner))
        axes = self.layout.axes[:i] + parts + self.layout.axes[i + 1 :]
        new_names = self.names[:i] + names + self.names[i + 1 :]
        return Mesh(MeshLayout(axes), self.ranks, new_names, self.aliases, self.device_type)

    # -- ranks, coordinates, groups ---------------------------------------------------

    def _index_of(self, rank: int) -> int | None:
        ranks = self.ranks
        if isinstance(ranks, range):
            if rank in ranks:
                return (rank - ranks.start) // ranks.step
            return None
        inv = self._inverse
        if inv is None:
            inv = {r: i for i, r in enumerate(ranks)}
            object.__setattr__(self, "_inverse", inv)
        return inv.get(rank)

    def _digits(self, index: int, axis: Axis) -> int:
        coord = 0
        for size, stride in axis.modes:
            coord = coord * size + (index // stride) % size
        return coord

    def _base(self, index: int, axes: Iterable[Axis]) -> int:
        for axis in axes:
            for size, stride in axis.modes:
                index -= ((index // stride) % size) * stride
        return index

    def contains(self, rank: int) -> bool:
        """True when ``rank`` is in some instance of this mesh."""
        return self._index_of(rank) is not None

    def coordinate(self, rank: int) -> tuple[int, ...] | None:
        """The mesh coordinate of ``rank`` (within its instance), or None if absent.

        Costs time proportional to the number of mesh dims, not the world.
        """
        index = self._index_of(rank)
        if index is None:
            return None
        return tuple(self._digits(index, a) for a in self.layout.axes)

    def rank_at(self, coordinate: Sequence[int], *, at: int | None = None) -> int:
        """The rank at ``coordinate`` in the instance containing ``at`` (default: first)."""
        coordinate = tuple(coordinate)
        if len(coordinate) != self.ndim or any(
            not 0 <= c < s for c, s in zip(coordinate, self.shape, strict=True)
        ):
            raise MeshError(
                f"coordinate {coordinate!r} is outside mesh shape {self.shape!r}",
                value=coordinate,
            )
        base = 0 if at is None else self._base(self._require(at), self.layout.axes)
        return self.ranks[
            base + sum(a.offset(c) for a, c in zip(self.layout.axes, coordinate, strict=True))
        ]

    def _require(self, rank: int) -> int:
        index = self._index_of(rank)
        if index is None:
            raise MeshError(f"rank {rank} is not in this mesh's rank map", value=rank)
        return index

    def group_of(self, rank: int, dims: DimKey | Sequence[DimKey] | None = None) -> tuple[int, ...]:
        """The ranks along ``dims`` that share every other coordinate with ``rank``.

        Ordered by coordinate along ``dims`` (last fastest); time and memory are
        proportional to the group, not the world.
        """
        chosen = self._resolve(dims)
        index = self._require(rank)
        axes = [a for _, a in chosen]
        base = self._base(index, axes)
        offsets = Axis.from_modes(m for a in axes for m in a.modes).offsets()
        ranks = self.ranks
        return tuple(ranks[base + o] for o in offsets)

    def groups(self, dims: DimKey | Sequence[DimKey] | None = None) -> tuple[tuple[int, ...], ...]:
        """Every rank group along ``dims``: the process groups to create for them.

        Groups are ordered by the coordinates of the remaining offsets (row-major),
        each group by coordinate along ``dims``.
        """
        chosen = self._resolve(dims)
        sub = Axis.from_modes(m for _, a in chosen for m in a.modes)
        inner = sub.offsets()
        ranks = self.ranks
        return tuple(
            tuple(ranks[base + o] for o in inner)
            for base in complement(sub.modes, len(ranks)).offsets()
        )

    def submesh(self, dims: DimKey | Sequence[DimKey] | None = None, *, at: int) -> Mesh:
        """The one instance of ``self[dims]`` that contains rank ``at``, as its own mesh.

        >>> Mesh.create((2, 4), ("dp", "tp")).submesh("dp", at=6)
        Mesh(layout=MeshLayout(axes=(Axis(sizes=(2,), strides=(1,)),)), ranks=(2, 6), names=('dp',))
        """
        chosen = self._resolve(dims)
        group = self.group_of(at, [n for n, _ in chosen])
        shape = tuple(a.size() for _, a in chosen)
        return Mesh.create(shape, tuple(n for n, _ in chosen), group, self.device_type)

    # -- printing ---------------------------------------------------------------------

    def __str__(self) -> str:
        extra = f", aliases={tuple(self.aliases)!r}" if self.aliases else ""
        return f"Mesh({self.shape!r}, names={self.names!r}{extra})"

    def __repr__(self) -> str:
        extra = ""
        if self.aliases:
            extra += f", aliases={dict(self.aliases)!r}"
        if self.device_type != "cpu":
            extra += f", device_type={self.device_type!r}"
        return (
            f"Mesh(layout={self.layout!r}, ranks={self.ranks!r}, names={self.names!r}{extra})"
        )

    def __getstate__(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in attrs.fields(Mesh) if f.init}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)
        object.__setattr__(self, "_inverse", None)


def _contained(axis: Axis, layout: MeshLayout) -> bool:
    """True when every offset of ``axis`` lies in the span of ``layout``'s modes."""
    segments: list[tuple[int, int]] = []  # (stride, count): multiples of stride below stride*count
    for stride, size in sorted((d, s) for s, d in layout.modes()):
        if segments and segments[-1][0] * segments[-1][1] == stride:
            s0, c0 = segments.pop()
            segments.append((s0, c0 * size))
        else:
            segments.append((stride, size))
    for size, stride in axis.modes:
        if not any(stride % s0 == 0 and (stride // s0) * (size - 1) < c0 for s0, c0 in segments):
            return False
    return True


def flatten(mesh: Mesh, dims: Sequence[DimKey] | None = None, name: str | None = None) -> Mesh:
    """Module-level form of :meth:`Mesh.flatten`."""
    return mesh.flatten(dims, name)


def unflatten(mesh: Mesh, dim: DimKey, sizes: Sequence[int], names: Sequence[str]) -> Mesh:
    """Module-level form of :meth:`Mesh.unflatten`."""
    return mesh.unflatten(dim, sizes, names)

"""The :class:`Mesh` value: a layout over a rank map, with dim names and flattened aliases."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from meshplan.errors import MeshError

from ._axis import Axis, complement
from ._frozen import FrozenMap, identity_first_eq
from ._ints import as_int, int_or_same
from ._mesh_algebra import contained, digit, gather, origin, overlapping_pair, reindex, split_axis
from ._mesh_check import MAX_WORLD, alias_map, check_mesh, mesh_shape, names_of, sequence_of
from ._mesh_layout import MeshLayout
from ._ranks import RankMap, index_of, rank_map, short_repr, trusted_rank_map

__all__ = ["Mesh", "flatten", "unflatten", "DimKey"]

DimKey = int | str
Dims = DimKey | Sequence[DimKey] | slice | None


@identity_first_eq
@attrs.frozen(repr=False, cache_hash=True)
class Mesh:
    """A device mesh: an N-D layout over a rank map, with dim names and flattened aliases.

    ``ranks[i]`` is the global rank at layout offset ``i``; the layout's axes pick which
    offsets form each mesh dim. A sliced mesh keeps the root's rank map and so stands for
    the whole family of such submeshes (``groups()`` lists them all);
    :meth:`submesh` picks the one instance containing a given rank.

    The rank map is canonical (:func:`~meshplan.layout._ranks.rank_map`): progressions
    are stored as a ``range``, so equal meshes compare equal however they were built.

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
    ranks: RankMap = attrs.field(converter=rank_map)
    names: tuple[str, ...] = attrs.field(converter=names_of)
    aliases: FrozenMap[str, Axis] = attrs.field(converter=alias_map, factory=FrozenMap)
    device_type: str = "cpu"

    def __attrs_post_init__(self) -> None:
        check_mesh(self.layout, self.ranks, self.names, self.aliases, self.device_type)

    # -- construction -----------------------------------------------------------------

    @classmethod
    def create(
        cls,
        shape: Sequence[int] | int,
        names: Sequence[str] | str | None = None,
        ranks: Iterable[int] | None = None,
        device_type: str = "cpu",
    ) -> Mesh:
        """A row-major mesh of ``shape`` over ``ranks`` (default ``range(prod(shape))``).

        ``ranks`` may be any permutation or any slice of a bigger world.

        >>> Mesh.create((2, 3), ("dp", "tp"), ranks=range(6, 12)).groups("tp")
        ((6, 7, 8), (9, 10, 11))
        >>> Mesh.create(4, "x", ranks=[3, 1, 2, 0]).ranks
        (3, 1, 2, 0)
        """
        shape = mesh_shape(shape)
        numel = math.prod(shape)
        if numel > MAX_WORLD:
            raise MeshError(
                f"mesh shape {shape!r} has {numel} ranks, more than any torch.distributed "
                f"world (ranks are 32-bit ints: at most {MAX_WORLD})",
                value=shape,
            )
        names = tuple(f"d{i}" for i in range(len(shape))) if names is None else names_of(names)
        ranks = range(numel) if ranks is None else rank_map(ranks)
        if len(ranks) != numel:
            raise MeshError(
                f"rank map {short_repr(ranks)} has {len(ranks)} ranks but mesh shape "
                f"{shape!r} needs {numel}; pass exactly prod(shape) ranks",
                value=ranks,
            )
        return cls(MeshLayout.row_major(shape), ranks, names, FrozenMap(), device_type)

    @classmethod
    def from_device_mesh(cls, device_mesh: Any) -> Mesh:
        """The mesh of a torch ``DeviceMesh``: same names, same groups, flattened dims as aliases.

        A submesh or flattened DeviceMesh gives the submesh family of its root's mesh.
        Imports torch (see :func:`meshplan.runtime.to_device_mesh` for the way back).
        """
        from meshplan.runtime._interop import mesh_from_device_mesh

        return mesh_from_device_mesh(device_mesh)

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
        """Number of ranks in one instance of this mesh, or along ``dim`` (or alias)."""
        if dim is None:
            return self.layout.numel()
        return self.axis(dim).size()

    def dim_index(self, dim: DimKey) -> int:
        """The index of a mesh dim given by name or (possibly negative) index.

        >>> Mesh.create((2, 4), ("dp", "tp")).dim_index("tp"), Mesh.create((2, 4)).dim_index(-2)
        (1, 0)
        """
        if isinstance(dim, str):
            if dim not in self.names:
                hint = (
                    f" ({dim!r} is a flattened alias: slice it with mesh[{dim!r}] first)"
                    if dim in self.aliases
                    else ""
                )
                raise MeshError(
                    f"unknown mesh dim {dim!r}{hint}; the dims are {self.names!r}"
                    + (f" and the aliases {tuple(self.aliases)!r}" if self.aliases else ""),
                    value=dim,
                )
            return self.names.index(dim)
        i = as_int(dim)
        if i is None:
            raise MeshError(
                f"mesh dims are names or ints, got {dim!r}; use one of {self.names!r}", value=dim
            )
        if not -self.ndim <= i < self.ndim:
            raise MeshError(
                f"mesh dim {i} is out of range for the {self.ndim}-D mesh {self.names!r}; "
                f"use an index in [{-self.ndim}, {self.ndim})",
                value=dim,
            )
        return i % self.ndim

    def axis(self, dim: DimKey) -> Axis:
        """The layout of one mesh dim or alias."""
        if isinstance(dim, str) and dim in self.aliases:
            return self.aliases[dim]
        return self.layout.axes[self.dim_index(dim)]

    def _resolve(self, dims: Dims) -> tuple[tuple[str, Axis], ...]:
        if dims is None:
            return tuple(zip(self.names, self.layout.axes, strict=True))
        if isinstance(dims, slice):
            try:
                dims = range(self.ndim)[dims]
            except (TypeError, ValueError) as exc:
                raise MeshError(f"bad mesh dim slice {dims!r}: {exc}", value=dims) from None
        elif isinstance(dims, str) or not isinstance(dims, Iterable):
            dims = (dims,)
        elif hasattr(dims, "__index__") and getattr(dims, "shape", None) == ():
            dims = (dims,)  # a 0-d array or tensor
        dims = sequence_of(dims, "mesh dims")
        out = []
        for d in dims:
            if isinstance(d, str) and d in self.aliases:
                out.append((d, self.aliases[d]))
            else:
                i = self.dim_index(d)
                out.append((self.names[i], self.layout.axes[i]))
        names = [n for n, _ in out]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise MeshError(
                f"mesh dims {dims!r} name dim {dup!r} twice; each dim may appear once",
                value=dims,
            )
        if not Axis.from_modes(m for _, a in out for m in a.modes).is_injective():
            a, b = overlapping_pair(out)
            raise MeshError(
                f"mesh dims {dims!r} cannot be combined: {a!r} ({self.axis(a)}) and {b!r} "
                f"({self.axis(b)}) share ranks (an alias and a dim it flattens?); pick dims "
                "that share no ranks, e.g. the alias or its dims but not both",
                value=dims,
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

    def __getitem__(self, dims: Dims) -> Mesh:
        """The submesh family along ``dims``: names, indices or aliases, in any order.

        Keeps the rank map and every alias that lies within the chosen dims.

        >>> m = Mesh.create((2, 3, 4), ("a", "b", "c"))
        >>> m["c", "a"].shape, m[1:].names, m[-1].groups()[:2]
        ((4, 2), ('b', 'c'), ((0, 1, 2, 3), (4, 5, 6, 7)))
        """
        chosen = self._resolve(dims)
        layout = MeshLayout(a for _, a in chosen)
        taken = {c for c, _ in chosen}
        kept = {n: a for n, a in self.aliases.items() if n not in taken and contained(a, layout)}
        return Mesh(layout, self.ranks, tuple(n for n, _ in chosen), kept, self.device_type)

    def flatten(self, dims: Dims = None, name: str | None = None) -> Mesh:
        """This mesh with ``name`` registered as the flattened alias of ``dims``.

        Adjacent or not, in the order given (default: every dim, named by joining the
        dim names with ``_``). Pure: ``self`` is unchanged. ``mesh[name]`` is then the
        1-D flattened mesh, and it can be sliced together with the remaining dims.

        >>> m = Mesh.create((2, 2, 2), ("a", "b", "c")).flatten(("a", "c"))
        >>> m.aliases["a_c"], m["b", "a_c"].groups()
        (Axis(sizes=(2, 2), strides=(4, 1)), ((0, 1, 4, 5, 2, 3, 6, 7),))
        """
        chosen = self._resolve(dims)
        if not chosen:
            raise MeshError(f"flatten needs at least one mesh dim, got {dims!r}", value=dims)
        if name is None:
            name = "_".join(n for n, _ in chosen)
        if not isinstance(name, str) or not name:
            raise MeshError(
                f"alias names must be non-empty strings, got {name!r}; pass name='...'",
                value=name,
            )
        axis = Axis.from_modes(m for _, a in chosen for m in a.modes)
        if name in self.names:
            if len(chosen) == 1 and chosen[0][0] == name:
                return self
            raise MeshError(
                f"alias {name!r} clashes with mesh dim {name!r} of {self.names!r}; "
                "pick another alias name",
                value=name,
            )
        if name in self.aliases:
            if self.aliases[name] == axis:
                return self
            raise MeshError(
                f"alias {name!r} already flattens {self.aliases[name]}, not {axis} "
                f"(dims {tuple(n for n, _ in chosen)!r}); pick another alias name",
                value=name,
            )
        return attrs.evolve(self, aliases=self.aliases.set(name, axis))

    def unflatten(self, dim: DimKey, sizes: Sequence[int], names: Sequence[str] | str) -> Mesh:
        """Split mesh dim ``dim`` into dims of ``sizes`` (row-major) named ``names``.

        >>> m = Mesh.create((2, 8), ("dp", "x")).unflatten("x", (2, 4), ("cp", "tp"))
        >>> m.shape, m.names, m.group_of(0, "cp")
        ((2, 2, 4), ('dp', 'cp', 'tp'), (0, 4))
        """
        i = self.dim_index(dim)
        sizes, names = sequence_of(sizes, "unflatten sizes"), names_of(names)
        if len(sizes) != len(names):
            raise MeshError(
                f"unflatten got {len(sizes)} sizes {sizes!r} but {len(names)} names "
                f"{names!r}; give one name per size",
                value=(sizes, names),
            )
        axis = self.layout.axes[i]
        sizes = tuple(int_or_same(s) for s in sizes)
        for s in sizes:
            if isinstance(s, bool) or not isinstance(s, int) or s < 1:
                raise MeshError(
                    f"unflatten sizes {sizes!r} hold {s!r}; sizes must be ints >= 1",
                    value=sizes,
                )
        if math.prod(sizes) != axis.size():
            raise MeshError(
                f"unflatten sizes {sizes!r} multiply to {math.prod(sizes)}, but dim "
                f"{self.names[i]!r} has size {axis.size()}; give sizes whose product is "
                f"{axis.size()}",
                value=sizes,
            )
        parts = split_axis(axis, sizes)
        if parts is None:
            raise MeshError(
                f"cannot unflatten dim {self.names[i]!r} (layout {axis}, a flattening of "
                f"non-adjacent dims) into sizes {sizes!r}: the sizes do not split its modes "
                f"{axis.sizes!r} into layouts that add up to it; choose sizes that split "
                f"those modes, e.g. {axis.sizes!r}",
                value=sizes,
            )
        axes = self.layout.axes[:i] + parts + self.layout.axes[i + 1 :]
        new_names = self.names[:i] + names + self.names[i + 1 :]
        return Mesh(MeshLayout(axes), self.ranks, new_names, self.aliases, self.device_type)

    # -- ranks, coordinates, groups ---------------------------------------------------

    def _index_of(self, rank: int) -> int | None:
        i = as_int(rank)
        if i is None:
            raise MeshError(f"ranks are ints, got {rank!r}", value=rank)
        return index_of(self.ranks, i)

    def _require(self, rank: int) -> int:
        index = self._index_of(rank)
        if index is None:
            raise MeshError(
                f"rank {rank!r} is not in this mesh's rank map {short_repr(self.ranks)}; "
                "pass a rank of the mesh",
                value=rank,
            )
        return index

    def contains(self, rank: int) -> bool:
        """True when ``rank`` is in some instance of this mesh.

        >>> Mesh.create(4, ranks=range(4, 8)).contains(2)
        False
        """
        return self._index_of(rank) is not None

    def coordinate(self, rank: int) -> tuple[int, ...] | None:
        """The mesh coordinate of ``rank`` (within its instance), or None if absent.

        Costs time proportional to the number of mesh dims, not the world.

        >>> Mesh.create((2, 3)).coordinate(4), Mesh.create((2, 3)).coordinate(6)
        ((1, 1), None)
        """
        index = self._index_of(rank)
        if index is None:
            return None
        return tuple(digit(index, a) for a in self.layout.axes)

    def rank_at(self, coordinate: Sequence[int], *, at: int | None = None) -> int:
        """The rank at ``coordinate`` in the instance containing ``at`` (default: first).

        >>> m = Mesh.create((2, 4), ("dp", "tp"))
        >>> m.rank_at((1, 2)), m["dp"].rank_at((1,), at=3)
        (6, 7)
        """
        coordinate = tuple(int_or_same(c) for c in sequence_of(coordinate, "a coordinate"))
        if len(coordinate) != self.ndim or any(
            isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < s
            for c, s in zip(coordinate, self.shape, strict=True)
        ):
            raise MeshError(
                f"coordinate {coordinate!r} is outside mesh shape {self.shape!r}; give one "
                "int per dim with 0 <= c < size",
                value=coordinate,
            )
        base = 0 if at is None else origin(self._require(at), self.layout.axes)
        return self.ranks[
            base + sum(a.offset(c) for a, c in zip(self.layout.axes, coordinate, strict=True))
        ]

    def group_of(self, rank: int, dims: Dims = None) -> tuple[int, ...]:
        """The ranks along ``dims`` that share every other coordinate with ``rank``.

        Ordered by coordinate along ``dims`` (last fastest); time and memory are
        proportional to the group, not the world.

        >>> Mesh.create((2, 2, 2), ("a", "b", "c")).group_of(5, ("c", "a"))
        (0, 4, 1, 5)
        """
        chosen = self._resolve(dims)
        index = self._require(rank)
        axes = [a for _, a in chosen]
        sub = Axis.from_modes(m for a in axes for m in a.modes)
        return gather(self.ranks, sub._offsets(origin(index, axes)))

    def groups(self, dims: Dims = None) -> tuple[tuple[int, ...], ...]:
        """Every rank group along ``dims``: the process groups to create for them.

        Groups are ordered by the coordinates of the remaining offsets (row-major),
        each group by coordinate along ``dims``.

        >>> Mesh.create((2, 3), ("dp", "tp")).groups("dp")
        ((0, 3), (1, 4), (2, 5))
        """
        chosen = self._resolve(dims)
        sub = Axis.from_modes(m for _, a in chosen for m in a.modes)
        inner = sub.offsets()
        ranks = self.ranks
        return tuple(
            gather(ranks, [base + o for o in inner])
            for base in complement(sub.modes, len(ranks))._offsets(0)
        )

    def submesh(self, dims: Dims = None, *, at: int) -> Mesh:
        """The one instance of ``self[dims]`` that contains rank ``at``, as its own mesh.

        Its rank map is that instance's ranks; aliases within ``dims`` are kept. Time and
        memory are proportional to the instance, not the world.

        >>> m = Mesh.create((2, 2, 2), ("a", "b", "c")).flatten(("a", "c"), "ac")
        >>> sub = m.submesh(("a", "c"), at=6)
        >>> sub.ranks, sub["ac"].groups()
        ((2, 3, 6, 7), ((2, 3, 6, 7),))
        """
        family = self[dims]
        group = self.group_of(at, family.names)
        collapsed = family.layout.collapse()
        aliases = {}
        for name, axis in family.aliases.items():
            moved = reindex(axis, collapsed)
            if moved is not None:
                aliases[name] = moved
        return Mesh(
            MeshLayout.row_major(family.shape),
            trusted_rank_map(group),
            family.names,
            aliases,
            self.device_type,
        )

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
        ranks = tuple(self.ranks) if not isinstance(self.ranks, range) else self.ranks
        return f"Mesh(layout={self.layout!r}, ranks={ranks!r}, names={self.names!r}{extra})"


def flatten(mesh: Mesh, dims: Dims = None, name: str | None = None) -> Mesh:
    """Module-level form of :meth:`Mesh.flatten`.

    >>> flatten(Mesh.create((2, 2), ("a", "b")), name="ab")["ab"].groups()
    ((0, 1, 2, 3),)
    """
    return _as_mesh(mesh).flatten(dims, name)


def unflatten(mesh: Mesh, dim: DimKey, sizes: Sequence[int], names: Sequence[str] | str) -> Mesh:
    """Module-level form of :meth:`Mesh.unflatten`.

    >>> unflatten(Mesh.create(4, "x"), "x", (2, 2), ("a", "b")).groups("a")
    ((0, 2), (1, 3))
    """
    return _as_mesh(mesh).unflatten(dim, sizes, names)


def _as_mesh(value) -> Mesh:
    if not isinstance(value, Mesh):
        raise MeshError(f"expected a Mesh, got {value!r}", value=value)
    return value


def first_instance(mesh: Mesh) -> tuple[int, ...]:
    """The ranks of ``mesh``'s first instance, in layout order: all its ranks, or, for a
    sliced mesh (which stands for a family of submeshes), those of the instance holding
    its first rank.

    >>> first_instance(Mesh.create((2, 3), ("dp", "tp"))["tp"])
    (0, 1, 2)
    """
    if mesh.size() == mesh.world_size:
        return tuple(mesh.ranks)
    return mesh.group_of(mesh.rank_at((0,) * mesh.ndim), None)

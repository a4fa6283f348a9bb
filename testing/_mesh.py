"""Hypothesis strategies for meshes: random shapes, rank maps, aliases and dim choices."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from meshplan.layout import Axis, Mesh
from meshplan.layout._ints import as_int as _as_int

__all__ = ["meshes", "mesh_dims"]

# the most ranks a torch.distributed world has (ranks are 32-bit ints)
_MAX_WORLD = 2**31 - 1


def as_int(name: str, value: object, low: int) -> int:
    """``value`` as an int >= ``low`` (numpy ints too, not bools), else InvalidArgument."""
    out = _as_int(value)
    if out is None:
        raise InvalidArgument(f"{name}={value!r} must be an int")
    if out < low:
        raise InvalidArgument(f"{name}={value!r} must be >= {low}")
    return out


def as_names(name: str, value: object, allowed: Sequence[str]) -> tuple[str, ...]:
    """``value``, a non-empty collection of names from ``allowed``, as a tuple in the order
    of ``allowed``; else InvalidArgument naming the offending entry."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidArgument(
            f"{name}={value!r} must be a collection of names from {tuple(allowed)!r}"
        )
    items = list(value)
    for item in items:
        if not isinstance(item, str) or item not in allowed:
            raise InvalidArgument(
                f"{name}={value!r} holds {item!r}; it must be a non-empty subset of "
                f"{tuple(allowed)!r}"
            )
    if not items:
        raise InvalidArgument(f"{name}={value!r} must be a non-empty subset of {tuple(allowed)!r}")
    return tuple(a for a in allowed if a in items)


def _largest(side: int, dims: int) -> int:
    """``side**dims``, or a number above ``_MAX_WORLD`` when that is larger (cheap for any
    ``dims``: past 32 dims of side >= 2 the product exceeds it anyway)."""
    return side ** min(dims, 32) if side > 1 else 1


def _check_order(lo_name: str, lo: int, hi_name: str, hi: int) -> None:
    if lo > hi:
        raise InvalidArgument(f"{lo_name}={lo!r} must not exceed {hi_name}={hi!r}")


def mesh_strategy(mesh: object, default: st.SearchStrategy[Mesh]) -> st.SearchStrategy[Mesh]:
    """A strategy for the ``mesh=`` argument of a public strategy: ``default`` for None,
    ``just`` a Mesh, a strategy as it is; anything else raises InvalidArgument."""
    if mesh is None:
        return default
    if isinstance(mesh, Mesh):
        return st.just(mesh)
    if isinstance(mesh, st.SearchStrategy):
        return mesh
    raise InvalidArgument(f"mesh={mesh!r} must be a Mesh, a strategy for meshes, or None")


def meshes(
    *,
    min_dims: int = 1,
    max_dims: int = 4,
    min_side: int = 1,
    max_side: int = 4,
    permuted: bool | None = None,
    max_rank_offset: int = 0,
    max_aliases: int = 0,
) -> st.SearchStrategy[Mesh]:
    """Meshes of ``min_dims..max_dims`` dims, each of size ``min_side..max_side``.

    Dims are named ``d0, d1, ...``. ``permuted`` picks the rank map: ``False`` the
    identity, ``True`` a random permutation, ``None`` (default) either. The ranks start
    at an offset in ``[0, max_rank_offset]`` (a mesh over a slice of a bigger world).
    Up to ``max_aliases`` flattened aliases ``f0, f1, ...`` of random dims (adjacent or
    not, in any order) are registered. Shrinks towards fewer, smaller dims, the
    identity map and no aliases.

    >>> from hypothesis import given
    >>> @given(meshes(max_dims=2, max_side=3, permuted=False))
    ... def check(mesh):
    ...     assert mesh.ranks == range(mesh.size())
    >>> check()
    """
    min_dims = as_int("min_dims", min_dims, 0)
    max_dims = as_int("max_dims", max_dims, 0)
    _check_order("min_dims", min_dims, "max_dims", max_dims)
    min_side = as_int("min_side", min_side, 1)
    max_side = as_int("max_side", max_side, 1)
    _check_order("min_side", min_side, "max_side", max_side)
    if permuted is not None and not isinstance(permuted, bool):
        raise InvalidArgument(f"permuted={permuted!r} must be True, False or None")
    max_rank_offset = as_int("max_rank_offset", max_rank_offset, 0)
    max_aliases = as_int("max_aliases", max_aliases, 0)
    largest = _largest(max_side, max_dims)
    if largest > _MAX_WORLD:
        raise InvalidArgument(
            f"max_side={max_side!r} and max_dims={max_dims!r} allow meshes of more than "
            f"{_MAX_WORLD} ranks, the most a torch.distributed world has; lower max_side or "
            "max_dims"
        )
    if largest > 1 << 16 and permuted is not False:
        raise InvalidArgument(
            f"max_side={max_side!r} and max_dims={max_dims!r} allow meshes of up to "
            f"{largest} ranks, too many to permute; lower them or pass permuted=False"
        )
    return _meshes(min_dims, max_dims, min_side, max_side, permuted, max_rank_offset, max_aliases)


@st.composite
def _meshes(
    draw: st.DrawFn,
    min_dims: int,
    max_dims: int,
    min_side: int,
    max_side: int,
    permuted: bool | None,
    max_rank_offset: int,
    max_aliases: int,
) -> Mesh:
    shape = draw(
        st.lists(st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims),
        label="shape",
    )
    numel = math.prod(shape)
    offset = draw(st.integers(0, max_rank_offset), label="rank offset") if max_rank_offset else 0
    if permuted is None:
        permuted = draw(st.booleans(), label="permuted")
    if permuted:
        order = draw(st.permutations(range(numel)), label="rank map")
        ranks: Sequence[int] = [offset + i for i in order]
    else:
        ranks = range(offset, offset + numel)
    mesh = Mesh.create(tuple(shape), ranks=ranks)
    if max_aliases and mesh.ndim:
        for k in range(draw(st.integers(0, max_aliases), label="number of aliases")):
            dims = draw(mesh_dims(mesh, min_size=1), label=f"dims of f{k}")
            mesh = mesh.flatten(dims, f"f{k}")
    return mesh


def mesh_dims(
    mesh: Mesh,
    *,
    min_size: int = 0,
    max_size: int | None = None,
    aliases: bool = False,
) -> st.SearchStrategy[tuple[str, ...]]:
    """Distinct dim names of ``mesh`` in any order (for slicing, flattening, groups).

    With ``aliases=True`` the names may include the mesh's aliases; dims that share
    ranks with an earlier pick are left out, so every result is a valid ``mesh[dims]``.
    Shrinks towards fewer dims in mesh order.

    >>> from hypothesis import given
    >>> @given(mesh_dims(Mesh.create((2, 2, 2)), min_size=2))
    ... def check(dims):
    ...     assert len(set(dims)) == len(dims) >= 2
    >>> check()
    """
    if not isinstance(mesh, Mesh):
        raise InvalidArgument(f"mesh={mesh!r} must be a meshplan.layout.Mesh")
    if not isinstance(aliases, bool):
        raise InvalidArgument(f"aliases={aliases!r} must be True or False")
    keys = mesh.names + (tuple(mesh.aliases) if aliases else ())
    min_size = as_int("min_size", min_size, 0)
    max_size = len(keys) if max_size is None else as_int("max_size", max_size, 0)
    _check_order("min_size", min_size, "max_size", max_size)
    if min_size > mesh.ndim:
        raise InvalidArgument(
            f"min_size={min_size!r} exceeds the {mesh.ndim} dims of {mesh}; lower min_size"
        )
    if not keys:
        return st.just(())
    picks = st.lists(st.sampled_from(keys), unique=True, min_size=min_size, max_size=max_size)
    if not aliases or not mesh.aliases:
        return picks.map(tuple)
    return picks.map(lambda names: _drop_overlaps(mesh, names)).filter(
        lambda names: len(names) >= min_size
    )


def _drop_overlaps(mesh: Mesh, names: Sequence[str]) -> tuple[str, ...]:
    out: list[str] = []
    modes: tuple[tuple[int, int], ...] = ()
    for name in names:
        more = modes + mesh.axis(name).modes
        if Axis.from_modes(more).is_injective():
            out.append(name)
            modes = more
    return tuple(out)

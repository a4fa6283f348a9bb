"""Hypothesis strategies for placements, shapes and specs."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from meshplan.errors import PlacementError
from meshplan.layout import Mesh
from meshplan.placement import (
    REDUCE_OPS,
    Partial,
    Placement,
    Replicate,
    Shard,
    Spec,
    StridedShard,
    dtype_name,
)

from ._mesh import as_int, as_names, mesh_strategy, meshes

__all__ = ["placements", "shapes", "specs"]

# Sizes worth hitting on purpose: empty, one, small primes, small composites.
_INTERESTING = (0, 1, 2, 3, 4, 5, 7, 8, 11, 12, 13)


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be True or False")


def _check_ops(partial_ops: object) -> tuple[str, ...]:
    return as_names("partial_ops", partial_ops, REDUCE_OPS)


def _sides(min_side: int, max_side: int) -> st.SearchStrategy[int]:
    special = [s for s in _INTERESTING if min_side <= s <= max_side] or [min_side]
    return st.one_of(st.sampled_from(special), st.integers(min_side, max_side))


def shapes(
    *, min_dims: int = 0, max_dims: int = 3, min_side: int = 0, max_side: int = 12
) -> st.SearchStrategy[tuple[int, ...]]:
    """Global tensor shapes; sides favour 0, 1, primes and other uneven sizes.

    >>> from hypothesis import given
    >>> @given(shapes(min_dims=1, max_dims=2, max_side=5))
    ... def check(shape):
    ...     assert 1 <= len(shape) <= 2 and all(0 <= s <= 5 for s in shape)
    >>> check()
    """
    min_dims = as_int("min_dims", min_dims, 0)
    max_dims = as_int("max_dims", max_dims, 0)
    min_side = as_int("min_side", min_side, 0)
    max_side = as_int("max_side", max_side, 0)
    if min_dims > max_dims:
        raise InvalidArgument(f"min_dims={min_dims!r} must not exceed max_dims={max_dims!r}")
    if min_side > max_side:
        raise InvalidArgument(f"min_side={min_side!r} must not exceed max_side={max_side!r}")
    return st.lists(_sides(min_side, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


def placements(
    *,
    ndim: int = 2,
    allow_partial: bool = True,
    allow_strided: bool = True,
    partial_ops: Sequence[str] = REDUCE_OPS,
    max_split_factor: int = 4,
) -> st.SearchStrategy[Placement]:
    """One placement for a tensor of ``ndim`` dims (shards name a dim in ``range(ndim)``).

    Shrinks towards ``Replicate()``, then ``Shard(0)``.

    >>> from hypothesis import given
    >>> @given(placements(ndim=1, allow_partial=False))
    ... def check(p):
    ...     assert not isinstance(p, Partial) and getattr(p, "dim", 0) == 0
    >>> check()
    """
    ndim = as_int("ndim", ndim, 0)
    _check_bool("allow_partial", allow_partial)
    _check_bool("allow_strided", allow_strided)
    ops = _check_ops(partial_ops)
    max_split_factor = as_int("max_split_factor", max_split_factor, 2 if allow_strided else 1)
    options: list[st.SearchStrategy[Placement]] = [st.just(Replicate())]
    if ndim:
        dims = st.integers(0, ndim - 1)
        options.append(st.builds(Shard, dims))
        if allow_strided:
            options.append(st.builds(StridedShard, dims, st.integers(2, max_split_factor)))
    if allow_partial:
        options.append(st.builds(Partial, st.sampled_from(ops)))
    return st.one_of(options)


def specs(
    *,
    mesh: Mesh | st.SearchStrategy[Mesh] | None = None,
    shape: Sequence[int] | None = None,
    min_dims: int = 0,
    max_dims: int = 3,
    min_side: int = 0,
    max_side: int = 12,
    dtypes: Sequence[str] = ("float32",),
    allow_partial: bool = True,
    allow_strided: bool = True,
    allow_order: bool = True,
    partial_ops: Sequence[str] = REDUCE_OPS,
    max_split_factor: int = 4,
) -> st.SearchStrategy[Spec]:
    """Valid specs: a mesh, a global shape, one placement per mesh dim and a shard order.

    ``mesh`` is a fixed :class:`~meshplan.layout.Mesh`, a strategy for meshes, or None
    (meshes of 1-3 dims of size 1-4, any rank map). ``shape`` fixes the global shape;
    otherwise it has ``min_dims..max_dims`` dims of ``min_side..max_side`` (favouring
    0, 1, primes and uneven sizes). One spec reduces with one Partial op from
    ``partial_ops`` (or mixes sum and avg, when both are allowed). ``allow_order``
    draws non-default shard orders for tensor dims sharded by several mesh dims.
    Shrinks towards small replicated specs in default order.

    >>> from hypothesis import given
    >>> from meshplan.layout import Mesh
    >>> @given(specs(mesh=Mesh.create((2, 3)), max_dims=2, allow_partial=False))
    ... def check(spec):
    ...     assert spec.mesh.shape == (2, 3) and not spec.is_partial
    >>> check()
    """
    mesh_st = mesh_strategy(mesh, meshes(min_dims=1, max_dims=3, max_side=4))
    if shape is not None:
        if isinstance(shape, str) or not isinstance(shape, Sequence):
            raise InvalidArgument(f"shape={shape!r} must be a sequence of ints >= 0")
        sides = tuple(as_int(f"shape={list(shape)!r}: side", s, 0) for s in shape)
        shape_st: st.SearchStrategy[tuple[int, ...]] = st.just(sides)
    else:
        shape_st = shapes(
            min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side
        )
    if isinstance(dtypes, str) or not isinstance(dtypes, Sequence) or not dtypes:
        raise InvalidArgument(f"dtypes={dtypes!r} must be a non-empty sequence of dtype names")
    try:
        names = tuple(dtype_name(d) for d in dtypes)
    except PlacementError as e:
        raise InvalidArgument(f"dtypes={dtypes!r}: {e}") from None
    for name, flag in [
        ("allow_partial", allow_partial),
        ("allow_strided", allow_strided),
        ("allow_order", allow_order),
    ]:
        _check_bool(name, flag)
    ops = _check_ops(partial_ops)
    max_split_factor = as_int("max_split_factor", max_split_factor, 2 if allow_strided else 1)
    return _specs(
        mesh_st, shape_st, names, allow_partial, allow_strided, allow_order, ops, max_split_factor
    )


@st.composite
def _specs(
    draw: st.DrawFn,
    mesh_st: st.SearchStrategy[Mesh],
    shape_st: st.SearchStrategy[tuple[int, ...]],
    dtypes: tuple[str, ...],
    allow_partial: bool,
    allow_strided: bool,
    allow_order: bool,
    ops: tuple[str, ...],
    max_split_factor: int,
) -> Spec:
    mesh = draw(mesh_st, label="mesh")
    if not isinstance(mesh, Mesh):
        raise InvalidArgument(f"the mesh strategy drew {mesh!r}, not a Mesh")
    shape = draw(shape_st, label="shape")
    dtype = draw(st.sampled_from(dtypes), label="dtype")
    ndim = len(shape)
    # one reduce op per spec; sum and avg may mix
    op_choices: tuple[str, ...] = ()
    if dtype.startswith("complex"):  # complex values have no order: no max/min
        ops = tuple(op for op in ops if op in ("sum", "avg"))
    if dtype == "bool":  # bool values have no average
        ops = tuple(op for op in ops if op != "avg")
    if allow_partial and ops:
        op = draw(st.sampled_from(ops), label="partial op")
        op_choices = tuple(o for o in ("sum", "avg") if o in ops) if op in ("sum", "avg") else (op,)
    kinds = ["R"]
    if ndim:
        kinds.append("S")
        if allow_strided:
            kinds.append("SS")
    if op_choices:
        kinds.append("P")
    out: list[Placement] = []
    for m in range(mesh.ndim):
        kind = draw(st.sampled_from(kinds), label=f"kind on mesh dim {m}")
        if kind == "R":
            out.append(Replicate())
        elif kind == "S":
            out.append(Shard(draw(st.integers(0, ndim - 1), label=f"dim on mesh dim {m}")))
        elif kind == "SS":
            d = draw(st.integers(0, ndim - 1), label=f"dim on mesh dim {m}")
            sf = draw(st.integers(2, max_split_factor), label=f"split factor on mesh dim {m}")
            out.append(StridedShard(d, sf))
        else:
            out.append(Partial(draw(st.sampled_from(op_choices), label=f"op on mesh dim {m}")))
    order: dict[int, tuple[int, ...]] = {}
    if allow_order:
        for d in range(ndim):
            dims = [m for m, p in enumerate(out) if getattr(p, "dim", None) == d]
            dims = [m for m in dims if mesh.shape[m] > 1]
            if len(dims) > 1:
                order[d] = tuple(draw(st.permutations(dims), label=f"shard order of dim {d}"))
    return Spec(mesh, out, shape, dtype, order)

"""A :class:`~meshplan.placement.Spec`'s canonical form, and reading its arguments.

Equivalent specs compare equal because each is built canonical: negative tensor dims
normalized, a placement on a size-1 mesh dim made ``Replicate()``, ``StridedShard(d, 1)``
made ``Shard(d)``, and the shard order stored in full (every sharded tensor dim, mesh dim
indices). Arguments already in that form (what the planner passes) take a fast path:
exact-type checks, no rebuilding.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from typing import Any

from meshplan.errors import PlacementError
from meshplan.layout import FrozenMap, Mesh
from meshplan.layout._frozen import EMPTY_MAP
from meshplan.layout._ints import int_or_same

from ._types import Partial, Placement, Replicate, Shard, StridedShard

__all__ = [
    "canonical_order",
    "canonical_placements",
    "check_partial_ops",
    "check_shape",
    "is_canonical_shape",
    "placement_facts",
    "read_order",
    "read_placements",
]


_MAX_SIZE = 2**63 - 1  # torch sizes are int64


def read_placements(value: Iterable[Any]) -> tuple[Any, ...]:
    """Placements (any sequence; a string or a scalar refused) as a tuple, unchecked."""
    if type(value) is tuple:
        return value
    if isinstance(value, str):
        raise PlacementError(
            f"placements {value!r} is a string; parse it with parse_placements first",
            value=value,
        )
    if not isinstance(value, Iterable):
        raise PlacementError(
            f"placements {value!r} is not a sequence; give one placement per mesh dim",
            value=value,
        )
    try:
        return tuple(value)
    except TypeError:  # a 0-d tensor or array
        raise PlacementError(
            f"placements {value!r} is not a sequence; give one placement per mesh dim",
            value=value,
        ) from None


def is_canonical_shape(value: Any) -> bool:
    """Whether ``value`` is a global shape in canonical form already: a tuple of ints in
    ``[0, 2**63)`` whose product fits int64."""
    if type(value) is not tuple:
        return False
    n = 1
    for s in value:
        if type(s) is not int or not 0 <= s <= _MAX_SIZE:
            return False
        n *= s
    return n <= _MAX_SIZE


def read_order(value: Any) -> Any:
    """A shard order as given (a FrozenMap kept, None empty, other mappings read with
    ints for numpy ints), for :func:`canonical_order` to check."""
    if isinstance(value, FrozenMap):
        return value
    if value is None:
        return EMPTY_MAP
    try:
        return {
            int_or_same(d): tuple(int_or_same(m) for m in ms)
            if isinstance(ms, list | tuple)
            else ms
            for d, ms in dict(value).items()
        }
    except (TypeError, ValueError):
        raise PlacementError(
            f"shard_order {value!r} is not a mapping tensor dim -> mesh dims; write e.g. "
            "{0: ('tp', 'dp')}",
            value=value,
        ) from None


def check_shape(shape: tuple[Any, ...]) -> None:
    """Raise unless ``shape`` holds ints >= 0 whose product fits int64."""
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise PlacementError(
                f"global shape {shape!r} has size {s!r}; sizes must be ints >= 0",
                value=shape,
            )
        if s > _MAX_SIZE:
            raise PlacementError(
                f"global shape {shape!r} has size {s!r}, beyond int64; torch sizes "
                f"are at most {_MAX_SIZE} (2**63 - 1)",
                value=shape,
            )
    n = math.prod(shape)
    if n > _MAX_SIZE:
        raise PlacementError(
            f"global shape {shape!r} holds {n} elements, beyond int64; a torch tensor holds "
            f"at most {_MAX_SIZE} (2**63 - 1): use smaller sizes",
            value=shape,
        )


def canonical_placements(
    mesh: Mesh, placements: tuple[Any, ...], ndim: int
) -> tuple[Placement, ...]:
    """``placements`` in canonical form for ``mesh`` and an ``ndim``-D tensor (the same
    tuple when it is already), or a PlacementError naming the bad one.

    >>> from meshplan.layout import Mesh
    >>> canonical_placements(Mesh.create((2, 1)), (Shard(-1), Partial()), 2)
    (Shard(1), Replicate())
    """
    sizes = mesh.shape
    if len(placements) == len(sizes):
        for p, size in zip(placements, sizes, strict=True):  # the common case: canonical already
            kind = type(p)
            if kind is Replicate:
                continue
            if size == 1:
                break
            if kind is Shard:
                if not 0 <= p.dim < ndim:
                    break
            elif kind is StridedShard:
                if p.split_factor == 1 or not 0 <= p.dim < ndim:
                    break
            elif kind is not Partial:
                break
        else:
            return placements
    return _canonicalize(mesh, placements, ndim)


def _canonicalize(mesh: Mesh, placements: tuple[Any, ...], ndim: int) -> tuple[Placement, ...]:
    if len(placements) != mesh.ndim:
        raise PlacementError(
            f"{len(placements)} placements {tuple(map(str, placements))} for a {mesh.ndim}-D "
            f"mesh {mesh.names!r}; give one placement per mesh dim",
            value=placements,
        )
    out: list[Placement] = []
    for i, p in enumerate(placements):
        match p:
            case Shard(dim=d) | StridedShard(dim=d):
                if not -ndim <= d < ndim:
                    raise PlacementError(
                        f"{p!r} on mesh dim {mesh.names[i]!r} shards tensor dim {d}, out of "
                        f"range for a {ndim}-D tensor; use a dim in [{-ndim}, {ndim})",
                        value=p,
                    )
                if mesh.shape[i] == 1:
                    out.append(_REPLICATE)
                elif d >= 0 and (
                    type(p) is Shard or (type(p) is StridedShard and p.split_factor > 1)
                ):
                    out.append(p)  # canonical already (a frozen value: shared)
                elif isinstance(p, StridedShard) and p.split_factor > 1:
                    d %= ndim
                    out.append(StridedShard(d, p.split_factor))
                else:
                    out.append(Shard(d % ndim))
            case Replicate():
                out.append(p)
            case Partial():
                out.append(_REPLICATE if mesh.shape[i] == 1 else p)
            case _:
                hint = " (convert torch placements with from_torch)" if _from_torch(p) else ""
                raise PlacementError(
                    f"{p!r} on mesh dim {mesh.names[i]!r} is not a meshplan placement; use "
                    f"Shard, StridedShard, Replicate or Partial{hint}",
                    value=p,
                )
    return tuple(out)


_REPLICATE = Replicate()


def _from_torch(p: object) -> bool:
    return type(p).__module__.startswith("torch")


@functools.lru_cache(maxsize=4096)
def placement_facts(
    placements: tuple[Placement, ...],
) -> tuple[FrozenMap[int, tuple[int, ...]], frozenset[str]]:
    """Of canonical placements: the mesh dims sharding each tensor dim (ascending, the
    default shard order) and the ops of their :class:`Partial` s."""
    sharding: dict[int, list[int]] = {}
    for i, p in enumerate(placements):
        if isinstance(p, Shard | StridedShard):
            sharding.setdefault(p.dim, []).append(i)
    default = FrozenMap({d: tuple(m) for d, m in sharding.items()}) if sharding else EMPTY_MAP
    return default, frozenset(p.op for p in placements if isinstance(p, Partial))


def check_partial_ops(placements: tuple[Placement, ...], ops: frozenset[str], dtype: str) -> None:
    """Raise unless one spec of ``dtype`` may hold Partials of ``ops`` together."""
    if len(ops) > 1 and ops != {"sum", "avg"}:
        raise PlacementError(
            f"placements {tuple(map(str, placements))} mix Partial ops {sorted(ops)!r}; one "
            "spec may reduce with one op (only sum and avg mix): reduce one of them first",
            value=placements,
        )
    if dtype == "bool" and "avg" in ops:
        raise PlacementError(
            f"placements {tuple(map(str, placements))} average bool values, which have no "
            "average; use Partial('max') (any) or Partial('min') (all), or another dtype",
            value=placements,
        )
    if dtype.startswith("complex") and ops & {"max", "min"}:
        raise PlacementError(
            f"placements {tuple(map(str, placements))} reduce {dtype} values with "
            f"{sorted(ops & {'max', 'min'})!r}, but complex numbers have no order; use "
            "Partial('sum') or Partial('avg')",
            value=placements,
        )


def canonical_order(
    mesh: Mesh, default: FrozenMap[int, tuple[int, ...]], given: Mapping[Any, Any], ndim: int
) -> FrozenMap[int, tuple[int, ...]]:
    """The full shard order: ``given`` (partial, with names or negative dims) checked
    against the mesh dims sharding each tensor dim and completed from ``default``."""
    if not given:
        return default
    if type(given) is FrozenMap and _is_full_order(given, default):
        return given
    order: dict[int, tuple[int, ...]] = dict(default)
    seen: set[int] = set()
    listed_ones: set[int] = set()
    for key, dims in dict(given).items():
        if isinstance(key, bool) or not isinstance(key, int) or not -ndim <= key < ndim:
            raise PlacementError(
                f"shard_order key {key!r} is not a tensor dim of a {ndim}-D tensor; use a "
                f"dim in [{-ndim}, {ndim})",
                value=given,
            )
        d = key % ndim
        if d in seen:
            raise PlacementError(
                f"shard_order {dict(given)!r} gives tensor dim {d} twice (as {key!r} and "
                "another key); give each dim once",
                value=given,
            )
        seen.add(d)
        if isinstance(dims, int | str):
            dims = (dims,)
        if isinstance(dims, set | frozenset) and len(dims) > 1:
            raise PlacementError(
                f"shard_order {dict(given)!r} maps tensor dim {key!r} to the set {dims!r}, "
                "which has no order; give a tuple, e.g. ('tp', 'dp')",
                value=given,
            )
        if not isinstance(dims, Iterable):
            raise PlacementError(
                f"shard_order {dict(given)!r} maps tensor dim {key!r} to {dims!r}; map it to "
                "a tuple of mesh dims (names or indices)",
                value=given,
            )
        dims = tuple(dims)
        try:
            idx = tuple(mesh.dim_index(m) for m in dims)
        except ValueError as e:
            raise PlacementError(f"shard_order {dict(given)!r}: {e}", value=given) from None
        # mesh dims of size 1 carry no sharding: drop them (canonical form), but each
        # may be listed once, for one tensor dim
        ones = [m for m in idx if mesh.shape[m] == 1]
        twice = [m for m in ones if m in listed_ones]
        listed_ones.update(ones)
        want = default.get(d, ())
        kept = tuple(m for m in idx if mesh.shape[m] != 1)
        if len(set(idx)) != len(idx) or twice or sorted(kept) != sorted(want):
            raise PlacementError(
                f"shard_order for tensor dim {d} is {tuple(dims)!r}, but the mesh dims "
                f"sharding it are {tuple(mesh.names[m] for m in want)!r}; the order must list "
                "each of them exactly once (it may neither omit nor invent a mesh dim)",
                value=given,
            )
        if kept:
            order[d] = kept
    return FrozenMap(order)


def _is_full_order(given: FrozenMap, default: FrozenMap[int, tuple[int, ...]]) -> bool:
    """Whether ``given`` is a shard order in the form a Spec stores: for every sharded
    tensor dim (int keys), a permutation of the mesh dims sharding it (int tuples)."""
    if given.keys() != default.keys():
        return False
    for d, dims in given.items():
        want = default[d]
        if type(d) is not int or type(dims) is not tuple or len(dims) != len(want):
            return False
        for m in dims:
            if type(m) is not int or m not in want:
                return False
        if len(set(dims)) != len(dims):
            return False
    return True

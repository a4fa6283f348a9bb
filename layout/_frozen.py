"""A small immutable, hashable mapping used for mesh aliases and shard orders."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

from meshplan.errors import MeshError

K = TypeVar("K")
V = TypeVar("V")

__all__ = ["FrozenMap", "identity_first_eq"]


class FrozenMap(Mapping[K, V], Generic[K, V]):
    """An immutable mapping, hashable, ordered by key (so equal maps print the same).

    Values must be hashable: an unhashable one is refused when the map is built.

    >>> m = FrozenMap({"b": 2, "a": 1})
    >>> m
    FrozenMap({'a': 1, 'b': 2})
    >>> m == FrozenMap(a=1, b=2), hash(m) == hash(FrozenMap(a=1, b=2))
    (True, True)
    """

    __slots__ = ("_data", "_hash")

    def __init__(self, data: Mapping[K, V] | Any = (), **kwargs: V) -> None:
        try:
            items = dict(data)
        except (TypeError, ValueError):
            raise MeshError(
                f"a FrozenMap is built from a mapping or (key, value) pairs, got {data!r}",
                value=data,
            ) from None
        items.update(kwargs)
        keys = list(items)
        if not _in_order(keys):
            try:
                keys.sort(key=_sort_key)
            except TypeError:
                raise MeshError(
                    f"a FrozenMap's keys must be orderable (ints or strings), got {list(items)!r}",
                    value=data,
                ) from None
            items = {k: items[k] for k in keys}
        self._data: dict[K, V] = items
        try:  # hashed now, so an unhashable value is refused here, not by a later lookup
            self._hash: int = hash(tuple(items.items()))
        except TypeError:
            key, value = next((k, v) for k, v in items.items() if not _is_hashable(v))
            raise MeshError(
                f"a FrozenMap's values must be hashable, but {key!r} maps to {value!r}; use "
                "tuples (not lists), frozensets (not sets) or FrozenMaps (not dicts)",
                value=value,
            ) from None

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: K, default: Any = None) -> Any:
        return self._data.get(key, default)

    def keys(self):
        return self._data.keys()

    def values(self):
        return self._data.values()

    def items(self):
        return self._data.items()

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, FrozenMap):
            return self._data == other._data
        if isinstance(other, Mapping):
            return self._data == dict(other)
        return NotImplemented

    def set(self, key: K, value: V) -> FrozenMap[K, V]:
        """A copy with ``key`` bound to ``value``."""
        d = dict(self._data)
        d[key] = value
        return FrozenMap(d)

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"

    def __reduce__(self):
        return (FrozenMap, (self._data,))


def _is_hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _sort_key(key: Any) -> tuple[str, Any]:
    return (type(key).__name__, key)


def frozen_map(value: Mapping | Any) -> FrozenMap:
    """attrs converter: any mapping (or pairs) to a :class:`FrozenMap` (idempotent)."""
    if isinstance(value, FrozenMap):
        return value
    return FrozenMap(value)


def _in_order(keys: list) -> bool:
    """Whether ``keys`` are all ints, or all strings, in increasing order (the order a
    :class:`FrozenMap` keeps), so they need no sort."""
    if not keys:
        return True
    kind = type(keys[0])
    if kind is not int and kind is not str:
        return False
    prev = keys[0]
    for k in keys[1:]:
        if type(k) is not kind or not prev < k:
            return False
        prev = k
    return True


EMPTY_MAP: FrozenMap = FrozenMap()


def int_keyed_map(data: Mapping[int, Any]) -> FrozenMap:
    """A :class:`FrozenMap` of ``data`` (int keys), sharing :data:`EMPTY_MAP` when empty.

    >>> int_keyed_map({}) is EMPTY_MAP, int_keyed_map({1: (0,), 0: (1,)})
    (True, FrozenMap({0: (1,), 1: (0,)}))
    """
    return FrozenMap(data) if data else EMPTY_MAP


T = TypeVar("T", bound=type)


def identity_first_eq(cls: T) -> T:
    """Make the attrs-generated ``==`` of a frozen, hash-caching class answer at once for
    the same object, and for values whose cached hashes differ, before comparing fields.

    attrs compares field by field with ``==``, which never short-cuts on identity; values
    that nest other values (a Spec holds a Mesh holding a MeshLayout) then compare every
    level even when both sides share it. Apply after ``@attrs.frozen`` to a class whose
    hash is cached (``cache_hash=True``, or a ``__hash__`` reading a cached property).
    """
    fields_eq = cls.__eq__

    def __eq__(self, other):  # noqa: N807
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        if hash(self) != hash(other):
            return False
        return fields_eq(self, other)

    def __ne__(self, other):  # noqa: N807
        result = __eq__(self, other)
        return result if result is NotImplemented else not result

    __eq__.__doc__ = fields_eq.__doc__
    cls.__eq__ = __eq__
    cls.__ne__ = __ne__
    return cls

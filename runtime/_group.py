"""One rank group as the calling rank sees it: a torch process group plus coordinate order.

A torch process group numbers its members by its own rank list, which need not be the
order of their mesh coordinates (torch sorts the list by default, and a mesh may have a
permuted rank map). A :class:`Group` holds both orders and maps between them, so every
meshplan collective can take and return per-position data (position = coordinate along
the group's dims) whatever order torch uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from meshplan.errors import RuntimeShellError

__all__ = ["DEFAULT_TIMEOUT", "Group"]

DEFAULT_TIMEOUT = 600.0
"""Seconds a collective may wait for its peers before it fails (NCCL's default too)."""


def _ranks(value: Sequence[int]) -> tuple[int, ...]:
    from meshplan.layout._ints import as_int

    try:
        items = tuple(value) if not isinstance(value, str | bytes) else None
    except (TypeError, RecursionError):
        items = None
    ints = None if items is None else [as_int(r) for r in items]
    if ints is None or any(r is None or r < 0 for r in ints):
        raise RuntimeShellError(f"a group's ranks are ints >= 0, got {value!r:.80}", value=value)
    return tuple(ints)  # type: ignore[arg-type]


def _check_group(group: Group) -> None:
    """Raise unless ``group``'s fields describe one group that holds the calling rank."""
    if type(group.rank) is not int or not isinstance(group.name, str):
        raise RuntimeShellError(
            f"a Group's name is a str and its rank an int, got {group.name!r:.40} and "
            f"{group.rank!r:.40}",
            value=group.rank,
        )
    if isinstance(group.timeout, bool) or not isinstance(group.timeout, int | float):
        raise RuntimeShellError(f"timeout={group.timeout!r:.40} is no number", value=group.timeout)
    if sorted(group.ranks) != sorted(group.pg_ranks) or len(set(group.ranks)) != group.size:
        raise RuntimeShellError(
            f"group {group.name!r}: coordinate order {group.ranks!r} and process-group order "
            f"{group.pg_ranks!r} must list the same distinct ranks",
            value=group.ranks,
        )
    if group.rank not in group.ranks:
        raise RuntimeShellError(
            f"group {group.name!r} over ranks {group.ranks!r} does not contain the calling "
            f"rank {group.rank}",
            value=group.rank,
        )


# A Group's lookups between the two orders are computed once, at construction: attrs
# computes these defaults in field order after setting the fields they read. The first
# one checks those fields, so the others (and every method) work on a valid group.


def _group_ranks_by_position(group: Group) -> tuple[int, ...]:
    """The torch group rank of every position (the fields checked first)."""
    _check_group(group)
    where = {r: g for g, r in enumerate(group.pg_ranks)}
    return tuple(where[r] for r in group.ranks)


def _positions_by_group_rank(group: Group) -> tuple[int, ...]:
    """The position of every torch group rank: the inverse of the above."""
    to_position = [0] * group.size
    for p, g in enumerate(group._group_of_position):
        to_position[g] = p
    return tuple(to_position)


def _own_position(group: Group) -> int:
    """The calling rank's position."""
    return group.ranks.index(group.rank)


@attrs.frozen(repr=False)
class Group:
    """One rank group of a mesh as the calling rank sees it: a torch group plus coordinate order.

    ``ranks`` lists the members by mesh coordinate along the group's dims (the order of
    every meshplan collective's per-position data); ``pg_ranks`` lists them in the torch
    group's own rank order; ``pg`` is the torch ``ProcessGroup``. Two groups are equal
    when all but ``pg`` are.

    >>> g = Group("tp", ranks=(7, 5, 6), pg_ranks=(5, 6, 7), rank=5, pg=None, timeout=60.0)
    >>> g.size, g.position, g.group_rank(0), g.position_of(0)
    (3, 1, 2, 1)
    >>> g.to_group_order(["from 7", "from 5", "from 6"])
    ['from 5', 'from 6', 'from 7']
    >>> g.to_position_order(["from 5", "from 6", "from 7"])
    ['from 7', 'from 5', 'from 6']
    """

    name: str
    ranks: tuple[int, ...] = attrs.field(converter=_ranks)
    pg_ranks: tuple[int, ...] = attrs.field(converter=_ranks)
    rank: int
    pg: Any = attrs.field(eq=False)
    timeout: float = DEFAULT_TIMEOUT
    _group_of_position: tuple[int, ...] = attrs.field(
        init=False, eq=False, default=attrs.Factory(_group_ranks_by_position, takes_self=True)
    )
    _position_of_group: tuple[int, ...] = attrs.field(
        init=False, eq=False, default=attrs.Factory(_positions_by_group_rank, takes_self=True)
    )
    _position: int = attrs.field(
        init=False, eq=False, default=attrs.Factory(_own_position, takes_self=True)
    )

    @property
    def size(self) -> int:
        """Number of members."""
        return len(self.ranks)

    @property
    def position(self) -> int:
        """The calling rank's position (mesh coordinate along the group's dims)."""
        return self._position

    @property
    def is_identity(self) -> bool:
        """True when the torch group's rank order is the coordinate order."""
        return self.ranks == self.pg_ranks

    def group_rank(self, position: int) -> int:
        """The torch group rank of the member at ``position``."""
        return self._group_of_position[self._check(position, "position")]

    def position_of(self, group_rank: int) -> int:
        """The position (coordinate order) of the member with torch group rank ``group_rank``."""
        return self._position_of_group[self._check(group_rank, "group rank")]

    def to_group_order(self, items: Sequence[Any]) -> list[Any]:
        """Reorder per-position ``items`` into torch group-rank order."""
        self._check_len(items)
        return [items[p] for p in self._position_of_group]

    def to_position_order(self, items: Sequence[Any]) -> list[Any]:
        """Reorder per-group-rank ``items`` into position (coordinate) order."""
        self._check_len(items)
        return [items[g] for g in self._group_of_position]

    def _check(self, index: int, what: str) -> int:
        if not isinstance(index, int) or not 0 <= index < self.size:
            raise RuntimeShellError(
                f"{what} {index!r} is out of range for group {self.name!r} of size {self.size}",
                value=index,
            )
        return index

    def _check_len(self, items: Sequence[Any]) -> None:
        if len(items) != self.size:
            raise RuntimeShellError(
                f"group {self.name!r} has {self.size} members but got {len(items)} items; "
                "pass one item per member",
                value=len(items),
            )

    def __getstate__(self) -> dict[str, Any]:
        # a torch process group does not travel between processes: it arrives as None
        return {
            "name": self.name,
            "ranks": self.ranks,
            "pg_ranks": self.pg_ranks,
            "rank": self.rank,
            "timeout": self.timeout,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(pg=None, **state)  # type: ignore[misc]

    def __repr__(self) -> str:
        return (
            f"Group({self.name!r}, ranks={self.ranks!r}, pg_ranks={self.pg_ranks!r}, "
            f"rank={self.rank}, timeout={self.timeout})"
        )

"""Rank maps: the global rank stored at each layout offset of a mesh.

A rank map is validated once (distinct, non-negative ints) and kept in canonical
form: an arithmetic progression is a :class:`range` (so ``Mesh.create((4,))`` and
``Mesh.create((4,), ranks=[0, 1, 2, 3])`` compare equal, and the default map costs
O(1) memory), anything else a :class:`RankTuple` that caches its hash and inverse.
Meshes derived by slicing or flattening share the same validated map.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from typing import Any

from meshplan.errors import MeshError

from ._ints import as_int

__all__ = ["RankMap", "RankTuple", "rank_map", "trusted_rank_map", "index_of", "short_repr"]


class RankTuple(tuple):
    """A validated rank map that is not a progression: a tuple with a cached inverse.

    >>> r = rank_map([3, 0, 2, 1])
    >>> r, type(r).__name__, index_of(r, 2), index_of(r, 9)
    ((3, 0, 2, 1), 'RankTuple', 2, None)
    """

    def _inverse(self) -> dict[int, int]:
        inv = self.__dict__.get("_inv")
        if inv is None:
            inv = dict(zip(self, range(len(self)), strict=True))
            self.__dict__["_inv"] = inv
        return inv

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = super().__hash__()
            self.__dict__["_hash"] = h
        return h

    def __reduce__(self):
        return (RankTuple, (tuple(self),))


RankMap = range | RankTuple


def short_repr(seq: Sequence[Any], limit: int = 12) -> str:
    """``repr`` of a sequence, eliding the middle of long ones.

    >>> short_repr(range(3)), short_repr(range(100)), short_repr(tuple(range(20)), limit=4)
    ('(0, 1, 2)', 'range(0, 100)', '(0, 1, ..., 18, 19) (20 items)')
    """
    if len(seq) <= limit:
        return repr(tuple(seq))
    if isinstance(seq, range):
        return repr(seq)
    half = limit // 2
    head = ", ".join(map(repr, seq[:half]))
    tail = ", ".join(map(repr, seq[-half:]))
    return f"({head}, ..., {tail}) ({len(seq)} items)"


def rank_map(value: Iterable[int]) -> RankMap:
    """Validate and canonicalize a rank map (idempotent; an attrs converter).

    >>> rank_map([4, 5, 6, 7]), rank_map((6, 4, 2)), rank_map(range(8))
    (range(4, 8), range(6, 0, -2), range(0, 8))
    """
    if isinstance(value, RankTuple):
        return value
    if isinstance(value, range):
        _check_range(value)
        return value
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise MeshError(
            f"a rank map is a sequence of ints, got {value!r}; pass e.g. range(8) or a list",
            value=value,
        )
    if isinstance(value, Set | Mapping):
        raise MeshError(
            f"a rank map is an ordered sequence of ints (the rank at each mesh position), got "
            f"the unordered {type(value).__name__} {short_repr(list(value))}; pass a list, "
            "e.g. sorted(ranks)",
            value=value,
        )
    if getattr(value, "ndim", None) == 1 and hasattr(value, "__array__"):
        checked = _checked_array(value)  # a 1-D numpy array or torch tensor
        if checked is not None:
            return checked
    try:
        ranks = tuple(value)
    except TypeError:  # a 0-d tensor or array
        raise MeshError(
            f"a rank map is a sequence of distinct ints >= 0, got {value!r:.80}", value=value
        ) from None
    if set(map(type, ranks)) != {int}:  # numpy ints and the like, or not ints at all
        given = ranks
        ranks = tuple(as_int(r) for r in given)
        if None in ranks:
            bad = given[ranks.index(None)]
            shown = repr(value) if len(given) <= 12 else short_repr(given)
            raise MeshError(
                f"rank map {shown} holds {bad!r}, which is not an int; ranks are ints >= 0",
                value=value,
            )
    if not ranks:
        raise MeshError("rank map is empty; a mesh needs at least one rank", value=ranks)
    progression = _as_range(ranks)
    if progression is not None:
        _check_range(progression)
        return progression
    low, high = min(ranks), max(ranks)
    if low < 0:
        raise MeshError(
            f"rank map {short_repr(ranks)} holds the negative rank {low}; ranks are ints >= 0",
            value=ranks,
        )
    if high > _MAX_RANK:
        raise MeshError(
            f"rank map {short_repr(ranks)} holds the rank {high}, beyond any torch.distributed "
            f"world (ranks are 32-bit ints: at most {_MAX_RANK})",
            value=ranks,
        )
    if len(set(ranks)) != len(ranks):
        seen: dict[int, int] = {}
        for i, r in enumerate(ranks):
            j = seen.setdefault(r, i)
            if j != i:
                raise MeshError(
                    f"rank map {short_repr(ranks)} repeats rank {r} (at positions {j} and "
                    f"{i}); every rank may appear once",
                    value=ranks,
                )
    return RankTuple(ranks)


def _checked_array(value) -> RankMap | None:
    """The rank map of a 1-D integer array (numpy, or a CPU torch tensor), checked at C
    speed (distinct, >= 0, 32-bit); None when it is not one or fails a check (the caller's
    checks then name what is wrong)."""
    try:  # (numpy only here: the layout imports neither numpy nor torch)
        import numpy as np

        arr = np.asarray(value)
    except Exception:  # e.g. a tensor on an accelerator
        return None
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or arr.size == 0:
        return None
    low, high = int(arr.min()), int(arr.max())
    if low < 0 or high > _MAX_RANK:
        return None
    arr = arr.astype(np.int64, copy=False)
    n = arr.size
    step = int(arr[1] - arr[0]) if n > 1 else 1
    first = int(arr[0])
    if step and (n == 1 or (arr == np.arange(first, first + n * step, step)).all()):
        return range(first, first + n * step, step)
    if high - low < 4 * arr.size:
        distinct = int(np.bincount(arr - low).max()) == 1
    else:
        distinct = np.unique(arr).size == arr.size
    return RankTuple(arr.tolist()) if distinct else None


def trusted_rank_map(ranks: tuple[int, ...]) -> RankMap:
    """Canonicalize ranks drawn from a validated rank map (distinct ints >= 0): no checks."""
    return _as_range(ranks) or RankTuple(ranks)


def _as_range(ranks: tuple[int, ...]) -> range | None:
    if len(ranks) == 1:
        return range(ranks[0], ranks[0] + 1)
    step = ranks[1] - ranks[0]
    if step == 0 or ranks[-1] - ranks[0] != step * (len(ranks) - 1):
        return None
    candidate = range(ranks[0], ranks[0] + len(ranks) * step, step)
    return candidate if ranks == tuple(candidate) else None


def _check_range(ranks: range) -> None:
    if len(ranks) == 0:
        raise MeshError(f"rank map {ranks!r} is empty; a mesh needs at least one rank", value=ranks)
    low = ranks[0] if ranks.step > 0 else ranks[-1]
    if low < 0:
        raise MeshError(
            f"rank map {ranks!r} holds the negative rank {low}; ranks are ints >= 0",
            value=ranks,
        )
    high = ranks[-1] if ranks.step > 0 else ranks[0]
    if high > _MAX_RANK:
        raise MeshError(
            f"rank map {ranks!r} holds the rank {high}, beyond any torch.distributed world "
            f"(ranks are 32-bit ints: at most {_MAX_RANK})",
            value=ranks,
        )


_MAX_RANK = 2**31 - 2


def index_of(ranks: RankMap, rank: int) -> int | None:
    """The layout offset that holds ``rank``, or None (O(1); no world-sized work for ranges)."""
    if isinstance(ranks, range):
        if isinstance(rank, int) and rank in ranks:
            return (rank - ranks.start) // ranks.step
        return None
    return ranks._inverse().get(rank)

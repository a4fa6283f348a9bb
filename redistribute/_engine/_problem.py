""":class:`Problem`: what a search context depends on, as one frozen value."""

from __future__ import annotations

import attrs

from meshplan.layout import Mesh

__all__ = ["Problem"]


@attrs.frozen(cache_hash=True)
class Problem:
    """The inputs every plan between specs of one tensor on one mesh shares: the mesh,
    the tensor's shape and dtype, the cost model, the placement universe searched (shard
    codes ``(tensor dim, split factor)`` and Partial op codes, ``_encoding.universe``),
    the memory bound, the objective and whether steps merge onto aliases. A planner keeps
    one search context per problem (``Planner.context``).

    >>> from meshplan.redistribute import CostModel
    >>> p = Problem(Mesh.create(2), (4,), "float32", CostModel(), ((0, 1),), (), None)
    >>> p == Problem(Mesh.create(2), (4,), "float32", CostModel(), ((0, 1),), (), None)
    True
    """

    mesh: Mesh
    shape: tuple[int, ...]
    dtype: str
    model: object  # a CostModel
    shards: tuple[tuple[int, int], ...]
    ptargets: tuple[int, ...]
    bound: int | None
    objective: str = "time"
    merge: bool = True

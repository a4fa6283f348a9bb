"""meshplan.placement — how a tensor lies on a mesh.

Decides which part of a global tensor each rank holds (``Spec``: placements per mesh
dim plus shard order), its local shape, offsets and boxes, and gives the pure
reference ``shard``/``unshard`` over all ranks at once. Never communicates; the
planning part (``Spec`` and shape/offset/chunk functions) never imports torch.
"""

from meshplan.errors import PlacementError

from ._local import (
    Chunk,
    Intervals,
    chunk_bounds,
    dim_intervals,
    global_offset,
    local_chunks,
    local_intervals,
    local_numel,
    local_shape,
    shard_intervals,
)
from ._spec import Spec
from ._text import format_placements, parse_placements
from ._types import (
    DTYPES,
    REDUCE_OPS,
    Partial,
    Placement,
    Replicate,
    Shard,
    StridedShard,
    dtype_itemsize,
    dtype_name,
    is_shard_like,
)


def __getattr__(name):
    # shard/unshard touch tensor values: import torch only when they are used.
    if name in ("shard", "unshard", "partial_keeps", "gather_index"):
        from . import _tensor

        return getattr(_tensor, name)
    raise AttributeError(f"module 'meshplan.placement' has no attribute {name!r}")


__all__ = [
    "Chunk",
    "DTYPES",
    "Intervals",
    "Partial",
    "Placement",
    "PlacementError",
    "REDUCE_OPS",
    "Replicate",
    "Shard",
    "Spec",
    "StridedShard",
    "chunk_bounds",
    "dim_intervals",
    "dtype_itemsize",
    "dtype_name",
    "format_placements",
    "global_offset",
    "is_shard_like",
    "local_chunks",
    "local_intervals",
    "local_numel",
    "local_shape",
    "parse_placements",
    "partial_keeps",
    "gather_index",
    "shard",
    "shard_intervals",
    "unshard",
]

"""meshplan.placement — how a tensor lies on a mesh.

Decides which part of a global tensor each rank holds (``Spec``: placements per mesh
dim plus shard order), its local shape, offsets and boxes, and gives the pure
reference ``shard``/``unshard`` over all ranks at once; ``Sharded`` pairs one rank's
local tensor with its spec. Two views of a spec: placements per mesh dim (DTensor)
and ``PartitionSpec`` (JAX); ``visualize`` draws it; ``to_torch``/``from_torch``
convert to and from torch DTensor placements. Never communicates; the planning part
(``Spec``, shape/offset/chunk functions, text, ``visualize``) never imports torch.
"""

from meshplan.errors import PlacementError
from meshplan.layout._lazy import lazy_attributes

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
    same_layout,
    shard_intervals,
)
from ._pspec import PartitionSpec
from ._spec import Spec, format_spec, from_partition_spec, partition_spec
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

_LAZY = {
    # conversions from and to torch's placements, and the text grid: loaded when used
    "from_torch": "_torch_compat",
    "to_torch": "_torch_compat",
    "to_torch_shard_order": "_torch_compat",
    "visualize": "_visualize",
    "shard": "_tensor",
    "shard_one": "_tensor",
    "unshard": "_tensor",
    "partial_keeps": "_tensor",
    "gather_index": "_tensor",
    "Sharded": "_sharded",
}

# shard/unshard/Sharded touch tensor values: import torch only when they are used.
__getattr__ = lazy_attributes(__name__, _LAZY)


__all__ = [
    "Chunk",
    "DTYPES",
    "Intervals",
    "Partial",
    "PartitionSpec",
    "Placement",
    "PlacementError",
    "REDUCE_OPS",
    "Replicate",
    "Shard",
    "Sharded",
    "Spec",
    "StridedShard",
    "chunk_bounds",
    "dim_intervals",
    "dtype_itemsize",
    "dtype_name",
    "format_placements",
    "format_spec",
    "from_partition_spec",
    "from_torch",
    "global_offset",
    "is_shard_like",
    "local_chunks",
    "local_intervals",
    "local_numel",
    "local_shape",
    "parse_placements",
    "partition_spec",
    "same_layout",
    "partial_keeps",
    "gather_index",
    "shard",
    "shard_intervals",
    "shard_one",
    "to_torch",
    "to_torch_shard_order",
    "unshard",
    "visualize",
]

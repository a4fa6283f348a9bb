"""Bad arguments to the placement API raise PlacementError naming them; numpy ints are taken
wherever ints are (regressions: these raised bare AttributeError / TypeError / ValueError /
RuntimeError, or answered silently wrong)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributed.tensor import Shard as TShard
from torch.distributed.tensor.placement_types import _StridedShard

from meshplan.errors import PlacementError
from meshplan.layout import Mesh
from meshplan.placement import (
    Partial,
    PartitionSpec,
    Replicate,
    Shard,
    Spec,
    StridedShard,
    dim_intervals,
    format_placements,
    format_spec,
    from_partition_spec,
    from_torch,
    gather_index,
    global_offset,
    local_chunks,
    local_numel,
    local_shape,
    parse_placements,
    partial_keeps,
    partition_spec,
    shard,
    shard_intervals,
    to_torch,
    to_torch_shard_order,
    unshard,
)
from meshplan.placement._local import chunk_bounds

SQUARE = Mesh.create((2, 2))
S = Spec(SQUARE, (Shard(0), Replicate()), (4, 2))

BAD = {
    "local_shape of None": lambda: local_shape(None, 0),
    "global_offset of None": lambda: global_offset(None, 0),
    "local_chunks of None": lambda: local_chunks(None, 0),
    "local_numel of None": lambda: local_numel(None, 0),
    "partition_spec of None": lambda: partition_spec(None),
    "format_spec of None": lambda: format_spec(None),
    "from_partition_spec without a mesh": lambda: from_partition_spec(None, (8, 4), ("dp",)),
    "dim_intervals at None": lambda: dim_intervals(S, None, 0),
    "parse None": lambda: parse_placements(None),
    "parse bytes": lambda: parse_placements(b"S(0)"),
    "format with a text order": lambda: format_placements([Shard(0)], "x"),
    "from_torch of None": lambda: from_torch(None),
    "decode_order 0": lambda: from_torch(
        [_StridedShard(0, split_factor=2), TShard(0)], SQUARE, (8,), decode_order=0
    ),
    "to_torch with a text order": lambda: to_torch([Shard(0)], shard_order="x"),
    "to_torch of None": lambda: to_torch(None),
    # returned () before
    "to_torch_shard_order of text": lambda: to_torch_shard_order(["x"]),
    "shard a numpy array": lambda: shard(np.zeros((4, 2), np.float32), S),
    "shard None": lambda: shard(None, S),
    "unshard None": lambda: unshard(None, S),
    "unshard a list": lambda: unshard([torch.zeros(2, 2)] * 4, S),
    "unshard numpy locals": lambda: unshard({r: np.zeros((2, 2)) for r in range(4)}, S),
    # returned (0, -2) and (-2, 0) before
    "chunk into negative parts": lambda: chunk_bounds(5, -2, 0),
    "chunk at a negative index": lambda: chunk_bounds(5, 4, -1),
    # kept the last order before
    "one dim's order twice": lambda: parse_placements("S(0)[1,0] S(0)[0,1]"),
    # read as PartitionSpec((100, 112)) before
    "partition spec of bytes": lambda: PartitionSpec(b"dp"),
    "a reversed interval": lambda: gather_index([(3, 1)]),
    # an empty index before
    "intervals of None": lambda: gather_index(None),
    "a short coordinate": lambda: partial_keeps(Spec(SQUARE, (Replicate(), Partial()), (4,)), (0,)),
    # regression: a TypeError for an int, and (5, 0) on a (2, 2) mesh answered False
    "an int coordinate": lambda: partial_keeps(Spec(SQUARE, (Partial(), Replicate()), (4,)), 0),
    "a coordinate outside the mesh": lambda: partial_keeps(
        Spec(SQUARE, (Partial(), Replicate()), (4,)), (5, 0)
    ),
    # regression: rank 9 (not in the 4-rank mesh) was silently ignored
    "unshard a rank outside the mesh": lambda: unshard(
        {r: torch.zeros(2, 2) for r in (0, 1, 2, 3, 9)}, S
    ),
    "unshard a text rank": lambda: unshard({**{r: torch.zeros(2, 2) for r in range(4)}, "0": 0}, S),
    # regression: parsed as Shard(3) (Arabic-Indic digit three; int() and \d take it)
    "parse a non-ASCII digit": lambda: parse_placements("S(\u0663)"),
    # regression: returned "1 2"
    "format non-placements": lambda: format_placements([1, 2]),
    # regression: a size beyond int64 was taken
    "a global size beyond int64": lambda: Spec(SQUARE, (Replicate(), Replicate()), (2**70,)),
    "replicate as a shard": lambda: shard_intervals(((0, 8),), Replicate(), 2, 0),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_placement_arguments_raise_placement_errors(case):
    with pytest.raises(PlacementError):
        BAD[case]()


def test_numpy_ints_are_taken_as_ints():
    assert Shard(np.int64(0)) == Shard(0)
    assert StridedShard(0, np.int64(2)) == StridedShard(0, 2)
    mesh = Mesh.create(2)
    assert Spec(mesh, (Shard(0),), (np.int64(8),)) == Spec(mesh, (Shard(0),), (8,))
    assert Spec(mesh, (Shard(0),), np.array([8, 4])).shape == (8, 4)
    ordered = Spec(SQUARE, (Shard(0), Shard(0)), (8,), shard_order={np.int64(0): (1, 0)})
    assert ordered == Spec(SQUARE, (Shard(0), Shard(0)), (8,), shard_order={0: (1, 0)})
    assert PartitionSpec(np.int64(0)) == PartitionSpec(0)
    assert dim_intervals(S, (np.int64(1), 0), 0) == dim_intervals(S, (1, 0), 0)

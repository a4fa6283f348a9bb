"""A brute-force model of what each mesh coordinate holds, on explicit index lists.

Independent of ``meshplan.placement._local``: it works on the placements as written
(no canonical form), one python list of global indices per tensor dim.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from meshplan.placement import Shard, StridedShard


def torch_chunk(items: list[int], parts: int) -> list[list[int]]:
    """``torch.chunk`` on a list, padded with empty pieces to exactly ``parts``."""
    size = math.ceil(len(items) / parts) if items else 0
    pieces = [items[i * size : (i + 1) * size] for i in range(parts)] if size else []
    return (pieces + [[] for _ in range(parts)])[:parts]


def held_indices(
    placements: Sequence, mesh_shape: Sequence[int], shape: Sequence[int],
    coord: Sequence[int], order: dict[int, Sequence[int]] | None = None,
) -> tuple[list[int], ...]:  # fmt: skip
    """Per tensor dim, the global indices held at ``coord``, in local storage order."""
    ndim = len(shape)
    out = []
    for d in range(ndim):
        sharding = [
            m for m, p in enumerate(placements)
            if isinstance(p, Shard | StridedShard) and p.dim % ndim == d
        ]  # fmt: skip
        seq = list((order or {}).get(d, sharding))
        if len(seq) < len(sharding):  # orders may leave out size-1 mesh dims
            seq += [m for m in sharding if m not in seq]
        items = list(range(shape[d]))
        for m in seq:
            p, k = placements[m], mesh_shape[m]
            if isinstance(p, StridedShard):
                items = [
                    i for piece in torch_chunk(items, p.split_factor)
                    for i in torch_chunk(piece, k)[coord[m]]
                ]  # fmt: skip
            else:
                items = torch_chunk(items, k)[coord[m]]
        out.append(items)
    return tuple(out)


def expand(intervals) -> list[int]:
    return [i for a, b in intervals for i in range(a, b)]

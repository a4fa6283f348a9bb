"""visualize(spec): the grid, read back, says exactly who holds each element."""

from __future__ import annotations

import re

import pytest
from hypothesis import given

from meshplan.errors import PlacementError
from meshplan.layout import Mesh
from meshplan.placement import (
    Partial,
    Replicate,
    Shard,
    Spec,
    StridedShard,
    local_chunks,
    visualize,
)
from meshplan.testing import meshes, specs


def _ranks(label: str) -> set[int]:
    out: set[int] = set()
    for part in label.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def read_grid(text: str, ndim: int) -> dict[tuple[int, int], set[int]]:
    """Element (row, col) -> ranks, from the picture (a 1-D tensor is row 0)."""
    lines = text.splitlines()[1:]
    cells: dict[tuple[int, int], set[int]] = {}
    cols = [tuple(map(int, t.split(":"))) for t in re.findall(r"\d+:\d+", lines[0])]
    for line in lines:
        if "│" not in line:
            continue
        head, *labels, _ = line.split("│")
        r0, r1 = tuple(map(int, head.strip().split(":"))) if ndim == 2 else (0, 1)
        assert len(labels) == len(cols)
        for (c0, c1), label in zip(cols, labels, strict=True):
            for i in range(r0, r1):
                for j in range(c0, c1):
                    cells[i, j] = _ranks(label.strip())
    return cells


@given(specs(mesh=meshes(max_dims=3, max_side=4, max_rank_offset=2), min_dims=1, max_dims=2))
def test_grid_lists_exactly_the_ranks_holding_each_element(spec):
    text = visualize(spec)
    assert text.splitlines()[0] == f"{spec} on {spec.mesh}"
    holders: dict[tuple[int, ...], set[int]] = {}
    ranks = spec.mesh.group_of(spec.mesh.rank_at((0,) * spec.mesh.ndim))
    for rank in ranks:
        for c in local_chunks(spec, rank):
            rows = range(c.offsets[0], c.offsets[0] + c.sizes[0]) if spec.ndim == 2 else [0]
            d = spec.ndim - 1
            for i in rows:
                for j in range(c.offsets[d], c.offsets[d] + c.sizes[d]):
                    holders.setdefault((i, j), set()).add(rank)
    if spec.numel() == 0:
        assert "no elements" in text
        return
    assert read_grid(text, spec.ndim) == holders
    empty = sorted(r for r in ranks if not local_chunks(spec, r))
    footer = [line for line in text.splitlines() if line.endswith("nothing")]
    if empty:
        assert _ranks(footer[0].split()[1]) == set(empty)
    else:
        assert not footer
    assert sum("reduce (" in line for line in text.splitlines()) == len(spec.partial_dims)


def test_replicas_share_a_cell():
    mesh = Mesh.create((2, 4), ("dp", "tp"))
    text = visualize(Spec(mesh, (Replicate(), Shard(1)), (2, 8)))
    assert text == "\n".join(
        [
            "f32[2,8](R S(1)) on Mesh((2, 4), names=('dp', 'tp'))",
            "      0:2   2:4   4:6   6:8",
            "    ┌─────┬─────┬─────┬─────┐",
            "0:2 │ 0,4 │ 1,5 │ 2,6 │ 3,7 │",
            "    └─────┴─────┴─────┴─────┘",
        ]
    )


def test_strided_shard_shows_a_rank_in_several_cells_and_partial_is_noted():
    mesh = Mesh.create((2, 2), ("dp", "tp"))
    text = visualize(Spec(mesh, (StridedShard(0, 2), Partial("max")), (7,)))
    assert text == "\n".join(
        [
            "f32[7](SS(0,2) P(max)) on Mesh((2, 2), names=('dp', 'tp'))",
            "  0:2   2:4   4:6   6:7",
            "┌─────┬─────┬─────┬─────┐",
            "│ 0,1 │ 2,3 │ 0,1 │ 2,3 │",
            "└─────┴─────┴─────┴─────┘",
            "P(max) over mesh dim 'tp': the ranks of a cell hold parts that reduce (max) to it",
        ]
    )


def test_uneven_multi_axis_shards():
    mesh = Mesh.create((2, 3), ("dp", "tp"))
    text = visualize(Spec(mesh, (Shard(0), Shard(0)), (5, 3), shard_order={0: ("tp", "dp")}))
    assert text.splitlines()[1:] == [
        "      0:3",
        "    ┌─────┐",
        "0:1 │  0  │",
        "    ├─────┤",
        "1:2 │  3  │",
        "    ├─────┤",
        "2:3 │  1  │",
        "    ├─────┤",
        "3:4 │  4  │",
        "    ├─────┤",
        "4:5 │  2  │",
        "    └─────┘",
        "rank 5 holds nothing",
    ]


def test_scalar_and_empty_tensors():
    mesh = Mesh.create((2, 2))
    assert visualize(Spec(mesh, (Replicate(), Partial()), ())).splitlines()[1:4] == [
        "┌─────┐",
        "│ 0-3 │",
        "└─────┘",
    ]
    assert "no elements" in visualize(Spec(mesh, (Shard(0), Replicate()), (0, 4)))


def test_more_than_two_dims_raises():
    with pytest.raises(PlacementError, match="3-D"):
        visualize(Spec(Mesh.create(2), (Shard(0),), (2, 2, 2)))
    with pytest.raises(PlacementError, match="needs a Spec"):
        visualize("S(0)")

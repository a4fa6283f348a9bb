"""A text picture of which ranks hold which block of a 1-D or 2-D tensor (no torch)."""

from __future__ import annotations

from meshplan.errors import PlacementError
from meshplan.layout._mesh import first_instance

from ._local import local_intervals
from ._spec import Spec
from ._types import Partial

__all__ = ["visualize"]


def _rank_label(ranks: list[int]) -> str:
    """``0,1,4`` with runs of three or more written ``a-b``."""
    if not ranks:
        return "-"
    parts: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        if prev - start >= 2:
            parts.append(f"{start}-{prev}")
        else:
            parts.extend(str(x) for x in range(start, prev + 1))
        if r is not None:
            start = prev = r
    return ",".join(parts)


def _segments(size: int, cuts: set[int]) -> list[tuple[int, int]]:
    points = sorted({0, size} | {c for c in cuts if 0 < c < size})
    return [(a, b) for a, b in zip(points, points[1:], strict=False) if a < b]


def _covered(segments: list[tuple[int, int]], intervals) -> list[int]:
    return [i for i, (a, _) in enumerate(segments) if any(lo <= a < hi for lo, hi in intervals)]


def _merge(labels: list[list[str]], segs: list[tuple[int, int]], axis: int):
    """Merge neighbouring rows (axis 0) or columns (axis 1) whose cells hold the same ranks."""
    if axis == 1:
        labels = [list(col) for col in zip(*labels, strict=True)]
    out_labels: list[list[str]] = []
    out_segs: list[tuple[int, int]] = []
    for line, seg in zip(labels, segs, strict=True):
        if out_labels and out_labels[-1] == line:
            out_segs[-1] = (out_segs[-1][0], seg[1])
        else:
            out_labels.append(line)
            out_segs.append(seg)
    if axis == 1:
        out_labels = [list(row) for row in zip(*out_labels, strict=True)]
    return out_labels, out_segs


def _grid(labels: list[list[str]], rows, cols, ndim: int) -> list[str]:
    show_rows = ndim == 2
    col_text = [f"{a}:{b}" if ndim else "" for a, b in cols]
    widths = [
        max(len(col_text[j]), *(len(labels[i][j]) for i in range(len(rows)))) + 2
        for j in range(len(cols))
    ]
    row_text = [f"{a}:{b}" for a, b in rows] if show_rows else [""] * len(rows)
    margin = max(map(len, row_text)) + 1 if show_rows else 0
    pad = " " * margin

    def rule(left: str, mid: str, right: str) -> str:
        return pad + left + mid.join("─" * w for w in widths) + right

    head = pad + " " + " ".join(t.center(w) for t, w in zip(col_text, widths, strict=True))
    lines = [head.rstrip()] if ndim else []
    lines.append(rule("┌", "┬", "┐"))
    for i, row in enumerate(labels):
        left = row_text[i].rjust(margin - 1) + " " if show_rows else ""
        cells = "│".join(t.center(w) for t, w in zip(row, widths, strict=True))
        lines.append(left + "│" + cells + "│")
        lines.append(rule("├", "┼", "┤") if i + 1 < len(labels) else rule("└", "┴", "┘"))
    return lines


def visualize(spec: Spec) -> str:
    """A text grid of which ranks hold each block of a 0-, 1- or 2-D tensor.

    Like ``jax.debug.visualize_array_sharding``: blocks are labelled with their global
    index ranges (``start:stop``) and the ranks holding them; replicas share a cell
    (``0,4``; runs as ``0-3``). Uneven and empty shards, shard orders and strided
    shards show as they are (a rank of a ``StridedShard`` appears in several cells).
    Partial mesh dims and ranks holding nothing are noted below the grid.

    >>> from meshplan.layout import Mesh
    >>> from meshplan.placement import Replicate, Shard
    >>> mesh = Mesh.create((2, 2), ("dp", "tp"))
    >>> print(visualize(Spec(mesh, (Shard(0), Replicate()), (5, 4))))
    f32[5,4](S(0) R) on Mesh((2, 2), names=('dp', 'tp'))
          0:4
        ┌─────┐
    0:3 │ 0,1 │
        ├─────┤
    3:5 │ 2,3 │
        └─────┘
    >>> print(visualize(Spec(Mesh.create(4), (Shard(0),), (5,))))
    f32[5](S(0)) on Mesh((4,), names=('d0',))
      0:2   2:4   4:5
    ┌─────┬─────┬─────┐
    │  0  │  1  │  2  │
    └─────┴─────┴─────┘
    rank 3 holds nothing
    """
    if not isinstance(spec, Spec):
        raise PlacementError(f"visualize needs a Spec, got {spec!r}", value=spec)
    if spec.ndim > 2:
        raise PlacementError(
            f"visualize draws 0-, 1- and 2-D tensors; {spec} is {spec.ndim}-D: picture a "
            "2-D view of it (e.g. merge or drop dims in a spec of your own)",
            value=spec,
        )
    ranks = first_instance(spec.mesh)
    held = {r: local_intervals(spec, r) for r in ranks}
    empty = [r for r in ranks if any(not ivs for ivs in held[r])]
    lines = [f"{spec} on {spec.mesh}"]
    if spec.numel() == 0:
        lines.append(f"(no elements: shape {spec.shape!r})")
        return "\n".join(lines)
    # a 1-D tensor is drawn as one row, a 0-D one as one cell
    shape2 = (1,) * (2 - spec.ndim) + spec.shape
    per_rank = {r: ((((0, 1),),) * (2 - spec.ndim) + held[r]) for r in ranks if r not in empty}
    segs = [
        _segments(shape2[d], {x for ivs in per_rank.values() for iv in ivs[d] for x in iv})
        for d in range(2)
    ]
    holders: list[list[list[int]]] = [[[] for _ in segs[1]] for _ in segs[0]]
    for r in sorted(per_rank):
        ivs = per_rank[r]
        for i in _covered(segs[0], ivs[0]):
            for j in _covered(segs[1], ivs[1]):
                holders[i][j].append(r)
    labels = [[_rank_label(cell) for cell in row] for row in holders]
    labels, rows = _merge(labels, segs[0], 0)
    labels, cols = _merge(labels, segs[1], 1)
    lines += _grid(labels, rows, cols, spec.ndim)
    for m in spec.partial_dims:
        p = spec.placements[m]
        assert isinstance(p, Partial)
        lines.append(
            f"{p} over mesh dim {spec.mesh.names[m]!r}: the ranks of a cell hold parts that "
            f"reduce ({p.op}) to it"
        )
    if empty:
        noun = "rank" if len(empty) == 1 else "ranks"
        verb = "holds" if len(empty) == 1 else "hold"
        lines.append(f"{noun} {_rank_label(sorted(empty))} {verb} nothing")
    return "\n".join(lines)

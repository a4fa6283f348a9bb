"""meshplan's shard/local_shape/global_offset against torch 2.13 DTensor, in one process.

Oracle: torch's ``distribute_tensor`` and ``compute_local_shape_and_global_offset``
under a fake process group and ``LocalTensorMode`` (DESIGN.md, "Correctness
reference"). Every case is classified; a disagreement is accepted only where torch is
known to be wrong or to refuse, and then meshplan's answer is checked independently:

* ``agree``: torch's ``distribute_tensor`` as users call it gives every rank exactly
  meshplan's local tensor, and torch's local shapes and offsets equal meshplan's.
* ``agree-local-split``: torch's offsets and its local split (``src_data_rank=None``)
  agree, but its scatter path does not: ``_StridedShard`` under ``LocalTensorMode``
  (every rank gets coordinate 0's piece; real gloo runs are right).
* ``permuted-local-split``: a permuted rank map; torch's offsets and local split
  agree. Its scatter is not compared: torch scatters in process-group order, not by
  mesh coordinate, and so disagrees with its own offsets (pinned below), and
  ``LocalTensorMode`` often cannot simulate that scatter at all.
* ``torch-refuses``: torch's scatter raises (uneven ``_StridedShard``); its offsets and
  local split agree with meshplan.
* ``torch-wrong-order``: an uneven non-default shard order, which torch 2.13 encodes as
  ``_StridedShard`` and then places differently from the order. meshplan's
  :func:`to_torch` refuses that encoding, and torch's *explicit* shard order (gathered
  by torch's own redistribute) agrees with meshplan's local tensors.
"""

from __future__ import annotations

import collections
import itertools
import math
import random

import pytest
import torch
from _placement_dtensor import gather_with_shard_order, run_distribute
from hypothesis import given
from hypothesis import strategies as st

from meshplan.errors import PlacementError
from meshplan.layout import Mesh
from meshplan.placement import (
    Partial,
    Replicate,
    Shard,
    Spec,
    StridedShard,
    global_offset,
    local_shape,
    shard,
    to_torch,
    unshard,
)
from meshplan.testing import meshes, specs


def _value(spec: Spec) -> torch.Tensor:
    # distinct, exactly representable values
    return torch.arange(math.prod(spec.shape), dtype=torch.float64).reshape(spec.shape)


def _reordered(spec: Spec) -> bool:
    return any(list(o) != sorted(o) for o in spec.shard_order.values())


def _encoding_exact(spec: Spec) -> bool:
    try:
        to_torch(spec)
    except PlacementError:
        return False
    return True


def _same_data(spec: Spec, theirs: dict[int, torch.Tensor], ours: dict[int, torch.Tensor]):
    if spec.is_partial:
        # torch splits partial values its own way (x/n for sum): compare what they reduce to
        if any(tuple(theirs[r].shape) != tuple(ours[r].shape) for r in ours):
            return False
        return torch.allclose(unshard(theirs, spec), unshard(ours, spec))
    return all(torch.equal(theirs[r], ours[r]) for r in ours)


def classify(spec: Spec) -> str:
    """Compare one spec with torch; return its category (see the module docs)."""
    x = _value(spec)
    ours = shard(x, spec)
    ranks = list(spec.mesh.ranks)
    our_shapes = {r: local_shape(spec, r) for r in ranks}
    our_offsets = {r: global_offset(spec, r) for r in ranks}
    empty = any(0 in shape for shape in our_shapes.values())
    if spec.is_partial:
        assert torch.equal(unshard(ours, spec), x)

    permuted = ranks != sorted(ranks)
    if _reordered(spec) and not permuted:
        # torch's explicit shard order (gathered by torch) means what meshplan's means
        full = gather_with_shard_order(spec, ours)
        assert torch.allclose(full, x), f"{spec}: torch's explicit shard order disagrees"

    try:
        split = run_distribute(spec, x, src_data_rank=None)
    except RuntimeError:
        # torch 2.13 cannot split by a _StridedShard where a piece comes out empty: it
        # concatenates the strided pieces, of unlike shapes there
        strided = any(isinstance(p, StridedShard) for p in spec.placements)
        assert empty and (strided or _reordered(spec)), f"{spec}: torch fails"
        return "torch-refuses"
    if _reordered(spec) and not _encoding_exact(spec):
        # torch's _StridedShard encoding of this order places data elsewhere (uneven)
        assert (
            split.offsets != our_offsets
            or split.shapes != our_shapes
            or not _same_data(spec, split.locals, ours)
        ), f"{spec}: to_torch refuses an encoding that torch reads correctly"
        return "torch-wrong-order"

    assert split.shapes == our_shapes, f"{spec}: local shapes {split.shapes} != {our_shapes}"
    assert split.offsets == our_offsets, f"{spec}: offsets {split.offsets} != {our_offsets}"
    assert _same_data(spec, split.locals, ours), f"{spec}: torch's local split differs"

    strided = any("_StridedShard" in type(p).__name__ for p in split.placements)
    if permuted:
        # torch scatters by process-group order (pinned below), and LocalTensorMode often
        # cannot simulate that scatter at all: compare offsets and the local split only
        return "permuted-local-split"
    try:
        scattered = run_distribute(spec, x, src_data_rank=0)
    except (AssertionError, RuntimeError):  # torch's own check, or its cat of unlike pieces
        uneven = len(set(split.shapes.values())) > 1
        # torch 2.13's scatter pads uneven chunks to one shape, but not empty ones, nor
        # all of a _StridedShard's
        assert (strided or empty) and uneven, f"{spec}: torch refuses an unexpected case"
        return "torch-refuses"
    if _same_data(spec, scattered.locals, ours):
        return "agree"
    assert strided, f"{spec}: torch's distribute_tensor differs from meshplan"
    return "agree-local-split"


_small_meshes = meshes(min_dims=1, max_dims=3, max_side=4).filter(lambda m: m.size() <= 12)


@given(specs(mesh=_small_meshes, max_dims=3, max_side=13, allow_order=False, dtypes=["float64"]))
def test_shard_and_offsets_agree_with_distribute_tensor(spec):
    classify(spec)


@given(
    specs(
        mesh=meshes(min_dims=2, max_dims=3, max_side=3),
        min_dims=1,
        max_dims=2,
        max_side=13,
        allow_strided=False,
        dtypes=["float64"],
    )
)
def test_shard_orders_agree_with_torch_where_its_encoding_is_exact(spec):
    classify(spec)


def _random_spec(rng: random.Random) -> Spec:
    shape_m = rng.choice([(2,), (3,), (4,), (5,), (8,), (2, 2), (2, 3), (3, 2), (2, 4), (4, 2),
                          (2, 2, 2), (1, 2, 3), (3, 1, 2), (2, 3, 2)])  # fmt: skip
    n = math.prod(shape_m)
    ranks = list(range(n))
    if rng.random() < 0.2:
        rng.shuffle(ranks)
    mesh = Mesh.create(shape_m, ranks=ranks)
    ndim = rng.randint(0, 3)
    shape = tuple(rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13]) for _ in range(ndim))
    op = rng.choice(["sum", "avg", "max", "min"])
    placements = []
    for _ in shape_m:
        k = rng.random()
        if ndim and k < 0.4:
            used = [p.dim for p in placements if isinstance(p, Shard)]
            reuse = used and rng.random() < 0.6
            placements.append(Shard(rng.choice(used) if reuse else rng.randrange(ndim)))
        elif ndim and k < 0.55:
            placements.append(StridedShard(rng.randrange(ndim), rng.choice([2, 3])))
        elif k < 0.85:
            placements.append(Replicate())
        else:
            placements.append(Partial(rng.choice(["sum", "avg"]) if op in ("sum", "avg") else op))
    order = {}
    for d in range(ndim):
        dims = [m for m, p in enumerate(placements) if isinstance(p, Shard) and p.dim == d]
        if len(dims) > 1 and not any(
            isinstance(p, StridedShard) and p.dim == d for p in placements
        ):
            rng.shuffle(dims)
            order[d] = tuple(dims)
    return Spec(mesh, placements, shape, "float64", order)


@pytest.mark.slow
def test_conformance_sweep(capsys):
    """A fixed sweep of 240 specs; prints how many fall in each category."""
    rng = random.Random(20240613)
    counts: collections.Counter[str] = collections.Counter()
    for _ in range(240):
        counts[classify(_random_spec(rng))] += 1
    with capsys.disabled():
        print(f"\ntorch 2.13 conformance sweep: {dict(sorted(counts.items()))}")
    assert counts["agree"] > 100
    assert set(counts) <= {
        "agree",
        "agree-local-split",
        "permuted-local-split",
        "torch-refuses",
        "torch-wrong-order",
    }


@pytest.mark.slow
def test_shard_order_sweep(capsys):
    """Every order of a 1-D tensor over small meshes; prints agreement counts."""
    counts: collections.Counter[str] = collections.Counter()
    for shape_m in [(2, 2), (2, 3), (3, 2), (2, 2, 2)]:
        mesh = Mesh.create(shape_m)
        for order in itertools.permutations(range(len(shape_m))):
            if list(order) == sorted(order):
                continue
            for n in (0, 1, 3, 4, 5, 7):
                spec = Spec(mesh, [Shard(0)] * len(shape_m), (n,), "float64", {0: order})
                counts[classify(spec)] += 1
    with capsys.disabled():
        print(f"\ntorch 2.13 shard-order sweep: {dict(sorted(counts.items()))}")
    assert counts["agree"] and counts["torch-wrong-order"]


# -- regressions: where torch is wrong or refuses, meshplan's answer is pinned ------------


def test_uneven_strided_shard_is_refused_by_torch_scatter_but_pinned_here():
    spec = Spec(Mesh.create((2, 4)), (StridedShard(0, 2), Shard(0)), (9,), "float64")
    x = _value(spec)
    with pytest.raises(AssertionError):
        run_distribute(spec, x, src_data_rank=0)
    ours = shard(x, spec)
    # split 9 into [0,5) and [5,9); each half over d0, then d1 chunks the rank's part
    assert [ours[r].tolist() for r in range(8)] == [
        [0.0, 1.0], [2.0, 5.0], [6.0], [],
        [3.0], [4.0], [7.0], [8.0],
    ]  # fmt: skip
    assert [global_offset(spec, r)[0] for r in range(8)] == [0, 2, 6, 9, 3, 4, 7, 8]
    split = run_distribute(spec, x, src_data_rank=None)
    assert split.offsets == {r: global_offset(spec, r) for r in range(8)}
    assert all(torch.equal(split.locals[r], ours[r]) for r in range(8))


def test_uneven_shard_order_is_misplaced_by_torchs_strided_encoding_but_pinned_here():
    # shard by d1 first, then d0: torch 2.13 encodes this as (_S(0, 2), S(0))
    spec = Spec(Mesh.create((3, 2)), (Shard(0), Shard(0)), (7,), "float64", {0: (1, 0)})
    x = _value(spec)
    ours = shard(x, spec)
    # d1 chunks 7 into [0,4) and [4,7); d0 chunks each of those into 3 (2+2+0, 1+1+1)
    assert [ours[r].tolist() for r in range(6)] == [
        [0.0, 1.0], [4.0],
        [2.0, 3.0], [5.0],
        [], [6.0],
    ]  # fmt: skip
    # torch reads (_S(0, 2), S(0)) literally: row 6 lands on rank 4, rank 5 gets nothing
    theirs = run_distribute(spec, x, src_data_rank=None)
    assert theirs.locals[4].tolist() == [6.0] and theirs.locals[5].tolist() == []
    assert theirs.offsets[4] == (6,) and global_offset(spec, 4) == (7,)
    with pytest.raises(PlacementError, match="uneven"):
        to_torch(spec)
    # torch's explicit shard order means what meshplan means
    assert torch.equal(gather_with_shard_order(spec, ours), x)


def test_permuted_rank_map_places_by_mesh_coordinate_unlike_torch_scatter():
    mesh = Mesh.create((2, 2), ranks=[3, 1, 2, 0])
    spec = Spec(mesh, (Shard(0), Shard(0)), (8,), "float64")
    x = _value(spec)
    ours = shard(x, spec)
    # rank 3 sits at coordinate (0, 0) and holds the first rows
    assert ours[3].tolist() == [0.0, 1.0] and ours[0].tolist() == [6.0, 7.0]
    scattered = run_distribute(spec, x, src_data_rank=0)
    assert scattered.offsets[0] == (6,)  # torch's own offsets agree with meshplan ...
    assert scattered.locals[0].tolist() != [6.0, 7.0]  # ... but its scatter does not


@given(st.integers(0, 40), st.integers(1, 6))
def test_chunk_bounds_follow_torch_chunk(n, parts):
    from meshplan.placement import chunk_bounds

    pieces = torch.arange(n).chunk(parts)
    bounds = [chunk_bounds(n, parts, i) for i in range(parts)]
    got = [list(range(a, b)) for a, b in bounds]
    want = [p.tolist() for p in pieces] + [[]] * (parts - len(pieces))
    assert got == want
    assert all(a == n for a, b in bounds if a == b)  # empty pieces start at the end

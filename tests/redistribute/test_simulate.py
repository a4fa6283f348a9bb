"""The simulator runs every step kind as the reference semantics says (hand-made steps)."""

from __future__ import annotations

import pytest
import torch

from meshplan.errors import PlanError
from meshplan.layout import Mesh
from meshplan.placement import Partial, Replicate, Spec, parse_placements, shard, unshard
from meshplan.redistribute import Plan, Step, simulate

MESH = Mesh.create((2, 2), ("a", "b"))


def spec(text, shape=(5, 3), dtype="float64", mesh=MESH):
    pl, order = parse_placements(text)
    return Spec(mesh, pl, shape, dtype, order)


def x_of(shape=(5, 3), dtype=torch.float64):
    return torch.arange(1, 1 + torch.Size(shape).numel(), dtype=dtype).reshape(shape)


def run(step, x=None, partial=False):
    x = x_of(step.src.shape) if x is None else x
    out = simulate(step, shard(x, step.src))
    if partial:
        return torch.equal(unshard(out, step.dst), x)
    want = shard(x, step.dst)
    return all(torch.equal(out[r], want[r]) for r in want)


@pytest.mark.parametrize(
    "dims, src, dst, kind",
    [
        (1, "S(0) S(0)", "S(0) R", "all_gather"),
        (0, "S(0) R", "S(1) R", "all_to_all"),
        ((0, 1), "S(0) S(0)", "S(0)[1,0] S(0)", "all_permute"),
        ((0, 1), "S(0) S(1)", "S(1) S(0)", "all_permute"),
        ((0, 1), "S(0) R", "R S(0)", "all_permute"),
        (1, "S(0) R", "S(0) SS(1,2)", None),
        (0, "SS(0,2) R", "R R", "all_gather"),
        (0, "SS(0,2) R", "S(0) R", "all_to_all"),
        (1, "R R", "R S(0)", None),
    ],
)
def test_data_moving_and_slicing_steps(dims, src, dst, kind):
    assert run(Step(dims, spec(src), spec(dst), kind))


@pytest.mark.parametrize(
    "src, dst",
    [
        ("R S(1)", "P(sum) S(1)"),
        ("R S(1)", "P(avg) S(1)"),
        ("R R", "P(max) R"),
        ("S(0) S(1)", "P(max) S(1)"),
        ("S(0) S(1)", "P(min) S(1)"),
        ("S(0) S(1)", "P(avg) S(1)"),
        ("S(0) R", "P(sum) R"),
    ],
)
def test_steps_to_partial_keep_the_value(src, dst):
    assert run(Step(0, spec(src), spec(dst), None), partial=True)


def test_partial_sum_and_avg_rescale_locally():
    x = x_of((4, 2))
    s_sum, s_avg = spec("P(sum) R", (4, 2)), spec("P(avg) R", (4, 2))
    out = simulate(Step(0, s_sum, s_avg, None), shard(x, s_sum))
    assert torch.allclose(unshard(out, s_avg), x)
    back = simulate(Step(0, s_avg, s_sum, None), out)
    assert torch.allclose(unshard(back, s_sum), x)


def _parts(spec_, x):
    """Parts that sum to x along the Partial dims: rank r holds x * (r + 1) / total."""
    plain = [Replicate() if isinstance(p, Partial) else p for p in spec_.placements]
    loc = shard(x, spec_.with_placements(plain, spec_.shard_order))
    weights = {r: r + 1 for r in loc}
    total = sum(weights.values())
    return {r: v * weights[r] / total for r, v in loc.items()}


def test_reductions_sum_the_parts():
    x = x_of((4, 2))
    src = spec("P(sum) P(sum)", (4, 2))
    parts = _parts(src, x)
    for dims, dst_text, kind in [
        ((0, 1), "R R", "all_reduce"),
        ((0, 1), "S(0) S(0)", "reduce_scatter"),
    ]:
        mesh = MESH.flatten(("a", "b"), "ab")
        s = Spec(mesh, src.placements, src.shape, src.dtype)
        d = spec(dst_text, (4, 2), mesh=mesh)
        out = simulate(Step(dims, s, d, kind, alias="ab"), parts)
        want = shard(x, d)
        assert all(torch.allclose(out[r], want[r]) for r in want)


def test_merged_sum_and_avg_reduction_divides_by_the_avg_sizes():
    mesh = MESH.flatten(("a", "b"), "ab")
    src = Spec(mesh, parse_placements("P(sum) P(avg)")[0], (4, 2), "float64")
    dst = Spec(mesh, parse_placements("R R")[0], (4, 2), "float64")
    x = x_of((4, 2))
    step = Step((0, 1), src, dst, "all_reduce", alias="ab")
    assert step.avg_scale == 2
    out = simulate(step, shard(x, src))
    assert all(torch.allclose(out[r], x) for r in out)


def test_integer_steps_are_exact():
    x = x_of((6, 4), torch.int64)
    a, b = spec("S(0) S(1)", (6, 4), "int64"), spec("R S(0)", (6, 4), "int64")
    mid = spec("R S(1)", (6, 4), "int64")
    p = Plan(a, b, (Step(0, a, mid, "all_gather"), Step(1, mid, b, "all_to_all")))
    out = simulate(p, shard(x, a))
    want = shard(x, b)
    assert all(torch.equal(out[r], want[r]) for r in want)


def test_empty_shards_take_local_steps():
    # 1 row over 4 ranks: three of them hold nothing and still take part
    mesh = Mesh.create(4)
    a = Spec(mesh, parse_placements("S(0)")[0], (1, 3), "float64")
    b = Spec(mesh, parse_placements("P(max)")[0], (1, 3), "float64")
    x = x_of((1, 3))
    out = simulate(Step(0, a, b, None), shard(x, a))
    assert torch.equal(unshard(out, b), x)


def test_bad_locals_are_named():
    src, dst = spec("P S(0)"), spec("R S(0)")
    step = Step(0, src, dst, "all_reduce")
    good = shard(x_of(), src)  # ranks 0 and 2 hold 3 rows, 1 and 3 hold 2
    with pytest.raises(PlanError, match="rank 3's tensor"):
        simulate(step, {r: t for r, t in good.items() if r != 3})
    with pytest.raises(PlanError, match=r"rank 1's local tensor is float64\[3, 3\]"):
        simulate(step, {**good, 1: torch.zeros(3, 3, dtype=torch.float64)})
    with pytest.raises(PlanError, match="float32"):
        simulate(step, {**good, 1: torch.zeros(2, 3)})
    with pytest.raises(PlanError, match="needs a dict"):
        simulate(step, {})
    with pytest.raises(PlanError, match="rank 9 is not in mesh"):
        simulate(step, {**good, 9: torch.zeros(3, 3, dtype=torch.float64)})
    with pytest.raises(PlanError, match="runs a Plan or a Step"):
        simulate("plan", good)


def test_a_step_names_its_mesh_dims_by_name_or_index():
    a, b = spec("S(0) R"), spec("R R")
    assert (
        Step("a", a, b, "all_gather") == Step(0, a, b, "all_gather") == Step(-2, a, b, "all_gather")
    )
    with pytest.raises(PlanError, match="'c' is not a dim"):
        Step("c", a, b, "all_gather")
    with pytest.raises(PlanError, match="from a Spec to a Spec"):
        Step(0, "S(0) R", b, "all_gather")


def test_invalid_data_moving_step_raises():
    with pytest.raises(PlanError, match="cannot deliver"):
        run(Step(0, spec("S(0) S(0)"), spec("R S(0)"), "all_gather"))


def test_a_local_step_that_needs_communication_is_refused():
    # dim 1 already shards tensor dim 1 (default order: a first, then b); slicing on a would
    # need data other ranks hold, so the step is not local
    from meshplan.errors import PlanError
    from meshplan.layout import Mesh as _Mesh
    from meshplan.placement import Replicate as _R
    from meshplan.placement import Shard as _S
    from meshplan.placement import Spec as _Spec
    from meshplan.placement import shard as _shard
    from meshplan.redistribute import Step as _Step
    from meshplan.redistribute import simulate as _simulate

    mesh = _Mesh.create((2, 2), ("a", "b"))
    src = _Spec(mesh, (_R(), _S(1)), (4, 4))
    dst = _Spec(mesh, (_S(1), _S(1)), (4, 4))
    x = torch.arange(16.0).reshape(4, 4)
    with pytest.raises(PlanError, match="needs communication"):
        _simulate(_Step(0, src, dst, None), _shard(x, src))


@pytest.mark.parametrize(
    "dims, src, dst, kind, match",
    [
        # regression: each was taken, and simulate returned some rank a wrong tensor
        (0, "P(sum) R", "R R", "all_gather", "copies values"),
        (0, "P(sum) R", "P(sum) R", "all_gather", "copies values"),
        (0, "R R", "P(sum) R", "all_to_all", "copies values"),
        (0, "S(0) R", "P(sum) R", "all_permute", "copies values"),
        (0, "P(max) R", "P(sum) R", "all_reduce", "ends Replicate"),
        (0, "P(sum) R", "P(sum) R", "all_reduce", "ends Replicate"),
        (0, "P(sum) R", "S(0) R", "all_reduce", "ends Replicate"),
        (0, "P(sum) R", "P(sum) R", "reduce_scatter", "ends sharded"),
        (0, "P(sum) R", "R R", "reduce_scatter", "ends sharded"),
        (0, "S(0) R", "R R", "all_reduce", "starts Partial"),
        ((0, 0), "S(0) R", "S(0) R", None, "twice"),
        (("a", 0), "S(0) R", "R R", "all_gather", "twice"),
    ],
)
def test_a_step_its_collective_cannot_make_is_refused(dims, src, dst, kind, match):
    with pytest.raises(PlanError, match=match):
        Step(dims, spec(src), spec(dst), kind)

"""plan_program's progress reports: stages in order, counts that never pass their totals,
and the same program with or without a listener."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.errors import StrategyError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec
from meshplan.strategy import PROGRESS_STAGES, plan_program


def _mlp(x, w1, w2):
    return ((x @ w1).relu() @ w2).sum()


def _specs(shape, placements):
    mesh = Mesh.create(shape, ("dp", "tp")[: len(shape)])
    x = Spec(mesh, placements, (8, 4), "float64")
    w1 = Spec(mesh, [Replicate()] * len(shape), (4, 6), "float64")
    w2 = Spec(mesh, [Replicate()] * len(shape), (6, 2), "float64")
    return x, w1, w2


@given(
    mesh_shape=st.sampled_from([(2,), (2, 2)]),
    shard_batch=st.booleans(),
)
def test_progress_reports_every_stage_in_order_and_changes_nothing(mesh_shape, shard_batch):
    first = [Shard(0) if shard_batch else Replicate()] + [Replicate()] * (len(mesh_shape) - 1)
    specs = _specs(mesh_shape, first)
    seen: list[tuple[str, int, int]] = []
    program = plan_program(_mlp, *specs, progress=lambda *r: seen.append(r))
    stages = [s for s, _, _ in seen]
    assert set(stages) == set(PROGRESS_STAGES)
    order = [PROGRESS_STAGES.index(s) for s in stages]
    assert order == sorted(order)
    assert all(0 <= done <= total for _, done, total in seen if total)
    assert seen[0] == ("trace", 0, 1) and ("trace", 1, 1) in seen
    ops = len(program.ops)
    assert ("strategies", ops, ops) in seen
    assert program.explain() == plan_program(_mlp, *specs).explain()


def test_progress_must_be_callable():
    with pytest.raises(StrategyError, match="progress must be a callable"):
        plan_program(_mlp, *_specs((2,), [Shard(0)]), progress="yes")

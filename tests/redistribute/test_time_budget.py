"""The planner's default budget bounds time on every input: a pair on a (2,)*8 mesh plans
in a second or two whatever the tensor's size (or returns the best plan found with its
proven gap), and the budget is a typed value (``Planner(max_seconds=...)``) checked like
every other argument."""

from __future__ import annotations

import time
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.errors import BudgetWarning, PlanError
from meshplan.layout import Mesh
from meshplan.placement import Partial, Replicate, Shard, Spec
from meshplan.redistribute import MergeWarning, Planner, cost, plan

EIGHT = Mesh.create((2,) * 8)
# generous against a loaded machine, far below what an unbounded search took (minutes)
SECONDS = 6.0


def _timed_plan(a, b, planner):
    start = time.thread_time()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        p = plan(a, b, planner=planner)
    spent = time.thread_time() - start
    gaps = [w.message for w in record if issubclass(w.category, BudgetWarning)]
    return p, spent, gaps


@pytest.mark.parametrize("bits", [20, 24])
def test_a_gather_of_a_large_tensor_over_eight_dims_plans_in_seconds(bits):
    # regression: 2**20 elements took 36 s at max_states=100_000, minutes at the default
    a = Spec(EIGHT, [Shard(0)] * 8, (2**bits,))
    b = Spec(EIGHT, [Replicate()] * 8, (2**bits,))
    p, spent, gaps = _timed_plan(a, b, Planner())
    assert spent < SECONDS
    assert p.src == a and p.dst == b
    for w in gaps:  # a plan past the budget comes with its proven gap
        assert cost(p).total <= w.lower + w.gap + 1e-12


_PLACEMENTS = st.sampled_from([Shard(0), Shard(1), Replicate(), Partial()])


@settings(max_examples=4, deadline=None)
@given(
    st.lists(_PLACEMENTS, min_size=8, max_size=8),
    st.lists(_PLACEMENTS.filter(lambda p: not isinstance(p, Partial)), min_size=8, max_size=8),
    st.integers(10, 12),
    st.integers(8, 12),
)
def test_random_pairs_on_eight_dims_plan_in_seconds(src, dst, rows, cols):
    a = Spec(EIGHT, src, (2**rows, 2**cols))
    b = Spec(EIGHT, dst, (2**rows, 2**cols))
    p, spent, gaps = _timed_plan(a, b, Planner())
    assert spent < SECONDS
    assert p.src == a and p.dst == b
    for w in gaps:
        assert cost(p).total <= w.lower + w.gap + 1e-12


def test_a_time_budget_cuts_the_search_and_proves_a_gap():
    a = Spec(EIGHT, [Shard(0)] * 8, (2**20,))
    b = Spec(EIGHT, [Replicate()] * 8, (2**20,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MergeWarning)
        with pytest.warns(BudgetWarning, match=r"max_seconds=0\.01") as record:
            p = plan(a, b, planner=Planner(max_states=None, max_seconds=0.01))
    w = record[0].message
    assert w.limit == 0.01
    assert cost(p).total <= w.lower + w.gap + 1e-12
    with pytest.raises(PlanError, match=r"max_seconds=0\.01"):
        plan(a, b, planner=Planner(max_states=None, max_seconds=0.01, on_budget="raise"))


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), 10**400, "1s", True])
def test_max_seconds_must_be_a_positive_finite_number_or_none(bad):
    with pytest.raises(PlanError, match="max_seconds"):
        Planner(max_seconds=bad)


def test_huge_max_states_is_accepted_as_no_practical_bound():
    assert Planner(max_states=10**400).max_states == 10**400


_SMALL = Mesh.create((2, 2, 2))
_SMALL_PLACEMENTS = st.sampled_from([Shard(0), Shard(1), Replicate(), Partial()])


@settings(max_examples=10, deadline=None)
@given(
    st.lists(_SMALL_PLACEMENTS, min_size=3, max_size=3),
    st.lists(_SMALL_PLACEMENTS, min_size=3, max_size=3),
    st.sampled_from([(8, 4), (3, 5), (1, 8)]),
)
def test_the_plan_through_the_common_prefix_delivers(src, dst, shape):
    # the plan taken when no search found one in its time: gather or reduce what the
    # shard orders do not share, then slice
    from _plan_cases import delivers, values

    from meshplan.redistribute._budgeted import through_common_prefix
    from meshplan.redistribute._planner import _planned
    from meshplan.redistribute._profile import as_model

    a = Spec(_SMALL, src, shape, "float64")
    b = Spec(_SMALL, dst, shape, "float64")
    planner, model = Planner(), as_model(None)
    p = through_common_prefix(
        lambda s, d: _planned(planner, s, d, model, True, None, "time")[0], a, b
    )
    if p is not None:
        assert p.src == a and p.dst == b
        assert delivers(p, values(shape))


def test_raising_past_the_budget_names_the_pair_asked_for_and_its_limit():
    # the greedy search finds no plan in its time either: raising, the planner raises for
    # the pair asked for (it made the plan through the common prefixes only to drop it,
    # and a leg cut in turn raised naming the leg)
    p_ = Partial()
    src = [p_, p_, Shard(0), Shard(0), Replicate(), p_, Shard(1), p_]
    dst = [Shard(1), Shard(0), Shard(0), Shard(0), Replicate(), Shard(0), Shard(1), Shard(0)]
    a = Spec(EIGHT, src, (2**11, 2**11))
    b = Spec(EIGHT, dst, (2**11, 2**11))
    with pytest.raises(PlanError, match=r"max_seconds=0\.02") as info:
        plan(a, b, planner=Planner(max_seconds=0.02, on_budget="raise"))
    assert str(a) in str(info.value) and str(b) in str(info.value)
    # taking the best plan found, where none was found at all in the time: the error names
    # the pair asked for, says so, and does not advise on_budget='best' (taken already)
    with pytest.raises(PlanError, match=r"found no plan in max_seconds=0\.001 s") as info:
        plan(a, b, planner=Planner(max_seconds=0.001))
    assert str(a) in str(info.value) and "on_budget" not in str(info.value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = plan(a, b, planner=Planner())  # the best found, past the default budget
    assert p.src == a and p.dst == b

"""Regressions: the shell's entry points refuse wrong arguments with typed meshplan errors,
and ``check_specs=True`` catches ranks that run different plans."""

import pytest
import torch

from meshplan.errors import MeshplanError, PlanError, RuntimeShellError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec
from meshplan.redistribute import plan
from meshplan.runtime import ProcessGroups, prepare_groups, redistribute, run

MESH = Mesh.create(4)
SRC = Spec(MESH, (Shard(0),), (8,), "float32")
DST = Spec(MESH, (Replicate(),), (8,), "float32")


@pytest.fixture(scope="module")
def groups(fake_world):
    return ProcessGroups(MESH)


@pytest.mark.parametrize("bad", [None, "x", 3, MESH, object()])
def test_run_and_redistribute_refuse_what_is_not_process_groups(bad):
    p = plan(SRC, DST)
    with pytest.raises(RuntimeShellError, match="ProcessGroups"):
        run(p, torch.zeros(2), bad)
    with pytest.raises(RuntimeShellError, match="ProcessGroups"):
        redistribute(torch.zeros(2), SRC, DST, bad)
    with pytest.raises(RuntimeShellError, match="ProcessGroups"):
        prepare_groups(p, bad)


@pytest.mark.parametrize("bad", [None, "plan", SRC, 3])
def test_run_and_prepare_groups_refuse_what_is_not_a_plan(groups, bad):
    with pytest.raises(PlanError, match="Plan"):
        run(bad, torch.zeros(2), groups)
    with pytest.raises(PlanError, match="Plan"):
        prepare_groups(bad, groups)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_check_specs_must_be_a_bool(fake_world, bad):
    with pytest.raises(RuntimeShellError, match="check_specs"):
        ProcessGroups(MESH, check_specs=bad)


def test_every_shell_error_is_a_meshplan_error():
    assert issubclass(RuntimeShellError, MeshplanError) and issubclass(PlanError, MeshplanError)


# -- check_specs on 4 gloo ranks ----------------------------------------------------------

GLOO = Mesh.create((2, 2), ("a", "b"))


def _run_with(shape_of_rank, check):
    import torch.distributed as dist

    rank = dist.get_rank()
    shape = shape_of_rank[rank]
    src = Spec(GLOO, (Shard(0), Shard(1)), shape, "float32")
    dst = Spec(GLOO, (Replicate(), Replicate()), shape, "float32")
    groups = ProcessGroups(GLOO, check_specs=check, timeout=30)
    local = torch.full((shape[0] // 2, shape[1] // 2), float(rank))
    try:
        out = run(plan(src, dst), local, groups)
        out = run(plan(src, dst), local, groups)  # the second run is not checked again
    except RuntimeShellError as e:
        return ("RuntimeShellError", str(e))
    return ("ok", tuple(out.shape))


def test_ranks_that_disagree_on_a_spec_all_raise_with_check_specs(pool4):
    shapes = {0: (4, 6), 1: (6, 4), 2: (4, 6), 3: (4, 6)}  # the same local size everywhere
    silent = pool4.run(_run_with, shapes, False)
    assert [kind for kind, _ in silent] == ["ok"] * 4  # without the check: wrong data, no error
    checked = pool4.run(_run_with, shapes, True)
    for kind, text in checked:
        assert kind == "RuntimeShellError" and "different plans" in text, text


def test_ranks_that_agree_run_as_before_with_check_specs(pool4):
    shapes = {r: (4, 6) for r in range(4)}
    assert pool4.run(_run_with, shapes, True) == [("ok", (4, 6))] * 4


def _run_other_plans():
    """Ranks 1 and 3 run another plan between the same specs (as a search cut by its CPU
    budget at another point would give): every rank runs rank 0's, and the data is right."""
    import torch.distributed as dist

    from meshplan.placement import shard, unshard
    from meshplan.redistribute import Plan

    rank = dist.get_rank()
    src = Spec(GLOO, (Shard(0), Shard(1)), (4, 4), "float32")
    dst = Spec(GLOO, (Replicate(), Replicate()), (4, 4), "float32")
    mid = Spec(GLOO, (Shard(1), Shard(0)), (4, 4), "float32")
    p = plan(src, dst)
    if rank in (1, 3):
        p = Plan(src, dst, plan(src, mid).steps + plan(mid, dst).steps)
    groups = ProcessGroups(GLOO, timeout=30)
    whole = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    local = shard(whole, src)[rank]
    other = Plan(src, dst, plan(src, mid).steps + plan(mid, dst).steps)
    out = run(p, local, groups)
    again = run(p, local, groups)  # agreed once: the same plan runs again unchecked
    # the other ranks now hold the other plan: the specs were agreed on, so no rank votes
    # again (a rank voting alone would wait for the others until the timeout)
    swapped = run(other if rank in (0, 2) else plan(src, dst), local, groups)
    ok = torch.equal(out, unshard({r: out for r in range(4)}, dst)) and torch.equal(out, whole)
    ok = ok and torch.equal(again, whole) and torch.equal(swapped, whole)
    return ok, len(groups._agreed_plans[(src, dst)].steps)


def test_ranks_whose_plans_differ_between_the_same_specs_run_the_lowest_ranks(pool4):
    results = pool4.run(_run_other_plans, timeout=120)
    assert [ok for ok, _ in results] == [True] * 4
    assert {steps for _, steps in results} == {2}  # rank 0's plan: two all_gathers


# -- the check is on by default ----------------------------------------------------------


def _run_default(specs_of_rank):
    """Every rank runs its own (src, dst) pair on default ProcessGroups (short timeout)."""
    import torch.distributed as dist

    rank = dist.get_rank()
    src, dst = specs_of_rank[rank]
    groups = ProcessGroups(GLOO, timeout=30)
    assert groups.check_specs is True
    from meshplan.placement import local_shape

    local = torch.full(local_shape(src, rank), float(rank))
    try:
        run(plan(src, dst), local, groups)
    except RuntimeShellError as e:
        return ("RuntimeShellError", str(e))
    return ("ok", None)


def _pair(shape, src, dst):
    return Spec(GLOO, src, shape, "float32"), Spec(GLOO, dst, shape, "float32")


R, S0, S1 = Replicate(), Shard(0), Shard(1)


@pytest.mark.parametrize(
    "mine, theirs",
    [
        # the same local size, so the collectives match in size: silently wrong data
        (_pair((4, 6), (S0, S1), (R, R)), _pair((6, 4), (S0, S1), (R, R))),
        # other collectives on other groups: without the check, ranks wait on each other
        (_pair((4, 4), (S0, S1), (R, R)), _pair((4, 4), (S0, S1), (S0, R))),
    ],
    ids=["same-size", "other-steps"],
)
def test_ranks_that_run_different_plans_all_raise_by_default(pool4, mine, theirs):
    results = pool4.run(_run_default, {0: mine, 1: theirs, 2: mine, 3: mine}, timeout=120)
    for kind, text in results:
        assert kind == "RuntimeShellError" and "different plans" in text, text


def _default_flag():
    import torch.distributed as dist  # noqa: F401

    return ProcessGroups(GLOO).check_specs, ProcessGroups(GLOO, check_specs=False).check_specs


def test_check_specs_is_on_by_default_with_an_opt_out(pool4):
    assert pool4.run(_default_flag) == [(True, False)] * 4

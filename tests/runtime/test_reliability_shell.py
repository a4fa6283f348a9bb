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

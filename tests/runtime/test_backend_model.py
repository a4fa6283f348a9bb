"""The shell plans with its backend's cost model and objective when its caller names none."""

import pytest
import torch
import torch.distributed as dist

from meshplan.errors import RuntimeShellError
from meshplan.layout import Mesh
from meshplan.placement import Spec, parse_placements, shard_one
from meshplan.redistribute import CostModel, HardwareProfile, plan
from meshplan.runtime import ProcessGroups, redistribute
from meshplan.runtime._backend_model import backend_plan_options, check_plan_options, runs_on_gloo

GLOO = CostModel(HardwareProfile.gloo_cpu())


@pytest.mark.parametrize(
    ("backend", "device", "expected"),
    [
        ("gloo", "cpu", True),
        ("GLOO", "cpu", True),
        ("nccl", "cuda", False),
        ("nccl", "cpu", False),
        ("cpu:gloo,cuda:nccl", "cpu", True),
        ("cpu:gloo,cuda:nccl", "cuda", False),
        ("mpi", "cpu", False),
    ],
)
def test_runs_on_gloo_reads_the_backend_of_the_device(backend, device, expected):
    assert runs_on_gloo(backend, device) is expected


def test_gloo_plans_with_the_host_preset_and_fewest_collectives_others_with_the_gpu_preset():
    assert backend_plan_options("gloo", "cpu") == (GLOO, "collectives")
    assert backend_plan_options("cpu:gloo,cuda:nccl", "cpu") == (GLOO, "collectives")
    assert backend_plan_options("nccl", "cuda") == (CostModel.default(), "time")
    assert backend_plan_options("cpu:gloo,cuda:nccl", "cuda") == (CostModel.default(), "time")


def test_bad_plan_options_name_the_value_and_the_fix():
    with pytest.raises(RuntimeShellError, match=r"CostModel\(profile\)"):
        check_plan_options(HardwareProfile.gloo_cpu(), None)
    with pytest.raises(RuntimeShellError, match="'fastest'"):
        check_plan_options(None, "fastest")
    check_plan_options(GLOO, "time")  # fine


def _specs(shape, src_text, dst_text):
    mesh = Mesh.create((2, 2, 2), ("a", "b", "c")).flatten(("a", "c"), "ac")
    placements, order = parse_placements(src_text)
    src = Spec(mesh, placements, shape, "float32", order)
    placements, order = parse_placements(dst_text)
    dst = Spec(mesh, placements, shape, "float32", order)
    return src, dst


def _defaults_on_gloo(shape):
    """On every rank: the groups' options (default, and as given), and what the
    default redistribute of ``P R P -> S(0) R R`` ran."""
    rank = dist.get_rank()
    src, dst = _specs(shape, "P(sum) R P(sum)", "S(0) R R")
    groups = ProcessGroups(src.mesh)
    given = ProcessGroups(src.mesh, cost_model=CostModel.default(), objective="time")
    x = torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape) % 7
    local = x.clone()  # every rank holds a partial sum equal to x: the sum is 4 x
    out = redistribute(local, src, dst, groups)
    expected = plan(src, dst, **groups.plan_options())
    return {
        "default": groups.plan_options(),
        "given": given.plan_options(),
        "call": groups.plan_options(GLOO),
        "ran": [p.collectives for p in groups._runs if getattr(p, "src", None) == src],
        "expected": expected.collectives,
        "correct": torch.equal(out, shard_one(4 * x, dst, rank)),
    }


def test_a_call_naming_no_cost_model_plans_with_the_gloo_options(pool8):
    # 4 MiB: the GPU preset reduce-scatters on the alias, then all-gathers (two
    # collectives, each an all_reduce's price or more on gloo); gloo's options take one
    # all_reduce on the alias and a local slice
    shape = (16384, 64)
    src, dst = _specs(shape, "P(sum) R P(sum)", "S(0) R R")
    assert len(plan(src, dst).collectives) == 2  # the GPU preset's choice
    for r in pool8.run(_defaults_on_gloo, shape):
        assert r["default"] == {"cost_model": GLOO, "objective": "collectives"}
        assert r["given"] == {"cost_model": CostModel.default(), "objective": "time"}
        assert r["call"] == {"cost_model": GLOO, "objective": "time"}
        assert r["expected"] == ("all_reduce",)
        assert r["ran"] == [("all_reduce",)]
        assert r["correct"]


def _bad_options():
    out = {}
    mesh = Mesh.create(4)
    for name, kwargs in {
        "profile": {"cost_model": HardwareProfile.gloo_cpu()},
        "objective": {"objective": "fastest"},
    }.items():
        try:
            ProcessGroups(mesh, **kwargs)
        except RuntimeShellError as e:
            out[name] = str(e)
    return out


def test_process_groups_refuse_bad_plan_options(pool4):
    for r in pool4.run(_bad_options):
        assert "CostModel(profile)" in r["profile"]
        assert "'fastest'" in r["objective"]

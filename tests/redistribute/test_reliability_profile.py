"""Regressions: hostile hardware-profile text is a PlanError (or exit 2 on the command line)."""

import math

import pytest

from meshplan.errors import PlanError
from meshplan.layout import Mesh
from meshplan.placement import Partial, Replicate, Shard, Spec
from meshplan.redistribute import CostModel, HardwareProfile, Link, cost, plan
from meshplan.redistribute._cli import main
from meshplan.redistribute._profile import MAX_SECONDS, MIN_BYTES_PER_S


@pytest.mark.parametrize(
    "text",
    ["[" * 100000, "{" * 100000, b"[" * 100000, '{"a":' * 50000, b"\xff\xfe{}"],
    ids=["lists", "objects", "bytes", "keys", "not-utf8"],
)
def test_deeply_nested_or_undecodable_profile_text_is_a_plan_error(text):
    with pytest.raises(PlanError, match="hardware profile"):
        HardwareProfile.from_json(text)


@pytest.mark.parametrize(
    "content", [b"\xff\xfe\x00junk", b"\x80" * 10, b"[" * 100000], ids=["bom", "high", "nested"]
)
def test_a_profile_file_that_is_not_utf8_json_exits_2_with_one_line(capsys, tmp_path, content):
    path = tmp_path / "profile.json"
    path.write_bytes(content)
    argv = ["plan", "--mesh", "2", "--src", "S(0)", "--dst", "R", "--shape", "4"]
    assert main(argv + ["--profile", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshplan: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_a_directory_as_profile_exits_2(capsys, tmp_path):
    argv = ["plan", "--mesh", "2", "--src", "S(0)", "--dst", "R", "--shape", "4"]
    assert main(argv + ["--profile", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("meshplan: error: ")


# -- numbers whose sums overflow: refused, naming the field ---------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"intra": (1e308, 1e9)}, "intra"),
        ({"inter": (1e300, 1e9)}, "inter"),
        ({"dims": [(1e-6, 1e9), (1e200, 1e9)]}, "latency_s"),
        ({"launch_s": 1e308}, "launch_s"),
        ({"local_launch_s": 1e300}, "local_launch_s"),
        ({"copy_bytes_per_s": 1e-320}, "copy_bytes_per_s"),
        ({"reduce_bytes_per_s": 5e-324}, "reduce_bytes_per_s"),
        ({"intra": (1e-6, 1e-310)}, "intra"),
        ({"per_collective": {"all_reduce": [(1e-6, 1e9), (1e308, 1e9)]}}, "latency_s"),
        ({"flattened": {(0, 1): (1e-6, 1e-320)}}, "bytes_per_s"),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(v),
)
def test_a_profile_whose_prices_would_overflow_is_refused_naming_the_field(kwargs, field):
    with pytest.raises(PlanError, match=field):
        HardwareProfile(**kwargs)


def test_a_link_whose_prices_would_overflow_is_refused_naming_the_field():
    with pytest.raises(PlanError, match=r"Link\.latency_s is 1e\+308 s"):
        Link(1e308, 1e9)
    with pytest.raises(PlanError, match=r"Link\.bytes_per_s is 1e-320 bytes/s"):
        Link(1e-6, 1e-320)


@pytest.mark.parametrize("text", ['{"meshplan_hardware_profile": 1, "intra": [1e308, 1e9]}'])
def test_a_profile_file_with_an_overflowing_latency_is_refused(text):
    with pytest.raises(PlanError, match="intra"):
        HardwareProfile.from_json(text)


def test_the_most_extreme_profile_accepted_prices_every_plan_finitely_and_in_order():
    """At the limits (slowest links, longest latencies accepted), prices stay finite on a
    big mesh for a big tensor, so the planner still ranks plans: the gathered plan costs
    more than the one that moves nothing."""
    worst = Link(MAX_SECONDS, MIN_BYTES_PER_S)
    hw = HardwareProfile(
        intra=worst,
        inter=worst,
        launch_s=MAX_SECONDS,
        local_launch_s=MAX_SECONDS,
        copy_bytes_per_s=MIN_BYTES_PER_S,
        reduce_bytes_per_s=MIN_BYTES_PER_S,
    )
    model = CostModel(hw)
    mesh = Mesh.create((2**12, 2**12))
    shape = (2**40, 2**20)  # 2**60 elements, 8 EiB in float64
    src = Spec(mesh, (Partial(), Shard(1)), shape, "float64")
    dst = Spec(mesh, (Replicate(), Replicate()), shape, "float64")
    gathered = cost(plan(src, dst, cost_model=model), model).total
    kept = cost(plan(src, src, cost_model=model), model).total
    assert math.isfinite(gathered) and kept < gathered, (gathered, kept)

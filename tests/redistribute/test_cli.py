"""The ``meshplan plan`` command prints the explained plan."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from meshplan.redistribute import reset_merge_warnings
from meshplan.redistribute._cli import main

ARGS = ["plan", "--mesh", "2x2x2", "--names", "a,b,c", "--shape", "8,8"]


def test_issue_example_prints_one_all_reduce_on_the_alias(capsys):
    status = main(ARGS + ["--flatten", "a,c", "--src", "P R P", "--dst", "R R R"])
    out = capsys.readouterr().out
    assert status == 0
    lines = out.splitlines()
    assert lines[0].startswith("Plan f32[8,8](P(sum) R P(sum)) -> f32[8,8](R R R)")
    assert "all_reduce" in lines[2] and "a_c=(a,c)" in lines[2] and "(0, 1, 4, 5)" in lines[2]
    assert lines[-1].startswith("total: 1 step (1 collective)")


def test_missing_alias_is_noted_with_the_flatten_call(capsys):
    reset_merge_warnings()
    assert main(ARGS + ["--src", "S(0) R S(0)", "--dst", "R R R"]) == 0
    out = capsys.readouterr().out
    assert "all_gather" in out and """mesh.flatten(('a', 'c'), "a_c")""" in out


def test_options_reach_the_planner(capsys):
    argv = ARGS + ["--flatten", "a,c=ac", "--src", "P R P", "--dst", "R R R", "--no-merge"]
    assert main(argv + ["--hardware", "gloo-cpu"]) == 0
    out = capsys.readouterr().out
    assert out.count("all_reduce") == 2 and "ac=" not in out
    assert main(ARGS + ["--src", "S(0)[2,0] R S(0)", "--dst", "S(0) R S(0)"]) == 0
    assert "all_permute" in capsys.readouterr().out
    # (2, 4) S(0) P -> R S(0) at 4 MiB: three collectives by time, two by count
    big = ["plan", "--mesh", "2x4", "--src", "S(0) P", "--dst", "R S(0)", "--shape", "1024,1024"]
    assert main(big) == 0
    assert capsys.readouterr().out.count("all_permute") == 1
    assert main(big + ["--objective", "collectives"]) == 0
    out = capsys.readouterr().out
    assert "all_permute" not in out and "all_reduce" in out


def test_a_saved_profile_prices_the_plan(capsys, tmp_path):
    from meshplan.redistribute import HardwareProfile, Link

    # a profile whose all_reduce is slow (saved as calibrate's would be): the merged
    # all_reduce gives way to a reduce_scatter and an all_gather
    argv = ARGS + ["--flatten", "a,c", "--src", "P R P", "--dst", "R R R", "--shape", "4096,256"]
    slow = HardwareProfile(per_collective={"all_reduce": Link(5e-6, 5e9)})
    path = tmp_path / "profile.json"
    path.write_text(slow.to_json())
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "all_reduce" in out and "reduce_scatter" not in out
    assert main(argv + ["--profile", str(path)]) == 0
    out = capsys.readouterr().out
    assert "all_reduce" not in out and "reduce_scatter" in out and "all_gather" in out
    # per-dim links for another mesh, a missing file, text that is no profile: exit 2
    path.write_text(HardwareProfile.from_dims([(1e-6, 1e9)] * 2).to_json())
    assert main(argv + ["--profile", str(path)]) == 2
    assert "calibrate it on this mesh" in capsys.readouterr().err
    assert main(argv + ["--profile", str(tmp_path / "none.json")]) == 2
    assert "none.json" in capsys.readouterr().err
    path.write_text("{}")
    assert main(argv + ["--profile", str(path)]) == 2
    assert "not a hardware profile" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one source of prices
        main(argv + ["--profile", str(path), "--hardware", "gloo-cpu"])
    assert "not allowed with argument" in capsys.readouterr().err
    assert main(argv + ["--profile", str(path), "--gpus-per-node", "4"]) == 2
    assert "a saved --profile has its own links" in capsys.readouterr().err
    assert main(argv + ["--hardware", "gloo-cpu", "--gpus-per-node", "4"]) == 2
    assert "--hardware gloo-cpu has no nodes" in capsys.readouterr().err
    assert main(argv + ["--gpus-per-node", "4"]) == 0
    assert main(argv + ["--gpus-per-node", "0"]) == 2
    assert "ranks_per_node must be an int >= 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--src", "S(0) R", "--dst", "R R R"], "2 placements"),
        (["--src", "Q R R", "--dst", "R R R"], "cannot parse placements"),
        (["--src", "R R R", "--dst", "R R R", "--flatten", "a,z"], "unknown mesh dim 'z'"),
        (["--src", "S(0) R R", "--dst", "R R R", "--max-local-bytes", "10"], "max_local_bytes"),
        (["--src", "R R R", "--dst", "R R R", "--flatten", "=x"], "--flatten '=x'"),
        # regression: the alias was named 'x,y'
        (["--src", "R R R", "--dst", "R R R", "--flatten", "a,c=x,y"], "one name"),
        (["--src", "R R R", "--dst", "R R R", "--flatten", "a,c="], "one name"),
    ],
)
def test_bad_input_exits_2_with_the_reason(capsys, extra, message):
    assert main(ARGS + extra) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("mesh", "shape", "bad"), [("2xq", "4", "--mesh"), ("2x", "4", "--mesh '2x'"),
                                                   ("2", "8,,8", "--shape '8,,8'")])  # fmt: skip
def test_bad_mesh_or_shape_text_exits_2(capsys, mesh, shape, bad):
    assert main(["plan", "--mesh", mesh, "--src", "R", "--dst", "R", "--shape", shape]) == 2
    assert bad in capsys.readouterr().err


def test_installed_console_script_runs():
    exe = shutil.which("meshplan")
    cmd = [exe] if exe else [sys.executable, "-m", "meshplan.redistribute._cli"]
    out = subprocess.run(
        cmd + ARGS + ["--flatten", "a,c", "--src", "P R P", "--dst", "R R R"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "all_reduce" in out.stdout and "a_c=(a,c)" in out.stdout

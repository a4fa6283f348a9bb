"""examples/train.py --auto on 2 gloo ranks (float64): the planner chooses every parameter's
layout within the FSDP x TP budget, trains with the losses of one-process torch, and a
checkpoint of the chosen specs resumes on another mesh (chosen again there) with the losses
of the uninterrupted run."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from test_train import PARITY, SCRIPT, STEP


def _train(*args: str) -> tuple[dict[int, float], str]:
    # planning the parameters' layouts too takes ~10 s of CPU: allow a loaded machine
    done = subprocess.run(
        [sys.executable, SCRIPT, "--dtype", "float64", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {int(k): float(x) for k, x in STEP.findall(done.stdout)}, done.stdout


@pytest.fixture(scope="module")
def auto_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("train_auto")
    losses, out = _train(
        "--auto", "--mesh", "2x1", "--steps", "4", "--check", "--save", str(folder),
        "--save-every", "2",
    )  # fmt: skip
    return folder, losses, out


def test_auto_prints_the_chosen_layouts_and_matches_one_process_torch(auto_run):
    _, losses, out = auto_run
    assert re.search(r"^auto-sharding: .* within [\d.]+ kB per rank", out, re.M), out
    assert re.search(r"^  h\.\*\.wq +\S", out, re.M), out  # one line per parameter group
    assert sorted(losses) == [1, 2, 3, 4] and losses[4] < losses[1], out
    diff, steps = PARITY.findall(out)[-1]
    assert int(steps) == 4 and float(diff) <= 1e-9, out


def test_auto_checkpoint_records_the_chosen_specs_and_resumes_on_another_mesh(auto_run):
    from meshplan.checkpoint import read_metadata

    folder, losses, _ = auto_run
    meta = read_metadata(folder / "step-2")
    saved = meta["h.0.w1"].spec
    assert saved.mesh.shape == (2, 1) and saved.dtype == "float64"
    resumed, out = _train(
        "--auto", "--mesh", "1x2", "--steps", "4", "--resume", str(folder / "step-2")
    )
    assert "resumed from" in out and sorted(resumed) == [3, 4], out
    for k, loss in resumed.items():
        assert abs(loss - losses[k]) <= 1e-9 * abs(losses[k]), (k, loss, losses[k], out)

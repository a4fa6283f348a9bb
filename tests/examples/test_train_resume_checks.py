"""examples/train.py checks ``--resume`` before it plans or starts any process: a missing
checkpoint, one of another dtype, and one whose training is already done are reported at
once (a checkpoint made here in one process, with the names train.py saves)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from meshplan.checkpoint import save
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Sharded, Spec

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train.py")
PLANNING = ("tracing and planning", "gloo processes")


def _train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, SCRIPT, "--mesh", "2x2", *args],
        capture_output=True,
        text=True,
        timeout=120,  # each answer comes before planning: seconds (a hang fails here)
    )


@pytest.fixture(scope="module")
def step4(tmp_path_factory):
    """A float64 checkpoint of step 4 under ``DIR/step-4`` (what check_resume reads)."""
    folder = tmp_path_factory.mktemp("resume")
    one = Mesh.create(1)
    state = {
        "tok_emb": Sharded(
            torch.zeros(64, 32, dtype=torch.float64),
            Spec(one, [Replicate()], (64, 32), "float64"),
            0,
        ),
        "state.counters": Sharded(torch.tensor([4, 4, 4]), Spec(one, [Replicate()], (3,), "int64"), 0),
    }
    save(state, folder / "step-4")
    return folder


def test_resume_from_a_missing_folder_fails_before_planning(tmp_path):
    done = _train("--resume", str(tmp_path / "nowhere"), "--steps", "2")
    assert done.returncode != 0
    assert "--resume" in done.stderr and "nowhere" in done.stderr
    assert not any(p in done.stdout for p in PLANNING), done.stdout


def test_resume_in_another_dtype_names_the_flag_that_fixes_it(step4):
    done = _train("--resume", str(step4), "--steps", "8", "--dtype", "float32")
    assert done.returncode != 0
    assert "resume with --dtype float64" in done.stderr, done.stderr
    assert "load(" not in done.stderr
    assert not any(p in done.stdout for p in PLANNING), done.stdout


def test_resume_when_training_is_done_says_so_at_once(step4):
    done = _train("--resume", str(step4), "--steps", "4", "--dtype", "float64")
    assert done.returncode == 0, done.stderr
    assert "training is already done" in done.stdout
    assert not any(p in done.stdout for p in PLANNING), done.stdout

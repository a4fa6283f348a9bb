"""examples/train.py end to end on 4 gloo ranks (float64): every step's loss equals one-process
torch autograd with the same optimizer, and a checkpoint saved in the background on one mesh
resumes on another with the losses of the uninterrupted run."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train.py")
STEP = re.compile(r"^step\s+(\d+) loss (\S+) ", re.M)
PARITY = re.compile(r"^parity: max rel loss diff (\S+) over (\d+) steps: pass \(tolerance", re.M)


def _train(*args: str) -> tuple[dict[int, float], str]:
    done = subprocess.run(
        [sys.executable, SCRIPT, "--dtype", "float64", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {int(k): float(x) for k, x in STEP.findall(done.stdout)}, done.stdout


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checked 4-step run on (dp 2, tp 2) that keeps the checkpoints of steps 2 and 4."""
    folder = tmp_path_factory.mktemp("train")
    losses, out = _train(
        "--mesh", "2x2", "--steps", "4", "--check", "--save", str(folder), "--save-every", "2"
    )
    return folder, losses, out


def test_a_checked_run_matches_one_process_torch_at_every_step(saved):
    _, losses, out = saved
    assert sorted(losses) == [1, 2, 3, 4], out
    assert losses[4] < losses[1], out  # it learns
    diff, steps = PARITY.findall(out)[-1]
    assert out.rstrip().splitlines()[-1].startswith("parity:"), out
    assert int(steps) == 4 and float(diff) <= 1e-9, out


def test_a_checkpoint_resumes_on_another_mesh_with_the_uninterrupted_losses(saved):
    folder, losses, saving = saved
    # the checkpoints were saved in the background while the next steps ran
    assert re.search(r"^saving .*step-2: held the loop", saving, re.M), saving
    assert saving.index("committed") > saving.index("step    3 loss"), saving
    resumed, out = _train("--mesh", "1x4", "--steps", "4", "--resume", str(folder / "step-2"))
    assert "resumed from" in out and sorted(resumed) == [3, 4], out
    for k, loss in resumed.items():
        assert abs(loss - losses[k]) <= 1e-9 * abs(losses[k]), (k, loss, losses[k], out)


def test_the_checkpoint_index_records_each_tensors_spec(saved):
    from meshplan.checkpoint import read_metadata
    from meshplan.placement import Replicate, Shard

    meta = read_metadata(saved[0] / "step-2")
    for key in ("h.0.wq", "optim.h.0.wq.exp_avg", "optim.h.0.wq.exp_avg_sq"):
        spec = meta[key].spec
        assert spec.mesh.shape == (2, 2) and spec.mesh.names == ("dp", "tp"), key
        assert spec.placements == (Shard(0), Shard(1)) and spec.dtype == "float64", key
    assert meta["h.1.w2"].spec.placements == (Shard(1), Shard(0))
    assert meta["state.rng"].spec.placements == (Replicate(), Replicate())
    assert "h.0.wq: f64[32,32](S(0) S(1)) on (2, 2) (dp, tp)" in str(meta)


def test_a_resume_from_a_truncated_shard_fails_on_every_rank_within_seconds(saved, tmp_path):
    import shutil
    import threading
    import time

    folder, _, _ = saved
    broken = tmp_path / "broken"
    shutil.copytree(folder / "step-2", broken)
    victim = sorted(broken.glob("shard-*.safetensors"))[-1]
    victim.write_bytes(victim.read_bytes()[:-100])
    proc = subprocess.Popen(
        [
            sys.executable,
            SCRIPT,
            "--dtype",
            "float64",
            "--mesh",
            "2x2",
            "--steps",
            "4",
            "--resume",
            str(broken),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines, training = [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if "; training" in line:
                training.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert training.wait(600), "".join(lines)  # planning and starting the ranks
        t0 = time.monotonic()
        proc.wait(timeout=60)  # the ranks' collectives would wait 300 s for the failed one
        seconds = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
        reader.join(10)
    out = "".join(lines)
    assert proc.returncode != 0 and "resumed from" not in out, out
    assert "truncated" in out and victim.name in out, out
    assert seconds < 60, (seconds, out)


def test_the_encoder_model_from_torch_matches_one_process_torch_at_every_step():
    # torch's nn.TransformerEncoderLayer stack, planned from the module (plan_module)
    losses, out = _train("--model", "encoder", "--mesh", "2x1", "--steps", "3", "--check")
    assert sorted(losses) == [1, 2, 3], out
    assert "model encoder" in out, out
    diff, steps = PARITY.findall(out)[-1]
    assert int(steps) == 3 and float(diff) <= 1e-9, out

"""The examples say what they are doing during their long phases: examples/redistribute.py
numbers its moves and announces calibration before its table, and train.py's planning
reports plan_program's stages as it goes."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def test_redistribute_example_reports_each_phase_before_its_table():
    done = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "redistribute.py")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    marks = [
        "starting 8 gloo processes",
        "ranks up; creating the process groups",
        "move 1/6: reduce over dp and tp (merged)",
        "move 6/6: uneven: reshard 1001 x 77",
        "calibrating: timing every collective",
    ]
    where = [out.find(m) for m in marks]
    where.append(re.search(r"^move\s+collectives\s+ok", out, re.M).start())  # the table
    assert all(w >= 0 for w in where) and where == sorted(where), out


def _train_module():
    spec = importlib.util.spec_from_file_location(
        "train_example", os.path.join(EXAMPLES, "train.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_planning_reports_its_stages_as_it_goes():
    train = _train_module()
    lines: list[str] = []
    opts = train.parse(["--mesh", "2x2", "--dtype", "float64"])
    program = train.plan(opts, train.make_mesh("2x2"), say=lines.append)
    text = "\n".join(lines)
    n = len(program.program.ops)
    assert "traced forward + backward" in text, text
    assert f"{n}/{n} ops given their candidate strategies" in text, text
    assert re.search(r"layout pairs priced|solver round", text), text
    assert lines[-1].startswith(f"planned {n} ops"), text
    stamps = [float(m) for m in re.findall(r"^\s+([\d.]+) s ", text, re.M)]
    assert len(stamps) >= 4 and stamps == sorted(stamps), text

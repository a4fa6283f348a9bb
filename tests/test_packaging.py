"""Packaging promises: what an install without the optional extras says, and the declared
torch range covers the torch this suite runs on."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent

BLOCK_HYPOTHESIS = """
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "hypothesis" or name.startswith("hypothesis."):
            raise ImportError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Block())
try:
    import meshplan.testing
except ImportError as exc:
    print(type(exc).__name__, exc)
else:
    print("imported")
"""


def test_meshplan_testing_without_hypothesis_names_the_extra():
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_HYPOTHESIS], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ImportError"), done.stdout
    assert "pip install 'meshplan[testing]'" in done.stdout


def test_the_extras_install_what_the_optional_modules_import():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert any(r.startswith("hypothesis") for r in extras["testing"])
    assert any(r.startswith("pytest-xdist") for r in extras["test"])  # .ci/run's -n 2


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("+")[0].split(".")[:2])


def test_the_declared_torch_range_includes_the_torch_under_test():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (req,) = [r for r in project["dependencies"] if r.startswith("torch")]
    low, high = (part.strip() for part in req.removeprefix("torch").split(","))
    assert low.startswith(">=") and high.startswith("<")
    here = _version(torch.__version__)
    assert _version(low[2:]) <= here < _version(high[1:]), (req, torch.__version__)

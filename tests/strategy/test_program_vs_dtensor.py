"""The whole-program plan against torch 2.13's DTensor on the same model and placements.

DTensor runs the transformer block (attention written out: DTensor has no CPU rule for
the fused kernel) on a fake process group, and every collective it issues — its
gradients moved to their parameters' placements at the end, as a user must — is priced
by meshplan's cost model. meshplan's planned step (forward and backward, compute
included) costs no more than torch's communication alone, and no more than the op-by-op
choice. Runs in a subprocess: the fake world must match the mesh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.slow  # a subprocess each: torch, DTensor on a fake world, planning

SCRIPT = textwrap.dedent(
    """
    import functools, json, sys, warnings
    warnings.simplefilter("ignore")
    sys.path.insert(0, {here!r})
    from _dtensor_peer import dtensor_collectives, price
    from _program_cases import transformer, transformer_args
    from meshplan.layout import Mesh
    from meshplan.strategy import plan_program
    from meshplan.strategy.programs._program import plan_graph
    mesh = Mesh.create({shape!r})
    tensors, specs = transformer_args(mesh, layers=1, B=8, T=8, D=16, V=32)
    fn = functools.partial(transformer, layers=1, fused=False)
    peer = price(dtensor_collectives(fn, tensors, specs), mesh)
    prog = plan_program(fn, *specs)
    greedy = plan_graph(prog.graph, specs, solver="op_by_op")
    print(json.dumps({{"torch": peer, "meshplan": prog.cost.total,
                      "collectives": prog.cost.collectives, "greedy": greedy.cost.total}}))
    """
)


@pytest.mark.parametrize("shape", [(2, 2), (4, 2)])
def test_the_planned_step_costs_no_more_than_dtensors_communication(shape):
    code = SCRIPT.format(here=HERE, shape=shape)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    row = json.loads(result.stdout.strip().splitlines()[-1])
    assert row["torch"]["collectives"] > 0
    assert row["meshplan"] <= row["torch"]["comm"], row
    assert row["meshplan"] <= row["greedy"] * (1 + 1e-12), row

"""run() and redistribute() under torch.compile give exactly what they give in eager mode.

One pool task (4 gloo ranks, a 2 x 2 mesh with a permuted rank map) compiles, for one
step of each kind (all_gather, all_to_all, all_permute, reduce_scatter, all_reduce, a
local slice), a function calling ``run`` with the ``eager`` and ``aot_eager`` backends,
and a function calling ``redistribute`` and ``backward``; outputs and gradients must
equal eager ``run``/``redistribute`` bit for bit. A counting backend proves that Dynamo
really compiled graphs (and, for the collective steps, that a collective landed in a
graph rather than only in eager fallbacks).

Where graphs break (torch 2.13): nowhere in ``run`` except at ``all_permute``, whose
``batch_isend_irecv`` Dynamo refuses to build (``P2POp`` construction; two breaks, the
exchange runs between graphs). Every other step compiles to one graph, the collective
inside it as a functional collective. The per-rank bookkeeping is kept as constants
while tracing (``traced_as_constant``); without that, Dynamo traced the whole pure
bookkeeping and broke on every frozen attrs value it built. ``redistribute`` breaks
around its autograd.Function (planning and the backward's dispatch run in eager).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _shell_cases import groups_for, make_locals, same

from meshplan.layout import Mesh
from meshplan.placement import Partial, Replicate, Shard, Spec
from meshplan.redistribute import Plan, Step

# -- worker side ----------------------------------------------------------------------------


class _Counter:
    """A backend that counts the graphs it is given and which hold a collective."""

    def __init__(self, inner: str):
        self.inner = inner
        self.graphs = 0
        self.collectives = 0

    def __call__(self, gm, example_inputs):
        from torch._dynamo import lookup_backend

        self.graphs += 1
        if any("c10d" in str(n.target) for n in gm.graph.nodes):
            self.collectives += 1
        return lookup_backend(self.inner)(gm, example_inputs)


def _compile(fn, backend: str):
    torch._dynamo.reset()  # one fresh cache per case: no recompile limit, no stale guards
    counter = _Counter(backend)
    return torch.compile(fn, backend=counter), counter


def _compiled_cases(cases):
    import warnings

    from meshplan.runtime._autograd import grad_spec, redistribute
    from meshplan.runtime._run import run

    rank = dist.get_rank()
    out = []
    for p, locals_ in cases:
        groups = groups_for(p.src.mesh)
        x = locals_[rank]
        want = run(p, x, groups)
        row = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Dynamo's notes on lru_cache-wrapped lookups
            for backend in ("eager", "aot_eager"):
                f, counter = _compile(lambda t: run(p, t, groups), backend)  # noqa: B023
                got = f(x)
                row[backend] = (same(got, want), counter.graphs, counter.collectives)

            # redistribute + backward, compiled as one function, against eager
            def step(t):
                y = redistribute(t, p.src, p.dst, groups, dst_grad=grad_spec(p.dst))  # noqa: B023
                (y * weight).sum().backward()  # noqa: B023
                return y

            weight = torch.arange(want.numel(), dtype=want.dtype).reshape(want.shape) % 5 - 2
            xe = x.clone().requires_grad_()
            ye = step(xe)
            f, counter = _compile(step, "eager")
            xc = x.clone().requires_grad_()
            yc = f(xc)
            row["autograd"] = (
                same(yc.detach(), ye.detach()) and same(xc.grad, xe.grad),
                counter.graphs,
                counter.collectives,
            )
        out.append(row)
    return out


# -- parent side ----------------------------------------------------------------------------


def _steps():
    mesh = Mesh.create((2, 2), ("a", "b"), ranks=(3, 1, 0, 2))
    S = lambda pl, order=None: Spec(mesh, pl, (5, 3), "float32", order or {})  # noqa: E731
    R, P = Replicate(), Partial
    return [
        Step(1, S([Shard(0), Shard(0)]), S([Shard(0), R]), "all_gather"),
        Step(0, S([Shard(0), R]), S([Shard(1), R]), "all_to_all"),
        Step((0, 1), S([Shard(0), Shard(0)]), S([Shard(0), Shard(0)], {0: (1, 0)}), "all_permute"),
        Step(0, S([R, Shard(1)]), S([Shard(1), Shard(1)], {1: (1, 0)}), None),
        Step(0, S([P(), Shard(1)]), S([Shard(0), Shard(1)]), "reduce_scatter"),
        Step(0, S([P("avg"), Shard(1)]), S([R, Shard(1)]), "all_reduce"),
    ]


@pytest.fixture(scope="module")
def compiled(pool4):
    steps = _steps()
    cases = [(Plan(s.src, s.dst, (s,)), make_locals(s.src, i)) for i, s in enumerate(steps)]
    return steps, pool4.run(_compiled_cases, cases, timeout=300)


@pytest.mark.parametrize("mode", ["eager", "aot_eager", "autograd"])
def test_compiled_run_equals_eager_run_bit_for_bit(compiled, mode):
    steps, results = compiled
    for rank, rows in enumerate(results):
        for s, row in zip(steps, rows, strict=True):
            ok, graphs, collectives = row[mode]
            assert ok, f"rank {rank}, {mode}: compiled result differs for {s}"
            assert graphs >= 1, f"rank {rank}, {mode}: nothing was compiled for {s}"
            if mode != "autograd" and s.collective in (
                "all_gather",
                "all_reduce",
                "all_to_all",
                "reduce_scatter",
            ):
                assert collectives >= 1, f"rank {rank}, {mode}: no collective in a graph for {s}"

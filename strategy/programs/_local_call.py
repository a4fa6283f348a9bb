"""What each rank runs for one op of a program: a :class:`LocalCall`, ready at assembly.

A program's op is an aten call on global tensors; every rank runs it on its local tensors.
Most calls run as traced, but some arguments and some ops need the rank's part of the
result: an argument holding the result's global shape takes the local shape
(:class:`LocalSize`), a sharded ``arange`` is the range of the rank's own indices
(:class:`LocalRange`), and a random op is the rank's shard of one global draw
(:class:`LocalDraw`). :func:`local_call` reads all of it from the op's rules once, so
the runtime needs nothing of the rules to run a program (no torch here).
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from ..rules._aten import SIZE_ARGS, Call
from ..rules._aten_pieces import local_range
from ..rules._random import DrawKind, draw_kind, draw_seed
from ._graph import Graph

__all__ = ["Draw", "LocalCall", "LocalDraw", "LocalRange", "LocalSize", "draw_seeds", "local_call"]

# ops whose local inputs may stay strided views (the others get contiguous inputs: some CPU
# kernels, e.g. embedding_dense_backward, read a strided gradient wrong)
_STRIDE_FREE = frozenset(
    {
        "t",
        "transpose",
        "permute",
        "view",
        "_unsafe_view",
        "reshape",
        "detach",
        "alias",
        "unsqueeze",
        "squeeze",
        "expand",
        "clone",
    }
)
_VIEWS = frozenset({"view", "_unsafe_view"})


class Draw(enum.Enum):
    """How a random op draws: the rank's shard of one global draw."""

    GENERATOR = "generator"  # no rule: runs replicated, on whole tensors, with the generator
    SHAPED = "shaped"  # the input gives only shape and dtype (``uniform``, ``bernoulli.p``)
    UNIFORM = "uniform"  # ``rand``, ``rand_like``
    NORMAL = "normal"  # ``randn``, ``randn_like``
    INTEGERS = "integers"  # ``randint``: ``low`` (inclusive) to ``high`` (exclusive)
    BERNOULLI = "bernoulli"  # one uniform draw per element compared with the probability
    DROPOUT = "dropout"  # ``native_dropout``: keep with probability ``1 - p``, scale by it


@attrs.frozen
class LocalSize:
    """An argument holding the result's global shape: each rank passes its local shape
    there (``dim`` None) or the local length of output dim ``dim``.

    >>> LocalSize(1, None)
    LocalSize(position=1, dim=None)
    """

    position: int
    dim: int | None


@attrs.frozen
class LocalRange:
    """A sharded ``arange``: the rank holding ``length`` elements from ``offset`` runs
    ``arange(start + step * offset, start + step * (offset + length), step)``.

    >>> LocalRange(2, 3).of(1, 2)
    (5, 11, 3)
    """

    start: int
    step: int

    def of(self, offset: int, length: int) -> tuple[int, int, int]:
        first = self.start + self.step * offset
        return (first, first + self.step * length, self.step)


@attrs.frozen
class LocalDraw:
    """A random op's draw: its kind, the whole draw's shape and dtype, and the numbers the
    kind reads (``low``/``high`` of integers, ``p``/``train`` of dropout)."""

    kind: Draw
    shape: tuple[int, ...]
    dtype: str
    low: int = 0
    high: int | None = None
    p: float = 0.5
    train: bool = True


@attrs.frozen
class LocalCall:
    """One op as every rank runs it on its local tensors.

    ``target`` names the aten op (``"aten.mm.default"``); ``args``/``kwargs`` are the
    call's, tensors as :class:`~meshplan.strategy.TensorArg` slots and torch constants as
    ``TorchConst``; ``contiguous``: the local inputs are made contiguous first; ``size``,
    ``range`` and ``draw`` say what differs per rank (None: nothing); ``view``: a
    ``view`` runs as a reshape of the local input to the local shape.
    """

    target: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    contiguous: bool = True
    size: LocalSize | None = None
    view: bool = False
    range: LocalRange | None = None
    draw: LocalDraw | None = None


def local_call(call: Call) -> LocalCall:
    """The :class:`LocalCall` of a traced aten call: its rules' local arguments read once.

    >>> from meshplan.strategy import Meta, TensorArg
    >>> c = Call("aten.view.default", (Meta((4, 6)),), (Meta((24,)),),
    ...          (TensorArg(0), (24,)), {}, frozenset())
    >>> lc = local_call(c)
    >>> lc.size, lc.view, lc.contiguous
    (LocalSize(position=1, dim=None), True, False)
    """
    size = SIZE_ARGS.get(call.op)
    start_step = local_range(call.target, call.args, 0, 0) if call.op == "arange" else None
    return LocalCall(
        call.target,
        call.args,
        call.kwargs,
        contiguous=call.op not in _STRIDE_FREE,
        size=None if size is None else LocalSize(*size),
        view=call.op in _VIEWS,
        range=None if start_step is None else LocalRange(start_step[0], start_step[2]),
        draw=_draw_of(call),
    )


def _draw_of(call: Call) -> LocalDraw | None:
    kind = draw_kind(call.target, call.names)
    if kind is None:
        return None
    meta = call.outputs[0]
    whole = (tuple(meta.shape), meta.dtype)
    if kind is DrawKind.GENERATOR:
        return LocalDraw(Draw.GENERATOR, *whole)
    if kind is DrawKind.SHAPED:
        return LocalDraw(Draw.SHAPED, *whole)
    named = call.named_args()
    if kind is DrawKind.FACTORY:
        if call.op in ("rand", "rand_like"):
            return LocalDraw(Draw.UNIFORM, *whole)
        if call.op in ("randn", "randn_like"):
            return LocalDraw(Draw.NORMAL, *whole)
        return LocalDraw(Draw.INTEGERS, *whole, low=named.get("low", 0), high=named["high"])
    if call.op == "bernoulli":
        return LocalDraw(Draw.BERNOULLI, *whole)
    return LocalDraw(
        Draw.DROPOUT, *whole, p=float(named.get("p", 0.5)), train=named.get("train") is not False
    )


def draw_seeds(graph: Graph, seed: int, step: int) -> dict[int, int]:
    """Each random op's generator seed at ``step``, by node: the ``k``-th draw of the
    program takes the ``k``-th seed of the stream, a recomputed draw its original's."""
    seeds = {n: draw_seed(seed, step, k) for k, n in enumerate(graph.draws)}
    seeds.update((c, seeds[o]) for c, o in graph.recomputes if o in seeds)
    return seeds

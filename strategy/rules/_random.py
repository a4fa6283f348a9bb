"""Random ops in a program: one global draw, each rank its shard of it (pure, no torch).

A random op (torch tags it ``nondeterministic_seeded``: ``bernoulli`` of dropout,
``rand``, ``randn``, ``normal_``, ``uniform_`` ...) means one draw of the whole tensor.
A sharded program keeps that meaning: rank by rank, the op's result is exactly the
rank's shard of the one global draw, so the sharded run equals one process drawing
with the same seed, and replicas always agree.

How (the runtime, :mod:`meshplan.runtime._program`): the program's ``k``-th random
op draws from a ``torch.Generator`` seeded with :func:`draw_seed` ``(seed, step, k)``;
every rank draws the whole global tensor from it and keeps its own chunks. That is
exact on CPU at the price of each rank drawing (and briefly holding) the global tensor
of each random op: O(global numel) time and memory per op instead of O(local). On CUDA
a Philox-offset scheme (torch's DTensor RNG tracker) would draw only the local part;
it is not built here.

The seed: ``run_program(..., seed=, step=)`` (and the simulator's and
:func:`~meshplan.runtime.run_unsharded`'s same keywords). Nothing is read from torch's
global generator: the stream is a pure function of ``(seed, step)``, so a training loop
passes its step counter and a resumed run continues the stream by passing the step it
resumes at (saved with the checkpoint).

Kinds (:func:`draw_kind`), each with a rule that shards it:

* ``SHAPED`` — the input gives only shape and dtype (``bernoulli.p``,
  ``normal_functional``, ``uniform``, ``random``, ``exponential`` ..., what
  functionalization makes of ``bernoulli_``, ``normal_``, ``uniform_``);
* ``FACTORY`` — ``rand``, ``randn``, ``randint``, ``rand_like`` and kin;
* ``ELEMENTWISE`` — a draw per element that reads the input's value there
  (``bernoulli(probabilities)``, ``native_dropout``): the input is sharded like the result;
* ``GENERATOR`` — any other op taking a ``generator``: no rule, it runs replicated,
  every rank drawing the same global draw;
* None — no generator argument: refused at plan time.

>>> draw_kind("aten.bernoulli.p", ("self", "p", "generator"))
<DrawKind.SHAPED: 'shaped'>
>>> draw_kind("aten.randperm.default", ("n", "dtype", "layout", "device", "pin_memory")) is None
True
"""

from __future__ import annotations

import enum
import hashlib
from typing import Any

from meshplan.errors import StrategyError

__all__ = [
    "DrawKind",
    "draw_kind",
    "draw_seed",
    "is_draw",
    "check_draw",
    "SHAPED",
    "FACTORIES",
    "ELEMENTWISE",
]


class DrawKind(enum.Enum):
    """How a random op draws (see the module docstring)."""

    SHAPED = "shaped"
    FACTORY = "factory"
    ELEMENTWISE = "elementwise"
    GENERATOR = "generator"


SHAPED = frozenset(
    {
        "bernoulli.p",
        "normal_functional.default",
        "uniform.default",
        "random.default",
        "random.from",
        "random.to",
        "exponential.default",
        "geometric.default",
        "log_normal.default",
        "cauchy.default",
    }
)
FACTORIES = frozenset(
    {
        "rand.default",
        "randn.default",
        "randint.default",
        "randint.low",
        "rand_like.default",
        "randn_like.default",
        "randint_like.default",
        "randint_like.low_dtype",
    }
)
ELEMENTWISE = frozenset({"bernoulli.default", "bernoulli.Tensor", "native_dropout.default"})


def draw_kind(target: str, names: tuple[str, ...] = ()) -> DrawKind | None:
    """How a random aten op (``"aten.bernoulli.p"``) is drawn; None: it cannot be."""
    op = target.removeprefix("aten.")
    if op in SHAPED:
        return DrawKind.SHAPED
    if op in FACTORIES:
        return DrawKind.FACTORY
    if op in ELEMENTWISE:
        return DrawKind.ELEMENTWISE
    if "generator" in names:
        return DrawKind.GENERATOR
    return None


def is_draw(call: Any) -> bool:
    """Whether a traced call draws random numbers (and how is known: see :func:`draw_kind`)."""
    return "nondeterministic_seeded" in call.tags and draw_kind(call.target, call.names) is not None


def check_draw(call: Any) -> None:
    """Refuse a call that draws random numbers in a way no rank can reproduce: torch tags
    it ``nondeterministic_seeded`` and it takes no generator. (Attention with
    ``dropout_p=0`` carries the tag but draws nothing.)"""
    if "nondeterministic_seeded" not in call.tags or is_draw(call):
        return
    if "dropout_p" in call.names and call.named_args().get("dropout_p", 0.0) == 0:
        return
    raise StrategyError(
        f"{call.target} draws random numbers without a generator argument, so meshplan "
        "cannot give every rank its part of one draw; draw with an op that takes one "
        "(torch.rand, torch.randn, bernoulli, dropout, normal_, uniform_: e.g. attention "
        "dropout as F.dropout on the weights), or pass the random tensor in as an argument",
        value=call.target,
    )


def draw_seed(seed: int, step: int, k: int) -> int:
    """The seed of the generator of a program's ``k``-th random op at ``step``: a hash of
    the three (the same on every rank and in every process).

    >>> draw_seed(0, 0, 1) == draw_seed(0, 0, 1) != draw_seed(0, 1, 1)
    True
    """
    digest = hashlib.blake2b(f"{seed}:{step}:{k}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1

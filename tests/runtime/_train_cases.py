"""The training loop the ``parallelize`` tests share: on the ranks of a pool through a
:class:`~meshplan.runtime.ParallelModule`, and on one process with torch alone.

Each step runs the batch, back-propagates, clips the whole model's gradient norm at
``clip``, steps the optimizer and zeroes the gradients; both sides return every step's
``(loss, gradient norm)``, which the tests compare.

The step is planned once, in the test process (planning is pure and deterministic: every
rank would make the same plan), and shipped to the ranks as a
:class:`~meshplan.strategy.ModuleProgram`; tests of planning on each rank call
``parallelize`` with a module themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from _shell_cases import groups_for

from meshplan.runtime import parallelize

Batch = Sequence[torch.Tensor]


def call(model: torch.nn.Module, *batch: torch.Tensor) -> torch.Tensor:
    """The model's own forward as the step's loss (a model that returns its loss)."""
    return model(*batch)


def train_steps(pm, opt, batches: Sequence[Batch], clip: float) -> list[tuple[float, float]]:
    """Train a ParallelModule on the global ``batches`` (this rank's part of each)."""
    out = []
    for batch in batches:
        loss = pm(*pm.local_batch(*batch))
        loss.backward()
        norm = pm.clip_grad_norm_(clip)
        opt.step()
        opt.zero_grad()
        out.append((loss.item(), norm.item()))
    return out


def reference_steps(
    model: torch.nn.Module,
    loss_of: Callable[..., torch.Tensor],
    opt: torch.optim.Optimizer,
    batches: Sequence[Batch],
    clip: float,
) -> list[tuple[float, float]]:
    """The same loop on one process: ``loss_of(model, *batch)``, torch's own clipping."""
    out = []
    for batch in batches:
        loss = loss_of(model, *batch)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        out.append((loss.item(), norm.item()))
    return out


def train_planned(
    planned,
    make_model: Callable[[], torch.nn.Module],
    make_optimizer: Callable[[Any], torch.optim.Optimizer],
    batches: Sequence[Batch],
    clip: float,
    save: str | None = None,
    resume: str | None = None,
):
    """On every rank: the planned module's shards, loaded from ``make_model()``'s weights
    (the whole model, cut to the planned specs), optionally resumed from a checkpoint,
    trained on ``batches``, optionally saved.

    Returns every step's ``(loss, norm)``, this rank's shards by name and their specs.
    ``make_model`` and ``make_optimizer`` are module-level callables (or partials of
    them): the pool pickles them by name.
    """
    pm = parallelize(planned, groups_for(planned.program.arg_specs[0].mesh))
    pm.load_state_dict(make_model())
    opt = make_optimizer(pm.parameters())
    if resume:
        pm.load(resume, opt)
    out = train_steps(pm, opt, batches, clip)
    if save:
        pm.save(save, opt)
    return out, {n: s.local for n, s in pm.state_dict().items()}, pm.specs

"""A planned model as an ``nn.Module`` of local shards: :func:`parallelize`, :class:`ParallelModule`.

``pm = parallelize(model, groups, *batch_specs, specs=..., forward=...)`` plans the
model's step once (each rank makes the same, deterministic plan) and
returns a module whose parameters are this rank's shards, each in its planned spec
(:meth:`ParallelModule.spec_of`). ``loss = pm(*local_batch)`` runs the planned forward
with :func:`~meshplan.runtime.run_program`, and ``loss.backward()`` leaves every shard's
gradient in the shard's own spec (a parameter's gradient spec is its spec), so a stock
torch optimizer steps the shards: any elementwise optimizer (``SGD``, ``Adam``, ``AdamW``)
on the shards does what it does on the whole model.

What is not elementwise is done here for the whole mesh: :meth:`~ParallelModule.clip_grad_norm_`
(each element counted once: a shard replicated over a mesh dim counts at coordinate 0
of that dim only), :meth:`~ParallelModule.state_dict` and the optimizer's state
(:meth:`~ParallelModule.optimizer_state_dict`) as :class:`~meshplan.placement.Sharded`
values that :mod:`meshplan.checkpoint` saves and loads on any mesh
(:meth:`~ParallelModule.save`, :meth:`~ParallelModule.load`), and loading real weights
into the planned specs from a whole model's tensors, shard by shard
(:meth:`~ParallelModule.load_state_dict`).

A parameter may not be planned ``Partial``: an optimizer step on a partial sum is not the
step on its value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from meshplan.errors import RuntimeShellError
from meshplan.placement import Spec
from meshplan.strategy import ModuleProgram, Program, plan_module

from ._parallel_module import ParallelModule, _check_groups, _is_meta, _plan_once, _tied_aliases

__all__ = ["ParallelModule", "parallelize"]


def parallelize(
    model: Any,
    groups: Any,
    *batch_specs: Spec,
    specs: Mapping[str, Any] | None = None,
    forward: Callable[..., Any] | None = None,
    state: Mapping[str, Any] | None = None,
    names: Sequence[str] | None = None,
    device: Any = None,
    seed: int = 0,
    **plan_args: Any,
) -> ParallelModule:
    """This rank's part of ``model`` planned on ``groups.mesh``, as a trainable module.

    Every rank of the mesh calls it alike. ``model`` is an ``nn.Module`` (its tensors
    give the initial shards; on the ``meta`` device the shards wait for
    :meth:`ParallelModule.load_state_dict` or :meth:`ParallelModule.load`), a plain
    function ``model(state, *batch)`` of ``state`` (name -> global tensor), both planned
    with :func:`~meshplan.strategy.plan_module` and the same arguments (``batch_specs``,
    ``specs`` by name or glob pattern, ``forward``, and ``plan_args`` such as
    ``choose=`` / ``memory_budget=``), or an already planned
    :class:`~meshplan.strategy.ModuleProgram` (or :class:`~meshplan.strategy.Program`
    with the ``names`` of its arguments after the batch), whose initial weights come
    from ``state`` if given. Each rank plans (deterministically: the same plan), with
    no collective waiting meanwhile. ``device`` places the shards (default: the model's, else the CPU).
    ``seed`` starts the random stream of the step's random ops (dropout), the same on
    every rank (see :meth:`ParallelModule.forward`).

    >>> parallelize("gpt", None)
    Traceback (most recent call last):
    ...
    meshplan.errors.RuntimeShellError: parallelize takes an nn.Module, a function of (state, *batch), a ModuleProgram or a Program, got 'gpt'
    """
    source = None
    if isinstance(model, Program):
        if names is None:
            raise RuntimeShellError(
                "a Program's arguments have no names: pass names= (the arguments after "
                "the batch), or plan with meshplan.strategy.plan_module",
                value=model,
            )
        names = tuple(names)
        model = ModuleProgram(model, names, len(model.arg_specs) - len(names))
    if isinstance(model, ModuleProgram):
        if batch_specs or specs or forward or plan_args:
            raise RuntimeShellError(
                "a planned program takes no planning arguments (batch specs, specs=, "
                "forward=, ...); pass the module to plan it again",
                value=model,
            )
        mp, persistent, aliases = model, None, {}
    elif isinstance(model, torch.nn.Module) or callable(model):
        if not isinstance(model, torch.nn.Module) and state is None:
            raise RuntimeShellError(
                "a plain function is planned as model(state, *batch): give state= "
                "(name -> global tensor)",
                value=model,
            )
        _check_groups(groups)
        args = dict(specs=specs, forward=forward, **plan_args)
        if not isinstance(model, torch.nn.Module):
            args["state"] = state
        mp = _plan_once(groups, lambda: plan_module(model, *batch_specs, **args))
        if isinstance(model, torch.nn.Module):
            source = model
            persistent = set(model.state_dict(keep_vars=True))
            aliases = _tied_aliases(model)
            state = dict(model.named_parameters())
            state.update(model.named_buffers())
            if device is None:
                device = next((t.device for t in state.values() if t.device.type != "meta"), None)
        else:
            persistent, aliases = None, {}
    else:
        raise RuntimeShellError(
            "parallelize takes an nn.Module, a function of (state, *batch), a ModuleProgram "
            f"or a Program, got {model!r:.80}",
            value=model,
        )
    _check_groups(groups)
    replan = None
    if source is not None:
        replan = dict(batch_specs=batch_specs, forward=forward, plan_args=plan_args)
    pm = ParallelModule(
        mp,
        groups,
        device=device,
        persistent=persistent,
        aliases=aliases,
        source=source,
        replan=replan,
        seed=seed,
    )
    if state is not None and not any(_is_meta(t) for t in state.values()):
        pm.load_state_dict({n: t for n, t in state.items() if n in pm.specs})
    return pm

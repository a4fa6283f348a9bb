"""A torch optimizer's state over a :class:`~meshplan.runtime.ParallelModule`'s shards, as
:class:`~meshplan.placement.Sharded` values a checkpoint saves and loads on any mesh.

Each per-parameter tensor shaped like its parameter is held in the parameter's spec
(``optim.<name>.<key>``, e.g. AdamW's ``exp_avg``); other tensors (``step``) are
replicated; the param groups' settings are JSON bytes (``optim.param_groups``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch

from meshplan.errors import RuntimeShellError
from meshplan.placement import Sharded, Spec

__all__ = ["OPTIM_PREFIX", "load_optimizer_state", "optimized_names", "optimizer_state"]

OPTIM_PREFIX = "optim."
"""Where :meth:`ParallelModule.optimizer_state_dict` puts the optimizer's tensors:
``optim.<parameter name>.<state key>`` and ``optim.param_groups``."""

Replicated = Callable[[tuple[int, ...], str], Spec]
"""A replicated spec on the module's mesh, of a shape and dtype."""


def params_of(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor the optimizer steps, in its groups' order."""
    return [p for g in optimizer.param_groups for p in g["params"]]


def optimized_names(optimizer: torch.optim.Optimizer, mine: Mapping[int, str]) -> dict[int, str]:
    """``id(tensor) -> parameter name`` for each tensor the optimizer steps; ``mine`` maps
    the module's parameters the same way. A tensor not among them raises."""
    out = {}
    for p in params_of(optimizer):
        if id(p) not in mine:
            raise RuntimeShellError(
                f"the optimizer steps a tensor of shape {tuple(p.shape)} that is not a "
                "parameter of this model; build it as torch.optim.AdamW(pm.parameters())",
                value=tuple(p.shape),
            )
        out[id(p)] = mine[id(p)]
    return out


def optimizer_state(
    optimizer: torch.optim.Optimizer,
    names: Mapping[int, str],
    specs: Mapping[str, Spec],
    rank: int,
    replicated: Replicated,
) -> dict[str, Sharded]:
    """The optimizer's state as this rank's Sharded values (see the module's docstring)."""
    out: dict[str, Sharded] = {}
    for p, state in optimizer.state.items():
        name = names[id(p)]
        for key, v in state.items():
            if not isinstance(v, torch.Tensor):
                raise RuntimeShellError(
                    f"the optimizer's state {key!r} of {name!r} is {v!r:.40}, not a "
                    "tensor; only tensor state is saved",
                    value=v,
                )
            dtype = str(v.dtype).removeprefix("torch.")
            if v.shape == p.shape and v.ndim > 0:
                spec = attrs.evolve(specs[name], dtype=dtype)
            else:
                spec = replicated(tuple(v.shape), dtype)
            out[f"{OPTIM_PREFIX}{name}.{key}"] = Sharded(v.detach(), spec, rank)
    groups = []
    for group in optimizer.param_groups:
        settings = {k: _jsonable(k, v) for k, v in group.items() if k != "params"}
        groups.append({"params": [names[id(p)] for p in group["params"]], **settings})
    raw = torch.tensor(list(json.dumps(groups).encode()), dtype=torch.uint8)
    out[OPTIM_PREFIX + "param_groups"] = Sharded(raw, replicated(tuple(raw.shape), "uint8"), rank)
    return out


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, state: Mapping[str, Any], names: Mapping[int, str]
) -> None:
    """Set the optimizer's state from :func:`optimizer_state`'s values (Sharded or local
    tensors), in place."""
    by_name = {names[id(p)]: p for p in params_of(optimizer)}
    for key, value in state.items():
        if not key.startswith(OPTIM_PREFIX) or key == OPTIM_PREFIX + "param_groups":
            continue
        name, _, what = key[len(OPTIM_PREFIX) :].rpartition(".")
        if name not in by_name:
            raise RuntimeShellError(
                f"optimizer state {key!r} names no parameter of this optimizer",
                value=key,
            )
        local = value.local if isinstance(value, Sharded) else value
        p = by_name[name]
        local = local.detach().clone()
        if what != "step":  # as torch's own load: step stays where it was saved
            local = local.to(p.device, p.dtype if local.is_floating_point() else None)
        optimizer.state[p][what] = local
    raw = state.get(OPTIM_PREFIX + "param_groups")
    if raw is None:
        return
    local = raw.local if isinstance(raw, Sharded) else raw
    saved = json.loads(bytes(local.cpu().tolist()).decode())
    if len(saved) != len(optimizer.param_groups):
        raise RuntimeShellError(
            f"the saved optimizer has {len(saved)} param groups, this one "
            f"{len(optimizer.param_groups)}; build the optimizer as it was",
            value=len(saved),
        )
    for group, got in zip(optimizer.param_groups, saved, strict=True):
        mine = [names[id(p)] for p in group["params"]]
        if mine != got["params"]:
            raise RuntimeShellError(
                f"a saved param group holds {got['params'][:3]!r}..., this optimizer's "
                f"{mine[:3]!r}...; build the optimizer over the same parameters",
                value=got["params"],
            )
        for k, v in got.items():
            if k != "params":
                group[k] = tuple(v) if isinstance(group.get(k), tuple) else v


def _jsonable(key: str, v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return v.item()
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, tuple | list) and all(isinstance(x, int | float) for x in v):
        return list(v)
    raise RuntimeShellError(
        f"the optimizer setting {key!r} is {v!r:.60}, which a checkpoint cannot hold; give "
        "numbers, strings or tuples of numbers",
        value=v,
    )

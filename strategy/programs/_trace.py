"""Tracing a function of global tensors into a :class:`~meshplan.strategy.programs._graph.Graph`.

torch's own tracer (``make_fx`` on fake tensors: no values, no memory, no process
groups) records the function and ``torch.autograd.grad`` of its outputs into aten
calls, forward and backward in one joint graph; the loss functions' aten kernels
(``nll_loss``) are traced as their decompositions, whose ops have simple sharding rules.
A Python branch on a tensor's value cannot be traced and is refused with a
:class:`StrategyError` naming the fix.

Writes are traced away: where the function writes in place (``copy_``, ``fill_``,
``masked_fill_``, ``index_put_``, ``x[..., 1:] = y``, a random ``bernoulli_``, into a
view of any stride), the trace is run again under torch's functionalization
(``torch.func.functionalize``), so each write becomes a value (``copy``,
``slice_scatter``, ``select_scatter``, ``fill``, ``bernoulli.p`` ...) that every later
reader reads: the graph is a pure dataflow that runs right on any layout. A write into
an argument (a buffer's running statistics) becomes an output, the argument's new
value (:attr:`Graph.writes`); a write into a differentiated argument is refused, as
eager torch refuses it on a leaf. A random op whose draw meshplan cannot reproduce on
every rank is refused (see :mod:`._random`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, assert_never

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from meshplan.errors import StrategyError
from meshplan.placement import Spec

from ..rules._aten import Call, TensorArg
from ..rules._random import check_draw
from ..rules._rule import Meta
from ._graph import ConstKind, Graph, Kind, Node, Phase, TorchConst, Value

__all__ = ["trace", "to_torch_const", "DECOMPOSE"]

aten = torch.ops.aten
DECOMPOSE = (
    aten.nll_loss_forward,
    aten.nll_loss_backward,
    aten.nll_loss2d_forward,
    aten.nll_loss2d_backward,
    aten._fused_rms_norm,
    aten._fused_rms_norm_backward,
    aten.rms_norm,
    aten.silu_backward,
    aten.sigmoid_backward,
    aten.tanh_backward,
    aten.threshold_backward,
    # its kernel writes the running statistics without its schema saying so: decomposed,
    # the writes are copy_ calls that functionalization turns into outputs
    aten.native_batch_norm,
)


def _decompositions() -> dict:
    from torch._decomp import get_decompositions

    ops = [op for op in DECOMPOSE if op is not None]
    return get_decompositions(ops)


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise StrategyError(f"dtype {name!r} is not a torch dtype", value=name)
    return dt


def to_torch_const(c: TorchConst, device: Any = None) -> Any:
    """The torch object a :class:`TorchConst` names (``device`` overrides devices)."""
    match c.kind:
        case ConstKind.DTYPE:
            return _dtype(c.name)
        case ConstKind.DEVICE:
            return torch.device(device) if device is not None else torch.device(c.name)
        case ConstKind.LAYOUT | ConstKind.MEMORY_FORMAT:
            return getattr(torch, c.name)
        case _:
            assert_never(c.kind)


def _const(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return TorchConst(ConstKind.DTYPE, str(value).removeprefix("torch."))
    if isinstance(value, torch.device):
        return TorchConst(ConstKind.DEVICE, str(value))
    if isinstance(value, torch.layout):
        return TorchConst(ConstKind.LAYOUT, str(value).removeprefix("torch."))
    if isinstance(value, torch.memory_format):
        return TorchConst(ConstKind.MEMORY_FORMAT, str(value).removeprefix("torch."))
    if isinstance(value, list | tuple):
        return tuple(_const(v) for v in value)
    return value


def _meta(t: Any) -> Meta | None:
    if isinstance(t, torch.Tensor):
        return Meta(tuple(int(s) for s in t.shape), str(t.dtype).removeprefix("torch."))
    return None


def trace(
    fn: Callable[..., Any], arg_specs: Sequence[Spec], requires_grad: Sequence[bool]
) -> Graph:
    """The joint forward/backward graph of ``fn`` on global tensors of ``arg_specs``."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx._lazy_graph_module import _use_lazy_graph_module

    n_args = len(arg_specs)
    state: dict[str, Any] = {}

    def joint(*args: torch.Tensor):
        outs = fn(*args)
        single = isinstance(outs, torch.Tensor)
        outs_t = (outs,) if single else tuple(outs)
        for o in outs_t:
            if not isinstance(o, torch.Tensor):
                raise StrategyError(
                    f"the program's function returned {type(o).__name__}; it must return a "
                    "tensor or a tuple of tensors",
                    value=o,
                )
        # the cotangents are arguments too, made once the outputs' metadata is known:
        # one trace, with no first pass of the function to find it
        cots = _cotangent_arguments(outs_t, n_args)
        state["cots"] = cots
        diff = [a for a, g in zip(args, requires_grad, strict=True) if g]
        pairs = [(o, c) for o, c in zip(outs_t, cots, strict=False) if o.requires_grad]
        grads: list[Any] = [None] * len(diff)
        if diff and pairs:
            grads = list(
                torch.autograd.grad(
                    [o for o, _ in pairs],
                    diff,
                    grad_outputs=[c for _, c in pairs],
                    allow_unused=True,
                )
            )
        return outs_t, tuple(grads)

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode:
            fakes = []
            for spec, g in zip(arg_specs, requires_grad, strict=True):
                t = torch.empty(spec.shape, dtype=_dtype(spec.dtype))
                fakes.append(t.requires_grad_(True) if g else t)
        # the graph module's Python code is generated only if it is called (the
        # functionalized trace calls it); its graph is all that is read
        with torch.enable_grad(), _use_lazy_graph_module(True):
            gm = make_fx(
                joint,
                decomposition_table=_decompositions(),
                tracing_mode="fake",
                _disable_torch_fn_metadata_mode=True,  # its per-call records are not read
            )(*fakes)
        cots = state["cots"]
        if _writes_in_place(gm):
            gm = _functionalized(gm, [t.detach() for t in fakes], cots)
    except StrategyError:
        raise
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        if type(exc).__name__ == "DynamicOutputShapeException":
            op = str(exc).splitlines()[0].strip() or "an op"
            raise StrategyError(
                f"{op}: its output shape depends on the data (the values of its input), "
                "which a sharded program is planned without; mask instead of indexing with "
                "the data (e.g. multiply by the mask, or torch.where, rather than nonzero / "
                "masked_select / boolean indexing / unique), or keep the module that calls "
                "it out of the planned function and run it locally",
                value=fn,
            ) from exc
        if "leaf Variable that requires grad" in str(exc):
            raise StrategyError(
                f"the program's function writes in place into a differentiated argument"
                f"{_user_line(exc)} ({text}); write into a copy (x = x.clone()), or pass "
                "requires_grad= marking that argument not differentiated",
                value=fn,
            ) from exc
        if "data-dependent" in str(exc).lower() or "DataDependent" in type(exc).__name__:
            raise StrategyError(
                "the program's function branches on a tensor's value (" + text + "); a "
                "sharded program is traced without values: compute both sides and select "
                "with torch.where, or move the branch outside the function",
                value=fn,
            ) from exc
        raise StrategyError(
            f"tracing the program's function failed: {text}; check that the argument specs' "
            "shapes and dtypes are what the function expects",
            value=fn,
        ) from exc
    return _to_graph(gm, arg_specs, requires_grad, len(cots), fn)


def _cotangent_arguments(outs: Sequence[Any], n_args: int) -> list[Any]:
    """One new argument of the trace per output, of its shape and dtype: the gradient
    arriving for it (placeholders ``arg{n_args}_1``... after the function's own)."""
    from torch.fx.experimental.proxy_tensor import (
        disable_proxy_modes_tracing,
        get_proxy_mode,
        track_tensor_tree,
    )

    tracer = get_proxy_mode().tracer
    placeholders = [n for n in tracer.graph.nodes if n.op == "placeholder"]
    last = placeholders[-1] if placeholders else None
    cots = []
    for k, o in enumerate(outs):
        with disable_proxy_modes_tracing():
            c = torch.empty(tuple(o.shape), dtype=o.dtype)
            proxy = tracer.create_proxy("placeholder", f"arg{n_args + k}_1", (), {})
            track_tensor_tree(c, proxy, constant=None, tracer=tracer)
        if last is None:
            next(iter(tracer.graph.nodes)).prepend(proxy.node)
        elif last.next is not proxy.node:
            last.append(proxy.node)  # the placeholders first, in order
        last = proxy.node
        cots.append(c)
    return cots


def _user_line(exc: BaseException) -> str:
    """`` at file:line`` of the innermost frame of ``exc`` outside torch and meshplan
    (the user's line that raised), or ``""``."""
    where = ""
    tb = exc.__traceback__
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        name = tb.tb_frame.f_code.co_filename
        if not module.startswith(("torch", "meshplan.")) and "<" not in name:
            where = f" at {name}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def _writes_in_place(gm) -> bool:
    """Whether a traced graph holds an op that writes into one of its arguments."""
    for fx in gm.graph.nodes:
        schema = getattr(fx.target, "_schema", None)
        if fx.op == "call_function" and schema is not None and schema.is_mutable:
            return True
    return False


def _functionalized(gm, fakes: Sequence[Any], cots: Sequence[Any]):
    """``gm`` traced again with every write a value (torch's functionalization): a write
    into a view becomes a scatter into its base, read by every later reader; a write into
    an argument a final ``copy_`` into it."""
    from torch.func import functionalize

    out = make_fx(
        functionalize(gm, remove="mutations"),
        decomposition_table=_decompositions(),
        tracing_mode="fake",
    )(*fakes, *cots)
    out.graph.eliminate_dead_code()  # the views a write read, no longer read
    return out


def _argument_write(fx, target: str, n_args: int, position: dict) -> int | None:
    """The argument position a functionalized graph's final ``copy_`` writes, or None."""
    if target != "aten.copy_.default":
        return None
    k = position.get(fx.args[0])
    return k if k is not None and k < n_args else None


class _Targets(dict):
    """Per op overload, what every call of it shares: its name, tags, schema argument
    names and whether it writes in place (read once per op, not once per call)."""

    def __missing__(self, target: Any) -> tuple[str, frozenset, tuple[str, ...], bool]:
        schema = getattr(target, "_schema", None)
        info = (
            str(target),
            frozenset(t.name for t in getattr(target, "tags", ())),
            tuple(a.name for a in schema.arguments) if schema is not None else (),
            schema is not None and schema.is_mutable,
        )
        self[target] = info
        return info


class _Metas(dict):
    """One :class:`Meta` per distinct (shape, dtype) of the trace's tensors, shared."""

    def of(self, t: Any) -> Meta | None:
        if not isinstance(t, torch.Tensor):
            return None
        key = (t.shape, t.dtype)
        m = self.get(key)
        if m is None:
            m = self[key] = _meta(t)
        return m


def _to_graph(gm, arg_specs, requires_grad, n_out: int, fn: Any = None) -> Graph:
    nodes: list[Node] = []
    where: dict[Any, int] = {}  # fx node -> index of our node (tuples: the call)
    backward: set[int] = set()
    n_args = len(arg_specs)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    metas_of, targets = _Metas(), _Targets()
    for k, ph in enumerate(placeholders):
        m = metas_of.of(ph.meta.get("val"))
        if k < n_args:
            nodes.append(Node(Kind.ARG, ph.name, (m,)))
        else:
            nodes.append(Node(Kind.COTANGENT, ph.name, (m,), phase=Phase.BACKWARD))
            backward.add(len(nodes) - 1)
        where[ph] = len(nodes) - 1
    position = {ph: k for k, ph in enumerate(placeholders)}
    values: dict[Any, Value] = {ph: Value(where[ph]) for ph in placeholders}
    written: dict[int, Any] = {}  # argument position -> the fx node of its new value
    out_node = None
    getitem = operator.getitem
    fx_node = torch.fx.Node
    for fx in gm.graph.nodes:
        if fx.op == "placeholder":
            continue
        if fx.op == "output":
            out_node = fx
            continue
        if fx.op == "get_attr":
            # a constant tensor: one of a single value (built inside the function, like
            # torch.tensor([]) or a filled mask) is a factory call; anything else is a
            # tensor the function captures instead of taking it as an argument
            node = _constant_node(fx.name, getattr(gm, fx.target, None))
            if node is None:
                raise captured_error(fn, getattr(gm, fx.target, None))
            nodes.append(node)
            where[fx] = len(nodes) - 1
            values[fx] = Value(len(nodes) - 1)
            continue
        if fx.op != "call_function":
            raise StrategyError(f"unexpected node {fx.op} {fx.target} in the trace", value=fx)
        if fx.target is getitem:
            src, i = fx.args
            if src in where:
                values[fx] = Value(where[src], i)
            continue
        target, tags, names, mutable = targets[fx.target]
        k = _argument_write(fx, target, n_args, position)
        if k is not None:
            if requires_grad[k]:
                raise StrategyError(
                    f"the program's function writes in place into argument {k}, which is "
                    "differentiated; write into a copy (x = x.clone()), or pass "
                    "requires_grad= marking that argument not differentiated",
                    value=k,
                )
            written[k] = fx.args[1]
            continue
        if mutable:
            _refuse_write(target)
        _check_aten(target, fx.target)
        tensors: list[Value] = []

        def enc(a: Any, tensors: list[Value] = tensors) -> Any:
            if isinstance(a, fx_node):
                v = values.get(a)
                if v is None:
                    return None  # a non-tensor value (e.g. a size): not traced statically
                tensors.append(v)
                return TensorArg(len(tensors) - 1)
            if isinstance(a, list | tuple):
                return tuple(enc(x) for x in a)
            return _const(a)

        args = tuple(enc(a) for a in fx.args)  # lists made tuples: frozen
        kwargs = {k: enc(v) for k, v in fx.kwargs.items()}
        val = fx.meta.get("val")
        if isinstance(val, list | tuple):
            metas = tuple(metas_of.of(v) for v in val)
        else:
            metas = (metas_of.of(val),)
        call = Call(
            target,
            tuple(nodes[v.node].metas[v.index] for v in tensors),
            metas,
            args,
            kwargs,
            tags,
            names,
        )
        check_draw(call)
        phase = Phase.BACKWARD if any(v.node in backward for v in tensors) else Phase.FORWARD
        nodes.append(Node(Kind.CALL, fx.name, metas, tuple(tensors), call, phase))
        idx = len(nodes) - 1
        if phase is Phase.BACKWARD:
            backward.add(idx)
        where[fx] = idx
        if not isinstance(val, list | tuple):
            values[fx] = Value(idx)
    outs, grads = out_node.args[0]
    writes = sorted(written)
    return Graph(
        tuple(nodes),
        (*(values[o] for o in outs), *(values[written[k]] for k in writes)),
        tuple(values[g] if g is not None else None for g in _grads_per_arg(grads, requires_grad)),
        writes,
    )


def _refuse_write(name: str) -> None:
    """Refuse a call that would still write in place."""
    raise StrategyError(
        f"the trace still writes in place with {name} after functionalization; such a "
        "write would be lost on a moved value: write into a new tensor instead "
        "(torch.where, index_put, slice_scatter)",
        value=name,
    )


def _grads_per_arg(grads, requires_grad) -> list[Any]:
    it = iter(grads)
    return [next(it) if g else None for g in requires_grad]


def _check_aten(name: str, target: Any) -> None:
    if not name.startswith("aten."):
        raise StrategyError(
            f"the trace holds {name!r}, not an aten op; programs are traced to aten ops",
            value=target,
        )


def _constant_node(name: str, t: Any) -> Node | None:
    """A constant tensor of one value (or none) as the call ``full(shape, value)``; None
    for a parameter, a buffer, or a tensor of several values."""
    if not isinstance(t, torch.Tensor) or isinstance(t, torch.nn.Parameter) or t.is_complex():
        return None
    if t.numel() > 0 and not bool((t == t.flatten()[0]).all()):
        return None
    value = t.flatten()[0].item() if t.numel() else 0
    meta = _meta(t)
    call = Call(
        "aten.full.default",
        (),
        (meta,),
        (tuple(meta.shape), value),
        {"dtype": _const(t.dtype)},
        frozenset(),
        ("size", "fill_value"),
    )
    return Node(Kind.CALL, name, (meta,), (), call, Phase.FORWARD)


def _holders(fn: Any) -> dict[str, Any]:
    """The modules and tensors ``fn`` can reach by name: its closure, the globals it
    reads, a bound method's owner, a partial's arguments."""
    import functools
    import inspect

    found: dict[str, Any] = {}
    seen = set()
    todo = [("", fn)]
    while todo:
        prefix, f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if isinstance(f, functools.partial):
            todo.append((prefix, f.func))
            for i, a in enumerate(f.args):
                found[f"{prefix}args[{i}]"] = a
            found.update({f"{prefix}{k}": v for k, v in f.keywords.items()})
            continue
        if isinstance(f, torch.nn.Module):
            found[prefix or "self"] = f
            continue
        owner = getattr(f, "__self__", None)
        if owner is not None and not inspect.isbuiltin(f):
            found[prefix or "self"] = owner
        try:
            cv = inspect.getclosurevars(inspect.unwrap(getattr(f, "__func__", f)))
        except (TypeError, ValueError):
            continue
        for name, v in {**cv.globals, **cv.nonlocals}.items():
            if isinstance(v, torch.nn.Module | torch.Tensor):
                found[name] = v
            elif (
                callable(v)
                and not isinstance(v, type)
                and not inspect.isbuiltin(v)
                and getattr(v, "__module__", "") == getattr(f, "__module__", None)
            ):
                todo.append(("", v))
    return found


def captured_name(fn: Any, tensor: Any) -> str | None:
    """The name by which ``fn`` reaches ``tensor`` (``model.layers.0.weight``), if found."""
    if not isinstance(tensor, torch.Tensor):
        return None

    def same(t: Any) -> bool:
        return isinstance(t, torch.Tensor) and (
            t is tensor
            or (
                t.shape == tensor.shape
                and t.dtype == tensor.dtype
                and t.data_ptr() == tensor.data_ptr()
            )
        )

    for name, v in _holders(fn).items():
        if isinstance(v, torch.nn.Module):
            for kind in (v.named_parameters(remove_duplicate=False), v.named_buffers()):
                for sub, t in kind:
                    if same(t):
                        return f"{name}.{sub}"
        elif same(v):
            return name
    return None


def captured_error(fn: Any, tensor: Any) -> StrategyError:
    """The error for a tensor the traced function captures instead of taking it as an argument."""
    name = captured_name(fn, tensor)
    what = (
        "a tensor"
        if not isinstance(tensor, torch.Tensor)
        else (
            f"a {'parameter' if isinstance(tensor, torch.nn.Parameter) else 'tensor'} of shape "
            f"{tuple(tensor.shape)}"
        )
    )
    said = f"{what} ({name!r})" if name else what
    return StrategyError(
        f"the program's function reads {said} that it captures instead of taking it as an "
        "argument; a sharded program's tensors are its arguments, each with a spec: plan a "
        "module with plan_module(model, *batch_specs, specs={name or pattern: placements}), "
        "or pass the tensor as an argument (torch.func.functional_call(model, params, args) "
        "inside the function)",
        value=name or tensor,
    )

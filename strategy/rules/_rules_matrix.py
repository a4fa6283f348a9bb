"""Built-in rules for contractions: einsum, mm, bmm, addmm, linear, and embedding.

On one mesh dim a contraction can shard a letter of its equation: a letter kept in
the output shards the output and every operand holding it; a contracted letter
shards every operand holding it and leaves the output ``Partial("sum")``. A
contraction is linear in each operand, so one ``Partial`` operand (sum, or avg for
floats) with the others replicated gives a ``Partial`` output. A bias added to the
product must be ``Partial("sum")`` wherever the product is (it would be added once
per rank otherwise); under ``avg`` it may also stay replicated.

Like torch, the operands must share one dtype (no promotion), which the output keeps;
einsum is planned for floating and complex dtypes only (see ``MATMUL_DTYPES``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshplan.errors import StrategyError
from meshplan.placement import Partial, Replicate

from ._args import ALL, LINEAR, as_int, broadcast_shapes, check_count, is_float, is_real
from ._dtypes import ALL_DTYPES, COMPLEX, FLOAT8, FLOATING, check_dtypes, same_dtype
from ._oprule import OpRule
from ._rule import DimPlacement, DimStrategy, Meta, Placeholder

__all__ = ["RULES", "parse_equation", "einsum_strategies", "MATMUL_DTYPES"]

# the dtypes torch 2.13 multiplies matrices in (all operands in one dtype, no promotion)
MATMUL_DTYPES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("mm", "addmm", "linear"), tuple(d for d in ALL_DTYPES if d != "bool")),
    "bmm": tuple(d for d in ALL_DTYPES if d != "bool" and d not in FLOAT8),
    # torch's einsum gives integers int64 or not depending on the contraction path (and on
    # which dims have size 1): only dtypes whose result is always the operands' are planned
    "einsum": FLOATING + COMPLEX,
}


def matmul_dtype(op: str, inputs: Sequence[Meta]) -> str:
    """The operands' one dtype, if torch multiplies in it; raise otherwise."""
    what = (
        "floating and complex dtypes (cast integer operands to a float dtype)"
        if op == "einsum"
        else ""
    )
    check_dtypes(op, inputs, MATMUL_DTYPES[op], what)
    return same_dtype(op, inputs)


def parse_equation(equation: str, n_operands: int) -> tuple[tuple[str, ...], str]:
    """Operand and output subscripts of an einsum equation (no ellipsis).

    >>> parse_equation("mk,kn->mn", 2)
    (('mk', 'kn'), 'mn')
    >>> parse_equation("ij,jk", 2)
    (('ij', 'jk'), 'ik')
    """
    if not isinstance(equation, str):
        raise StrategyError(f"einsum equation must be a string, got {equation!r}", value=equation)
    eq = equation.replace(" ", "")
    if "." in eq:
        raise StrategyError(
            f"einsum equation {equation!r} uses an ellipsis; spell out every dim with a letter",
            value=equation,
        )
    lhs, arrow, out = eq.partition("->")
    operands = tuple(lhs.split(","))
    if not arrow:
        letters = "".join(operands)
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    if len(operands) != n_operands:
        raise StrategyError(
            f"einsum equation {equation!r} has {len(operands)} operands but {n_operands} "
            "tensors were given",
            value=equation,
        )
    for part in (*operands, out):
        if not all(c.isalpha() for c in part):
            raise StrategyError(
                f"einsum equation {equation!r}: subscripts are letters", value=equation
            )
    if len(set(out)) != len(out):
        raise StrategyError(
            f"einsum equation {equation!r} repeats an output letter", value=equation
        )
    missing = set(out) - set("".join(operands))
    if missing:
        raise StrategyError(
            f"einsum equation {equation!r}: output letters {sorted(missing)!r} appear in no operand",
            value=equation,
        )
    return operands, out


def _letter_sizes(equation: str, operands: Sequence[str], metas: Sequence[Meta]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for sub, meta in zip(operands, metas, strict=True):
        if len(sub) != meta.ndim:
            raise StrategyError(
                f"einsum {equation!r}: operand {sub!r} names {len(sub)} dims but the tensor has "
                f"shape {meta.shape!r}",
                value=meta,
            )
        for c, s in zip(sub, meta.shape, strict=True):
            if sizes.setdefault(c, s) != s:
                raise StrategyError(
                    f"einsum {equation!r}: letter {c!r} has sizes {sizes[c]} and {s}", value=meta
                )
    return sizes


def einsum_strategies(
    operands: Sequence[str], out: str, float_math: bool
) -> list[tuple[DimPlacement, list[DimPlacement]]]:
    """(output placement, operand placements) pairs of one mesh dim for a contraction."""
    pairs: list[tuple[DimPlacement, list[DimPlacement]]] = []
    letters = sorted(set("".join(operands)), key=lambda c: ("".join(operands) + out).index(c))
    for c in letters:
        if any(sub.count(c) > 1 for sub in operands):
            continue  # a diagonal: one mesh dim cannot shard two tensor dims of one operand
        ins: list[DimPlacement] = [
            Placeholder(sub.index(c)) if c in sub else Replicate() for sub in operands
        ]
        pairs.append((Placeholder(out.index(c)) if c in out else Partial("sum"), ins))
    for op in LINEAR if float_math else LINEAR[:1]:
        for j in range(len(operands)):
            ins = [Partial(op) if k == j else Replicate() for k in range(len(operands))]
            pairs.append((Partial(op), ins))
    return pairs


def _bias_entry(out_p: DimPlacement, out_shape: tuple[int, ...], bias: Meta) -> DimPlacement:
    if isinstance(out_p, Placeholder):
        bd = out_p.dim - (len(out_shape) - bias.ndim)
        if bd >= 0 and bias.shape[bd] == out_shape[out_p.dim]:
            return Placeholder(bd)
        return Replicate()
    return out_p  # Partial: the bias must be Partial of the same op (Replicate only handled below)


def _with_bias(
    pairs: list[tuple[DimPlacement, list[DimPlacement]]],
    n_operands: int,
    out_shape: tuple[int, ...],
    bias: Meta,
    bias_first: bool,
    float_math: bool,
) -> list[DimStrategy]:
    """The contraction's strategies with a bias input added to the product."""
    out: list[DimStrategy] = []

    def add(o: DimPlacement, b: DimPlacement, ins: list[DimPlacement]) -> None:
        out.append(DimStrategy([o], [b, *ins] if bias_first else [*ins, b]))

    for o, ins in pairs:
        add(o, _bias_entry(o, out_shape, bias), ins)
        if o == Partial("avg") and any(p == Partial("avg") for p in ins):
            add(o, Replicate(), ins)  # avg of (b + x_r) is b + avg(x_r)
    if float_math:  # only the bias averages: avg of (b_r + x) is avg(b_r) + x
        add(Partial("avg"), Partial("avg"), [Replicate()] * n_operands)
    return out


def _contraction(
    equation: str, inputs: tuple[Meta, ...]
) -> tuple[list[DimStrategy], tuple[int, ...]]:
    """A contraction's strategies and its output shape."""
    operands, out = parse_equation(equation, len(inputs))
    sizes = _letter_sizes(equation, operands, inputs)
    pairs = einsum_strategies(operands, out, all(is_float(m) for m in inputs))
    return [DimStrategy([o], ins) for o, ins in pairs], tuple(sizes[c] for c in out)


def _einsum_rule(inputs: tuple[Meta, ...], *, equation: str) -> list[DimStrategy]:
    matmul_dtype("einsum", inputs)
    return _contraction(equation, inputs)[0]


def _einsum_outputs(inputs: tuple[Meta, ...], *, equation: str) -> tuple[Meta, ...]:
    dtype = matmul_dtype("einsum", inputs)
    return (Meta(_contraction(equation, inputs)[1], dtype),)


def _fixed(equation: str, op: str, ndims: tuple[int, ...]):
    def check(inputs: tuple[Meta, ...]) -> str:
        check_count(op, inputs, len(ndims))
        for m, nd in zip(inputs, ndims, strict=True):
            if m.ndim != nd:
                raise StrategyError(
                    f"{op} takes {'-D, '.join(map(str, ndims))}-D tensors, got shapes "
                    f"{[x.shape for x in inputs]!r}",
                    value=inputs,
                )
        return matmul_dtype(op, inputs)

    def rule(inputs: tuple[Meta, ...]) -> list[DimStrategy]:
        check(inputs)
        return _contraction(equation, inputs)[0]

    def outputs(inputs: tuple[Meta, ...]) -> tuple[Meta, ...]:
        dtype = check(inputs)
        return (Meta(_contraction(equation, inputs)[1], dtype),)

    return OpRule(rule, outputs)


def _addmm_parts(inputs: tuple[Meta, ...]) -> tuple[Meta, tuple[int, int]]:
    check_count("addmm", inputs, 3)
    matmul_dtype("addmm", inputs)
    bias, m1, m2 = inputs
    if m1.ndim != 2 or m2.ndim != 2 or m1.shape[1] != m2.shape[0]:
        raise StrategyError(
            f"addmm needs (m, k) and (k, n) matrices, got {m1.shape!r} and {m2.shape!r}",
            value=inputs,
        )
    shape = (m1.shape[0], m2.shape[1])
    if broadcast_shapes("addmm", [bias.shape, shape]) != shape:
        raise StrategyError(
            f"addmm: bias {bias.shape!r} does not broadcast to {shape!r}", value=bias
        )
    return bias, shape


def _scalar(op: str, name: str, value: Any) -> None:
    if not is_real(value):
        raise StrategyError(f"{op}: {name}={value!r} must be a number", value=value)


def _addmm_rule(inputs: tuple[Meta, ...], *, beta: Any = 1, alpha: Any = 1) -> list[DimStrategy]:
    # out = beta * bias + alpha * (m1 @ m2): scalars, so every strategy of the plain
    # sum holds (its Partials are sums and averages, linear in each term)
    _scalar("addmm", "beta", beta)
    _scalar("addmm", "alpha", alpha)
    bias, shape = _addmm_parts(inputs)
    fm = all(is_float(m) for m in inputs)
    return _with_bias(einsum_strategies(("mk", "kn"), "mn", fm), 2, shape, bias, True, fm)


def _addmm_outputs(inputs: tuple[Meta, ...], *, beta: Any = 1, alpha: Any = 1) -> tuple[Meta, ...]:
    _scalar("addmm", "beta", beta)
    _scalar("addmm", "alpha", alpha)
    _, shape = _addmm_parts(inputs)
    return (Meta(shape, inputs[1].dtype),)


_BATCH = "abcdefghijlmopqrstuvwxyz"  # every letter but k and n


def _linear_parts(inputs: tuple[Meta, ...]) -> tuple[tuple[str, str], str, tuple[int, ...]]:
    check_count("linear", inputs, 2, 3)
    matmul_dtype("linear", inputs)
    x, w = inputs[0], inputs[1]
    if x.ndim < 1 or w.ndim != 2 or x.shape[-1] != w.shape[1] or x.ndim > len(_BATCH) + 1:
        raise StrategyError(
            f"linear needs x of shape (..., k) and weight (n, k), got {x.shape!r} and {w.shape!r}",
            value=inputs,
        )
    batch = _BATCH[: x.ndim - 1]
    shape = (*x.shape[:-1], w.shape[0])
    if len(inputs) == 3 and broadcast_shapes("linear", [inputs[2].shape, shape]) != shape:
        raise StrategyError(
            f"linear: bias {inputs[2].shape!r} does not broadcast to {shape!r}", value=inputs[2]
        )
    return (batch + "k", "nk"), batch + "n", shape


def _linear_rule(inputs: tuple[Meta, ...]) -> list[DimStrategy]:
    operands, out, shape = _linear_parts(inputs)
    fm = all(is_float(m) for m in inputs)
    pairs = einsum_strategies(operands, out, fm)
    if len(inputs) == 2:
        return [DimStrategy([o], ins) for o, ins in pairs]
    return _with_bias(pairs, 2, shape, inputs[2], False, fm)


def _linear_outputs(inputs: tuple[Meta, ...]) -> tuple[Meta, ...]:
    _, _, shape = _linear_parts(inputs)
    return (Meta(shape, inputs[0].dtype),)


def _embedding_parts(inputs: tuple[Meta, ...]) -> tuple[Meta, Meta]:
    check_count("embedding", inputs, 2)
    ids, weight = inputs
    if weight.ndim != 2 or ids.dtype not in ("int64", "int32"):
        raise StrategyError(
            f"embedding takes (indices, weight): int64 or int32 indices (as torch does) and a "
            f"2-D weight, got {ids!r} and {weight!r}",
            value=inputs,
        )
    return ids, weight


def _padding_idx(weight: Meta, padding_idx: Any) -> None:
    n = weight.shape[0]
    i = as_int(padding_idx)
    if padding_idx is not None and (i is None or not -n <= i < n):
        raise StrategyError(
            f"embedding: padding_idx={padding_idx!r} must be None or a row in [{-n}, {n})",
            value=padding_idx,
        )


def _embedding_rule(inputs: tuple[Meta, ...], *, padding_idx: Any = None) -> list[DimStrategy]:
    # padding_idx only keeps that row's gradient at zero: the lookup, and so its
    # strategies, are the same
    ids, weight = _embedding_parts(inputs)
    _padding_idx(weight, padding_idx)
    out = [DimStrategy([Placeholder(ids.ndim)], [Replicate(), Placeholder(1)])]  # column-wise
    out += [DimStrategy([Placeholder(i)], [Placeholder(i), Replicate()]) for i in range(ids.ndim)]
    # a lookup selects rows, so it commutes with every reduction of the weight
    out += [DimStrategy([Partial(op)], [Replicate(), Partial(op)]) for op in ALL]
    return out


def _embedding_outputs(inputs: tuple[Meta, ...], *, padding_idx: Any = None) -> tuple[Meta, ...]:
    ids, weight = _embedding_parts(inputs)
    _padding_idx(weight, padding_idx)
    return (Meta((*ids.shape, weight.shape[1]), weight.dtype),)


RULES: dict[str, OpRule] = {
    "einsum": OpRule(_einsum_rule, _einsum_outputs),
    "mm": _fixed("mk,kn->mn", "mm", (2, 2)),
    "bmm": _fixed("bmk,bkn->bmn", "bmm", (3, 3)),
    "addmm": OpRule(_addmm_rule, _addmm_outputs),
    "linear": OpRule(_linear_rule, _linear_outputs),
    "embedding": OpRule(_embedding_rule, _embedding_outputs),
}

"""Composition of layouts, and the layout that enumerates given offsets.

``compose(outer, inner)`` maps index ``i`` to ``outer.offset(inner.offset(i))``: mode by
mode when ``inner``'s modes split ``outer``'s evenly (CuTe's admissible case), otherwise
by reading the composite's offsets back as a layout (:func:`modes_of`).
"""

from __future__ import annotations

from collections.abc import Sequence

from meshplan.errors import MeshError

from ._axis import Axis, Mode, spans_nest

__all__ = ["compose", "modes_of"]


def compose(outer: Axis, inner: Axis) -> Axis:
    """``outer ∘ inner``: index ``i`` maps to ``outer.offset(inner.offset(i))``.

    Mode by mode when ``inner``'s strides and sizes divide ``outer``'s modes (CuTe's
    admissible case, O(modes)); otherwise by enumerating the ``inner.size()`` offsets.
    Raises :class:`MeshError` when the composite is not a layout.

    >>> compose(Axis.of((2, 4), (1, 2)), Axis.of(2, 4))   # every 4th index of outer
    Axis(sizes=(2,), strides=(1,))
    >>> compose(Axis.of((2, 3), (1, 2)), Axis.of(2, 2))   # offsets 0, 4: not admissible
    Axis(sizes=(2,), strides=(4,))
    """
    for value in (outer, inner):
        if not isinstance(value, Axis):
            raise MeshError(f"compose takes two Axis values, got {value!r}", value=value)
    if inner.cosize() > outer.size():
        raise MeshError(
            f"{inner} reaches index {inner.cosize() - 1}, outside {outer} (indices "
            f"0..{outer.size() - 1}); compose needs the inner layout within the outer's indices",
            value=(outer, inner),
        )
    result: list[Mode] = []
    try:
        # mode by mode only when inner's moving modes, by stride, each start at a multiple
        # of the span of the faster ones: their offsets then add up digit by digit in
        # outer's mixed radix; else two of them may carry across one of outer's mode
        # boundaries, even when inner is injective ((2,3):(3,2) reaches 3 + 4)
        if not spans_nest(inner.modes):
            raise _NotAdmissible
        for size, stride in inner.modes:
            result.extend(_compose_mode(outer, size, stride))
    except _NotAdmissible:
        pass
    else:
        return Axis.from_modes(result)
    offsets = [outer.offset(inner.offset(i)) for i in range(inner.size())]
    modes = modes_of(offsets)
    if modes is None:
        raise MeshError(
            f"{outer} composed with {inner} is not a layout (its offsets "
            f"{_short(offsets)} are not a mixed-radix progression); choose sizes that split "
            "the layout's modes evenly",
            value=(outer, inner),
        )
    return Axis.from_modes(modes)


def modes_of(offsets: Sequence[int]) -> tuple[Mode, ...] | None:
    """The coalesced modes that enumerate ``offsets`` in order, or None if no layout does.

    >>> modes_of([0, 1, 4, 5]), modes_of([0, 1, 3])
    (((2, 4), (2, 1)), None)
    """
    out: list[Mode] = []
    offsets = list(offsets)
    while len(offsets) > 1:
        if offsets[0] != 0:
            return None
        n, d = len(offsets), offsets[1]
        run = next((i for i in range(n) if offsets[i] != i * d), n)
        if n % run or d < 0:
            return None
        for j in range(0, n, run):
            if any(offsets[j + i] != offsets[j] + i * d for i in range(run)):
                return None
        out.append((run, d))
        offsets = offsets[::run]
    if offsets and offsets[0] != 0:
        return None
    return tuple(reversed(out))


def _short(values: Sequence[int], limit: int = 8) -> str:
    if len(values) <= limit:
        return repr(tuple(values))
    return f"({', '.join(map(str, values[:limit]))}, ...)"


class _NotAdmissible(Exception):
    pass


def _compose_mode(outer: Axis, size: int, stride: int) -> list[Mode]:
    if stride == 0 or size == 1:
        return [(size, 0)]
    pieces: list[Mode] = []  # fastest first while walking
    rest_stride, rest_size = stride, size
    for osize, ostride in reversed(outer.modes):
        if rest_stride >= osize:
            if rest_stride % osize != 0:
                break
            rest_stride //= osize
            continue
        if osize % rest_stride != 0:
            break
        avail = osize // rest_stride
        if rest_size <= avail:
            pieces.append((rest_size, ostride * rest_stride))
            rest_size = 1
            break
        if rest_size % avail != 0:
            break
        pieces.append((avail, ostride * rest_stride))
        rest_size //= avail
        rest_stride = 1
    if rest_size != 1:
        raise _NotAdmissible
    return list(reversed(pieces))

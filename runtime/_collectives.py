"""Collectives over a :class:`~meshplan.runtime.Group`, in mesh-coordinate order.

Every helper speaks in *positions*: the members of a group numbered by mesh coordinate
along its dims (``group.ranks``), never by the torch group's own rank order. Lists of
per-member data are in position order, and the helpers translate to and from torch group
ranks (a permuted rank map therefore cannot permute data).

They return new contiguous tensors and never modify their inputs; uneven sizes are padded
on the wire and trimmed afterwards; a group of one member needs no communication. The
torch calls are the current (2.13) ones: ``all_gather_single``, ``reduce_scatter_single``,
``all_reduce`` and ``all_to_all_single``; gloo runs all of them, all_to_all included.
(Point-to-point messages, ``batch_isend_irecv``, are in :mod:`meshplan.runtime._p2p`.)
Reductions: ``"sum"``, ``"max"``, ``"min"`` map to torch's ops, and ``"avg"`` is a sum
followed by a division by the group size (true division for floating and complex dtypes,
floor division for integers, as in the simulator), which works on every backend. gloo
(torch 2.13) reduce-scatters every one of these ops natively, so no all_reduce fallback
is needed; it has no max/min for complex dtypes.

A torch failure (a dead peer, a peer that never joins within the group's timeout, a
mismatch between ranks that the backend detects) surfaces as a ``RuntimeShellError``
naming the collective, the group and the rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from meshplan.errors import RuntimeShellError

from ._failstop import check, wait
from ._group import Group

__all__ = [
    "REDUCE_OPS",
    "all_gather",
    "all_gather_chunks",
    "all_gather_concat",
    "all_gather_into",
    "all_reduce",
    "all_to_all",
    "all_to_all_flat",
    "all_to_all_single",
    "is_chunk_sizes",
    "reduce_scatter",
]

REDUCE_OPS = ("sum", "avg", "max", "min")

_TORCH_OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


# -- shared checks ------------------------------------------------------------------------


class guard:
    """Turn a torch.distributed failure inside the block into a RuntimeShellError naming
    what failed (every collective here and in :mod:`._p2p` runs in one). A plain class:
    entering it costs next to nothing on the per-call path."""

    __slots__ = ("what", "group")

    def __init__(self, what: str, group: Group) -> None:
        self.what = what
        self.group = group

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is None or isinstance(exc, RuntimeShellError):
            return False
        if isinstance(exc, RuntimeError | ValueError):
            raise _shell_error(self.what, self.group, exc) from exc
        return False


def _collective(call, what: str, group: Group, tensor: torch.Tensor, *args, **kwargs) -> None:
    """Run the torch collective ``call(tensor, *args, group=group.pg, **kwargs)``: as is
    while ``torch.compile`` traces (a functional collective in the graph), else issued
    asynchronously and waited for with fail-stop (:func:`~._failstop.wait`: a peer's
    failure stops this rank within seconds; a known failure refuses at once)."""
    if torch.compiler.is_compiling():
        with guard(what, group):
            call(tensor, *args, group=group.pg, **kwargs)
        return
    check(what, group)
    with guard(what, group):
        work = call(tensor, *args, group=group.pg, async_op=True, **kwargs)
    wait(work, group, what, cuda=tensor.is_cuda)


def _shell_error(what: str, group: Group, exc: BaseException) -> RuntimeShellError:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    if "Invalid scalar type" in text or "Unsupported data type" in text:
        return RuntimeShellError(
            f"{what} on group {group.name!r} failed on rank {group.rank}: the process "
            f"group's backend cannot carry this dtype ({first}; gloo lacks e.g. int16 "
            "and the float8 types). View the tensor as a same-size dtype it carries "
            "(meshplan's run() does) or convert it",
            value=group,
        )
    return RuntimeShellError(
        f"{what} on group {group.name!r} (ranks {group.ranks!r}) failed on rank "
        f"{group.rank}: {first}. A peer rank died, did not join within the group's "
        f"{group.timeout:g}s timeout, or called a different collective or shape",
        value=group,
    )


def _check_op(op: str) -> str:
    if op not in _TORCH_OPS:
        raise RuntimeShellError(f"unknown reduce op {op!r}; use one of {REDUCE_OPS!r}", value=op)
    return op


def _check_dim(tensor: torch.Tensor, dim: int) -> int:
    if tensor.dim() == 0:
        raise RuntimeShellError("a 0-d tensor has no dim to split or gather along", value=dim)
    if not -tensor.dim() <= dim < tensor.dim():
        raise RuntimeShellError(
            f"dim {dim} is out of range for a {tensor.dim()}-d tensor", value=dim
        )
    return dim % tensor.dim()


def _check_sizes(sizes: Sequence[int], group: Group, what: str) -> list[int]:
    sizes = [int(s) for s in sizes]
    if len(sizes) != group.size or any(s < 0 for s in sizes):
        raise RuntimeShellError(
            f"{what} {sizes!r} must list one size >= 0 per member of group {group.name!r} "
            f"({group.size} members)",
            value=sizes,
        )
    return sizes


def _finish_avg(tensor: torch.Tensor, n: int) -> torch.Tensor:
    if n == 1:
        return tensor
    if tensor.dtype == torch.bool:
        raise RuntimeShellError("cannot average bool tensors; use 'max' (any) or 'min' (all)")
    if tensor.is_floating_point() or tensor.is_complex():
        return tensor.div_(n)
    return tensor.floor_divide_(n)


# -- all_reduce ---------------------------------------------------------------------------


def all_reduce(tensor: torch.Tensor, group: Group, op: str = "sum") -> torch.Tensor:
    """Reduce ``tensor`` over the group with ``op``; every member gets the result.

    >>> from meshplan.runtime._group import Group
    >>> alone = Group("d0", ranks=(0,), pg_ranks=(0,), rank=0, pg=None)
    >>> all_reduce(torch.tensor([1, 5]), alone, "avg")
    tensor([1, 5])
    """
    _check_op(op)
    out = tensor.clone(memory_format=torch.contiguous_format)
    if group.size > 1 and out.numel():
        _collective(dist.all_reduce, f"all_reduce({op})", group, out, op=_TORCH_OPS[op])
    if op == "avg":
        _finish_avg(out, group.size)
    return out


# -- all_gather ---------------------------------------------------------------------------


def all_gather(
    tensor: torch.Tensor, group: Group, *, sizes: Sequence[int] | None = None, dim: int = 0
) -> list[torch.Tensor]:
    """Every member's ``tensor``, as a list in position order.

    ``sizes[p]`` is the length along ``dim`` of position ``p``'s tensor (default: all
    equal to the local one); the other dims must agree on every member. Uneven pieces are
    padded on the wire and trimmed.

    >>> from meshplan.runtime._group import Group
    >>> alone = Group("d0", ranks=(3,), pg_ranks=(3,), rank=3, pg=None)
    >>> all_gather(torch.arange(4).view(2, 2), alone, dim=1)
    [tensor([[0, 1],
            [2, 3]])]
    """
    dim = _check_dim(tensor, dim)
    n, me = group.size, group.position
    sizes = _check_sizes([tensor.shape[dim]] * n if sizes is None else sizes, group, "sizes")
    if tensor.shape[dim] != sizes[me]:
        raise RuntimeShellError(
            f"all_gather: rank {group.rank}'s tensor has size {tensor.shape[dim]} along dim "
            f"{dim}, but sizes[{me}] says {sizes[me]}",
            value=tuple(tensor.shape),
        )
    if n == 1:
        return [tensor.clone(memory_format=torch.contiguous_format)]
    x = tensor.movedim(dim, 0)
    rest = tuple(x.shape[1:])
    width = max(sizes)
    if width == 0 or math.prod(rest) == 0:
        return [_moved(x.new_empty((s, *rest)), dim) for s in sizes]
    if x.shape[0] == width:
        x = x.contiguous()
    else:
        padded = x.new_empty((width, *rest))
        padded[: x.shape[0]] = x
        x = padded
    out = x.new_empty((n * width, *rest))
    _collective(dist.all_gather_single, "all_gather", group, out, x)
    pieces = []
    for p, s in enumerate(sizes):
        start = group.group_rank(p) * width
        pieces.append(_moved(out[start : start + s], dim))
    return pieces


def all_gather_concat(
    tensor: torch.Tensor, group: Group, *, sizes: Sequence[int] | None = None, dim: int = 0
) -> torch.Tensor:
    """Every member's ``tensor`` concatenated along ``dim`` in position order.

    Without padding or reordering (even sizes, dim 0, coordinate order equal to the torch
    group's order) the gathered buffer is returned as is, with no copy.

    >>> from meshplan.runtime._group import Group
    >>> alone = Group("d0", ranks=(0,), pg_ranks=(0,), rank=0, pg=None)
    >>> all_gather_concat(torch.ones(2), alone)
    tensor([1., 1.])
    """
    dim = _check_dim(tensor, dim)
    n = group.size
    even = sizes is None or len(set(sizes)) <= 1
    if n > 1 and dim == 0 and even and group.is_identity and tensor.numel():
        _check_sizes([tensor.shape[0]] * n if sizes is None else sizes, group, "sizes")
        if sizes is not None and sizes[0] != tensor.shape[0]:
            raise RuntimeShellError(
                f"all_gather: rank {group.rank}'s tensor has size {tensor.shape[0]} along "
                f"dim 0, but sizes says {sizes[0]}",
                value=tuple(tensor.shape),
            )
        x = tensor.contiguous()
        out = x.new_empty((n * x.shape[0], *x.shape[1:]))
        _collective(dist.all_gather_single, "all_gather", group, out, x)
        return out
    return torch.cat(all_gather(tensor, group, sizes=sizes, dim=dim), dim=dim)


def is_chunk_sizes(sizes: Sequence[int]) -> bool:
    """Whether ``sizes`` are those of ``torch.chunk``'s pieces: whole pieces of the
    largest size, then at most one shorter piece, then empty ones.

    >>> is_chunk_sizes([3, 3, 2, 0]), is_chunk_sizes([3, 2, 2]), is_chunk_sizes([0, 0])
    (True, False, False)
    """
    width = max(sizes, default=0)
    if width == 0:
        return False
    short = False
    for s in sizes:
        if short and s:
            return False
        short = short or s < width
    return True


def all_gather_chunks(flat: torch.Tensor, group: Group, sizes: Sequence[int]) -> torch.Tensor:
    """The concatenation, in position order, of every member's 1-d ``flat`` whose lengths
    are ``sizes`` (:func:`is_chunk_sizes`, in a group whose positions are its torch ranks):
    one gather of pieces padded to the largest, whose first ``sum(sizes)`` elements are
    the result (a view of the gathered buffer: no copy after the collective).

    >>> from meshplan.runtime._group import Group
    >>> alone = Group("d0", ranks=(0,), pg_ranks=(0,), rank=0, pg=None)
    >>> all_gather_chunks(torch.arange(3), alone, [3])
    tensor([0, 1, 2])
    """
    sizes = _check_sizes(sizes, group, "sizes")
    if not is_chunk_sizes(sizes) or not group.is_identity or flat.dim() != 1:
        raise RuntimeShellError(
            f"all_gather_chunks gathers 1-d pieces of torch.chunk sizes in a group ordered "
            f"by position, got sizes {sizes!r} on group {group.name!r} and a "
            f"{flat.dim()}-d tensor; use all_gather",
            value=sizes,
        )
    width = sizes[0]
    if flat.numel() != sizes[group.position]:
        raise RuntimeShellError(
            f"all_gather: rank {group.rank}'s tensor has {flat.numel()} elements, but "
            f"sizes[{group.position}] says {sizes[group.position]}",
            value=flat.numel(),
        )
    if flat.numel() == width:
        piece = flat.contiguous()
    else:  # the padding is gathered too, and dropped: it need not be zeroed
        piece = flat.new_empty((width,))
        piece[: flat.numel()] = flat
    out = flat.new_empty((group.size * width,))
    all_gather_into(out, piece, group)
    return out[: sum(sizes)]


def all_gather_into(out: torch.Tensor, tensor: torch.Tensor, group: Group) -> None:
    """Gather every member's ``tensor`` (equal shapes, at least one dim) into ``out``
    (their concatenation along dim 0, written in place) in torch group-rank order, not
    position order: for callers that map the order themselves.

    >>> from meshplan.runtime._group import Group
    >>> alone = Group("d0", ranks=(0,), pg_ranks=(0,), rank=0, pg=None)
    >>> out = torch.empty(2, dtype=torch.long)
    >>> all_gather_into(out, torch.arange(2), alone)
    >>> out
    tensor([0, 1])
    """
    if group.size == 1:
        out.copy_(tensor)
        return
    _collective(dist.all_gather_single, "all_gather", group, out, tensor.contiguous())


def _moved(piece: torch.Tensor, dim: int) -> torch.Tensor:
    return piece if dim == 0 else piece.movedim(0, dim).contiguous()


# -- reduce_scatter -----------------------------------------------------------------------


def reduce_scatter(
    tensor: torch.Tensor | Sequence[torch.Tensor],
    group: Group,
    op: str = "sum",
    *,
    sizes: Sequence[int] | None = None,
    dim: int = 0,
) -> torch.Tensor:
    """Reduce over the group with ``op``; position ``p`` keeps the reduction of block ``p``.

    ``tensor`` is split along ``dim`` into per-position blocks of ``sizes`` (default:
    equal blocks; the size must divide), or is already a list of per-position blocks
    (any shapes, equal on every member for the same position). Uneven blocks are padded
    with zeros on the wire.

    >>> from meshplan.runtime._group import Group
    >>> alone = Group("d0", ranks=(0,), pg_ranks=(0,), rank=0, pg=None)
    >>> reduce_scatter(torch.tensor([4.0, 6.0]), alone, "avg")
    tensor([4., 6.])
    """
    _check_op(op)
    n = group.size
    if isinstance(tensor, torch.Tensor):
        dim = _check_dim(tensor, dim)
        total = tensor.shape[dim]
        if sizes is None:
            if total % n:
                raise RuntimeShellError(
                    f"reduce_scatter: size {total} along dim {dim} does not split evenly over "
                    f"{n} members of group {group.name!r}; pass sizes=",
                    value=total,
                )
            sizes = [total // n] * n
        sizes = _check_sizes(sizes, group, "sizes")
        if sum(sizes) != total:
            raise RuntimeShellError(
                f"reduce_scatter: sizes {sizes!r} add up to {sum(sizes)}, but the tensor has "
                f"{total} along dim {dim}",
                value=sizes,
            )
        x = tensor.movedim(dim, 0)
        if n > 1 and dim == 0 and len(set(sizes)) == 1 and group.is_identity and x.numel():
            out = x.new_empty((sizes[0], *x.shape[1:]))
            _collective(
                dist.reduce_scatter_single,
                f"reduce_scatter({op})",
                group,
                out,
                x.contiguous(),
                op=_TORCH_OPS[op],
            )
            return _finish_avg(out, n) if op == "avg" else out
        blocks = list(x.split(sizes, dim=0))
        return _moved(_reduce_scatter_blocks(blocks, group, op), dim)
    if dim != 0 or sizes is not None:
        raise RuntimeShellError("reduce_scatter of a block list takes neither sizes= nor dim=")
    blocks = list(tensor)
    if len(blocks) != n:
        raise RuntimeShellError(
            f"reduce_scatter got {len(blocks)} blocks for group {group.name!r} of {n} members",
            value=len(blocks),
        )
    return _reduce_scatter_blocks(blocks, group, op)


def _reduce_scatter_blocks(blocks: list[torch.Tensor], group: Group, op: str) -> torch.Tensor:
    n, me = group.size, group.position
    mine = blocks[me]
    dtypes = {b.dtype for b in blocks}
    if len(dtypes) != 1:
        raise RuntimeShellError(f"reduce_scatter blocks mix dtypes {sorted(map(str, dtypes))}")
    width = max(b.numel() for b in blocks)
    if n == 1 or width == 0:  # every member knows both: nothing to send
        out = mine.clone(memory_format=torch.contiguous_format)
        return _finish_avg(out, n) if op == "avg" else out
    uneven = any(b.numel() != width for b in blocks)
    wire = mine.new_zeros((n, width)) if uneven else mine.new_empty((n, width))
    for p, block in enumerate(blocks):
        wire[group.group_rank(p), : block.numel()] = block.reshape(-1)
    out = mine.new_empty((width,))
    _collective(
        dist.reduce_scatter_single,
        f"reduce_scatter({op})",
        group,
        out,
        wire.view(-1),
        op=_TORCH_OPS[op],
    )
    out = out[: mine.numel()].view(mine.shape)
    return _finish_avg(out, n) if op == "avg" else out


# -- all_to_all ---------------------------------------------------------------------------


def all_to_all(
    blocks: Sequence[torch.Tensor],
    group: Group,
    recv_shapes: Sequence[Sequence[int]] | None = None,
) -> list[torch.Tensor]:
    """Send ``blocks[p]`` to position ``p``; return what each position sent here, in order.

    ``recv_shapes[p]`` is the shape of the block position ``p`` sends to this rank
    (default: the shapes sent, for symmetric exchanges). One ``all_to_all_single`` call.

    >>> from meshplan.runtime._group import Group
    >>> alone = Group("d0", ranks=(0,), pg_ranks=(0,), rank=0, pg=None)
    >>> all_to_all([torch.arange(3)], alone)
    [tensor([0, 1, 2])]
    """
    n = group.size
    blocks = list(blocks)
    if len(blocks) != n:
        raise RuntimeShellError(
            f"all_to_all got {len(blocks)} blocks for group {group.name!r} of {n} members",
            value=len(blocks),
        )
    if recv_shapes is None:
        recv_shapes = [tuple(b.shape) for b in blocks]
    shapes = [tuple(int(d) for d in s) for s in recv_shapes]
    if len(shapes) != n:
        raise RuntimeShellError(
            f"all_to_all got {len(shapes)} receive shapes for a group of {n} members",
            value=shapes,
        )
    dtypes = {b.dtype for b in blocks}
    if len(dtypes) != 1:
        raise RuntimeShellError(f"all_to_all blocks mix dtypes {sorted(map(str, dtypes))}")
    if n == 1:
        return [blocks[0].clone(memory_format=torch.contiguous_format).view(shapes[0])]
    send = [b.reshape(-1) for b in group.to_group_order(blocks)]
    recv_numels = group.to_group_order([math.prod(s) for s in shapes])
    inp = torch.cat(send)
    out = inp.new_empty((sum(recv_numels),))
    _collective(
        dist.all_to_all_single,
        "all_to_all",
        group,
        out,
        inp,
        recv_numels,
        [t.numel() for t in send],
    )
    by_group = out.split(recv_numels)
    return [by_group[group.group_rank(p)].view(shapes[p]) for p in range(n)]


def all_to_all_flat(
    send: torch.Tensor,
    recv: torch.Tensor,
    send_sizes: Sequence[int],
    recv_sizes: Sequence[int],
    group: Group,
) -> None:
    """Exchange flat buffers already laid out in torch group-rank order: ``send_sizes[g]``
    elements of ``send`` go to group rank ``g``, ``recv_sizes[g]`` elements from it land
    in ``recv`` (written in place). The caller sizes both buffers; a group of one copies.

    >>> from meshplan.runtime._group import Group
    >>> alone = Group("d0", ranks=(0,), pg_ranks=(0,), rank=0, pg=None)
    >>> out = torch.empty(3, dtype=torch.long)
    >>> all_to_all_flat(torch.arange(3), out, [3], [3], alone)
    >>> out
    tensor([0, 1, 2])
    """
    if group.size == 1:
        recv.copy_(send)
        return
    _collective(
        dist.all_to_all_single, "all_to_all", group, recv, send, list(recv_sizes), list(send_sizes)
    )


def all_to_all_single(
    tensor: torch.Tensor,
    group: Group,
    send_sizes: Sequence[int],
    recv_sizes: Sequence[int],
    *,
    dim: int = 0,
) -> torch.Tensor:
    """Split ``tensor`` along ``dim`` by ``send_sizes`` (one piece per position), exchange,
    and concatenate the received pieces (``recv_sizes``) along ``dim`` in position order.

    >>> from meshplan.runtime._group import Group
    >>> alone = Group("d0", ranks=(0,), pg_ranks=(0,), rank=0, pg=None)
    >>> all_to_all_single(torch.arange(4).view(2, 2), alone, [2], [2], dim=1)
    tensor([[0, 1],
            [2, 3]])
    """
    dim = _check_dim(tensor, dim)
    send_sizes = _check_sizes(send_sizes, group, "send_sizes")
    recv_sizes = _check_sizes(recv_sizes, group, "recv_sizes")
    if sum(send_sizes) != tensor.shape[dim]:
        raise RuntimeShellError(
            f"all_to_all: send_sizes {send_sizes!r} add up to {sum(send_sizes)}, but the "
            f"tensor has {tensor.shape[dim]} along dim {dim}",
            value=send_sizes,
        )
    if group.size > 1 and dim == 0 and group.is_identity:
        x = tensor.contiguous()
        out = x.new_empty((sum(recv_sizes), *x.shape[1:]))
        _collective(dist.all_to_all_single, "all_to_all", group, out, x, recv_sizes, send_sizes)
        return out
    shape = list(tensor.shape)
    blocks = list(tensor.split(send_sizes, dim=dim))
    recv_shapes = [tuple(shape[:dim] + [s] + shape[dim + 1 :]) for s in recv_sizes]
    return torch.cat(all_to_all(blocks, group, recv_shapes), dim=dim)

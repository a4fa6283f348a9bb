"""Point-to-point messages over a :class:`~meshplan.runtime.Group`, in mesh-coordinate order.

:func:`exchange` sends and receives any number of messages in one ``batch_isend_irecv``,
addressing members by *position* (mesh coordinate along the group's dims) as the
collectives of :mod:`meshplan.runtime._collectives` do; :func:`permute` is its
one-send, one-receive form. Messages to the calling rank's own position are copied
locally and empty ones are not sent. A torch failure surfaces as a
``RuntimeShellError`` naming the group and the rank.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import torch
import torch.distributed as dist

from meshplan.errors import RuntimeShellError

from ._collectives import guard
from ._failstop import check, fail_stop
from ._group import Group

__all__ = ["exchange", "permute"]


def exchange(
    sends: Sequence[tuple[int, torch.Tensor]],
    recvs: Sequence[tuple[int, Sequence[int]]],
    group: Group,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> list[torch.Tensor]:
    """Point-to-point exchange in one ``batch_isend_irecv``: ``(position, tensor)`` sends and
    ``(position, shape)`` receives; returns the received tensors in ``recvs`` order.

    Several messages between the same pair are matched in order; messages to this rank's
    own position are copied locally; empty messages are not sent. ``dtype``/``device``
    default to the first send's (a rank that only receives must give ``dtype``).

    >>> from meshplan.runtime._group import Group
    >>> alone = Group("d0", ranks=(0,), pg_ranks=(0,), rank=0, pg=None)
    >>> exchange([(0, torch.tensor([1, 2]))], [(0, (2,))], alone)
    [tensor([1, 2])]
    """
    me = group.position
    sends = [(group._check(int(p), "position"), t) for p, t in sends]
    recvs = [(group._check(int(p), "position"), tuple(int(d) for d in s)) for p, s in recvs]
    if dtype is None or device is None:
        if not sends:
            if recvs and dtype is None:
                raise RuntimeShellError("exchange: a rank that only receives must pass dtype=")
            device = device or "cpu"
        else:
            dtype = dtype or sends[0][1].dtype
            device = device or sends[0][1].device
    out = [torch.empty(shape, dtype=dtype, device=device) for _, shape in recvs]
    local = [t for p, t in sends if p == me]
    local_slots = [i for i, (p, _) in enumerate(recvs) if p == me]
    if len(local) != len(local_slots):
        raise RuntimeShellError(
            f"exchange on rank {group.rank}: {len(local)} message(s) to itself but "
            f"{len(local_slots)} expected from itself",
            value=(len(local), len(local_slots)),
        )
    for t, i in zip(local, local_slots, strict=True):
        if t.numel() != out[i].numel():
            raise RuntimeShellError(
                f"exchange on rank {group.rank}: a message to itself has shape "
                f"{tuple(t.shape)}, but {tuple(out[i].shape)} is expected",
                value=tuple(t.shape),
            )
        out[i].copy_(t.reshape(out[i].shape))
    ops: list[dist.P2POp] = []
    sent: dict[int, int] = {}
    for p, t in sends:
        if p == me or t.numel() == 0:
            continue
        tag = sent[p] = sent.get(p, -1) + 1
        ops.append(
            dist.P2POp(
                dist.isend, t.contiguous(), group=group.pg, group_peer=group.group_rank(p), tag=tag
            )
        )
    received: dict[int, int] = {}
    for (p, _), buf in zip(recvs, out, strict=True):
        if p == me or buf.numel() == 0:
            continue
        tag = received[p] = received.get(p, -1) + 1
        ops.append(
            dist.P2POp(dist.irecv, buf, group=group.pg, group_peer=group.group_rank(p), tag=tag)
        )
    # A rank with nothing to send or receive skips batch_isend_irecv. NCCL allows that
    # only once the group has run a collective of all its members (its first one sets up
    # the communicator): ProcessGroups runs one when it creates an NCCL group (warm_up).
    if ops:
        if torch.compiler.is_compiling():
            with guard("exchange", group):
                for work in dist.batch_isend_irecv(ops):
                    work.wait(datetime.timedelta(seconds=group.timeout))
            return out
        # gloo fails a point-to-point op whose wait times out (it cannot be waited for
        # in slices, as collectives are): wait once, with the group's timeout
        check("exchange", group)
        with fail_stop(), guard("exchange", group):
            for work in dist.batch_isend_irecv(ops):
                work.wait(datetime.timedelta(seconds=group.timeout))
    return out


def permute(
    tensor: torch.Tensor,
    group: Group,
    *,
    dst: int | None,
    src: int | None,
    recv_shape: Sequence[int] | None = None,
) -> torch.Tensor | None:
    """Send ``tensor`` to position ``dst`` and receive one from position ``src``.

    ``recv_shape`` defaults to ``tensor``'s shape; ``dst``/``src`` may be None (send or
    receive nothing; then the result is None when nothing is received).

    >>> from meshplan.runtime._group import Group
    >>> alone = Group("d0", ranks=(0,), pg_ranks=(0,), rank=0, pg=None)
    >>> permute(torch.tensor([7]), alone, dst=0, src=0)
    tensor([7])
    """
    sends = [] if dst is None else [(dst, tensor)]
    recvs = (
        [] if src is None else [(src, tuple(tensor.shape) if recv_shape is None else recv_shape)]
    )
    out = exchange(sends, recvs, group, dtype=tensor.dtype, device=tensor.device)
    return out[0] if out else None

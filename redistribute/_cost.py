"""The cost model: alpha-beta prices for collectives per mesh dim, plus local compute.

One pricing function (:func:`_price`) serves the planner, :func:`step_cost`,
:func:`cost`, ``explain()`` and strategy selection, so estimates agree everywhere.

Model (per step over the mesh dims ``G``; ``n`` ranks in the group, ``b_in``/``b_out``
the padded local bytes before/after — the largest rank's, as collectives pad to it):

===============  ==========================================  ===========================
collective       bytes received per rank                     time
===============  ==========================================  ===========================
local (None)     0                                           launch_local + b_out/copy
all_gather       (n-1) * b_in                                launch + a*L + recv/bw
reduce_scatter   (n-1) * b_out                               ... + recv/reduce
all_reduce       2 (n-1)/n * b_in                            launch + 2a*L + recv/bw + ...
all_to_all,      (k-1)/k * b_out (k: ranks that send, i.e.   launch + a*ceil(log2 k)
all_permute      the dims sharded in the source)             + recv/bw + b_out/copy
===============  ==========================================  ===========================

``L = ceil(log2 n)`` (latency of a tree / recursive-doubling schedule; bandwidth terms of
a ring). ``a``/``bw`` are the latency and bandwidth of the group's link: the slowest of
its mesh dims (a dim spanning nodes is inter-node), on the collective's own links when
the profile has them (``HardwareProfile.per_collective``, what ``calibrate`` fits). On a
profile with ``reduce_scatter_via_all_reduce`` (gloo) a reduce_scatter is priced as the
all_reduce of its input plus a copy of its output. No torch here.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence

import attrs

from meshplan.errors import PlanError
from meshplan.layout import FrozenMap, Mesh
from meshplan.layout._axis import complement
from meshplan.placement import Spec, StridedShard, dtype_itemsize, is_shard_like
from meshplan.placement._local import chunk_lengths

__all__ = [
    "Link",
    "HardwareProfile",
    "COLLECTIVES",
    "CostModel",
    "Cost",
    "cost",
    "step_cost",
    "transition_cost",
    "padded_local_bytes",
    "chain_extent",
]


def _number(value):
    """A finite float of ``value`` (for the profiles' numeric fields), or a PlanError naming
    it (text, a bool, nan, an infinity or a number beyond a float's range)."""
    if isinstance(value, bool | str | bytes):
        raise PlanError(f"expected a number, got {value!r}", value=value)
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        raise PlanError(f"expected a finite number, got {value!r}", value=value) from None
    if not math.isfinite(out):
        raise PlanError(f"expected a finite number, got {value!r}", value=value)
    return out


def _positive(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise PlanError(
            f"{type(instance).__name__}.{attribute.name} must be a number > 0, got {value!r}",
            value=value,
        )


def _boolean(instance, attribute, value) -> None:
    if not isinstance(value, bool):
        raise PlanError(
            f"{type(instance).__name__}.{attribute.name} must be True or False, got {value!r}",
            value=value,
        )


def _non_negative(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise PlanError(
            f"{type(instance).__name__}.{attribute.name} must be a number >= 0, got {value!r}",
            value=value,
        )


@attrs.frozen(cache_hash=True)
class Link:
    """The alpha-beta parameters of one kind of connection: latency (s) and bandwidth (B/s).

    >>> Link(2e-6, 100e9).seconds(1e9)
    0.010002
    """

    latency_s: float = attrs.field(validator=_non_negative, converter=_number)
    bytes_per_s: float = attrs.field(validator=_positive, converter=_number)

    def seconds(self, nbytes: float) -> float:
        """Time to send ``nbytes`` over one hop."""
        return self.latency_s + nbytes / self.bytes_per_s


def _links(value) -> tuple[Link, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not hasattr(value, "__iter__"):
        raise PlanError(
            f"per-dim links are a sequence of Link or (latency_s, bytes_per_s), got {value!r}",
            value=value,
        )
    out = []
    try:
        value = tuple(value)
    except TypeError:  # a 0-d tensor or array
        raise PlanError(
            f"per-dim links are a sequence of Link or (latency_s, bytes_per_s), got {value!r:.80}",
            value=value,
        ) from None
    for v in value:
        if not isinstance(v, Link):
            try:
                latency, bandwidth = v
            except (TypeError, ValueError):
                raise PlanError(
                    f"a per-dim link is a Link or (latency_s, bytes_per_s), got {v!r}", value=v
                ) from None
            v = Link(latency, bandwidth)
        out.append(v)
    return tuple(out)


_FORMAT = "meshplan_hardware_profile"  # the marker (and format version) of to_json's text


def _is_pair(value) -> bool:
    """Whether ``value`` is one ``[latency_s, bytes_per_s]`` (not a list of them)."""
    return (
        isinstance(value, list | tuple)
        and len(value) == 2
        and not any(isinstance(v, list | tuple) for v in value)
    )


def _link_of(value, name: str) -> Link:
    if isinstance(value, Link):
        return value
    if not _is_pair(value):
        raise PlanError(
            f"hardware profile field {name} must be a Link or [latency_s, bytes_per_s], got "
            f"{value!r}",
            value=value,
        )
    return Link(*value)


COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "all_permute")
"""The collectives a plan's steps run (``HardwareProfile.per_collective``'s keys)."""


def _per_collective(value) -> FrozenMap:
    """``value`` as a FrozenMap of collective -> a Link (every mesh dim) or per-dim Links."""
    if value is None:
        return FrozenMap()
    if not isinstance(value, Mapping):
        raise PlanError(
            "per_collective maps a collective name to a Link or to per-dim links, got "
            f"{value!r}; e.g. {{'all_reduce': Link(2e-5, 1e9)}}",
            value=value,
        )
    out = {}
    for kind, links in value.items():
        if kind not in COLLECTIVES:
            raise PlanError(
                f"per_collective has links for {kind!r}, which is not a collective a plan "
                f"runs; the keys are {', '.join(COLLECTIVES)}",
                value=kind,
            )
        given = links
        if not isinstance(links, Link):
            iterable = not isinstance(links, str) and hasattr(links, "__iter__")
            links = _links(links) if iterable else None
            if not links:
                raise PlanError(
                    f"per_collective[{kind!r}] needs a Link or one link per mesh dim, got "
                    f"{given!r}",
                    value=given,
                )
        out[kind] = links
    return FrozenMap(out)


FLATTENED = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
"""The collectives a step merged onto a flattened alias runs (``HardwareProfile.flattened``'s
links are theirs; an all_permute spans whichever mesh dims it moves)."""


def _flattened(value) -> FrozenMap:
    """``value`` as a FrozenMap of mesh dims (a sorted tuple of two or more) -> a FrozenMap
    of collective -> Link; a Link alone (or ``(latency_s, bytes_per_s)``) serves each of
    :data:`FLATTENED`."""
    if value is None:
        return FrozenMap()
    if not isinstance(value, Mapping):
        raise PlanError(
            "flattened maps a tuple of mesh dims to a Link or to {collective: Link}, got "
            f"{value!r}; e.g. {{(0, 2): {{'all_gather': Link(2e-5, 1e9)}}}}",
            value=value,
        )
    out = {}
    for key, links in value.items():
        dims = key
        if isinstance(key, str):  # as to_json writes it: "0,2"
            try:
                dims = tuple(int(x) for x in key.split(","))
            except ValueError:
                dims = None
        ok = (
            isinstance(dims, tuple | list)
            and len(dims) >= 2
            and all(isinstance(m, int) and not isinstance(m, bool) and m >= 0 for m in dims)
            and len(set(dims)) == len(dims)
        )
        if not ok:
            raise PlanError(
                f"flattened links are keyed by two or more distinct mesh dims (ints), got {key!r}",
                value=key,
            )
        dims = tuple(sorted(dims))
        if dims in out:
            raise PlanError(f"flattened has links for mesh dims {dims} twice", value=key)
        if isinstance(links, Link) or _is_pair(links):
            links = dict.fromkeys(FLATTENED, _link_of(links, f"flattened[{key!r}]"))
        if not isinstance(links, Mapping) or not links:
            raise PlanError(
                f"flattened[{key!r}] needs a Link or {{collective: Link}}, got {links!r}",
                value=links,
            )
        kinds = {}
        for kind, link in links.items():
            if kind not in FLATTENED:
                raise PlanError(
                    f"flattened[{key!r}] has links for {kind!r}; a merged step runs one of "
                    f"{', '.join(FLATTENED)} (an all_permute's links go in per_collective)",
                    value=kind,
                )
            kinds[kind] = _link_of(link, f"flattened[{key!r}][{kind!r}]")
        out[dims] = FrozenMap(kinds)
    return FrozenMap(out)


@attrs.frozen(cache_hash=True)
class HardwareProfile:
    """Measured or assumed hardware numbers the cost model prices steps with.

    Either per-node links (``intra`` within a node of ``ranks_per_node`` consecutive
    global ranks, ``inter`` across nodes; ``ranks_per_node=None`` means one node), or
    explicit per-mesh-dim links ``dims`` (they win when given). ``per_collective`` gives a
    collective kind links of its own, one Link for every mesh dim or one per dim (what
    ``calibrate`` measures: a backend's all_reduce or all_to_all need not move bytes as
    fast as its all_gather); a kind it leaves out takes the links above, and an
    ``all_permute`` without its own takes the ``all_to_all``'s. ``flattened`` gives the
    group of several mesh dims (a flattened alias's, keyed by the sorted tuple of its
    dims) links of its own per collective, for the steps merged onto it; without them a
    merged step runs on the slowest of its dims' links. Plus per-kernel launch
    overheads and local memory / reduction throughput, and
    ``reduce_scatter_via_all_reduce``: the backend runs a reduce_scatter as an all_reduce
    of its whole input, then keeps its own chunk (gloo does, in torch 2.13), so it costs
    that much. :meth:`to_json` / :meth:`from_json` save and load a profile.

    >>> hw = HardwareProfile.nvlink_ib(gpus_per_node=8)
    >>> hw.ranks_per_node, hw.inter.bytes_per_s < hw.intra.bytes_per_s
    (8, True)
    >>> HardwareProfile.from_dims([(1e-6, 100e9), (5e-6, 20e9)]).dims[1]
    Link(latency_s=5e-06, bytes_per_s=20000000000.0)
    >>> HardwareProfile(per_collective={"all_reduce": Link(2e-5, 1e9)}).per_collective
    FrozenMap({'all_reduce': Link(latency_s=2e-05, bytes_per_s=1000000000.0)})
    """

    intra: Link = attrs.field(
        default=Link(1e-6, 150e9), converter=functools.partial(_link_of, name="intra")
    )
    inter: Link = attrs.field(
        default=Link(5e-6, 25e9), converter=functools.partial(_link_of, name="inter")
    )
    ranks_per_node: int | None = None
    dims: tuple[Link, ...] | None = attrs.field(default=None, converter=_links)
    launch_s: float = attrs.field(default=8e-6, validator=_non_negative, converter=_number)
    local_launch_s: float = attrs.field(default=2e-6, validator=_non_negative, converter=_number)
    copy_bytes_per_s: float = attrs.field(default=1e12, validator=_positive, converter=_number)
    reduce_bytes_per_s: float = attrs.field(default=5e11, validator=_positive, converter=_number)
    reduce_scatter_via_all_reduce: bool = attrs.field(default=False, validator=_boolean)
    per_collective: FrozenMap = attrs.field(factory=FrozenMap, converter=_per_collective)
    flattened: FrozenMap = attrs.field(factory=FrozenMap, converter=_flattened)

    def __attrs_post_init__(self) -> None:
        rpn = self.ranks_per_node
        if rpn is not None and (isinstance(rpn, bool) or not isinstance(rpn, int) or rpn < 1):
            raise PlanError(f"ranks_per_node must be an int >= 1 or None, got {rpn!r}", value=rpn)

    @classmethod
    def nvlink_ib(cls, gpus_per_node: int = 8) -> HardwareProfile:
        """GPU nodes: NVLink within a node of ``gpus_per_node`` ranks, InfiniBand across."""
        return cls(
            intra=Link(1e-6, 150e9),
            inter=Link(5e-6, 25e9),
            ranks_per_node=gpus_per_node,
            launch_s=8e-6,
            local_launch_s=2e-6,
            copy_bytes_per_s=1.5e12,
            reduce_bytes_per_s=7e11,
        )

    @classmethod
    def gloo_cpu(cls) -> HardwareProfile:
        """CPU processes on one host talking through gloo (loopback TCP)."""
        return cls(
            intra=Link(40e-6, 3e9),
            inter=Link(100e-6, 1e9),
            ranks_per_node=None,
            launch_s=60e-6,
            local_launch_s=5e-6,
            copy_bytes_per_s=8e9,
            reduce_bytes_per_s=4e9,
            reduce_scatter_via_all_reduce=True,
        )

    @classmethod
    def from_dims(cls, links: Sequence[tuple[float, float] | Link], **kwargs) -> HardwareProfile:
        """A profile with one measured ``(latency_s, bytes_per_s)`` per mesh dim."""
        links = _links(links)
        if not links:
            raise PlanError(
                "from_dims needs one (latency_s, bytes_per_s) per mesh dim", value=links
            )
        return cls(dims=links, **kwargs)

    def to_json(self) -> str:
        """The profile as JSON text, which :meth:`from_json` reads back to an equal
        profile: measure once with ``calibrate``, plan with it anywhere (also
        ``meshplan plan --profile FILE``). A Link is ``[latency_s, bytes_per_s]``.

        >>> slow = {"all_reduce": Link(2e-6, 5e10)}
        >>> hw = HardwareProfile.from_dims([(1e-6, 1e11)], per_collective=slow)
        >>> HardwareProfile.from_json(hw.to_json()) == hw
        True
        """

        def link(x: Link) -> list[float]:
            return [x.latency_s, x.bytes_per_s]

        def links(x):
            return link(x) if isinstance(x, Link) else [link(v) for v in x]

        data = {_FORMAT: 1}
        for field in attrs.fields(HardwareProfile):
            value = getattr(self, field.name)
            if field.name == "per_collective":
                value = {kind: links(v) for kind, v in value.items()}
            elif field.name == "flattened":
                value = {
                    ",".join(map(str, dims)): {kind: link(x) for kind, x in v.items()}
                    for dims, v in value.items()
                }
            elif isinstance(value, Link) or (field.name == "dims" and value is not None):
                value = links(value)
            data[field.name] = value
        # one field per line, each link on one line
        lines = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in data.items()]
        return "{\n" + ",\n".join(lines) + "\n}\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> HardwareProfile:
        """The profile :meth:`to_json` wrote (fields left out take their defaults); a
        :class:`~meshplan.errors.PlanError` names what is wrong with any other text."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as e:  # UnicodeDecodeError too
            raise PlanError(
                f"a hardware profile is JSON text (UTF-8), got {str(text)[:60]!r}: {e}"
            ) from None
        except RecursionError:
            raise PlanError(
                f"a hardware profile is a flat JSON object, got text nesting too deeply: "
                f"{str(text)[:60]!r}",
                value=str(text)[:60],
            ) from None
        if not isinstance(data, dict) or data.get(_FORMAT) != 1:
            raise PlanError(
                f"not a hardware profile of HardwareProfile.to_json (no {_FORMAT!r}: 1): "
                f"{str(data)[:80]}",
                value=data,
            )
        names = {f.name for f in attrs.fields(HardwareProfile)}
        unknown = sorted(set(data) - names - {_FORMAT})
        if unknown:
            raise PlanError(
                f"hardware profile has unknown fields {unknown}; the fields are "
                f"{', '.join(sorted(names))}",
                value=unknown,
            )
        kwargs = {k: v for k, v in data.items() if k != _FORMAT}
        for name in ("intra", "inter"):
            if name in kwargs:
                kwargs[name] = _link_of(kwargs[name], name)
        pc = kwargs.get("per_collective")
        if isinstance(pc, dict):
            kwargs["per_collective"] = {
                kind: Link(*v) if _is_pair(v) else v for kind, v in pc.items()
            }
        return cls(**kwargs)


@attrs.frozen(cache_hash=True)
class CostModel:
    """Prices steps and plans on a :class:`HardwareProfile` (see the module docs).

    >>> CostModel.default().profile == HardwareProfile.nvlink_ib()
    True
    >>> CostModel(HardwareProfile.gloo_cpu()).profile.launch_s
    6e-05
    """

    profile: HardwareProfile = attrs.field(factory=HardwareProfile.nvlink_ib)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.profile, HardwareProfile):
            raise PlanError(
                f"CostModel needs a HardwareProfile, got {self.profile!r}; e.g. "
                "CostModel(HardwareProfile.nvlink_ib())",
                value=self.profile,
            )

    @classmethod
    def default(cls) -> CostModel:
        """The model ``plan()`` uses when given none: :meth:`HardwareProfile.nvlink_ib`."""
        return _DEFAULT

    @classmethod
    def from_profile(cls, profile: HardwareProfile) -> CostModel:
        return cls(profile)


_DEFAULT = CostModel()


def as_model(value) -> CostModel:
    """``value`` as a cost model: None is the default; anything but a CostModel raises
    :class:`PlanError` (a bare HardwareProfile is named, with the fix)."""
    if value is None:
        return _DEFAULT
    if isinstance(value, CostModel):
        return value
    hint = " wrap it: CostModel(profile)" if isinstance(value, HardwareProfile) else ""
    raise PlanError(
        f"cost_model must be a CostModel, got {value!r};{hint or ' see CostModel'}", value=value
    )


@attrs.frozen
class Cost:
    """A price: seconds of communication and of local compute, their sum, and bytes received.

    ``bytes`` counts what the busiest rank receives (padded), summed over steps.

    >>> Cost(1.0, 0.5, 10) + Cost(2.0, 0.0, 5)
    Cost(comm=3.0, compute=0.5, bytes=15, total=3.5)
    """

    comm: float = 0.0
    compute: float = 0.0
    bytes: int = 0
    total: float = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        for name in ("comm", "compute", "bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise PlanError(
                    f"Cost {name}={v!r:.80} is no number; a cost holds seconds and bytes",
                    value=v,
                )
        object.__setattr__(self, "total", self.comm + self.compute)

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(self.comm + other.comm, self.compute + other.compute, self.bytes + other.bytes)


# -- local sizes --------------------------------------------------------------------------


@functools.lru_cache(maxsize=65536)
def chain_extent(length: int, kinds: tuple[tuple[int, int], ...]) -> int:
    """The largest local length of a tensor dim of ``length`` sharded by a chain of mesh dims.

    ``kinds`` lists ``(mesh_dim_size, split_factor)`` in shard order (1 for ``Shard``).

    >>> chain_extent(5, ((2, 1), (2, 1))), chain_extent(8, ((2, 2),)), chain_extent(3, ())
    (2, 4, 3)
    """
    lengths = {length}
    for n, sf in kinds:
        nxt: set[int] = set()
        for L in lengths:
            if sf == 1:
                nxt.update(_chunk_lengths(L, n))
            else:
                pieces = chunk_lengths(L, sf)  # (length, count): O(1) in sf
                # a rank's length is constant between the coordinates where some piece's
                # chunks turn short or empty: those (and 0) give every value, O(1) in n
                for c in _chunk_breaks(pieces, n):
                    nxt.add(sum(k * _chunk_length(p, n, c) for p, k in pieces))
        lengths = nxt
    return max(lengths)


def _chunk_length(length: int, parts: int, index: int) -> int:
    size = -(-length // parts)
    start = min(size * index, length)
    return min(start + size, length) - start


def _chunk_lengths(length: int, parts: int) -> tuple[int, ...]:
    """The distinct chunk lengths of ``length`` in ``parts``, in O(1)."""
    return tuple(n for n, _ in chunk_lengths(length, parts))


def _chunk_breaks(pieces, parts: int) -> set[int]:
    """Coordinates (below ``parts``) where the chunk length of some piece changes, and 0."""
    out = {0}
    for p, _ in pieces:
        size = -(-p // parts)
        full = p // size if size else 0
        out.update(c for c in (full, full + 1) if c < parts)
    return out


def _kinds(spec: Spec, tensor_dim: int) -> tuple[tuple[int, int], ...]:
    sizes = spec.mesh.shape
    out = []
    for m in spec.order(tensor_dim):
        p = spec.placements[m]
        out.append((sizes[m], p.split_factor if isinstance(p, StridedShard) else 1))
    return tuple(out)


@functools.lru_cache(maxsize=16384)
def padded_local_bytes(spec: Spec) -> int:
    """Bytes of the largest local tensor of ``spec`` (per dim the longest shard).

    >>> from meshplan.placement import Shard
    >>> padded_local_bytes(Spec(Mesh.create(4), [Shard(0)], (5, 3)))  # 2 rows x 3 x 4 B
    24
    """
    n = dtype_itemsize(spec.dtype)
    for d, length in enumerate(spec.shape):
        n *= chain_extent(length, _kinds(spec, d))
    return n


# -- links ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _spans_nodes(mesh: Mesh, dims: tuple[int, ...], ranks_per_node: int) -> bool:
    """Whether some group of ``mesh`` along ``dims`` holds ranks of two nodes (node:
    ``rank // ranks_per_node``). A rank map that is a range is decided from the layout in
    time independent of the number of ranks (see :func:`_range_spans_nodes`); any other
    rank map lists its groups."""
    ranks = mesh.ranks
    if isinstance(ranks, range) and len(ranks) > ranks_per_node:
        return _range_spans_nodes(mesh, dims, ranks_per_node)
    for group in mesh.groups(dims):
        node = group[0] // ranks_per_node
        if any(r // ranks_per_node != node for r in group):
            return True
    return False


def _range_spans_nodes(mesh: Mesh, dims: tuple[int, ...], r: int) -> bool:
    """:func:`_spans_nodes` for a rank map ``range(s, ..., k)``.

    A group is ``s + (b + o) * k`` for its base ``b`` (an offset of the complement of the
    group's layout) and every offset ``o`` of the group's layout, ``0 <= o <= M``. Ranks
    are monotone in ``o``, so the group spans nodes when its lowest rank ``lo`` has
    ``lo % r + M * |k| >= r``. Only ``lo % r`` matters: the residues of every base are
    built mode by mode of the complement, a set of at most ``r`` values.
    """
    ranks = mesh.ranks
    modes = [mode for m in dims for mode in mesh.axis(m).modes]
    extent = sum((n - 1) * d for n, d in modes) * abs(ranks.step)
    if extent >= r:
        return True
    if extent == 0:
        return False
    low = ranks.start - extent if ranks.step < 0 else ranks.start  # base 0's lowest rank
    residues = {low % r}
    for n, d in complement(modes, len(ranks)).modes:
        step = (d * ranks.step) % r
        residues = {(x + c * step) % r for x in residues for c in range(min(n, r))}
        if len(residues) == r:
            break
    return max(residues) + extent >= r


def group_link(
    model: CostModel, mesh: Mesh, dims: tuple[int, ...], collective: str | None = None
) -> Link:
    """The link a group over ``dims`` communicates on: the slowest of its dims' links (for
    ``collective``, its own links when the profile has them), or for a merged step the
    links the profile gives the group of those dims (``HardwareProfile.flattened``)."""
    hw = model.profile
    if hw.flattened:
        _check_flattened(hw, mesh)
        if len(dims) > 1 and collective in FLATTENED:
            links = hw.flattened.get(tuple(sorted(dims)))
            if links is not None and collective in links:
                return links[collective]
    own = hw.per_collective.get(collective) if hw.per_collective else None
    if own is None and collective == "all_permute" and hw.per_collective:
        own = hw.per_collective.get("all_to_all")
    if isinstance(own, Link):
        return own
    if own is not None:
        return _slowest(own, mesh, dims, f"per_collective[{collective!r}]", hw)
    if hw.dims is not None:
        return _slowest(hw.dims, mesh, dims, "dims", hw)
    if hw.ranks_per_node is not None and _spans_nodes(mesh, tuple(dims), hw.ranks_per_node):
        return hw.inter
    return hw.intra


@functools.lru_cache(maxsize=256)
def _check_flattened(hw: HardwareProfile, mesh: Mesh) -> None:
    for dims in hw.flattened:
        if dims[-1] >= mesh.ndim:
            raise PlanError(
                f"hardware profile has flattened links for mesh dims {dims}, but mesh {mesh} "
                f"has {mesh.ndim} dims; calibrate it on this mesh",
                value=hw,
            )


def _slowest(links: tuple[Link, ...], mesh: Mesh, dims, what: str, hw) -> Link:
    if len(links) != mesh.ndim:
        raise PlanError(
            f"hardware profile has {what} links for {len(links)} mesh dims, but mesh "
            f"{mesh} has {mesh.ndim}; calibrate it on this mesh",
            value=hw,
        )
    chosen = [links[m] for m in dims]
    return Link(max(x.latency_s for x in chosen), min(x.bytes_per_s for x in chosen))


# -- the one pricing function ---------------------------------------------------------------


@functools.lru_cache(maxsize=16384)
def coefficients(
    model: CostModel, mesh: Mesh, dims: tuple[int, ...], collective: str | None, n_send: int
) -> tuple[float, float, float, float, float, float, float]:
    """Linear coefficients of a step's price in its padded local bytes ``b_in``, ``b_out``.

    Returns ``(comm0, comm_in, comm_out, comp0, comp_in, comp_out, recv)``: comm =
    comm0 + comm_in*b_in + comm_out*b_out, compute likewise, and bytes received =
    recv * b_in for all_gather/all_reduce, recv * b_out otherwise.

    >>> coefficients(CostModel(), Mesh.create(2), (0,), None, 1)[:3]
    (0.0, 0.0, 0.0)
    """
    hw = model.profile
    if collective is None:
        return (0.0, 0.0, 0.0, hw.local_launch_s, 0.0, 1.0 / hw.copy_bytes_per_s, 0.0)
    link = group_link(model, mesh, dims, collective)
    n = math.prod(mesh.shape[m] for m in dims)
    hops, y_in, y_out, comp_in, comp_out, recv = link_terms(hw, collective, n, n_send)
    bw = link.bytes_per_s
    comm0 = hw.launch_s + link.latency_s * hops
    return (comm0, y_in / bw, y_out / bw, 0.0, comp_in, comp_out, recv)


def link_terms(
    hw: HardwareProfile, collective: str, n: int, n_send: int
) -> tuple[int, float, float, float, float, float]:
    """The shape of a collective's price over a group of ``n`` ranks (``n_send`` of them
    sending), whatever its link: ``(hops, y_in, y_out, comp_in, comp_out, recv)``. It
    costs ``launch_s + latency * hops + (y_in * b_in + y_out * b_out) / bandwidth`` of
    communication and ``comp_in * b_in + comp_out * b_out`` of compute, and the busiest
    rank receives ``recv`` times its ``b_in`` (all_gather, all_reduce) or ``b_out``.
    ``calibrate`` fits each collective's link to its timings through this shape.

    >>> link_terms(HardwareProfile(), "all_gather", 4, 4)
    (2, 3.0, 0.0, 0.0, 0.0, 3.0)
    """
    steps = math.ceil(math.log2(n)) if n > 1 else 0
    if collective == "all_gather":
        k = n_send
        return (steps, float(k - 1), 0.0, 0.0, 0.0, float(k - 1))
    if collective == "reduce_scatter" and hw.reduce_scatter_via_all_reduce:
        # an all_reduce of the input (n times the output), then a copy of the own chunk
        f = (n - 1) / n
        copy = 1.0 / hw.copy_bytes_per_s
        return (2 * steps, 2 * f, 0.0, f / hw.reduce_bytes_per_s, copy, 2.0 * (n - 1))
    if collective == "reduce_scatter":
        red = (n - 1) / hw.reduce_bytes_per_s
        return (steps, 0.0, float(n - 1), 0.0, red, float(n - 1))
    if collective == "all_reduce":
        f = (n - 1) / n
        return (2 * steps, 2 * f, 0.0, f / hw.reduce_bytes_per_s, 0.0, 2 * f)
    if collective in ("all_to_all", "all_permute"):
        k = n_send
        f = (k - 1) / k
        ksteps = math.ceil(math.log2(k)) if k > 1 else 0
        return (ksteps, 0.0, f, 0.0, 1.0 / hw.copy_bytes_per_s, f)
    raise PlanError(f"cannot price collective {collective!r}", value=collective)


OBJECTIVES = ("time", "collectives")
"""What ``plan()`` minimizes: modeled time, or the number of collectives first (then time)."""


@functools.lru_cache(maxsize=1024)
def collective_weight(model: CostModel, mesh: Mesh, nbytes: int) -> float:
    """The price the ``"collectives"`` objective adds per collective, for a tensor of
    ``nbytes`` on ``mesh``: more than a plan of a few times as many steps as the mesh has
    dims, each as dear as the dearest step there is, can take, so a plan with fewer
    collectives always ranks first and time only breaks ties between equal counts.

    >>> m = Mesh.create((2, 4))
    >>> collective_weight(CostModel(), m, 1 << 20) > 0.001  # s; one step costs ~20 us
    True
    """
    n = math.prod(mesh.shape)
    dims = tuple(range(mesh.ndim))
    worst = 0.0
    for kind in (None, *COLLECTIVES):  # (each on its own links, when the profile has them)
        c = coefficients(model, mesh, dims, kind, n)
        worst = max(worst, c[0] + c[3] + (c[1] + c[4] + c[2] + c[5]) * nbytes)
    return 8.0 * (mesh.ndim + 2) * worst


def _price(
    model: CostModel,
    mesh: Mesh,
    dims: tuple[int, ...],
    collective: str | None,
    b_in: int,
    b_out: int,
    n_send: int,
    scaled: bool = False,
) -> Cost:
    """The price of a step from its padded local bytes (``scaled``: divides by avg_scale)."""
    c = coefficients(model, mesh, dims, collective, n_send)
    comm = c[0] + c[1] * b_in + c[2] * b_out
    compute = c[3] + c[4] * b_in + c[5] * b_out
    if scaled:
        compute += b_out / model.profile.copy_bytes_per_s
    recv = c[6] * (b_in if collective in ("all_gather", "all_reduce") else b_out)
    return Cost(comm, compute, int(round(recv)))


def _n_send(src: Spec, dims: tuple[int, ...]) -> int:
    sizes = src.mesh.shape
    return math.prod(sizes[m] for m in dims if is_shard_like(src.placements[m])) or 1


def transition_cost(
    src: Spec,
    dst: Spec,
    mesh_dims: Sequence[int] | int,
    collective: str | None,
    model: CostModel | None = None,
) -> Cost:
    """The price of one step from ``src`` to ``dst`` over ``mesh_dims`` (no Step needed).

    >>> from meshplan.placement import Replicate, Shard
    >>> mesh = Mesh.create(4)
    >>> a = Spec(mesh, [Shard(0)], (1024, 1024))
    >>> b = Spec(mesh, [Replicate()], (1024, 1024))
    >>> c = transition_cost(a, b, 0, "all_gather")
    >>> c.bytes, c.comm > 0, c.compute
    (3145728, True, 0.0)
    """
    from ._step import Step

    step = Step(mesh_dims, src, dst, collective)  # checks the arguments
    return _step_price(step.src, step.dst, step.mesh_dims, step.collective, as_model(model))


def _step_price(src: Spec, dst: Spec, dims: tuple[int, ...], collective, model) -> Cost:
    scaled = collective in ("all_reduce", "reduce_scatter") and any(
        getattr(src.placements[m], "op", None) == "avg" for m in dims
    )
    return _price(
        model,
        src.mesh,
        dims,
        collective,
        padded_local_bytes(src),
        padded_local_bytes(dst),
        _n_send(src, dims),
        scaled,
    )


def step_cost(step, model: CostModel | None = None) -> Cost:
    """The price of one :class:`~meshplan.redistribute.Step`.

    >>> from meshplan.placement import Partial, Replicate
    >>> from meshplan.redistribute import Step
    >>> mesh = Mesh.create(2)
    >>> a, b = Spec(mesh, [Replicate()], (4,)), Spec(mesh, [Partial()], (4,))
    >>> step_cost(Step(0, a, b, None)).compute > 0   # Replicate -> Partial is not free
    True
    """
    from ._step import Step

    if not isinstance(step, Step):
        raise PlanError(f"step_cost needs a Step, got {step!r}", value=step)
    return _step_price(step.src, step.dst, step.mesh_dims, step.collective, as_model(model))


def cost(plan, model: CostModel | None = None) -> Cost:
    """The price of a plan: the sum of its steps' prices.

    >>> from meshplan.placement import Replicate, Shard
    >>> from meshplan.redistribute import plan as make_plan
    >>> mesh = Mesh.create(2)
    >>> p = make_plan(Spec(mesh, [Shard(0)], (8,)), Spec(mesh, [Replicate()], (8,)))
    >>> cost(p).bytes
    16
    """
    from ._step import as_plan

    return _plan_cost(as_plan(plan, "cost"), as_model(model))


@functools.lru_cache(maxsize=4096)
def _plan_cost(plan, model: CostModel) -> Cost:
    # (plans and models are frozen values: a plan's price is kept as long as the plan
    # cache keeps plans, so the memo holds no more plans than that cache does)
    total = Cost()
    for step in plan.steps:
        total = total + _step_price(step.src, step.dst, step.mesh_dims, step.collective, model)
    return total

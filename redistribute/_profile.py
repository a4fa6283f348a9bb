"""Hardware profiles and the cost model: the alpha-beta numbers a step is priced with.

A :class:`Link` is one kind of connection (latency, bandwidth); a :class:`HardwareProfile`
holds the links of a machine (per node, per mesh dim, per collective, per flattened group)
and its local throughputs, with presets and a JSON form; a :class:`CostModel` prices steps
and plans on one profile (``meshplan.redistribute._step_cost`` has the formulas). No torch
here.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence

import attrs

from meshplan.errors import PlanError
from meshplan.layout import FrozenMap

from ._collectives import COLLECTIVES, MERGEABLE

__all__ = [
    "MAX_SECONDS",
    "MIN_BYTES_PER_S",
    "Link",
    "HardwareProfile",
    "COLLECTIVES",
    "FLATTENED",
    "CostModel",
    "as_model",
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


MAX_SECONDS = 1e6
"""The longest latency or launch time a profile accepts (11.6 days): with longer ones the
sum of a plan's step prices can overflow to inf, and every plan would cost the same."""

MIN_BYTES_PER_S = 1.0
"""The lowest throughput (bytes/s) a profile accepts: a lower one makes a byte's price (its
inverse) overflow, and every plan would cost the same."""


def _rate(instance, attribute, value) -> None:
    """A throughput in bytes/s: at least :data:`MIN_BYTES_PER_S`."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise PlanError(
            f"{type(instance).__name__}.{attribute.name} must be a number > 0, got {value!r}",
            value=value,
        )
    if value < MIN_BYTES_PER_S:
        raise PlanError(
            f"{type(instance).__name__}.{attribute.name} is {value!r} bytes/s, below the "
            f"{MIN_BYTES_PER_S:g} a profile accepts (prices of bytes at that rate overflow to "
            "inf and plans could no longer be ranked); give the throughput in bytes per second",
            value=value,
        )


def _boolean(instance, attribute, value) -> None:
    if not isinstance(value, bool):
        raise PlanError(
            f"{type(instance).__name__}.{attribute.name} must be True or False, got {value!r}",
            value=value,
        )


def _seconds(instance, attribute, value) -> None:
    """A time in seconds: from 0 to :data:`MAX_SECONDS`."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise PlanError(
            f"{type(instance).__name__}.{attribute.name} must be a number >= 0, got {value!r}",
            value=value,
        )
    if value > MAX_SECONDS:
        raise PlanError(
            f"{type(instance).__name__}.{attribute.name} is {value!r} s, above the "
            f"{MAX_SECONDS:g} s a profile accepts (sums of such prices overflow to inf and "
            "plans could no longer be ranked); give the time in seconds",
            value=value,
        )


@attrs.frozen(cache_hash=True)
class Link:
    """The alpha-beta parameters of one kind of connection: latency (s) and bandwidth (B/s).

    >>> Link(2e-6, 100e9).seconds(1e9)
    0.010002
    """

    latency_s: float = attrs.field(validator=_seconds, converter=_number)
    bytes_per_s: float = attrs.field(validator=_rate, converter=_number)

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
    try:
        return Link(*value)
    except PlanError as e:
        raise PlanError(f"hardware profile field {name}: {e}", value=value) from None




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


FLATTENED = MERGEABLE
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
    launch_s: float = attrs.field(default=8e-6, validator=_seconds, converter=_number)
    local_launch_s: float = attrs.field(default=2e-6, validator=_seconds, converter=_number)
    copy_bytes_per_s: float = attrs.field(default=1e12, validator=_rate, converter=_number)
    reduce_bytes_per_s: float = attrs.field(default=5e11, validator=_rate, converter=_number)
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
    """Prices steps and plans on a :class:`HardwareProfile` (the formulas:
    ``meshplan.redistribute._step_cost``).

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

"""A brute-force model of meshes: every dim and alias is an explicit list of offsets.

A dim's *pattern* lists the rank-map positions of the instance at position 0, in
coordinate order. Several dims combine by adding patterns (row-major); the
instances of a family are the translates of the combined pattern that tile the rank
map, found greedily from the smallest uncovered position. Unflattening reads the
parts off the pattern and checks them by enumeration. No layout algebra is used, so
the model is an independent oracle for ``meshplan.layout``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence


class ModelError(Exception):
    """The model refuses the operation (meshplan must raise MeshError too)."""


def as_layout(offsets: Sequence[int]) -> tuple[tuple[int, int], ...] | None:
    """The coalesced modes (slowest first) enumerating ``offsets`` in order, or None."""
    n = len(offsets)
    if n == 1:
        return () if offsets[0] == 0 else None
    d = offsets[1] - offsets[0]
    r = next((i for i in range(n) if offsets[i] != offsets[0] + i * d), n)
    if n % r or d < 0:
        return None
    for j in range(0, n, r):
        if any(offsets[j + i] != offsets[j] + i * d for i in range(r)):
            return None
    rest = as_layout(offsets[::r])
    return None if rest is None else (*rest, (r, d))


def combine(patterns: Sequence[Sequence[int]]) -> tuple[int, ...]:
    out = (0,)
    for p in patterns:
        out = tuple(a + b for a in out for b in p)
    return out


def tiling(pattern: Sequence[int], world: int) -> list[int]:
    """The bases ``b`` (ascending) with ``{b + p}`` tiling ``range(world)``; ModelError if none."""
    covered: set[int] = set()
    bases = []
    for x in range(world):
        if x in covered:
            continue
        shifted = {x + p for p in pattern}
        if len(shifted) != len(pattern) or shifted & covered or max(shifted) >= world:
            raise ModelError("does not tile")
        covered |= shifted
        bases.append(x)
    return bases


class MeshModel:
    def __init__(self, ranks, dims, aliases):
        self.ranks = tuple(ranks)
        self.dims = list(dims)  # (name, pattern)
        self.aliases = dict(aliases)  # name -> pattern

    @classmethod
    def create(cls, shape: Sequence[int], names: Sequence[str], ranks: Sequence[int]):
        strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
        dims = [
            (n, tuple(k * d for k in range(s)))
            for n, s, d in zip(names, shape, strides, strict=True)
        ]
        return cls(ranks, dims, {})

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.dims)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(p) for _, p in self.dims)

    def _pattern(self, key) -> tuple[str, tuple[int, ...]]:
        if isinstance(key, str):
            if key in self.aliases:
                return key, self.aliases[key]
            for n, p in self.dims:
                if n == key:
                    return n, p
            raise ModelError(f"unknown {key!r}")
        if not -len(self.dims) <= key < len(self.dims):
            raise ModelError(f"index {key!r}")
        return self.dims[key]

    def _chosen(self, keys) -> list[tuple[str, tuple[int, ...]]]:
        out = [self._pattern(k) for k in keys]
        names = [n for n, _ in out]
        if len(set(names)) != len(names):
            raise ModelError("duplicate")
        combined = combine([p for _, p in out])
        if len(set(combined)) != len(combined):
            raise ModelError("overlap")
        return out

    # -- queries ------------------------------------------------------------------

    def groups(self, keys=None) -> tuple[tuple[int, ...], ...]:
        keys = self.names if keys is None else keys
        pattern = combine([p for _, p in self._chosen(keys)])
        return tuple(
            tuple(self.ranks[b + p] for p in pattern) for b in tiling(pattern, len(self.ranks))
        )

    def coordinate(self, rank: int) -> tuple[int, ...] | None:
        if rank not in self.ranks:
            return None
        q = self.ranks.index(rank)
        pattern = combine([p for _, p in self.dims])
        for b in tiling(pattern, len(self.ranks)):
            if q - b in pattern:
                flat = pattern.index(q - b)
                coord = []
                for size in reversed(self.shape):
                    flat, c = divmod(flat, size)
                    coord.append(c)
                return tuple(reversed(coord))
        raise AssertionError("rank in no instance")

    def contains_alias(self, name: str, keys) -> bool:
        span = set(combine([p for _, p in self._chosen(keys)]))
        return set(self.aliases[name]) <= span

    # -- operations ---------------------------------------------------------------

    def slice(self, keys) -> MeshModel:
        chosen = self._chosen(keys)
        taken = {n for n, _ in chosen}
        span = set(combine([p for _, p in chosen]))
        aliases = {n: p for n, p in self.aliases.items() if n not in taken and set(p) <= span}
        return MeshModel(self.ranks, chosen, aliases)

    def flatten(self, keys, name: str) -> MeshModel:
        chosen = self._chosen(keys)
        pattern = combine([p for _, p in chosen])
        if name in self.names:
            if len(chosen) == 1 and chosen[0][0] == name:
                return self
            raise ModelError("alias clashes with a dim")
        if name in self.aliases:
            if self.aliases[name] == pattern:
                return self
            raise ModelError("alias exists")
        return MeshModel(self.ranks, self.dims, {**self.aliases, name: pattern})

    def unflatten(self, key, sizes: Sequence[int], names: Sequence[str]) -> MeshModel:
        if isinstance(key, str) and key not in self.names:
            raise ModelError("not a dim")
        i = self.names.index(key) if isinstance(key, str) else key % len(self.dims)
        pattern = self.dims[i][1]
        if len(sizes) != len(names) or math.prod(sizes) != len(pattern):
            raise ModelError("sizes")
        new_names = self.names[:i] + tuple(names) + self.names[i + 1 :]
        if len(set(new_names)) != len(new_names) or set(new_names) & set(self.aliases):
            raise ModelError("names")
        strides = [math.prod(sizes[j + 1 :]) for j in range(len(sizes))]
        parts = [
            tuple(pattern[d * k] for k in range(s)) for s, d in zip(sizes, strides, strict=True)
        ]
        for coord in itertools.product(*(range(s) for s in sizes)):
            index = sum(c * d for c, d in zip(coord, strides, strict=True))
            if pattern[index] != sum(p[c] for p, c in zip(parts, coord, strict=True)):
                raise ModelError("the parts do not add up to the dim")
        if any(as_layout(p) is None for p in parts):
            raise ModelError("a part is not a layout")
        dims = self.dims[:i] + list(zip(names, parts, strict=True)) + self.dims[i + 1 :]
        return MeshModel(self.ranks, dims, self.aliases)


def meshes_with_models(*, max_dims=4, max_side=4, max_aliases=2):
    """Strategy: ``(mesh, model)`` pairs built by the same steps (create, then flatten)."""
    from hypothesis import strategies as st

    from meshplan.layout import Mesh
    from meshplan.testing import mesh_dims

    @st.composite
    def build(draw):
        shape = tuple(draw(st.lists(st.integers(1, max_side), min_size=1, max_size=max_dims)))
        n = math.prod(shape)
        kind = draw(st.sampled_from(["identity", "permuted", "subset"]))
        if kind == "identity":
            ranks = list(range(n))
        elif kind == "permuted":
            ranks = draw(st.permutations(range(n)))
        else:
            pool = draw(st.integers(n, 2 * n + 8))
            ranks = draw(st.lists(st.integers(0, pool - 1), min_size=n, max_size=n, unique=True))
        names = tuple(f"d{i}" for i in range(len(shape)))
        mesh = Mesh.create(shape, names, ranks)
        model = MeshModel.create(shape, names, ranks)
        for k in range(draw(st.integers(0, max_aliases))):
            dims = draw(mesh_dims(mesh, min_size=1))
            mesh = mesh.flatten(dims, f"f{k}")
            model = model.flatten(dims, f"f{k}")
        return mesh, model

    return build()

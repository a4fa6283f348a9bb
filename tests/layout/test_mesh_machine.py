"""Chains of slice / flatten / unflatten agree with the brute-force numpy model."""

import itertools

import pytest
from _layout_model import ModelError, meshes_with_models
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from meshplan.errors import MeshError


def _divisor_chain(n):
    divisors = [d for d in range(1, n + 1) if n % d == 0]

    @st.composite
    def build(draw):
        out, rest = [], n
        for _ in range(draw(st.integers(0, 2))):
            d = draw(st.sampled_from([d for d in divisors if rest % d == 0]))
            out.append(d)
            rest //= d
        return (*out, rest)

    return build()


class MeshChains(RuleBasedStateMachine):
    """Apply the same operations to a Mesh and to the model; both agree or both refuse."""

    @initialize(pair=meshes_with_models(max_dims=3, max_aliases=1))
    def start(self, pair):
        self.mesh, self.model = pair
        self.fresh = itertools.count()

    def _apply(self, ours, theirs):
        try:
            expected = theirs()
        except ModelError:
            with pytest.raises(MeshError):
                ours()
            return
        self.mesh, self.model = ours(), expected

    def _keys(self, data, min_size=1):
        keys = self.mesh.names + tuple(self.mesh.aliases)
        return tuple(data.draw(st.lists(st.sampled_from(keys), unique=True, min_size=min_size)))

    @rule(data=st.data())
    def slice(self, data):
        keys = self._keys(data)
        self._apply(lambda: self.mesh[keys], lambda: self.model.slice(keys))

    @rule(data=st.data())
    def flatten(self, data):
        keys = self._keys(data)
        taken = self.mesh.names + tuple(self.mesh.aliases)
        name = data.draw(st.sampled_from(taken) | st.just(f"x{next(self.fresh)}"))
        self._apply(lambda: self.mesh.flatten(keys, name), lambda: self.model.flatten(keys, name))

    @precondition(lambda self: self.mesh.ndim <= 5)
    @rule(data=st.data())
    def unflatten(self, data):
        dim = data.draw(st.sampled_from(self.mesh.names))
        sizes = data.draw(_divisor_chain(self.mesh.size(dim)))
        k = next(self.fresh)
        names = tuple(f"u{k}_{i}" for i in range(len(sizes)))
        if data.draw(st.booleans()):  # sometimes clash with an existing name
            clash = data.draw(st.sampled_from(self.mesh.names + tuple(self.mesh.aliases)))
            names = (*names[:-1], clash)
        self._apply(
            lambda: self.mesh.unflatten(dim, sizes, names),
            lambda: self.model.unflatten(dim, sizes, names),
        )

    @invariant()
    def groups_agree(self):
        assert self.mesh.names == self.model.names
        assert self.mesh.shape == self.model.shape
        assert set(self.mesh.aliases) == set(self.model.aliases)
        for d in self.mesh.names + tuple(self.mesh.aliases):
            assert self.mesh.groups(d) == self.model.groups((d,))
        assert self.mesh.groups() == self.model.groups()

    @invariant()
    def coordinates_agree(self):
        for rank in tuple(self.mesh.ranks)[:: max(1, len(self.mesh.ranks) // 5)]:
            assert self.mesh.coordinate(rank) == self.model.coordinate(rank)
            group = self.mesh.group_of(rank)
            assert tuple(self.mesh.submesh(at=rank).ranks) == group


MeshChains.TestCase.settings = settings(MeshChains.TestCase.settings, stateful_step_count=12)
TestMeshChains = MeshChains.TestCase

"""meshplan.testing — hypothesis strategies for meshplan values, for your own test suites.

Strategies draw valid values (meshes, dim choices, shapes, placements, specs) and
shrink towards small, readable ones; they never touch torch.distributed.

>>> from hypothesis import given
>>> from meshplan.testing import meshes
>>> @given(meshes(max_dims=2))
... def test_groups_cover_the_mesh(mesh):
...     assert sum(map(len, mesh.groups())) == mesh.world_size
>>> test_groups_cover_the_mesh()
"""

try:
    import hypothesis  # noqa: F401
except ImportError as exc:  # hypothesis is an optional dependency of meshplan
    raise ImportError(
        "meshplan.testing provides hypothesis strategies and needs hypothesis, which is not "
        "installed; install it with: pip install 'meshplan[testing]' (or pip install hypothesis)",
        name=exc.name,
    ) from exc

from ._mesh import mesh_dims, meshes
from ._placement import placements, shapes, specs
from ._strategy import BUILTIN_OPS, OpCall, op_calls

__all__ = [
    "BUILTIN_OPS",
    "OpCall",
    "mesh_dims",
    "meshes",
    "op_calls",
    "placements",
    "shapes",
    "specs",
]

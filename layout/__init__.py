"""meshplan.layout — device meshes as CuTe-style layouts.

Decides which ranks form each mesh dim, each slice, each flattened alias and each
process group, as pure values (``Axis``, ``MeshLayout``, ``Mesh``). Never creates
process groups, never imports torch, never keeps a "current mesh".
"""

from meshplan.errors import MeshError

from ._axis import Axis, coalesce, complement, row_major_strides
from ._compose import compose
from ._frozen import FrozenMap
from ._mesh import DimKey, Mesh, flatten, unflatten
from ._mesh_layout import MeshLayout

__all__ = [
    "Axis",
    "DimKey",
    "FrozenMap",
    "Mesh",
    "MeshError",
    "MeshLayout",
    "coalesce",
    "complement",
    "compose",
    "flatten",
    "row_major_strides",
    "unflatten",
]

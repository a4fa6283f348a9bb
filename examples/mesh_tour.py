"""A tour of meshplan's mesh values: shape, groups, slices and a flattened alias.

Runs anywhere (pure Python, no processes): ``python examples/mesh_tour.py``.
"""

from meshplan.layout import Mesh

# 1. Describe the mesh: 8 ranks as (dp=2, pp=2, tp=2), rank map in row-major order.
mesh = Mesh.create((2, 2, 2), names=("dp", "pp", "tp"))
print("mesh:", mesh, "layout:", mesh.layout)

# 2. The process groups each mesh dim needs.
for name in mesh.names:
    print(f"groups along {name!r}:", mesh.groups(name))

# 3. Slice out non-adjacent dims and flatten them into an alias (pure: new value).
mesh = mesh.flatten(("dp", "tp"), "dp_tp")
print("alias dp_tp groups:", mesh["dp_tp"].groups())
print("rank 5 is at", mesh.coordinate(5), "and its dp_tp group is", mesh.group_of(5, "dp_tp"))

# 4. A permuted rank map: groups follow mesh coordinates, not rank order.
shuffled = Mesh.create((2, 4), names=("dp", "tp"), ranks=(7, 6, 5, 4, 3, 2, 1, 0))
print("permuted tp groups:", shuffled.groups("tp"))
print("unflatten tp into (2, 2):", shuffled.unflatten("tp", (2, 2), ("tp0", "tp1")).groups("tp1"))

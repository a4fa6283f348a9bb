"""Regressions: a Spec refuses shapes torch cannot hold, and unshard refuses replicas that
disagree (each found by probing the public API with hostile inputs)."""

import pytest
import torch

from meshplan.errors import PlacementError
from meshplan.layout import Mesh
from meshplan.placement import Partial, Replicate, Shard, Spec, shard, unshard


@pytest.mark.parametrize("shape", [torch.tensor(3), torch.tensor(3.5)])
def test_a_0d_tensor_as_a_shape_is_a_placement_error(shape):
    with pytest.raises(PlacementError, match="not a sequence of sizes"):
        Spec(Mesh.create(2), (Replicate(),), shape)


def test_a_1d_tensor_as_a_shape_is_still_accepted():
    assert Spec(Mesh.create(2), (Shard(0),), torch.tensor([4, 2])).shape == (4, 2)


@pytest.mark.parametrize("shape", [(2**40, 2**40), (2**32, 2**32), (2**62, 2, 1)])
def test_a_shape_whose_element_count_exceeds_int64_is_refused(shape):
    with pytest.raises(PlacementError, match="elements"):
        Spec(Mesh.create(2), (Replicate(),), shape)


def test_a_shape_of_exactly_the_largest_element_count_is_accepted():
    assert Spec(Mesh.create(2), (Replicate(),), (2**63 - 1,)).numel() == 2**63 - 1
    assert Spec(Mesh.create(2), (Replicate(),), (2**62, 2, 0)).numel() == 0


def _replicated():
    spec = Spec(Mesh.create((2, 2)), (Shard(0), Replicate()), (4, 2), "int64")
    return spec, shard(torch.arange(8).reshape(4, 2), spec)


def test_unshard_of_replicas_that_disagree_is_a_placement_error():
    spec, locals_ = _replicated()
    locals_[3] = locals_[3] + 1  # rank 3 replicates rank 2's rows, with other values
    with pytest.raises(PlacementError, match=r"rank 3.*rank 2"):
        unshard(locals_, spec)


def test_unshard_with_check_off_reads_the_first_replica():
    spec, locals_ = _replicated()
    locals_[3] = locals_[3] + 1
    got = unshard(locals_, spec, check=False)
    assert torch.equal(got, torch.arange(8).reshape(4, 2))


def test_unshard_of_agreeing_replicas_with_nans_is_accepted():
    spec = Spec(Mesh.create(2), (Replicate(),), (3,), "float32")
    t = torch.tensor([1.0, float("nan"), -0.0])
    assert torch.equal(unshard({0: t, 1: t.clone()}, spec).isnan(), t.isnan())


def test_unshard_of_partial_values_never_compares_them():
    spec = Spec(Mesh.create((2, 2)), (Partial(), Replicate()), (2,), "int64")
    locals_ = {0: torch.tensor([1, 2]), 1: torch.tensor([1, 2]), 2: torch.tensor([5, 5]),
               3: torch.tensor([5, 5])}
    assert unshard(locals_, spec).tolist() == [6, 7]
    locals_[3] = torch.tensor([4, 4])  # disagrees with rank 2 along the Replicate dim
    with pytest.raises(PlacementError):
        unshard(locals_, spec)

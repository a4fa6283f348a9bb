"""Models at real size planned from the ``meta`` device: shapes and dtypes only.

A model built under ``torch.device("meta")`` holds no values; ``plan_module`` reads
its parameters' shapes and dtypes and traces on fake tensors, so planning allocates
nothing of parameter size. The models here would take gigabytes if materialized; the
process's peak resident memory must not grow by a fraction of that.
"""

from __future__ import annotations

import resource

import pytest
import torch

from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Spec
from meshplan.strategy import plan_module


def _grown_mb(before: int) -> float:
    """How far this process's peak resident memory grew past ``before`` (kB), in MB."""
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1e3


def test_a_meta_model_of_gigabytes_plans_without_allocating_its_parameters():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    width = 1 << 14  # two 1 GiB weights in float32
    with torch.device("meta"):
        model = torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, width)
        )
    mesh = Mesh.create((2, 2), ("dp", "tp"))
    x = Spec(mesh, [Shard(0), Replicate()], (32, width), "float32")
    budget = 4e9
    mp = plan_module(
        model, x, forward=lambda m, x: m(x).square().mean(), choose=["*"], memory_budget=budget
    )
    assert all(p.is_meta for p in model.parameters())  # the model is not touched
    assert mp.program.memory.peak <= budget
    assert mp.program.memory.params < 2 * width * width * 4 / 2  # sharded to fit
    assert _grown_mb(before) < 500, "planning a meta model allocated parameter-size memory"


def test_choose_names_module_tensors_by_pattern():
    mesh = Mesh.create((2,), ("dp",))
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    x = Spec(mesh, [Shard(0)], (4, 8), "float32")
    mp = plan_module(model, x, forward=lambda m, x: m(x).sum(), choose=["*.bias"], specs={})
    assert str(mp.specs["0.weight"]) == "f32[8,8](R)"  # not chosen: as given (replicated)
    with pytest.raises(Exception, match="matches no argument name"):
        plan_module(model, x, forward=lambda m, x: m(x).sum(), choose=["*.nothing"])


@pytest.mark.slow
def test_llama3_8b_widths_plan_from_the_meta_device_in_little_host_memory():
    """Llama-3-8B's published shapes (one of its 32 layers), bf16, on a (2, 2) mesh with
    every tensor chosen under a whole-step budget: well under 4 GB of host memory."""
    transformers = pytest.importorskip("transformers")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    config = transformers.LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_hidden_layers=1,
        vocab_size=128256,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        torch_dtype="bfloat16",
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    mesh = Mesh.create((2, 2), ("dp", "tp"))
    ids = Spec(mesh, [Shard(0), Replicate()], (4, 128), "int64")

    def step(m, ids):
        return m(input_ids=ids, labels=ids, use_cache=False).loss

    budget = 40e9
    mp = plan_module(model, ids, forward=step, choose=["*"], memory_budget=budget)
    assert mp.program.memory.peak <= budget
    assert _grown_mb(before) < 4000

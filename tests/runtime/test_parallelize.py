"""parallelize on 4 gloo ranks: a stock torch optimizer on the shards equals it on the whole model.

A small module (embedding, layer norm, MLP, a buffer) is planned FSDP x TP on (dp 2, tp 2)
by name patterns, trained with ``torch.optim`` and ``pm.clip_grad_norm_`` for a few steps,
saved with its optimizer's state, and resumed on another mesh (4-way FSDP): every loss,
every gradient norm and the final weights equal one process's ``torch.optim`` and
``torch.nn.utils.clip_grad_norm_`` on the whole model (float64).
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from _shell_cases import groups_for
from _train_cases import call, reference_steps, train_planned

from meshplan.errors import RuntimeShellError
from meshplan.layout import Mesh
from meshplan.placement import Replicate, Shard, Sharded, Spec, unshard
from meshplan.runtime import ParallelModule, parallelize
from meshplan.strategy import ComputeModel, plan_module

V, D, B, T = 16, 8, 8, 6
CLIP = 0.05  # small enough that every step clips


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(V, D, dtype=torch.float64)
        self.ln = torch.nn.LayerNorm(D, dtype=torch.float64)
        self.fc1 = torch.nn.Linear(D, 2 * D, dtype=torch.float64)
        self.fc2 = torch.nn.Linear(2 * D, V, dtype=torch.float64)
        self.register_buffer("scale", torch.tensor([0.5, 2.0], dtype=torch.float64))

    def forward(self, tok, tgt):
        x = self.ln(self.emb(tok))
        logits = self.fc2(F.gelu(self.fc1(x))) * self.scale.sum()
        return F.cross_entropy(logits.flatten(0, 1), tgt.flatten())


FSDP_TP = {
    "fc1.weight": "S(0) S(0)",  # column-parallel, then FSDP
    "fc2.weight": "S(0) S(1)",  # row-parallel
    "emb.weight": "S(0) S(1)",
    "*": "S(0) R",  # biases and norms
}
FSDP = {"*weight": "S(0)", "*bias": "S(0)"}


def _batches(n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g))
        for _ in range(n)
    ]


def _optimizer(kind: str, params):
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    return torch.optim.SGD(params, lr=0.5, momentum=0.9)


def _batch_spec(mesh: Mesh) -> Spec:
    return Spec(mesh, [Shard(0)] + [Replicate()] * (mesh.ndim - 1), (B, T), "int64")


@pytest.fixture(scope="module")
def planned():
    """The step planned once per mesh and shared by both optimizers' runs (planning is
    pure and deterministic; each rank planning alike is tested below)."""
    out = {}
    grid, line = Mesh.create((2, 2), ("dp", "tp")), Mesh.create((4,), ("dp",))
    for mesh, specs in ((grid, FSDP_TP), (line, FSDP)):
        b = _batch_spec(mesh)
        out[mesh.ndim] = plan_module(Tiny(), b, b, specs=specs, compute=ComputeModel.cpu())
    return out


def _close(got, want, what):
    for (la, na), (lb, nb) in zip(got, want, strict=True):
        assert abs(la - lb) <= 1e-12 * abs(lb), (what, got, want)
        assert abs(na - nb) <= 1e-12 * abs(nb), (what, got, want)


def _same_weights(results, want):
    _, state, specs = results[0]
    for name, spec in specs.items():
        got = unshard({r: res[1][name] for r, res in enumerate(results)}, spec)
        assert torch.allclose(got, want[name], rtol=1e-12, atol=1e-14), name


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_a_stock_optimizer_on_the_shards_equals_it_on_the_whole_model_and_resumes_elsewhere(
    pool4, planned, kind, tmp_path
):
    batches = _batches(5)
    model = Tiny()
    want = reference_steps(model, call, _optimizer(kind, model.parameters()), batches, CLIP)
    final = model.state_dict()
    make_optimizer = functools.partial(_optimizer, kind)
    path = str(tmp_path / "ckpt")
    results = pool4.run(
        train_planned, planned[2], Tiny, make_optimizer, batches[:3], CLIP, save=path, timeout=600
    )
    for got, _, _ in results:
        _close(got, want[:3], "fsdp x tp")
    assert all(norm > CLIP for _, norm in want[:3])  # the clipping did clip
    resumed = pool4.run(
        train_planned, planned[1], Tiny, make_optimizer, batches[3:], CLIP, resume=path, timeout=600
    )
    for got, _, _ in resumed:
        _close(got, want[3:], "resumed on another mesh")
    _same_weights(resumed, final)


def _shards_and_errors(mesh):
    rank = dist.get_rank()
    groups = groups_for(mesh)
    b = _batch_spec(mesh)
    model = Tiny()
    mp = plan_module(model, b, b, specs=FSDP_TP, compute=ComputeModel.cpu())
    # a planned program and the whole model's state dict (tied-free, buffers included)
    pm = parallelize(mp, groups)
    out = {"names": [n for n, _ in pm.named_parameters()], "zeros": pm.scale.clone()}
    with pytest.raises(RuntimeShellError, match="hold no weights"):
        pm(*pm.local_batch(*_batches(1)[0]))
    pm.load_state_dict(model.state_dict())
    out["shards"] = {n: p.detach().clone() for n, p in pm.named_parameters()}
    out["scale"] = pm.scale.clone()
    out["specs"] = pm.specs
    # errors name the fix
    with pytest.raises(RuntimeShellError, match="missing"):
        pm.load_state_dict({"fc1.weight": model.fc1.weight})
    other = Spec(mesh, [Replicate(), Replicate()], (2 * D, D), "float64")
    with pytest.raises(RuntimeShellError, match="pm.load"):
        pm.load_state_dict(
            {"fc1.weight": Sharded(torch.zeros(2 * D, D, dtype=torch.float64), other, rank)},
            strict=False,
        )
    with pytest.raises(RuntimeShellError, match="shape"):
        pm.load_state_dict({"fc1.weight": torch.zeros(3)}, strict=False)
    with pytest.raises(RuntimeShellError, match="not a parameter of this model"):
        pm.optimizer_state_dict(torch.optim.SGD([torch.zeros(2, requires_grad=True)]))
    with pytest.raises(RuntimeShellError, match="no parameter or buffer is named"):
        pm.spec_of("fc3.weight")
    with pytest.raises(RuntimeShellError, match="eval mode|train mode"):
        pm.eval()(*pm.local_batch(*_batches(1)[0]))
    # a meta model: shards wait for weights, then load from the initialized whole model
    with torch.device("meta"):
        meta = Tiny()
    pm2 = parallelize(meta, groups, b, b, specs=FSDP_TP, compute=ComputeModel.cpu())
    pm2.load_state_dict(model)
    out["meta_equal"] = all(
        torch.equal(a, b) for a, b in zip(pm2.parameters(), pm.parameters(), strict=True)
    )
    out["loss"] = pm2(*pm2.local_batch(*_batches(1)[0])).item()
    return out


def test_the_shards_are_parameters_named_as_the_model_and_load_from_a_whole_model(pool4):
    model = Tiny()
    grid = Mesh.create((2, 2), ("dp", "tp"))
    results = pool4.run(_shards_and_errors, grid, timeout=600)
    assert results[0]["names"] == [n for n, _ in model.named_parameters()]
    specs = results[0]["specs"]
    for name, t in model.named_parameters():
        got = unshard({r: res["shards"][name] for r, res in enumerate(results)}, specs[name])
        assert torch.equal(got, t.detach()), name
    assert str(specs["fc1.weight"]) == "f64[16,8](S(0) S(0))"
    assert all(not res["zeros"].any() for res in results)  # no weights before the load
    scale = unshard({r: res["scale"] for r, res in enumerate(results)}, specs["scale"])
    assert torch.equal(scale, model.scale)  # a buffer, sharded as "*" says
    assert all(res["meta_equal"] for res in results)
    want = Tiny()(*_batches(1)[0]).item()
    assert all(abs(res["loss"] - want) <= 1e-12 * abs(want) for res in results)


def test_parallelize_refuses_what_is_not_a_model():
    with pytest.raises(RuntimeShellError, match="nn.Module"):
        parallelize(42, None)
    with pytest.raises(RuntimeShellError, match="names="):
        b = _batch_spec(Mesh.create((2,)))
        parallelize(plan_module(Tiny(), b, b).program, None)
    assert issubclass(ParallelModule, torch.nn.Module)


class Norm(torch.nn.Module):
    """A BatchNorm (running statistics: buffers the step writes) and a dropout."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(D, 2 * D, dtype=torch.float64)
        self.bn = torch.nn.BatchNorm1d(2 * D, dtype=torch.float64)
        self.drop = torch.nn.Dropout(p)
        self.fc2 = torch.nn.Linear(2 * D, 4, dtype=torch.float64)

    def forward(self, x):
        return self.fc2(self.drop(self.bn(self.fc1(x)))).square().mean()


def _inputs(n: int):
    g = torch.Generator().manual_seed(2)
    return [torch.randn(B, D, generator=g, dtype=torch.float64) for _ in range(n)]


def _buffers_dropout_and_modes(mesh):
    groups = groups_for(mesh)
    x = Spec(mesh, [Shard(0), Replicate()], (B, D), "float64")
    pm = parallelize(Norm(), groups, x, specs={"fc1.weight": "S(0) S(0)"})
    opt = torch.optim.SGD(pm.parameters(), lr=0.1)
    losses = []
    for batch in _inputs(3):
        loss = pm(*pm.local_batch(batch))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    buffers = {n: b.clone() for n, b in pm.named_buffers()}
    evaluated = pm.eval()(*pm.local_batch(_inputs(1)[0])).item()  # planned again, in eval mode
    drop = parallelize(Norm(0.5), groups, x, seed=7)
    drawn = [drop(*drop.local_batch(_inputs(1)[0])).item() for _ in range(2)]
    return losses, buffers, pm.specs, evaluated, drawn, drop.step


def test_buffers_update_as_on_one_process_eval_replans_and_dropout_draws_per_step(pool4):
    results = pool4.run(_buffers_dropout_and_modes, Mesh.create((2, 2), ("dp", "tp")), timeout=600)
    model = Norm()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    want = []
    for batch in _inputs(3):
        loss = model(batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        want.append(loss.item())
    model.eval()
    evaluated = model(_inputs(1)[0]).item()
    specs = results[0][2]
    for losses, _, _, ev, drawn, step in results:
        assert all(abs(a - b) <= 1e-12 * abs(b) for a, b in zip(losses, want, strict=True))
        assert abs(ev - evaluated) <= 1e-12 * abs(evaluated)
        assert drawn[0] != drawn[1] and step == 2  # each training call draws anew
        assert drawn == results[0][4]  # one global draw: every rank the same loss
    for name, value in model.named_buffers():
        got = unshard({r: res[1][name] for r, res in enumerate(results)}, specs[name])
        assert torch.allclose(got.to(value.dtype), value, rtol=1e-12, atol=1e-14), name

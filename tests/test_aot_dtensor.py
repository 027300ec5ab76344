"""mode='aot' with DTensor state: AOT's subclass descriptors mapped onto local shards.

The models and shardings are those of tests/test_distributed.py (tensor parallelism with
parallelize_module Colwise/Rowwise, and a SimpleFSDP-style parametrisation) on a fake
world. References: eager autograd under the same fake world, the single-device eager step,
the model's own named_parameters(), and the make_fx mode's trace of the same model.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab.analysis.distributed import collectives
from jointlab.errors import BakedConstantWarning, UnsupportedWrapperError
from jointlab.runtime.dtensor import DTensorRuntime
from tests.test_distributed import (
    SHARDINGS,
    _assert_like_single_device,
    _inputs,
    _reference,
    _sharded,
    _step,
    _tp,
)
from tests.util import NEEDS_DISTRIBUTED_TORCH, assert_unchanged, deep_state

pytestmark = NEEDS_DISTRIBUTED_TORCH

tensor = pytest.importorskip("torch.distributed.tensor")
Partial, Replicate = tensor.Partial, tensor.Replicate
KINDS = list(SHARDINGS)
DIST = ["local_shape", "global_shape", "placement", "mesh_dim", "comm_bytes"]


def _trace_aot(kind, world, ref=None):
    """A sharded model, its inputs and its AOT joint; the model must stay unchanged."""
    shard, _ = SHARDINGS[kind]
    model, inputs = _sharded(shard, world, ref), _inputs()
    before = deep_state(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BakedConstantWarning)  # no fake shard baked in
        joint = jl.trace(model, _step, inputs, mode="aot")
    assert_unchanged(before, model)
    return model, inputs, joint


@pytest.mark.parametrize("kind", KINDS)
def test_aot_step_equals_eager_under_the_same_fake_world_bit_for_bit(kind):
    with jl.fake_world(4, mesh=SHARDINGS[kind][1]) as world:
        model, inputs, joint = _trace_aot(kind, world)
        assert isinstance(joint.runtime, DTensorRuntime)
        result = joint.run(model, inputs)
        loss = _step(model, **inputs)  # eager, same fake world, same local shards
        loss.backward()
        params = dict(model.named_parameters())
    assert torch.equal(result.loss, loss.detach())
    assert list(result.grads) == list(params)
    for fqn, p in params.items():
        g = result.grads[fqn]
        assert type(g) is type(p.grad) and g.placements == p.grad.placements, fqn
        assert g.shape == p.grad.shape and g.device_mesh == p.grad.device_mesh, fqn
        assert torch.equal(g.to_local(), p.grad.to_local()), fqn


@pytest.mark.parametrize("kind", KINDS)
def test_aot_placeholders_are_local_shards_with_the_node_table_columns(kind):
    with jl.fake_world(4, mesh=SHARDINGS[kind][1]) as world:
        model, _, joint = _trace_aot(kind, world)
        make_fx = jl.trace(model, _step, _inputs())
        state = dict(model.named_parameters())
        table = joint.nodes
    # The same contract as make_fx mode: state names, trainable names, one placeholder
    # per parameter (its local shard; the mesh is no graph input), one gradient each.
    assert joint.state_fqns == make_fx.state_fqns and joint.param_names == make_fx.param_names
    assert list(joint.params()) == list(state)
    assert all(isinstance(n.meta["val"], torch.Tensor) for n in joint.placeholders)
    grads = joint.params_and_grads()
    for fqn, node in joint.params().items():
        local = state[fqn].to_local()
        assert tuple(node.meta["val"].shape) == tuple(local.shape), fqn
        assert tuple(grads[fqn][1].meta["val"].shape) == tuple(local.shape), fqn
        row = table.loc[node.name]
        assert row.local_shape == tuple(local.shape)
        assert row.global_shape == tuple(state[fqn].shape)
        assert row.placement == ", ".join(str(p) for p in state[fqn].placements)
        assert row.bytes == local.numel() * local.element_size()
        assert row[DIST].tolist() == make_fx.nodes.loc[make_fx.params()[fqn].name, DIST].tolist()
    assert int(table.comm_bytes.sum()) == int(make_fx.nodes.comm_bytes.sum()) > 0


@pytest.mark.parametrize("kind", KINDS)
def test_aot_descriptors_name_each_parameter_and_its_gradient(kind):
    with jl.fake_world(4, mesh=SHARDINGS[kind][1]) as world:
        model, _, joint = _trace_aot(kind, world)
        fqns = [n for n, _ in model.named_parameters()]
    out = joint.graph.output_node()
    desc_of = dict(zip(out.args[0], out.meta["desc"]))
    pairs = joint.inputs_and_grads()
    assert len(pairs) == len(fqns) + 2  # every parameter, then the inputs x and y
    for (ph, grad), fqn in zip(pairs, fqns):
        # torch's own descriptors: the '_local_tensor' part of this parameter, and of its grad
        assert ph.meta["desc"].attr == "_local_tensor"
        assert ph.meta["desc"].base.target == f"model.{fqn}"
        assert ph.meta["jointlab"]["fqn"] == fqn
        assert desc_of[grad].attr == "_local_tensor"
        assert desc_of[grad].base.grad_of.target == f"model.{fqn}"
    assert [g for _, g in pairs[len(fqns):]] == [None, None]
    assert [p.meta["jointlab"]["input_path"] for p, _ in pairs[len(fqns):]] == ["x", "y"]
    ((loss, tangent),) = joint.outputs_and_tangents()
    assert desc_of[loss].idx == 0 and tangent.meta["desc"].output.idx == 0


@pytest.mark.parametrize("kind", KINDS)
def test_aot_collectives_equal_make_fx_ones(kind):
    cols = ["op", "phase", "module", "mesh_dim", "bytes"]
    with jl.fake_world(4, mesh=SHARDINGS[kind][1]) as world:
        model, inputs, joint = _trace_aot(kind, world)
        reference = collectives(jl.trace(model, _step, inputs))
        table = collectives(joint)
    assert len(table) > 0
    assert table[cols].values.tolist() == reference[cols].values.tolist()
    assert table.attrs["rank_classes"] == reference.attrs["rank_classes"] == ((0, 1, 2, 3),)
    waits = {n.name for n in joint.graph.nodes if "wait_tensor" in str(n.target)}
    assert set(table.wait) <= waits and "" not in set(table.wait)


@pytest.mark.parametrize("kind", KINDS)
def test_aot_run_all_ranks_matches_single_device_eager(kind):
    ref = _reference()
    with jl.fake_world(4, mesh=SHARDINGS[kind][1]) as world:
        shard = SHARDINGS[kind][0]
        _, inputs, joint = _trace_aot(kind, world, ref)
        with world.all_ranks():
            every_rank = _sharded(shard, world, ref)
        result = jl.run_all_ranks(joint, every_rank, inputs)
    loss = _step(ref, **inputs)
    loss.backward()
    assert result.ranks == (0, 1, 2, 3)
    # Bitwise against each rank's own eager step under LocalTensorMode; single-device
    # eager sums in another order (whole matmuls instead of shards plus an all-reduce),
    # so the gathered values agree to rounding: 1e-7 as in make_fx mode.
    _assert_like_single_device(result, every_rank, ref, loss, result.ranks)


def test_aot_replicated_dtensor_loss_is_its_value_and_a_partial_one_is_refused():
    from torch.distributed.tensor import DTensor, Replicate, Shard

    def replicated(model, x, y):
        out = DTensor.from_local(model(x), world.mesh["tp"], [Replicate()])
        return F.mse_loss(out, DTensor.from_local(y, world.mesh["tp"], [Replicate()]))

    def sharded(model, x, y):  # each rank's rows declared row-sharded: a Partial loss
        out = DTensor.from_local(model(x), world.mesh["tp"], [Shard(0)])
        return F.mse_loss(out, DTensor.from_local(y, world.mesh["tp"], [Shard(0)]))

    with jl.fake_world(4, mesh={"dp": 2, "tp": 2}) as world:
        model, inputs = _sharded(_tp, world), _inputs()
        result = jl.trace(model, replicated, inputs, mode="aot").run(model, inputs)
        loss = replicated(model, **inputs)
        loss.backward()
        assert torch.equal(result.loss, loss.to_local())
        for fqn, p in model.named_parameters():
            assert torch.equal(result.grads[fqn].to_local(), p.grad.to_local()), fqn
        model.zero_grad(set_to_none=True)
        before = deep_state(model)
        with pytest.raises(UnsupportedWrapperError, match=r"the loss as a DTensor placed \(P"):
            jl.trace(model, sharded, inputs, mode="aot")
        assert_unchanged(before, model)


def test_aot_partial_parameter_is_refused_and_model_unchanged():
    from torch.distributed.tensor import Partial, distribute_tensor

    with jl.fake_world(4) as world:
        model, inputs = _reference(), _inputs()
        model.fc1.weight = nn.Parameter(
            distribute_tensor(model.fc1.weight.data, world.mesh, [Partial()]))
        before = deep_state(model)
        with pytest.raises(UnsupportedWrapperError,
                           match="'fc1.weight' is a DTensor.*Partial parameter"):
            jl.trace(model, _step, inputs, mode="aot")
        assert_unchanged(before, model)


class RowsThenShardedRows(nn.Module):
    """Two replicated weights; the second multiplies row-sharded activations made with
    DTensor.from_local in the forward, so eager gives it a Partial(sum) gradient whose
    mesh AOT lifts as a graph constant (not a placeholder)."""

    def __init__(self, mesh, tied: bool = False) -> None:
        from torch.distributed.tensor import Replicate, distribute_tensor

        super().__init__()
        self.mesh = mesh
        self.a, self.b = nn.Linear(16, 16, bias=False), nn.Linear(16, 16, bias=False)
        for lin in (self.a, self.b):
            lin.weight = nn.Parameter(distribute_tensor(lin.weight.data, mesh, [Replicate()]))
        if tied:
            self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, Replicate, Shard

        h = DTensor.from_local(x, self.mesh, [Replicate()]) @ self.a.weight.t()
        h = DTensor.from_local(h.to_local(), self.mesh, [Shard(0)])
        return (h @ self.b.weight.t()).to_local()


def test_aot_gradient_placed_unlike_its_parameter_is_wrapped_as_eager_places_it():
    import copy

    with jl.fake_world(2) as world:
        torch.manual_seed(0)
        model, inputs = RowsThenShardedRows(world.mesh), _inputs()
        eager = copy.deepcopy(model)
        before = deep_state(model)
        joint = jl.trace(model, _step, inputs, mode="aot")
        assert_unchanged(before, model)
        assert not joint.graph.find_nodes(op="get_attr")  # the lifted mesh constant is gone
        result = joint.run(model, inputs)
        loss = _step(eager, **inputs)
        loss.backward()
    assert torch.equal(result.loss, loss.detach())
    assert [p.grad.placements for p in eager.parameters()] == [
        (Replicate(),), (Partial("sum"),)]  # the reference really differs from the params
    for fqn, p in eager.named_parameters():
        assert result.grads[fqn].placements == p.grad.placements, fqn
        assert torch.equal(result.grads[fqn].to_local(), p.grad.to_local()), fqn


def test_aot_tied_dtensor_with_alias_gradients_placed_differently_is_refused():
    with jl.fake_world(2) as world:
        torch.manual_seed(0)
        model, inputs = RowsThenShardedRows(world.mesh, tied=True), _inputs()
        assert [n for n, _ in model.named_parameters()] == ["a.weight"]
        result = jl.trace(model, _step, inputs).run(model, inputs)  # make_fx: autograd sums
        assert result.grads["a.weight"].placements == (Partial("sum"),)
        before = deep_state(model)
        with pytest.raises(UnsupportedWrapperError,
                           match=r"tied DTensor 'a.weight' gets a gradient placed "
                                 r"\(Partial\(sum\),\) through its alias 'b.weight'.*"
                                 r"mode='make_fx'"):
            jl.trace(model, _step, inputs, mode="aot")
        assert_unchanged(before, model)


def test_aot_dtensor_buffers_are_updated_like_eager():
    import copy

    from torch.distributed.tensor import DTensor, Replicate, distribute_module

    def replicate_input(mod, args, mesh):
        return (DTensor.from_local(args[0], mesh, [Replicate()]),)

    with jl.fake_world(2) as world:
        torch.manual_seed(0)
        model = distribute_module(nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16)),
                                  world.mesh, input_fn=replicate_input,
                                  output_fn=lambda mod, out, mesh: out.to_local())
        inputs = _inputs()
        eager = copy.deepcopy(model)
        joint = jl.trace(model, _step, inputs, mode="aot")
        assert {n for n, _ in model.named_buffers()} <= set(joint.buffers())
        result = joint.run(model, inputs)
        loss = _step(eager, **inputs)
        loss.backward()
        buffers = dict(eager.named_buffers())
    assert torch.equal(result.loss, loss.detach())
    for fqn, p in eager.named_parameters():
        assert torch.equal(result.grads[fqn].to_local(), p.grad.to_local()), fqn
    for fqn, b in model.named_buffers():  # running stats: updated once, as eager did
        assert not torch.equal(b.to_local(), _initial_buffer(fqn)), fqn
        assert torch.equal(b.to_local(), buffers[fqn].to_local()), fqn


def _initial_buffer(fqn: str) -> torch.Tensor:
    fresh = nn.BatchNorm1d(16)
    return dict(fresh.named_buffers())[fqn.split(".", 1)[1]]


def test_aot_meta_dtensor_model_traces_like_the_cpu_one_and_run_refuses():
    from jointlab.errors import MetaDeviceError
    from tests.test_distributed import AllReduceMLP

    cols = ["local_shape", "global_shape", "bytes", "comm_bytes"]
    with jl.fake_world(4, mesh={"dp": 2, "tp": 2}) as world:
        _, inputs, cpu = _trace_aot("tp", world)
        with torch.device("meta"):
            model = AllReduceMLP(collective=False)
        _tp(model, world.mesh)
        meta = jl.trace(model, _step, inputs, mode="aot")
        # Reference: the same plan traced from real CPU weights.
        assert meta.nodes[cols].equals(cpu.nodes[cols])
        assert meta.memory().peak_bytes == cpu.memory().peak_bytes
        before = deep_state(model)
        with pytest.raises(MetaDeviceError, match="'fc1.weight' is on the meta device"):
            meta.run(model, inputs)
        assert_unchanged(before, model)


@pytest.mark.parametrize("case", ["sequence_parallel", "vocab_parallel_embedding"])
def test_aot_names_the_module_of_each_plan_collective_as_make_fx_does(case):
    """PrepareModuleInput's and ColwiseParallel's input hooks run inside their module:
    make_fx's own module stack (torch's tracer around Module.__call__) is the reference."""
    import copy

    from torch.distributed.tensor.parallel import parallelize_module

    from tests.test_distributed import _TinyTitan, _titan_plan, _titan_step

    torch.manual_seed(0)
    ref, gen = _TinyTitan(), torch.Generator().manual_seed(1)
    inputs = {"tok": torch.randint(0, 32, (2, 8), generator=gen),
              "y": torch.randint(0, 32, (2, 8), generator=gen)}
    tables = {}
    with jl.fake_world(4) as world:
        for mode in ("make_fx", "aot"):
            model = parallelize_module(copy.deepcopy(ref), world.mesh, _titan_plan(case))
            tables[mode] = collectives(jl.trace(model, _titan_step, inputs, mode=mode))
    cols = ["op", "phase", "module", "bytes"]
    want, got = tables["make_fx"][cols], tables["aot"][cols]
    assert len(want) >= 6 and "ffn" in set(want.module)  # PrepareModuleInput's all-gather
    assert got.to_dict("records") == want.to_dict("records")

"""Distributed graphs on a fake world: functional collectives in the memory picture."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab.analysis.distributed import collectives
from jointlab.errors import BakedConstantWarning, StateMismatchError, UnsupportedWrapperError
from tests.real_job.models import simple_fsdp as _simple_fsdp
from tests.util import NEEDS_DISTRIBUTED_TORCH, assert_unchanged, deep_state

pytestmark = NEEDS_DISTRIBUTED_TORCH

fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
funcol = pytest.importorskip("torch.distributed._functional_collectives")


@pytest.fixture
def fake_world():
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=4)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


class AllReduceMLP(nn.Module):
    def __init__(self, collective: bool = True) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)
        self.collective = collective

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        # The reference allocates one buffer of the same size where the collective does.
        h = funcol.all_reduce(h, "sum", dist.group.WORLD) if self.collective else h.clone()
        return self.fc2(torch.relu(h))


def _step(model, x, y):
    return F.mse_loss(model(x), y)


def test_wait_tensor_output_is_not_a_new_allocation(fake_world):
    torch.manual_seed(0)
    model, x, y = AllReduceMLP(), torch.randn(8, 16), torch.randn(8, 16)
    joint = jl.trace(model, _step, {"x": x, "y": y})
    waits = [n for n in joint.graph.nodes if "wait_tensor" in str(n.target)]
    assert waits, "the trace has no functional collective"
    life = joint.memory().lifetimes
    for w in waits:
        buffer = w.args[0]  # the collective's output: one storage for both
        assert w.name not in set(life.storage)
        row = life[life.storage == buffer.meta["jointlab"]["storage"]]
        assert len(row) == 1 and int(row.bytes.iloc[0]) == buffer.meta["val"].numel() * 4
    reference = AllReduceMLP(collective=False)
    reference.load_state_dict(model.state_dict())
    ref = jl.trace(reference, _step, {"x": x, "y": y}).memory()
    assert joint.memory().peak_bytes == ref.peak_bytes


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_fsdp2_fully_shard_is_refused_and_model_unchanged(fake_world, mode):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = AllReduceMLP(collective=False)
    fully_shard(model.fc1, mesh=init_device_mesh("cpu", (4,)))
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    before = deep_state(model)
    with pytest.raises(UnsupportedWrapperError, match="module 'fc1'.*FSDP2 fully_shard") as info:
        jl.trace(model, _step, {"x": x, "y": y}, mode=mode)
    assert "parallelize_module" in str(info.value) and "SimpleFSDP" in str(info.value)
    # The DTensor route works in both modes; the message names them.
    assert "mode='make_fx' or mode='aot'" in str(info.value)
    assert_unchanged(before, model)


def test_collectives_table_lists_each_collective_with_its_wait(fake_world):
    torch.manual_seed(0)
    model, x, y = AllReduceMLP(), torch.randn(8, 16), torch.randn(8, 16)
    joint = jl.trace(model, _step, {"x": x, "y": y})
    table = collectives(joint)
    # Reference: the forward all_reduce, and autograd's all_reduce of its gradient.
    assert table.op.tolist() == ["all_reduce", "all_reduce"]
    assert table.phase.tolist() == ["forward", "backward"]
    assert (table.module == "").all() and (table.bytes == 8 * 32 * 4).all()
    waits = {n.name: n for n in joint.graph.nodes if "wait_tensor" in str(n.target)}
    assert all(waits[w].args[0].name == c for c, w in zip(table.node, table.wait))
    assert (table.group == dist.group.WORLD.group_name).all()


# -- DTensor state: traced as local shards --------------------------------------------
def _tp_plan():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}


def _tp(model, mesh):
    from torch.distributed.tensor.parallel import parallelize_module

    return parallelize_module(model, mesh["tp"], _tp_plan())


def _inputs():
    gen = torch.Generator().manual_seed(1)  # leaves the global RNG alone (assert_unchanged)
    return {"x": torch.randn(8, 16, generator=gen), "y": torch.randn(8, 16, generator=gen)}


def _reference():
    torch.manual_seed(0)
    return AllReduceMLP(collective=False)


def _sharded(shard, world, ref=None):
    import copy

    return shard(copy.deepcopy(ref or _reference()), world.mesh)


def _assert_like_single_device(result, every_rank, ref, loss, ranks=(0, 1, 2, 3)):
    """Every rank matches its own eager step, and its loss and every gathered gradient
    equal single-device eager (``ref`` after ``loss.backward()``) to rounding (1e-7)."""
    assert result.matches_eager == dict.fromkeys(ranks, True)
    for rank in ranks:
        torch.testing.assert_close(result.loss[rank], loss.detach(), rtol=0, atol=1e-7)
    names = dict(zip(dict(every_rank.named_parameters()), ref.named_parameters()))
    for fqn, (_, p) in names.items():
        torch.testing.assert_close(result.grads[fqn], p.grad, rtol=0, atol=1e-7)


SHARDINGS = {"tp": (_tp, {"dp": 2, "tp": 2}), "simple_fsdp": (_simple_fsdp, None)}


@pytest.mark.parametrize("kind", list(SHARDINGS))
def test_dtensor_state_traces_as_local_shards_and_runs_like_eager(kind):
    shard, mesh = SHARDINGS[kind]
    with jl.fake_world(4, mesh=mesh) as world:
        model, inputs = _sharded(shard, world), _inputs()
        before = deep_state(model)
        with warnings.catch_warnings():
            warnings.simplefilter("error", BakedConstantWarning)  # no fake shard baked in
            joint = jl.trace(model, _step, inputs)
        assert_unchanged(before, model)
        state = dict(model.named_parameters())
        # Reference: each DTensor's own local shard and global shape.
        for node, fqn in zip(joint.placeholders, joint.state_fqns):
            local = state[fqn].to_local()
            assert tuple(node.meta["val"].shape) == tuple(local.shape)
            row = joint.nodes.loc[node.name]
            assert row.local_shape == tuple(local.shape)
            assert row.global_shape == tuple(state[fqn].shape)
            assert row.bytes == local.numel() * local.element_size()
        assert len(collectives(joint)) > 0
        result = joint.run(model, inputs)
        loss = _step(model, **inputs)  # eager, same fake world
        loss.backward()
        assert torch.equal(result.loss, loss.detach())
        for fqn, p in state.items():
            g = result.grads[fqn]
            assert g.placements == p.grad.placements
            assert torch.equal(g.to_local(), p.grad.to_local()), fqn


def test_tp_node_table_and_collectives_name_placements_and_mesh_dims():
    with jl.fake_world(4, mesh={"dp": 2, "tp": 2}) as world:
        model = _sharded(_tp, world)
        joint = jl.trace(model, _step, _inputs())
        table = joint.nodes
        state = dict(model.named_parameters())
        for node, fqn in zip(joint.placeholders, joint.state_fqns):
            row = table.loc[node.name]
            assert row.placement == ", ".join(str(p) for p in state[fqn].placements)
            assert row.mesh_dim == "tp"
        coll = collectives(joint)
        # Reference: RowwiseParallel all-reduces fc2's partial output on the tp group.
        assert coll.op.tolist() == ["all_reduce"] and coll.module.tolist() == ["fc2"]
        assert coll.mesh_dim.tolist() == ["tp"]
        assert coll.group.tolist() == [world.mesh["tp"].get_group().group_name]
        out = joint.graph.find_nodes(op="call_function",
                                     target=torch.ops._c10d_functional.all_reduce.default)[0]
        assert table.loc[out.name, "comm_bytes"] == coll.bytes.iloc[0] == 8 * 16 * 4
        assert table.loc[out.name, "mesh_dim"] == "tp"
        assert (table.drop(index=out.name).comm_bytes == 0).all()
        assert coll.attrs["rank_classes"] == ((0, 1, 2, 3),)


def test_uneven_shards_split_the_ranks_into_classes():
    with jl.fake_world(4) as world:
        torch.manual_seed(0)
        model = _simple_fsdp(nn.Sequential(nn.Linear(16, 6), nn.ReLU(), nn.Linear(6, 16)),
                             world.mesh)
        joint = jl.trace(model, lambda m, x, y: F.mse_loss(m(x), y), _inputs())
        # Reference: torch.chunk gives 6 rows as 2, 2, 2, 0 over four ranks.
        local = dict(model.named_parameters())["0.parametrizations.weight.original"].to_local()
        assert tuple(local.shape) == (2, 16)
        assert joint.runtime.rank_classes == ((0, 1, 2), (3,))


@pytest.mark.parametrize("kind", list(SHARDINGS))
def test_run_all_ranks_matches_single_device_eager(kind):
    shard, mesh = SHARDINGS[kind]
    ref, inputs = _reference(), _inputs()
    with jl.fake_world(4, mesh=mesh) as world:
        joint = jl.trace(_sharded(shard, world, ref), _step, inputs)
        with world.all_ranks():
            every_rank = _sharded(shard, world, ref)
        result = jl.run_all_ranks(joint, every_rank, inputs)
    loss = _step(ref, **inputs)
    loss.backward()
    assert result.ranks == (0, 1, 2, 3)
    _assert_like_single_device(result, every_rank, ref, loss, result.ranks)
    for shards in result.local_grads.values():
        assert len({tuple(v.shape) for v in shards.values()}) == 1


def test_run_all_ranks_refuses_a_graph_of_another_ranks_read_and_trace_ranks_splits():
    def rank_scaled(model, x, y):
        # A Python int of the traced rank (0) is baked into the graph; other ranks differ.
        return F.mse_loss(model(x), y) * (1 + world.mesh["tp"].get_local_rank())

    ref, inputs = _reference(), _inputs()
    with jl.fake_world(4, mesh={"dp": 2, "tp": 2}) as world:
        joint = jl.trace(_sharded(_tp, world, ref), rank_scaled, inputs)
        assert joint.runtime.rank_classes == ((0, 1, 2, 3),)  # same shapes on every rank
        with world.all_ranks():
            every_rank = _sharded(_tp, world, ref)
        # Reference: the tp coordinate is rank % 2 on a (dp=2, tp=2) mesh, so ranks 1
        # and 3 read another value than the traced rank 0: refused before it runs.
        from jointlab.errors import AssumptionError

        with pytest.raises(AssumptionError, match=r"cannot run as rank 1.*only ranks \[0, 2\]"):
            jl.run_all_ranks(joint, every_rank, inputs)
        graphs = jl.trace_ranks(every_rank, rank_scaled, inputs)
        result = jl.run_all_ranks(graphs, every_rank, inputs)
    assert graphs.classes == ((0, 2), (1, 3))
    assert result.matches_eager == dict.fromkeys(range(4), True)
    loss = F.mse_loss(ref(inputs["x"]), inputs["y"]).detach()
    for rank in range(4):
        torch.testing.assert_close(result.loss[rank], loss * (1 + rank % 2), rtol=0, atol=1e-6)


def test_run_all_ranks_refuses_a_one_rank_model():
    with jl.fake_world(4, mesh={"dp": 2, "tp": 2}) as world:
        model = _sharded(_tp, world)
        joint = jl.trace(model, _step, _inputs())
        with pytest.raises(StateMismatchError, match="inside `with world.all_ranks"):
            jl.run_all_ranks(joint, model, _inputs())


def test_run_refuses_a_model_sharded_differently():
    import copy

    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    with jl.fake_world(4, mesh={"dp": 2, "tp": 2}) as world:
        inputs = _inputs()
        joint = jl.trace(_sharded(_tp, world), _step, inputs)
        swapped = parallelize_module(copy.deepcopy(_reference()), world.mesh["tp"],
                                     {"fc1": RowwiseParallel(), "fc2": ColwiseParallel()})
        half = parallelize_module(copy.deepcopy(_reference()), world.mesh["tp"],
                                  {"fc1": ColwiseParallel()})
        for model, match in [(swapped, r"'fc1.weight' cannot feed.*placed \(S\(1\)\)"),
                             (half, "'fc2.weight' cannot feed.*plain Parameter"),
                             (_reference(), "'fc1.weight' cannot feed.*plain Parameter")]:
            before = deep_state(model)
            with pytest.raises(StateMismatchError, match=match):
                joint.run(model, inputs)
            assert_unchanged(before, model)


@pytest.mark.parametrize("mode, dynamic, match", [
    # both modes trace static DTensor state (tests/test_aot_dtensor.py); dynamic stays refused
    ("aot", True, "dynamic shapes with DTensor state are not supported (mode='aot')"),
    ("make_fx", True, "dynamic shapes with DTensor state are not supported (mode='make_fx')"),
])
def test_dtensor_state_refusals_leave_the_model_unchanged(mode, dynamic, match):
    with jl.fake_world(8, mesh={"dp": 4, "tp": 2}) as world:
        assert dist.get_world_size() == 8 and world.mesh.mesh_dim_names == ("dp", "tp")
        model = _sharded(_tp, world)
        before = deep_state(model)
        with pytest.raises(UnsupportedWrapperError, match="'fc1.weight' is a DTensor") as info:
            jl.trace(model, _step, _inputs(), mode=mode, dynamic=dynamic)
        assert match in str(info.value)
        # the route that works: static shapes, in either mode
        assert "Trace with static shapes" in str(info.value)
        assert_unchanged(before, model)
    assert not dist.is_initialized()


@pytest.mark.parametrize("mesh, placements, match", [
    # a Partial parameter holds a partial sum, not a shard of its value
    (None, "P", "Partial parameter"),
    # (Shard(0), Shard(0)) slices by the rank's mesh coordinate when redistributed: a graph
    # traced on rank 0 would bake rank 0's slice index, so it is refused, not traced
    ({"dp": 2, "tp": 2}, "S0S0", "several mesh dimensions"),
], ids=["partial", "one_dim_over_two_mesh_dims"])
def test_dtensor_parameter_placement_is_refused(mesh, placements, match):
    from torch.distributed.tensor import Partial, Shard, distribute_tensor

    place = [Partial()] if placements == "P" else [Shard(int(d)) for d in placements[1::2]]
    with jl.fake_world(4, mesh=mesh) as world:
        model = _reference()
        p = distribute_tensor(model.fc1.weight.data, world.mesh, place)
        model.fc1.weight = nn.Parameter(p)
        before = deep_state(model)
        with pytest.raises(UnsupportedWrapperError, match=match):
            jl.trace(model, _step, _inputs())
        assert_unchanged(before, model)


def test_dtensor_loss_that_is_not_replicated_is_refused():
    from torch.distributed.tensor import DTensor, Shard

    def sharded_loss(model, x, y):
        # The loss of this rank's rows, declared row-sharded: a Partial DTensor loss.
        out = DTensor.from_local(model(x), world.mesh["tp"], [Shard(0)])
        return F.mse_loss(out, DTensor.from_local(y, world.mesh["tp"], [Shard(0)]))

    with jl.fake_world(4, mesh={"dp": 2, "tp": 2}) as world:
        model = _sharded(_tp, world)
        before = deep_state(model)
        with pytest.raises(UnsupportedWrapperError, match="the loss as a DTensor placed"):
            jl.trace(model, sharded_loss, _inputs())
        assert_unchanged(before, model)


def test_meta_dtensor_model_traces_like_the_cpu_one_and_run_refuses():
    from jointlab.errors import MetaDeviceError

    with jl.fake_world(4, mesh={"dp": 2, "tp": 2}) as world:
        cpu = jl.trace(_sharded(_tp, world), _step, _inputs())
        with torch.device("meta"):
            model = AllReduceMLP(collective=False)
        _tp(model, world.mesh)
        meta = jl.trace(model, _step, _inputs())
        cols = ["local_shape", "global_shape", "bytes", "comm_bytes"]
        # Reference: the same plan traced from real CPU weights.
        assert meta.nodes[cols].equals(cpu.nodes[cols])
        assert meta.memory().peak_bytes == cpu.memory().peak_bytes
        before = deep_state(model)
        with pytest.raises(MetaDeviceError, match="'fc1.weight' is on the meta device"):
            meta.run(model, _inputs())
        assert_unchanged(before, model)


def test_dtensor_input_is_refused_not_baked():
    from torch.distributed.tensor import Replicate, distribute_tensor

    with jl.fake_world(4) as world:
        model = _reference()
        inputs = _inputs()
        inputs["x"] = distribute_tensor(inputs["x"], world.mesh, [Replicate()])
        before = deep_state(model)
        with pytest.raises(UnsupportedWrapperError, match=r"inputs\['x'\] is a DTensor"):
            jl.trace(model, _step, inputs)
        assert_unchanged(before, model)


# -- one graph per rank class (jl.trace_ranks) -------------------------------------------
def _uneven_reference():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 6), nn.ReLU(), nn.Linear(6, 16))


def _seq_step(model, x, y):
    return F.mse_loss(model(x), y)


def _local_shapes(model, rank):
    """Each DTensor's local shard on ``rank``, read from the all-ranks model itself."""
    from jointlab.torch_compat import per_rank_values

    return {n: tuple(per_rank_values(p.to_local())[rank].shape)
            for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_trace_ranks_traces_each_uneven_class_as_its_own_rank_and_matches_eager(mode):
    import copy

    ref, inputs = _uneven_reference(), _inputs()
    with jl.fake_world(4) as world:
        with world.all_ranks():
            every_rank = _simple_fsdp(copy.deepcopy(ref), world.mesh)
        before = deep_state(every_rank)
        graphs = jl.trace_ranks(every_rank, _seq_step, inputs, mode=mode)
        assert_unchanged(before, every_rank)
        # Reference: torch.chunk gives 6 rows as 2, 2, 2, 0 over four ranks.
        assert graphs.classes == ((0, 1, 2), (3,)) and len(graphs) == 2
        assert graphs[1] is graphs[0] and graphs[3] is not graphs[0]
        text = repr(graphs)
        assert "ranks 0, 1, 2 share it (traced as rank 0" in text
        assert "rank 3 runs it (traced as rank 3" in text
        for rank in (0, 3):
            joint, want = graphs[rank], _local_shapes(every_rank, rank)
            got = {fqn: tuple(node.meta["val"].shape)
                   for node, fqn in zip(joint.placeholders, joint.state_fqns)}
            assert got == want, rank
            # The gradients the graph returns have this rank's local shapes too (rank 3's
            # come from DTensor's unpadding at rank 3's mesh coordinate, not rank 0's).
            terms = joint.grad_terms()
            assert [tuple(terms[n][0].meta["val"].shape) for n in joint.param_names] == [
                want[n] for n in joint.param_names]
        before = deep_state(every_rank)
        result = jl.run_all_ranks(graphs, every_rank, inputs)
        assert_unchanged(before, every_rank)
    loss = _seq_step(ref, **inputs)
    loss.backward()
    assert result.rank_classes == ((0, 1, 2), (3,))
    _assert_like_single_device(result, every_rank, ref, loss)
    for rank in range(4):
        shapes = {n: tuple(g[rank].shape) for n, g in result.local_grads.items()}
        assert shapes == _local_shapes(every_rank, rank)


@pytest.mark.parametrize("source", ["mesh", "dist"])
def test_trace_ranks_traces_ranks_that_read_another_rank_value_separately(source):
    import copy

    def rank_scaled(model, x, y):
        # A Python int of the traced rank is baked: each rank needs its own graph.
        rank = world.mesh.get_local_rank() if source == "mesh" else dist.get_rank()
        return _seq_step(model, x, y) * (1 + rank)

    ref, inputs = _uneven_reference(), _inputs()
    with jl.fake_world(4) as world:
        with world.all_ranks():
            every_rank = _simple_fsdp(copy.deepcopy(ref), world.mesh)
        graphs = jl.trace_ranks(every_rank, rank_scaled, inputs)
        result = jl.run_all_ranks(graphs, every_rank, inputs)
    assert graphs.classes == ((0,), (1,), (2,), (3,))
    facts = graphs[2].guards.query("kind == 'rank'")
    assert list(facts.traced) == [2] and list(facts.attr) == ["rank"]
    assert "rank = world.mesh.get_local_rank() if source" in facts.source.iloc[0]
    # Reference: the single-device loss, scaled by 1 + rank in each rank's own step;
    # the reduce-scatter averages the ranks' gradients: (1 + 2 + 3 + 4) / 4 = 2.5 times
    # the single-device gradient.
    loss = _seq_step(ref, **inputs)
    loss.backward()
    for rank in range(4):
        torch.testing.assert_close(result.loss[rank], loss.detach() * (1 + rank), rtol=0,
                                   atol=1e-6)
    for fqn, p in zip(dict(every_rank.named_parameters()), ref.parameters()):
        torch.testing.assert_close(result.grads[fqn], p.grad * 2.5, rtol=1e-6, atol=1e-6)
    # Eager takes one rank's branch for every rank, and the reduce-scatter mixes the
    # ranks: no eager step is any rank's own, so the check cannot say (None), not False.
    assert result.matches_eager == dict.fromkeys(range(4), None)


class _RankBranch(nn.Module):
    """Issue #29's model: rank 0 doubles its output, the other ranks do not."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32, bias=False), nn.Linear(32, 16, bias=False)

    def forward(self, x):
        y = self.b(F.gelu(self.a(x)))
        return y * 2.0 if dist.get_rank() == 0 else y


def _rank_branch_reference(rank, inputs):
    """Single-device eager of rank ``rank``'s branch: (loss, grad of a, grad of b)."""
    torch.manual_seed(0)
    ref = _RankBranch()
    y = ref.b(F.gelu(ref.a(inputs["x"])))
    loss = F.mse_loss(y * 2.0 if rank == 0 else y, inputs["y"])
    return (loss.detach(), *torch.autograd.grad(loss, [ref.a.weight, ref.b.weight]))


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_rank_branch_is_a_guard_and_each_rank_runs_its_own_branch(mode):
    import copy

    from torch.distributed.tensor.parallel import parallelize_module

    from jointlab.errors import AssumptionError

    torch.manual_seed(0)
    model, inputs = _RankBranch(), _inputs()
    plan = dict(zip("ab", _tp_plan().values()))  # a: Colwise, b: Rowwise
    with jl.fake_world(4) as world:
        with world.all_ranks():
            every_rank = parallelize_module(copy.deepcopy(model), world.mesh, plan)
        one_rank = parallelize_module(copy.deepcopy(model), world.mesh, plan)
        # One graph traced as rank 0 holds rank 0's branch: it refuses to run as rank 1.
        joint = jl.trace(one_rank, _step, inputs, mode=mode)
        facts = joint.guards.query("kind == 'rank'")
        assert list(facts.target) == ["torch.distributed.get_rank()"]
        assert list(facts.traced) == [0] and "ranks [0]" in facts.checks.iloc[0]
        assert "return y * 2.0 if dist.get_rank() == 0 else y" in facts.source.iloc[0]
        with pytest.raises(AssumptionError, match=r"cannot run as rank 1.*get_rank\(\) = 0"):
            jl.run_all_ranks(joint, every_rank, inputs)
        graphs = jl.trace_ranks(every_rank, _step, inputs, mode=mode)
        result = jl.run_all_ranks(graphs, every_rank, inputs)
    assert graphs.classes == ((0,), (1,), (2,), (3,))
    assert result.matches_eager == dict.fromkeys(range(4), True)
    for rank in range(4):  # against a single-device eager step of that rank's branch
        loss, grad_a, grad_b = _rank_branch_reference(rank, inputs)
        torch.testing.assert_close(result.loss[rank], loss, rtol=0, atol=1e-6)
        rows = slice(8 * rank, 8 * rank + 8)  # Colwise a: rows; Rowwise b: columns
        torch.testing.assert_close(result.local_grads["a.weight"][rank], grad_a[rows],
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(result.local_grads["b.weight"][rank], grad_b[:, rows],
                                   rtol=1e-5, atol=1e-6)
    assert not torch.allclose(result.loss[0], result.loss[1])


def test_a_rank_read_is_saved_and_checked_on_the_rank_that_runs_it(tmp_path):
    from jointlab.errors import AssumptionError

    def step(model, x, y):  # a plain model; the loss is weighted by the rank
        return _step(model, x, y) * (1 + dist.get_rank())

    model, inputs = _reference(), _inputs()
    with jl.fake_world(4, rank=1):
        joint = jl.trace(model, step, inputs)
        joint.save(tmp_path / "g.jlg")
        loaded = jl.load(tmp_path / "g.jlg")
        assert loaded.guards.equals(joint.guards)
        fact = loaded.assumptions.rank_facts()
        assert [(f.value, f.ranks) for f in fact] == [(1, (1,))]
        torch.testing.assert_close(loaded.run(model, inputs).loss, step(model, **inputs))
    with jl.fake_world(4, rank=2):  # the same graph, run by rank 2
        with pytest.raises(AssumptionError, match=r"cannot run as rank 2.*get_rank\(\) = 1"):
            loaded.run(model, inputs)
    with pytest.raises(AssumptionError, match="no process group"):
        loaded.run(model, inputs)


class _GatherDP(nn.Module):
    """SimpleFSDP over dp of a tensor-parallel parameter: all-gather on dp, stay tp-sharded."""

    def __init__(self, mesh, tp_placement) -> None:
        super().__init__()
        self.mesh, self.tp = mesh, tp_placement

    def forward(self, p):
        from torch.distributed.tensor import DTensor, Partial, Replicate

        full = p.redistribute(self.mesh, [Replicate(), self.tp])
        local = full.to_local(grad_placements=[Partial("avg"), self.tp])
        return DTensor.from_local(local, self.mesh["tp"], [self.tp], run_check=False,
                                  shape=full.shape, stride=full.stride())


def _tp_dp(model, mesh):
    """TP on ``tp`` (fc1 colwise, fc2 rowwise), then FSDP-style on ``dp`` over another dim."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.nn.utils import parametrize

    _tp(model, mesh)
    for mod in (model.fc1, model.fc2):
        for name, p in list(mod.named_parameters(recurse=False)):
            (tp,) = p.placements
            free = [d for d in range(p.ndim) if not (tp.is_shard() and tp.dim == d)]
            dp = Shard(free[0]) if free else Replicate()
            full = distribute_tensor(p.full_tensor().detach(), mesh, [dp, tp])
            mod.register_parameter(name, nn.Parameter(full))
            parametrize.register_parametrization(mod, name, _GatherDP(mesh, tp), unsafe=True)
    return model



def test_tp_x_dp_run_all_ranks_matches_single_device_eager():
    ref, inputs = _reference(), _inputs()
    with jl.fake_world(4, mesh={"dp": 2, "tp": 2}) as world:
        with world.all_ranks():
            every_rank = _sharded(_tp_dp, world, ref)
        placements = {n: [str(x) for x in p.placements] for n, p in every_rank.named_parameters()}
        # Reference: both mesh dims shard, each a different tensor dim.
        assert placements["fc1.parametrizations.weight.original"] == ["S(1)", "S(0)"]
        assert placements["fc2.parametrizations.weight.original"] == ["S(0)", "S(1)"]
        before = deep_state(every_rank)
        graphs = jl.trace_ranks(every_rank, _step, inputs)
        assert_unchanged(before, every_rank)
        assert graphs.classes == ((0, 1, 2, 3),)
        dims = set(collectives(graphs[0]).mesh_dim)
        assert {"dp", "tp"} <= dims, dims
        result = jl.run_all_ranks(graphs, every_rank, inputs)
    loss = _step(ref, **inputs)
    loss.backward()
    _assert_like_single_device(result, every_rank, ref, loss)


def test_trace_ranks_puts_the_world_back_when_a_rank_fails_and_refuses_one_rank_models():
    import copy

    from torch.distributed.device_mesh import DeviceMesh

    def fails_on_rank_3(model, x, y):
        if world.mesh.get_local_rank() == 3:
            raise ValueError("rank 3 says no")
        return _seq_step(model, x, y)

    ref, inputs = _uneven_reference(), _inputs()
    methods = {n: getattr(DeviceMesh, n) for n in ("get_coordinate", "get_local_rank", "get_rank")}
    with jl.fake_world(4) as world:
        with world.all_ranks():
            every_rank = _simple_fsdp(copy.deepcopy(ref), world.mesh)
        before = deep_state(every_rank)
        with pytest.raises(ValueError, match="rank 3 says no"):
            jl.trace_ranks(every_rank, fails_on_rank_3, inputs)
        assert_unchanged(before, every_rank)
        assert {n: getattr(DeviceMesh, n) for n in methods} == methods
        assert dist.get_rank() == 0 and world.mesh.get_coordinate() == (0,)
        one_rank = _simple_fsdp(copy.deepcopy(ref), world.mesh)
        before = deep_state(one_rank)
        with pytest.raises(StateMismatchError, match="inside `with world.all_ranks"):
            jl.trace_ranks(one_rank, _seq_step, inputs)
        assert_unchanged(before, one_rank)


def test_run_all_ranks_refuses_classes_that_issue_different_collectives():
    import copy

    def extra_on_rank_3(model, x, y):
        if world.mesh.get_local_rank() == 3:  # only rank 3's graph all-reduces its input
            x = funcol.all_reduce(x, "avg", world.mesh)
        return _seq_step(model, x, y)

    ref, inputs = _uneven_reference(), _inputs()
    with jl.fake_world(4) as world:
        with world.all_ranks():
            every_rank = _simple_fsdp(copy.deepcopy(ref), world.mesh)
        graphs = jl.trace_ranks(every_rank, extra_on_rank_3, inputs)
        before = deep_state(every_rank)
        with pytest.raises(UnsupportedWrapperError, match="issue different collectives"):
            jl.run_all_ranks(graphs, every_rank, inputs)
        assert_unchanged(before, every_rank)


class _OddOut(nn.Module):
    """15 outputs: fc2's rows split 8, 7 over dp (its columns split evenly over tp)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 15)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def test_uneven_tp_x_dp_classes_run_side_by_side_like_single_device_eager():
    import copy

    torch.manual_seed(0)
    ref, inputs = _OddOut(), _inputs()
    inputs["y"] = inputs["y"][:, :15].contiguous()
    with jl.fake_world(4, mesh={"dp": 2, "tp": 2}) as world:
        with world.all_ranks():
            every_rank = _tp_dp(copy.deepcopy(ref), world.mesh)
        graphs = jl.trace_ranks(every_rank, _step, inputs)
        # Reference: the dp coordinate is rank // 2 on a (dp=2, tp=2) mesh; 15 rows are 8, 7.
        assert graphs.classes == ((0, 1), (2, 3))
        for rank in (0, 2):
            joint, want = graphs[rank], _local_shapes(every_rank, rank)
            assert {fqn: tuple(node.meta["val"].shape) for node, fqn in
                    zip(joint.placeholders, joint.state_fqns)} == want
            terms = joint.grad_terms()
            assert [tuple(terms[n][0].meta["val"].shape) for n in joint.param_names] == [
                want[n] for n in joint.param_names]
        assert {"dp", "tp"} <= set(collectives(graphs[2]).mesh_dim)
        before = deep_state(every_rank)
        result = jl.run_all_ranks(graphs, every_rank, inputs)
        assert_unchanged(before, every_rank)
    loss = _step(ref, **inputs)
    loss.backward()
    _assert_like_single_device(result, every_rank, ref, loss)


def test_padded_shard_storage_of_a_short_last_rank_is_counted():
    # torch keeps the last rank's short chunk of an uneven split in padded storage
    with jl.fake_world(4, rank=3) as world:
        torch.manual_seed(0)
        model = _simple_fsdp(nn.Sequential(nn.Linear(16, 6), nn.ReLU(), nn.Linear(6, 16)),
                             world.mesh)
        joint = jl.trace(model, lambda m, x, y: F.mse_loss(m(x), y), _inputs())
    locals_ = [p.to_local() for p in model.parameters()]
    assert tuple(locals_[0].shape) == (0, 16)  # rank 3 holds no row of the first weight
    # Reference: the storages the live DTensors' local shards really hold.
    held = sum(t.untyped_storage().nbytes() for t in locals_)
    assert held > sum(t.numel() * t.element_size() for t in locals_)
    life = joint.memory().lifetimes
    assert life.loc[life.category == "param", "bytes"].sum() == held


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
@pytest.mark.parametrize("kind", list(SHARDINGS))
def test_compare_judges_dtensor_graphs_by_local_shards_and_finds_an_edit(kind, mode):
    shard, mesh = SHARDINGS[kind]
    with jl.fake_world(4, mesh=mesh) as world:
        model, inputs = _sharded(shard, world), _inputs()
        before = deep_state(model)
        joint = jl.trace(model, _step, inputs, mode=mode)
        comp = jl.compare(joint, model, inputs)
        assert comp.verdict == "bit-exact", comp
        assert any("local shards" in n for n in comp.notes)
        # Reference: eager's own gradients on this rank, as local shards.
        loss = _step(model, **inputs)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        res = joint.run(model, inputs)
        for (fqn, _), g in zip(model.named_parameters(), grads):
            assert torch.equal(res.grads[fqn].to_local(), g.to_local())
        # An edited graph must not pass: scale the first forward matmul's output.
        node = next(n for n in joint.graph.nodes
                    if n.op == "call_function" and jl.meta.op_name(n) in ("mm", "addmm"))
        with joint.graph.inserting_after(node):
            scaled = joint.graph.call_function(torch.ops.aten.mul.Tensor, (node, 1.5))
        node.replace_all_uses_with(scaled, delete_user_cb=lambda u: u is not scaled)
        joint.recompute()
        bad = jl.compare(joint, model, inputs)
        assert bad.verdict == "MISMATCH" and bad.first_divergence is not None
        assert_unchanged(before, model)


def test_placement_mismatch_of_gradients_is_named():
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from jointlab.analysis.compare.capture import placement_mismatches

    with jl.fake_world(2) as world:
        t = torch.randn(4, 4)
        rep, sh = distribute_tensor(t, world.mesh, [Replicate()]), distribute_tensor(
            t, world.mesh, [Shard(0)])
        assert placement_mismatches({"w": rep}, {"w": rep}) == []
        assert placement_mismatches({"w": rep}, {"w": sh})[0].startswith("w (graph")
        assert placement_mismatches({"w": rep.to_local()}, {"w": sh}) != []
        assert placement_mismatches({"w": rep}, {"w": None}) == []  # eager: no gradient


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_stepper_and_record_run_a_dtensor_graph_like_eager(mode):
    shard, mesh = SHARDINGS["simple_fsdp"]
    with jl.fake_world(4, mesh=mesh) as world:
        model, inputs = _sharded(shard, world), _inputs()
        joint = jl.trace(model, _step, inputs, mode=mode)
        stepper = jl.Stepper(joint, model, inputs)
        stepper.run()
        assert stepper.done
        assert stepper.compare().verdict == "bit-exact"
        rec = jl.record(joint, model, inputs)
        # Reference: eager's loss on this rank under the same fake world.
        assert rec.loss == float(_step(model, **inputs))
        described = rec.table.drop(index="output")
        assert (described["note"] == "").all()  # every value observed and described


class _InPlaceAllReduce(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        h = self.fc(x)
        dist.all_reduce(h)  # in place: no graph node would record it
        return h


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_in_place_collective_is_refused_naming_it_its_line_and_funcol(mode):
    from jointlab.errors import TrainFnMisuseError

    model, inputs = _InPlaceAllReduce(), _inputs()
    with jl.fake_world(4):
        before = deep_state(model)
        with pytest.raises(TrainFnMisuseError) as info:
            jl.trace(model, _step, inputs, mode=mode)
        assert_unchanged(before, model)
    text = str(info.value)
    assert "torch.distributed.all_reduce()" in text and "funcol.all_reduce(t" in text
    assert "test_distributed.py" in text and "dist.all_reduce(h)" in text


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
@pytest.mark.parametrize("where", ["train_fn", "around jl.trace"])
def test_loss_parallel_is_refused_in_both_modes_naming_it(mode, where):
    from torch.distributed.tensor.parallel import loss_parallel

    def step(model, x, y):
        with loss_parallel():  # the line the refusal names
            return F.cross_entropy(model(x), y.argmax(-1))

    inputs = _inputs()
    with jl.fake_world(4, mesh={"dp": 2, "tp": 2}) as world:
        model = _sharded(_tp, world)
        before = deep_state(model)
        refused = pytest.raises(UnsupportedWrapperError, match="loss_parallel.. is not supported")
        if where == "train_fn":
            with refused as e:
                jl.trace(model, step, inputs, mode=mode)
        else:  # caught inside: torch's loss_parallel() stays on when an error leaves it
            with loss_parallel(), refused as e:
                jl.trace(model, _step, inputs, mode=mode)
        assert_unchanged(before, model)
    if where == "train_fn":
        assert "with loss_parallel():  # the line the refusal names" in str(e.value)
    else:
        assert "jl.trace was called inside loss_parallel()" in str(e.value)


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_uneven_tensor_parallel_shards_are_refused_as_uneven(mode):
    import copy

    from torch.distributed.tensor.parallel import parallelize_module

    ref, inputs = _uneven_reference(), _inputs()  # hidden 6 over 4 ranks: 2, 2, 2, 0
    with jl.fake_world(4) as world:
        with world.all_ranks():
            every_rank = parallelize_module(copy.deepcopy(ref), world.mesh,
                                            dict(zip(("0", "2"), _tp_plan().values())))
        before = deep_state(every_rank)
        with pytest.raises(UnsupportedWrapperError) as info:
            jl.trace_ranks(every_rank, _seq_step, inputs, mode=mode)
        assert_unchanged(before, every_rank)
    text = str(info.value)
    assert "'0.weight' (S(0)): 6 over 4 ranks" in text and "'2.weight' (S(1))" in text
    assert "test_distributed.py" in text and "divisible" in text


# -- torch's own rank reads: sequence parallel, vocab-parallel embedding (issue #29) ----
class _FFN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32, bias=False), nn.Linear(32, 16, bias=False)

    def forward(self, h):
        return self.fc2(F.gelu(self.fc1(h)))


class _TinyTitan(nn.Module):
    """A torchtitan-style block: embedding, norm, residual MLP, final norm, output."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(32, 16)
        self.norm, self.ffn, self.final_norm = nn.LayerNorm(16), _FFN(), nn.LayerNorm(16)
        self.out = nn.Linear(16, 32, bias=False)

    def forward(self, tok):
        h = self.tok_embeddings(tok)  # the line the embedding's reads name
        h = h + self.ffn(self.norm(h))
        return self.out(self.final_norm(h))


def _titan_step(model, tok, y):
    return F.cross_entropy(model(tok).flatten(0, 1), y.flatten())


def _titan_plan(case):
    """torchtitan's plan (sequence parallel), its Shard(1) embedding output two ways."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    if case == "colwise_replicate_output":
        return {"out": ColwiseParallel(output_layouts=Replicate())}
    embedding = {
        "sequence_parallel": PrepareModuleOutput(output_layouts=Replicate(),
                                                 desired_output_layouts=Shard(1)),
        "vocab_parallel_embedding": RowwiseParallel(input_layouts=Replicate(),
                                                    output_layouts=Shard(1)),
    }[case]
    return {"tok_embeddings": embedding, "norm": SequenceParallel(),
            "final_norm": SequenceParallel(),
            "ffn": PrepareModuleInput(input_layouts=(Shard(1),),
                                      desired_input_layouts=(Replicate(),)),
            "ffn.fc1": ColwiseParallel(), "ffn.fc2": RowwiseParallel(output_layouts=Shard(1)),
            "out": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())}


# What torch reads the coordinate for, and where (the reference: torch's redistribute keeps
# this rank's chunk of a replicated tensor; _MaskPartial masks the indices of other ranks'
# vocabulary rows; a Replicate output's gradient is sliced back to this rank's columns).
_TITAN_READS = {
    "sequence_parallel": ("redistribute_local_tensor() (R -> S(1))", "self.tok_embeddings(tok)"),
    "vocab_parallel_embedding": ("_MaskPartial._partition_value()", "self.tok_embeddings(tok)"),
    "colwise_replicate_output": ("redistribute_local_tensor() (R -> S(2))",
                                 "autograd's RedistributeBackward"),
}


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
@pytest.mark.parametrize("case", list(_TITAN_READS))
def test_torch_rank_reads_split_the_ranks_and_every_rank_matches_single_device(case, mode):
    import copy

    from torch.distributed.tensor.parallel import parallelize_module

    from jointlab.errors import AssumptionError

    torch.manual_seed(0)
    ref, gen = _TinyTitan(), torch.Generator().manual_seed(1)
    inputs = {"tok": torch.randint(0, 32, (2, 8), generator=gen),
              "y": torch.randint(0, 32, (2, 8), generator=gen)}
    with jl.fake_world(4) as world:
        with world.all_ranks():
            every_rank = parallelize_module(copy.deepcopy(ref), world.mesh, _titan_plan(case))
        one_rank = parallelize_module(copy.deepcopy(ref), world.mesh, _titan_plan(case))
        # One graph traced as rank 0 keeps rank 0's chunk: it refuses to run as rank 1.
        joint = jl.trace(one_rank, _titan_step, inputs, mode=mode)
        with pytest.raises(AssumptionError, match="cannot run as rank 1: torch read"):
            jl.run_all_ranks(joint, every_rank, inputs)
        before = deep_state(every_rank)
        graphs = jl.trace_ranks(every_rank, _titan_step, inputs, mode=mode)
        result = jl.run_all_ranks(graphs, every_rank, inputs)
        assert_unchanged(before, every_rank)
    assert graphs.classes == ((0,), (1,), (2,), (3,))
    reader, where = _TITAN_READS[case]
    facts = graphs[2].guards.query("kind == 'rank'")
    assert any(reader in t for t in facts.target), list(facts.target)
    assert any(where in s for s in facts.source), list(facts.source)
    assert set(facts.traced) == {2}  # rank 2's graph holds rank 2's choices
    loss = _titan_step(ref, **inputs)
    loss.backward()
    _assert_like_single_device(result, every_rank, ref, loss)


class _FullWeight(nn.Module):
    def __init__(self, mesh):
        super().__init__()
        from torch.distributed.tensor import Shard, distribute_tensor

        torch.manual_seed(0)
        self.w = nn.Parameter(distribute_tensor(torch.randn(16, 16), mesh, [Shard(0)]))

    def forward(self, x):
        return x @ self.w.full_tensor().t()  # backward: Replicate -> Shard(0) by coordinate


def test_a_second_fake_world_playing_another_rank_is_not_served_the_first_worlds_mesh():
    def step(m, x):
        return m(x).pow(2).mean()

    seen = {}
    for rank in (0, 1):  # one process, two worlds: DTensor's caches must not mix them
        with jl.fake_world(4, rank=rank) as world:
            model = _FullWeight(world.mesh)
            joint = jl.trace(model, step, {"x": torch.randn(4, 16)})
            coord = [f.value for f in joint.assumptions.rank_facts() if f.attr == "coordinate"]
            seen[rank] = (model.w.device_mesh.get_coordinate(), coord, world.mesh.get_coordinate())
    for rank, (dtensor_coord, traced, mesh_coord) in seen.items():
        assert mesh_coord == (rank,)
        assert dtensor_coord == mesh_coord  # was (0,) for rank 1: the first world's mesh
        assert traced and set(traced) == {rank}  # the chunk the backward keeps is this rank's


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_ddp_is_refused_by_name_like_fsdp(mode):
    from torch.nn.parallel import DistributedDataParallel

    with jl.fake_world(2):
        model = DistributedDataParallel(nn.Linear(4, 4))
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(UnsupportedWrapperError, match="DistributedDataParallel.*ddp.module"):
            jl.trace(model, lambda m, x: m(x).sum(), {"x": torch.randn(2, 4)}, mode=mode)
        for k, v in model.state_dict().items():
            assert torch.equal(v, before[k])


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_a_pipeline_schedule_inside_train_fn_is_refused_by_name(mode):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    with jl.fake_world(1):
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
        stage = PipelineStage(model, 0, 1, torch.device("cpu"))
        schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=F.mse_loss)

        def step(model, x, y):
            losses = []
            schedule.step(x, target=y, losses=losses)  # the line the error names
            return sum(losses)

        with pytest.raises(UnsupportedWrapperError,
                           match=r"ScheduleGPipe.step\(\) at .*schedule.step\(x.*not traceable"
                                 r".*stage.submod") as info:
            jl.trace(model, step, {"x": torch.randn(4, 4), "y": torch.randn(4, 4)}, mode=mode)
    assert ".item()" not in str(info.value)
    assert ScheduleGPipe.step is not None and "refuse" not in ScheduleGPipe.step.__name__


class _PartialOut(nn.Module):
    """x @ w with w sharded on the contraction dim: the output is a Partial DTensor."""

    def __init__(self, mesh):
        super().__init__()
        from torch.distributed.tensor import Shard, distribute_tensor

        torch.manual_seed(0)
        self.w = nn.Parameter(distribute_tensor(torch.randn(16, 8), mesh, [Shard(0)]))

    def forward(self, x):
        from torch.distributed.tensor import DTensor, Replicate, Shard

        xs = DTensor.from_local(x, self.w.device_mesh, [Replicate()])
        return xs.redistribute(placements=[Shard(1)]) @ self.w


def test_a_loss_from_a_partial_dtensor_gets_the_partial_hint_and_its_advice_works():
    from torch.distributed.tensor import Partial

    inputs = {"x": torch.randn(4, 16, generator=torch.Generator().manual_seed(1))}
    with jl.fake_world(4) as world:
        assert _PartialOut(world.mesh)(**inputs).placements == (Partial(),)
        with pytest.raises(jl.errors.GradientLostError) as info:
            jl.trace(_PartialOut(world.mesh), lambda m, x: m(x).pow(2).mean(), inputs)
        with world.all_ranks():
            every_rank = _PartialOut(world.mesh)
        advised = jl.trace_ranks(every_rank,  # what the message advises
                                 lambda m, x: m(x).full_tensor().pow(2).mean(), inputs)
        result = jl.run_all_ranks(advised, every_rank, inputs)
    text = str(info.value)
    assert "all_reduce" in text and "Partial" in text and "full_tensor()" in text
    assert "meta" not in text and "cross_entropy" not in text  # the hint for another cause
    torch.manual_seed(0)
    w = torch.randn(16, 8).requires_grad_()
    loss = (inputs["x"] @ w).pow(2).mean()  # one device
    loss.backward()
    for rank in range(4):
        torch.testing.assert_close(result.loss[rank], loss.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(result.grads["w"], w.grad, rtol=1e-5, atol=1e-6)


def test_a_symbolic_rank_read_outside_all_ranks_does_not_say_to_leave_all_ranks():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from jointlab.runtime.rank_reads import _plain

    sym = ShapeEnv().create_unbacked_symint()  # what a compile-on-one-rank read gives
    with pytest.raises(UnsupportedWrapperError, match="symbolic int") as info:
        _plain(sym)
    assert "outside world.all_ranks()" not in str(info.value)  # the user is already outside
    with jl.fake_world(2) as world, world.all_ranks():
        with pytest.raises(UnsupportedWrapperError, match=r"trace outside world.all_ranks\(\)"):
            _plain(sym)


class _OddRanksScale(nn.Module):
    """Replicated weights, same shapes on every rank; odd ranks scale: other graphs."""

    def __init__(self, mesh):
        super().__init__()
        from torch.distributed.tensor import Replicate, distribute_tensor

        torch.manual_seed(0)
        self.w = nn.Parameter(distribute_tensor(torch.randn(16, 16), mesh, [Replicate()]))

    def forward(self, x):
        h = x @ self.w.to_local()
        return h * 3 if dist.get_rank() % 2 else h


def test_collectives_rank_classes_split_ranks_whose_graphs_differ_with_the_same_shapes():
    def step(m, x):
        return funcol.all_reduce(m(x), "sum", dist.group.WORLD).pow(2).mean()

    inputs = {"x": torch.randn(4, 16)}
    with jl.fake_world(4) as world:
        joint = jl.trace(_OddRanksScale(world.mesh), step, inputs)
        with world.all_ranks():
            every_rank = _OddRanksScale(world.mesh)
        graphs = jl.trace_ranks(every_rank, step, inputs)
    assert joint.runtime.rank_classes == ((0, 1, 2, 3),)  # the shapes alone
    ops = {r: [_op(n) for n in graphs[r].graph.nodes] for r in (0, 1)}
    assert ops[0] != ops[1]  # the reference: rank 1's graph has the scaling, rank 0's not
    classes = collectives(joint).attrs["rank_classes"]
    assert sorted(r for cls in classes for r in cls) == [0, 1, 2, 3]
    assert not any({0, 1} <= set(cls) for cls in classes)  # was ((0, 1, 2, 3),)
    for cls in classes:  # never coarser than the graphs trace_ranks traced per class
        assert any(set(cls) <= set(traced) for traced in graphs.classes)


def _op(node):
    return str(node.target) if node.op == "call_function" else node.op

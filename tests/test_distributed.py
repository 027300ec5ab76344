"""Distributed graphs on a fake world: functional collectives in the memory picture."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab.analysis.distributed import collectives
from jointlab.errors import UnsupportedWrapperError
from tests.util import assert_unchanged, deep_state

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


def test_fake_world_builds_a_mesh_and_dtensor_state_is_refused():
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    with jl.fake_world(8, mesh={"dp": 4, "tp": 2}) as world:
        assert dist.get_world_size() == 8 and world.mesh.mesh_dim_names == ("dp", "tp")
        torch.manual_seed(0)
        model = AllReduceMLP(collective=False)
        parallelize_module(model, world.mesh["tp"], {"fc1": ColwiseParallel()})
        inputs = {"x": torch.randn(8, 16), "y": torch.randn(8, 16)}
        before = deep_state(model)
        with pytest.raises(UnsupportedWrapperError, match="'fc1.weight' is a DTensor"):
            jl.trace(model, _step, inputs)
        assert_unchanged(before, model)
    assert not dist.is_initialized()

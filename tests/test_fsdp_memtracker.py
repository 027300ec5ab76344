"""jointlab's per-rank memory of a SimpleFSDP-style trace against FSDP2's FSDPMemTracker.

The reference is torch's own ``FSDPMemTracker`` on an eager ``fully_shard`` step of
the same model and mesh size (fake world, CPU); jointlab's side is the prediction of
the SimpleFSDP-style trace (DTensor parameters that all-gather in the forward).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab import torch_compat
from jointlab.errors import MemoryQueryError, UnsupportedTorchError
from tests.fixtures import real
from tests.test_distributed import _simple_fsdp
from tests.util import NEEDS_DISTRIBUTED_TORCH, assert_unchanged, deep_state

pytestmark = NEEDS_DISTRIBUTED_TORCH

pytest.importorskip("torch.distributed.fsdp")

STATE_ROWS = ["sharded param (storage)", "sharded param (shards)", "sharded grad (storage)",
              "sharded grad (shards)", "buffer", "input"]


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 6), nn.Linear(6, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


def _step(model, x, y):
    return F.mse_loss(model(x), y)


def _inputs():
    gen = torch.Generator().manual_seed(1)
    return {"x": torch.randn(8, 16, generator=gen), "y": torch.randn(8, 16, generator=gen)}


def _two_layer():
    torch.manual_seed(0)
    return TwoLayer()


def _fully_shard(model, mesh, blocks):
    from torch.distributed.fsdp import fully_shard

    for block in blocks(model):
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _both(world, ref, train_fn, inputs, blocks):
    """FSDPMemTracker's figures of the fully_shard-ed copy, and the SimpleFSDP trace."""
    fsdp = _fully_shard(copy.deepcopy(ref), world.mesh, blocks)
    before = deep_state(fsdp)
    measured = jl.track_fsdp_step(fsdp, train_fn, inputs)
    assert_unchanged(before, fsdp)
    joint = jl.trace(_simple_fsdp(copy.deepcopy(ref), world.mesh), train_fn, inputs)
    return fsdp, measured, joint


def _tracker_sharded_param_bytes(fsdp):
    # Reference independent of fsdp_check: a fresh tracker's own category total before a step.
    tracker = torch_compat.fsdp_mem_tracker()(fsdp)
    with tracker:
        snap = tracker.get_tracker_snapshot()
    (per_dev,) = snap.values()
    return {str(getattr(k, "value", k)): v for k, v in per_dev.items()}["Sharded Param"]


def test_two_layer_local_param_and_grad_bytes_agree_with_fsdp_memtracker():
    with jl.fake_world(4) as world:
        fsdp, measured, joint = _both(world, _two_layer(), _step, _inputs(),
                                      lambda m: [m.fc1, m.fc2])
        table = jl.fsdp_memory_check(joint, measured)
        tracker_params = _tracker_sharded_param_bytes(fsdp)
    # rank 0 of 4: chunks of 6 rows are 2 rows, of 16 rows 4 rows: (2*16 + 2 + 4*6 + 4) * 4 B
    assert tracker_params == 248 == measured.end["Sharded Param"]
    assert table.loc["sharded param (storage)", "jointlab"] == tracker_params
    assert table.loc["sharded grad (storage)", "fsdp2"] == measured.end["Sharded Grad"] == 248
    assert table.loc[STATE_ROWS, "matches"].all(), table
    assert (table.loc[STATE_ROWS, "difference"] == 0).all()
    assert table.loc["input", "jointlab"] == 2 * 8 * 16 * 4
    assert table.attrs["rank"] == 0


def test_kept_forward_values_agree_and_the_gathered_weights_differ_by_design():
    with jl.fake_world(4) as world:
        _, measured, joint = _both(world, _two_layer(), _step, _inputs(),
                                   lambda m: [m.fc1, m.fc2])
        table = jl.fsdp_memory_check(joint, measured)
    kept = table.loc["forward values kept for backward"]
    # eager keeps relu's output (8x6), fc2's output (8x16) and mse_loss's input-sized result
    assert kept.jointlab == kept.fsdp2 == measured.boundary["Activation"] == (48 + 128 + 128) * 4
    gathered = table.loc["all-gathered weights at boundary"]
    # SimpleFSDP keeps fc2's gathered 16x6 weight for the input gradient; FSDP2 resharded it
    assert (gathered.jointlab, gathered.fsdp2) == (16 * 6 * 4, 0)
    assert not gathered.comparable and not gathered.matches
    peak = table.loc["peak"]
    assert peak.fsdp2 == measured.peak["Total"] and not peak.comparable
    assert peak.jointlab == joint.memory().peak_bytes
    assert (table.matches == (table.jointlab == table.fsdp2)).all()


def test_uneven_last_rank_shows_fsdp2s_padded_shard_storage():
    with jl.fake_world(4, rank=3) as world:
        fsdp, measured, joint = _both(world, _two_layer(), _step, _inputs(),
                                      lambda m: [m.fc1, m.fc2])
        table = jl.fsdp_memory_check(joint, measured)
        local = sum(p.to_local().numel() * 4 for p in fsdp.parameters())
    # torch.chunk gives rank 3 no row of fc1 (6 rows: 2, 2, 2, 0): shards 4*6 + 4 floats
    assert local == (4 * 6 + 4) * 4 == table.loc["sharded param (shards)", "jointlab"]
    assert table.loc["sharded param (shards)", "matches"]
    row = table.loc["sharded param (storage)"]
    # FSDP2 pads fc1's empty shards to ceil(6 / 4) = 2 rows of storage: 2*16 + 2 floats;
    # so does distribute_tensor for the SimpleFSDP trace, whose prediction counts it
    assert (row.jointlab, row.fsdp2) == (112 + (2 * 16 + 2) * 4, 248)
    assert row.matches
    assert table.loc["sharded grad (storage)", "matches"]


def test_hf_llama_state_bytes_agree_with_fsdp_memtracker():
    fx = real.get("hf_llama")
    ref, inputs = fx.make_model(), fx.make_inputs(2)
    with jl.fake_world(4) as world:
        _, measured, joint = _both(world, ref, fx.train_fn, inputs,
                                   lambda m: list(m.model.layers))
        table = jl.fsdp_memory_check(joint, measured)
    params = sum(p.numel() for p in ref.parameters())
    assert table.loc["sharded param (shards)", "jointlab"] < params * 4  # local, not global
    assert table.loc[STATE_ROWS, "matches"].all(), table
    assert table.loc["buffer", "jointlab"] == sum(b.numel() * 4 for b in ref.buffers())  # RoPE
    assert (table.matches == (table.jointlab == table.fsdp2)).all()


def test_track_fsdp_step_refuses_a_root_that_is_not_fully_shard_ed():
    with jl.fake_world(4) as world:
        model = _two_layer()
        from torch.distributed.fsdp import fully_shard

        fully_shard(model.fc1, mesh=world.mesh)
        before = deep_state(model)
        with pytest.raises(MemoryQueryError, match="root module .TwoLayer. is not fully_shard"):
            jl.track_fsdp_step(model, _step, _inputs())
        assert_unchanged(before, model)


def test_check_refuses_a_graph_without_shards_and_another_rank():
    ref, inputs = _two_layer(), _inputs()
    with jl.fake_world(4) as world:
        measured = jl.track_fsdp_step(
            _fully_shard(copy.deepcopy(ref), world.mesh, lambda m: [m.fc1, m.fc2]), _step, inputs)
        plain = jl.trace(copy.deepcopy(ref), _step, inputs)
        with pytest.raises(MemoryQueryError, match="not traced from DTensor parameters"):
            jl.fsdp_memory_check(plain, measured)
    with jl.fake_world(4, rank=3) as world:
        joint = jl.trace(_simple_fsdp(copy.deepcopy(ref), world.mesh), _step, inputs)
        with pytest.raises(MemoryQueryError, match=r"traced as rank \[3\].*ran as rank 0 of 4"):
            jl.fsdp_memory_check(joint, measured)


def test_a_torch_without_fsdp_memtracker_is_a_clear_error(monkeypatch):
    module = torch_compat.torch_module("torch.distributed._tools.fsdp2_mem_tracker", "test")
    monkeypatch.delattr(module, "FSDPMemTracker")
    with pytest.raises(UnsupportedTorchError, match="fsdp2_mem_tracker.FSDPMemTracker"):
        torch_compat.fsdp_mem_tracker()

"""Expert parallel in the fake world: collectives of plain tensors under ``world.all_ranks()``.

torch's ``LocalTensorMode`` ran a collective whose tensors were all plain (made outside
the mode) once and gave every rank that one result, so an ``all_to_all_single`` of the
step's input sent rank 0's chunks to all ranks and ``run_all_ranks`` agreed with an
eager step that was wrong the same way. References: all_to_all's definition computed
by hand with plain autograd, and (``slow``) a real 4-process gloo job.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab.errors import UnsupportedWrapperError
from tests.util import NEEDS_DISTRIBUTED_TORCH

pytestmark = NEEDS_DISTRIBUTED_TORCH

funcol = pytest.importorskip("torch.distributed._functional_collectives")
WORLD = 4


class MoE(nn.Module):
    """The input's tokens go to one expert per rank and come back (all_to_all both ways)."""

    def __init__(self, mesh=None, rank=None):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(16, 16)
        experts = torch.randn(WORLD, 16, 16) / 4
        if mesh is not None:
            from torch.distributed.tensor import Shard, distribute_tensor

            self.experts = nn.Parameter(distribute_tensor(experts, mesh, [Shard(0)]))
        else:  # a real job's rank: its own expert
            self.experts = nn.Parameter(experts[rank:rank + 1].clone())

    def forward(self, x):
        h = funcol.all_to_all_single_autograd(x, None, None, dist.group.WORLD)
        w = self.experts.to_local() if hasattr(self.experts, "to_local") else self.experts
        h = torch.relu(h @ w[0])
        h = funcol.all_to_all_single_autograd(h, None, None, dist.group.WORLD)
        return self.fc(h)


def _step(model, x, y):
    return F.mse_loss(model(x), y)


def _inputs():
    gen = torch.Generator().manual_seed(1)
    return {"x": torch.randn(8, 16, generator=gen), "y": torch.randn(8, 16, generator=gen)}


def _all_to_all(per_rank):
    """all_to_all_single by its definition: rank r gets chunk r of every rank, in rank order."""
    chunks = [t.chunk(WORLD) for t in per_rank]
    return [torch.cat([chunks[src][dst] for src in range(WORLD)]) for dst in range(WORLD)]


def _by_hand():
    """Every rank's loss and gradients of a real job, in one process with plain autograd."""
    models = [MoE(rank=r) for r in range(WORLD)]
    inputs = _inputs()
    h = _all_to_all([inputs["x"]] * WORLD)
    h = _all_to_all([torch.relu(h[r] @ models[r].experts[0]) for r in range(WORLD)])
    losses = [F.mse_loss(models[r].fc(h[r]), inputs["y"]) for r in range(WORLD)]
    sum(losses).backward()  # each rank's backward reaches the others' experts through a2a
    return {r: (losses[r].detach(), {n: p.grad for n, p in models[r].named_parameters()})
            for r in range(WORLD)}


def test_all_to_all_of_a_plain_tensor_gives_each_rank_its_own_chunks():
    x = torch.arange(8.0).reshape(8, 1)
    with jl.fake_world(WORLD) as world, world.all_ranks():
        out = funcol.all_to_all_single_autograd(x, None, None, dist.group.WORLD).wait()
        got = jl.torch_compat.per_rank_values(out)
    want = _all_to_all([x] * WORLD)  # rank r: four copies of rows 2r, 2r+1
    assert sorted(got) == list(range(WORLD))
    for r in range(WORLD):
        torch.testing.assert_close(got[r], want[r], rtol=0, atol=0)


def test_in_place_collectives_of_plain_tensors_write_back_or_refuse():
    x, plain_out = torch.arange(8.0).reshape(8, 1), torch.zeros(8, 1)
    with jl.fake_world(WORLD) as world, world.all_ranks():
        y = x.clone()
        dist.all_reduce(y)  # the same on every rank: written back
        out = torch.zeros(8, 1)  # made inside: a LocalTensor
        with pytest.raises(UnsupportedWrapperError, match="alltoall_base_"):
            dist.all_to_all_single(plain_out, x)  # differs per rank: not one plain value
        dist.all_to_all_single(out, x)  # a LocalTensor output holds each rank's value
        got = jl.torch_compat.per_rank_values(out)
    torch.testing.assert_close(y, x * WORLD, rtol=0, atol=0)
    want = _all_to_all([x] * WORLD)
    for r in range(WORLD):
        torch.testing.assert_close(got[r], want[r], rtol=0, atol=0)


def _run_all_ranks(mode):
    with jl.fake_world(WORLD) as world:
        joint = jl.trace(MoE(world.mesh), _step, _inputs(), mode=mode)
        with world.all_ranks():
            every_rank = MoE(world.mesh)
        return jl.run_all_ranks(joint, every_rank, _inputs())


def _assert_like(result, reference):
    assert result.matches_eager == dict.fromkeys(range(WORLD), True)
    for r, (loss, grads) in reference.items():
        torch.testing.assert_close(result.loss[r], loss, rtol=0, atol=1e-6)
        for name, grad in grads.items():
            torch.testing.assert_close(result.local_grads[name][r], grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_expert_parallel_run_all_ranks_matches_all_to_all_by_hand(mode):
    _assert_like(_run_all_ranks(mode), _by_hand())


def _gloo_rank(rank, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        model = MoE(rank=rank)
        loss = _step(model, **_inputs())
        loss.backward()
        queue.put((rank, loss.item(), {n: p.grad.tolist() for n, p in model.named_parameters()}))
    finally:
        dist.destroy_process_group()


def _gloo_job():
    """Each rank's loss and gradients from a real 4-process gloo job (bounded: 120 s)."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_gloo_rank, args=(r, port, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        got = [queue.get(timeout=120) for _ in range(WORLD)]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    return {r: (torch.tensor(loss), {n: torch.tensor(g) for n, g in grads.items()})
            for r, loss, grads in got}


@pytest.mark.slow
def test_expert_parallel_run_all_ranks_matches_a_real_gloo_job():
    real = _gloo_job()
    _assert_like(_run_all_ranks("make_fx"), real)
    by_hand = _by_hand()
    for r in range(WORLD):  # the hand reference is that job's arithmetic
        torch.testing.assert_close(real[r][0], by_hand[r][0], rtol=0, atol=1e-6)

"""The plan check (``jl.run_all_ranks(..., reference=)``) against one device's eager step.

A tensor-parallel plan that lets each rank's heads read a plain shared rotary
key (DeepSeek-style MLA) gives ``wkv_a.weight`` a wrong gradient that every
rank's own eager step shares (``matches_eager`` is True); the check must name
it, with the relative error an independent one-device computation gives, and
pass the fixed plan, a data-parallel plan and a sequence-parallel one.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab.errors import StateMismatchError
from jointlab.models import lm_inputs, lm_train_fn, make_tiny_deepseek
from tests.util import NEEDS_DISTRIBUTED_TORCH, assert_unchanged, deep_state

pytestmark = NEEDS_DISTRIBUTED_TORCH


def mla_plan(fixed: bool, n_layer: int = 1) -> dict:
    """Megatron TP of the tiny DeepSeek; ``fixed`` runs attention on DTensors.

    Without the ``attn.core`` entry each rank's local heads read the plain shared
    rotary key, so its gradient sums only those heads (the planted bug).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInputOutput,
        RowwiseParallel,
    )

    plan = {}
    for i in range(n_layer):
        layer = f"layers.{i}."
        plan.update({layer + "attn.wq": ColwiseParallel(), layer + "attn.wkv_b": ColwiseParallel(),
                     layer + "attn.wo": RowwiseParallel(), layer + "w1": ColwiseParallel(),
                     layer + "w3": ColwiseParallel(), layer + "w2": RowwiseParallel()})
        if fixed:  # q, k_nope, v sharded on heads; the shared key a Replicate DTensor
            heads = (Shard(2), Shard(2), Shard(2), Replicate())
            plan[layer + "attn.core"] = PrepareModuleInputOutput(
                input_layouts=heads, desired_input_layouts=heads,
                output_layouts=Shard(2), desired_output_layouts=Shard(2))
    return plan


def _check(reference, shard, train_fn, inputs, world_size, mesh=None, draws=False):
    """Shard ``reference`` inside ``world.all_ranks()``, trace every rank, run the check.

    The reference is left as it was (and the global RNG, unless the graphs ``draws``)."""
    with jl.fake_world(world_size, mesh=mesh) as world:
        with world.all_ranks():
            every_rank = shard(copy.deepcopy(reference), world.mesh)
        graphs = jl.trace_ranks(every_rank, train_fn, inputs)
        before = deep_state(reference)
        result = jl.run_all_ranks(graphs, every_rank, inputs, reference=reference)
        if draws:  # the graphs' own run draws from the global RNG
            before["rng"] = torch.get_rng_state()
        assert_unchanged(before, reference)  # the reference steps run on copies
    return result


def _tp(plan):
    from torch.distributed.tensor.parallel import parallelize_module

    return lambda model, mesh: parallelize_module(model, mesh, plan)


def _one_device_buggy_grad(reference, inputs, rank, world_size):
    """wkv_a.weight's gradient as rank ``rank`` of the buggy plan gets it, on one device:
    the shared key's gradient summed over that rank's heads only (a hook masks the rest)."""
    model = copy.deepcopy(reference)

    def local_heads_only(_module, args):
        q, k_nope, v, k_pe = args
        heads = q.shape[2]
        k = k_pe.expand(-1, -1, heads, -1)
        mask = torch.zeros(heads)
        per = heads // world_size
        mask[rank * per:(rank + 1) * per] = 1.0
        return q, k_nope, v, k.detach() + (k - k.detach()) * mask[:, None]

    model.layers[0].attn.core.register_forward_pre_hook(local_heads_only)
    loss = lm_train_fn(model, **inputs)
    return torch.autograd.grad(loss, model.layers[0].attn.wkv_a.weight)[0]


def test_plan_check_names_the_shared_rotary_key_bug_that_eager_shares():
    reference, inputs = make_tiny_deepseek(n_layer=1), lm_inputs(2, 64, 8)
    result = _check(reference, _tp(mla_plan(fixed=False)), lm_train_fn, inputs, 2)
    assert result.matches_eager == {0: True, 1: True}  # each rank's eager shares the bug
    plan = result.plan
    assert plan.ok is False and plan.verdict == "DIFFERS from one device"
    assert plan.first.param == "layers.0.attn.wkv_a.weight"
    assert plan.first.module == "layers.0.attn.wkv_a"
    # Reference: one device, plain torch: the true gradient and each rank's masked one.
    want = torch.autograd.grad(lm_train_fn(reference, **inputs),
                               reference.layers[0].attn.wkv_a.weight)[0]
    rel = {r: float((_one_device_buggy_grad(reference, inputs, r, 2) - want).norm()
                    / want.norm()) for r in (0, 1)}
    assert min(rel.values()) > 0.01  # far beyond rounding
    assert plan.first.rel_err == pytest.approx(max(rel.values()), rel=1e-4)
    assert plan.first.ranks == (0, 1)
    # The loss is right on every rank: only the backward is wrong.
    assert plan.loss["ok"].tolist() == [True, True]
    text = repr(result)
    assert "first differing gradient: layers.0.attn.wkv_a.weight" in text
    assert "module 'layers.0.attn.wkv_a'" in text


def test_plan_check_passes_the_fixed_plan():
    reference, inputs = make_tiny_deepseek(n_layer=1), lm_inputs(2, 64, 8)
    result = _check(reference, _tp(mla_plan(fixed=True)), lm_train_fn, inputs, 2)
    assert result.plan.ok is True, repr(result.plan)
    assert result.plan.verdict == "matches one device" and result.plan.first is None
    loss = lm_train_fn(reference, **inputs)
    want = dict(zip(dict(reference.named_parameters()),
                    torch.autograd.grad(loss, list(reference.parameters()))))
    for name, g in result.grads.items():  # the gathered gradients really are one device's
        torch.testing.assert_close(g, want[name], rtol=0, atol=1e-6)
    assert set(result.plan.grads["param"]) == set(want)


class _Replicated(nn.Module):
    """DDP as a parametrisation: a Replicate DTensor used locally, its gradient averaged."""

    def forward(self, p):
        from torch.distributed.tensor import Partial

        return p.to_local(grad_placements=[Partial("avg")])


def _data_parallel(model, mesh):
    from torch.distributed.tensor import Replicate, distribute_tensor
    from torch.nn.utils import parametrize

    for mod in list(model.modules()):
        for name, p in list(mod.named_parameters(recurse=False)):
            every_rank = torch.empty(p.shape).copy_(p.detach())  # made in LocalTensorMode
            mod.register_parameter(name, nn.Parameter(distribute_tensor(every_rank, mesh,
                                                                         [Replicate()])))
            parametrize.register_parametrization(mod, name, _Replicated(), unsafe=True)
    return model


def _mse_step(model, x, y):
    return F.mse_loss(model(x), y)


def test_plan_check_passes_plain_data_parallel():
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 16))
    gen = torch.Generator().manual_seed(1)
    inputs = {"x": torch.randn(8, 16, generator=gen), "y": torch.randn(8, 16, generator=gen)}
    result = _check(reference, _data_parallel, _mse_step, inputs, 4)
    assert result.plan.ok is True, repr(result.plan)
    assert set(result.plan.grads["param"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert (result.plan.grads["placement"] == "R").all()


def test_plan_check_passes_tensor_and_sequence_parallel():
    from tests.test_distributed import _TinyTitan, _titan_plan, _titan_step

    torch.manual_seed(0)
    reference, gen = _TinyTitan(), torch.Generator().manual_seed(1)
    inputs = {"tok": torch.randint(0, 32, (2, 8), generator=gen),
              "y": torch.randint(0, 32, (2, 8), generator=gen)}
    result = _check(reference, _tp(_titan_plan("sequence_parallel")), _titan_step, inputs, 4)
    assert result.rank_classes == ((0,), (1,), (2,), (3,))  # torch reads the coordinate
    assert result.plan.ok is True, repr(result.plan)


def test_float32_rounding_of_another_summation_order_is_no_mismatch():
    from jointlab.analysis.compare.judge import Tolerance, close
    from jointlab.analysis.plan_check import _judge

    gen = torch.Generator().manual_seed(0)
    terms = torch.randn(64, 4096, generator=gen, dtype=torch.float64) * 1e3
    # Sums that mostly cancel: results around 5, terms around 1e3 (float32 rounds at ~1e-3).
    terms += 5 * torch.randn(64, 1, generator=gen, dtype=torch.float64) / 4096 \
        - terms.mean(1, keepdim=True)
    exact = terms.sum(1)
    one_device = terms.float().sum(1)
    four_ranks = sum(c.float().sum(1) for c in terms.chunk(4, dim=1))  # partial sums, reduced
    assert not close(four_ranks, one_device, Tolerance())  # beyond float32 tolerance...
    ok, rel, _ = _judge(four_ranks, one_device, exact, Tolerance())
    assert ok is True, rel  # ...but no farther from float64 than one device is
    wrong = four_ranks + 0.05 * exact.float()  # a bug: 5% off
    assert _judge(wrong, one_device, exact, Tolerance())[0] is False
    assert _judge(four_ranks, one_device, None, Tolerance())[0] is None  # no float64: not known


def test_plan_check_says_not_known_when_the_step_draws_random_numbers():
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.5), nn.Linear(32, 16))
    gen = torch.Generator().manual_seed(1)
    inputs = {"x": torch.randn(8, 16, generator=gen), "y": torch.randn(8, 16, generator=gen)}
    result = _check(reference, _data_parallel, _mse_step, inputs, 2, draws=True)
    assert result.plan.ok is None and result.plan.verdict == "not known"
    assert result.plan.first is None
    assert any("draws random numbers" in n for n in result.plan.notes)


def test_plan_check_refuses_a_reference_that_is_not_the_unsharded_model():
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 16))
    gen = torch.Generator().manual_seed(1)
    inputs = {"x": torch.randn(8, 16, generator=gen), "y": torch.randn(8, 16, generator=gen)}
    with jl.fake_world(2) as world:
        with world.all_ranks():
            every_rank = _data_parallel(copy.deepcopy(reference), world.mesh)
        graphs = jl.trace_ranks(every_rank, _mse_step, inputs)
        with pytest.raises(StateMismatchError, match=r"no parameter \['0.bias'"):
            jl.run_all_ranks(graphs, every_rank, inputs,
                             reference=nn.Sequential(nn.Linear(16, 32, bias=False)))


def test_plan_check_runs_on_saved_graphs_as_gathered_from_a_real_job(tmp_path):
    """jl.gather_ranks hands rank 0 loaded graphs (no train_fn): the same check, train_fn=."""
    reference, inputs = make_tiny_deepseek(n_layer=1), lm_inputs(2, 64, 8)
    with jl.fake_world(2) as world:
        with world.all_ranks():
            every_rank = _tp(mla_plan(fixed=False))(copy.deepcopy(reference), world.mesh)
        graphs = jl.trace_ranks(every_rank, lm_train_fn, inputs)
        live = jl.run_all_ranks(graphs, every_rank, inputs, reference=reference)
        loaded = {}
        for cls, graph in graphs.graphs.items():
            graph.save(tmp_path / f"{cls[0]}.jlg")
            loaded[cls] = jl.load(tmp_path / f"{cls[0]}.jlg")
        gathered = jl.RankGraphs(loaded, graphs.world_size)
        with pytest.raises(StateMismatchError, match="pass train_fn="):
            jl.run_all_ranks(gathered, every_rank, inputs, reference=reference)
        result = jl.run_all_ranks(gathered, every_rank, inputs, reference=reference,
                                  train_fn=lm_train_fn)
    assert result.matches_eager == {0: True, 1: True}
    assert result.plan.first == live.plan.first
    assert result.plan.first.param == "layers.0.attn.wkv_a.weight"

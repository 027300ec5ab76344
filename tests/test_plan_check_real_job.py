"""The plan check on a real job's graphs: two gloo processes, gathered to rank 0.

Each process of a ``torch.distributed.run`` job traces the tiny DeepSeek under
the planted-bug plan and the fixed one and calls ``jl.gather_ranks``
(:mod:`tests.real_job.plan_worker`). Here the gathered graphs run every rank in
``jl.fake_world(2)`` with ``reference=``: the check must flag the planted bug with
the error a one-device computation gives, and pass the fixed plan, whose gathered
gradients are one device's. The job is bounded by a hard timeout that kills its
whole process group. About a minute on two cores, so marked slow (``make fuzz``).
"""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch

import jointlab as jl
from jointlab.models import lm_inputs, lm_train_fn, make_tiny_deepseek
from tests.real_job.launch import run_real_job
from tests.test_plan_check import _one_device_buggy_grad, _tp, mla_plan
from tests.util import NEEDS_DISTRIBUTED_TORCH

pytestmark = [NEEDS_DISTRIBUTED_TORCH, pytest.mark.slow]

WORLD = 2
JOB_TIMEOUT_S = 150


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> str:
    """Run the real job once; the folder holding rank 0's gathered graphs."""
    out = str(tmp_path_factory.mktemp("plan_job"))
    return run_real_job("plan_worker.py", out, WORLD, JOB_TIMEOUT_S)


def _check(job: str, name: str):
    """The plan check of the real job's gathered graphs, run in a fake world of its size."""
    with open(os.path.join(job, f"{name}.json")) as f:
        classes = [tuple(c) for c in json.load(f)["classes"]]
    gathered = jl.RankGraphs({c: jl.load(os.path.join(job, f"{name}_class{c[0]}.jlg"))
                              for c in classes}, WORLD)
    reference, inputs = make_tiny_deepseek(n_layer=1), lm_inputs(2, 64, 8)
    with jl.fake_world(WORLD, mesh={"tp": WORLD}) as world:  # the job's mesh
        with world.all_ranks():
            every_rank = _tp(mla_plan(name == "fixed"))(copy.deepcopy(reference), world.mesh)
        result = jl.run_all_ranks(gathered, every_rank, inputs, reference=reference,
                                  train_fn=lm_train_fn)
    return result, reference, inputs


def test_the_plan_check_flags_the_planted_bug_in_a_real_jobs_graphs(job):
    result, reference, inputs = _check(job, "buggy")
    assert result.matches_eager == {0: True, 1: True}
    assert result.plan.ok is False
    assert result.plan.first.param == "layers.0.attn.wkv_a.weight"
    assert result.plan.first.module == "layers.0.attn.wkv_a"
    want = torch.autograd.grad(lm_train_fn(reference, **inputs),
                               reference.layers[0].attn.wkv_a.weight)[0]
    rel = [float((_one_device_buggy_grad(reference, inputs, r, WORLD) - want).norm()
                 / want.norm()) for r in range(WORLD)]
    assert result.plan.first.rel_err == pytest.approx(max(rel), rel=1e-4)


def test_the_plan_check_passes_the_fixed_plan_in_a_real_jobs_graphs(job):
    result, reference, inputs = _check(job, "fixed")
    assert len(result.rank_classes) == WORLD  # torch's redistribute reads the coordinate
    assert result.plan.ok is True, repr(result.plan)
    loss = lm_train_fn(reference, **inputs)
    want = dict(zip(dict(reference.named_parameters()),
                    torch.autograd.grad(loss, list(reference.parameters()))))
    for name, g in result.grads.items():
        torch.testing.assert_close(g, want[name], rtol=0, atol=1e-6)

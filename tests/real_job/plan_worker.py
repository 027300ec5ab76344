"""One process of a real job for the plan check: trace the tiny DeepSeek under both plans.

Run by torch's launcher (``python -m torch.distributed.run --nproc-per-node N
tests/real_job/plan_worker.py OUT``). Each process shards the model with the
planted-bug plan and the fixed one (:func:`tests.test_plan_check.mla_plan`),
traces its own graph and calls ``jl.gather_ranks``; rank 0 saves each rank
class's graph as ``OUT/<plan>_class<first rank>.jlg`` and the classes as
``OUT/<plan>.json``.
"""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jointlab as jl  # noqa: E402
from jointlab.models import lm_inputs, lm_train_fn, make_tiny_deepseek  # noqa: E402
from tests.test_plan_check import mla_plan  # noqa: E402


def main(out: str) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    for name in ("buggy", "fixed"):
        model = parallelize_module(make_tiny_deepseek(n_layer=1), mesh, mla_plan(name == "fixed"))
        gathered = jl.gather_ranks(jl.trace(model, lm_train_fn, lm_inputs(2, 64, 8)))
        if gathered is None:
            continue
        for cls, graph in gathered.graphs.items():
            graph.save(os.path.join(out, f"{name}_class{cls[0]}.jlg"))
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump({"classes": [list(c) for c in gathered.classes],
                       "world_size": gathered.world_size}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

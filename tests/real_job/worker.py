"""One process of a real job: trace each kind in each mode, gather every rank's graph on rank 0.

Run by torch's launcher (``python -m torch.distributed.run --nproc-per-node N
tests/real_job/worker.py OUT``). Rank 0 saves each rank's gathered graph as
``OUT/<kind>_<mode>_rank<r>.jlg`` and writes ``OUT/<kind>_<mode>.json``: the gathered classes,
``jl.rank_table`` of the gathered graphs,
what every other rank got back (None), and per rank the trace time, one gloo eager
step's time, the collectives and the predicted peak of its own graph.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jointlab as jl  # noqa: E402
from jointlab.analysis.distributed import collectives  # noqa: E402
from jointlab.analysis.memory.profile import memory_profile  # noqa: E402
from tests.real_job.models import CASES, inputs, sharded, step  # noqa: E402


def _eager_seconds(model, data) -> float:
    step(model, **data).backward()  # warm
    model.zero_grad()
    t0 = time.perf_counter()
    step(model, **data).backward()
    model.zero_grad()
    return time.perf_counter() - t0


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (size,), mesh_dim_names=("world",))
    for kind, mode in CASES:
        model, data, name = sharded(kind, mesh), inputs(), f"{kind}_{mode}"
        t0 = time.perf_counter()
        joint = jl.trace(model, step, data, mode=mode)
        trace_s = time.perf_counter() - t0
        result = joint.run(model, data)
        eager = step(model, **data)
        coll = collectives(joint)
        mine = {"rank": rank, "trace_s": trace_s, "eager_s": _eager_seconds(model, data),
                "run_matches_eager": bool(torch.equal(result.loss, eager.detach())),
                "collectives": len(coll), "comm_bytes": int(coll.bytes.sum()),
                "peak_bytes": int(memory_profile(joint).peak_bytes)}
        figures = [None] * size
        dist.all_gather_object(figures, mine)  # small JSON-able dicts of numbers
        t0 = time.perf_counter()
        gathered = jl.gather_ranks(joint)
        gather_s = time.perf_counter() - t0
        if rank != 0:
            assert gathered is None, type(gathered)
            continue
        for r in range(size):
            gathered[r].save(os.path.join(out, f"{name}_rank{r}.jlg"))
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump({"classes": [list(c) for c in gathered.classes],
                       "world_size": gathered.world_size,
                       "type": type(gathered).__name__, "ranks": figures,
                       "gather_s": gather_s,
                       "table": jl.rank_table(gathered).drop(columns="shared_with")
                       .to_dict(orient="index")}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

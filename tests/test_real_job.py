"""A real multi-process job against the fake world: each rank's gathered graph is the fake's.

Two gloo processes on the CPU, started by torch's own launcher
(``torch.distributed.run --standalone``: it picks free ports), each trace the
models of :mod:`tests.real_job.models` with ``jl.trace`` and call
``jl.gather_ranks``; rank 0 saves each rank's gathered graph
(:mod:`tests.real_job.worker`). Here, the reference is ``jl.trace_ranks`` of
the same models in ``jl.fake_world(2)``: the same rank classes, and for every
rank the same graph (op sequence, arguments, shapes and dtypes, process groups
by mesh dimension), the same collectives and the same predicted peak. The job
runs once per test session, bounded by a hard timeout that kills the whole
process group, so a hang fails fast.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import pytest
import torch
import torch.fx as fx
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import jointlab as jl
from jointlab.analysis.distributed import collectives, group_dims
from jointlab.analysis.memory.profile import memory_profile
from jointlab.errors import StateMismatchError
from tests.real_job.launch import run_real_job
from tests.real_job.models import CASES, inputs, reference, sharded, step
from tests.util import NEEDS_DISTRIBUTED_TORCH

pytestmark = NEEDS_DISTRIBUTED_TORCH

WORLD = 2
JOB_TIMEOUT_S = 150


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> str:
    """Run the real job once; the folder holding rank 0's archives and figures."""
    out = str(tmp_path_factory.mktemp("real_job"))
    return run_real_job("worker.py", out, WORLD, JOB_TIMEOUT_S)


def _signature(joint: Any) -> list[tuple]:
    """Each node's op, target, arguments (nodes by name, groups by mesh dim), shape, dtype."""
    dims = group_dims(joint)

    def arg(a: Any) -> Any:
        if isinstance(a, fx.Node):
            return ("node", a.name)
        if isinstance(a, (list, tuple)):
            return tuple(arg(x) for x in a)
        if isinstance(a, str) and a in dims:
            return ("group", dims[a])
        return a

    out = []
    for node in joint.graph.nodes:
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        shapes = tuple((tuple(v.shape), v.dtype) for v in vals if isinstance(v, torch.Tensor))
        out.append((node.op, str(node.target), arg(node.args), arg(dict(node.kwargs)), shapes))
    return out


def _fake_world_graphs(kind: str, mode: str) -> jl.RankGraphs:
    with jl.fake_world(WORLD) as world:
        with world.all_ranks():
            every_rank = sharded(kind, world.mesh)
        return jl.trace_ranks(every_rank, step, inputs(), mode=mode)


def _loaded(job: str, name: str) -> dict[int, jl.JointGraph]:
    return {r: jl.load(os.path.join(job, f"{name}_rank{r}.jlg")) for r in range(WORLD)}


@pytest.mark.parametrize(("kind", "mode"), CASES)
def test_each_ranks_gathered_graph_is_the_fake_worlds_graph_of_that_rank(job, kind, mode):
    with open(os.path.join(job, f"{kind}_{mode}.json")) as f:
        report = json.load(f)
    fake = _fake_world_graphs(kind, mode)
    real = _loaded(job, f"{kind}_{mode}")
    assert report["type"] == "RankGraphs" and report["world_size"] == WORLD
    # The ranks share a graph in the real job exactly where the fake world says they do.
    assert [tuple(c) for c in report["classes"]] == list(fake.classes)
    for rank in range(WORLD):
        want, got = fake[rank], real[rank]
        assert _signature(got) == _signature(want), (kind, rank)
        cols = ["op", "phase", "module", "mesh_dim", "bytes"]
        assert collectives(got)[cols].equals(collectives(want)[cols]), (kind, rank)
        assert memory_profile(got).peak_bytes == memory_profile(want).peak_bytes
        # Each process's own run of its graph was its own eager step, bitwise.
        assert report["ranks"][rank]["run_matches_eager"] is True
        assert report["ranks"][rank]["collectives"] == len(collectives(want))
    # Rank 0's side-by-side table of the gathered graphs says what each rank's own graph
    # said in its own process, and what the fake world's table says.
    table, fake_table = report["table"], jl.rank_table(fake)
    for rank in range(WORLD):
        mine, row = report["ranks"][rank], table[str(rank)]
        for col in ("collectives", "comm_bytes", "peak_bytes"):
            assert row[col] == mine[col] == fake_table.loc[rank, col], (kind, rank, col)
    if kind == "uneven":  # 3 rows over 2 ranks: the two graphs differ, and the diff shows it
        assert len(jl.diff(real[0], real[1]).table) > 0


def test_a_gathered_graph_runs_only_in_a_world_of_its_size(job):
    graph = _loaded(job, "tp_make_fx")[0]
    with pytest.raises(StateMismatchError, match=r"2-rank world.*no process group"):
        graph.run(reference("tp"), inputs())
    with jl.fake_world(4, mesh={"dp": 2, "tp": 2}) as world:
        model = sharded("tp", world.mesh["tp"])
        with pytest.raises(StateMismatchError, match="this world has 4 ranks"):
            graph.run(model, inputs())
    with jl.fake_world(WORLD) as world:
        model = sharded("tp", world.mesh)
        want = jl.trace(model, step, inputs()).run(copy.deepcopy(model), inputs())
        got = graph.run(model, inputs())
    assert torch.equal(got.loss, want.loss)
    assert got.grads.keys() == want.grads.keys()
    for fqn, g in want.grads.items():
        assert got.grads[fqn].placements == g.placements
        assert torch.equal(got.grads[fqn].to_local(), g.to_local()), fqn


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_a_saved_dtensor_graph_loads_for_viewing_and_runs_in_its_world(tmp_path, mode):
    with jl.fake_world(WORLD) as world:
        model = sharded("tp", world.mesh)
        joint = jl.trace(model, step, inputs(), mode=mode)
        joint.save(tmp_path / "g.jlg")
        loaded = jl.load(tmp_path / "g.jlg")
        want, got = joint.run(model, inputs()), loaded.run(model, inputs())
        # Another plan of the same model is refused, not fed the wrong shards.
        other = parallelize_module(reference("tp"), world.mesh,
                                   {"0": RowwiseParallel(), "2": ColwiseParallel()})
    assert torch.equal(got.loss, want.loss)
    for fqn, g in want.grads.items():
        assert got.grads[fqn].placements == g.placements
        assert torch.equal(got.grads[fqn].to_local(), g.to_local()), fqn
    assert _signature(loaded) == _signature(joint)
    cols = ["node", "op", "phase", "module", "group", "mesh_dim", "bytes", "wait"]
    assert collectives(loaded)[cols].equals(collectives(joint)[cols])
    assert memory_profile(loaded).peak_bytes == memory_profile(joint).peak_bytes
    with pytest.raises(StateMismatchError, match="no process group"):
        loaded.run(model, inputs())
    with jl.fake_world(WORLD):
        with pytest.raises(StateMismatchError, match=r"'0.weight' cannot feed this loaded graph"
                           r".*placement is 'S\(1\)' here but was 'S\(0\)'"):
            loaded.run(other, inputs())


def test_gather_ranks_outside_a_distributed_job_says_so():
    joint = jl.trace(reference("tp"), step, inputs())
    with pytest.raises(StateMismatchError, match="no process group is initialised"):
        jl.gather_ranks(joint)


@pytest.mark.parametrize("edit,message", [
    (lambda w: w["v"]["state"].__getitem__(0)["v"].pop("placement"), "DTensor input"),
    (lambda w: w["v"].pop("world_size"), "expected"),
    (lambda w: w["v"]["groups"].__setitem__("v", {"0": "x"}), "process groups"),
])
def test_a_tampered_world_is_refused_on_load(tmp_path, edit, message):
    import zipfile

    from jointlab.errors import PersistError

    with jl.fake_world(WORLD) as world:
        jl.trace(sharded("tp", world.mesh), step, inputs()).save(tmp_path / "g.jlg")
    with zipfile.ZipFile(tmp_path / "g.jlg") as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    layout = json.loads(members["layout.json"])
    edit(layout["world"])
    members["layout.json"] = json.dumps(layout).encode()
    with zipfile.ZipFile(tmp_path / "bad.jlg", "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    jl.load(tmp_path / "g.jlg")  # the untouched archive loads
    with pytest.raises(PersistError, match=message):
        jl.load(tmp_path / "bad.jlg")

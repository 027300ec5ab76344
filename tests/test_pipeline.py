"""The passes run once, in PIPELINE order, and the graph object runs none of them (issue 44)."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

import jointlab as jl
from jointlab.errors import StaleAnalysisError
from jointlab.meta import KEY
from jointlab.passes import pipeline
from jointlab.runtime.graph import RunnableGraph
from tests.fixtures import zoo

aten = torch.ops.aten
TRACE = pathlib.Path(jl.__file__).parent / "trace"


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_trace_runs_each_pass_once_in_declared_order(mode, monkeypatch):
    ran = []

    def counted(step):
        def run(gm, facts):
            ran.append(step.name)
            return step.run(gm, facts)
        return pipeline.PassStep(step.name, run)

    monkeypatch.setattr(pipeline, "PIPELINE", tuple(counted(s) for s in pipeline.PIPELINE))
    f = zoo.FIXTURES["mlp"]
    joint = jl.trace(f.make_model(), f.train_fn, f.make_inputs(4), mode=mode)
    assert ran == [s.name for s in pipeline.PIPELINE]
    # what the passes write is there: every node annotated, the analysis current
    assert all(KEY in n.meta for n in joint.graph.nodes)
    assert len(joint.nodes) == len(joint.graph.nodes)


def test_plain_graph_recompute_runs_no_pass_and_jointgraph_recompute_reanalyzes():
    f = zoo.FIXTURES["mlp"]
    joint = jl.trace(f.make_model(), f.train_fn, f.make_inputs(4))
    gelu = next(n for n in joint.graph.nodes if n.target == aten.gelu.default)
    with joint.graph.inserting_after(gelu):
        neg = joint.graph.call_function(aten.neg.default, (gelu,))
    neg.meta["val"] = aten.neg.default(gelu.meta["val"])
    neg.meta[KEY] = {k: gelu.meta[KEY][k] for k in ("phase", "module", "module_type", "source")}
    RunnableGraph.recompute(joint)  # the plain graph's recompute: no analysis pass
    assert "flops" not in neg.meta[KEY]
    with pytest.raises(StaleAnalysisError):
        joint.nodes  # noqa: B018
    joint.recompute()  # JointGraph's: the pipeline's reanalyze
    assert neg.meta[KEY]["flops"] == 0  # the analysis pass wrote the new node's keys
    assert neg.name in joint.nodes.index


def _writes_in(path: pathlib.Path) -> list[str]:
    """``file:line`` of each ``x.meta[...] = `` or ``x.target = `` in a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for t in targets:
            meta = (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Attribute)
                    and t.value.attr == "meta")
            target = isinstance(t, ast.Attribute) and t.attr == "target"
            if meta or target:
                found.append(f"{path.name}:{node.lineno}")
    return found


#: Writes left in trace/: none (the checkpoint recompute tag is written by
#: passes/recompute.py, AOT's output descriptors by passes/aot_outputs.py).
_LEFT: dict[str, int] = {}


def test_trace_folder_retargets_no_node_and_writes_meta_only_where_listed():
    writes = [w for p in sorted(TRACE.glob("*.py")) for w in _writes_in(p)]
    per_file: dict[str, int] = {}
    for w in writes:
        per_file[w.split(":")[0]] = per_file.get(w.split(":")[0], 0) + 1
    assert per_file == _LEFT, writes

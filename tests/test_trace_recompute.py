"""Readers never write node meta; an edited graph is refused until ``joint.recompute()``.

Also: a persisted AOT graph loads and runs without importing the AOT exporter.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import torch

import jointlab as jl
from jointlab.errors import StaleAnalysisError
from jointlab.meta import KEY
from jointlab.viz._dagdata import graph_data
from tests.fixtures import zoo
from tests.util import eager_step

aten = torch.ops.aten


def _mlp(mode: str = "make_fx"):
    f = zoo.FIXTURES["mlp"]
    inputs = f.make_inputs(4)
    model = f.make_model()
    return f, model, inputs, jl.trace(model, f.train_fn, inputs, mode=mode)


def _first(joint, target):
    return next(n for n in joint.graph.nodes if n.target == target)


def _insert_neg_after_gelu(joint):
    gelu = _first(joint, aten.gelu.default)
    with joint.graph.inserting_after(gelu):
        neg = joint.graph.call_function(aten.neg.default, (gelu,))
    neg.meta["val"] = aten.neg.default(gelu.meta["val"])
    neg.meta[KEY] = {k: gelu.meta[KEY][k] for k in ("phase", "module", "module_type", "source")}
    return gelu, neg


def _readers(joint, model, inputs, tmp_path):
    return {
        "nodes": lambda: joint.nodes,
        "summary": lambda: joint.summary(),
        "memory": lambda: joint.memory(),
        "save": lambda: joint.save(str(tmp_path / "g.jlg")),
        "dag": lambda: graph_data(joint),
        "stepper keep": lambda: jl.Stepper(joint, model, inputs, device="cpu", keep="all"),
    }


def test_every_reader_refuses_an_edited_graph_until_recompute(tmp_path):
    f, model, inputs, joint = _mlp()
    joint.nodes  # noqa: B018  # cache the table before the edit
    gelu, neg = _insert_neg_after_gelu(joint)
    for name, read in _readers(joint, model, inputs, tmp_path).items():
        with pytest.raises(StaleAnalysisError, match=r"joint\.recompute\(\)"):
            read()
        assert KEY not in neg.meta or "category" not in neg.meta[KEY], name  # nothing written
    joint.recompute()
    for read in _readers(joint, model, inputs, tmp_path).values():
        read()
    row = joint.nodes.loc[neg.name]
    assert row["target"] == "aten.neg" and row["category"] == "pointwise"
    # Independent reference: the value the recompiled graph really computes for the node.
    s = jl.Stepper(joint, model, inputs, device="cpu", keep={neg.name})
    s.run()
    real = s.value(neg.name)
    assert row["bytes"] == real.numel() * real.element_size()
    assert list(row["shape"]) == list(real.shape)
    assert joint.nodes.loc[gelu.name, "num_users"] == len(gelu.users)


def test_recompile_alone_marks_the_graph_stale():
    _, _, _, joint = _mlp()
    gelu = _first(joint, aten.gelu.default)
    assert joint.nodes.loc[gelu.name, "target"] == "aten.gelu"
    gelu.target = aten.relu.default
    joint.graph_module.recompile()  # same node count: only the code changed
    with pytest.raises(StaleAnalysisError):
        joint.nodes  # noqa: B018
    joint.recompute()
    assert joint.nodes.loc[gelu.name, "target"] == "aten.relu"
    assert joint.nodes.loc[gelu.name, "flops"] == 0


def test_recompute_refreshes_after_a_meta_only_edit():
    _, _, _, joint = _mlp()
    fwd = next(n for n in joint.graph.nodes if n.meta[KEY]["phase"] == "forward"
               and n.meta[KEY]["saved_for_backward"])
    for u in fwd.users:  # the user declares those readers forward: nothing saves fwd now
        u.meta[KEY]["phase"] = "forward"
    assert joint.nodes.loc[fwd.name, "saved_for_backward"]  # still the analysed answer
    joint.recompute()
    assert not joint.nodes.loc[fwd.name, "saved_for_backward"]


@pytest.mark.parametrize("mode", ["make_fx", "aot"])
def test_readers_never_write_meta(mode, tmp_path):
    f, model, inputs, joint = _mlp(mode)
    victim = _first(joint, aten.gelu.default)
    victim.meta[KEY]["flops"] = -12345  # a value no analysis would write
    before = {n.name: dict(n.meta[KEY]) for n in joint.graph.nodes}
    for read in _readers(joint, model, inputs, tmp_path).values():
        read()
    assert {n.name: dict(n.meta[KEY]) for n in joint.graph.nodes} == before
    assert joint.nodes.loc[victim.name, "flops"] == -12345


def test_trace_leaves_the_graph_analysed():
    _, _, _, joint = _mlp()
    mm = _first(joint, aten.mm.default)
    a, b = (x.meta["val"] for x in mm.args)
    assert mm.meta[KEY]["flops"] == 2 * a.shape[0] * a.shape[1] * b.shape[1]
    assert mm.meta[KEY]["category"] == "matmul"


_LOAD_AOT = """
import json, sys
import jointlab as jl
from tests.fixtures import zoo
f = zoo.FIXTURES["mlp"]
joint = jl.load(sys.argv[1])
table = joint.nodes
loss, grads, _ = joint.run(f.make_model(), f.make_inputs(4))
print(json.dumps({"mods": sorted(m for m in sys.modules if m.startswith("jointlab")),
                  "loss": float(loss), "rows": len(table), "mode": joint.mode}))
"""


def test_a_persisted_aot_graph_loads_without_the_exporter(tmp_path):
    f, model, inputs, joint = _mlp("aot")
    path = tmp_path / "aot.jlg"
    joint.save(str(path))
    out = subprocess.run([sys.executable, "-c", _LOAD_AOT, str(path)], capture_output=True,
                         text=True, check=True, cwd=str(pathlib.Path(__file__).parents[1]))
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert "jointlab.trace.aot" not in got["mods"], got["mods"]
    assert "jointlab.runtime" in got["mods"] and got["mode"] == "aot"
    assert got["rows"] == len(joint.graph.nodes)
    eloss, _, _ = eager_step(f.make_model(), f.train_fn, f.make_inputs(4), seed=0)
    assert got["loss"] == pytest.approx(float(eloss), rel=1e-6, abs=1e-7)


def test_run_returns_a_named_result():
    f, model, inputs, joint = _mlp()
    res = joint.run(model, inputs)
    eloss, egrads, _ = eager_step(f.make_model(), f.train_fn, inputs, seed=0)
    assert isinstance(res, jl.RunResult)
    assert res.loss == res[0] and res.grads is res[1] and res.loss_dict is res[2]
    torch.testing.assert_close(res.loss, eloss)
    for k, g in egrads.items():
        torch.testing.assert_close(res.grads[k], g)

"""Stepper: stepped and bulk runs against joint.run and eager, breakpoints, errors, memory."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F

import jointlab as jl
from jointlab import meta as _meta
from jointlab.errors import NodeExecutionError, ValueNotAvailableError
from tests.fixtures import zoo
from tests.util import assert_unchanged, deep_state


def _setup(name: str, batch: int = 4):
    f = zoo.FIXTURES[name]
    model, inputs = f.make_model(), f.make_inputs(batch)
    return f, model, inputs, jl.trace(model, f.train_fn, inputs)


def _same(a, b) -> bool:
    return torch.equal(a[0], b[0]) and a[1].keys() == b[1].keys() and all(
        torch.equal(a[1][k], b[1][k]) for k in a[1])


@pytest.fixture(scope="module")
def mlp():
    return _setup("mlp")


@pytest.fixture(scope="module")
def lm():
    return _setup("tiny_lm")


@pytest.mark.parametrize("name", ["tiny_lm", "cnn_bn", "nested_inputs", "unused_param",
                                  "shared_submodule"])
def test_stepped_and_bulk_equal_joint_run_bitwise(name):
    f, model, inputs, joint = _setup(name)
    torch.manual_seed(7)
    ref = joint.run(f.make_model(), inputs)
    s = jl.Stepper(joint, model, inputs, device="cpu", seed=7)
    while not s.done:
        s.step()
    assert _same(s.outputs, ref)
    s.reset()
    assert _same(s.run(), ref)
    assert _same(jl.Stepper(joint, model, inputs, device="cpu", seed=7).run(), ref)


def test_seed_controls_dropout(lm):
    f, model, inputs, joint = lm
    a = jl.Stepper(joint, model, inputs, device="cpu", seed=1).run()
    b = jl.Stepper(joint, model, inputs, device="cpu", seed=2).run()
    assert not torch.equal(a[0], b[0])  # dropout is live: seeds matter
    torch.manual_seed(2)
    eager = f.train_fn(f.make_model(), **inputs)
    assert torch.equal(b[0], eager.detach())


def test_stepper_rng_is_private(lm):
    _, model, inputs, joint = lm
    s = jl.Stepper(joint, model, inputs, device="cpu", seed=3)
    ref = jl.Stepper(joint, model, inputs, device="cpu", seed=3).run()
    s.step(len(s.nodes) // 3)
    torch.rand(100)  # the user draws random numbers between steps
    rng = torch.get_rng_state()
    assert _same(s.run(), ref)
    assert torch.equal(torch.get_rng_state(), rng)


def test_position_current_and_value(mlp):
    f, model, inputs, joint = mlp
    s = jl.Stepper(joint, model, inputs, device="cpu")
    nodes = list(joint.graph.nodes)
    s.step(3)
    assert s.position == 3 and s.current is nodes[3]
    addmm = next(n for n in nodes if n.target == torch.ops.aten.addmm.default)
    s.run_to(nodes.index(addmm) + 1)
    want = F.linear(inputs["x"], model.fc1.weight, model.fc1.bias)
    torch.testing.assert_close(s.value("addmm"), want)
    with pytest.raises(ValueNotAvailableError, match="not run yet"):
        s.value("mse_loss")


def test_free_after_last_use_and_keep(lm):
    _, model, inputs, joint = lm
    s = jl.Stepper(joint, model, inputs, device="cpu", seed=0)
    live = []
    while not s.done:
        s.step()
        live.append(len(s.env))
    n = len(s.nodes)
    assert max(live) < n // 2  # values die after their last use
    with pytest.raises(ValueNotAvailableError, match="freed"):
        s.value("embedding")
    kept = jl.Stepper(joint, model, inputs, device="cpu", seed=0, keep={"embedding"})
    kept.run()
    emb = torch.nn.functional.embedding(inputs["input_ids"], model.wte.weight)
    torch.testing.assert_close(kept.value("embedding"), emb)
    with pytest.raises(ValueNotAvailableError):
        kept.value("embedding_1")
    every = jl.Stepper(joint, model, inputs, device="cpu", seed=0, keep="all")
    every.run()
    assert all(n in every.env for n in every.nodes[:-1])


def test_breakpoint_on_node_and_op(mlp):
    _, model, inputs, joint = mlp
    s = jl.Stepper(joint, model, inputs, device="cpu")
    s.add_breakpoint(node="relu")
    assert s.run() is None
    assert s.current.name == "relu" and s.hit[1].name == "relu"
    s.clear_breakpoints()
    s.add_breakpoint(op="aten.mm")
    assert s.run() is None
    assert s.current.target == torch.ops.aten.mm.default
    s.clear_breakpoints()
    s.add_breakpoint(op="threshold_backward")
    s.run()
    assert s.current.name == "threshold_backward"
    s.clear_breakpoints()
    assert s.run() is not None and s.done


def test_breakpoint_module_prefix_includes_backward(lm):
    _, model, inputs, joint = lm
    s = jl.Stepper(joint, model, inputs, device="cpu", seed=0)
    s.add_breakpoint(module="h.1.mlp")
    phases = []
    while s.run() is None:
        node = s.current
        assert _meta.module(node).startswith("h.1.mlp")
        phases.append(_meta.phase(node))
    want = [_meta.phase(n) for n in s.nodes
            if _meta.module(n).startswith("h.1.mlp") and n.op == "call_function"]
    assert phases == want and "backward" in phases and "forward" in phases


def test_breakpoint_when_non_finite(mlp):
    _, model, inputs, joint = mlp
    bad = {"x": inputs["x"].clone(), "y": inputs["y"]}
    bad["x"][1, 3] = float("nan")
    s = jl.Stepper(joint, model, bad, device="cpu", keep="all")
    s.add_breakpoint(when="non-finite")
    assert s.run() is None
    hit = s.hit[1]
    assert s.position == s.nodes.index(hit) + 1
    assert torch.isnan(s.value(hit)).any()
    x_node = next(n for n in s.nodes if _meta.info(n).get("input_path") == "x")
    assert x_node in hit.all_input_nodes  # first consumer of the poisoned input
    earlier = [n for n in s.nodes[: s.nodes.index(hit)] if n.op != "placeholder"]
    assert all(torch.isfinite(s.value(n)).all() for n in earlier)


def test_step_over_module(lm):
    _, model, inputs, joint = lm
    s = jl.Stepper(joint, model, inputs, device="cpu", seed=0)
    s.add_breakpoint(module="h.0.attn")
    s.run()
    s.clear_breakpoints()
    mod = _meta.module(s.current)
    s.step_over_module()
    assert _meta.module(s.current) != mod
    assert all(_meta.module(n) == mod for n in s.nodes[s.position - 1: s.position])


def _boom(x):
    raise RuntimeError("injected failure")


def _broken(name: str, target, module: str):
    f, model, inputs, joint = _setup(name)
    node = next(n for n in joint.graph.nodes
                if n.target == target and _meta.module(n) == module)
    node.target = _boom
    node.args, node.kwargs = node.args[:1], {}
    joint.graph_module.recompile()
    return f, model, inputs, joint, node.name


@pytest.mark.parametrize("how", ["step", "run"])
def test_failing_node_leaves_stepper_at_it(how):
    f, model, inputs, joint, name = _broken(
        "cnn_bn", torch.ops.aten.native_batch_norm_backward.default, "bn2")
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    s = jl.Stepper(joint, model, inputs, device="cpu")
    with pytest.raises(NodeExecutionError) as err:
        if how == "run":
            s.run()
        else:
            while not s.done:
                s.step()
    msg = str(err.value)
    node = next(n for n in joint.graph.nodes if n.name == name)
    assert name in msg and node.format_node() in msg and "bn2" in msg
    assert "injected failure" in msg
    assert s.current is node
    # the buffers of the stepper were updated once (one BN forward), like eager
    eager = f.make_model()
    f.train_fn(eager, **inputs)
    for k, v in dict(eager.named_buffers()).items():
        assert torch.equal(s.buffers()[k], v), k
    s.reset()
    for k, v in buffers.items():
        assert torch.equal(s.buffers()[k], v), k


def test_reset_restores_mutated_buffers_and_model_untouched():
    f, model, inputs, joint = _setup("cnn_bn")
    before = deep_state(model)
    s = jl.Stepper(joint, model, inputs, device="cpu")
    first = s.run()
    moved = s.buffers()["bn1.running_mean"].clone()
    assert not torch.equal(moved, model.bn1.running_mean)
    s.reset()
    assert torch.equal(s.buffers()["bn1.running_mean"], model.bn1.running_mean)
    assert _same(s.run(), first)
    assert torch.equal(s.buffers()["bn1.running_mean"], moved)
    assert_unchanged(before, model)


def test_node_timings_join_node_table(mlp):
    _, model, inputs, joint = mlp
    s = jl.Stepper(joint, model, inputs, device="cpu")
    s.step(20)
    t = s.node_timings()
    assert list(t.index) == [n.name for n in s.nodes[:20]]
    assert (t["step_s"] >= 0).all()
    joined = joint.nodes.join(t, how="inner")
    assert len(joined) == 20 and "op" in joined.columns


def test_aot_mode_steps_like_run():
    f = zoo.FIXTURES["cnn_bn"]
    model, inputs = f.make_model(), f.make_inputs(4)
    joint = jl.trace(model, f.train_fn, inputs, mode="aot")
    ref = joint.run(f.make_model(), inputs)
    s = jl.Stepper(joint, model, inputs, device="cpu")
    while not s.done:
        s.step()
    got = s.outputs
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=0)
    for k in ref[1]:
        torch.testing.assert_close(got[1][k], ref[1][k], rtol=0, atol=0)


def test_getitem_and_operator_nodes_step(lm):
    _, model, inputs, joint = lm
    s = jl.Stepper(joint, model, inputs, device="cpu", seed=0)
    getitem = next(n for n in s.nodes if n.target is operator.getitem)
    s.add_breakpoint(node=getitem)
    s.run()
    s.step()
    assert isinstance(s.value(getitem.name), torch.Tensor)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_step_matches_run_and_reports_memory():
    f, model, inputs, joint = _setup("tiny_lm")
    s = jl.Stepper(joint, model, inputs, device="cuda", seed=5)
    while not s.done:
        s.step()
    ref = jl.Stepper(joint, model, inputs, device="cuda", seed=5).run()
    assert _same(s.outputs, ref)
    t = s.node_timings()
    assert (t["step_mem_peak"] > 0).any()


def test_reading_outputs_never_mutates_buffers_in_aot_mode():
    """After the last node the buffers hold one BN update, like eager's, however often read."""
    f = zoo.FIXTURES["cnn_bn"]
    model, inputs = f.make_model(), f.make_inputs(4)
    joint = jl.trace(model, f.train_fn, inputs, mode="aot")
    eager = f.make_model()
    f.train_fn(eager, **inputs)
    want = dict(eager.named_buffers())
    s = jl.Stepper(joint, model, inputs, device="cpu")
    while not s.done:
        s.step()

    def buffers_match() -> bool:
        got = s.buffers()
        return all(torch.equal(got[k], v) for k, v in want.items())

    assert int(s.buffers()["bn1.num_batches_tracked"]) == 1
    assert buffers_match()  # before .outputs is ever read
    for _ in range(2):
        assert s.outputs is not None
    assert buffers_match() and int(s.buffers()["bn1.num_batches_tracked"]) == 1


@pytest.mark.parametrize("args, says", [
    (("graph", "model", "inputs"), "joint graph from jl.trace"),
    (("joint", "a string", "inputs"), "torch.nn.Module"),
    (("joint", "model", ["x"]), "dict of keyword inputs"),
])
def test_stepper_refuses_arguments_of_the_wrong_kind(mlp, args, says):
    _, model, inputs, joint = mlp
    real = {"joint": joint, "model": model, "inputs": inputs}
    call = [real.get(a, a) if isinstance(a, str) else a for a in args]
    with pytest.raises(jl.errors.StepperError, match=says):
        jl.Stepper(*call, device="cpu")


def test_unknown_breakpoint_condition_is_a_stepper_error(mlp):
    _, model, inputs, joint = mlp
    s = jl.Stepper(joint, model, inputs, device="cpu")
    with pytest.raises(jl.errors.StepperError, match="non-finite"):
        s.add_breakpoint(when="sometimes")
    assert s.breakpoints == []


@pytest.mark.parametrize("kw, near", [
    ({"op": "not_an_op"}, None),
    ({"op": "aten.gelu_backwrd"}, "'aten.gelu_backward'"),
    ({"op": "gelu_backwards"}, "'gelu_backward'"),
    ({"module": "h.1.atn"}, "'h.1.attn'"),
    ({"module": "h.3"}, "'h.1'"),  # tiny_lm has blocks h.0 and h.1 only
])
def test_breakpoint_matching_nothing_is_refused_with_the_nearest_names(lm, kw, near):
    _, model, inputs, joint = lm
    # independent reference: what the graph's compute nodes really carry
    compute = [n for n in joint.graph.nodes if n.op == "call_function"]
    ops = {a for n in compute for a in _meta.op_aliases(n)}
    mods = {_meta.module(n) for n in compute}
    value = next(iter(kw.values()))
    assert value not in ops and not any(m == value or m.startswith(value + ".") for m in mods)
    s = jl.Stepper(joint, model, inputs, device="cpu")
    with pytest.raises(jl.errors.StepperError, match="would never stop") as err:
        s.add_breakpoint(**kw)
    assert repr(value) in str(err.value)
    if near is not None:
        assert near in str(err.value)
        assert near.strip("'") in ops | mods | {"h.1"}
        s.add_breakpoint(**{next(iter(kw)): near.strip("'")})  # the suggestion is accepted
    assert len(s.breakpoints) == (near is not None)


def test_breakpoint_parts_that_never_hold_together_are_refused(mlp):
    _, model, inputs, joint = mlp
    s = jl.Stepper(joint, model, inputs, device="cpu")
    relu = next(n for n in joint.graph.nodes if _meta.op_name(n) == "relu")
    assert _meta.module(relu) != "fc3"
    with pytest.raises(jl.errors.StepperError, match="same node"):
        s.add_breakpoint(node=relu.name, module="fc3")
    s.add_breakpoint(node=relu.name, module=_meta.module(relu))  # both hold for relu
    s.run()
    assert s.current is relu


def test_continue_after_a_refused_breakpoint_still_stops_at_the_valid_one(lm):
    _, model, inputs, joint = lm
    s = jl.Stepper(joint, model, inputs, device="cpu")
    with pytest.raises(jl.errors.StepperError):
        s.add_breakpoint(op="not_an_op")
    s.add_breakpoint(op="gelu_backward")
    assert s.run() is None and _meta.op_name(s.current) == "gelu_backward"


def test_breakpoint_is_exported_with_a_short_repr(mlp):
    _, model, inputs, joint = mlp
    s = jl.Stepper(joint, model, inputs, device="cpu")
    bp = s.add_breakpoint(module="fc3", when="non-finite")
    assert isinstance(bp, jl.Breakpoint)
    assert repr(bp) == "Breakpoint(module='fc3', when=non_finite)"
    assert repr(s.add_breakpoint(node="relu")) == "Breakpoint(node='relu')"


def _imports(path) -> set[str]:
    """Every module a file imports, at top level, in functions or under TYPE_CHECKING."""
    import ast

    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_compare_and_the_panel_do_not_import_the_stepper():
    import pathlib

    root = pathlib.Path(jl.__file__).parent
    stepper = "jointlab.analysis.step.stepper"
    for path in [*(root / "analysis" / "compare").glob("*.py"),
                 root / "analysis" / "step" / "runner.py", root / "analysis" / "compile.py"]:
        assert stepper not in _imports(path), path
    panel = _imports(root / "widgets" / "_stepper.py")
    assert not [m for m in panel if m.startswith(("jointlab.analysis.step",
                                                  "jointlab.analysis.compare"))], panel
    to_widgets = {m for m in _imports(root / "analysis" / "step" / "stepper.py")
                  if m.startswith(("jointlab.widgets", "jointlab.viz"))}
    assert to_widgets <= {"jointlab.widgets._stepper", "jointlab.widgets._stepper.stepper_widget"}
    mine = [*(root / "analysis" / "step").glob("*.py"),
            *(root / "analysis" / "compare").glob("*.py"), root / "analysis" / "compile.py"]
    for path in mine:  # they annotate with jointlab.core.TracedGraph
        assert not [m for m in _imports(path) if m.startswith("jointlab.graph")], path
    from jointlab.analysis.compare import compare as compare_module

    assert jl.compare is compare_module.compare


def _stats(t: torch.Tensor) -> dict[str, float]:
    """Reference statistics with numpy (not the panel's torch code)."""
    import numpy as np

    x = t.detach().double().numpy()
    return {"mean": x.mean(), "std": x.std(ddof=0), "min": x.min(), "max": x.max(),
            "norm": float(np.sqrt((x * x).sum()))}


def test_panel_dag_detail_carries_stats_of_held_values(lm):
    _, model, inputs, joint = lm
    s = jl.Stepper(joint, model, inputs, device="cpu", seed=0, keep={"embedding"})
    panel = s.widget()
    at = next(k for k, n in enumerate(s.nodes) if n.name == "embedding")
    for _ in range(at + 1):  # run up to and including the embedding
        panel.buttons["step"].click()
    emb = torch.nn.functional.embedding(inputs["input_ids"], model.wte.weight)  # eager
    rows = panel.dag.values["embedding"]
    assert rows["value"] == f"({', '.join(map(str, emb.shape))}) float32"
    for k, want in _stats(emb).items():
        assert float(rows[k]) == pytest.approx(want, rel=5e-4), (k, rows[k], want)
    assert rows["NaN / Inf"] == "0 / 0"
    for _ in range(40):  # far past it: the kept value is still described, a freed one is not
        panel.buttons["step"].click()
    assert panel.dag.values["embedding"] == rows
    freed = [n.name for n in s.nodes[:s.position] if n.op != "placeholder" and n not in s.env]
    assert freed and not set(freed) & set(panel.dag.values)
    current_inputs = {a.name for a in s.current.all_input_nodes}
    assert current_inputs <= set(panel.dag.values)

"""jl.diff: structural diff of two joint graphs and the first node whose value differs.

Three FX passes written here: one fuses mm+add into addmm, one drops a
redundant detach, one rounds a value through bfloat16. The first value
difference is checked against torch's own ``fx.Interpreter`` values of both
graphs (``tests.util.node_values``), compared here by hand node by node.
"""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

import jointlab as jl
from jointlab import meta as _meta
from jointlab.errors import DiffError, StaleAnalysisError
from jointlab.torch_compat import op_schema
from tests.fixtures import zoo
from tests.util import assert_unchanged, deep_state, node_values

aten = torch.ops.aten


def _trace(name: str = "mlp"):
    f = zoo.get(name)
    model, inputs = f.make_model(), f.make_inputs(4)
    return model, inputs, jl.trace(model, f.train_fn, inputs)


def _forward(joint, target, module: str) -> fx.Node:
    return next(n for n in joint.graph.nodes if n.target is target
                and _meta.info(n).get("module") == module and _meta.is_forward(n))


def _insert(joint, before: fx.Node, target, args, like: fx.Node, val=None, **kwargs) -> fx.Node:
    """A new node before ``before`` with ``like``'s annotations and ``val`` (default ``like``'s)."""
    with joint.graph.inserting_before(before):
        new = joint.graph.call_function(target, args, kwargs)
    new.meta["jointlab"] = dict(_meta.info(like))
    new.meta["val"] = like.meta["val"] if val is None else val
    return new


def unfuse_addmm(joint, module: str) -> list[fx.Node]:
    """Setup pass: ``addmm(b, x, w)`` of ``module``'s forward -> ``add(mm(x, w), b)``."""
    addmm = _forward(joint, aten.addmm.default, module)
    bias, x, w = addmm.args
    mm = _insert(joint, addmm, aten.mm.default, (x, w), addmm)
    add = _insert(joint, addmm, aten.add.Tensor, (mm, bias), addmm)
    addmm.replace_all_uses_with(add)
    joint.graph.erase_node(addmm)
    joint.recompute()
    return [mm, add]


def fuse_mm_add(joint) -> list[fx.Node]:
    """The pass under test: every ``add(mm(x, w), b)`` whose mm has one user -> ``addmm``."""
    made = []
    for add in list(joint.graph.nodes):
        mm = add.args[0] if add.target is aten.add.Tensor and add.args else None
        if not (isinstance(mm, fx.Node) and mm.target is aten.mm.default and len(mm.users) == 1):
            continue
        addmm = _insert(joint, add, aten.addmm.default, (add.args[1], *mm.args), add)
        add.replace_all_uses_with(addmm)
        joint.graph.erase_node(add)
        joint.graph.erase_node(mm)
        made.append(addmm)
    joint.recompute()
    return made


#: How make_fx records autograd's reference to a saved tensor: ``detach`` up to torch 2.13,
#: ``alias`` from 2.14 (seen in the 05 notebook's outputs on 2.14.1 and 2.15.0).
SAVED_REFS = (aten.detach.default, aten.alias.default)


def drop_detach(joint) -> tuple[str, fx.Node]:
    """The pass under test: remove the first forward detach (values are unchanged).

    Returns the removed node's name and the node it read."""
    det = next(n for n in joint.graph.nodes if n.target in SAVED_REFS)
    src = det.args[0]
    det.replace_all_uses_with(src)
    joint.graph.erase_node(det)
    joint.recompute()
    return det.name, src


def bf16_roundtrip(joint, node: fx.Node) -> list[fx.Node]:
    """The pass under test: ``node``'s users read it rounded through bfloat16."""
    after = node.next
    low = node.meta["val"].to(torch.bfloat16)
    down = _insert(joint, after, aten._to_copy.default, (node,), node, low, dtype=torch.bfloat16)
    up = _insert(joint, after, aten._to_copy.default, (down,), node, dtype=torch.float32)
    node.replace_all_uses_with(up, delete_user_cb=lambda u: u is not down)
    joint.recompute()
    return [down, up]


def tanh_gelu(joint) -> list[str]:
    """The pass under test: every gelu and gelu_backward takes ``approximate='tanh'``."""
    made = []
    for n in joint.graph.nodes:
        if n.target in (aten.gelu.default, aten.gelu_backward.default):
            n.update_kwarg("approximate", "tanh")
            made.append(n.name)
    joint.recompute()
    return made


def reference_first_difference(joint_a, joint_b, model, inputs, made: list[fx.Node]):
    """By hand: the first node of ``joint_b`` (graph order) whose interpreter value
    differs bitwise from the same-named node of ``joint_a`` (nodes the pass made excluded)."""
    va, vb = node_values(joint_a, model, inputs), node_values(joint_b, model, inputs)
    skip = {n.name for n in made}
    for n in joint_b.graph.nodes:
        if n.name in skip or n.name not in va or n.op == "output":
            continue
        x, y = va[n.name], vb[n.name]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and not (
                x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)):
            return n.name
    return None


def _rows(d, change: str) -> set[tuple[str, str]]:
    t = d.table[d.table["change"] == change]
    col = "node_a" if change == "removed" else "node_b"
    return {(r[col], r["op_a" if change == "removed" else "op_b"]) for _, r in t.iterrows()}


def test_same_graph_traced_twice_is_no_difference():
    model, inputs, a = _trace("tiny_lm")
    _, _, b = _trace("tiny_lm")
    before = deep_state(model)
    d = jl.diff(a, b, model, inputs, seed=3)
    assert_unchanged(before, model)
    assert d.table.empty and d.same and d.first_value_difference is None
    assert dict(d.matched) == {n.name: n.name for n in a.graph.nodes}
    empty = {n.name for n in a.graph.nodes if n.target is aten.empty_like.default}
    assert len(empty) == 5  # dropout masks: uninitialized memory, not compared
    tensors = sum(isinstance(v, torch.Tensor) for k, v in node_values(a, model, inputs).items()
                  if k != "output" and k not in empty)
    assert d.compared == tensors and d.not_compared == ()


def test_fuse_mm_add_into_addmm():
    model, inputs, a = _trace()
    _, _, b = _trace()
    made_a = unfuse_addmm(a, "fc2")
    unfuse_addmm(b, "fc2")
    made = fuse_mm_add(b)
    assert len(made) == 1
    d = jl.diff(a, b, model, inputs)
    assert _rows(d, "removed") == {(made_a[0].name, "mm"), (made_a[1].name, "add")}
    assert _rows(d, "added") == {(made[0].name, "addmm")}
    assert set(d.removed["module"]) == set(d.added["module"]) == {"fc2"}
    assert d.added.iloc[0][["shape_b", "dtype_b"]].tolist() == [(4, 32), "float32"]
    changed = d.changed.set_index("node_b")
    x, w = made[0].args[1], made[0].args[2]
    assert "users" in changed.at[x.name, "what"] and "users" in changed.at[w.name, "what"]
    consumer = next(iter(made[0].users))
    assert "args" in changed.at[consumer.name, "what"]
    want = reference_first_difference(a, b, model, inputs, made)
    got = d.first_value_difference
    assert (got.node_b if got else None) == want
    # addmm and mm+add happen to round alike here; either way diff must agree with the reference
    assert d.compared == len(d.matched) - 1  # every matched value (the mlp has no tuple values)


def test_drop_detach_changes_structure_not_values():
    model, inputs, a = _trace()
    _, _, b = _trace()
    det, src = drop_detach(b)
    d = jl.diff(a, b, model, inputs)
    op = next(n for n in a.graph.nodes if n.name == det).target.__name__.split(".")[0]
    assert op in ("detach", "alias")  # the op name, as torch records it
    assert _rows(d, "removed") == {(det, op)} and d.added.empty
    changed = d.changed.set_index("node_b")
    assert changed.at[src.name, "what"] == "users"
    rewired = {n.name for n in a.graph.nodes if det in {u.name for u in n.all_input_nodes}}
    assert rewired and set(changed.index) == {src.name} | rewired
    assert all(changed.at[r, "what"] == "args" for r in rewired)
    assert reference_first_difference(a, b, model, inputs, []) is None
    assert d.first_value_difference is None and d.not_compared == ()
    assert "no value differs" in repr(d)


def test_bf16_roundtrip_first_difference_matches_interpreter():
    model, inputs, a = _trace("tiny_lm")
    _, _, b = _trace("tiny_lm")
    gelu = _forward(b, aten.gelu.default, "h.1.mlp.1")
    made = bf16_roundtrip(b, gelu)
    d = jl.diff(a, b, model, inputs, seed=5)
    assert _rows(d, "added") == {(made[0].name, "_to_copy"), (made[1].name, "_to_copy")}
    assert d.removed.empty
    assert set(d.added["dtype_b"]) == {"bfloat16", "float32"}
    want = reference_first_difference(a, b, model, inputs, made)
    assert want is not None
    got = d.first_value_difference
    assert got is not None and got.node_b == want and got.node_a == want
    assert got.module.startswith("h.1.mlp") and got.max_abs_err > 0
    assert want in repr(d)


def test_structure_only_and_refusals():
    _, _, a = _trace()
    model, inputs, b = _trace()
    d = jl.diff(a, b)
    assert not d.value_checked and "values not compared" in repr(d)
    with pytest.raises(DiffError, match="both model= and inputs="):
        jl.diff(a, b, model)
    with pytest.raises(DiffError, match="rtol"):
        jl.diff(a, b, model, inputs, rtol=-1)
    det = next(n for n in b.graph.nodes if n.target in SAVED_REFS)
    det.replace_all_uses_with(det.args[0])
    b.graph.erase_node(det)
    with pytest.raises(StaleAnalysisError):
        jl.diff(a, b)


def test_budget_too_small_is_said_not_hidden():
    model, inputs, a = _trace()
    _, _, b = _trace()
    bf16_roundtrip(b, _forward(b, aten.addmm.default, "fc3"))
    d = jl.diff(a, b, model, inputs, keep_bytes=0)
    assert d.compared == 0 and d.first_value_difference is None
    assert len(d.not_compared) > 0 and "not compared" in repr(d)


def test_plot_diff_marks_every_change_where_its_node_is_drawn():
    model, inputs, a = _trace()
    _, _, b = _trace()
    det, src = drop_detach(b)
    made = bf16_roundtrip(b, _forward(b, aten.addmm.default, "fc1"))
    d = jl.diff(a, b, model, inputs)
    view = jl.plot_diff(d, a, b)
    P = view.payload
    names = P["nodes"]["name"]
    layer = P["layers"]["change"]
    level = {n: layer["levels"][v] for n, v in zip(names, layer["v"])}
    rows = {names[int(i)]: dict(r) for i, r in P["nodes"]["rows"].items()}
    for kind in ("added", "changed"):
        want = set(d.table[d.table["change"] == kind]["node_b"])
        assert want and {n for n, lv in level.items() if lv == kind} == want, kind
    assert {n.name for n in made} <= set(d.added["node_b"])
    assert P["layers"]["change"]["colors"][layer["levels"].index("added")] == "#2ca02c"
    # the removed detach is told at its input's partner (the relu it read)
    assert rows[src.name]["removed here"].startswith(det)
    first = d.first_value_difference
    assert first is not None and "first value difference" in rows[first.node_b]
    # the view steps through the changes, in graph order
    marked = [n for n in names if level[n] != "same" or "removed here" in rows.get(n, {})]
    assert [names[i] for i in P["hits"]] == marked
    assert view.payload["color_by"] == "change" and "Diff: +" in P["title"]
    other = jl.trace(zoo.get("mlp").make_model(), zoo.get("mlp").train_fn, inputs)
    unfuse_addmm(other, "fc2")
    with pytest.raises(jl.errors.PlotArgumentError, match="the two graphs given to jl.diff"):
        jl.plot_diff(d, a, other)


def test_arg_changes_name_each_argument_with_old_and_new_values():
    model, inputs, a = _trace()
    _, _, b = _trace()
    gelus = tanh_gelu(b)
    assert len(gelus) == 2  # the forward gelu and its backward
    d = jl.diff(a, b)
    assert set(d.changed["node_b"]) == set(gelus)
    for name in gelus:  # left out in graph a: the schema default, 'none' (F.gelu's default)
        assert d.arg_changes[name] == (jl.analysis.diff.ArgChange("approximate", "none", "tanh"),)
        assert str(d.arg_changes[name][0]) == "approximate: none -> tanh"
    # a node argument: the users of a rounded value now read the round trip's output
    _, _, c = _trace()
    node = _forward(c, aten.addmm.default, "fc1")
    readers = [u.name for u in node.users]
    down, up = bf16_roundtrip(c, node)
    d = jl.diff(a, c)
    for name in readers:
        changes = d.arg_changes[name]
        assert [(x.old, x.new) for x in changes] == [(node.name, up.name)], changes
        n = next(m for m in c.graph.nodes if m.name == name)
        k = list(n.args).index(up)  # the op's own name for that position
        assert changes[0].name == op_schema(n.target).arguments[k].name

"""Save/load round trips and hostile archives for jointlab.io.persist."""

from __future__ import annotations

import json
import os
import pickle
import zipfile

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab.errors import GuardError, PersistError, StaleAnalysisError
from jointlab.io.deferred import has_generated_code
from tests.fixtures import zoo


def _trace(name: str, batch: int = 4, **kw):
    fx_ = zoo.FIXTURES[name]
    model, inputs = fx_.make_model(), fx_.make_inputs(batch)
    return fx_, model, inputs, jl.trace(model, fx_.train_fn, inputs, **kw)


def _run(joint, model, inputs, seed=0):
    torch.manual_seed(seed)
    loss, grads, ld = joint.run(model, inputs)
    bufs = {k: v.clone() for k, v in model.named_buffers()}
    return loss, grads, ld, bufs


def _assert_bitwise(a, b):
    assert torch.equal(a[0], b[0])
    assert list(a[1]) == list(b[1])
    for k in a[1]:
        assert torch.equal(a[1][k], b[1][k]), k
    assert list(a[2]) == list(b[2])
    for k in a[2]:
        assert torch.equal(a[2][k], b[2][k]), k
    for k in a[3]:
        assert torch.equal(a[3][k], b[3][k]), k


@pytest.mark.parametrize("name", ["mlp", "cnn_bn", "tiny_lm", "nested_inputs", "unused_param",
                                  "shared_submodule"])
def test_roundtrip_runs_bit_for_bit(name, tmp_path):
    fx_, model, inputs, joint = _trace(name)
    path = tmp_path / "g.jlg"
    joint.save(str(path))
    loaded = jl.load(str(path))
    # Two independent models from the same builder: buffers (BatchNorm) evolve identically.
    model2 = fx_.make_model()
    for _ in range(2):  # two steps: buffer updates feed the second step
        _assert_bitwise(_run(joint, model, inputs), _run(loaded, model2, inputs))
    assert loaded.state_fqns == joint.state_fqns
    assert loaded.param_names == joint.param_names
    assert loaded.loss_dict_keys == joint.loss_dict_keys
    assert loaded.input_spec == joint.input_spec
    assert loaded.state_spec == joint.state_spec


def test_dropout_matches_eager_after_load(tmp_path):
    fx_, model, inputs, joint = _trace("tiny_lm")
    joint.save(str(tmp_path / "g.jlg"))
    loaded = jl.load(str(tmp_path / "g.jlg"))
    torch.manual_seed(7)
    loss = fx_.train_fn(model, **inputs)
    torch.manual_seed(7)
    got, _, _ = loaded.run(model, inputs)
    torch.testing.assert_close(got, loss.detach())
    torch.manual_seed(8)
    other, _, _ = loaded.run(model, inputs)
    assert not torch.equal(other, got)  # dropout really is live in the loaded graph


def test_annotations_and_names_survive(tmp_path):
    _, _, _, joint = _trace("tiny_lm")
    joint.save(str(tmp_path / "g.jlg"))
    loaded = jl.load(str(tmp_path / "g.jlg"))
    a, b = list(joint.graph.nodes), list(loaded.graph.nodes)
    assert [n.name for n in a] == [n.name for n in b]
    assert [str(n.target) for n in a] == [str(n.target) for n in b]
    for n1, n2 in zip(a, b):
        assert n1.meta["jointlab"] == n2.meta["jointlab"], n1.name
        assert n1.meta.get("nn_module_stack") == n2.meta.get("nn_module_stack")
        assert n1.meta.get("seq_nr") == n2.meta.get("seq_nr")
    pairs, loaded_pairs = joint.params_and_grads(), loaded.params_and_grads()
    assert {k: (p.name, g.name if g else None) for k, (p, g) in pairs.items()} == {
        k: (p.name, g.name if g else None) for k, (p, g) in loaded_pairs.items()}
    # meta["val"] is rebuilt with the same shapes, dtypes and storage sharing
    for n1, n2 in zip(a, b):
        v1, v2 = n1.meta.get("val"), n2.meta.get("val")
        if isinstance(v1, torch.Tensor):
            assert isinstance(v2, torch.Tensor), n1.name
            assert (v1.shape, v1.dtype, v1.stride()) == (v2.shape, v2.dtype, v2.stride())


def test_dynamic_graph_serves_other_sizes_and_keeps_guards(tmp_path):
    fx_, model, inputs, joint = _trace("mlp", dynamic=True)
    joint.save(str(tmp_path / "g.jlg"))
    loaded = jl.load(str(tmp_path / "g.jlg"))
    for batch in (3, 9):
        other = fx_.make_inputs(batch)
        _assert_bitwise(_run(joint, model, other), _run(loaded, model, other))
        eager = fx_.train_fn(model, **other)
        torch.testing.assert_close(_run(loaded, model, other)[0], eager.detach())
    with pytest.raises(GuardError, match="dim 0 of 'x'"):
        loaded.run(model, fx_.make_inputs(1))


def test_tensor_constant_in_graph(tmp_path):
    class WithConst(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            return self.fc(x) * torch.tensor([1.0, 2.0, 3.0])

    torch.manual_seed(0)
    model, x = WithConst(), torch.randn(2, 3)
    joint = jl.trace(model, lambda m, x: m(x).sum(), {"x": x})
    assert any(n.op == "get_attr" for n in joint.graph.nodes)
    joint.save(str(tmp_path / "g.jlg"))
    with zipfile.ZipFile(tmp_path / "g.jlg") as zf:
        assert "constants.pt" in zf.namelist()
    loaded = jl.load(str(tmp_path / "g.jlg"))
    _assert_bitwise(_run(joint, model, {"x": x}), _run(loaded, model, {"x": x}))


def test_archive_is_data_only(tmp_path):
    _, _, _, joint = _trace("cnn_bn")
    joint.save(str(tmp_path / "g.jlg"))
    with zipfile.ZipFile(tmp_path / "g.jlg") as zf:
        assert set(zf.namelist()) == {"format.json", "graph.json", "layout.json"}
        graph = json.loads(zf.read("graph.json"))
    targets = {r["target"] for r in graph["nodes"] if r["op"] == "call_function"}
    assert all(t.startswith("torch.ops.aten.") or t == "operator.getitem" for t in targets)


def test_loaded_graph_still_checks_inputs(tmp_path):
    fx_, model, inputs, joint = _trace("mlp")
    joint.save(str(tmp_path / "g.jlg"))
    loaded = jl.load(str(tmp_path / "g.jlg"))
    with pytest.raises(jl.errors.InputMismatchError, match="'x'"):
        loaded.run(model, fx_.make_inputs(5))
    with pytest.raises(jl.errors.InputStructureError, match="missing: y"):
        loaded.run(model, {"x": inputs["x"]})


# -- hostile files ----------------------------------------------------------------------
class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _tamper(src, dst, member, edit):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            data = zin.read(name)
            if name == member:
                data = edit(data)
            zout.writestr(name, data)
        if member not in zin.namelist():
            zout.writestr(member, edit(b""))


@pytest.fixture
def saved(tmp_path):
    _, _, _, joint = _trace("mlp")
    path = tmp_path / "good.jlg"
    joint.save(str(path))
    return path


def _edit_graph(fn):
    def edit(data):
        doc = json.loads(data)
        fn(doc["nodes"])
        return json.dumps(doc).encode()
    return edit


def _first_call(nodes):
    return next(r for r in nodes if r["op"] == "call_function")


def _set_target(target, args):
    def fn(nodes):
        rec = _first_call(nodes)
        rec["target"], rec["args"], rec["kwargs"] = target, args, {"t": "dict", "v": []}
    return fn


def _hostile_cases(marker):
    cmd = f"touch {marker}"
    return {
        "os_system_target": ("graph.json", _edit_graph(_set_target("os.system", [cmd])),
                             "allow-list"),
        "builtins_eval_target": ("graph.json", _edit_graph(_set_target(
            "builtins.eval", [f"__import__('os').system('{cmd}')"])), "allow-list"),
        "dunder_op_path": ("graph.json", _edit_graph(_set_target(
            "torch.ops.aten.__class__.__init__", [])), "allow-list"),
        "foreign_namespace": ("graph.json", _edit_graph(_set_target(
            "torch.ops.profiler._record_function_enter.default", ["x"])), "allow-list"),
        "call_module_node": ("graph.json", _edit_graph(
            lambda nodes: _first_call(nodes).update(op="call_method", target="system")),
            "op must be one of"),
        "name_injection": ("graph.json", _edit_graph(lambda nodes: _first_call(nodes).update(
            name=f"x = __import__('os').system('{cmd}'); y")), "names must be Python"),
        "placeholder_target_injection": ("graph.json", _edit_graph(lambda nodes: nodes[0].update(
            target=f"a=__import__('os').system('{cmd}')")), "names must be Python"),
        "unknown_value_tag": ("graph.json", _edit_graph(lambda nodes: _first_call(nodes).update(
            args=[{"t": "pickle", "v": pickle.dumps(1).hex()}])), "unknown value tag"),
        "extra_code_member": ("code.py", lambda _: f"import os; os.system('{cmd}')".encode(),
                              "unexpected members"),
        "pickled_constants": ("constants.pt", lambda _: pickle.dumps(_Payload(marker), protocol=2),
                              "constants.pt"),
        "torch_saved_payload": ("constants.pt", lambda _: _torch_saved(_Payload(marker)),
                                "constants.pt"),
        "bad_dtype": ("layout.json", lambda d: d.replace(b'"float32"', b'"_C"'), "dtype"),
        "bad_device": ("layout.json", lambda d: d.replace(b'"cpu"', b'"cpu;rm"'), "device"),
        "bad_treespec": ("layout.json", lambda d: _edit_layout(d), "layout"),
        "kwarg_name_injection": ("graph.json", _edit_graph(lambda nodes: _first_call(
            nodes).update(kwargs={f"x=__import__('os').system('{cmd}'), y": 1})),
            "not a Python identifier"),
        "meta_key_smuggling": ("graph.json", _edit_graph(lambda nodes: nodes[1]["meta"].update(
            {"__reduce__": cmd})), "unexpected node meta key"),
    }


def _edit_layout(data):
    doc = json.loads(data)
    spec = json.loads(doc["inputs"]["treespec"])
    spec[1]["type"] = "os.system"
    doc["inputs"]["treespec"] = json.dumps(spec)
    return json.dumps(doc).encode()


def _torch_saved(obj):
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.mark.parametrize("case", sorted(_hostile_cases("m")))
def test_hostile_archive_is_refused_and_runs_nothing(case, saved, tmp_path):
    marker = tmp_path / "PWNED"
    member, edit, message = _hostile_cases(marker)[case]
    bad = tmp_path / "bad.jlg"
    _tamper(saved, bad, member, edit)
    with pytest.raises(PersistError, match=message):
        jl.load(str(bad))
    assert not marker.exists()


def test_raw_pickle_file_is_refused(tmp_path):
    marker = tmp_path / "PWNED"
    bad = tmp_path / "bad.jlg"
    bad.write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(PersistError, match="not a zip"):
        jl.load(str(bad))
    assert not marker.exists()


def test_torch_save_of_a_joint_graph_file_is_refused(tmp_path):
    marker = tmp_path / "PWNED"
    bad = tmp_path / "bad.jlg"
    bad.write_bytes(_torch_saved(_Payload(marker)))  # a zip, but torch's, not ours
    with pytest.raises(PersistError, match="unexpected members"):
        jl.load(str(bad))
    assert not marker.exists()


def test_sympy_guard_tampering_is_refused(tmp_path):
    fx_, model, inputs, joint = _trace("mlp", dynamic=True)
    joint.save(str(tmp_path / "g.jlg"))
    marker = tmp_path / "PWNED"

    def edit(data):
        doc = json.loads(data)
        doc["guards"]["dims"]["x"][0] = {"fn": "__import__", "args": [{"int": 1}]}
        return json.dumps(doc).encode()

    _tamper(tmp_path / "g.jlg", tmp_path / "bad.jlg", "layout.json", edit)
    with pytest.raises(PersistError, match="not allow-listed"):
        jl.load(str(tmp_path / "bad.jlg"))
    assert not marker.exists()


def test_save_refuses_unsafe_targets(tmp_path):
    _, _, _, joint = _trace("mlp")
    node = next(n for n in joint.graph.nodes if n.op == "call_function")
    node.target = F.relu  # a Python function, not an ATen overload
    with pytest.raises(PersistError, match="cannot save safely"):
        joint.save(str(tmp_path / "g.jlg"))


def test_payload_is_live_so_the_hostile_tests_can_fail(tmp_path):
    marker = tmp_path / "PWNED"
    pickle.loads(pickle.dumps(_Payload(marker)))  # what an unsafe loader would do
    assert marker.exists()


@pytest.mark.parametrize("name,dynamic", [("cnn_bn", False), ("tiny_lm", False),
                                          ("nested_inputs", True)])
def test_aot_roundtrip_runs_bit_for_bit(name, dynamic, tmp_path):
    fx_, model, inputs, joint = _trace(name, mode="aot", dynamic=dynamic)
    joint.save(str(tmp_path / "g.jlg"))
    loaded = jl.load(str(tmp_path / "g.jlg"))
    assert loaded.mode == "aot" and type(loaded.runtime) is type(joint.runtime)
    model2 = fx_.make_model()
    for _ in range(2):  # buffer mutations are applied by the loaded runtime too
        _assert_bitwise(_run(joint, model, inputs), _run(loaded, model2, inputs))


@pytest.mark.parametrize("dynamic", [False, True])
def test_loaded_node_table_equals_original(dynamic, tmp_path):
    _, _, _, joint = _trace("cnn_bn", dynamic=dynamic)
    joint.save(str(tmp_path / "g.jlg"))
    loaded = jl.load(str(tmp_path / "g.jlg"))
    cols = ["op", "target", "phase", "module", "shape", "dtype", "bytes", "flops",
            "saved_for_backward", "is_view", "alias_of"]
    a, b = joint.nodes[cols], loaded.nodes[cols]
    assert list(a.index) == list(b.index)
    assert a.astype(str).equals(b.astype(str))


# -- format version 2: value specs, shared meta, version 1 still read ------------------
def _storage_partition(nodes):
    """Node names grouped by the storage their (first) fake value lives in."""
    from jointlab.torch_compat import storage_id

    groups = {}
    for n in nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            groups.setdefault(storage_id(val), []).append(n.name)
    return sorted(groups.values())


@pytest.mark.parametrize("name", ["tiny_lm", "cnn_bn"])
def test_vals_rebuilt_with_layout_and_storage_sharing(name, tmp_path):
    _, _, _, joint = _trace(name)
    joint.save(str(tmp_path / "g.jlg"))
    loaded = jl.load(str(tmp_path / "g.jlg"))
    a, b = list(joint.graph.nodes), list(loaded.graph.nodes)
    for n1, n2 in zip(a, b):
        assert _val_facts(n1.meta.get("val")) == _val_facts(n2.meta.get("val")), n1.name
    assert _storage_partition(a) == _storage_partition(b)
    has_offset = any(n.meta["val"].storage_offset() for n in b
                     if isinstance(n.meta.get("val"), torch.Tensor))
    assert has_offset == (name == "tiny_lm")  # the attention's q/k/v split views
    # the analysis pass, rerun on the rebuilt values, derives what the trace derived
    loaded.recompute()
    for n1, n2 in zip(a, b):
        assert n1.meta["jointlab"] == n2.meta["jointlab"], n1.name


def test_archive_is_version_3_with_shared_meta_and_jointlab_rows(saved):
    with zipfile.ZipFile(saved) as zf:
        assert json.loads(zf.read("format.json")) == {"format": "jointlab.joint-graph",
                                                      "version": 3}
        doc = json.loads(zf.read("graph.json"))
    refs = [i for r in doc["nodes"] for i in r["shared_meta"].values()]
    assert len(set(refs)) == len(doc["shared"]) < len(refs)  # repeats stored once
    rows = [r["jl"] for r in doc["nodes"]]
    assert all(r is not None for r in rows) and all("jointlab" not in r["meta"]
                                                    for r in doc["nodes"])
    assert len({r[0] for r in rows}) == len(doc["jl_keys"]) < len(rows)  # key tuples once


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("name", ["mlp", "tiny_lm"])
def test_older_archive_still_loads_and_runs(name, version):
    path = os.path.join(os.path.dirname(__file__), "fixtures", f"archive_v{version}_{name}.jlg")
    with zipfile.ZipFile(path) as zf:
        assert json.loads(zf.read("format.json"))["version"] == version
    fx_, model, inputs, joint = _trace(name)
    loaded = jl.load(path)
    model2 = fx_.make_model()
    _assert_bitwise(_run(joint, model, inputs), _run(loaded, model2, inputs))
    a, b = list(joint.graph.nodes), list(loaded.graph.nodes)
    for n1, n2 in zip(a, b):  # v1: values re-propagated from the placeholders' specs
        v1, v2 = n1.meta.get("val"), n2.meta.get("val")
        if isinstance(v1, torch.Tensor):
            assert _val_facts(v1) == _val_facts(v2), n1.name
        _assert_same_meta(n2.meta["jointlab"], n1.meta["jointlab"], n1.name,
                          {m2.name: m1.name for m1, m2 in zip(a, b)})


# Ops a newer torch records under another name than the archives' torch (2.13) did: the
# archive keeps the op it recorded. torch 2.15 records saved-tensor detaches as
# aten.alias (2.14 in some graphs) and a matmul's reshape as aten._unsafe_view, whose
# schema is no view (category "other").
_RENAMED = {("aten.detach", "aten.alias"), ("aten.view", "aten._unsafe_view")}


def _renamed(value, names: dict[str, str]):
    if isinstance(value, str):
        return names.get(value, value)
    if isinstance(value, (list, tuple)):
        return type(value)(_renamed(v, names) for v in value)
    return value


def _assert_same_meta(archived: dict, traced: dict, name: str, names: dict[str, str]) -> None:
    # node names follow op names (detach_1 / alias_1): read the archive's references
    # to other nodes by position
    archived = {k: _renamed(v, names) for k, v in archived.items()}
    if archived.get("target") != traced.get("target"):
        assert (archived.get("target"), traced.get("target")) in _RENAMED, name
        archived, traced = ({k: v for k, v in m.items() if k not in ("target", "category")}
                            for m in (archived, traced))
    assert archived == traced, name


def _edit_doc(fn):
    def edit(data):
        doc = json.loads(data)
        fn(doc)
        return json.dumps(doc).encode()
    return edit


def _first_shared(doc):
    return next(r for r in doc["nodes"] if r["shared_meta"])


def _first_call_rec(doc):
    return next(r for r in doc["nodes"] if r["op"] == "call_function")


def _first_val(doc):
    return next(r for r in doc["nodes"] if r["val"] and "tensor" in r["val"])


@pytest.mark.parametrize("member,edit,message", [
    ("format.json", lambda d: d.replace(b'"version": 3', b'"version": 99'), "version"),
    ("graph.json", _edit_doc(lambda d: _first_shared(d)["shared_meta"].update(
        {"__reduce__": 0})), "unexpected node meta key"),
    ("graph.json", _edit_doc(lambda d: _first_shared(d)["shared_meta"].update(
        stack_trace=10 ** 6)), "missing shared value"),
    ("graph.json", _edit_doc(lambda d: d["shared"].__setitem__(
        0, {"t": "pickle", "v": "80"})), "unknown value tag"),
    ("graph.json", _edit_doc(lambda d: _first_val(d)["val"]["tensor"].__setitem__(
        3, "_C")), "dtype"),
    ("graph.json", _edit_doc(lambda d: _first_val(d)["val"]["tensor"].__setitem__(
        5, 10 ** 6)), "value spec"),
    ("graph.json", _edit_doc(lambda d: _first_val(d)["val"]["tensor"].__setitem__(
        2, 10 ** 9)), "value spec"),  # an offset outside its storage
    ("graph.json", _edit_doc(lambda d: _first_val(d)["val"]["tensor"].__setitem__(
        5, -1)), "value spec"),  # no storage -1 (not the last one)
    # version 3: meta["jointlab"] rows and their key tuples
    ("graph.json", _edit_doc(lambda d: d["nodes"][0]["jl"].__setitem__(0, 10 ** 6)),
     "malformed meta\\['jointlab'\\] row"),
    ("graph.json", _edit_doc(lambda d: d["nodes"][0]["jl"].append(0)),
     "malformed meta\\['jointlab'\\] row"),
    ("graph.json", _edit_doc(lambda d: d["jl_keys"][0].__setitem__(0, 5)), "jl_keys"),
    ("graph.json", _edit_doc(lambda d: d["nodes"][0]["meta"].update(
        jointlab={"t": "sdict", "v": {}})), "unexpected node meta key"),
    ("graph.json", _edit_doc(lambda d: _first_call_rec(d)["jl"].__setitem__(
        1, {"t": "pickle", "v": "80"})), "unknown value tag"),
])
def test_malformed_version_2_and_3_fields_are_refused(member, edit, message, saved, tmp_path):
    bad = tmp_path / "bad.jlg"
    _tamper(saved, bad, member, edit)
    with pytest.raises(PersistError, match=message):
        jl.load(str(bad))


def test_loaded_graph_generates_its_code_when_first_run_and_stays_analyzed(tmp_path):
    fx_, model, inputs, joint = _trace("cnn_bn")
    path = str(tmp_path / "g.jlg")
    joint.save(path)
    loaded = jl.load(path)
    gm = loaded.graph_module
    assert not has_generated_code(gm)
    loaded.nodes, loaded.memory()  # readers need no generated code
    assert not has_generated_code(gm)
    model2 = fx_.make_model()  # same builder: BatchNorm buffers evolve identically
    _assert_bitwise(_run(loaded, model2, inputs), _run(joint, model, inputs))
    assert has_generated_code(gm)
    assert gm.code == torch.fx.GraphModule(gm, gm.graph).code
    # the first code generation is not an edit: the analysis is still current
    assert len(loaded.nodes) == len(joint.nodes)
    _assert_bitwise(_run(loaded, model2, inputs), _run(joint, model, inputs))


@pytest.mark.parametrize("run_first", [False, True])
def test_recompile_of_loaded_graph_makes_its_analysis_stale(run_first, tmp_path):
    _, model, inputs, joint = _trace("mlp")
    path = str(tmp_path / "g.jlg")
    joint.save(path)
    loaded = jl.load(path)
    if run_first:
        loaded.run(model, inputs)
    loaded.graph_module.recompile()  # what a user does after editing the graph
    with pytest.raises(StaleAnalysisError):
        loaded.summary()
    loaded.recompute()
    assert len(loaded.nodes) == len(joint.nodes)
    _assert_bitwise(_run(loaded, model, inputs), _run(joint, model, inputs))


# -- nothing lost: every node's meta and value as traced, built the fast way ------------
def _val_facts(val):
    """Everything a reader sees of a fake value (dispatch keys included)."""
    if isinstance(val, torch.Tensor):
        return (type(val), tuple(val.shape), val.stride(), val.storage_offset(), val.dtype,
                val.device, val.requires_grad, val.untyped_storage().nbytes(),
                val.is_contiguous(), str(torch._C._dispatch_keys(val)))
    if isinstance(val, (list, tuple)):
        return type(val), [_val_facts(v) for v in val]
    return val


def _comparable_meta(node):
    m = {k: v for k, v in node.meta.items() if k not in ("val", "tensor_meta")}
    if "original_aten" in m:  # make_fx may hold another OpOverload object of the same op
        m["original_aten"] = getattr(m["original_aten"], "name", str)()
    return m


@pytest.mark.parametrize("name", ["tiny_lm", "cnn_bn"])
def test_loaded_graph_keeps_every_meta_and_value(name, tmp_path):
    from jointlab.passes.analyze import tensors_of
    from jointlab.torch_compat import FakeTensor

    fx_, model, inputs, joint = _trace(name)
    joint.save(str(tmp_path / "g.jlg"))
    loaded = jl.load(str(tmp_path / "g.jlg"))
    a, b = list(joint.graph.nodes), list(loaded.graph.nodes)
    assert [(n.op, n.name, n.target, str(n.args), str(n.kwargs)) for n in a] == \
        [(n.op, n.name, n.target, str(n.args), str(n.kwargs)) for n in b]
    modes = set()
    for n1, n2 in zip(a, b):
        assert set(n1.meta) - set(n2.meta) <= {"tensor_meta"}, n1.name  # not archived
        assert _comparable_meta(n1) == _comparable_meta(n2), n1.name
        assert _val_facts(n1.meta.get("val")) == _val_facts(n2.meta.get("val")), n1.name
        for t in tensors_of(n2.meta.get("val")):
            modes.add(id(t.fake_mode))
            elem = torch.empty(0, dtype=t.dtype, device="meta")
            assert vars(t) == vars(FakeTensor(t.fake_mode, elem, t.device)), n1.name
    assert len(modes) == 1
    mutable = [id(v) for n in b for v in n.meta.values() if isinstance(v, (dict, list))]
    assert len(mutable) == len(set(mutable))  # no node shares a meta dict or list
    assert _storage_partition(a) == _storage_partition(b)
    _assert_bitwise(_run(joint, model, inputs), _run(loaded, fx_.make_model(), inputs))
    m1, m2 = joint.memory(), loaded.memory()
    assert m1.lifetimes.equals(m2.lifetimes) and m1.timeline.equals(m2.timeline)
    assert (m1.peak_bytes, m1.peak_node) == (m2.peak_bytes, m2.peak_node)
    assert loaded.nodes.astype(str).equals(joint.nodes.astype(str))
    steppers = [jl.Stepper(j, fx_.make_model(), inputs, seed=0, keep="all")
                for j in (joint, loaded)]
    for s in steppers:
        s.run()
    uninitialised = ("aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty")
    for n in a[:-1]:  # every value the Stepper computed, bit for bit (not uninitialised ones)
        if n.meta["jointlab"].get("target") in uninitialised:
            continue
        v1, v2 = (tensors_of(st.value(n.name)) for st in steppers)
        assert len(v1) == len(v2) and all(map(torch.equal, v1, v2)), n.name


def test_fast_fake_tensors_only_where_they_equal_the_constructors(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorConfig

    from jointlab.torch_compat import FakeTensor, FakeTensorMode, fake_tensor_maker, release

    mode, cpu = FakeTensorMode(), torch.device("cpu")
    storage = torch.empty(64, dtype=torch.uint8, device="meta").untyped_storage()

    def elem():
        return torch.empty(0, device="meta").set_(storage, 2, (3, 4), (1, 3))

    make = fake_tensor_maker(mode, cpu)
    fast, ref = make(elem()), FakeTensor(mode, elem(), cpu)
    # the fast path where torch's own FakeTensor keeps its device as `_fake_device`
    # (2.12 on); 2.11's keeps `fake_device`, which the fast path does not know: the
    # constructor is used there. Every tested torch from 2.13 takes the fast path.
    fast_path = "_fake_device" in vars(ref)
    assert make.__name__ == ("make" if fast_path else "construct")
    assert fast_path or release(torch.__version__) < (2, 13, 0)
    assert vars(fast) == vars(ref) and _val_facts(fast) == _val_facts(ref)
    with mode:  # it computes like the constructor's fake
        assert _val_facts(fast.t() @ fast) == _val_facts(ref.t() @ ref)
    monkeypatch.setattr(FakeTensorConfig, "debug", True)  # a traceback per tensor: no copy
    slow = fake_tensor_maker(mode, cpu)
    assert slow.__name__ == "construct"
    assert "_debug_trace" in vars(slow(elem()))


def test_load_restores_the_collector_and_leaves_young_generations_empty(saved, tmp_path):
    import gc

    bad = tmp_path / "bad.jlg"
    _tamper(saved, bad, "graph.json", lambda d: b"{")
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            gc.enable() if enabled else gc.disable()
            loaded = jl.load(str(saved))
            assert gc.isenabled() is enabled
            assert gc.get_count()[0] < 100  # the load's objects aged, not left to gen-0 passes
            with pytest.raises(PersistError):
                jl.load(str(bad))
            assert gc.isenabled() is enabled
        gc.enable()
        gc.freeze()  # a process keeping frozen objects of its own (say, before fork)
        frozen = gc.get_freeze_count()
        jl.load(str(saved))
        # left frozen: nothing thawed, nothing added (frozen objects the load frees leave
        # the count: two on torch 2.15)
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
        gc.enable() if was else gc.disable()
    assert len(loaded.nodes)


# -- a failed save writes nothing (issue #27 item 5) -------------------------------------
def _const_graph():
    torch.manual_seed(0)
    scale = torch.tensor([1.0, 2.0, 3.0])
    model, x = nn.Linear(3, 3), torch.randn(2, 3)
    with pytest.warns(jl.errors.BakedConstantWarning):
        joint = jl.trace(model, lambda m, x: (m(x) * scale).sum(), {"x": x})
    node = next(n for n in joint.graph.nodes if n.op == "get_attr")
    return joint, node


def test_unsaveable_constant_is_refused_naming_it_and_nothing_is_written(tmp_path):
    from torch._subclasses.fake_tensor import FakeTensorMode

    joint, node = _const_graph()
    old = tmp_path / "old.jlg"
    joint.save(old)
    good = old.read_bytes()
    with FakeTensorMode():  # what a trace that read .grad used to bake in
        setattr(joint.graph_module, node.target, torch.ones(3))
    for path in (old, tmp_path / "new.jlg"):
        with pytest.raises(PersistError) as info:
            joint.save(path)
        assert f"'{node.name}'" in str(info.value) and "FakeTensor" in str(info.value)
    assert old.read_bytes() == good  # the earlier archive is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.jlg"]  # no partial file


def test_save_failing_midway_leaves_the_old_archive_and_no_temporary(tmp_path, monkeypatch):
    joint, _ = _const_graph()
    path = tmp_path / "g.jlg"
    joint.save(path)
    good = path.read_bytes()
    real = zipfile.ZipFile.writestr

    def fail_on_constants(self, name, data, *args, **kwargs):
        if name == "constants.pt":
            raise OSError("disk full")
        return real(self, name, data, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "writestr", fail_on_constants)
    with pytest.raises(OSError, match="disk full"):
        joint.save(path)
    with pytest.raises(OSError, match="disk full"):
        joint.save(tmp_path / "new.jlg")
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.jlg"]
    monkeypatch.undo()
    joint.save(path)  # and a save that succeeds reads back
    assert jl.load(path).param_names == joint.param_names
    assert os.stat(path).st_mode & 0o044  # readable by others, as a plain open() would make it

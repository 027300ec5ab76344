"""The torch range policy: no upper cap, one warning on an untested torch, clear errors."""

from __future__ import annotations

import ast
import importlib
import pathlib
import re
import subprocess
import sys
import warnings

import pytest
import torch
from packaging.requirements import Requirement

import jointlab as jl
from jointlab import torch_compat as _torch_version
from jointlab.trace import checkpoint as _checkpoint
from tests.util import assert_unchanged, deep_state

tomllib = pytest.importorskip("tomllib", reason="needs Python 3.11+ to read pyproject.toml")
ROOT = pathlib.Path(__file__).resolve().parent.parent


def _torch_requirement() -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (req,) = [Requirement(d) for d in deps if Requirement(d).name == "torch"]
    return req


def test_range_never_forces_a_downgrade_of_a_newer_torch():
    spec = _torch_requirement().specifier
    # a host's newer torch (Colab's) satisfies it, so pip keeps it
    for newer in ("2.15.0", "2.15.0+cu130", "2.16.1", "3.0.0"):
        assert spec.contains(newer), (str(spec), newer)
    # Colab's torch (2.11.0+cpu, +cu128) is enough: pip keeps it
    for colab in ("2.11.0", "2.11.0+cpu", "2.11.0+cu128", "2.12.1", "2.13.0"):
        assert spec.contains(colab), (str(spec), colab)
    assert not spec.contains("2.10.0")


def test_installed_torch_is_a_tested_one():
    assert _torch_version.is_tested(torch.__version__), torch.__version__


@pytest.mark.parametrize(("version", "tested"), [
    ("2.13.0", True), ("2.13.0+cpu", True), ("2.14.1+cu130", True), ("2.14.0", True),
    ("2.15.0", True), ("2.15.0+cu132", True), ("2.11.0+cpu", True), ("2.11.0+cu128", True),
    ("2.12.1", True), ("2.10.0", False), ("2.10.0+cpu", False), ("2.15.1", False),
    ("2.16.0", False), ("3.0", False)])
def test_tested_range(version, tested):
    assert _torch_version.is_tested(version) is tested


def test_untested_torch_warns_once_naming_both_versions(monkeypatch):
    monkeypatch.setattr(_torch_version, "_warned", False)
    with pytest.warns(jl.errors.UntestedTorchWarning) as record:
        assert _torch_version.warn_if_untested("2.99.0+cu130") is True
        assert _torch_version.warn_if_untested("2.99.0+cu130") is False
    assert len(record) == 1
    msg = str(record[0].message)
    assert "torch 2.99.0+cu130, newer" in msg and _torch_version.TESTED in msg
    assert "jl.compare" in msg and "pip install" not in msg


def test_advice_never_says_to_replace_a_hosted_notebooks_torch(monkeypatch):
    # on Colab another torch is a multi-GB download and a runtime restart
    monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    msg = _torch_version.untested_message("2.99.0")
    assert "pip install" not in msg and "keep this notebook's torch" in msg, msg
    err = str(_torch_version.unsupported("torch._no_such_api", "do a thing", since="2.99"))
    assert "pip install" not in err and "torch 2.99 or newer has it" in err, err
    monkeypatch.delitem(sys.modules, "google.colab")
    assert "pip install" in str(_torch_version.unsupported("torch._no_such_api", "do a thing"))


def test_tested_torch_does_not_warn(monkeypatch):
    monkeypatch.setattr(_torch_version, "_warned", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for version in ("2.11.0+cpu", "2.12.1", "2.13.0+cpu", "2.14.1", "2.15.0+cu132"):
            assert _torch_version.warn_if_untested(version) is False


def test_import_warns_on_an_untested_torch_and_not_on_this_one():
    code = ("import warnings, torch; {patch}warnings.simplefilter('always')\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    import jointlab\n"
            "print(sum(issubclass(x.category, jointlab.errors.UntestedTorchWarning) for x in w))")
    for patch, expected in (("", "0"), ("torch.__version__ = '2.99.0'; ", "1")):
        out = subprocess.run([sys.executable, "-c", code.format(patch=patch)], cwd=ROOT,
                             capture_output=True, text=True, check=True)
        assert out.stdout.strip().splitlines()[-1] == expected, out.stdout + out.stderr


def test_missing_private_module_is_a_clear_jointlab_error():
    with pytest.raises(jl.errors.UnsupportedTorchError) as info:
        _torch_version.torch_module("torch._no_such_module", "read AOT descriptors")
    msg = str(info.value)
    assert f"torch {torch.__version__} has no torch._no_such_module" in msg
    assert "read AOT descriptors" in msg and _torch_version.TESTED in msg
    assert isinstance(info.value.__cause__, ImportError)
    with pytest.raises(jl.errors.UnsupportedTorchError, match="torch.fx.no_such_name"):
        _torch_version.torch_attr("torch.fx", "no_such_name", "trace")


def test_import_names_the_missing_torch_module():
    # a torch whose private module is gone: jointlab's import says so, not an ImportError
    code = ("import sys, torch\n"
            "sys.modules['torch.fx.experimental.proxy_tensor'] = None\n"
            "import jointlab")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0
    assert "jointlab.errors.UnsupportedTorchError" in out.stderr, out.stderr[-2000:]
    missing = f"torch {torch.__version__} has no torch.fx.experimental.proxy_tensor"
    assert missing in out.stderr, out.stderr[-2000:]


def test_module_loaded_on_first_use_is_named_when_first_needed():
    # symbolic shapes load on first use (import jointlab stays light); a torch without
    # them imports jointlab, and jl.trace names the missing module instead of advising
    # the other tracing mode
    code = ("import sys, torch\n"
            "sys.modules['torch.fx.experimental.symbolic_shapes'] = None\n"
            "import jointlab as jl\n"
            "print('imported', flush=True)\n"
            "m = torch.nn.Linear(4, 2); x = torch.randn(3, 4)\n"
            "jl.trace(m, lambda m, x: m(x).sum(), {'x': x})")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert "imported" in out.stdout, out.stderr[-2000:]
    assert out.returncode != 0
    assert "jointlab.errors.UnsupportedTorchError" in out.stderr, out.stderr[-2000:]
    missing = f"torch {torch.__version__} has no torch.fx.experimental.symbolic_shapes"
    assert missing in out.stderr, out.stderr[-2000:]


def test_checkpoint_region_counter_missing_is_a_clear_error(monkeypatch):
    for name in ("_checkpoint_without_reentrant_generator_impl",
                 "_checkpoint_without_reentrant_generator"):
        monkeypatch.setattr(_checkpoint.torch_checkpoint, name, None, raising=False)
    with pytest.raises(jl.errors.UnsupportedTorchError, match="count checkpointed regions"):
        with _checkpoint.checkpoint_tracing():
            pass


def _small_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    inputs = {"x": torch.randn(5, 3), "y": torch.randn(5, 1)}
    return model, (lambda m, x, y: torch.nn.functional.mse_loss(m(x), y)), inputs


@pytest.mark.skipif(_torch_version.release(torch.__version__) < (2, 13, 0),
                    reason="before torch 2.13 jointlab uses its rebuild of the patch")
def test_trace_without_the_engine_patch_refuses(monkeypatch):
    # without it no backward node is tagged; a structural guess would misplace nodes
    model, train_fn, inputs = _small_step()
    before = deep_state(model)
    monkeypatch.delattr(torch.compiler, "_patch_engine_backward")
    with pytest.raises(jl.errors.UnsupportedTorchError,
                       match=r"has no torch\.compiler\._patch_engine_backward"):
        jl.trace(model, train_fn, inputs)
    assert_unchanged(before, model)


def test_measure_without_the_kineto_event_tree_refuses(monkeypatch):
    model, train_fn, inputs = _small_step()
    joint = jl.trace(model, train_fn, inputs)
    monkeypatch.delattr(torch._C._profiler, "_EventType")
    with pytest.raises(jl.errors.UnsupportedTorchError, match="_EventType"):
        joint.memory(model, inputs)


# -- every private torch name goes through jointlab.torch_compat ------------------------
PACKAGE = ROOT / "jointlab"
COMPAT = PACKAGE / "torch_compat"
#: Private torch names that must be reported even where jointlab has a name of its own
#: spelled the same way.
TORCH_PRIVATE = {
    "_C", "_ops", "_guards", "_subclasses", "_dynamo", "_inductor", "_functorch", "_pytree",
    "_sympy", "_python_dispatch", "_dispatch", "_profiler", "_EventType", "_schema",
    "_opname", "_overloadname", "_cdata", "_codegen", "_input_nodes", "_args", "_kwargs",
    "_parameters", "_buffers", "_modules", "_orig_mod", "_sync", "_from_functional_tensor",
    "_non_strict_tracing_context", "_patch_engine_backward", "_reparametrize_module",
    "_backward_hooks", "_post_accumulate_grad_hooks",
}
#: Private attributes that are not torch's, each with the reason it may stay.
ALLOWED = {
    "_getframe": "sys._getframe: CPython, not torch",
    "_repr_html_": "IPython's display protocol, public by convention",
    "_replace": "NamedTuple's public API (the underscore avoids field clashes)",
    "_asdict": "NamedTuple's public API",
    "_fields": "NamedTuple's public API",
    "_field_defaults": "NamedTuple's public API",
    "_jointlab_data": "an attribute jointlab itself sets on a plotly Figure, not torch",
    "_experts_implementation": "a transformers config attribute, not torch",
}


#: Strings naming a private torch API that only name it to the user (never looked up).
ALLOWED_STRINGS = {
    "torch._transformer_encoder_layer_fwd": "the fused kernel a FastPathError names",
    "torch._native_multi_head_attention": "the fused kernel a FastPathError names",
}
#: A dotted path into a private part of torch: ``torch._foo``, ``torch.x._y.z``.
_PRIVATE_PATH = re.compile(r"torch(\.\w+)*\._\w+(\.\w+)*")


def _private_op_namespaces() -> set[str]:
    """The underscore op namespaces this torch registers (``_c10d_functional``, ...)."""
    names = torch._C._dispatch_get_all_op_names()
    return {n.split("::")[0] for n in names if n.startswith("_") and "::" in n}


def _docstrings(tree: ast.AST) -> set[int]:
    """``id`` of every docstring constant (documentation may name what it describes)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _private_torch_strings(tree: ast.AST, namespaces: set[str]) -> list[tuple[int, str]]:
    """``(line, string)`` for a string that names a private torch module, API or op namespace."""
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) \
                or id(node) in docs or node.value in ALLOWED_STRINGS:
            continue
        if _PRIVATE_PATH.fullmatch(node.value) or node.value in namespaces:
            found.append((node.lineno, node.value))
    return found


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _jointlab_private_names() -> set[str]:
    """Private names jointlab defines itself: functions, classes, assignments, modules."""
    names = {p.stem for p in PACKAGE.rglob("*.py")} | {p.name for p in PACKAGE.rglob("*/")}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                names.add(node.attr)
            elif isinstance(node, ast.alias) and node.asname:
                names.add(node.asname)
    return {n for n in names if _is_private(n)} - TORCH_PRIVATE


def _private_torch_uses(path: pathlib.Path, own: set[str], namespaces: set[str]) -> list[str]:
    """``file:line: what`` for each private torch import, attribute, op or string in ``path``.

    Private ATen overloads (``aten._foo``) and private op namespaces
    (``torch.ops._c10d_functional``, or the string ``"_c10d_functional"``) count too.
    """
    found, rel = [], path.relative_to(ROOT)
    tree = ast.parse(path.read_text())
    found += [f'{rel}:{line}: "{s}"' for line, s in _private_torch_strings(tree, namespaces)]
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            parts = node.module.split(".") + [a.name for a in node.names]
            if any(_is_private(p) or p == "experimental" for p in parts):
                what = f"from {node.module} import ..."
        elif isinstance(node, ast.Import):
            bad = [a.name for a in node.names if a.name.split(".")[0] == "torch"
                   and any(_is_private(p) or p == "experimental" for p in a.name.split("."))]
            what = f"import {bad[0]}" if bad else None
        elif isinstance(node, ast.Attribute) and _is_private(node.attr):
            base = node.value
            if not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
                what = node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and _is_private(node.args[1].value)):
            what = f'{node.func.id}(..., "{node.args[1].value}")'
        if what is None:
            continue
        name = what.split('"')[1] if '"' in what else what
        if name in own or name in ALLOWED:
            continue
        found.append(f"{rel}:{node.lineno}: {what}")
    return found


def test_private_torch_apis_are_used_only_in_torch_compat():
    own = _jointlab_private_names()
    namespaces = _private_op_namespaces()
    assert "_c10d_functional" in namespaces  # the check reads the dispatcher, not a list
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if COMPAT not in path.parents
             for hit in _private_torch_uses(path, own, namespaces)]
    assert not found, ("private torch API outside jointlab/torch_compat/ (add an accessor "
                       "there, guarded, and use it):\n" + "\n".join(found))


def test_every_private_name_resolves_on_this_torch():
    for name, (module, attr, _) in _torch_version.PRIVATE.items():
        value = getattr(_torch_version, name)
        expected = importlib.import_module(module)
        assert value is (expected if attr is None else getattr(expected, attr)), name
    with pytest.raises(AttributeError, match="no_such_name"):
        _torch_version.no_such_name  # noqa: B018


def test_missing_private_name_is_a_clear_jointlab_error(monkeypatch):
    monkeypatch.setitem(_torch_version.PRIVATE, "Gone", ("torch._ops", "Gone", "do a thing"))
    with pytest.raises(jl.errors.UnsupportedTorchError, match=r"no torch\._ops\.Gone.*do a thing"):
        _torch_version.Gone  # noqa: B018


class _StorageWithoutCdata:
    def untyped_storage(self):
        return object()


def test_storage_id_follows_storage_sharing_and_refuses_without_cdata():
    a = torch.zeros(4)
    same = [a, a[1:], a.view(2, 2), a.data]
    ids = {_torch_version.storage_id(t) for t in same}
    ptrs = {t.untyped_storage().data_ptr() for t in same}
    assert len(ids) == len(ptrs) == 1
    assert _torch_version.storage_id(torch.zeros(4)) not in ids
    with pytest.raises(jl.errors.UnsupportedTorchError, match="UntypedStorage._cdata"):
        _torch_version.storage_id(_StorageWithoutCdata())


def test_op_schema_is_the_operators_own_and_none_for_other_callables():
    schema = _torch_version.op_schema(torch.ops.aten.add_.Tensor)
    assert str(schema).startswith("aten::add_.Tensor(Tensor(a!) self")
    assert _torch_version.op_schema(torch.add) is None
    assert _torch_version.op_parts(torch.ops.aten.add.Tensor) == ("aten", "add", "Tensor")


def _relu_unused(x):
    y = x * 2
    torch.relu(y)  # a value nobody reads
    return y + 1


def test_free_unused_values_drops_a_value_without_users_at_once():
    gm = torch.fx.symbolic_trace(_relu_unused)
    seen = {}

    class Recording(torch.fx.Interpreter):
        def run_node(self, n):
            seen[n.name] = set(k.name for k in self.env)
            return super().run_node(n)

    plain = Recording(gm)
    plain.run(torch.ones(2))
    assert "relu" in seen["add"]  # fx keeps it alive: no user frees it
    freeing = Recording(gm)
    _torch_version.free_unused_values(freeing)
    freeing.run(torch.ones(2))
    assert "relu" not in seen["add"]
    with pytest.raises(jl.errors.UnsupportedTorchError, match="user_to_last_uses"):
        _torch_version.free_unused_values(torch.fx.Interpreter(gm, garbage_collect_values=False))


def test_compiled_module_check_refuses_without_the_marker(monkeypatch):
    lin = torch.nn.Linear(2, 2)
    assert not _torch_version.is_compiled_module(lin)
    monkeypatch.delattr(torch.nn.Module, "_compiled_call_impl")
    with pytest.raises(jl.errors.UnsupportedTorchError, match="_compiled_call_impl"):
        _torch_version.is_compiled_module(lin)


@pytest.mark.skipif(_torch_version.release(torch.__version__) < (2, 13, 0),
                    reason="before torch 2.13 jointlab uses its rebuild of the anchor")
def test_trace_without_the_stack_trace_anchor_refuses(monkeypatch):
    model, train_fn, inputs = _small_step()
    before = deep_state(model)
    monkeypatch.delattr(torch.fx.proxy, "_register_stack_trace_anchor")
    with pytest.raises(jl.errors.UnsupportedTorchError, match="_register_stack_trace_anchor"):
        jl.trace(model, train_fn, inputs)
    assert_unchanged(before, model)


def test_simulated_worlds_are_refused_before_torch_2_13(monkeypatch):
    """On torch 2.11/2.12 jl.fake_world and DTensor tracing refuse, naming the version."""
    monkeypatch.setattr(torch, "__version__", "2.11.0+cpu")
    with pytest.raises(jl.errors.UnsupportedTorchError) as info:
        with jl.fake_world(2):
            pass
    msg = str(info.value)
    assert "torch 2.11.0+cpu has no" in msg and "torch 2.13 or newer has it" in msg, msg
    assert "jl.fake_world" in msg
    import torch.distributed as dist

    assert not dist.is_initialized()  # refused before it took the process group

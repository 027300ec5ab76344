"""The one place jointlab touches private torch APIs, and its torch-version policy.

jointlab declares ``torch>=2.13`` with no upper cap, so installing it (for
example from a notebook's setup cell on Colab) never replaces the host's torch.
In exchange it says plainly what it does not know:

* ``import jointlab`` warns once (:class:`~jointlab.errors.UntestedTorchWarning`)
  when torch is outside the tested versions;
* every private torch API jointlab uses is reached through this module: the
  names in :data:`PRIVATE` (``from jointlab.torch_compat import FakeTensorMode``),
  the accessors below (:func:`op_schema`, :func:`storage_id`, ...), or
  :func:`torch_module` / :func:`torch_attr` / :func:`unsupported`. A torch that
  lacks one raises :class:`~jointlab.errors.UnsupportedTorchError` naming the
  API, the torch version and the tested versions, instead of an ``ImportError``
  (or a silently different result) from deep inside. ``tests/test_torch_version.py``
  fails on a private torch name used anywhere else in ``jointlab/``.

This module imports nothing beyond torch, and the names in :data:`PRIVATE` are
imported on first use, so ``import jointlab`` stays light.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import warnings
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch

from jointlab.errors import UnsupportedTorchError, UntestedTorchWarning

#: Oldest and newest torch releases the whole test suite passed on.
OLDEST_TESTED = (2, 13, 0)
NEWEST_TESTED = (2, 14, 1)

_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
_warned = False


def _dotted(release: tuple[int, ...]) -> str:
    return ".".join(map(str, release))


TESTED = f"{_dotted(OLDEST_TESTED)} to {_dotted(NEWEST_TESTED)}"


def release(version: str) -> tuple[int, int, int]:
    """The ``(major, minor, micro)`` release of a torch version string.

    Args:
        version: A version such as ``"2.14.1+cu130"`` or ``"2.16.0.dev20261101"``.

    Returns:
        The release numbers; local (``+cpu``) and pre-release parts are dropped.

    Raises:
        ValueError: ``version`` does not start with a release number.
    """
    match = _RELEASE.match(str(version))
    if match is None:
        raise ValueError(f"not a torch version: {version!r}")
    major, minor, micro = match.groups()
    return int(major), int(minor), int(micro or 0)


def is_tested(version: str) -> bool:
    """Whether ``version``'s release lies in the tested range (bounds included)."""
    return OLDEST_TESTED <= release(version) <= NEWEST_TESTED


def untested_message(version: str) -> str:
    """The warning text for an untested torch ``version``."""
    side = "newer" if release(version) > NEWEST_TESTED else "older"
    return (
        f"jointlab is tested with torch {TESTED}; this is torch {version}, {side}. "
        "jointlab relies on private torch APIs: where one is missing it raises "
        "jointlab.errors.UnsupportedTorchError, but where one changed its behaviour the "
        "results are unverified. Check a trace against eager autograd with jl.compare "
        "before you rely on it, or install a tested torch. Silence this warning with "
        "warnings.filterwarnings('ignore', category=jointlab.errors.UntestedTorchWarning).")


def warn_if_untested(version: str | None = None) -> bool:
    """Warn once per process when torch is outside the tested versions.

    Args:
        version: The torch version to check; defaults to the installed one.

    Returns:
        True when this call issued the warning.
    """
    global _warned
    version = torch.__version__ if version is None else version
    if _warned or is_tested(version):
        return False
    _warned = True
    warnings.warn(untested_message(version), UntestedTorchWarning, stacklevel=2)
    return True


def unsupported(api: str, purpose: str) -> UnsupportedTorchError:
    """The error for a torch that lacks ``api``, which jointlab needs for ``purpose``.

    Args:
        api: The missing torch name, e.g. ``"torch.compiler._patch_engine_backward"``.
        purpose: What jointlab needs it for, completing "which jointlab needs to ...".

    Returns:
        The error to raise (chain torch's own with ``raise ... from exc``).
    """
    return UnsupportedTorchError(
        f"torch {torch.__version__} has no {api}, which jointlab needs to {purpose}. "
        f"jointlab is tested with torch {TESTED}: install one of those "
        f"(pip install 'torch=={_dotted(NEWEST_TESTED)}').")


def torch_module(name: str, purpose: str) -> ModuleType:
    """Import the (private) torch module ``name`` or raise :func:`unsupported`'s error.

    Args:
        name: The dotted module name, e.g. ``"torch._functorch._aot_autograd.descriptors"``.
        purpose: What jointlab needs it for.

    Returns:
        The module.

    Raises:
        UnsupportedTorchError: This torch has no such module.
    """
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise unsupported(name, purpose) from exc


def torch_attr(module: str, name: str, purpose: str) -> Any:
    """``module.name`` from a (private) torch module, or raise :func:`unsupported`'s error.

    Args:
        module: The dotted module name.
        name: The attribute to read from it.
        purpose: What jointlab needs it for.

    Returns:
        The attribute's value.

    Raises:
        UnsupportedTorchError: This torch has no such module or attribute.
    """
    value = getattr(torch_module(module, purpose), name, None)
    if value is None:
        raise unsupported(f"{module}.{name}", purpose)
    return value


# -- private names, imported on first use -----------------------------------------
_PROXY = "torch.fx.experimental.proxy_tensor"
_SHAPES = "torch.fx.experimental.symbolic_shapes"
_FAKE = "trace with fake tensors"

#: ``name: (torch module, attribute or None for the module itself, what for)``.
PRIVATE: dict[str, tuple[str, str | None, str]] = {
    "pytree": ("torch.utils._pytree", None, "flatten nested inputs and outputs"),
    "sympy_functions": ("torch.utils._sympy.functions", None, "load symbolic shapes"),
    "int_oo": ("torch.utils._sympy.numbers", "int_oo", "load symbolic shapes"),
    "OpOverload": ("torch._ops", "OpOverload", "recognise ATen operators"),
    "FakeTensor": ("torch._subclasses", "FakeTensor", _FAKE),
    "FakeTensorMode": ("torch._subclasses", "FakeTensorMode", _FAKE),
    "DataDependentOutputException": ("torch._subclasses.fake_tensor",
                                     "DataDependentOutputException", _FAKE),
    "DynamicOutputShapeException": ("torch._subclasses.fake_tensor",
                                    "DynamicOutputShapeException", _FAKE),
    "FunctionalTensor": ("torch._subclasses.functional_tensor", "FunctionalTensor",
                         "see through AOT's functional tensors"),
    "sync_functional": ("torch", "_sync", "see through AOT's functional tensors"),
    "from_functional_tensor": ("torch", "_from_functional_tensor",
                               "see through AOT's functional tensors"),
    "TracingContext": ("torch._guards", "TracingContext", _FAKE),
    "tracing": ("torch._guards", "tracing", _FAKE),
    "TorchDispatchMode": ("torch.utils._python_dispatch", "TorchDispatchMode",
                          "watch the aten ops train_fn runs"),
    "enable_python_dispatcher": ("torch._dispatch.python", "enable_python_dispatcher",
                                 "trace with dynamic shapes"),
    "make_fx": (_PROXY, "make_fx", "trace a training step"),
    "get_proxy_mode": (_PROXY, "get_proxy_mode", "trace a training step"),
    "get_innermost_proxy_mode": (_PROXY, "get_innermost_proxy_mode", "probe module outputs"),
    "get_proxy_slot": (_PROXY, "get_proxy_slot", "probe module outputs"),
    "DimDynamic": (_SHAPES, "DimDynamic", "trace with dynamic shapes"),
    "ShapeEnv": (_SHAPES, "ShapeEnv", "trace with dynamic shapes"),
    "StatelessSymbolicContext": (_SHAPES, "StatelessSymbolicContext",
                                 "trace with dynamic shapes"),
    "GuardOnDataDependentSymNode": (_SHAPES, "GuardOnDataDependentSymNode",
                                    "explain data-dependent branches"),
    "reparametrize_module": ("torch.nn.utils.stateless", "_reparametrize_module",
                             "trace with the parameters as graph inputs"),
    "non_strict_tracing_context": ("torch.compiler", "_non_strict_tracing_context",
                                   "trace a training step"),
    "FakeStore": ("torch.testing._internal.distributed.fake_pg", "FakeStore",
                  "simulate a distributed world with the fake process group"),
    "LocalTensorMode": ("torch.distributed._local_tensor", "LocalTensorMode",
                        "run every rank of a simulated world in one process"),
    "LocalTensor": ("torch.distributed._local_tensor", "LocalTensor",
                    "run every rank of a simulated world in one process"),
    "LOCAL_TENSOR_MESH_METHODS": ("torch.distributed._local_tensor",
                                  "_PATCHED_DEVICE_MESH_METHODS",
                                  "make the device mesh report the rank being traced"),
    "inductor_compile": ("torch._inductor", "compile",
                         "compile the joint graph itself and map its kernels onto it"),
    "build_memory_profile": ("torch._inductor.fx_passes.memory_estimator",
                             "build_memory_profile",
                             "cross-check the memory prediction against Inductor's estimator"),
}


def _resolve(name: str) -> Any:
    value = globals().get(name)
    return __getattr__(name) if value is None else value


def __getattr__(name: str) -> Any:
    """Resolve a name of :data:`PRIVATE` on first use (``from jointlab.torch_compat import X``).

    Raises:
        AttributeError: ``name`` is not one of :data:`PRIVATE`.
        UnsupportedTorchError: This torch lacks the module or attribute.
    """
    spec = PRIVATE.get(name)
    if spec is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr, purpose = spec
    value = torch_module(module, purpose) if attr is None else torch_attr(module, attr, purpose)
    globals()[name] = value
    return value


def _required(obj: Any, attr: str, api: str, purpose: str) -> Any:
    value = getattr(obj, attr, None)
    if value is None:
        raise unsupported(api, purpose)
    return value


# -- private attributes of public torch objects ----------------------------------------
def is_op_overload(target: Any) -> bool:
    """Whether ``target`` is an operator overload such as ``torch.ops.aten.add.Tensor``."""
    return isinstance(target, _resolve("OpOverload"))


def op_schema(target: Any) -> Any:
    """The ``FunctionSchema`` of an operator overload, or None for anything else.

    Raises:
        UnsupportedTorchError: An ``OpOverload`` of this torch has no ``_schema``.
    """
    if not is_op_overload(target):
        return None
    return _required(target, "_schema", "OpOverload._schema", "read operator schemas")


def graph_codegen(graph: Any) -> Any:
    """The code generator of an ``fx.Graph`` (FX has ``set_codegen`` but no public getter).

    Raises:
        UnsupportedTorchError: This torch's ``fx.Graph`` keeps no ``_codegen``.
    """
    return _required(graph, "_codegen", "fx.Graph._codegen", "copy a graph's calling convention")


def op_parts(target: Any) -> tuple[str, str, str]:
    """``(namespace, op, overload)`` of an operator overload: ``("aten", "add", "Tensor")``.

    Raises:
        UnsupportedTorchError: This torch's ``OpOverload`` lacks the private names.
    """
    purpose = "name operators in saved graphs"
    return (target.namespace, _required(target, "_opname", "OpOverload._opname", purpose),
            _required(target, "_overloadname", "OpOverload._overloadname", purpose))


def storage_id(t: Any) -> int | None:
    """An identity of ``t``'s storage, shared by its views and ``.data`` (None if it has none).

    Raises:
        UnsupportedTorchError: This torch's storages have no ``_cdata``.
    """
    try:
        storage = t.untyped_storage()
    except Exception:  # sparse, nested or otherwise storage-less values
        return None
    return _required(storage, "_cdata", "UntypedStorage._cdata",
                     "tell which tensors share storage")


#: FakeTensor attributes ``FakeTensor.__new__`` may set to something other than None.
_FAKE_SET = frozenset({"_fake_device", "fake_mode"})


def fake_tensor_maker(mode: Any, device: torch.device) -> Callable[[torch.Tensor], Any]:
    """A function doing ``FakeTensor(mode, elem, device)`` for many meta tensors, cheaper.

    ``FakeTensor.__new__`` normalizes the device and sets about twenty attributes
    through descriptors on every call (two thirds of its cost). The fast path
    builds one fake tensor the ordinary way and gives every other one that
    tensor's attribute dict, after ``Tensor._make_subclass`` with the same
    dispatch device and the same mutable-data-pointer guard. It is used only
    when a probe made both ways agrees (type, attributes, dispatch keys,
    device); otherwise the constructor itself is returned.

    Args:
        mode: The ``FakeTensorMode`` the tensors belong to.
        device: The device they fake.

    Returns:
        A function from a meta tensor to its fake tensor.
    """
    fake_cls = _resolve("FakeTensor")

    def construct(elem: torch.Tensor) -> Any:
        return fake_cls(mode, elem, device)

    reference = construct(torch.empty(0, device="meta"))
    template = dict(reference.__dict__)
    make_subclass = getattr(torch.Tensor, "_make_subclass", None)
    unsafe = getattr(mode, "_allow_unsafe_data_ptr_access", None)
    guard = getattr(torch._C, "_set_warn_deprecated_on_mutable_data_ptr" if unsafe
                    else "_set_throw_on_mutable_data_ptr", None)
    dispatch_keys = getattr(torch._C, "_dispatch_keys", None)
    if None in (unsafe, make_subclass, guard, dispatch_keys) or any(
            v is not None for k, v in template.items() if k not in _FAKE_SET):
        return construct  # e.g. FakeTensorConfig.debug records a traceback per tensor
    backend = template.get("_fake_device")

    def make(elem: torch.Tensor) -> Any:
        fake = make_subclass(fake_cls, elem, elem.requires_grad, dispatch_device=True,
                             device_for_backend_keys=backend)
        guard(fake)
        fake.__dict__.update(template)
        return fake

    try:
        probe = make(torch.empty(0, device="meta"))
    except (TypeError, RuntimeError, AttributeError):
        return construct
    agrees = (type(probe) is type(reference) and probe.__dict__ == template
              and dispatch_keys(probe) == dispatch_keys(reference)
              and probe.device == reference.device
              and probe.requires_grad == reference.requires_grad)
    return make if agrees else construct


def module_stores(mod: torch.nn.Module) -> tuple[dict[str, Any], dict[str, Any]]:
    """The live ``_parameters`` and ``_buffers`` dicts of ``mod`` (to snapshot and restore)."""
    purpose = "restore the model after tracing"
    return (_required(mod, "_parameters", "Module._parameters", purpose),
            _required(mod, "_buffers", "Module._buffers", purpose))


def root_mesh(mesh: Any) -> Any:
    """The ``DeviceMesh`` a sub-mesh was sliced from (``mesh`` itself when it is a root).

    Returns None on a torch whose ``DeviceMesh`` lacks ``_get_root_mesh``.
    """
    get_root = getattr(mesh, "_get_root_mesh", None)
    return get_root() if callable(get_root) else None


def per_rank_values(t: torch.Tensor) -> dict[int, torch.Tensor]:
    """Each simulated rank's tensor inside a ``LocalTensor`` (``LocalTensorMode``).

    Raises:
        UnsupportedTorchError: ``t`` has no per-rank tensors on this torch.
    """
    values = getattr(t, "_local_tensors", None)
    if not isinstance(values, dict):
        raise unsupported("LocalTensor._local_tensors", "read every simulated rank's values")
    return dict(values)


def mesh_coordinates(mesh: Any) -> dict[int, tuple[int, ...]]:
    """Each rank's coordinate on ``mesh`` (a root mesh or a slice of one), in pure Python.

    It follows ``DeviceMesh``'s layout the way ``_MeshLayout.remap_to_tensor``
    does (one copy of the sub-mesh per complement offset), without tensor ops, so
    it is safe to call while make_fx is tracing. For ``mesh["tp"]`` of a
    ``(dp=2, tp=2)`` mesh: ``{0: (0,), 1: (1,), 2: (0,), 3: (1,)}``.

    Raises:
        UnsupportedTorchError: This torch's ``DeviceMesh`` lacks the layout names.
    """
    purpose = "find a rank's coordinate on a device mesh"
    layout = _required(mesh, "_layout", "DeviceMesh._layout", purpose)
    rank_map = _required(mesh, "_flatten_rank_map", "DeviceMesh._flatten_rank_map", purpose)
    try:
        flat = layout.collapse()
        offsets = flat.complement(len(rank_map)).all_ranks_from_zero()
        inner = flat.all_ranks_from_zero()
        sizes = tuple(layout.top_level_sizes)
    except AttributeError as exc:
        raise unsupported("DeviceMesh._layout's collapse/complement/all_ranks_from_zero",
                          purpose) from exc
    out: dict[int, tuple[int, ...]] = {}
    for offset in offsets:
        for j, pos in enumerate(inner):
            coord, rest = [], j
            for size in reversed(sizes):
                rest, c = divmod(rest, size)
                coord.append(c)
            out[int(rank_map[offset + pos])] = tuple(reversed(coord))
    return out


#: The DeviceMesh methods that report the calling rank (``jointlab.trace.rank_view`` sets them).
_MESH_RANK_METHODS = ("get_coordinate", "get_local_rank", "get_rank",
                      "_is_current_rank_part_of_mesh", "_sym_get_coordinate")


def mesh_rank_methods() -> tuple[str, ...]:
    """The ``DeviceMesh`` methods that answer for one rank, as jointlab patches them.

    Raises:
        UnsupportedTorchError: LocalTensorMode patches a method this list lacks
            (a torch whose meshes report the rank in a way jointlab does not know),
            or ``DeviceMesh`` lacks one of them.
    """
    from torch.distributed.device_mesh import DeviceMesh

    purpose = "make the device mesh report the rank being traced"
    unknown = set(_resolve("LOCAL_TENSOR_MESH_METHODS")) - set(_MESH_RANK_METHODS)
    if unknown:
        raise unsupported(f"a DeviceMesh without rank-reporting methods {sorted(unknown)}",
                          purpose)
    for name in _MESH_RANK_METHODS:
        _required(DeviceMesh, name, f"DeviceMesh.{name}", purpose)
    return _MESH_RANK_METHODS


@contextlib.contextmanager
def patched_attrs(patches: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Set ``obj.name = value`` for each patch; put every original back on exit, even on error."""
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def record_module_stack_of(fn: Callable[..., Any], model: torch.nn.Module) -> None:
    """Make ``make_fx(fn, record_module_stack=True)`` record ``model``'s module stack.

    make_fx looks for the module on the traced callable's ``_orig_mod`` attribute
    (the convention of ``torch.compile``'s wrapper); without it nothing is recorded.
    """
    fn._orig_mod = model  # type: ignore[attr-defined]


def kineto_event_tree(prof: torch.profiler.profile) -> list[Any]:
    """The root events of a finished CPU profile (kineto's experimental event tree).

    Raises:
        UnsupportedTorchError: This torch's profiler has no event tree.
    """
    tree = getattr(getattr(prof.profiler, "kineto_results", None),
                   "experimental_event_tree", None)
    if tree is None:
        raise unsupported("the profiler's kineto_results.experimental_event_tree",
                          "measure allocations")
    return tree()


def allocation_event_tag() -> Any:
    """The tag of allocation events in :func:`kineto_event_tree`."""
    return torch_attr("torch._C._profiler", "_EventType", "measure allocations").Allocation


def free_unused_values(interp: torch.fx.Interpreter) -> None:
    """Have ``interp`` drop each value nobody reads right after its node runs.

    ``fx.Interpreter(garbage_collect_values=True)`` frees a value after its last
    user, so a value without users (an in-place op's result) stays alive to the
    end; the generated code frees it at once. This adds those frees to the
    Interpreter's undocumented ``user_to_last_uses`` table.

    Raises:
        UnsupportedTorchError: This torch's Interpreter has no such table.
    """
    table = getattr(interp, "user_to_last_uses", None)
    if not isinstance(table, dict):
        raise unsupported("torch.fx.Interpreter.user_to_last_uses", "free values like "
                          "the generated code when measuring memory")
    for node in interp.graph.nodes:
        if not node.users and node.op not in ("placeholder", "output"):
            table.setdefault(node, []).append(node)


def engine_backward_patch() -> Callable[[], Any]:
    """``torch.compiler._patch_engine_backward``: tags backward nodes while make_fx traces.

    Raises:
        UnsupportedTorchError: This torch has no such patch (phases guessed from
            structure would put some forward nodes in the backward).
    """
    return _required(torch.compiler, "_patch_engine_backward",
                     "torch.compiler._patch_engine_backward",
                     "tell the backward nodes of a make_fx trace from the forward ones")


def keep_stack_frames_of(fn: Callable[..., Any]) -> None:
    """Keep ``fn``'s frame in make_fx stack traces (by default only ``forward`` frames).

    Raises:
        UnsupportedTorchError: This torch cannot register the frame, so the loss's
            ops would have no source line.
    """
    _required(torch.fx.proxy, "_register_stack_trace_anchor",
              "torch.fx.proxy._register_stack_trace_anchor",
              "give the ops of train_fn a source line")(fn)


def is_compiled_module(mod: torch.nn.Module) -> bool:
    """Whether ``mod`` is ``torch.compile``'s wrapper or was compiled with ``mod.compile()``.

    Raises:
        UnsupportedTorchError: This torch's ``nn.Module`` has no ``_compiled_call_impl``,
            so a ``mod.compile()``-d module could not be recognised.
    """
    if not hasattr(torch.nn.Module, "_compiled_call_impl"):
        raise unsupported("torch.nn.Module._compiled_call_impl", "recognise compiled modules")
    wrapper = type(mod).__name__ == "OptimizedModule" and hasattr(mod, "_orig_mod")
    return wrapper or getattr(mod, "_compiled_call_impl", None) is not None


def checkpoint_region_entry() -> str:
    """The ``torch.utils.checkpoint`` function every non-reentrant region enters.

    torch 2.14 has ``checkpoint()`` call ``..._generator_impl`` directly; 2.13 calls
    ``..._generator``. Counting the wrong one would count no region at all.

    Raises:
        UnsupportedTorchError: This torch has neither.
    """
    ckpt = torch_module("torch.utils.checkpoint", "count checkpointed regions")
    for name in ("_checkpoint_without_reentrant_generator_impl",
                 "_checkpoint_without_reentrant_generator"):
        if callable(getattr(ckpt, name, None)):
            return name
    raise unsupported("torch.utils.checkpoint._checkpoint_without_reentrant_generator",
                      "count checkpointed regions")


def checkpoint_internals() -> tuple[Callable[..., Any], type]:
    """``torch.utils.checkpoint``'s recompute runner and reentrant ``CheckpointFunction``.

    Raises:
        UnsupportedTorchError: This torch lacks either.
    """
    ckpt = torch_module("torch.utils.checkpoint", "trace gradient checkpointing exactly")
    run = getattr(ckpt, "_run_fn_with_dynamo_disabled", None)
    func = getattr(ckpt, "CheckpointFunction", None)
    if run is None or func is None:
        raise unsupported("torch.utils.checkpoint._run_fn_with_dynamo_disabled or "
                          "CheckpointFunction", "trace gradient checkpointing exactly")
    return run, func


def inductor_provenance(compiled: Callable[..., Any]) -> tuple[dict[str, Any], str]:
    """Inductor's kernel provenance and output code for a ``torch._inductor.compile`` result.

    Inductor (``trace.provenance_tracking_level=1``) leaves, on the callable it
    returns, a JSON mapping between the graph it was given ("pre-grad" nodes),
    its post-grad nodes and its kernels (``preToPost``, ``postToPre``,
    ``cppCodeToPost``, ``postToCppCode``), and the generated Python wrapper code.

    Args:
        compiled: What ``torch._inductor.compile`` returned.

    Returns:
        ``(mapping, source code)``.

    Raises:
        UnsupportedTorchError: This torch leaves no such attributes.
    """
    text = getattr(compiled, "inductor_provenance_mapping_str", None)
    source = getattr(compiled, "source_code", None)
    if not isinstance(text, str) or not text or not isinstance(source, str):
        raise unsupported("inductor_provenance_mapping_str/source_code on compiled graphs",
                          "map Inductor's kernels onto the joint graph")
    return json.loads(text), source


def inductor_wrapper_globals(compiled: Callable[..., Any]) -> dict[str, Any]:
    """The module namespace of a ``torch._inductor.compile`` result's generated wrapper code.

    Its ``call`` runs the kernels; its globals hold the loaded kernels
    (``cpp_fused_*``, ``extern_kernels``, ``reinterpret_tensor``...).

    Args:
        compiled: What ``torch._inductor.compile`` returned.

    Returns:
        The generated module's globals.

    Raises:
        UnsupportedTorchError: This torch keeps no ``current_callable`` with module globals.
    """
    call = getattr(compiled, "current_callable", None)
    func = getattr(call, "__func__", call)
    namespace = getattr(func, "__globals__", None)
    if not isinstance(namespace, dict) or "call" not in namespace:
        raise unsupported("current_callable of compiled graphs (the generated wrapper's call)",
                          "step the kernels of a compiled joint graph")
    return namespace


# -- completing Inductor's provenance around pattern replacements -----------------
_ABSORBED = "jointlab_absorbed"  # the pass name on the provenance jointlab adds


def _replacements(graph: torch.fx.Graph, outputs: list[Any]) -> list[Any]:
    """Nodes of ``graph`` whose provenance names one of ``outputs`` (a replaced match output)."""
    gid, names = id(graph), {o.name for o in outputs}
    return [n for n in graph.nodes
            if any(s.name in names and s.graph_id == gid for s in n.meta.get("from_node", ()))]


def _recording_erase(original: Callable[..., Any], node_source: Any,
                     action: Any) -> Callable[..., Any]:
    def erase_nodes(match: Any) -> None:
        graph = match.graph
        outputs = [o for o in match.output_nodes() if o is not None and not o.users]
        original(match)
        alive = set(graph.nodes)
        absorbed = [n for n in match.nodes if n not in alive and n not in outputs
                    and n.op == "call_function"]
        if not absorbed or not outputs:
            return
        for new in _replacements(graph, outputs):
            new.meta["from_node"] = [*new.meta.get("from_node", ()),
                                     *(node_source(a, _ABSORBED, action) for a in absorbed)]
    return erase_nodes


def _recording_codegen(original: Callable[..., Any], lowered: list[Any]) -> Callable[..., Any]:
    def codegen(graph: Any) -> Any:
        out = original(graph)
        names = {}
        for buf in graph.buffers:
            origin = getattr(buf, "origin_node", None)
            if origin is not None:
                names[buf.get_name()] = origin.name
        lowered.append((graph.module, names))
        return out
    return codegen


@contextlib.contextmanager
def complete_inductor_provenance() -> Iterator[dict[str, Any]]:
    """Inductor options and patches under which a compile records its full provenance.

    Inductor's pattern replacements (``mm`` + ``add`` -> ``addmm``, ...) record
    only the match's output node as the source of the replacement; the other
    nodes they consume vanish from ``trace.provenance_tracking_level=1``'s
    mapping (the tied-weight gradient ``mm`` of a GPT became part of an
    ``addmm`` nobody said covered it). While this context is open, each match
    that erases such nodes adds them, as provenance with pass name
    ``jointlab_absorbed``, to the nodes that replaced its outputs, so Inductor's
    own mapping carries them on to the kernel. Each lowering also leaves the
    graph it lowered (post-grad, after decompositions and pattern passes) and
    which of its nodes each buffer of the generated code holds (Inductor's
    best-effort ``origin_node``). The yielded options turn the FX-graph cache
    off: a cached compile lowers nothing, so it would leave neither record.

    Yields:
        ``{"options": Inductor options to compile with, "lowered": [(post-grad
        graph module, {buffer name: its node's name}), ...]}``.

    Raises:
        UnsupportedTorchError: This torch lacks the pattern matcher's ``Match``,
            ``NodeSource`` or ``GraphLowering.codegen``.
    """
    purpose = "map the nodes Inductor's pattern replacements consume onto their kernels"
    match_cls = torch_attr("torch._inductor.pattern_matcher", "Match", purpose)
    lowering = torch_attr("torch._inductor.graph", "GraphLowering", purpose)
    node_source = torch_attr("torch.fx.traceback", "NodeSource", purpose)
    action = torch_attr("torch.fx.traceback", "NodeSourceAction", purpose).REPLACE
    erase = _required(match_cls, "erase_nodes", "Match.erase_nodes", purpose)
    codegen = _required(lowering, "codegen", "GraphLowering.codegen", purpose)
    record: dict[str, Any] = {"options": {"fx_graph_cache": False}, "lowered": []}
    match_cls.erase_nodes = _recording_erase(erase, node_source, action)
    lowering.codegen = _recording_codegen(codegen, record["lowered"])
    try:
        yield record
    finally:
        match_cls.erase_nodes = erase
        lowering.codegen = codegen


# -- FSDP2's memory tracker -------------------------------------------------------
def fsdp_mem_tracker() -> type:
    """``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker``, the FSDP2 memory tracker.

    A ``TorchDispatchMode`` that sizes the storages of one eager FSDP2 step by
    category (sharded/unsharded parameters and gradients, activations,
    temporaries, all-gather and reduce-scatter buffers, optimizer state,
    inputs); its snapshot keys are a ``str`` enum plus ``"Total"``.

    Raises:
        UnsupportedTorchError: This torch has no such module or class.
    """
    return torch_attr("torch.distributed._tools.fsdp2_mem_tracker", "FSDPMemTracker",
                      "cross-check per-rank memory against FSDP2's own memory tracker")


# -- mode='aot' with DTensor state: the gradients' subclass metadata ---------------------
_AOT_GRAD_META = "wrap the AOT graph's local gradients back into DTensors"


def aot_grad_subclass_metas(export: Any) -> list[tuple[Any, Any]]:
    """Each flat input of an AOT joint export with its gradient's subclass metadata.

    ``aot_export_joint_with_descriptors`` flattens a DTensor gradient into its
    local tensor; how to wrap it back (placements, global size and stride) is
    in the export's ``SubclassMeta.grad_input_metas``, one per flat input.

    Args:
        export: The ``JointWithDescriptors`` the export returned.

    Returns:
        ``(input descriptor, its gradient's creation metadata)`` per flat input
        (a plain tensor's metadata has no ``meta``); empty without subclass inputs.

    Raises:
        UnsupportedTorchError: This torch keeps that metadata elsewhere.
    """
    capture = _required(export, "_aot_graph_capture", "JointWithDescriptors._aot_graph_capture",
                        _AOT_GRAD_META)
    state = _required(export, "_aot_state", "JointWithDescriptors._aot_state", _AOT_GRAD_META)
    descs = _required(state, "flat_args_descs", "AOTState.flat_args_descs", _AOT_GRAD_META)
    sub = getattr(capture, "maybe_subclass_meta", None)  # None: no subclass among the inputs
    if sub is None:
        return []
    metas = _required(sub, "grad_input_metas", "SubclassMeta.grad_input_metas", _AOT_GRAD_META)
    if len(metas) != len(descs):
        raise unsupported("one SubclassMeta.grad_input_metas entry per flat input",
                          _AOT_GRAD_META)
    return list(zip(descs, metas))


def subclass_creation_parts(meta: Any) -> tuple[Any, tuple[int, ...], tuple[int, ...]] | None:
    """``(flatten context, outer size, outer stride)`` of a subclass creation metadata.

    Args:
        meta: One entry of :func:`aot_grad_subclass_metas`.

    Returns:
        What ``__tensor_unflatten__`` takes besides the inner tensors; None for
        a plain tensor's metadata.

    Raises:
        UnsupportedTorchError: It is a subclass's metadata without those fields.
    """
    if not hasattr(meta, "original_subclass_type"):
        return None
    parts = [getattr(meta, a, None) for a in ("meta", "outer_size", "outer_stride")]
    if any(p is None for p in parts):
        raise unsupported("SubclassCreationMeta.meta/outer_size/outer_stride", _AOT_GRAD_META)
    return parts[0], tuple(parts[1]), tuple(parts[2])


def opaque_real_object(obj: Any) -> Any:
    """The Python object a traced opaque constant stands for (a DTensor's ``DeviceMesh``).

    AOT lifts a mesh it meets inside the traced step (``DTensor.from_local`` in the
    forward) as a ``FakeScriptObject`` attribute of the graph module.

    Args:
        obj: That attribute's value.

    Returns:
        The real object (``FakeScriptObject.real_obj``).

    Raises:
        UnsupportedTorchError: This torch's fake script objects do not keep it.
    """
    real = getattr(obj, "real_obj", None)
    if real is None:
        raise unsupported("FakeScriptObject.real_obj", _AOT_GRAD_META)
    return real

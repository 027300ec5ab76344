"""Guarded accessors for private attributes of public torch objects: ops, graphs, tracing.

Operator overloads and their schemas, an FX graph's codegen, storages,
fast fake tensors for loading a graph, a module's parameter and buffer
dicts, a tensor's Python hooks, make_fx's module-stack hook, the profiler's
event tree, the FX interpreter's freeing of dead values, the autograd engine patch, frames,
compiled modules, activation checkpointing internals and the Python
decompositions an op carries for the Python dispatcher.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from jointlab.torch_compat._base import required, resolve, torch_attr, torch_module, unsupported


def is_op_overload(target: Any) -> bool:
    """Whether ``target`` is an operator overload such as ``torch.ops.aten.add.Tensor``."""
    return isinstance(target, resolve("OpOverload"))


def op_schema(target: Any) -> Any:
    """The ``FunctionSchema`` of an operator overload, or None for anything else.

    Raises:
        UnsupportedTorchError: An ``OpOverload`` of this torch has no ``_schema``.
    """
    if not is_op_overload(target):
        return None
    return required(target, "_schema", "OpOverload._schema", "read operator schemas")


def graph_codegen(graph: Any) -> Any:
    """The code generator of an ``fx.Graph`` (FX has ``set_codegen`` but no public getter).

    Raises:
        UnsupportedTorchError: This torch's ``fx.Graph`` keeps no ``_codegen``.
    """
    return required(graph, "_codegen", "fx.Graph._codegen", "copy a graph's calling convention")


def op_parts(target: Any) -> tuple[str, str, str]:
    """``(namespace, op, overload)`` of an operator overload: ``("aten", "add", "Tensor")``.

    Raises:
        UnsupportedTorchError: This torch's ``OpOverload`` lacks the private names.
    """
    purpose = "name operators in saved graphs"
    return (target.namespace, required(target, "_opname", "OpOverload._opname", purpose),
            required(target, "_overloadname", "OpOverload._overloadname", purpose))


def storage_id(t: Any) -> int | None:
    """An identity of ``t``'s storage, shared by its views and ``.data`` (None if it has none).

    Raises:
        UnsupportedTorchError: This torch's storages have no ``_cdata``.
    """
    try:
        storage = t.untyped_storage()
    except Exception:  # sparse, nested or otherwise storage-less values
        return None
    return required(storage, "_cdata", "UntypedStorage._cdata",
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
    fake_cls = resolve("FakeTensor")

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
    return (required(mod, "_parameters", "Module._parameters", purpose),
            required(mod, "_buffers", "Module._buffers", purpose))


_NO_ATTRIBUTE = object()


def _hook_dict(t: torch.Tensor, attr: str, api: str) -> list[Callable[..., Any]]:
    hooks = getattr(t, attr, _NO_ATTRIBUTE)
    if hooks is _NO_ATTRIBUTE:
        raise unsupported(api, "apply or refuse a parameter's hooks while tracing")
    return list((hooks or {}).values())


def tensor_hooks(t: torch.Tensor) -> list[Callable[..., Any]]:
    """The Python functions of ``t.register_hook(fn)``, in registration order.

    Torch keeps them in ``Tensor._backward_hooks`` (None until the first one).

    Raises:
        UnsupportedTorchError: This torch's tensors have no ``_backward_hooks``.
    """
    return _hook_dict(t, "_backward_hooks", "Tensor._backward_hooks")


def post_accumulate_grad_hooks(t: torch.Tensor) -> list[Callable[..., Any]]:
    """The functions of ``t.register_post_accumulate_grad_hook(fn)``, in registration order.

    Raises:
        UnsupportedTorchError: This torch's tensors have no ``_post_accumulate_grad_hooks``.
    """
    return _hook_dict(t, "_post_accumulate_grad_hooks", "Tensor._post_accumulate_grad_hooks")


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


def _before_2_13() -> bool:
    from jointlab.torch_compat._base import release

    return release(torch.__version__) < (2, 13, 0)


def engine_backward_patch() -> Callable[[], Any]:
    """``torch.compiler._patch_engine_backward``: tags backward nodes while make_fx traces.

    torch 2.11 and 2.12 lack it: there, :mod:`jointlab.torch_compat.backport`'s rebuild
    of it from the pieces they have.

    Raises:
        UnsupportedTorchError: This torch has no such patch and is not one the rebuild
            serves (phases guessed from structure would put some forward nodes in the
            backward).
    """
    if _before_2_13() and not hasattr(torch.compiler, "_patch_engine_backward"):
        from jointlab.torch_compat import backport

        return backport.patch_engine_backward
    patch = required(torch.compiler, "_patch_engine_backward",
                     "torch.compiler._patch_engine_backward",
                     "tell the backward nodes of a make_fx trace from the forward ones "
                     "(jl.trace's default mode; mode='aot' does not need it)", since="2.11")
    return lambda: _then_clear_callback_flag(patch)


_LOGGING_UTILS = "torch._functorch._aot_autograd.logging_utils"


@contextlib.contextmanager
def backward_callback_flag_cleared() -> Iterator[None]:
    """On exit, even by an error, torch's "end-of-backward callback queued" flag is cleared.

    torch keeps that flag in a module global (``logging_utils.callback_set``),
    set by the first backward node's hook in a make_fx or AOT trace and cleared
    by the callback the engine runs when that backward ends. A backward that
    raises (a refused trace) never runs it, so the flag stays set and every
    later trace in the process skips the callback: nodes made after its
    backward (the output) keep the last backward node's stack trace and mark.
    """
    try:
        yield
    finally:
        module = torch_module(_LOGGING_UTILS, "clear the flag a failed backward leaves set")
        if hasattr(module, "callback_set"):
            module.callback_set = False


@contextlib.contextmanager
def _then_clear_callback_flag(patch: Callable[[], Any]) -> Iterator[None]:
    """``patch()`` inside :func:`backward_callback_flag_cleared`."""
    with backward_callback_flag_cleared(), patch():
        yield


@contextlib.contextmanager
def non_strict_tracing_context() -> Iterator[None]:
    """``torch.compiler._non_strict_tracing_context()``, plus the backport's frame filter.

    The filter is entered where this torch has no ``_register_stack_trace_anchor``
    (2.11 and 2.12). torch 2.12 has the context but not the anchors: both are entered there, so the
    ops of ``train_fn`` keep their source line.

    Raises:
        UnsupportedTorchError: This torch has no such context.
    """
    native = None
    if not (_before_2_13() and not hasattr(torch.compiler, "_non_strict_tracing_context")):
        native = required(torch.compiler, "_non_strict_tracing_context",
                          "torch.compiler._non_strict_tracing_context",
                          "trace a training step with make_fx (jl.trace's default mode; "
                          "mode='aot' does not need it)", since="2.11")
    with contextlib.ExitStack() as stack:
        if _before_2_13() and not hasattr(torch.fx.proxy, "_register_stack_trace_anchor"):
            from jointlab.torch_compat import backport

            stack.enter_context(backport.non_strict_tracing_context())
        if native is not None:
            stack.enter_context(native())
        yield


def make_fx_joint_supported() -> None:
    """Raise before any work when this torch cannot make a make_fx joint trace."""
    engine_backward_patch()
    if not _before_2_13():
        required(torch.compiler, "_non_strict_tracing_context",
                 "torch.compiler._non_strict_tracing_context",
                 "trace a training step with make_fx (jl.trace's default mode; "
                 "mode='aot' does not need it)", since="2.11")
    keep_stack_frames_of(None, check_only=True)


def keep_stack_frames_of(fn: Callable[..., Any] | None, check_only: bool = False) -> None:
    """Keep ``fn``'s frame in make_fx stack traces (by default only ``forward`` frames).

    Raises:
        UnsupportedTorchError: This torch cannot register the frame, so the loss's
            ops would have no source line.
    """
    if _before_2_13() and not hasattr(torch.fx.proxy, "_register_stack_trace_anchor"):
        from jointlab.torch_compat import backport

        if not check_only and fn is not None:
            backport.register_stack_trace_anchor(fn)
        return
    register = required(torch.fx.proxy, "_register_stack_trace_anchor",
                        "torch.fx.proxy._register_stack_trace_anchor",
                        "give the ops of train_fn a source line", since="2.11")
    if not check_only:
        register(fn)


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


@contextlib.contextmanager
def without_python_decompositions(ops: tuple[Any, ...]) -> Iterator[None]:
    """Hide the Python decompositions of ``ops`` (their autograd-level ``py_impl``) in the block.

    Under the Python dispatcher (AOT export, dynamic make_fx) a decomposition
    registered with ``op.py_impl(DispatchKey.CompositeImplicitAutograd)`` (or
    ``Autograd``) replaces the op's C++ kernel; hiding it makes the op run its
    C++ composite, as eager does. They are restored afterwards, also on error.

    Args:
        ops: Operator overloads, e.g. ``torch.ops.aten.lstm.input``.

    Yields:
        Nothing; the kernels are hidden inside the block.

    Raises:
        UnsupportedTorchError: This torch's ops keep no ``py_kernels`` or dispatch cache.
    """
    purpose = "trace these ops with the kernels eager runs"
    keys = (torch._C.DispatchKey.CompositeImplicitAutograd, torch._C.DispatchKey.Autograd)
    saved: list[tuple[Any, Any, Callable[..., Any]]] = []
    for op in ops:
        kernels = required(op, "py_kernels", "OpOverload.py_kernels", purpose)
        required(op, "_dispatch_cache", "OpOverload._dispatch_cache", purpose)
        saved += [(op, key, kernels.pop(key)) for key in keys if key in kernels]
        op._dispatch_cache.clear()
    try:
        yield
    finally:
        for op, key, kernel in saved:
            op.py_kernels[key] = kernel
        for op in ops:
            op._dispatch_cache.clear()

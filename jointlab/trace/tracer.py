"""Default tracing mode: one make_fx graph holding forward, loss and backward.

The training step runs under a fake mode with the model's parameters and
buffers swapped for fake placeholders, and ``torch.autograd.grad`` is called
*inside* ``torch.compiler._patch_engine_backward()`` so the autograd engine
records the backward as graph nodes tagged with the ``seq_nr`` of the forward
op they differentiate. The model is restored from a snapshot afterwards,
whatever happens.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch._guards import TracingContext, tracing
from torch._subclasses import FakeTensorMode
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.fx.traceback import preserve_node_meta
from torch.nn.utils import stateless

from jointlab.errors import DataDependentError, LossError, NoTrainableParametersError, TraceError
from jointlab.graph import JointGraph
from jointlab.guards import (
    ShapeGuards,
    fakeify,
    resolve_dynamic_dims,
    symbolic_dispatch,
    symbolic_fake_mode,
)
from jointlab.inputs import (
    InputSpec,
    StateSpec,
    describe_inputs,
    describe_state,
    flatten_inputs,
    model_state,
    state_on_meta,
)
from jointlab.passes.annotate import annotate, frame_text, innermost_user_frame
from jointlab.passes.repair import repair_views
from jointlab.torch_compat import unsupported
from jointlab.trace.checkpoint import checkpoint_tracing
from jointlab.trace.distributed import refuse_unsupported_wrappers
from jointlab.trace.hf_compat import hf_refusals
from jointlab.trace.lost_backward import no_kernel_warnings, refuse_lost_backward
from jointlab.trace.meta_attention import flag_meta_attention, meta_attention_calls
from jointlab.trace.probes import module_probes
from jointlab.trace.python_state import no_tensor_printing, warn_baked_constants
from jointlab.trace.random_ops import random_op_refusals, refuse_explicit_generators
from jointlab.trace.refusals import in_train_fn, refuse_compiled, torch_errors, tracing_guard
from jointlab.trace.snapshot import ModelSnapshot

MODES = ("make_fx", "aot")
_DATA_DEPENDENT = (
    DataDependentOutputException,
    DynamicOutputShapeException,
    GuardOnDataDependentSymNode,
)


def trace(
    model: nn.Module,
    train_fn: Callable[..., Any],
    inputs: dict[str, Any],
    *,
    mode: str = "make_fx",
    dynamic: bool = False,
    dynamic_arg_dims: dict[str, int | list[int]] | None = None,
) -> JointGraph:
    """Trace ``train_fn(model, **inputs)`` and its backward into one FX graph.

    Args:
        model: The model. It is never changed by tracing, even on failure.
        train_fn: Returns a scalar loss, or ``(loss, loss_dict)``.
        inputs: Keyword arguments for ``train_fn``; leaves are tensors, int,
            float, bool, str or None, nested in dicts, lists or tuples.
        mode: ``"make_fx"`` (default) or ``"aot"`` (AOT joint export with descriptors).
        dynamic: Make every dim of every tensor input symbolic.
        dynamic_arg_dims: Dotted input path to the dims to make symbolic,
            e.g. ``{"batch.input_ids": [0, -1]}``. Parameters stay static.

    Returns:
        The traced :class:`JointGraph`.

    Raises:
        ValueError: ``mode`` or ``dynamic`` is invalid.
        jointlab.errors.JointlabError: The inputs, the loss or the model cannot
            be traced; the message says why and where.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not isinstance(dynamic, bool):
        raise TypeError(f"dynamic must be a bool, got {type(dynamic).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    refuse_compiled(model)
    refuse_unsupported_wrappers(model)
    with no_tensor_printing(), torch_errors("jl.trace"), tracing_guard(model), \
            hf_refusals(model), random_op_refusals(), no_kernel_warnings() as no_kernel, \
            meta_attention_calls() as sdpa_calls:
        if mode == "aot":
            from jointlab.trace.aot import trace_aot

            joint = trace_aot(model, train_fn, inputs, dynamic=dynamic,
                              dynamic_arg_dims=dynamic_arg_dims)
        else:
            joint = _trace_make_fx(model, train_fn, inputs, dynamic, dynamic_arg_dims)
    refuse_explicit_generators(joint.graph_module)
    repair_views(joint.graph_module)
    refuse_lost_backward(joint, no_kernel)
    flag_meta_attention(joint, sdpa_calls)
    warn_baked_constants(joint.graph_module, train_fn, model)
    joint.train_fn = train_fn
    return joint


def trainable_names(model: nn.Module) -> list[str]:
    """Names of parameters with ``requires_grad``, tied weights once.

    Raises:
        NoTrainableParametersError: There are none.
    """
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if not names:
        raise NoTrainableParametersError(
            f"{type(model).__name__} has no parameter with requires_grad=True, so there is "
            "no gradient to trace. Unfreeze at least one parameter."
        )
    return names


def check_loss(loss: Any) -> None:
    """Raise :class:`LossError` unless ``loss`` is a differentiable one-element tensor."""
    if not isinstance(loss, torch.Tensor):
        raise LossError(
            f"train_fn returned a {type(loss).__name__} as the loss; it must return a scalar "
            "tensor (or (loss, loss_dict)). Return the tensor itself, not .item() or a float."
        )
    if loss.numel() != 1:
        raise LossError(
            f"train_fn returned a loss of shape {list(loss.shape)}; it must be a scalar. "
            "Reduce it, e.g. loss.mean() or loss.sum()."
        )
    if not loss.requires_grad:
        raise LossError(
            "train_fn returned a loss that does not require grad: it does not depend on any "
            "trainable parameter (was it detached, or computed under torch.no_grad()?)."
        )


def split_loss(out: Any) -> tuple[Any, dict[str, Any]]:
    """Split ``train_fn``'s result into the loss and the ``loss_dict``."""
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
        return out[0], dict(out[1])
    return out, {}


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn data-dependent tracing failures into :class:`DataDependentError`."""
    try:
        yield
    except _DATA_DEPENDENT as exc:
        frame = innermost_user_frame(traceback.extract_tb(exc.__traceback__))
        where = f" at {frame_text(frame)}" if frame is not None else ""
        raise DataDependentError(
            "the model reads a tensor's value in Python while tracing" + where + ". A joint "
            "graph cannot depend on data: replace Python control flow on tensor values "
            "(if, .item(), printing a tensor) with tensor ops such as torch.where."
        ) from exc


def _fake_inputs(model, leaves, dyn_dims):
    mode = symbolic_fake_mode() if dyn_dims else FakeTensorMode(allow_non_fake_inputs=True)
    state = model_state(model)
    on_meta = state_on_meta(model)
    fake_state = [fakeify(mode, t, None) for t in state.values()]
    fake_user = []
    for path, leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            src = leaf.to("meta") if on_meta else leaf
            fake_user.append((path, fakeify(mode, src, dyn_dims.get(path))))
    return mode, list(state), fake_state, fake_user


@dataclass(frozen=True)
class TraceRequest:
    """What both tracing modes derive from the user's call before tracing."""

    leaves: list[tuple[str, Any]]
    treespec: Any
    input_spec: InputSpec
    tensors: list[tuple[str, torch.Tensor]]
    dyn_dims: dict[str, set[int]]
    state_spec: StateSpec
    param_names: list[str]

    @classmethod
    def of(cls, model: nn.Module, inputs: dict[str, Any], dynamic: bool,
           dynamic_arg_dims: dict[str, int | list[int]] | None) -> TraceRequest:
        """Flatten and check the inputs and the model state (raises jointlab errors)."""
        leaves, treespec = flatten_inputs(inputs)
        tensors = [(p, v) for p, v in leaves if isinstance(v, torch.Tensor)]
        return cls(leaves, treespec, describe_inputs(leaves, treespec), tensors,
                   resolve_dynamic_dims(tensors, dynamic, dynamic_arg_dims),
                   describe_state(model), trainable_names(model))

    def joint_graph(self, gm: fx.GraphModule, mode: str, loss_dict_keys: list[str],
                    guards: ShapeGuards | None, runtime: Any = None) -> JointGraph:
        """Assemble the traced graph with this request's layout."""
        return JointGraph(gm, mode=mode, state_spec=self.state_spec,
                          input_spec=self.input_spec, param_names=self.param_names,
                          loss_dict_keys=loss_dict_keys, dynamic_dims=self.dyn_dims,
                          guards=guards, runtime=runtime)

    def guards(self, shape_env: Any, fake_user: list[tuple[str, torch.Tensor]]
               ) -> ShapeGuards | None:
        """The shape guards of a dynamic trace (None for a static one)."""
        if not self.dyn_dims or shape_env is None:
            return None
        sizes = {p: tuple(t.shape) for p, t in self.tensors}
        return ShapeGuards.record(shape_env, fake_user, sizes, self.dyn_dims)


def _trace_make_fx(model, train_fn, inputs, dynamic, dynamic_arg_dims) -> JointGraph:
    req = TraceRequest.of(model, inputs, dynamic, dynamic_arg_dims)
    leaves, tensors, dyn_dims = req.leaves, req.tensors, req.dyn_dims
    state_spec, param_names = req.state_spec, req.param_names

    snapshot = ModelSnapshot.take(model)
    try:
        fake_mode, fqns, fake_state, fake_user = _fake_inputs(model, leaves, dyn_dims)
        fn, box = _joint_fn(model, train_fn, fqns, param_names, leaves, req.treespec)
        fn._orig_mod = model  # type: ignore[attr-defined]  # enables nn_module_stack
        _keep_stack_frames_of(train_fn)
        with contextlib.ExitStack() as stack:
            stack.enter_context(fake_mode)
            stack.enter_context(tracing(TracingContext(fake_mode)))
            stack.enter_context(preserve_node_meta())
            stack.enter_context(torch.autograd.set_multithreading_enabled(False))
            if hasattr(torch.compiler, "_non_strict_tracing_context"):
                stack.enter_context(torch.compiler._non_strict_tracing_context())
            stack.enter_context(checkpoint_tracing())  # exact RNG replay of recomputes
            stack.enter_context(user_errors())
            probes = stack.enter_context(module_probes(model))
            stack.enter_context(symbolic_dispatch(bool(dyn_dims)))
            gm = make_fx(fn, record_stack_traces=True, record_module_stack=True)(
                *fake_state, *(f for _, f in fake_user)
            )
        guards = req.guards(fake_mode.shape_env, fake_user)
    finally:
        snapshot.restore()

    placeholder_info = [
        state_placeholder_info(model, fqn, is_p)
        for fqn, is_p in zip(state_spec.fqns, state_spec.is_param)
    ] + [{"phase": "input", "input_path": p} for p, _ in tensors]
    annotate(gm, placeholder_info, param_names, box["zero_grads"], len(box["loss_dict_keys"]))
    probes.write(gm)
    return req.joint_graph(gm, "make_fx", box["loss_dict_keys"], guards)


def state_placeholder_info(model: nn.Module, fqn: str, is_param: bool) -> dict[str, Any]:
    """Trace-time annotation of a parameter or buffer placeholder."""
    owner = fqn.rpartition(".")[0]
    return {"phase": "param" if is_param else "buffer", "fqn": fqn, "module": owner,
            "module_type": type(model.get_submodule(owner)).__name__}


def _joint_fn(model, train_fn, fqns, param_names, leaves, treespec):
    box: dict[str, list[str]] = {"loss_dict_keys": [], "zero_grads": []}
    n_state = len(fqns)

    def joint(*args):
        box["zero_grads"].clear()
        state = dict(zip(fqns, args[:n_state]))
        tensor_args = iter(args[n_state:])
        values = [next(tensor_args) if isinstance(v, torch.Tensor) else v for _, v in leaves]
        kwargs = torch.utils._pytree.tree_unflatten(values, treespec)
        with stateless._reparametrize_module(model, state, tie_weights=True), _engine_backward():
            with in_train_fn(model):
                loss, loss_dict = split_loss(train_fn(model, **kwargs))
            check_loss(loss)
            params = [state[n] for n in param_names]
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        out = []
        for name, p, g in zip(param_names, params, grads):
            if g is None:
                box["zero_grads"].append(name)
                g = torch.zeros_like(p)
            out.append(g)
        box["loss_dict_keys"][:] = list(loss_dict)
        return [loss, *out, *loss_dict.values()]

    return joint, box


def _keep_stack_frames_of(train_fn: Callable[..., Any]) -> None:
    # With module-stack recording, make_fx keeps only frames named "forward"
    # in stack traces; registering train_fn as an anchor keeps its frame too,
    # so ops of the loss get a source line.
    register = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
    if register is not None:
        register(train_fn)


@contextlib.contextmanager
def _engine_backward() -> Iterator[None]:
    # Without the patch the engine tags no backward node, and phases guessed from
    # structure put some forward nodes in the backward: refuse instead.
    patch = getattr(torch.compiler, "_patch_engine_backward", None)
    if patch is None:
        raise unsupported("torch.compiler._patch_engine_backward",
                          "tell the backward nodes of a make_fx trace from the forward ones")
    with patch():
        yield


__all__ = ["trace", "TraceError"]

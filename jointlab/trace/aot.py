"""Second tracing mode: PyTorch's AOT joint export with descriptors.

``aot_export_joint_with_descriptors`` gives the functional joint graph that
PyTorch's own compiler stack partitions and lowers. Its placeholders and
outputs carry descriptors (``ParamAOTInput``, ``GradAOTOutput``,
``InputMutationAOTOutput``, ...) instead of a fixed layout, so this module
reads those descriptors once at trace time (:mod:`jointlab.trace.aot_plan`)
and builds:

- the same ``node.meta["jointlab"]`` annotations as the default mode, and
- an :class:`jointlab.runtime.AotRuntime` plan that maps jointlab's flat call layout onto the
  graph's arguments (tied aliases, the loss tangent) and maps its outputs back
  (buffer mutations copied into the live model, alias gradients summed).

DTensor parameters and buffers reach the export as they are; AOT flattens
each into its parts, and :mod:`jointlab.trace.aot_subclass` keeps one
local-shard placeholder and one gradient output per DTensor, with an
:class:`~jointlab.runtime.dtensor.AotDTensorRuntime` around the plan.

The export runs inside an ``ExitStack`` that holds a fake mode; the graph is
taken out and the stack closed before anything touches real tensors again.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.fx import traceback as fx_tb
from torch.overrides import TorchFunctionMode

from jointlab.core import GraphParts
from jointlab.inputs import state_on_meta
from jointlab.passes.pipeline import TraceFacts
from jointlab.runtime.dtensor import AotDTensorRuntime, DTensorLayout
from jointlab.runtime.fakes import fakeify, symbolic_fake_mode
from jointlab.runtime.snapshot import ModelSnapshot
from jointlab.runtime.train_fn import check_loss, split_loss
from jointlab.sources import walk_out
from jointlab.torch_compat import aot_backward_marks, aot_export_joint, pytree
from jointlab.trace import request
from jointlab.trace.aot_plan import (
    D,
    aot_rules,
    build_runtime,
    canonical_names,
    sum_alias_grads_like_eager,
)
from jointlab.trace.aot_plan import strip_prefix as strip_prefix
from jointlab.trace.aot_subclass import drop_opaque_parts, grad_specs, refuse_subclass_state
from jointlab.trace.checkpoint import checkpoint_tracing
from jointlab.trace.checkpoint import (
    warn_checkpoint_not_recomputed as warn_checkpoint_not_recomputed,
)
from jointlab.trace.param_hooks import ParamHooks
from jointlab.trace.probe_hooks import module_probes
from jointlab.trace.refusals import in_train_fn

aot_export_joint_with_descriptors = aot_export_joint()


# -- the module AOT traces ----------------------------------------------------
class _TrainStep(nn.Module):
    """``train_fn(model, **inputs)`` as a module: tensor leaves in, tensors out.

    Returns ``(loss, *tensor loss_dict values)``. The values are detached so
    the loss is the only differentiable output (one tangent). Non-tensor
    loss_dict values are recorded in ``box`` and returned by the runtime.
    """

    def __init__(self, model: nn.Module, train_fn: Callable[..., Any],
                 req: request.TraceRequest, hooks: ParamHooks) -> None:
        super().__init__()
        self.model = model
        self._train_fn = train_fn
        self._leaves = [None if isinstance(v, torch.Tensor) else v for _, v in req.leaves]
        self._tensor_mask = [isinstance(v, torch.Tensor) for _, v in req.leaves]
        self._req = req  # inputs that are the model's tensors: fed its own (AOT's stand-ins)
        self._aliased = [leaf.state_alias for leaf in req.input_spec.leaves if leaf.state_alias]
        self.hooks = hooks  # the parameters' own hooks, run in the traced backward
        self.box = request.LossBox()

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        it = iter(tensors)
        values = [next(it) if is_tensor else v
                  for v, is_tensor in zip(self._leaves, self._tensor_mask)]
        state = {fqn: _state_tensor(self.model, fqn) for fqn in self._aliased}
        kwargs = pytree.tree_unflatten(self._req.substitute(values, state), self._req.treespec)
        with _source_recorder(), self.hooks.applied(self.model), in_train_fn(self.model):
            loss, loss_dict = split_loss(self._train_fn(self.model, **kwargs))
        check_loss(loss)
        self.box.record(loss_dict)
        plain = DTensorLayout().plain_output  # a replicated DTensor loss: its local value
        vals = [plain(f"loss_dict[{k!r}]", v).detach() for k, v in loss_dict.items()
                if isinstance(v, torch.Tensor)]
        return (plain("the loss", loss), *vals)


def _state_tensor(model: nn.Module, fqn: str) -> torch.Tensor:
    owner, _, name = fqn.rpartition(".")
    return getattr(model.get_submodule(owner), name)


class _SourceMode(TorchFunctionMode):
    """Publish the user's ``file:line`` of each torch call as the node's stack trace.

    AOT's inner make_fx does not record stack traces, but it copies
    ``stack_trace`` from the preserved node meta onto every node it creates.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        meta = fx_tb.get_current_meta()
        prev = meta.get("stack_trace")
        frame, _ = walk_out(sys._getframe(1))
        if frame is not None:
            meta["stack_trace"] = (
                f'File "{frame.f_code.co_filename}", line {frame.f_lineno}, '
                f"in {frame.f_code.co_name}"
            )
        try:
            return func(*args, **(kwargs or {}))
        finally:
            if prev is None:
                meta.pop("stack_trace", None)
            else:
                meta["stack_trace"] = prev


@contextlib.contextmanager
def _source_recorder() -> Iterator[None]:
    if not fx_tb.has_preserved_node_meta():
        yield
        return
    with _SourceMode():
        yield


@contextlib.contextmanager
def module_stack_hooks(model: nn.Module) -> Iterator[None]:
    """Publish ``nn_module_stack`` in the preserved node meta while ``model`` runs.

    AOT copies that field onto every node it creates, so forward nodes learn
    their module. Hooks are removed on exit, whatever happens.

    Args:
        model: The user's model; module names are its ``named_modules()`` FQNs.

    Yields:
        Nothing; the hooks are active inside the block.
    """
    stack: list[tuple[str, str]] = []

    def publish() -> None:
        meta = fx_tb.get_current_meta()
        if stack:
            meta["nn_module_stack"] = {f"L__{f or 'self'}": (f, t) for f, t in stack}
        else:
            meta.pop("nn_module_stack", None)

    def pre(name: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: Any) -> None:
            stack.append((name, type(mod).__qualname__))
            publish()
        return hook

    def post(mod: nn.Module, args: Any, out: Any) -> None:
        if stack:
            stack.pop()
        publish()

    handles = []
    try:
        for name, mod in model.named_modules():
            # first of the pre-hooks: a plan's own (PrepareModuleInput, ColwiseParallel's
            # input redistribute) runs inside the module, as make_fx's module stack says
            handles.append(mod.register_forward_pre_hook(pre(name), prepend=True))
            handles.append(mod.register_forward_hook(post, always_call=True))
        yield
    finally:
        for h in handles:
            h.remove()


# -- tracing ------------------------------------------------------------------
def trace_aot(model: nn.Module, train_fn: Callable[..., Any], req: request.TraceRequest
              ) -> tuple[GraphParts, TraceFacts]:
    """Trace ``train_fn(model, **inputs)`` with the AOT joint export.

    Args:
        model: The model; left bitwise unchanged, also when tracing fails.
        train_fn: Returns a scalar loss, or ``(loss, loss_dict)``.
        req: The checked request (inputs, state, dynamic dims).

    Returns:
        The raw graph and its layout, ``mode="aot"`` with an :class:`AotRuntime`,
        and what the passes (:func:`jointlab.passes.pipeline.run_passes`) need.
    """
    refuse_subclass_state(model)
    tensors = req.tensors
    snapshot = ModelSnapshot.take(model)
    layout = DTensorLayout.of(model)  # DTensor state: one local-shard placeholder each
    try:
        with module_probes(model) as probes:
            gm, box, fake_user, shape_env = _export(model, train_fn, req, layout)
        guards = req.guards(shape_env, fake_user)
    finally:
        snapshot.restore()

    canon = canonical_names(model)
    sum_alias_grads_like_eager(gm, canon)
    fqns = list(req.state_spec.fqns)
    runtime: Any = build_runtime(gm, fqns, req, canon, box)
    if layout.state:
        runtime = AotDTensorRuntime(runtime, [layout.state.get(n) for n in fqns],
                                    dict(layout.grads))
    rules = aot_rules(gm, model, [p for p, _ in tensors], req.param_names, canon, layout,
                      req.grad_paths)
    parts = req.parts(gm, "aot", box, guards, runtime, module_inputs=probes.in_shapes)
    return parts, TraceFacts(rules, probes)


def _export(model, train_fn, req, layout):
    tensors, dyn_dims = req.tensors, req.dyn_dims
    hooks = ParamHooks(model, req.param_names)  # read from the real parameters; refuses
    wrapper = _TrainStep(model, train_fn, req, hooks)
    on_meta = state_on_meta(model)
    own = set(req.grad_paths)  # inputs whose gradient the graph returns
    args = [(t.detach().to("meta") if on_meta else t.detach()).requires_grad_(p in own)
            for p, t in tensors]
    fake_user: list[tuple[str, torch.Tensor]] = []
    shape_env = None
    if dyn_dims:
        mode = symbolic_fake_mode()
        shape_env = mode.shape_env
        args = [fakeify(mode, a, dyn_dims.get(p)) for (p, _), a in zip(tensors, args)]
        fake_user = [(p, a) for (p, _), a in zip(tensors, args)]
    with contextlib.ExitStack() as stack:
        stack.callback(hooks.remove)
        stack.enter_context(request.user_errors())
        stack.enter_context(module_stack_hooks(model))
        ckpt = stack.enter_context(checkpoint_tracing(replay_rng=False))  # refuses reentrant
        stack.enter_context(aot_backward_marks())  # 2.11/2.12: tag backward nodes as 2.13 does
        joint = aot_export_joint_with_descriptors(stack, wrapper, tuple(args))
        gm = joint.graph_module
    if ckpt.regions:
        warn_checkpoint_not_recomputed(ckpt.regions)
    # The stack is closed: the export's fake mode is gone before real tensors run.
    _drop_unrequested_input_grads(gm, [p in own for p, _ in tensors])
    gm.graph.set_codegen(fx.graph.CodeGen())  # public; plain positional codegen
    gm.recompile()
    if layout.state:  # one local-shard placeholder and one gradient output per DTensor
        canon = canonical_names(model)
        meshes = drop_opaque_parts(gm, layout, canon)
        layout.grads.update(grad_specs(joint, gm, meshes, canon))
    return gm, wrapper.box, fake_user, shape_env


def _drop_unrequested_input_grads(gm: fx.GraphModule, requires_grad: list[bool]) -> None:
    """Drop gradients the export computes for inputs whose gradient is not returned.

    With meta-device weights the export differentiates plain inputs too (a
    second ``mse_loss_backward`` for the target); nothing reads that output. An
    input that is a parameter is fed the parameter itself, so its own gradient
    output is unused too.
    """
    out = gm.graph.output_node()
    values = list(out.args[0])
    for k, desc in enumerate(out.meta["desc"]):
        src = getattr(desc, "grad_of", None)
        if isinstance(src, D.PlainAOTInput) and not requires_grad[src.idx] \
                and isinstance(values[k], fx.Node):
            dead, values[k] = values[k], None
            out.args = (values, *out.args[1:])
            _erase_unused(gm.graph, dead)


def _erase_unused(graph: fx.Graph, node: fx.Node) -> None:
    todo = [node]
    while todo:
        n = todo.pop()
        if n.users or n.op != "call_function":
            continue
        inputs = n.all_input_nodes
        graph.erase_node(n)
        todo.extend(inputs)

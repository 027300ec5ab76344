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
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.fx.traceback import preserve_node_meta

from jointlab.core import GraphParts
from jointlab.inputs import model_state, state_on_meta
from jointlab.passes.classify import MakeFxRules
from jointlab.passes.pipeline import TraceFacts
from jointlab.runtime.dtensor import DTensorLayout
from jointlab.runtime.fakes import fakeify, symbolic_dispatch, symbolic_fake_mode
from jointlab.runtime.snapshot import ModelSnapshot
from jointlab.runtime.torch_errors import note_forward_source
from jointlab.runtime.train_fn import check_loss, split_loss
from jointlab.torch_compat import (
    TracingContext,
    checking_fake_mode,
    engine_backward_patch,
    keep_stack_frames_of,
    make_fx,
    make_fx_joint_supported,
    non_strict_tracing_context,
    pytree,
    record_module_stack_of,
    reparametrize_module,
    tracing,
)
from jointlab.trace.checkpoint import checkpoint_tracing
from jointlab.trace.param_hooks import ParamHooks
from jointlab.trace.probe_hooks import module_probes
from jointlab.trace.refusals import in_train_fn
from jointlab.trace.request import (
    LossBox,
    TraceRequest,
    state_placeholder_info,
    user_errors,
)

__all__ = ["trace_make_fx"]


def trace_make_fx(model: nn.Module, train_fn: Callable[..., Any], req: TraceRequest
                  ) -> tuple[GraphParts, TraceFacts]:
    """Trace ``train_fn(model, **inputs)`` and its backward with make_fx.

    Args:
        model: The model; left unchanged, also when tracing fails.
        train_fn: Returns a scalar loss, or ``(loss, loss_dict)``.
        req: The checked request (inputs, state, dynamic dims).

    Returns:
        The raw graph and its layout (``mode="make_fx"``), and what the passes
        of :func:`jointlab.passes.pipeline.run_passes` need to annotate it.
    """
    make_fx_joint_supported()  # torch before 2.13: refused here, before any work
    leaves, dyn_dims = req.leaves, req.dyn_dims
    hooks = ParamHooks(model, req.param_names)  # read from the real parameters; refuses
    snapshot = ModelSnapshot.take(model)
    layout = DTensorLayout.of(model)  # DTensor state: traced as its local shards
    try:
        fake_mode, fqns, fake_state, fake_user = _fake_inputs(model, leaves, dyn_dims, layout)
        fn, box = _joint_fn(model, train_fn, fqns, req, layout, fake_mode, hooks)
        record_module_stack_of(fn, model)
        _keep_stack_frames_of(train_fn)
        with contextlib.ExitStack() as stack:
            stack.enter_context(fake_mode)
            stack.enter_context(tracing(TracingContext(fake_mode)))
            stack.enter_context(preserve_node_meta())
            stack.enter_context(torch.autograd.set_multithreading_enabled(False))
            stack.enter_context(non_strict_tracing_context())
            ckpt = stack.enter_context(checkpoint_tracing())  # exact RNG replay of recomputes
            stack.enter_context(user_errors())
            probes = stack.enter_context(module_probes(model))
            stack.enter_context(symbolic_dispatch(bool(dyn_dims)))
            gm = make_fx(fn, record_stack_traces=True, record_module_stack=True)(
                *fake_state, *(f for _, f in fake_user)
            )
        guards = req.guards(fake_mode.shape_env, fake_user)
    finally:
        snapshot.restore()

    spec = req.state_spec
    placeholder_info = [
        {**state_placeholder_info(model, fqn, is_p), **layout.placeholder_info(fqn)}
        for fqn, is_p in zip(spec.fqns, spec.is_param)
    ] + [{"phase": "input", "input_path": p} for p, _ in req.tensors]
    rules = MakeFxRules(gm, placeholder_info, req.param_names, box.zero_grads,
                        len(box.keys), req.grad_paths, box.zero_input_grads)
    # a shared submodule makes torch name modules relative to a sub-model: true FQNs
    names = {n for n, _ in model.named_modules(remove_duplicate=False)}
    parts = req.parts(gm, "make_fx", box, guards, layout.runtime(list(spec.fqns)),
                      module_inputs=probes.in_shapes)
    return parts, TraceFacts(rules, probes, module_names=names,
                             recomputed=tuple(ckpt.recomputed))


def _fake_inputs(model, leaves, dyn_dims, layout):
    # a fake mode that can check train_fn's writes itself (trace/refusals.in_train_fn)
    mode = symbolic_fake_mode(checking=True) if dyn_dims else checking_fake_mode(
        allow_non_fake_inputs=True)
    state = layout.local_state(model_state(model))
    on_meta = state_on_meta(model)
    fake_state = [fakeify(mode, t, None) for t in state.values()]
    fake_user = []
    seen = {id(t) for t in state.values()}
    for path, leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            src = leaf.to("meta") if on_meta else leaf
            if id(leaf) in seen:  # one fake per placeholder: a shared fake shares its proxy
                src = src.detach().requires_grad_(leaf.requires_grad)
            seen.add(id(leaf))
            fake_user.append((path, fakeify(mode, src, dyn_dims.get(path))))
    return mode, list(state), fake_state, fake_user


def _joint_fn(model, train_fn, fqns, req, layout, fake_mode, hooks):
    box = LossBox()
    n_state, param_names, leaves = len(fqns), req.param_names, req.leaves
    tensor_paths = [p for p, v in leaves if isinstance(v, torch.Tensor)]

    def joint(*args):
        box.zero_grads.clear()
        box.zero_input_grads.clear()
        state = layout.rewrap(dict(zip(fqns, args[:n_state])))
        tensors = dict(zip(tensor_paths, args[n_state:]))
        values = [tensors[p] if isinstance(v, torch.Tensor) else v for p, v in leaves]
        kwargs = pytree.tree_unflatten(req.substitute(values, state), req.treespec)
        with reparametrize_module(model, state, tie_weights=True), _engine_backward():
            try:  # the parameters' own hooks run in the traced backward
                with hooks.applied(model), in_train_fn(model, fake_mode):
                    loss, loss_dict = split_loss(train_fn(model, **kwargs))
                check_loss(loss)
                params = [state[n] for n in param_names]
                wrt = [*params, *(tensors[p] for p in req.grad_paths)]  # inputs requiring grad
                try:
                    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
                except RuntimeError as exc:  # name the forward's call of a backward failing
                    note_forward_source(exc)
                    raise
            finally:
                hooks.remove()
        n = len(params)
        out = [layout.local_grad(name, g) for name, g in
               zip(param_names, _zeros_for_none(param_names, params, grads, box.zero_grads))]
        out += _zeros_for_none(req.grad_paths, wrt[n:], grads[n:], box.zero_input_grads)
        box.record(loss_dict)
        loss_dict = {k: layout.plain_output(f"loss_dict[{k!r}]", v) for k, v in loss_dict.items()}
        return [layout.plain_output("the loss", loss), *out, *loss_dict.values()]

    return joint, box


def _zeros_for_none(names, wrt, grads, zero_names):
    # a tensor the loss does not depend on: zeros (its name noted), as the runtime returns
    out = []
    for name, t, g in zip(names, wrt, grads):
        if g is None:
            zero_names.append(name)
            g = torch.zeros_like(t)
        out.append(g)
    return out


def _keep_stack_frames_of(train_fn: Callable[..., Any]) -> None:
    # With module-stack recording, make_fx keeps only frames named "forward"
    # in stack traces; registering train_fn as an anchor keeps its frame too,
    # so ops of the loss get a source line.
    keep_stack_frames_of(train_fn)


@contextlib.contextmanager
def _engine_backward() -> Iterator[None]:
    # Without the patch the engine tags no backward node, and phases guessed from
    # structure put some forward nodes in the backward: refuse instead.
    with engine_backward_patch()():
        yield

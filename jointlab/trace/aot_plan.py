"""What an AOT joint export's descriptors say, read once at trace time.

:mod:`jointlab.trace.aot` runs the export; this module reads the descriptors
on its placeholders and outputs (``ParamAOTInput``, ``GradAOTOutput``,
``InputMutationAOTOutput``, ...) into:

- the :class:`jointlab.runtime.AotRuntime` plan: each graph argument's place in
  jointlab's flat call layout (tied aliases, the loss tangent) and what each
  output is (loss, loss_dict value, gradient, input gradient, buffer mutation);
- the order of a tied weight's alias gradients, so the runtime sums them as
  eager does (:func:`sum_alias_grads_like_eager`);
- the annotation pass's :class:`~jointlab.passes.classify.AotRules` (:func:`aot_rules`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch import nn

from jointlab.errors import TraceError
from jointlab.meta import TRAIN_FN
from jointlab.passes.aot_outputs import replace_outputs
from jointlab.passes.classify import AotRules
from jointlab.runtime.descriptors import state_base
from jointlab.runtime.dtensor import DTensorLayout
from jointlab.runtime.plans import AotRuntime
from jointlab.torch_compat import aot_descriptors
from jointlab.trace import request
from jointlab.trace.aot_subclass import is_subclass_part, subclass_part_error

D = aot_descriptors()

_PREFIX = "model."  # the wrapper holds the model as ``self.model``


def strip_prefix(target: str) -> str:
    """Return a parameter/buffer FQN as the user's model names it."""
    return target[len(_PREFIX):] if target.startswith(_PREFIX) else target


def canonical_names(model: nn.Module) -> dict[str, str]:
    """Map every alias FQN (params and buffers) to the name ``named_*()`` reports.

    Args:
        model: The traced model.

    Returns:
        ``{alias FQN: the FQN named_parameters()/named_buffers() reports}``.
    """
    out: dict[str, str] = {}
    for named in (model.named_parameters, model.named_buffers):
        first = {id(t): n for n, t in named()}
        out.update({n: first[id(t)] for n, t in named(remove_duplicate=False)})
    return out


def sum_alias_grads_like_eager(gm: fx.GraphModule, canon: dict[str, str]) -> None:
    """Order each tied weight's alias gradients so the runtime sums them as eager does.

    AOT gives every alias of a tied weight its own gradient output, and
    :meth:`AotRuntime.finish` adds them in output order. Eager's engine adds a
    leaf's incoming gradients in backward order: the alias used last in the
    forward first. With three or more terms the order changes the last bit, so
    each group is put in reverse order of first forward use.

    Args:
        gm: The AOT joint graph (its output node is edited in place, by
            :func:`jointlab.passes.aot_outputs.replace_outputs`).
        canon: Alias FQN to the FQN ``named_parameters()`` reports.
    """
    out = gm.graph.output_node()
    values, descs = list(out.args[0]), list(out.meta["desc"])
    step = {n: i for i, n in enumerate(gm.graph.nodes)}
    inputs = {strip_prefix(state_base(n.meta["desc"]).target): n
              for n in gm.graph.find_nodes(op="placeholder")
              if isinstance(state_base(n.meta.get("desc")), D.ParamAOTInput)}
    groups: dict[str, list[int]] = {}
    for j, (v, d) in enumerate(zip(values, descs)):
        d = state_base(d)
        if (isinstance(v, fx.Node) and isinstance(d, D.GradAOTOutput)
                and isinstance(d.grad_of, D.ParamAOTInput)):
            groups.setdefault(canon[strip_prefix(d.grad_of.target)], []).append(j)

    def first_use(j: int) -> int:
        ph = inputs.get(strip_prefix(state_base(descs[j]).grad_of.target))
        return min((step[u] for u in ph.users), default=0) if ph is not None else 0

    for slots in (s for s in groups.values() if len(s) > 2):
        order = sorted(slots, key=first_use, reverse=True)
        moved = [(values[j], descs[j]) for j in order]
        for j, (v, d) in zip(slots, moved):
            values[j], descs[j] = v, d
    replace_outputs(gm, (type(out.args[0])(values),), descs)
    gm.recompile()


def _flat_index(desc: Any, state_index: dict[str, int], canon: dict[str, str],
                n_state: int) -> int:
    desc = state_base(desc)  # a DTensor's local shard feeds as the DTensor's flat entry
    if isinstance(desc, (D.ParamAOTInput, D.BufferAOTInput)):
        return state_index[canon[strip_prefix(desc.target)]]
    if isinstance(desc, D.PlainAOTInput):
        return n_state + desc.idx
    if is_subclass_part(desc):
        raise subclass_part_error(desc, "input")
    if isinstance(desc, (D.SyntheticBaseAOTInput, D.ViewBaseAOTInput)):
        raise TraceError(
            f"the AOT export produced an input jointlab cannot feed ({desc!r}). This happens "
            "when inputs alias each other and one is mutated in place; pass separate "
            "tensors or avoid the in-place update, or use mode='make_fx'.")
    raise TraceError(f"the AOT export produced an input jointlab cannot feed ({desc!r}); "
                     "use mode='make_fx' for this model.")


def build_runtime(gm, state_fqns, req, canon, box: request.LossBox) -> AotRuntime:
    """The AOT runtime plan: each graph argument's flat index, each output's step.

    Args:
        gm: The AOT joint graph (placeholders and outputs carry descriptors).
        state_fqns: The model state's FQNs, in flat order.
        req: The trace request (parameter names, tensor inputs, input gradients).
        canon: Alias FQN to the FQN ``named_parameters()`` reports.
        box: What train_fn returned besides the loss (loss_dict keys, constants).

    Returns:
        The :class:`AotRuntime`, with the loss tangent's shape and dtype.

    Raises:
        TraceError: The export made an input or output jointlab cannot feed or return.
        UnsupportedWrapperError: An input or output is one part of a tensor subclass.
    """
    param_names = req.param_names
    state_index = {f: i for i, f in enumerate(state_fqns)}
    arg_plan: list[int | None] = []
    tangent: torch.Tensor | None = None
    for node in gm.graph.find_nodes(op="placeholder"):
        desc = node.meta.get("desc")
        if isinstance(desc, D.TangentAOTInput):
            if not (isinstance(desc.output, D.PlainAOTOutput) and desc.output.idx == 0):
                raise TraceError(f"unexpected tangent {desc!r}: only the loss has one")
            arg_plan.append(None)
            tangent = node.meta["val"]
        else:
            arg_plan.append(_flat_index(desc, state_index, canon, len(state_fqns)))
    pos = {n: k for k, n in enumerate(param_names)}
    paths = [p for p, _ in req.tensors]
    in_pos = {paths.index(p): k for k, p in enumerate(req.grad_paths)}  # PlainAOTInput idx
    out_plan: list[tuple[str, int]] = []
    for desc in gm.graph.output_node().meta["desc"]:
        out_plan.append(_out_step(desc, pos, state_index, canon, len(state_fqns), in_pos))
    rt = AotRuntime(arg_plan, out_plan, [state_index[n] for n in param_names],
                    list(box.keys), dict(box.consts))
    if tangent is not None:
        rt.tangent_shape, rt.tangent_dtype = tuple(tangent.shape), tangent.dtype
    return rt


def _out_step(desc, pos, state_index, canon, n_state, in_pos) -> tuple[str, int]:
    desc = state_base(desc)  # a DTensor gradient's local tensor is that gradient
    if isinstance(desc, D.PlainAOTOutput):
        return ("loss", 0) if desc.idx == 0 else ("ld", desc.idx - 1)
    if isinstance(desc, D.GradAOTOutput):
        src = desc.grad_of
        if isinstance(src, D.ParamAOTInput):
            name = canon[strip_prefix(src.target)]
            if name in pos:
                return ("grad", pos[name])
        if isinstance(src, D.PlainAOTInput) and src.idx in in_pos:
            return ("igrad", in_pos[src.idx])
        return ("skip", 0)
    if isinstance(desc, D.InputMutationAOTOutput):
        return ("mut", _flat_index(desc.mutated_input, state_index, canon, n_state))
    if desc is None:
        return ("skip", 0)
    if is_subclass_part(desc):
        raise subclass_part_error(desc, "output")
    raise TraceError(
        f"the AOT export produced an output jointlab cannot return ({desc!r}); "
        "use mode='make_fx' for this model."
    )


# -- annotation ---------------------------------------------------------------
def _placeholder_meta(desc: Any, model: nn.Module, paths: list[str], layout: DTensorLayout
                      ) -> dict[str, Any]:
    desc = state_base(desc)
    if isinstance(desc, (D.ParamAOTInput, D.BufferAOTInput)):
        is_param = isinstance(desc, D.ParamAOTInput)
        fqn = strip_prefix(desc.target)
        return {**request.state_placeholder_info(model, fqn, is_param),
                **layout.placeholder_info(fqn)}
    if isinstance(desc, D.PlainAOTInput):
        return {"phase": "input", "input_path": paths[desc.idx]}
    # The loss tangent seeds the backward, like make_fx's ones_like node.
    return {"phase": "backward", "module": TRAIN_FN}


def aot_rules(gm: fx.GraphModule, model: nn.Module, input_paths: list[str],
              param_names: list[str], canon: dict[str, str],
              layout: DTensorLayout | None = None, grad_paths: list[str] = ()) -> AotRules:
    """Read the export's descriptors into the annotation pass's :class:`AotRules`.

    Args:
        gm: The flattened AOT joint graph.
        model: The traced model (module types of parameter and buffer owners).
        input_paths: Dotted path of each tensor input, in ``PlainAOTInput`` order.
        param_names: Trainable parameter FQNs (only their gradients are marked).
        canon: Alias FQN to the FQN ``named_parameters()`` reports.
        layout: The model's DTensor state (its placeholders get ``dtensor`` facts).
        grad_paths: The inputs whose gradient the graph returns.

    Returns:
        The AOT mode's classification.
    """
    info, tangents = {}, []
    layout = layout or DTensorLayout()
    for node in gm.graph.find_nodes(op="placeholder"):
        desc = node.meta.get("desc")
        info[node] = _placeholder_meta(desc, model, input_paths, layout)
        if isinstance(desc, D.TangentAOTInput):
            tangents.append(node)
    trainable = set(param_names)
    out = gm.graph.output_node()
    grads, input_grads = [], []
    for value, desc in zip(out.args[0], out.meta["desc"]):
        desc = state_base(desc)
        if isinstance(desc, D.GradAOTOutput) and isinstance(value, fx.Node):
            if isinstance(desc.grad_of, D.PlainAOTInput):
                if input_paths[desc.grad_of.idx] in grad_paths:
                    input_grads.append((input_paths[desc.grad_of.idx], value))
                continue
            name = canon.get(strip_prefix(getattr(desc.grad_of, "target", "")), "")
            if name in trainable:
                grads.append((name, value))
    return AotRules(info, tangents, grads, input_grads)

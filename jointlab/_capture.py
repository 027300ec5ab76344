"""Eager capture: what the untouched model computes, module by module.

One eager training step runs on a copy of the model with forward hooks on
every module (recording each call's output tensors) and tensor hooks on
those outputs (recording the gradient that reaches them in backward). The
graph's matching values are found by module: a module call's output is the
last node of that module's subtree, in graph order, with the same shape as
the eager output and a forward user outside the subtree. The gradient of a
module output is the backward node outside the subtree that feeds the
subtree's backward nodes and has that many elements, when there is exactly one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from . import _meta
from ._trace import split_loss


@dataclass
class ModuleCall:
    """One call of one module in the eager run."""

    fqn: str
    outputs: list[torch.Tensor]
    grads: dict[int, torch.Tensor] = field(default_factory=dict)  # leaf index -> grad


@dataclass
class EagerCapture:
    """Everything recorded from one eager step."""

    loss: torch.Tensor
    grads: dict[str, torch.Tensor | None]
    loss_dict: dict[str, Any]
    buffers: dict[str, torch.Tensor]
    calls: list[ModuleCall]


def to_device(tree: Any, device: torch.device | None) -> Any:
    """Move the tensor leaves of ``tree`` to ``device`` (no-op for None)."""
    if device is None:
        return tree
    return pytree.tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, tree)


def _leaves(out: Any) -> list[torch.Tensor]:
    return [v for v in pytree.tree_leaves(out) if isinstance(v, torch.Tensor)]


def _grad_hook(call: ModuleCall, i: int):
    def hook(grad: torch.Tensor) -> None:
        prev = call.grads.get(i)
        call.grads[i] = grad.detach().clone() if prev is None else prev + grad
    return hook


def _forward_hook(fqn: str, calls: list[ModuleCall]):
    def hook(_mod: nn.Module, _args: Any, out: Any) -> None:
        leaves = _leaves(out)
        call = ModuleCall(fqn, [t.detach().clone() for t in leaves])
        calls.append(call)
        for i, t in enumerate(leaves):
            if t.requires_grad:
                t.register_hook(_grad_hook(call, i))
    return hook


def capture_eager(model: nn.Module, train_fn: Any, inputs: dict[str, Any],
                  param_names: list[str], *, seed: int) -> EagerCapture:
    """Run ``train_fn`` eagerly on ``model`` (a private copy) and record module values.

    Args:
        model: A model the caller owns (it is run, hooked and then unhooked).
        train_fn: The training step.
        inputs: Keyword inputs, already on the model's device.
        param_names: The parameters to differentiate, in graph order.
        seed: Seed for the global RNG (restored afterwards).

    Returns:
        Loss, gradients, loss_dict, buffers after the step and per-module values.
    """
    calls: list[ModuleCall] = []
    handles = [m.register_forward_hook(_forward_hook(fqn, calls))
               for fqn, m in model.named_modules()]
    params = dict(model.named_parameters())
    devices = [p.device for p in params.values() if p.device.type == "cuda"][:1]
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            loss, loss_dict = split_loss(train_fn(model, **inputs))
            wanted = [params[n] for n in param_names]
            grads = torch.autograd.grad(loss, wanted, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    return EagerCapture(
        loss=loss.detach(),
        grads=dict(zip(param_names, grads)),
        loss_dict={k: v.detach() if isinstance(v, torch.Tensor) else v
                   for k, v in loss_dict.items()},
        buffers={k: v.detach().clone() for k, v in model.named_buffers()},
        calls=calls,
    )


# -- matching graph nodes to module calls --------------------------------------
def in_subtree(node: fx.Node, fqn: str) -> bool:
    """True when the node belongs to module ``fqn`` or below (root: any module)."""
    mod = _meta.module(node)
    if fqn == "":
        return mod != _meta.TRAIN_FN and _meta.phase(node) in ("forward", "backward")
    return mod == fqn or mod.startswith(fqn + ".")


def escapes_forward(node: fx.Node, fqn: str) -> bool:
    """True when a forward node of the subtree is read by forward code outside it."""
    return any((u.op == "output" or _meta.is_forward(u)) and not in_subtree(u, fqn)
               for u in node.users)


def _shape_of(node: fx.Node) -> tuple[int, ...] | None:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        try:
            return tuple(int(s) for s in val.shape)
        except (TypeError, ValueError):
            return None
    return None


def _numel(node: fx.Node) -> int | None:
    shape = _shape_of(node)
    return None if shape is None else math.prod(shape)


def output_candidates(graph: fx.Graph, fqn: str) -> list[fx.Node]:
    """Forward nodes of the subtree whose value is used outside it, in graph order."""
    return [n for n in graph.nodes
            if _meta.is_forward(n) and in_subtree(n, fqn) and escapes_forward(n, fqn)]


def match_calls(graph: fx.Graph, calls: list[ModuleCall]) -> list[tuple[fx.Node, ModuleCall, int]]:
    """Pair module-call outputs with graph nodes.

    Returns:
        ``(node, call, leaf index)`` triples; modules whose calls cannot be
        paired unambiguously are left out.
    """
    by_fqn: dict[str, list[ModuleCall]] = {}
    for c in calls:
        by_fqn.setdefault(c.fqn, []).append(c)
    pairs = []
    for fqn, fcalls in by_fqn.items():
        cands = output_candidates(graph, fqn)
        for i in range(len(fcalls[0].outputs)):
            shape = tuple(fcalls[0].outputs[i].shape)
            same = [n for n in cands if _shape_of(n) == shape]
            if len(fcalls) == 1 and same:
                pairs.append((same[-1], fcalls[0], i))
            elif len(same) == len(fcalls):
                pairs.extend((n, c, i) for n, c in zip(same, fcalls))
    return pairs


def grad_node(node: fx.Node, fqn: str) -> fx.Node | None:
    """The backward node holding d(loss)/d(``node``), found structurally, or None."""
    shape = _shape_of(node)
    numel = None if shape is None else math.prod(shape)
    inside = [n for n in node.graph.nodes if _meta.is_backward(n) and in_subtree(n, fqn)]
    feeders = {a for n in inside for a in n.all_input_nodes
               if _meta.is_backward(a) and not in_subtree(a, fqn) and _numel(a) in (numel, None)}
    return next(iter(feeders)) if len(feeders) == 1 else None

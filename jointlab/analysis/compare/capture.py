"""Eager capture: what the untouched model computes, module call by module call.

One eager training step runs on the model (the user's own, kept by the caller
with :func:`jointlab.runtime.kept.model_kept`, or a copy on another device)
with forward hooks on every module (recording a copy of each call's output
tensors at the moment they are returned) and tensor hooks on those outputs
(recording the gradient that reaches them in backward). Values are keyed
``(module fqn, call index, output leaf)``, exactly as the tracer's probes
(:mod:`jointlab.trace.probe_hooks`) key the graph nodes that hold the same
values, so pairing needs no guessing.

A graph traced from DTensor state computes this rank's local shards, so a
DTensor value of either side is compared as its local tensor
(:func:`local_values`), and the placements of the two sides' gradients must
agree (:func:`placement_mismatches`) for those shards to be the same slice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from jointlab import meta as _meta
from jointlab.inputs import flatten_inputs, tensor_leaves
from jointlab.runtime.dtensor import is_dtensor
from jointlab.runtime.train_fn import split_loss
from jointlab.torch_compat import pytree

Key = tuple[str, int, int]  # (module fqn, call index, output leaf)


@dataclass
class EagerCapture:
    """Everything recorded from one eager step."""

    loss: torch.Tensor
    grads: dict[str, torch.Tensor | None]
    loss_dict: dict[str, Any]
    buffers: dict[str, torch.Tensor]
    outputs: dict[Key, torch.Tensor]
    output_grads: dict[Key, torch.Tensor]
    calls: dict[str, int]
    #: d loss / d input of each input that requires grad, by input path (eager's x.grad).
    input_grads: dict[str, torch.Tensor | None] = field(default_factory=dict)


def to_device(tree: Any, device: torch.device | None) -> Any:
    """Move the tensor leaves of ``tree`` to ``device`` (no-op for None)."""
    if device is None:
        return tree
    return pytree.tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, tree)


def local_values(tree: Any) -> Any:
    """``tree`` with every DTensor leaf replaced by this rank's local tensor."""
    return pytree.tree_map(lambda v: v.to_local() if is_dtensor(v) else v, tree)


def placement_mismatches(graph_grads: dict[str, Any], eager_grads: dict[str, Any]
                         ) -> list[str]:
    """Gradients whose DTensor placements differ between the graph and eager.

    Their local tensors are different slices (or partial sums) of the value, so
    comparing them would report a mismatch that is not one, or hide one.
    """
    return [f"{name} (graph {_placement(got)}, eager {_placement(want)})"
            for name, got in graph_grads.items()
            if (want := eager_grads.get(name)) is not None
            and _placement(got) != _placement(want)]


def _placement(t: Any) -> str:
    return str(tuple(t.placements)) if is_dtensor(t) else "a plain tensor"


def _grad_hook(grads: dict[Key, torch.Tensor], key: Key):
    def hook(grad: torch.Tensor) -> None:
        prev = grads.get(key)
        grads[key] = grad.detach().clone() if prev is None else prev + grad
    return hook


def _forward_hook(fqn: str, cap: dict[str, Any]):
    def hook(_mod: nn.Module, _args: Any, out: Any) -> None:
        call = cap["calls"].get(fqn, 0)
        cap["calls"][fqn] = call + 1
        for leaf, t in enumerate(tensor_leaves(out)):
            cap["outputs"][(fqn, call, leaf)] = t.detach().clone()
            if t.requires_grad:
                t.register_hook(_grad_hook(cap["output_grads"], (fqn, call, leaf)))
    return hook


def capture_eager(model: nn.Module, train_fn: Any, inputs: dict[str, Any],
                  param_names: list[str], *, seed: int,
                  input_paths: list[str] | None = None) -> EagerCapture:
    """Run ``train_fn`` eagerly on ``model`` and record module values.

    Gradients come from ``torch.autograd.grad``, so the parameters' own hooks
    (``register_hook``) apply, as in ``loss.backward()``, but nothing is accumulated
    into ``.grad`` and post-accumulate-grad hooks do not run.

    Args:
        model: The model to run (hooked, then unhooked; the caller restores its state).
        train_fn: The training step.
        inputs: Keyword inputs, already on the model's device.
        param_names: The parameters to differentiate, in graph order.
        seed: Seed for the global RNG (restored afterwards).
        input_paths: The inputs to differentiate too (those that require grad), by path.

    Returns:
        Loss, gradients, loss_dict, buffers after the step and per-module values.
    """
    cap: dict[str, Any] = {"calls": {}, "outputs": {}, "output_grads": {}}
    handles = [m.register_forward_hook(_forward_hook(fqn, cap))
               for fqn, m in model.named_modules()]
    params = dict(model.named_parameters())
    devices = [p.device for p in params.values() if p.device.type == "cuda"][:1]
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            loss, loss_dict = split_loss(train_fn(model, **inputs))
            by_path = dict(flatten_inputs(inputs)[0])
            wanted = [params[n] for n in param_names] + [by_path[p] for p in input_paths or ()]
            grads = torch.autograd.grad(loss, wanted, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    return EagerCapture(
        loss=loss.detach(),
        grads=dict(zip(param_names, grads)),
        input_grads=dict(zip(input_paths or (), grads[len(param_names):])),
        loss_dict={k: v.detach().clone() if isinstance(v, torch.Tensor) else v
                   for k, v in loss_dict.items()},
        buffers={k: v.detach().clone() for k, v in model.named_buffers()},
        outputs=local_values(cap["outputs"]),
        output_grads=local_values(cap["output_grads"]),
        calls=cap["calls"],
    )


# -- pairing graph nodes with eager values -----------------------------------------
@dataclass(frozen=True)
class Probe:
    """One graph node paired with the eager value recorded at the same point."""

    node: fx.Node
    want: torch.Tensor
    what: str  # "module output" or "output gradient"
    module: str  # the module whose output (or output's gradient) this is
    #: The node after which ``node`` holds the returned value (an output the module
    #: filled in place), or None: its value as produced.
    after: fx.Node | None = None


def probe_pairs(graph: fx.Graph, eager: EagerCapture) -> tuple[list[Probe], list[str]]:
    """Pair the tracer's probed nodes with the eager capture.

    A module output filled in place (``probe_settled``) is read after its last
    write before the module returned, as eager's hook saw it. A node is read at
    one point, so a key on it that needs another (a parent writing its child's
    output in place before returning it) is left out and its module reported.

    Args:
        graph: The traced graph, its probes written.
        eager: The eager capture.

    Returns:
        The pairs, and the modules whose calls could not be paired (the graph
        and eager saw a different number of calls), which ``compare`` reports
        as not checked rather than guessing.
    """
    traced_calls: dict[str, int] = {}
    found: list[tuple[fx.Node, Key, str]] = []
    settled: dict[Key, fx.Node] = {}
    for node in graph.nodes:
        meta = _meta.info(node)
        for fqn, call, leaf in meta.get("probe_settled", ()):
            settled[(fqn, call, leaf)] = node
        for kind, what in (("probe_out", "module output"), ("probe_grad", "output gradient")):
            for fqn, call, leaf in meta.get(kind, ()):
                found.append((node, (fqn, call, leaf), what))
                if kind == "probe_out":
                    traced_calls[fqn] = max(traced_calls.get(fqn, 0), call + 1)
    unpaired = sorted(f for f in set(traced_calls) | set(eager.calls)
                      if traced_calls.get(f) != eager.calls.get(f))
    bad = set(unpaired)
    pairs: list[Probe] = []
    read_at: dict[fx.Node, fx.Node | None] = {}
    for node, key, what in found:
        table = eager.outputs if what == "module output" else eager.output_grads
        after = settled.get(key) if what == "module output" else None
        if key[0] in bad or key not in table:
            continue
        if read_at.setdefault(node, after) is not after:
            bad.add(key[0])
            continue
        pairs.append(Probe(node, table[key], what, key[0], after))
    return [p for p in pairs if p.module not in bad], sorted(bad)


def settle_points(probes: list[Probe]) -> dict[str, str]:
    """``{node name: writer name}``: where each filled-in-place output is read (NodeRunner)."""
    return {p.node.name: p.after.name for p in probes if p.after is not None}

"""Module paths as FQNs of the traced model, also where a submodule is shared.

make_fx records ``node.meta["nn_module_stack"]`` with torch's module-stack
tracer. While the model holds a shared submodule (two sub-models sharing one
``nn.Embedding``: ELECTRA's generator and discriminator, two BERTs), that
tracer switches to attribute proxies, and a submodule reached from a module
that is not itself a proxy (a sub-model the train_fn holds in a closure, or
calls through a plain reference) is named by its attribute path *relative to
that module*: ``electra.encoder.layer.0`` for both ``gen.electra...`` and
``disc.electra...``, mixing the two sub-models in every table while
``compare``'s probes use true FQNs.

:func:`absolute_module_paths` rewrites each stack entry against the entries
that enclose it: an entry that is not under its parent's FQN, but is once the
FQN of an enclosing entry is put in front (torch names it relative to the
module the call went through, which may sit several levels out), gets that
prefix. Names are checked against ``model.named_modules(remove_duplicate=False)``,
so a shared module keeps the FQN of the sub-model it ran in. It runs before
:func:`jointlab.passes.annotate.annotate`, so the module column, gradient-
accumulation attribution and saved graphs all read the same FQNs.
"""

from __future__ import annotations

from collections.abc import Collection

import torch.fx as fx

_STACK = "nn_module_stack"


def absolute_module_paths(gm: fx.GraphModule, names: Collection[str]) -> int:
    """Make every ``nn_module_stack`` path of ``gm`` (and its subgraphs) a true FQN.

    Args:
        gm: The traced graph (make_fx mode).
        names: Every module FQN of the traced model,
            ``{n for n, _ in model.named_modules(remove_duplicate=False)}``.

    Returns:
        How many nodes had a relative path rewritten.
    """
    known = set(names)
    fixed = 0
    for sub in gm.modules():
        if not isinstance(sub, fx.GraphModule):
            continue
        for node in sub.graph.nodes:
            stack = node.meta.get(_STACK)
            if not stack:
                continue
            resolved = resolve_stack(stack, known)
            if resolved != stack:
                node.meta[_STACK] = resolved
                fixed += 1
    return fixed


def resolve_stack(stack: dict, known: Collection[str]) -> dict:
    """A copy of one ``nn_module_stack`` with each path made absolute against its parent.

    Args:
        stack: ``{key: (path, type)}``, outermost module first.
        known: Every module FQN of the traced model.

    Returns:
        ``stack`` itself when every path already is a FQN under its parent, else a new dict.
    """
    out: dict = {}
    resolved: list[str] = []
    for key, (path, mtype) in stack.items():
        fqn = _absolute(str(path), resolved, known)
        out[key] = (fqn, mtype)
        resolved.append(fqn)
    return out if resolved != [str(p) for p, _ in stack.values()] else stack


def _absolute(path: str, outer: list[str], known: Collection[str]) -> str:
    # torch names such a module relative to the un-proxied module the call went
    # through, which may sit several levels out: try each enclosing FQN, innermost
    # first, and keep the first that gives a module under the direct parent.
    parent = outer[-1] if outer else ""
    if not parent or path == parent or path.startswith(parent + "."):
        return path  # the outermost entry, or already a FQN under its parent
    for anc in reversed(outer):
        joined = f"{anc}.{path}"
        if joined in known and joined.startswith(parent + "."):
            return joined
    return path

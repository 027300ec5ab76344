"""Saved-for-backward bytes per module against autograd's own saved tensors.

The reference is one eager training step run under
``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd packs is a
saved tensor. A dispatch mode below autograd records, for every storage an ATen
op allocates, the innermost module running at the time, so each saved storage
is counted once, for the module that allocated it (parameters, buffers and the
step's inputs are allocated by no op and so are not activations).
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import jointlab as jl
from jointlab.meta import KEY, TRAIN_FN
from tests.fixtures import real, zoo


class _Allocations(TorchDispatchMode):
    """Maps each storage an op allocates to (innermost module FQN, bytes)."""

    def __init__(self, stack: list[str]) -> None:
        super().__init__()
        self.stack = stack
        self.owner: dict[int, tuple[str, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr()
                  for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.untyped_storage().nbytes() == 0:
                continue
            ptr = t.untyped_storage().data_ptr()
            if ptr not in inputs:  # a fresh storage (in-place and view ops return their input's)
                self.owner[ptr] = (self.stack[-1], t.untyped_storage().nbytes())
        return out


def autograd_saved_bytes(model: nn.Module, train_fn, inputs: dict[str, Any]) -> dict[str, int]:
    """Bytes of the storages autograd saves in one eager step, by allocating module."""
    stack = [TRAIN_FN]

    def leave(*_: Any) -> None:
        stack.pop()

    hooks = []
    for fqn, mod in model.named_modules():
        hooks.append(mod.register_forward_pre_hook(lambda m, a, fqn=fqn: stack.append(fqn)))
        hooks.append(mod.register_forward_hook(leave))
    allocs = _Allocations(stack)
    saved: dict[int, tuple[str, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr in allocs.owner:  # looked up now: the storage is alive, so its pointer is its own
            saved[ptr] = allocs.owner[ptr]
        return t

    torch.manual_seed(0)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), allocs:
            train_fn(model, **inputs)
    finally:
        for h in hooks:
            h.remove()
    per_module: collections.Counter[str] = collections.Counter()
    for fqn, nbytes in saved.values():
        per_module[fqn] += nbytes
    return dict(per_module)


def jointlab_saved_bytes(joint) -> dict[str, int]:
    s = joint.summary()["saved_bytes"]
    return {k: int(v) for k, v in s.items() if v}


def _check(model: nn.Module, train_fn, inputs: dict[str, Any], mode: str) -> None:
    ref = autograd_saved_bytes(model, train_fn, inputs)
    joint = jl.trace(model, train_fn, inputs, mode=mode)
    assert sum(ref.values()) > 0
    assert jointlab_saved_bytes(joint) == ref
    assert joint.nodes["bytes"][joint.nodes["saved_for_backward"]].sum() == sum(ref.values())


@pytest.mark.parametrize("name", ["mlp", "cnn_bn", "tiny_lm", "nested_inputs", "unused_param",
                                  "shared_submodule"])
def test_saved_bytes_per_module_match_autograd_make_fx(name):
    f = zoo.FIXTURES[name]
    _check(f.make_model(), f.train_fn, f.make_inputs(4), "make_fx")


# AOT's functional graph is not eager's for dropout (one bool mask instead of the
# CPU kernel's float mask) and batch norm (its backward reads the new running
# stats), so only the fixtures without either are compared in that mode.
@pytest.mark.parametrize("name", ["mlp", "nested_inputs", "unused_param", "shared_submodule"])
def test_saved_bytes_per_module_match_autograd_aot(name):
    f = zoo.FIXTURES[name]
    _check(f.make_model(), f.train_fn, f.make_inputs(4), "aot")


def test_saved_bytes_per_module_match_autograd_hf_gpt2():
    f = real.get("hf_gpt2")
    model, inputs = f.make_model(), f.make_inputs()
    _check(model, f.train_fn, inputs, "make_fx")


def test_saved_flag_sits_on_the_allocating_node():
    f = zoo.FIXTURES["tiny_lm"]
    joint = jl.trace(f.make_model(), f.train_fn, f.make_inputs(4))
    df = joint.nodes
    saved = df[df["saved_for_backward"]]
    assert not saved["is_view"].any() and (saved["bytes"] > 0).all()
    owners = {n.name: n.meta[KEY]["storage"] for n in joint.graph.nodes}
    assert all(owners[name] == name for name in saved.index)
    # the MLP's hidden activations (fc output and GELU output) are saved
    assert {"h.0.mlp.0", "h.0.mlp.1"} <= set(saved["module"])
    # the loss is read by the gradient seed (ones_like) only for its size: not saved
    loss = next(n for n in joint.graph.nodes if any(
        u.op == "call_function" and getattr(u.target, "__name__", "").startswith("ones_like")
        for u in n.users) and n.meta[KEY]["phase"] == "forward")
    assert not df.loc[loss.name, "saved_for_backward"]

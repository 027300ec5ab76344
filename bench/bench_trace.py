"""Trace cost: jl.trace against a bare make_fx joint trace of the same model."""

from __future__ import annotations

import contextlib

import torch
from run import interleaved, row
from torch._guards import TracingContext, tracing
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.traceback import preserve_node_meta
from torch.nn.utils import stateless


def bare_joint_trace(model, train_fn, inputs):
    """The minimal make_fx joint trace: no checks, no snapshot, no annotation."""
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    names = list(state)
    pnames = [n for n, p in model.named_parameters() if p.requires_grad]
    keys = list(inputs)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(t) for t in [*state.values(), *inputs.values()]]

    def joint(*args):
        st = dict(zip(names, args[: len(names)]))
        kw = dict(zip(keys, args[len(names):]))
        with stateless._reparametrize_module(model, st, tie_weights=True), \
                torch.compiler._patch_engine_backward():
            loss = train_fn(model, **kw)
            grads = torch.autograd.grad(loss, [st[n] for n in pnames], allow_unused=True)
        return [loss, *grads]

    joint._orig_mod = model
    with contextlib.ExitStack() as stack:
        for cm in (mode, tracing(TracingContext(mode)), preserve_node_meta(),
                   torch.autograd.set_multithreading_enabled(False),
                   torch.compiler._non_strict_tracing_context()):
            stack.enter_context(cm)
        return make_fx(joint, record_stack_traces=True, record_module_stack=True)(*fakes)


def rows(ctx):
    m, fn, inp = ctx.gpt2
    import jointlab as jl

    t = interleaved({"bare": lambda: bare_joint_trace(m, fn, inp),
                     "ours": lambda: jl.trace(m, fn, inp)}, repeat=3 if ctx.quick else 7)
    bare, ours = t["bare"], t["ours"]
    n = len(ctx.gpt2_joint.graph.nodes)
    return [
        row("gpt2-12L d256: bare make_fx joint trace", bare, "s", detail=f"{n} nodes"),
        row("gpt2-12L d256: jl.trace", ours, "s"),
        row("gpt2-12L d256: jl.trace / bare make_fx", ours / bare, "x", "<= 1.3",
            ours / bare <= 1.3),
    ]

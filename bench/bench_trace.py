"""Trace cost: jl.trace against a bare make_fx joint trace of the same step.

Subjects: the 12-layer GPT-2-shaped LM (real tensors), Mixtral-8x7B's shape
on the meta device at 2 and 8 layers, and the 385-layer, 50k-node narrow GPT-2
(48 layers with ``--quick``). Each pair is timed alternately in this
process's CPU time (both are single-threaded Python; other processes' load on a
shared machine stays out), best of the runs. Each timed run ends with a
``gc.collect()`` while the graph is still alive: jl.trace runs no full garbage
collection while it traces (``jointlab.runtime.gc_pause``) and CPython runs the
one that fell due just after, so both sides' figures include a last walk of
the heap. A trace of 5,000 nodes or more (``gc_pause.COLLECT_AT_NODES``) runs
that walk itself as it returns, so for those our figure holds two walks, the
bench's and its own: it overstates ours by one. Target: <= 1.15x.
"""

from __future__ import annotations

import contextlib
import gc
import time

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


def collected(trace):
    """``trace`` followed by a full collection, its graph still alive (timed with it)."""
    def run(*args):
        out = trace(*args)
        gc.collect()
        return out
    return run


def mixtral_meta(layers: int):
    """(model, train_fn, inputs): Mixtral-8x7B's shape on the meta device, ``layers`` deep.

    Hidden 4096, 32 heads (8 KV), 8 experts of 14336 (top 2), vocab 32000, one
    sequence of 512 tokens (on meta too, so the bare trace takes them as they are).
    """
    import transformers as tr

    cfg = tr.MixtralConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                           num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                           vocab_size=32000, num_hidden_layers=layers,
                           max_position_embeddings=4096, output_router_logits=True,
                           experts_implementation="batched_mm")
    with torch.device("meta"):
        model = tr.MixtralForCausalLM(cfg).train()
    ids = torch.zeros(1, 512, dtype=torch.long, device="meta")
    return model, _moe_loss, {"input_ids": ids, "labels": ids.clone()}


def _moe_loss(model, input_ids, labels):
    """The LM loss with the router's load-balancing term (Mixtral adds it to ``loss``)."""
    return model(input_ids=input_ids, labels=labels, use_cache=False).loss


def _ratio_rows(name: str, m, fn, inp, repeat: int) -> list:
    import warnings

    import jointlab as jl

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = interleaved({"bare": lambda: collected(bare_joint_trace)(m, fn, inp),
                         "ours": lambda: collected(jl.trace)(m, fn, inp)}, repeat=repeat, stat=min,
                        clock=time.process_time)
        n = len(jl.trace(m, fn, inp).graph.nodes)
    return _rows(name, t["bare"], t["ours"], n,
                 "CPU time of this process, best of the runs, interleaved, "
                 "each with a full collection after it")


def _few_run_rows(name: str, m, fn, inp, runs: int = 2) -> list:
    """A few traces each, interleaved (bare, ours, bare, ours), best of each, no warm-up (the
    earlier rows warmed both paths): for a subject of minutes. Single pairs read 1.07x to
    1.31x on the same code on a shared machine."""
    import warnings

    import jointlab as jl

    nodes = []

    def traced(trace):
        return lambda: nodes.append(len(collected(trace)(m, fn, inp).graph.nodes))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        times = interleaved({"bare": traced(bare_joint_trace), "ours": traced(jl.trace)},
                            repeat=runs, stat=list, clock=time.process_time, warmup=False)
    runs_text = ", ".join(f"{k} " + " / ".join(f"{t:.1f}" for t in v) + " s"
                          for k, v in times.items())
    return _rows(name, min(times["bare"]), min(times["ours"]), nodes[-1],
                 f"CPU time of this process, best of {runs} interleaved runs, each with a "
                 f"full collection after it ({runs_text})")


def _rows(name: str, bare: float, ours: float, n: int, how: str) -> list:
    return [
        row(f"{name}: bare make_fx joint trace (CPU)", bare, "s", detail=f"{n} nodes"),
        row(f"{name}: jl.trace (CPU)", ours, "s"),
        row(f"{name}: jl.trace / bare make_fx", ours / bare, "x", "<= 1.15", ours / bare <= 1.15,
            detail=how),
    ]


def rows(ctx):
    m, fn, inp = ctx.gpt2
    out = _ratio_rows("gpt2-12L d256", m, fn, inp, 3 if ctx.quick else 5)
    for layers in (2,) if ctx.quick else (2, 8):
        out += _ratio_rows(f"mixtral-8x7B x{layers} meta", *mixtral_meta(layers),
                           3 if ctx.quick else 5)
    # the 385-layer, 50k-node GPT-2 (three interleaved runs each: about 35-50 CPU s
    # per trace on this machine); --quick takes 48 layers (6.3k nodes)
    from run import narrow_lm

    depth = 48 if ctx.quick else 385
    return out + _few_run_rows(f"gpt2 {depth}L d16 (narrow)", *narrow_lm(depth),
                               runs=1 if ctx.quick else 3)

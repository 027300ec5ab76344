"""Recording cost: jl.record (statistics of every value) vs one joint.run, same process."""

from __future__ import annotations

import torch


def rows(ctx):
    from run import interleaved, row

    import jointlab as jl
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2

    model, inputs = make_gpt2(n_layer=4, d=256), lm_inputs(2, 1024, 64)
    joint = jl.trace(model, lm_train_fn, inputs)
    fns = {"run": lambda: joint.run(model, inputs),
           "record": lambda: jl.record(joint, model, inputs)}
    repeat = 5 if ctx.quick else 15
    threads = torch.get_num_threads()
    out = []
    for n in sorted({1, threads}):
        torch.set_num_threads(n)
        try:
            t = interleaved(fns, repeat, stat=min)
        finally:
            torch.set_num_threads(threads)
        ratio = t["record"] / t["run"]
        # the target holds at one intra-op thread, where neither side waits on busy cores
        target, ok = ("<= 2", ratio <= 2) if n == 1 else ("", None)
        out.append(row(f"gpt2-4L d256: jl.record (stats only) / joint.run, {n} thread(s)",
                       ratio, "x", target, ok, detail=f"{len(joint.graph.nodes)} nodes, "
                       f"joint.run {t['run'] * 1e3:.0f} ms"))
    return out

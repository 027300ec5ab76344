"""AOT mode: trace and step time next to the default make_fx mode, and attribution share."""

from __future__ import annotations

import torch
from run import interleaved, row


def attributed_share(joint) -> float:
    """Share of forward/backward compute nodes attributed to a module of the model."""
    from jointlab.meta import KEY, TRAIN_FN

    comp = [n for n in joint.graph.nodes
            if n.op == "call_function" and n.meta[KEY]["phase"] in ("forward", "backward")]
    return sum(n.meta[KEY]["module"] != TRAIN_FN for n in comp) / len(comp)


def rows(ctx):
    import jointlab as jl

    m, fn, inp = ctx.gpt2
    reps = 3 if ctx.quick else 7
    t = interleaved({"make_fx": lambda: jl.trace(m, fn, inp),
                     "aot": lambda: jl.trace(m, fn, inp, mode="aot")}, repeat=reps)
    mfx, aot = ctx.gpt2_joint, jl.trace(m, fn, inp, mode="aot")

    def step(joint):
        def go():
            torch.manual_seed(0)
            joint.run(m, inp)
        return go

    s = interleaved({"make_fx": step(mfx), "aot": step(aot)}, repeat=reps)
    ratio = t["aot"] / t["make_fx"]
    return [
        row("gpt2-12L d256: jl.trace mode=aot", t["aot"], "s",
            detail=f"{len(aot.graph.nodes)} nodes"),
        row("gpt2-12L d256: jl.trace mode=make_fx", t["make_fx"], "s",
            detail=f"{len(mfx.graph.nodes)} nodes"),
        row("gpt2-12L d256: aot trace / make_fx trace", ratio, "x", "report"),
        row("gpt2-12L d256: aot run / make_fx run", s["aot"] / s["make_fx"], "x", "<= 1.2",
            s["aot"] / s["make_fx"] <= 1.2),
        row("gpt2-12L d256: aot nodes attributed to a module", attributed_share(aot), "share",
            ">= 0.9", attributed_share(aot) >= 0.9,
            detail=f"make_fx: {attributed_share(mfx):.3f}"),
    ]

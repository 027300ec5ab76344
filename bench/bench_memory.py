"""Memory analysis: prediction error against the profiler, and analysis cost."""

from __future__ import annotations

import time

from run import row, timeit


def _predict(joint):
    from jointlab.analysis.memory.predict import predict

    return predict(joint)


def rows(ctx):
    import jointlab as jl
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2
    from jointlab.passes.analyze import ensure_analyzed
    from tests.fixtures import zoo

    out = []
    worst = 0.0
    for name, f in zoo.FIXTURES.items():
        model, inputs = f.make_model(), f.make_inputs(4)
        prof = jl.trace(model, f.train_fn, inputs).memory(model, inputs)
        err = abs(prof.peak_error)
        worst = max(worst, err)
        out.append(row(f"{name}: predicted vs measured peak error", 100 * err, "%", "<= 1",
                       err <= 0.01, predicted=prof.peak_bytes, measured=prof.measured_peak_bytes,
                       workspace=prof.workspace_peak_bytes))
    out.append(row("worst peak error over fixtures", 100 * worst, "%", "<= 1", worst <= 0.01))

    joint = ctx.gpt2_joint
    t0 = time.perf_counter()
    ensure_analyzed(joint.graph_module)
    analyze_s = time.perf_counter() - t0
    n = len(joint.graph.nodes)
    mem_s = timeit(lambda: _predict(joint), repeat=3 if ctx.quick else 7)
    share = mem_s / ctx.gpt2_trace_s
    out.append(row("gpt2-12L d256: memory analysis", mem_s, "s", detail=f"{n} nodes",
                   first_ensure_analyzed_s=analyze_s))
    out.append(row("gpt2-12L d256: memory analysis / jl.trace", share, "x", "<= 0.10",
                   share <= 0.10))
    m, fn, inp = ctx.gpt2
    prof = joint.memory(m, inp)
    out.append(row("gpt2-12L d256: predicted vs measured peak error",
                   100 * abs(prof.peak_error), "%", "<= 1", abs(prof.peak_error) <= 0.01,
                   predicted=prof.peak_bytes, measured=prof.measured_peak_bytes))

    # linear in nodes: per-node cost at 24 layers vs 12 layers
    big = jl.trace(make_gpt2(n_layer=24, d=256), lm_train_fn, lm_inputs(2, 1024, 64))
    ensure_analyzed(big.graph_module)
    big_s = timeit(lambda: _predict(big), repeat=3 if ctx.quick else 7)
    ratio = (big_s / len(big.graph.nodes)) / (mem_s / n)
    out.append(row("memory analysis per node: 24L / 12L", ratio, "x", "<= 1.3", ratio <= 1.3,
                   detail=f"{len(big.graph.nodes)} vs {n} nodes"))
    return out

"""Meta-device giants: a Llama-70B-shaped model traced at a few depths, extrapolated to 80.

Each depth is traced in its own fresh process (``python bench/bench_giant.py
--layers N`` prints one JSON record), so its RSS is its own. Per depth: nodes,
``jl.trace`` wall and CPU time, the share of its CPU time spent in jointlab's own
passes (annotation, probes, view repair, the baked-constant check, the analysis,
the lost-backward and meta-attention checks, building the JointGraph), the peak
RSS the trace added (over the process's RSS before it), and the CPU time of the
first (uncached) call of every view: the node table, the collectives table,
``memory()`` and the DAG payload. Nodes, trace CPU time and RSS are fitted
linearly in layers and extrapolated to the real model's 80 layers; "linear"
is checked as the cost per added layer between the two deepest runs against
that between the two shallowest (at most 1.1x: nothing grows faster than the
layers). ``JOINTLAB_BENCH_GIANT_FULL=1`` also traces all 80 (about 30 CPU seconds,
0.31 GiB), which shows what a fit over small depths hides (a super-linear pass).

The "8-rank TP" rows trace the same shape with DTensor tensor parallelism
(``parallelize_module``: q/k/v/gate/up column-wise, o/down row-wise) on
``jl.fake_world(8)``, at 2 and 4 layers (and 80 with ``JOINTLAB_BENCH_GIANT_FULL``;
``--layers N --tp``): rank 0's graph
of local shards, its trace RSS, its collectives, and the CPU time of every view.

On meta, attention takes the math path (S x S scores), so the predicted peak is
the math-path one (``MetaAttentionWarning``); ``jl.fake_cpu()`` gives the fused one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings

from run import ROOT, row

#: Llama-3-70B: hidden 8192, 64 heads, 8 KV heads, MLP 28672, vocab 128256.
SHAPE = dict(hidden_size=8192, num_attention_heads=64, num_key_value_heads=8,
             intermediate_size=28672, vocab_size=128256, max_position_embeddings=8192)
BATCH, SEQ, FULL_DEPTH = 1, 4096, 80


def _model(layers: int):
    import torch
    import transformers as tr

    cfg = tr.LlamaConfig(**SHAPE, num_hidden_layers=layers)
    with torch.device("meta"):
        model = tr.AutoModelForCausalLM.from_config(cfg)
    return model.to(torch.bfloat16).train()


def _tp_plan(layers: int) -> dict:
    """Megatron-style TP of HF Llama: attention and MLP inputs column-, outputs row-wise."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles = {"self_attn.q_proj": ColwiseParallel, "self_attn.k_proj": ColwiseParallel,
              "self_attn.v_proj": ColwiseParallel, "self_attn.o_proj": RowwiseParallel,
              "mlp.gate_proj": ColwiseParallel, "mlp.up_proj": ColwiseParallel,
              "mlp.down_proj": RowwiseParallel}
    return {f"model.layers.{i}.{name}": style() for i in range(layers)
            for name, style in styles.items()}


def _ce(model, input_ids, labels):
    import torch.nn.functional as F

    logits = model(input_ids=input_ids, use_cache=False).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


#: (module, attribute) of every check of the finished graph that trace() runs; the
#: passes themselves are the steps of jointlab.passes.pipeline.PIPELINE.
_PASSES = [("jointlab.trace.tracer", "refuse_explicit_generators"),
           ("jointlab.trace.tracer", "warn_baked_constants"),
           ("jointlab.trace.tracer", "refuse_lost_backward")]


def _timed_passes() -> dict[str, float]:
    """Wrap every pass in :data:`_PASSES` to add its CPU time to the returned dict."""
    import importlib

    spent: dict[str, float] = {}

    def wrap(fn, name):
        def timed(*a, **k):
            t0 = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.process_time() - t0
        return timed

    for mod, name in _PASSES:
        m = importlib.import_module(mod)
        setattr(m, name, wrap(getattr(m, name), name))
    from jointlab.passes import pipeline

    pipeline.PIPELINE = tuple(pipeline.PassStep(step.name, wrap(step.run, step.name))
                              for step in pipeline.PIPELINE)
    return spent


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss() -> int:
    """This process's own peak RSS (``VmHWM``).

    Not ``ru_maxrss``: Linux carries that across ``exec`` from the forking parent,
    so under ``make bench`` (a parent holding GiBs) every depth read the parent's peak.
    """
    with open("/proc/self/status") as f:
        line = next(ln for ln in f if ln.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def _clock(fn):
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def measure(layers: int, tp: int = 0) -> dict:
    """Trace the model at ``layers`` depth and time its views (run in a fresh process).

    Args:
        layers: Decoder layers.
        tp: Tensor-parallel ranks on a ``jl.fake_world`` (0: the unsharded model).

    Returns:
        The JSON record of one depth.
    """
    import jointlab as jl
    from jointlab.runtime.graph import RunnableGraph

    spent = _timed_passes()
    from_parts = RunnableGraph.from_parts.__func__
    RunnableGraph.from_parts = classmethod(lambda cls, p: _add(spent, from_parts, cls, p))
    if not tp:
        return _trace_and_views(_model(layers), layers, spent)
    from torch.distributed.tensor.parallel import parallelize_module

    with jl.fake_world(tp, mesh={"tp": tp}) as world:
        model = parallelize_module(_model(layers), world.mesh, _tp_plan(layers))
        return _trace_and_views(model, layers, spent)


def _trace_and_views(model, layers: int, spent: dict[str, float]) -> dict:
    import torch

    import jointlab as jl
    from jointlab.analysis.distributed import collectives
    from jointlab.viz.dagview import build_payload

    ids = torch.zeros(BATCH, SEQ, dtype=torch.long)
    inputs = {"input_ids": ids, "labels": ids.clone()}
    rss0 = _rss()
    t0, c0 = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jl.errors.MetaAttentionWarning)
        joint = jl.trace(model, _ce, inputs)
    trace_s, trace_cpu = time.perf_counter() - t0, time.process_time() - c0
    rss = max(_rss(), _peak_rss()) - rss0
    views = {"table": _clock(lambda: joint.nodes),
             "collectives": _clock(lambda: collectives(joint)),
             "memory": _clock(lambda: joint.memory()),
             "dag": _clock(lambda: build_payload(joint))}
    coll = collectives(joint)
    return {"layers": layers, "nodes": len(joint.graph.nodes), "trace_s": trace_s,
            "trace_cpu_s": trace_cpu, "passes_s": sum(spent.values()), "passes": spent,
            "rss": rss, "peak": joint.memory().peak_bytes, "views_cpu_s": views,
            "collectives": len(coll), "comm_bytes": int(coll.bytes.sum()),
            "rank_classes": getattr(joint.runtime, "rank_classes", None)}


def _add(spent, fn, cls, parts):
    t0 = time.process_time()
    try:
        return fn(cls, parts)
    finally:
        spent["from_parts"] = spent.get("from_parts", 0.0) + time.process_time() - t0


def _run_depth(layers: int, tp: bool = False) -> dict:
    out = subprocess.run([sys.executable, __file__, "--layers", str(layers),
                          *(["--tp"] if tp else [])], cwd=ROOT.parent,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fit(xs: list[int], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares ``y = a x + b`` and the largest relative residual."""
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    a = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    b = my - a * mx
    return a, b, max(abs(a * x + b - y) / y for x, y in zip(xs, ys)) if n else 0.0


def rows(ctx):
    depths = [2, 4] if ctx.quick else [2, 4, 8]
    if os.environ.get("JOINTLAB_BENCH_GIANT_FULL"):  # the real depth: minutes on 2 loaded cores
        depths.append(FULL_DEPTH)
    recs = [_run_depth(d) for d in depths]
    out = []
    for r in recs:
        d = r["layers"]
        share = r["passes_s"] / r["trace_cpu_s"]
        slowest = max(r["views_cpu_s"], key=r["views_cpu_s"].get)
        out += [
            row(f"llama70b x{d} meta: nodes", r["nodes"], "nodes"),
            row(f"llama70b x{d} meta: jl.trace (wall)", r["trace_s"], "s"),
            row(f"llama70b x{d} meta: jl.trace (CPU)", r["trace_cpu_s"], "s"),
            row(f"llama70b x{d} meta: trace RSS", r["rss"] / 2**30, "GiB", "< 1", r["rss"] < 2**30),
            row(f"llama70b x{d} meta: jointlab passes / trace", 100 * share, "%", "<= 5",
                share <= 0.05),
            row(f"llama70b x{d} meta: slowest view ({slowest}), CPU", r["views_cpu_s"][slowest],
                "s", "< 1", r["views_cpu_s"][slowest] < 1),
            row(f"llama70b x{d} meta: predicted peak (math attention)", r["peak"] / 2**30, "GiB"),
        ]
    xs = [r["layers"] for r in recs]
    for key, unit in (("nodes", "nodes"), ("trace_cpu_s", "s"), ("rss", "GiB")):
        ys = [r[key] / (2**30 if key == "rss" else 1) for r in recs]
        a, b, resid = _fit(xs, ys)
        growth = _marginal_growth(xs, ys)
        out += [row(f"llama70b {key}: per layer (fit over {xs})", a, unit),
                row(f"llama70b {key}: worst residual of the linear fit", 100 * resid, "%"),
                row(f"llama70b {key}: per-layer cost, deepest step / first step", growth, "x",
                    "<= 1.1", growth <= 1.1),
                row(f"llama70b {key}: extrapolated to {FULL_DEPTH} layers", a * FULL_DEPTH + b,
                    unit, "< 1" if key == "rss" else "",
                    (a * FULL_DEPTH + b) < 1 if key == "rss" else None)]
    return out + _tp_rows()


def _marginal_growth(xs: list[int], ys: list[float]) -> float:
    """Cost per added layer between the two deepest runs over that of the two shallowest.

    Above 1 the cost grows faster than the layers (superlinear); at or below 1 it
    is linear, or cheaper per layer once torch's caches are warm (the shallow runs
    also pay for filling them, which a fit's relative residual at 2 layers shows
    as a large miss although nothing grows faster than linear).
    """
    first = (ys[1] - ys[0]) / (xs[1] - xs[0])
    last = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return last / first if first > 0 else float("inf")


def _tp_rows() -> list:
    """The "8-rank TP" rows: rank 0's graph of the TP-sharded model at 2 and 4 layers.

    With ``JOINTLAB_BENCH_GIANT_FULL`` also at the issue's 80 layers.
    """
    out = []
    full = [FULL_DEPTH] if os.environ.get("JOINTLAB_BENCH_GIANT_FULL") else []
    for d in (2, 4, *full):
        r = _run_depth(d, tp=True)
        slowest = max(r["views_cpu_s"], key=r["views_cpu_s"].get)
        name = f"llama70b x{d} meta 8-rank TP"
        out += [
            row(f"{name}: nodes (rank 0)", r["nodes"], "nodes"),
            row(f"{name}: jl.trace (CPU)", r["trace_cpu_s"], "s"),
            row(f"{name}: trace RSS", r["rss"] / 2**30, "GiB", "< 1", r["rss"] < 2**30),
            row(f"{name}: collectives per rank", r["collectives"], "ops"),
            row(f"{name}: collective bytes per rank", r["comm_bytes"] / 2**30, "GiB"),
            row(f"{name}: slowest view ({slowest}), CPU", r["views_cpu_s"][slowest], "s", "< 1",
                r["views_cpu_s"][slowest] < 1),
            row(f"{name}: predicted per-rank peak (math attention)", r["peak"] / 2**30, "GiB"),
        ]
    return out


if __name__ == "__main__":
    if len(sys.argv) in (3, 4) and sys.argv[1] == "--layers":
        sys.path.insert(0, str(ROOT.parent))
        print(json.dumps(measure(int(sys.argv[2]), tp=8 if sys.argv[3:] == ["--tp"] else 0)))

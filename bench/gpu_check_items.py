"""The checks of ``bench/gpu_check.py``, one function each (models and cases: ``gpu_check_cases``).

Each ``check_*`` returns ``(status, detail, figures[, value])``: ``status`` True (ok),
False (FAIL) or ``"known"`` (a limitation the README documents, said in the detail),
``detail`` one line, ``figures`` JSON-ready numbers. They raise :class:`Skip` where a
check does not apply. Every comparison is against an independent reference: eager
autograd run here, float64 reductions on the CPU, ``c.run`` of the same compiled code.

Pass rules: ``run``: ``jl.compare`` ok, and in make_fx mode (or where compare says
bit-exact) every value that eager itself reproduces is bitwise equal. ``record``: NaN/Inf
counts equal; min/max/norm within 1e-4 of their size, mean/std within 1e-4 of the rms.
``memory``: ``|peak_error| <= 1%`` (tests/test_measure.py's bound on CUDA). ``stepper``:
it stops inside the module, ``run()`` and node-by-node outputs are bitwise those of
``joint.run``, its compare is ok, on CUDA per-node memory is recorded. ``compile``:
``c.compare`` ok. ``compiled-step``: the breakpoint stops, no boundary row is off, the
outputs are bitwise ``c.run``'s, every kernel call is timed. ``inject``: MISMATCH naming
the scaled module; ``inject-compiled``: MISMATCH whose kernel holds the scaled node.
``known`` marks only torch < 2.13's documented random-op limit of compiled code.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from gpu_check_cases import (
    KEEP_BYTES,
    SCALE,
    SEED,
    Case,
    Skip,
    best_of,
    eager_step,
    known_random_limit,
    not_bitwise,
    short,
    sync,
    values_of,
)

import jointlab as jl
from jointlab import meta as jmeta


# -- checks -----------------------------------------------------------------------------
def check_trace(case: Case) -> tuple:
    """Build the model on the device; jl.trace it in the case's mode."""
    case.model, case.inputs = case.build(case.device)
    case.joint = jl.trace(case.model, case.train_fn, case.inputs, mode=case.mode)
    n = len(case.joint.graph.nodes)
    return True, f"{n} nodes", {"nodes": n}, case.joint


def check_run(case: Case) -> tuple:
    """joint.run vs eager, value by value; eager vs eager; jl.compare's verdict."""
    e1, e2 = eager_step(case, SEED), eager_step(case, SEED)
    m = case.fresh()
    torch.manual_seed(SEED)
    got = values_of(case.joint.run(m, case.inputs), m)
    diffs = not_bitwise(got, e1)
    nondet = sorted(not_bitwise(e2, e1))
    c = jl.compare(case.joint, case.model, case.inputs, seed=SEED)
    unexplained = {k: v for k, v in diffs.items() if k not in nondet}
    exact_wanted = case.mode == "make_fx" or c.exact
    ok = c.ok and not (exact_wanted and unexplained)
    detail = f"{len(e1) - len(diffs)}/{len(e1)} values bitwise; compare {c.verdict}"
    if diffs:
        detail += f"; not bitwise: {short(diffs)}"
    if nondet:
        detail += (f"; eager run twice differs itself in {len(nondet)} "
                   f"({short(not_bitwise(e2, e1), 2)})")
    return ok, detail, {
        "values": len(e1), "bitwise": len(e1) - len(diffs), "not_bitwise": diffs,
        "not_bitwise_eager_reproducible": unexplained, "eager_nondeterministic": nondet,
        "compare_verdict": c.verdict, "compare_ok": c.ok, "first_inexact": str(c.first_inexact),
        "first_divergence": str(c.first_divergence), "notes": list(c.notes)}


def cpu_stats(v: torch.Tensor) -> dict[str, float]:
    """The record's statistics, recomputed in float64 on the CPU (finite elements)."""
    x = v.detach().to("cpu", torch.float64).flatten()
    fin = x[torch.isfinite(x)]
    out = {"nan": int(torch.isnan(x).sum()), "inf": int(torch.isinf(x).sum())}
    if not fin.numel():
        return {**out, **dict.fromkeys(("mean", "std", "min", "max", "norm"), math.nan),
                "rms": math.nan}
    return {**out, "mean": float(fin.mean()), "std": float(fin.std(correction=0)),
            "min": float(fin.min()), "max": float(fin.max()), "norm": float(fin.norm()),
            "rms": float(fin.square().mean().sqrt())}


def stat_errors(row: Any, ref: dict[str, float], rtol: float = 1e-4) -> list[str]:
    """The statistics of ``row`` beyond float tolerance of ``ref``."""
    bad = [c for c in ("nan", "inf") if int(row[c]) != ref[c]]
    for c in ("mean", "std", "min", "max", "norm"):
        got, want = float(row[c]), ref[c]
        if math.isnan(got) and math.isnan(want):
            continue
        scale = abs(want) if c in ("min", "max", "norm") else ref["rms"]
        if not abs(got - want) <= rtol * scale + 1e-30:
            bad.append(f"{c} {got:.6g} vs {want:.6g}")
    return bad


def check_record(case: Case) -> tuple:
    """jl.record on the device: every kept value's statistics vs CPU float64 reductions."""
    m = case.fresh()
    torch.manual_seed(SEED)
    rec = jl.record(case.joint, m, case.inputs, keep_bytes=KEEP_BYTES)
    tbl = rec.table
    checked, bad, where = 0, {}, set()
    for name, v in rec.values.items():
        row = tbl.loc[name]
        if row["note"] or not isinstance(v, torch.Tensor) or v.is_complex():
            continue
        where.add(v.device.type)
        errs = stat_errors(row, cpu_stats(v))
        if errs:
            bad[name] = "; ".join(errs)
        checked += 1
    ok = checked > 0 and not bad and where == {case.device.type}
    detail = (f"{checked}/{len(tbl)} values' statistics (kept on {sorted(where)}) equal CPU "
              f"float64 reductions within 1e-4" if ok else
              f"{len(bad)}/{checked} differ: " + "; ".join(f"{k}: {v}" for k, v in
                                                          list(bad.items())[:3]))
    return ok, detail, {"checked": checked, "nodes": len(tbl), "kept_on": sorted(where),
                        "mismatches": dict(list(bad.items())[:10]), "loss": rec.loss}


def check_memory(case: Case, out: Any) -> tuple:
    """joint.memory predicted vs measured on the device; the plot saved as SVG."""
    mem = case.joint.memory(model=case.model, inputs=case.inputs)
    path = out / f"memory_{case.name}_{case.mode}.svg"
    path.write_text(jl.plot_memory(mem).svg())
    how = ("the CUDA caching allocator" if case.device.type == "cuda" else
           "CPU profiler events (the caching allocator: skipped: needs CUDA)")
    err = mem.peak_error
    ok = err is not None and abs(err) <= 0.01
    detail = (f"predicted {mem.peak_bytes:,} B vs measured {mem.measured_peak_bytes:,} B by "
              f"{how}: peak_error {100 * (err or 0):+.2f}% (|err| <= 1%); plot {path.name}")
    return ok, detail, {
        "measured_by": how, "predicted_peak_bytes": mem.peak_bytes,
        "measured_peak_bytes": mem.measured_peak_bytes, "peak_error": err,
        "predicted_peak_node": mem.peak_node, "measured_peak_node": mem.measured_peak_node,
        "measured_total_peak_bytes": mem.measured_total_peak_bytes,
        "workspace_peak_bytes": mem.workspace_peak_bytes, "plot": str(path)}


def check_stepper(case: Case) -> tuple:
    """Breakpoint, step, outputs bitwise == joint.run under the seed, compare, cost ratios."""
    j, dev, bpm = case.joint, case.device, case.bp_module
    m = case.fresh()
    torch.manual_seed(SEED)
    want = values_of(j.run(m, case.inputs))
    s = jl.Stepper(j, case.model, case.inputs, device=dev, seed=SEED)
    bp = s.add_breakpoint(module=bpm)
    s.run()
    stop = s.current
    at_bp = s.hit is not None and jmeta.in_module(jmeta.module(stop), bpm)
    s.step(3)
    s.remove_breakpoint(bp)
    diffs = not_bitwise(values_of(s.run()), want)
    c = s.compare()
    s2 = jl.Stepper(j, case.model, case.inputs, device=dev, seed=SEED)
    t0 = time.perf_counter()
    while not s2.done:
        s2.step()
    stepped = time.perf_counter() - t0
    diffs2 = not_bitwise(values_of(s2.outputs), want)
    nt = s2.node_timings()
    t_run = best_of(lambda: j.run(m, case.inputs), dev)
    t_st = best_of(lambda: jl.Stepper(j, m, case.inputs, device=dev, seed=SEED).run(), dev)
    ok = at_bp and not diffs and not diffs2 and c.ok
    mem_ok = dev.type != "cuda" or bool((nt["step_mem_peak"] > 0).any())
    detail = (f"stopped at {stop.name} ({jmeta.module(stop)}); run()/stepped == joint.run "
              f"bitwise: {not diffs}/{not diffs2}; compare {c.verdict}; Stepper.run()/joint.run "
              f"{t_st / t_run:.2f}x; node-by-node {stepped / t_run:.0f}x ({len(s2.nodes)} nodes)")
    return ok and mem_ok, detail, {
        "stopped_at": stop.name, "stopped_module": jmeta.module(stop), "at_breakpoint": at_bp,
        "run_not_bitwise": diffs, "stepped_not_bitwise": diffs2, "compare_verdict": c.verdict,
        "joint_run_s": t_run, "stepper_run_s": t_st, "stepper_run_ratio": t_st / t_run,
        "node_by_node_s": stepped, "node_by_node_ratio": stepped / t_run,
        "nodes": len(s2.nodes), "cuda_mem_recorded": mem_ok}


def check_compile(case: Case) -> tuple:
    """joint.compile() (Triton on CUDA, C++ on CPU), c.compare, kernels and coverage."""
    t0 = time.perf_counter()
    c = case.joint.compile()
    m = case.fresh()
    torch.manual_seed(SEED)
    case.want = values_of(c.run(m, case.inputs))
    sync(case.device)
    compile_s = time.perf_counter() - t0
    case.compiled = c
    cmp = c.compare(case.model, case.inputs, seed=SEED)
    kt, cov = c.kernels(), c.coverage()
    kinds = {str(k): int(v) for k, v in kt["kind"].value_counts().items()} if "kind" in kt else {}
    backend = ("Triton" if case.device.type == "cuda"
               else "C++ kernels (Triton: skipped: needs CUDA)")
    status: Any = cmp.ok
    detail = (f"{backend}, compiled and run in {compile_s:.1f} s; compare {cmp.verdict}; "
              f"{len(kt)} kernel calls {kinds}; coverage {cov.share:.1%}")
    if not cmp.ok:
        detail += f"; first divergence: {cmp.first_divergence}"
        if known_random_limit(case, cmp):
            status = "known"
            detail += " (torch < 2.13: compiled random ops do not draw eager's, README)"
    return status, detail, {
        "backend": backend, "compile_and_run_s": compile_s, "compare_verdict": cmp.verdict,
        "first_divergence": str(cmp.first_divergence), "first_inexact": str(cmp.first_inexact),
        "kernel_calls": len(kt), "kinds": kinds, "coverage": cov.share,
        "unmapped": list(cov.unmapped)[:20], "notes": list(cmp.notes)}, c


def step_with_boundary(sc: Any) -> tuple[dict[str, int], dict[str, list[str]], int]:
    """Step a compiled stepper to its end, reading boundary(eager=True) after each kernel.

    Returns:
        Buffers compared with the graph and with eager, those off (``kernel buffer``), and
        how many were not compared because this torch's compiled code draws other numbers.
    """
    compared = {"graph": 0, "eager": 0}
    off: dict[str, list[str]] = {"graph": [], "eager": []}
    draws = 0
    while not sc.done:
        sc.step()
        b = sc.boundary(eager=True)
        draws += int(b["note"].fillna("").str.contains("draws other numbers").sum())
        for side in compared:
            compared[side] += int(b[f"{side}_ok"].notna().sum())
            off[side] += [f"{sc.last} {i}" for i, v in b[f"{side}_ok"].items() if v is False]
    return compared, off, draws


def check_compiled_step(case: Case) -> tuple:
    """The compiled Stepper: to a breakpoint, then kernel by kernel with boundary() each time."""
    c, dev = case.compiled, case.device
    sc = jl.Stepper(c, case.model, case.inputs, seed=SEED)
    bp = sc.add_breakpoint(module=case.bp_module)
    sc.run()
    hit, stop, at = sc.hit is not None, sc.current, sc.position
    sc.remove_breakpoint(bp)
    compared, off, draws = step_with_boundary(sc)
    diffs = not_bitwise(values_of(sc.outputs), case.want)
    kt = sc.kernel_timings()
    m = case.fresh()
    t_c = best_of(lambda: c.run(m, case.inputs), dev)
    t_s = best_of(lambda: jl.Stepper(c, m, case.inputs, seed=SEED).run(), dev, k=3)
    top = kt.sort_values("step_s", ascending=False).head(3)
    ok: Any = (hit and not diffs and not off["graph"] and not off["eager"]
               and len(kt) == len(sc.kernels))
    detail = (f"stopped before kernel {at} of {len(sc.kernels)} "
              f"({', '.join(sc.kernel_info(stop)['modules'])}); stepped on, boundary() after "
              f"each: {compared['graph']} buffers vs the graph, {compared['eager']} vs eager, "
              f"{len(off['graph'])}+{len(off['eager'])} off; outputs == c.run bitwise: "
              f"{not diffs}; kernel_timings {len(kt)} rows, sum {kt['step_s'].sum() * 1e3:.1f} "
              f"ms; stepper run / c.run {t_s / t_c:.1f}x")
    if ok and not compared["graph"]:
        ok = "known" if draws else False
        detail += (f"; nothing compared: {draws} buffers follow a random op that torch < 2.13's "
                   "compiled code draws otherwise (README)" if draws else "; nothing compared")
    return ok, detail, {
        "stopped_before": stop, "stop_index": at, "kernel_calls": len(sc.kernels),
        "boundary_compared": compared, "boundary_off": {k: v[:10] for k, v in off.items()},
        "boundary_not_compared_draws": draws, "not_bitwise": diffs, "kernels_timed": len(kt),
        "kernel_s_sum": float(kt["step_s"].sum()),
        "slowest": {str(k): float(v) for k, v in top["step_s"].items()},
        "compiled_run_s": t_c, "stepped_run_s": t_s, "stepped_ratio": t_s / t_c}


def probed_output(joint: Any, module: str) -> torch.fx.Node:
    """The graph node that is ``module``'s (first call's) output, as the tracer probed it."""
    for n in joint.graph.nodes:
        if any(p[0] == module for p in jmeta.info(n).get("probe_out", ())):
            return n
    raise LookupError(f"no node is probed as the output of {module!r}")


def scale_output(joint: Any, node: torch.fx.Node) -> None:
    """Make ``node`` compute its op's value times SCALE (it keeps its name and probe)."""
    g = joint.graph
    with g.inserting_before(node):
        orig = g.call_function(node.target, node.args, node.kwargs)
    own = {k: v for k, v in jmeta.info(node).items() if not k.startswith("probe")}
    orig.meta = {**node.meta, "jointlab": own}
    node.target, node.args, node.kwargs = torch.ops.aten.mul.Tensor, (orig, SCALE), {}
    joint.recompute()


def check_inject(case: Case) -> tuple:
    """A module's output scaled x1.001 in the graph: compare says MISMATCH and names it."""
    node = probed_output(case.joint, case.inject_module)
    scale_output(case.joint, node)
    c = jl.compare(case.joint, case.model, case.inputs, seed=SEED)
    d = c.first_divergence
    ok = c.verdict == "MISMATCH" and d is not None and d.module == case.inject_module
    return ok, f"scaled {node.name} ({case.inject_module}) x{SCALE}: {c.verdict}, named {d}", {
        "scaled": node.name, "module": case.inject_module, "verdict": c.verdict,
        "first_divergence": str(d), "named_module": getattr(d, "module", None)}


def check_inject_compiled(case: Case) -> tuple:
    """An Inductor lowering scaled x1.001 (bench/inject.py): MISMATCH at the kernel holding it."""
    import inject
    from bench_heldout_compile import _holds_patched

    targets = {n.target for n in case.joint.graph.nodes if n.op == "call_function"}
    op = inject.pick(targets, inject.FORWARD_OPS)
    if op is None:
        raise Skip(f"the graph calls none of {inject.FORWARD_OPS}")
    with inject.wrong_lowering(op, backward=False) as injected:
        c = case.joint.compile()
        c.run(case.fresh(), case.inputs)
    cmp = c.compare(case.model, case.inputs, seed=SEED)
    d = cmp.first_divergence
    right = d is not None and bool(injected.scaled) and _holds_patched(c, d, injected)
    status: Any = cmp.verdict == "MISMATCH" and right
    detail = (f"{op} lowering x{SCALE} (scaled {injected.scaled}): {cmp.verdict}, named {d}; "
              f"the named kernel holds the scaled node: {right}")
    if not status and known_random_limit(case, cmp) and not right:
        status, detail = "known", detail + " (torch < 2.13 with random ops, README)"
    return status, detail, {"op": str(op), "scaled": injected.scaled, "verdict": cmp.verdict,
                            "first_divergence": str(d), "kernel": getattr(d, "kernel", None),
                            "holds_scaled_node": right}


def check_retarget(device: torch.device) -> tuple:
    """The demo GPT traced on the CPU, stepped on the device: stepped == run(), compare."""
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2

    small = make_gpt2(n_layer=2, d=64, n_head=2, vocab=128, seq=16)
    inputs = lm_inputs(2, 128, 16)
    joint = jl.trace(small, lm_train_fn, inputs)
    s = jl.Stepper(joint, small, inputs, device=device, seed=SEED)
    while not s.done:
        s.step()
    bulk = jl.Stepper(joint, small, inputs, device=device, seed=SEED).run()
    diffs = not_bitwise(values_of(s.outputs), values_of(bulk))
    c = jl.compare(joint, small, inputs, train_fn=lm_train_fn, device=device, seed=1)
    return not diffs and c.ok, f"stepped == run() bitwise: {not diffs}; compare {c.verdict}", {
        "not_bitwise": diffs, "compare_verdict": c.verdict}


def check_big(device: torch.device) -> tuple:
    """gpt2-12L (demo GPT, d=256, batch 8 x 128): Stepper.run()/joint.run, stepping time."""
    from jointlab.models import lm_inputs, lm_train_fn, make_gpt2

    model = make_gpt2(n_layer=12, d=256, seq=128).to(device)  # the old check's 64 refused 128
    inputs = {k: v.to(device) for k, v in lm_inputs(8, 1024, 128).items()}
    joint = jl.trace(model, lm_train_fn, inputs)
    st = jl.Stepper(joint, model, inputs, device=device, seed=0)
    tj = best_of(lambda: joint.run(model, inputs), device)
    ts = best_of(lambda: (st.reset(), st.run()), device)
    st.reset()
    t0 = time.perf_counter()
    while not st.done:
        st.step()
    stepped = time.perf_counter() - t0
    return ts / tj <= 1.10, (f"Stepper.run()/joint.run {ts / tj:.3f}x (<= 1.10; {tj * 1e3:.1f} "
                             f"vs {ts * 1e3:.1f} ms); stepping {len(st.nodes)} nodes "
                             f"{stepped:.2f} s"), {
        "joint_run_s": tj, "stepper_run_s": ts, "ratio": ts / tj, "nodes": len(st.nodes),
        "node_by_node_s": stepped}

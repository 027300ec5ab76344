"""Prepared GPU check (issue 46): the CUDA paths of jointlab, run for real in one short script.

Run it through the device tool as ONE command (one machine start; it ends by itself
well inside the 10-minute command limit, skipping checks not started by ``--budget``,
420 s; expect about 3-5 minutes, most of it the five Inductor compiles)::

    run(command="set -o pipefail; PYTHONUNBUFFERED=1 timeout 540 python3 "
                "bench/gpu_check.py --device cuda --big 2>&1 | tee $OUT/gpu_check.log",
        timeout_s=600)

then ``give_back``. The device image's ``python3`` has torch (2.11 when last read),
Triton, transformers and pandas; jointlab is imported from the working tree. Results go
to ``$OUT`` (the tool sets it; a temporary folder otherwise): ``gpu_check.json`` (every
figure, rewritten after each check, so a run cut short keeps what it did),
``gpu_check.txt`` (the table), one ``memory_<model>_<mode>.svg`` per case and the log: 7
files, inside the tool's 8. Here, ``python bench/gpu_check.py --device cpu`` runs the
same checks on the CPU (Inductor's C++ kernels instead of Triton's, profiler events
instead of the caching allocator: those rows say "skipped: needs CUDA") in about a
minute; the exit status is 1 when a row is FAIL or ERROR.

For the closing note of issue 46, paste: the first line (device, GPU, torch, Triton,
TF32 flags), the table, the whole detail of every row that is not ``ok`` (the table
prints them uncut; ``gpu_check.json`` has all figures), and the ``GPU_CHECK {...}``
line printed last (per row: status, seconds and its key figures: ``run``'s non-bitwise
values with max abs diff and those eager does not reproduce itself, ``memory``'s
``peak_error``, the stepper's and the compiled stepper's cost ratios, ``coverage``, the
named divergences). Say what differs from the CPU run (``--device cpu``) and look at a
memory SVG (render it to PNG with ``jointlab.viz.export.write_svg_or_png``).

Checks, on a tiny HF GPT-2 (random init, ``use_cache=False``, dropout 0.1) and a small
conv+BatchNorm net (written here), each traced on the device in ``mode="make_fx"`` and
``mode="aot"`` (models: ``gpu_check_cases``; each check and its pass rule: ``gpu_check_items``):

* ``run``: ``joint.run`` vs eager autograd from one seed, value by value (loss, grads,
  buffers): bitwise or the max abs diff, and whether eager run twice is bitwise itself (a
  nondeterministic kernel) or not; ``jl.compare``'s verdict and first inexact node.
* ``record``: ``jl.record`` statistics vs float64 CPU reductions of the same kept values.
* ``memory`` (each case's first, so the first case measures a process that has run no
  CUDA kernel yet): ``joint.memory(model, inputs)``: predicted vs measured peak (CUDA: the
  caching allocator's counters), ``peak_error``; ``jl.plot_memory`` saved as SVG.
* ``stepper``: ``jl.Stepper`` on the device: module breakpoint, step, outputs bitwise equal
  to ``joint.run`` under the seed, ``compare``; cost of ``Stepper.run()`` and of stepping
  node by node, as ratios to ``joint.run``. ``retarget``: a CPU trace stepped on CUDA.
* ``compile`` / ``compiled-step``: ``joint.compile()`` (one compile per case), ``c.compare``,
  ``c.kernels()``/``coverage()``; the compiled Stepper kernel by kernel (breakpoint,
  ``boundary()``, outputs bitwise equal to ``c.run``, ``kernel_timings()``, cost vs ``c.run``).
* ``inject``: ``jl.compare`` once a module's output is scaled x1.001 in the graph: MISMATCH,
  ``first_divergence`` names that module. ``inject-compiled`` (cnn/make_fx, one more
  compile): an Inductor lowering scaled x1.001 as the held-out suite injects
  (``bench/inject.py``): MISMATCH, and the named kernel holds the scaled node. Not on
  GPT-2: with dropout, compare does no kernel-by-kernel check and names the random op.
* ``big`` (``--big``): gpt2-12L, ``Stepper.run()/joint.run <= 1.10`` and node-by-node stepping.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import gpu_check_cases as cases  # noqa: E402
import gpu_check_items as items  # noqa: E402

Skip = cases.Skip


@dataclass
class Row:
    """One check's outcome."""

    model: str
    mode: str
    check: str
    status: str = "ok"  # ok, known (a documented limitation), FAIL, ERROR, skipped
    seconds: float = 0.0
    detail: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


class Report:
    """Runs checks one by one, each isolated, under a time budget; writes as it goes."""

    def __init__(self, out: pathlib.Path, budget: float, header: dict[str, Any]) -> None:
        """Write to ``out``; skip checks that start after ``budget`` seconds."""
        self.out, self.budget, self.header = out, budget, header
        self.rows: list[Row] = []
        self.t0 = time.perf_counter()

    def check(self, case: str, mode: str, name: str, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` -> ``(ok, detail, figures[, value])``; return the value or None."""
        row, value = Row(case, mode, name), None
        t = time.perf_counter()
        if t - self.t0 > self.budget:
            row.status, row.detail = "skipped", f"skipped: time budget ({self.budget:.0f} s) spent"
        else:
            try:
                ok, row.detail, row.figures, *rest = fn(*args)
                value = rest[0] if rest else None
                row.status = ok if isinstance(ok, str) else "ok" if ok else "FAIL"
            except Skip as e:
                row.status, row.detail = "skipped", f"skipped: {e}"
            except Exception as e:  # noqa: BLE001 - one check's crash is its result
                traceback.print_exc()
                first = (str(e).strip().splitlines() or [""])[0]
                row.status, row.detail = "ERROR", f"{type(e).__name__}: {first[:300]}"
        row.seconds = round(time.perf_counter() - t, 2)
        self.rows.append(row)
        print(f"{row.status:7} {case:5} {mode:8} {name:16} {row.seconds:7.1f}s  {row.detail}",
              flush=True)
        self.write()
        return value

    def payload(self) -> dict[str, Any]:
        """Everything, JSON-ready."""
        counts = {s: sum(r.status == s for r in self.rows) for s in ("ok", "known", "FAIL",
                                                                      "ERROR", "skipped")}
        return {**self.header, "total_s": round(time.perf_counter() - self.t0, 1),
                "counts": counts, "rows": [dataclasses.asdict(r) for r in self.rows]}

    def summary(self) -> dict[str, Any]:
        """The compact JSON line: header, counts, per row its status, time and key figures."""
        rows = [[r.model, r.mode, r.check, r.status, r.seconds,
                 {k: _brief(r.figures[k]) for k in KEY_FIGURES.get(r.check, ())
                  if k in r.figures}] for r in self.rows]
        full = self.payload()
        return {**self.header, "total_s": full["total_s"], "counts": full["counts"],
                "rows": rows}

    def write(self) -> None:
        """gpu_check.json, rewritten whole."""
        (self.out / "gpu_check.json").write_text(json.dumps(self.payload(), indent=1,
                                                            default=str))

    def table(self) -> str:
        """The readable table."""
        lines = [f"{'status':7} {'model':5} {'mode':8} {'check':16} {'time':>8}  detail"]
        lines += [f"{r.status:7} {r.model:5} {r.mode:8} {r.check:16} {r.seconds:7.1f}s  "
                  f"{_cut(r.detail, DETAIL if r.status in ('ok', 'skipped') else 0)}"
                  for r in self.rows]
        return "\n".join(lines)


#: Per check, the figures the JSON line carries (gpu_check.json has them all).
KEY_FIGURES = {
    "run": ("bitwise", "values", "compare_verdict", "not_bitwise", "eager_nondeterministic"),
    "record": ("checked", "mismatches"),
    "memory": ("predicted_peak_bytes", "measured_peak_bytes", "peak_error"),
    "stepper": ("stepper_run_ratio", "node_by_node_ratio", "compare_verdict"),
    "compile": ("compile_and_run_s", "compare_verdict", "kernel_calls", "coverage"),
    "compiled-step": ("boundary_compared", "boundary_off", "stepped_ratio", "kernel_s_sum"),
    "inject": ("verdict", "named_module"),
    "inject-compiled": ("verdict", "kernel", "holds_scaled_node"),
    "retarget": ("compare_verdict",),
    "big": ("ratio", "node_by_node_s"),
}
#: Characters of an ok or skipped row's detail in the table (others are shown whole).
DETAIL = 150


def _cut(text: str, n: int) -> str:
    return text if not n or len(text) <= n else text[:n - 3] + "..."


def _brief(v: Any) -> Any:
    """A figure made short: 4 significant digits, at most 3 items, strings cut."""
    if isinstance(v, float):
        return float(f"{v:.4g}")
    if isinstance(v, dict):
        return {str(k)[:60]: _brief(x) for k, x in list(v.items())[:3]}
    if isinstance(v, (list, tuple)):
        return [_brief(x) for x in v[:3]] + ([f"+{len(v) - 3}"] if len(v) > 3 else [])
    return _cut(v, 80) if isinstance(v, str) else v


def header(device: torch.device) -> dict[str, Any]:
    """What ran where: device, versions, the numerics flags that decide bitwise equality."""
    h: dict[str, Any] = {"device": str(device), "torch": torch.__version__,
                         "python": sys.version.split()[0]}
    try:
        import transformers
        h["transformers"] = transformers.__version__
    except ImportError:
        h["transformers"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        h.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                 cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                 matmul_tf32=torch.backends.cuda.matmul.allow_tf32,
                 cudnn_tf32=torch.backends.cudnn.allow_tf32,
                 cudnn_deterministic=torch.backends.cudnn.deterministic)
        try:
            import triton
            h["triton"] = triton.__version__
        except ImportError:
            h["triton"] = None
    else:
        h["cpu_threads"] = torch.get_num_threads()
    return h


def needs(what: str) -> Any:
    """A check standing in for one whose input is missing: a visible skip."""
    def skipped() -> Any:
        raise Skip(f"{what} failed (see its row)")
    return skipped


def run_case(rep: Report, case: cases.Case, inject_compiled: list[str]) -> None:
    """Every check of one (model, mode) case, in order of importance.

    ``memory`` comes first, so the first case measures a process that has run no CUDA
    kernel yet. A check whose input (the trace, the compile) failed is a skipped row.
    """
    def check(name: str, fn: Any, *args: Any, after: str = "trace") -> None:
        ready = case.joint if after == "trace" else case.compiled
        if ready is None:
            fn, args = needs(after), ()
        rep.check(case.name, case.mode, name, fn, *args)

    rep.check(case.name, case.mode, "trace", items.check_trace, case)
    check("memory", items.check_memory, case, rep.out)
    check("run", items.check_run, case)
    check("record", items.check_record, case)
    check("stepper", items.check_stepper, case)
    check("compile", items.check_compile, case)
    check("compiled-step", items.check_compiled_step, case, after="compile")
    if f"{case.name}/{case.mode}" in inject_compiled:
        check("inject-compiled", items.check_inject_compiled, case)
    check("inject", items.check_inject, case)


def retarget(device: torch.device) -> Any:
    """The CPU-traced-stepped-on-CUDA check, or a skip off CUDA."""
    if device.type != "cuda":
        raise Skip("needs CUDA (a CPU trace stepped on the GPU)")
    return items.check_retarget(device)


def big(device: torch.device, wanted: bool) -> Any:
    """The gpt2-12L timing, when asked for."""
    if not wanted:
        raise Skip("not asked for (--big)")
    return items.check_big(device)


def main(argv: list[str] | None = None) -> int:
    """Run every check; print the table and one JSON line; exit 1 on a FAIL or ERROR."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default="gpt2,cnn", help="comma-separated: gpt2, cnn")
    p.add_argument("--modes", default="make_fx,aot")
    p.add_argument("--inject-compiled", default="cnn/make_fx",
                   help="comma-separated model/mode cases given one more compile with an "
                        "Inductor bug ('' for none); "
                        "not gpt2: with dropout, compare names the random op (README)")
    p.add_argument("--big", action="store_true", help="also the gpt2-12L timing")
    p.add_argument("--budget", type=float, default=420.0,
                   help="seconds after which checks not yet started are skipped")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    modes = [m for m in args.modes.split(",") if m]
    if not set(models) <= set(cases.MODELS) or not set(modes) <= {"make_fx", "aot"}:
        p.error(f"--models takes {sorted(cases.MODELS)}, --modes make_fx and aot")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("GPU_CHECK " + json.dumps({"device": "cuda", "error": "no CUDA device here"}))
        return 2
    out = pathlib.Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu_check_"))
    out.mkdir(parents=True, exist_ok=True)
    rep = Report(out, args.budget, header(device))
    print(" ".join(f"{k}={v}" for k, v in rep.header.items()), flush=True)
    for name in models:
        for mode in modes:
            run_case(rep, cases.Case(name, mode, device), args.inject_compiled.split(","))
    rep.check("demo", "make_fx", "retarget", retarget, device)  # jointlab.models' GPT
    rep.check("demo", "make_fx", "big", big, device, args.big)
    text = rep.table()
    (out / "gpu_check.txt").write_text(text + "\n")
    print("\n" + text)
    payload = rep.payload()
    print(f"\nwritten to {out}; total {payload['total_s']} s; {payload['counts']}")
    print("GPU_CHECK " + json.dumps(rep.summary(), default=str, separators=(",", ":")),
          flush=True)
    return 1 if payload["counts"]["FAIL"] or payload["counts"]["ERROR"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""First view of each jointlab view in a fresh Jupyter kernel: what a class waits for.

For each view a new ``python3`` kernel (``jupyter_client``) imports jointlab,
traces notebook 01's tiny GPT-2 (2 layers, d=64) and builds what the view needs
(memory profile, comparison, stepper) untimed; then one cell builds the view and
hands it to ``display`` (IPython's formatters: the view's HTML, mime bundle or
widget comms), timed inside the kernel. That is the first view's cost on top of
the analysis: the imports the view pulls in (plotly, ipywidgets, anywidget,
pandas' HTML) and its own rendering. Target: every first view <= 1 s of wall time; the
kernel's CPU time is printed beside it, as the wall time of a loaded machine varies.
Run alone: ``python bench/bench_first_view.py [VIEW ...]``.
"""

from __future__ import annotations

import sys
import time

from run import row

SETUP = """
import time, torch, torch.nn.functional as F
import jointlab as jl
from jointlab.models import lm_inputs, make_gpt2
model = make_gpt2(n_layer=2, d=64, n_head=4, vocab=256, seq=32)
inputs = lm_inputs(4, vocab=256, seq=32)
def train_fn(model, input_ids, labels):
    return F.cross_entropy(model(input_ids).flatten(0, 1), labels.flatten())
joint = jl.trace(model, train_fn, inputs)
{extra}
"""

#: view -> (untimed setup it needs, the displayed expression)
VIEWS = {
    "dag_view": ("", "jl.dag_view(joint)"),
    "plot_memory": ("profile = joint.memory(model=model, inputs=inputs)",
                    "jl.plot_memory(profile)"),
    "plot_lifetimes": ("profile = joint.memory(model=model, inputs=inputs)",
                       "jl.plot_lifetimes(profile)"),
    "explore": ("", "jl.explore(joint, depth=2, height=420)"),
    "stepper widget": ("stepper = jl.Stepper(joint, model, inputs, device='cpu', seed=0)",
                       "stepper.widget(train_fn=train_fn)"),
    "module_summary": ("", "jl.module_summary(joint, model)"),
    "node table": ("", "joint.nodes"),
    "compare card": ("", "jl.compare(joint, model, inputs, seed=0)"),
    "memory card": ("", "joint.memory(model=model, inputs=inputs)"),
}
#: views whose expression itself runs an analysis: that part is timed apart and left out
ANALYSIS = {"compare card": "jl.compare(joint, model, inputs, seed=0)",
            "memory card": "joint.memory(model=model, inputs=inputs)",
            "node table": "joint.nodes", "module_summary": "jl.module_summary(joint, model)"}

TIMED = """
from IPython.display import display
c0, t0 = time.process_time(), time.perf_counter()
_obj = {expr}
t1 = time.perf_counter()
display(_obj)
t2 = time.perf_counter()
print("JLTIME", t1 - t0, t2 - t1, time.process_time() - c0)
"""


def _run(kc, code: str, timeout: float = 600) -> str:
    """Execute ``code`` in the kernel; its stdout (raises on an error)."""
    out: list[str] = []
    msg_id = kc.execute(code)
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            out.append(content["text"])
        elif kind == "error":
            raise RuntimeError("\n".join(content["traceback"]))
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(out)


def first_view(view: str) -> tuple[float, float, float]:
    """(build s, display s, kernel CPU s) of ``view`` in a fresh kernel; analysis left out."""
    from jupyter_client.manager import start_new_kernel

    extra, expr = VIEWS[view]
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        if view in ANALYSIS:  # the analysis is not the view: run it once, time the rendering
            extra = f"_warm = {ANALYSIS[view]}\n{extra}"
            expr = "_warm"
        _run(kc, SETUP.format(extra=extra))
        line = next(x for x in _run(kc, TIMED.format(expr=expr)).splitlines()
                    if x.startswith("JLTIME"))
        build, shown, cpu = map(float, line.split()[1:])
        return build, shown, cpu
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def rows(ctx):
    out = []
    for view in VIEWS:
        build, shown, cpu = first_view(view)
        total = build + shown
        out.append(row(f"first {view} in a fresh kernel (build + display)", total, "s",
                       "<= 1", total <= 1.0, build_s=build, display_s=shown, cpu_s=cpu))
    return out


if __name__ == "__main__":
    for name in sys.argv[1:] or VIEWS:
        t = time.perf_counter()
        b, d, c = first_view(name)
        print(f"{name:<16} build {b:7.3f} s  display {d:7.3f} s  total {b + d:7.3f} s  "
              f"(CPU {c:.3f} s; kernel {time.perf_counter() - t:.0f} s)", flush=True)

"""One DAG layout: the renderer's ``layeredLayout`` and ``viz/_layout.py`` agree exactly.

The JS functions are cut out of the shipped renderer source by name (whatever
file under ``viz/static/`` holds them) and run with node on the same item
sets the Python layout gets: real graphs (a tiny MLP, HF GPT-2 tiny, a
torchvision-style ConvNeXt), every node open, and collapsed to module boxes
at several depths (items ordered by each side's own ``topoOrder``). Positions,
layers and buckets must be identical, bit for bit. Without node the tests
skip with a message saying so (never silently).
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

import jointlab as jl
from jointlab.viz import _layout
from jointlab.viz._dagdata import collapse, graph_data
from tests.fixtures import real, zoo
from tests.fixtures.convnext import ConvNeXt, convnext_inputs, convnext_train_fn

STATIC = pathlib.Path(jl.__file__).parent / "viz" / "static"
FUNCTIONS = ("csr", "topoOrder", "forwardLayers", "backwardBuckets", "stackColumns",
             "barycentres", "columnsOf", "bandY", "gapEdges", "crossingCount", "layeredLayout")
CONSTANTS = {"SWEEPS": _layout.SWEEPS, "BAND_GAP": _layout.BAND_GAP,
             "NODE_SLOT": _layout.NODE_SLOT, "BOX_COLS": _layout.BOX_COLS,
             "BOX_SLOT": _layout.BOX_SLOT}
NODE = shutil.which("node") or ("/usr/bin/node" if pathlib.Path("/usr/bin/node").exists()
                                else None)


def _block_end(src: str, start: int) -> int:
    """Index after the ``}`` closing the first ``{`` at or after ``start``."""
    depth, k, quote = 0, src.index("{", start), None
    while k < len(src):
        c = src[k]
        if quote:
            k += 2 if c == "\\" else 1
            if c == quote:
                quote = None
            continue
        if c in "'\"`":
            quote = c
        elif src.startswith("//", k):
            k = src.index("\n", k)
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return k + 1
        k += 1
    raise AssertionError("unbalanced braces in the renderer source")


def _definition(sources: str, head: str) -> str:
    m = re.search(head, sources)
    assert m, f"{head!r} not found in {STATIC}/*.js: the renderer was renamed or split"
    return sources[m.start():_block_end(sources, m.end())]


def js_layout_source() -> str:
    """The renderer's layout functions and constants, as one node script prelude."""
    sources = "\n".join(p.read_text(encoding="utf-8") for p in sorted(STATIC.glob("*.js")))
    parts = []
    for name in CONSTANTS:
        m = re.search(rf"\b{name}\s*=\s*([0-9.]+)", sources)
        assert m, f"constant {name} not found in the renderer"
        parts.append(f"const {name} = {m.group(1)};")
    parts.append(_definition(sources, r"class MinHeap\b"))
    parts += [_definition(sources, rf"function {name}\(") for name in FUNCTIONS]
    return "\n".join(parts)


RUNNER = """
const cases = JSON.parse(require("fs").readFileSync(0, "utf8"));
const out = cases.map(c => {
  const order = topoOrder(c.n, Float64Array.from(c.rank), Int32Array.from(c.src),
                          Int32Array.from(c.dst));
  const loc = new Int32Array(c.n); order.forEach((v, k) => { loc[v] = k; });
  const pick = (a, T) => T.from(order, v => a[v]);
  const twin = Int32Array.from(order, v => c.twin[v] >= 0 ? loc[c.twin[v]] : -1);
  const lay = layeredLayout({n: c.n, band: pick(c.band, Uint8Array), w: pick(c.w, Float64Array),
    h: pick(c.h, Float64Array), twin, src: Int32Array.from(c.src, v => loc[v]),
    dst: Int32Array.from(c.dst, v => loc[v])});
  return {order, x: Array.from(lay.x), y: Array.from(lay.y), layer: Array.from(lay.layer),
          bucket: Array.from(lay.bucket)};
});
process.stdout.write(JSON.stringify({cases: out, constants: {%s}}));
"""


def run_js(cases: list[dict]) -> dict:
    if NODE is None:
        pytest.skip("node is not installed: the JS/Python layout parity cannot be checked "
                    "(install nodejs; CI has /usr/bin/node)")
    consts = ", ".join(CONSTANTS)
    script = js_layout_source() + RUNNER % consts
    run = subprocess.run([NODE, "-e", script], input=json.dumps(cases), capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)


def item_cases(joint) -> list[tuple[str, dict]]:
    """The graph every node open, then collapsed to boxes at depths 1..3 (if distinct)."""
    full = graph_data(joint)
    cases = [("open", {"n": len(full.names), "band": [int(b) for b in full.is_bwd],
                       "w": [1.0] * len(full.names),
                       "h": [_layout.NODE_SLOT] * len(full.names),
                       "twin": list(full.twin), "rank": list(range(len(full.names))),
                       "src": full.src.tolist(), "dst": full.dst.tolist()})]
    pos = {n: i for i, n in enumerate(full.names)}
    seen = set()
    for depth in (1, 2, 3):
        d = collapse(full, depth)
        if len(d.names) in seen:
            continue
        seen.add(len(d.names))
        n = len(d.names)
        cases.append((f"depth {depth}", {
            "n": n, "band": [int(b) for b in d.is_bwd], "w": [float(_layout.BOX_COLS)] * n,
            "h": [_layout.BOX_SLOT] * n, "twin": list(d.twin),
            "rank": [min(pos[m] for m in ms) for ms in d.members],
            "src": d.src.tolist(), "dst": d.dst.tolist()}))
    return cases


def python_layout(c: dict) -> dict:
    order = _layout.topo_order(c["n"], c["rank"], c["src"], c["dst"])
    loc = {v: k for k, v in enumerate(order)}
    twin = [loc[c["twin"][v]] if c["twin"][v] >= 0 else -1 for v in order]
    lay = _layout.layered_layout([bool(c["band"][v]) for v in order],
                                 [loc[v] for v in c["src"]], [loc[v] for v in c["dst"]], twin,
                                 w=[c["w"][v] for v in order], h=[c["h"][v] for v in order])
    return {"order": order, "x": lay.x.tolist(), "y": lay.y.tolist(),
            "layer": lay.layer.tolist(), "bucket": lay.bucket.tolist()}


def _mlp():
    f = zoo.FIXTURES["mlp"]
    return jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))


def _gpt2():
    f = real.get("hf_gpt2")
    return jl.trace(f.make_model(), f.train_fn, f.make_inputs(2))


def _convnext():
    torch.manual_seed(0)
    return jl.trace(ConvNeXt(), convnext_train_fn, convnext_inputs())


@pytest.mark.parametrize("make", [_mlp, _gpt2, _convnext], ids=["mlp", "hf_gpt2", "convnext"])
def test_js_and_python_layouts_are_identical(make):
    cases = item_cases(make())
    assert len(cases) >= 2  # open, and at least one collapsed level
    got = run_js([c for _, c in cases])
    assert got["constants"] == CONSTANTS
    for (what, c), js in zip(cases, got["cases"]):
        py = python_layout(c)
        assert py["order"] == js["order"], what
        for key in ("layer", "bucket", "x", "y"):
            a, b = np.asarray(py[key]), np.asarray(js[key])
            bad = np.flatnonzero(a != b)
            assert not len(bad), (f"{what}: {key} differs at {len(bad)} of {c['n']} items, "
                                  f"first item {bad[0]}: python {a[bad[0]]}, js {b[bad[0]]}")


def test_topo_order_breaks_a_cycle_at_the_lowest_rank_like_the_renderer():
    # a module called twice collapses to a cycle: 0 -> 1 -> 2 -> 1, and 3 from 0
    c = {"n": 4, "band": [0, 0, 0, 0], "w": [2.0] * 4, "h": [2.4] * 4, "twin": [-1] * 4,
         "rank": [0.0, 5.0, 3.0, 1.0], "src": [0, 1, 2, 0], "dst": [1, 2, 1, 3]}
    js = run_js([c])["cases"][0]
    assert python_layout(c)["order"] == js["order"] == [0, 3, 2, 1]

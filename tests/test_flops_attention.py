"""FLOPs of attention nodes and of ops without a formula: counted or unknown, never 0.

torch before 2.15 has no FLOP formula for CPU flash attention; jointlab gives the
one 2.15 registers (checked against the hand count from the nodes' shapes, and
against torch 2.15's own counter: this interpreter's on torch 2.15 or later, else the
one ``JOINTLAB_TORCH215_PYTHON`` names, default ``/tmp/venv-t215/bin/python``). A matmul-like op
without a formula is unknown, so summaries say so instead of adding 0.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import jointlab as jl
from jointlab import torch_compat
from jointlab.meta import phase
from jointlab.viz.module_table import module_summary_html
from tests.fixtures import real
from tests.util import traced_real

pytest.importorskip("transformers")
if torch_compat.release(torch.__version__) < (2, 13, 0):
    pytest.skip("torch before 2.13: its sdpa FLOP formula rejects grouped-query shapes, so "
                "these attention nodes are counted unknown (never 0); the exact counts are "
                f"checked on torch 2.13 and later; this is torch {torch.__version__}",
                allow_module_level=True)

HAS_215_COUNTER = torch_compat.release(torch.__version__) >= (2, 15, 0)
T215 = (pathlib.Path(sys.executable) if HAS_215_COUNTER else
        pathlib.Path(os.environ.get("JOINTLAB_TORCH215_PYTHON", "/tmp/venv-t215/bin/python")))


def _attention(joint) -> list[torch.fx.Node]:
    return [n for n in joint.graph.nodes
            if n.op == "call_function" and "scaled_dot_product" in str(n.target)]


def _shape(node: torch.fx.Node, i: int) -> tuple[int, ...]:
    return tuple(node.args[i].meta["val"].shape)


def _hand_count(node: torch.fx.Node) -> int:
    """2·m·n·k per matmul of attention: QKᵀ and PV forward; the backward adds dP, dV, dQ, dK."""
    backward = str(node.target).split(".")[-2].endswith("backward")
    q, k, v = (_shape(node, i + backward) for i in range(3))
    (b, h, sq, dq), sk, dv = q, k[2], v[3]
    if not backward:
        return 2 * b * h * sq * sk * dq + 2 * b * h * sq * sk * dv
    return 2 * b * h * sq * sk * (dq + dv + dv + dq + dq)


def _torch215_count(q, k, v) -> int:
    """torch 2.15's counter on real CPU attention of these shapes (fwd + bwd), in a fresh
    process of :data:`T215` (so the test process's own FLOP registry stays untouched)."""
    code = ("import json,sys,torch\nfrom torch.utils.flop_counter import FlopCounterMode\n"
            "q,k,v=(torch.randn(*s,requires_grad=True) for s in json.loads(sys.argv[1]))\n"
            "with FlopCounterMode(display=False) as c:\n"
            "    torch.nn.functional.scaled_dot_product_attention(\n"
            "        q,k,v,is_causal=True,enable_gqa=True).sum().backward()\n"
            "print(c.get_total_flops())")
    out = subprocess.run([str(T215), "-c", code, json.dumps([q, k, v])], capture_output=True,
                         text=True, timeout=120, check=True)
    return int(out.stdout.split()[-1])


@pytest.fixture(scope="module")
def llama():
    return traced_real("hf_llama", "make_fx")


def test_cpu_flash_attention_flops_match_the_hand_count(llama):
    _, model, _, joint = llama
    nodes = _attention(joint)
    phases = {phase(n) for n in nodes}
    assert len(nodes) == 2 * model.config.num_hidden_layers
    assert phases == {"forward", "backward"}
    df = joint.nodes
    for n in nodes:
        assert not df.loc[n.name, "flops_unknown"], n.name
        assert df.loc[n.name, "flops"] == _hand_count(n) > 0, n.name
    by_mod = jl.module_summary(joint, model)
    attn = "model.layers.0.self_attn"
    own = df[(df["module"] == attn) | df["module"].str.startswith(attn + ".")]
    assert by_mod.loc[attn, "flops_fwd"] == own["flops"][own["phase"] == "forward"].sum()
    assert by_mod.loc[attn, ["flops_unknown_fwd", "flops_unknown_bwd"]].sum() == 0


@pytest.mark.skipif(not T215.exists(), reason=f"this is torch {torch.__version__}, and no torch "
                    f"2.15 interpreter at {T215} (set JOINTLAB_TORCH215_PYTHON)")
def test_cpu_flash_attention_flops_match_torch_215_counter(llama):
    _, _, _, joint = llama
    fwd = next(n for n in _attention(joint) if phase(n) == "forward")
    bwd = next(n for n in _attention(joint) if phase(n) == "backward"
               and _shape(n, 1) == _shape(fwd, 0))
    shapes = [list(_shape(fwd, i)) for i in range(3)]
    df = joint.nodes
    assert df.loc[fwd.name, "flops"] + df.loc[bwd.name, "flops"] == _torch215_count(*shapes)


def test_a_matmul_without_formula_is_unknown_and_summaries_say_so(monkeypatch):
    from torch.utils.flop_counter import flop_registry

    monkeypatch.delitem(flop_registry, torch.ops.aten.mm)
    f = real.get("hf_llama")  # a fresh trace (traced_real's is cached, analysed with mm)
    model, inputs = f.make_model(), f.make_inputs()
    joint = jl.trace(model, f.train_fn, inputs)
    df = joint.nodes
    mm = set(df.index[df["target"] == "aten.mm"])
    assert mm and set(df.index[df["flops_unknown"]]) == mm
    assert not df.loc[df["category"] == "pointwise", "flops_unknown"].any()
    by_mod = jl.module_summary(joint, model)
    root = by_mod.loc[""]
    assert root["flops_unknown_fwd"] + root["flops_unknown_bwd"] == len(mm)
    assert "unknown" in module_summary_html(by_mod)
    assert joint.summary()["flops_unknown"].sum() == len(mm)

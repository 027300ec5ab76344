"""Honest kernel credit: a fused kernel is credited with what it computes, not what it copies.

One Inductor compile of a small conv net (three convolutions, ReLUs, an MSE loss)
serves the module. Inductor transposes the weight gradients its
``convolution_backward`` calls return, and lays activations and weights out
channels-last, inside kernels that also compute ReLUs; its provenance credits
those kernels with the convolutions. References are independent of the kernel map:
the generated wrapper (``convolution_backward`` runs as an extern call, never in a
fused kernel) and which buffer each kernel writes holds which node.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab.analysis import kernels as K
from tests.util import one_thread


def _step(m, x, y):
    return F.mse_loss(m(x), y)


@pytest.fixture(scope="module")
def conv():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                          nn.ReLU(), nn.Conv2d(8, 1, 1))
    inputs = {"x": torch.randn(2, 3, 8, 8), "y": torch.randn(2, 1, 8, 8)}
    with one_thread():
        compiled = jl.trace(model, _step, inputs).compile()
        compiled.run(model, inputs)
        yield model, inputs, compiled


def _conv_backward(compiled):
    return {n.name for n in compiled.source.graph.nodes
            if "convolution_backward" in str(n.target)}


def test_no_fused_kernel_is_credited_with_a_convolution_backward_it_only_copies(conv):
    _, _, compiled = conv
    inner, table = compiled.compiled, K.kernel_table(compiled)
    conv_bwd = _conv_backward(compiled)
    # the reference: the wrapper runs each convolution_backward as an extern call, and no
    # fused kernel's generated body calls a convolution
    code = inner.source_code
    assert code.count("torch.ops.aten.convolution_backward.default(") == len(conv_bwd) == 3
    fused = table[~table.index.map(K.is_extern)]
    assert not any("convolution" in src.split("{", 1)[-1] for src in fused["source"])
    # Inductor's own provenance credits fused kernels with them: the case is exercised
    post_to_pre = inner.provenance["postToPre"]
    raw = {k for k, posts in inner.provenance["cppCodeToPost"].items() if not K.is_extern(k)
           and conv_bwd & {p for post in posts for p in post_to_pre.get(post, [])}}
    assert len(raw) >= 2, inner.provenance["cppCodeToPost"]
    for kernel, row in fused.iterrows():
        assert not conv_bwd & set(row.nodes), (kernel, row.nodes)
    # only the extern calls compute them, and each still is covered
    for name in conv_bwd:
        cover = [k for k, row in table.iterrows() if name in row.nodes]
        assert cover and all(K.is_extern(k) for k in cover), (name, cover)
    assert not conv_bwd & set(K.kernel_coverage(compiled).unmapped)
    # what was dropped is named as copied: the weight gradients transposed after them
    copied = {v for k in raw for v in table.loc[k, "copies"]}
    grads = {inner.buffers[c][0] for c in inner.copies
             if c in inner.buffers and inner.buffers[c][0].startswith("getitem")}
    assert grads and grads <= copied, (grads, copied)


def test_kernels_that_compute_keep_their_credit(conv):
    _, _, compiled = conv
    inner, table = compiled.compiled, K.kernel_table(compiled)
    post_to_pre = inner.provenance["postToPre"]
    order = {n.name for n in compiled.source.graph.nodes}
    checked = 0
    for kernel, writes in K.kernel_writes(compiled).items():
        if K.is_extern(kernel):
            continue
        for buf in writes:  # a buffer computed (not copied) here holds a node it computes
            if buf in inner.copies or buf not in inner.buffers:
                continue
            pre = [p for p in post_to_pre.get(inner.buffers[buf][0], []) if p in order]
            assert set(pre) <= set(table.loc[kernel, "nodes"]), (kernel, buf, pre)
            checked += len(pre)
    assert checked >= 5
    ops = {str(n.target)
           for n in compiled.source.graph.nodes
           if any(n.name in row.nodes for _, row in table.iterrows())}
    assert any("relu" in o for o in ops) and any("threshold_backward" in o for o in ops)


def test_every_boundary_row_that_compares_nothing_says_why(conv):
    model, inputs, compiled = conv
    inner = compiled.compiled
    s = jl.Stepper(compiled, model, inputs, seed=0)
    writes = K.kernel_writes(compiled)
    no_origin = 0
    while not s.done:
        kernel = s.current
        s.step()
        tab = s.boundary()
        held = {b for b in writes[kernel] if isinstance(s.namespace.get(b), torch.Tensor)}
        assert held <= set(tab.index) and len(tab), (kernel, tab)
        for buf, row in tab.iterrows():
            if row["graph_ok"] is None:
                assert row["note"], (kernel, buf, row.to_dict())
            if buf not in inner.buffers and isinstance(s.namespace.get(buf), torch.Tensor):
                no_origin += 1
                assert row["node"] is None and row["note"], (kernel, buf, row.to_dict())
                assert "origin" in row["note"] or "layout copy" in row["note"], row["note"]
    assert no_origin >= 3

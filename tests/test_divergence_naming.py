"""A compiled bug from a decomposition is named at its op (issue 41, item 7).

The reference is where the bug was injected: Inductor's decomposition of
``aten.gelu`` (forward, first called in ``enc1``) or of
``aten.native_layer_norm_backward`` (a tuple-valued backward op, first run for
``enc2.ln`` since the backward runs the blocks in reverse) scaled by 1.001 while
the graph compiles. Every kernel then matches Inductor's post-grad graph, so the
bug arose before lowering, and ``first_divergence`` must name the patched op,
where it used to name the loss or a parameter gradient after it. A clean compile
pairs every traced op with its post-grad values and finds no divergence there.
A pattern replacement (``mm`` + ``add`` -> ``addmm``) is paired with the ``add``
only (stub provenance, no compile). Three small Inductor compiles.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab import torch_compat
from jointlab.analysis.compare.judge import Tolerance
from jointlab.analysis.kernel_probe import first_decomposed_divergence, first_diverging_kernel
from jointlab.analysis.post_grad import _group_outputs
from jointlab.analysis.step.runner import ValueRecorder
from tests.util import one_thread

aten = torch.ops.aten


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1, self.fc2, self.ln = nn.Linear(d, 2 * d), nn.Linear(2 * d, d), nn.LayerNorm(d)

    def forward(self, x):
        return self.ln(x + self.fc2(F.gelu(self.fc1(x))))


class _TwoBlocks(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.enc1, self.enc2, self.head = _Block(d), _Block(d), nn.Linear(d, 4)

    def forward(self, x):
        return self.head(self.enc2(self.enc1(x)))


def _mse(m, x, y):
    return F.mse_loss(m(x), y)


def _setup():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return _TwoBlocks(), {"x": torch.randn(4, 8, 16, generator=g),
                          "y": torch.randn(4, 8, 4, generator=g)}


def _wrong_gelu(base):
    def gelu(x, approximate="none"):
        return base(x, approximate) * 1.001
    return gelu


def _wrong_ln_backward(base):
    def ln_backward(*args):
        dx, dw, db = base(*args)
        return (None if dx is None else dx * 1.001), dw, db
    return ln_backward


_BUGS = {  # op patched -> (wrong decomposition, the node and module it must name)
    "gelu": (aten.gelu.default, _wrong_gelu, "gelu", "enc1"),
    "layer_norm_backward": (aten.native_layer_norm_backward.default, _wrong_ln_backward,
                            "native_layer_norm_backward", "enc2.ln"),
}


def _compiled_with(monkeypatch, op, wrong):
    model, inputs = _setup()
    decomp = torch_compat.torch_module("torch._inductor.decomposition", "inject a wrong one")
    monkeypatch.setitem(decomp.decompositions, op, wrong(decomp.decompositions[op]))
    with one_thread():
        compiled = jl.trace(model, _mse, inputs).compile("inductor")
        compiled.run(model, inputs)
    monkeypatch.undo()
    return model, inputs, compiled


@pytest.mark.parametrize("bug", sorted(_BUGS))
def test_a_wrong_decomposition_is_named_at_its_op(monkeypatch, bug):
    op, wrong, node, module = _BUGS[bug]
    model, inputs, compiled = _compiled_with(monkeypatch, op, wrong)
    with one_thread():
        c = compiled.compare(model, inputs)
    print(c)
    assert c.verdict == "MISMATCH", repr(c)
    check = c.kernels["inductor"]
    assert check.first is None, repr(c)  # no kernel differs: it arose before lowering
    assert "arose before lowering" in repr(c)
    d = c.first_divergence
    assert d is not None and d.candidate == "inductor", repr(c)
    assert (d.node, d.module) == (node, module), str(d)
    assert d.what == "output after Inductor's decompositions" and d.phase, str(d)
    assert 5e-4 < d.max_rel_err < 2e-3, str(d)  # the 1.001 the decomposition put there
    assert f"inductor: {node} (output after Inductor's decompositions of module " \
           f"'{module}'" in repr(c)


def test_a_clean_compile_pairs_every_op_without_a_divergence():
    model, inputs = _setup()
    with one_thread():
        compiled = jl.trace(model, _mse, inputs).compile("inductor")
        compiled.run(model, inputs)
        check = first_diverging_kernel(compiled, model, inputs, Tolerance(floor=torch.float32))
    assert check.first is None and check.checked > 0, check
    assert check.decomposed is None, check
    held = _group_outputs(compiled, compiled.compiled.lowered[0][0])  # the pairing is not empty
    assert {"gelu", "gelu_1", "native_layer_norm_backward", "addmm"} <= set(held), held


def test_a_pattern_replacement_holds_the_value_of_its_last_op_only():
    # Inductor's mm + add -> addmm: provenance derives addmm from both, but it holds
    # the add's value; pairing it with the mm would call a correct compile wrong
    def traced_fn(a, b, c):
        return torch.relu(torch.mm(a, b) + c)

    def post_fn(a, b, c):
        return torch.relu(torch.addmm(c, a, b))

    source = torch.fx.symbolic_trace(traced_fn)
    post = torch.fx.symbolic_trace(post_fn)
    names = {n.name for n in source.graph.nodes}
    assert {"mm", "add", "relu"} <= names, names
    prov = {"postToPre": {"addmm": ["mm", "add"], "relu": ["relu"]}}
    compiled = SimpleNamespace(source=SimpleNamespace(graph=source.graph),
                               compiled=SimpleNamespace(provenance=prov))
    assert _group_outputs(compiled, post) == {"add": ["addmm"], "relu": ["relu"]}
    args = [torch.randn(3, 4), torch.randn(4, 5), torch.randn(5)]
    values = {}
    for graph, out in ((source, values.setdefault("traced", {})),
                       (post, values.setdefault("post", {}))):
        rec = ValueRecorder(graph)
        rec.run(*args)
        out.update(rec.values)
    tol = Tolerance(floor=torch.float32)
    assert first_decomposed_divergence(compiled, post, values["post"], values["traced"],
                                       tol) is None
    wrong = {**values["post"], "relu": values["post"]["relu"] * 1.01}
    found = first_decomposed_divergence(compiled, post, wrong, values["traced"], tol)
    assert found is not None and (found.node, found.post_node) == ("relu", "relu"), found

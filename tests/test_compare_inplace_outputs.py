"""compare() on modules that fill their output in place (issue 41, item 3).

RecurrentGemma's RG-LRU writes its output slice by slice into a tensor it
created as zeros (``out = zeros_like(h); out[:, t] = ...``). make_fx records
the zeros as the module's output node and the writes as in-place ops on views
of it; compare used to read that node as produced (zeros), call a bit-exact
graph a MISMATCH, and blame that module for a bug planted elsewhere. The
reference is eager: the value a forward hook sees when the module returns.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab import meta as _meta
from jointlab.analysis.compare.capture import capture_eager, probe_pairs, settle_points
from jointlab.analysis.step.runner import NodeRunner
from tests.util import eager_step

aten = torch.ops.aten
MODES = ["make_fx", "aot"]


class Scan(nn.Module):
    """The issue's repro: zeros, then one slice written per step."""

    def forward(self, x):
        out = torch.zeros_like(x)
        for t in range(x.shape[1]):
            out[:, t] = x[:, t] * 2
        return out


class Recurrence(nn.Module):
    """An RG-LRU-like scan: a gated linear recurrence written into zeros step by step."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.gate = nn.Linear(d, d)
        self.log_a = nn.Parameter(torch.rand(d))

    def forward(self, x):
        a = torch.sigmoid(self.log_a) ** (1 + torch.sigmoid(self.gate(x)))
        h = torch.zeros_like(x[:, 0])
        out = torch.zeros_like(x)
        for t in range(x.shape[1]):
            h = a[:, t] * h + torch.sqrt(1 - a[:, t] ** 2) * x[:, t]
            out[:, t] = h
        return out


class Block(nn.Module):
    """The recurrence followed by more ops: a norm, a gated projection, a residual."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.rec = Recurrence(d)
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        y = self.rec(self.inp(x))
        return x + self.out(self.norm(y) * F.gelu(x))


def _loss(m, x, y):
    return F.mse_loss(m(x), y)


def _scan_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Scan(), nn.Linear(8, 8))
    return model, {"x": torch.randn(2, 4, 8), "y": torch.randn(2, 4, 8)}


def _block_model():
    torch.manual_seed(1)
    model = nn.Sequential(Block(8), Block(8))
    return model, {"x": torch.randn(2, 5, 8), "y": torch.randn(2, 5, 8)}


def _assert_run_is_eager(joint, model, inputs):
    """The graph's own run equals eager autograd bit for bit (what compare must agree with)."""
    out = joint.run(model, inputs)
    loss, grads, _ = eager_step(model, _loss, inputs, seed=0)
    assert torch.equal(out.loss, loss)
    assert all(torch.equal(out.grads[n], grads[n]) for n in grads)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("make", [_scan_model, _block_model], ids=["scan", "rg_lru"])
def test_output_filled_in_place_is_bit_exact(make, mode):
    model, inputs = make()
    joint = jl.trace(model, _loss, inputs, mode=mode)
    _assert_run_is_eager(joint, model, inputs)
    c = jl.compare(joint, model, inputs)
    assert c.ok and c.verdict == "bit-exact" and c.first_divergence is None, c.first_divergence
    assert not c.unchecked
    settled = [n for n in joint.graph.nodes if _meta.info(n).get("probe_settled")]
    assert bool(settled) == (mode == "make_fx")  # AOT's functional graph writes nothing back


def _scan_keys(make, fqn):
    model, inputs = make()
    joint = jl.trace(model, _loss, inputs)
    eager = capture_eager(model, _loss, inputs, joint.param_names, seed=0)
    probes, unpaired = probe_pairs(joint.graph, eager)
    return model, inputs, joint, eager, [p for p in probes if p.module == fqn], unpaired


@pytest.mark.parametrize("make, fqn", [(_scan_model, "1"), (_block_model, "0.rec"),
                                       (_block_model, "1.rec")])
def test_filled_output_is_read_as_returned_and_its_gradient_as_produced(make, fqn):
    model, inputs, joint, eager, probes, unpaired = _scan_keys(make, fqn)
    assert not unpaired
    out = next(p for p in probes if p.what == "module output")
    grad = next(p for p in probes if p.what == "output gradient")
    # the output node is the zeros; the last slice write settles it
    assert out.node.target == aten.zeros_like.default
    assert out.after is not None and out.after.target == aten.copy_.default
    assert [fqn, 0, 0] in _meta.info(out.after).get("probe_settled", [])
    assert bool((eager.outputs[(fqn, 0, 0)] != 0).all())  # zeros would not pass
    keep = {p.node.name for p in probes}
    runner = NodeRunner(joint, model, inputs, seed=0, keep=keep, settle=settle_points(probes))
    runner.advance(len(runner.nodes))
    assert torch.equal(runner.lookup(out.node), eager.outputs[(fqn, 0, 0)])
    assert torch.equal(runner.lookup(grad.node), eager.output_grads[(fqn, 0, 0)])
    # stepping node by node reads the same values as the whole run
    stepped = NodeRunner(joint, model, inputs, seed=0, keep=keep, settle=settle_points(probes))
    while not stepped.done:
        stepped.step_node()
    assert torch.equal(stepped.lookup(out.node), eager.outputs[(fqn, 0, 0)])


class LateWrite(nn.Module):
    """A view of the output taken first, written only after many other ops."""

    def forward(self, x):
        out = torch.zeros_like(x)
        tail = out[:, -1]
        h = x[:, 0]
        for t in range(x.shape[1]):
            h = torch.tanh(h * 0.5 + x[:, t])
        tail.copy_(h * 3)
        return out


def test_runner_stopped_between_the_output_and_its_last_write_reads_it_as_returned():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(8, 8), LateWrite(), nn.Linear(8, 8))
    inputs = {"x": torch.randn(2, 4, 8), "y": torch.randn(2, 4, 8)}
    joint = jl.trace(model, _loss, inputs)
    eager = capture_eager(model, _loss, inputs, joint.param_names, seed=0)
    probes, _ = probe_pairs(joint.graph, eager)
    out = next(p for p in probes if p.module == "1" and p.what == "module output")
    nodes = list(joint.graph.nodes)
    write = nodes.index(out.after)
    last_use = max(i for u in out.node.users if (i := nodes.index(u)) < write)
    assert write - last_use > 16  # the write runs in a segment the output is no input of
    keep = {p.node.name for p in probes}
    runner = NodeRunner(joint, model, inputs, seed=0, keep=keep, settle=settle_points(probes))
    runner.advance(last_use + 1)
    runner.advance(write + 1)
    assert torch.equal(runner.lookup(out.node), eager.outputs[("1", 0, 0)])
    runner.advance(len(runner.nodes))
    assert torch.equal(runner.lookup(out.node), eager.outputs[("1", 0, 0)])
    assert jl.compare(joint, model, inputs).verdict == "bit-exact"


def test_parent_writing_a_child_output_reads_neither_as_the_other():
    """One node, two returns: the child's output read as the child returned it, never later."""

    class Parent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scan = Scan()

        def forward(self, x):
            y = self.scan(x)
            y[:, 0] = y[:, 0] + 1  # written after the child returned
            return y

    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(8, 8), Parent(), nn.Linear(8, 8))
    inputs = {"x": torch.randn(2, 4, 8), "y": torch.randn(2, 4, 8)}
    joint = jl.trace(model, _loss, inputs)
    c = jl.compare(joint, model, inputs)
    assert c.ok and c.verdict == "bit-exact", c.first_divergence
    assert c.unchecked == ("1",)  # the parent's return is that node at another point: said so


def _scaled(joint, node, factor):
    """Rewire every user of ``node`` to ``node * factor`` (annotated like ``node``)."""
    with joint.graph.inserting_after(node):
        new = joint.graph.call_function(aten.mul.Tensor, (node, factor))
    node.replace_all_uses_with(new, delete_user_cb=lambda u: u is not new)
    new.meta["jointlab"] = dict(_meta.info(node))
    new.meta["val"] = node.meta.get("val")
    joint.recompute()


def _grad_node(joint, name):
    return next(n for n in joint.graph.nodes if _meta.info(n).get("grad_of") == name)


@pytest.mark.parametrize("where", ["weight gradient", "forward"])
def test_bug_elsewhere_is_not_blamed_on_the_filling_module(where):
    model, inputs = _scan_model()
    joint = jl.trace(model, _loss, inputs)
    if where == "weight gradient":  # the check: last Linear's weight gradient x1.001
        target = _grad_node(joint, "2.weight").args[0]
    else:  # the last Linear's matmul, after Scan in the forward
        target = next(n for n in joint.graph.nodes if n.target == aten.addmm.default
                      and _meta.module(n) == "2")
    _scaled(joint, target, 1.001)
    c = jl.compare(joint, model, inputs)
    assert not c.ok and c.verdict == "MISMATCH"
    d = c.first_divergence
    assert d.module == "2", d
    assert d.phase == ("backward" if where == "weight gradient" else "forward")


def test_bug_inside_the_filling_module_is_found():
    model, inputs = _scan_model()
    joint = jl.trace(model, _loss, inputs)
    muls = [n for n in joint.graph.nodes if n.target == aten.mul.Tensor
            and _meta.module(n) == "1" and _meta.info(n).get("phase") == "forward"]
    muls[-1].args = (muls[-1].args[0], 2.002)  # the last step's x[:, t] * 2
    joint.recompute()
    c = jl.compare(joint, model, inputs)
    assert not c.ok and c.first_divergence.module == "1"
    assert c.first_divergence.what == "module output"


def test_settled_probes_survive_save_and_load(tmp_path):
    model, inputs = _block_model()
    joint = jl.trace(model, _loss, inputs)
    path = tmp_path / "g.jlg"
    joint.save(str(path))
    loaded = jl.load(str(path))
    settled = {n.name: _meta.info(n).get("probe_settled") for n in loaded.graph.nodes
               if _meta.info(n).get("probe_settled")}
    assert len(settled) == 2
    assert jl.compare(loaded, model, inputs, train_fn=_loss).verdict == "bit-exact"

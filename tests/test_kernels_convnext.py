"""Layout copies in a ConvNeXt-style CNN are shown as copies, credited with no node.

Inductor's layout optimisation runs the convolutions channels-last and adds
copies of the input and the conv weights (and of a conv output) into that
layout. Each copy carries the origins of the op that needed it, so Inductor's
raw provenance credited the copy kernel with its consumers' fused chain. The
reference for "it only copies" is the copy kernel's own output, read while
stepping the compiled code: every buffer it writes equals, value for value,
the tensor the kernel table says it copies. One small compile for the module.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl
from jointlab.analysis import kernels as K
from tests.util import one_thread


class _LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class _Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = _LayerNorm2d(c)
        self.pw1, self.pw2 = nn.Conv2d(c, 4 * c, 1), nn.Conv2d(4 * c, c, 1)

    def forward(self, x):
        return x + self.pw2(F.gelu(self.pw1(self.norm(self.dw(x)))))


class _ConvNeXt(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.stem, self.block, self.head = nn.Conv2d(3, c, 2, stride=2), _Block(c), nn.Linear(c, 4)

    def forward(self, x):
        return self.head(self.block(self.stem(x)).mean((2, 3)))


def _step(m, x, y):
    return F.cross_entropy(m(x), y)


@pytest.fixture(scope="module")
def convnext():
    torch.manual_seed(0)
    model = _ConvNeXt()
    inputs = {"x": torch.randn(2, 3, 16, 16), "y": torch.tensor([0, 3])}
    with one_thread():
        compiled = jl.trace(model, _step, inputs).compile("inductor")
        compiled.run(model, inputs)
        yield model, inputs, compiled


def test_layout_copy_kernels_are_copies_credited_with_no_node(convnext):
    model, inputs, compiled = convnext
    table = K.kernel_table(compiled)
    copies = table[table["kind"] == "copy"]
    assert len(copies) >= 1, table[["kind", "nodes"]]
    assert all(n == () and m == () for n, m in zip(copies["nodes"], copies["modules"]))
    first = copies.index[0]
    assert set(copies.loc[first, "copies"]) == {"x", "stem.weight"}, copies["copies"]
    # Inductor's own provenance credited the copy with its consumers' nodes
    assert compiled.compiled.provenance["cppCodeToPost"][first], "nothing was fixed"
    # the independent check: what the kernel wrote is the values it is said to copy
    stepper = jl.Stepper(compiled, model, inputs)
    while stepper.current != first:
        stepper.step()
    stepper.step()
    sources = {"x": inputs["x"], "stem.weight": model.stem.weight.detach()}
    writes = K.kernel_writes(compiled)[first]
    assert writes and all(any(torch.equal(stepper.buffer(b), s) for s in sources.values())
                          for b in writes)
    # the copied-for nodes are still covered, by the kernels that compute them
    assert K.kernel_coverage(compiled).share == 1.0


def test_a_module_breakpoint_stops_at_the_kernel_that_computes_it(convnext):
    model, inputs, compiled = convnext
    stepper = jl.Stepper(compiled, model, inputs)
    stepper.add_breakpoint(module="block.norm")
    stepper.run()
    # the first kernel that writes a LayerNorm value, not the copy made for the conv before it
    kind = K.kernel_table(compiled).loc[stepper.current, "kind"]
    assert kind == "fused reduction" and "native_layer_norm" in stepper.current, stepper.current

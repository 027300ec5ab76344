"""The root module's own ops are spelled one way, ``(root)``, in every view and message."""

from __future__ import annotations

import re

import torch
import torch.nn as nn
import torch.nn.functional as F

import jointlab as jl
from jointlab.meta import ROOT_LABEL, module_label, node_error
from jointlab.viz.module_table import module_summary_html

OTHER_SPELLINGS = re.compile(r"<root>|\(model\)")


class RootOps(nn.Module):
    """A model whose root runs ops of its own (the scale and the tanh), beside a child."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return (self.fc(x) * self.w).tanh()


def _train_fn(model, x, y):
    return F.mse_loss(model(x), y)


def test_every_view_spells_the_root_module_the_same_way(tmp_path):
    torch.manual_seed(0)
    model, inputs = RootOps(), {"x": torch.randn(5, 3), "y": torch.randn(5, 4)}
    joint = jl.trace(model, _train_fn, inputs)
    root_node = next(n for n in joint.graph.nodes if jl.meta.module(n) == "" and
                     jl.meta.phase(n) == "forward")
    svg = (tmp_path / "g.svg")
    jl.export_figure(joint, svg)
    script = jl.dag_view(joint).html()
    payload = script.split('type="application/json"')[1].split("</script>")[0]
    texts = {
        "export_figure": svg.read_text(),
        "dag_view": payload,
        "module_summary": module_summary_html(jl.module_summary(joint, model, inputs)),
        "summary": joint.summary(by="module")._repr_html_(),
        "node error": str(node_error(root_node, RuntimeError("boom"))),
    }
    assert '|| "(root)"' in script and "<root>" not in script  # G.name[gid] || "(root)"
    assert module_label("") == ROOT_LABEL == "(root)" and module_label("fc") == "fc"
    for view, text in texts.items():
        assert ROOT_LABEL in text or view == "dag_view", view  # its script names it, below
        assert not OTHER_SPELLINGS.search(text), (view, OTHER_SPELLINGS.findall(text))

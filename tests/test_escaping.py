"""Every HTML jointlab writes or displays treats model-derived names as data.

A submodule named ``</script><script>alert(1)</script>`` (and a module class
with that name) must never reach HTML unescaped: the card, the DAG hover
labels and the report are checked; each check also proves the name did reach
the output in escaped form, so it cannot pass by omission. plotly is a dev
dependency: without it these tests fail, they do not skip.
"""

from __future__ import annotations

import html

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jointlab as jl

EVIL = "</script><script>alert(1)</script>"
ESCAPED = ("&lt;/script&gt;&lt;script&gt;alert(1)", "&lt;\\u002fscript&gt;&lt;script&gt;alert(1)",
           "\\u003c/script\\u003e\\u003cscript\\u003e", "\\u003c\\u002fscript\\u003e")

EvilType = type(EVIL, (nn.Linear,), {})


class Victim(nn.Module):
    def __init__(self):
        super().__init__()
        self.add_module(EVIL, EvilType(4, 4))
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(F.relu(getattr(self, EVIL)(x)))


@pytest.fixture(scope="module")
def traced():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Victim()
    inputs = {"x": torch.randn(3, 4)}
    joint = jl.trace(model, lambda m, x: m(x).pow(2).mean(), inputs)
    assert any(n.meta["jointlab"].get("module") == EVIL for n in joint.graph.nodes)
    return model, inputs, joint


def assert_safe(text: str, must_mention: bool = True) -> None:
    assert "<script>alert(1)" not in text
    if must_mention:
        assert any(e in text for e in ESCAPED), "the module name never reached the output"


def test_summary_card(traced):
    _, _, joint = traced
    html = joint._repr_html_()
    assert "<script>alert(1)" not in html  # the card holds only counts, no names today


def test_dag_labels(traced):
    _, _, joint = traced
    assert any(n.meta["jointlab"].get("module") == EVIL for n in joint.graph.nodes)
    assert_safe(jl.dag_view(joint).html())


def test_report(traced, tmp_path):
    model, inputs, joint = traced
    path = jl.report(joint, tmp_path / "r.html", title=EVIL)
    assert_safe(path.read_text(encoding="utf-8"))


def test_memory_and_lifetime_hover(traced):
    model, inputs, joint = traced
    profile = joint.memory()
    assert (profile.lifetimes["module"] == EVIL).any()
    for fig in (jl.plot_memory(profile), jl.plot_lifetimes(profile)):
        assert_safe(fig.to_json())
        assert_safe(fig.to_html(include_plotlyjs=False))
        # hover labels render HTML: the values they show must be escaped text
        shown = {str(v) for tr in fig.data if tr.customdata is not None
                 for row in tr.customdata for v in row}
        assert EVIL not in shown and html.escape(EVIL) in shown
    for view in (jl.plot_memory(profile), jl.plot_lifetimes(profile)):  # the notebook's SVG
        assert_safe(view._repr_mimebundle_()["text/html"])

"""Renderers register themselves: results ask jointlab.display for a view by kind (#44 item 3)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import jointlab as jl
from jointlab import display
from jointlab.errors import RendererMissingError


@pytest.fixture
def joint():
    return jl.trace(nn.Linear(3, 1), lambda m, x: m(x).sum(), {"x": torch.randn(2, 3)})


def test_a_result_is_drawn_by_whatever_is_registered_for_its_kind(joint, monkeypatch):
    seen = []
    monkeypatch.setitem(display._RENDERERS, "card",
                        lambda obj, kind: seen.append((kind, obj)) or "<b>mine</b>")
    monkeypatch.setitem(display._RENDERERS, "frame", lambda obj: f"<i>{len(obj)} rows</i>")
    assert joint._repr_html_() == "<b>mine</b>" and seen == [("graph", joint)]
    assert joint.nodes._repr_html_() == f"<i>{len(joint.graph.nodes)} rows</i>"


def test_the_registered_renderers_draw_the_real_views(joint):
    assert "Linear" in joint._repr_html_() or "nodes" in joint._repr_html_()
    html = joint.nodes._repr_html_()
    assert "<table" in html and "addmm" in html


def test_nothing_registered_is_a_clear_error(joint, monkeypatch):
    monkeypatch.delitem(display._RENDERERS, "card")
    with pytest.raises(RendererMissingError, match="'card'.*import jointlab"):
        joint._repr_html_()
    stepper = jl.Stepper(joint, nn.Linear(3, 1), {"x": torch.randn(2, 3)})
    monkeypatch.delitem(display._RENDERERS, "stepper_widget")
    with pytest.raises(RendererMissingError, match="stepper_widget"):
        stepper.widget()

"""What printed summaries show: the root module by class, one phase order in both modes."""

from __future__ import annotations

import re

import pytest

from jointlab.meta import PHASES
from tests.util import traced_fixture, traced_real


def test_root_row_shows_its_class_and_keeps_the_fqn():
    _, model, _, joint = traced_real("hf_gpt2", "make_fx")
    s = joint.summary()
    assert "" in s.index  # the data keeps the FQN
    assert s.loc[""].sum() > 0
    label = f"(root) {type(model).__name__}"
    assert label == "(root) GPT2LMHeadModel"
    assert re.search(rf"^{re.escape(label)}\s+\d", repr(s), re.M), repr(s)
    assert f"<th>{label}</th>" in s._repr_html_()
    assert label in repr(s.loc[["", "transformer.wpe"]])  # slices keep the label
    # other groupings are untouched
    assert "(root)" not in repr(joint.summary(by="op"))


@pytest.mark.parametrize("name", ["tiny_lm", "cnn_bn"])
def test_repr_orders_phases_the_same_in_both_modes(name):
    shown = {}
    for mode in ("make_fx", "aot"):
        _, _, joint = traced_fixture(name, mode)
        shown[mode] = re.findall(r"(\w+)=\d+", repr(joint).split(":", 1)[1])
    assert shown["make_fx"] == shown["aot"]
    assert shown["aot"] == [p for p in PHASES if p in shown["aot"]]

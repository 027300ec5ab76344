"""The stepper names what it steps as a user knows it: a short repr, parameter FQNs.

On a tiny HF GPT-2 (random init): the repr is one line naming the model class, the
position, the node, its phase and module; the current-node card and the DAG detail
panel name a node's parameter inputs by FQN (``transformer.h.0.attn.c_attn.weight``),
never by placeholder (``arg4_1``). The reference for each name is the model itself:
the tensor the stepper holds for the named placeholder *is* that parameter's value.
"""

from __future__ import annotations

import re

import pytest
import torch

import jointlab as jl
from jointlab.widgets._stepper_html import node_card

PLACEHOLDER = re.compile(r"\barg\d+_\d+\b")


@pytest.fixture(scope="module")
def gpt2():
    from tests.fixtures import real

    f = real.get("hf_gpt2")
    model, inputs = f.make_model(), f.make_inputs(2)
    return jl.trace(model, f.train_fn, inputs), model, inputs


def _param(model, fqn: str) -> torch.Tensor:
    return dict(model.named_parameters(remove_duplicate=False))[fqn]


def test_repr_is_one_short_line_naming_position_node_phase_module(gpt2):
    joint, model, inputs = gpt2
    s = jl.Stepper(joint, model, inputs, device="cpu", seed=0)
    first = repr(s)
    fqn = re.search(r"'arg0_1' = (\S+) \(param", first).group(1)
    s.step()
    assert torch.equal(s.value("arg0_1"), _param(model, fqn).detach())
    s.add_breakpoint(module="transformer.h.0.attn.c_attn")
    s.add_breakpoint(op="aten.addmm")
    s.run()
    text = repr(s)
    row = joint.nodes.loc[s.current.name]
    assert text == (f"<Stepper {type(model).__name__!r} graph: at node {s.position}/"
                    f"{len(joint.nodes)} {s.current.name!r} ({row.phase}, {row.module}), "
                    f"breakpoints: 2>")
    assert "\n" not in text and len(text) < 140 and "%" not in text and "call_function" not in text
    s.clear_breakpoints()
    s.run()
    assert repr(s) == (f"<Stepper {type(model).__name__!r} graph: done ({len(joint.nodes)}/"
                       f"{len(joint.nodes)} nodes run), breakpoints: 0>")


def test_card_names_parameter_inputs_by_fqn(gpt2):
    joint, model, inputs = gpt2
    s = jl.Stepper(joint, model, inputs, device="cpu", seed=0, keep="all")
    s.add_breakpoint(op="aten.addmm")
    s.run()
    card = node_card(s.current, {})
    named = re.findall(r"<code title='graph node (arg\d+_\d+)'>([^<]+)</code>", card)
    params = [a for a in s.current.all_input_nodes if a.op == "placeholder"]
    assert len(named) == len(params) == 2  # Conv1D's addmm: its bias and its weight
    for graph_name, fqn in named:
        assert torch.equal(s.value(graph_name), _param(model, fqn).detach()), fqn
    assert {fqn for _, fqn in named} == {"transformer.h.0.attn.c_attn.bias",
                                         "transformer.h.0.attn.c_attn.weight"}
    assert not PLACEHOLDER.search(re.sub(r"title='[^']*'", "", card))


def test_dag_detail_panel_names_parameter_inputs_by_fqn(gpt2, tmp_path):
    from jointlab.viz.dagview import dag_view
    from tests.chromium import browser, open_dag_page, save_screenshot

    joint, _, _ = gpt2
    node = next(n for n in joint.graph.nodes if jl.meta.op_name(n) == "addmm")
    params = {a.name for a in node.all_input_nodes if a.op == "placeholder"}
    path = dag_view(joint).write_html(tmp_path / "dag.html")
    with browser() as b:
        page, errors = open_dag_page(b, path)
        page.evaluate(f"""() => {{ const v = document.querySelector('.jl-dag').jlView;
            v.select(v.P.nodes.name.indexOf({node.name!r}), true); }}""")
        links = page.evaluate("""() => [...document.querySelectorAll('.jl-detail tr')]
            .filter(tr => tr.firstChild.textContent === 'inputs')
            .flatMap(tr => [...tr.querySelectorAll('.jl-link')]
                     .map(a => [a.title, a.textContent]))""")
        save_screenshot(page, tmp_path, "detail_panel_fqn")
    assert errors.errors == []
    shown = {title: text for title, text in links}
    assert set(shown) >= params
    by_node = {n.name: fqn for fqn, n in joint.params().items()}  # descriptors' own lookup
    assert {name: shown[name] for name in params} == {name: by_node[name] for name in params}
    assert not any(PLACEHOLDER.fullmatch(text) for text in shown.values()), shown

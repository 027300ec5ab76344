"""Every notebook in notebooks/ runs top to bottom in a fresh kernel with zero errors.

The kernel is the ``python3`` kernelspec as jupyter_client resolves it from this
interpreter; a probe cell appended to each (in-memory) notebook checks that the
kernel really runs this virtual environment's Python, so a stray system kernel
cannot make the test pass on the wrong packages. Each notebook's run time is
printed (visible with ``pytest -s`` or in the report's captured output).
"""

from __future__ import annotations

import html
import json
import pathlib
import re
import sys
import time

import pytest
import torch

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
EXPECTED = ["01_quickstart", "02_memory", "03_debugging", "04_modes_and_shapes",
            "05_teaching_autodiff", "06_distributed", "07_compiled"]
PROBE = "import json, sys; print('JL-PROBE ' + json.dumps([sys.executable, sys.prefix]))"


def test_all_notebooks_present_and_clean():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), \
            f"{path.name} is committed with outputs"
        first = nb.cells[0]
        assert first.cell_type == "code", f"{path.name} must start with the setup cell"
        assert "google.colab" in first.source and '"-m", "pip", "install"' in first.source


#: Numbers the prose of a notebook states, and the text its executed outputs must show for
#: them: (a phrase of the markdown, [strings of the outputs]). A rerun that computes other
#: numbers, or prose edited away from them, fails the notebook's test.
#: make_fx's name for autograd's reference to a saved tensor: ``detach`` up to torch 2.13,
#: ``alias`` from 2.14 (05's prose names the 2.13 spelling only, its outputs either).
SAVED_REF = "alias" if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 14) \
    else "detach"
CLAIMS = {
    "05_teaching_autodiff": [
        ("born at step 8 and last\nread at step 24",
         ["tanh act aten.tanh (256, 512) 512 KiB 8 24"]),
        ("read by\n`mse_loss_backward` at step 14",
         ["addmm_1 fc2 aten.addmm (256, 1) 1 KiB 11 14"]),
        ("The plot marks the predicted peak, 1.52 MiB at tanh_backward",
         ["peak 1.52 MiB at tanh_backward"]),  # the plot's own label
        ("1 → 0.5743 → 0.1514 → 0.1120", ["ones_like → mse_loss_backward dL/dL = 1 () 1.0000",
                                          "(5, 1) 0.5743", "(5, 4) 0.1514", "(5, 4) 0.1120"]),
        ("into $\\bar W_1$ (0.2135)", ["fc1.weight (4, 3) 0.2135"]),
        ("`threshold_backward` replaces `tanh_backward`, and it reads the ReLU's *output*",
         [f"threshold_backward reads: ['mm', '{SAVED_REF}_1']", "relu act aten.relu (5, 4)"]),
        ("Two new backward ops: an `mm` computing", [
            "new backward ops: {'aten.t': 1, 'aten.mm': 1}",
            "x's gradient: mm_2 = mm(tanh_backward, t_6), shape (5, 3)",
            "x gradient, max |graph - eager|: 0.0"]),
        ("2 + 2 + 1 = **5** backward `mm` nodes", ["backward mm, one hidden layer: 3",
                                                   "backward mm, two hidden layers: 5"]),
        ("Backward FLOPs\nstay at 2.15 GFLOP and saved bytes at 18 MiB",
         ["first Linear checkpointed forward 41 1.08 GFLOP 18 MiB backward 128 2.15 GFLOP",
          "recomputed in blocks.0: ['aten.t', 'aten.detach', 'aten.detach', "
          "'jointlab.rng_set_state']"]),
        ("(`getitem_1`, the log-sum-exp of the scores: 6 floats)",
         ["getitem_1 getitem (1, 1, 6) 24 B",
          "_scaled_dot_product_flash_attention_for_cpu (root) "]),
        ("drop from 18 MiB to 10 MiB", ["plain forward 37 1.08 GFLOP 18 MiB",
                                        # the node count is not claimed (torch 2.11: 41)
                                        "1.08 GFLOP 10 MiB backward 172"]),
        ("grow from 2.15 GFLOP to 3.23 GFLOP",
         ["backward 96 2.15 GFLOP", "backward 172 3.23 GFLOP"]),
        ("falls from 22.6 MiB to 16.6 MiB", ["peak 22.6 MiB", "peak 16.6 MiB"]),
        ("The same loss and the same gradients, bit for bit",
         ["same loss: True", "largest gradient difference: 0.0"]),
        ("(144 B, 2,304 B, 36,864 B)", ["6 1104 144 0.13", "24 6144 2304 0.38",
                                        "96 52224 36864 0.71"]),
        ("`_softmax` has `_softmax_backward_data`",
         [f"_softmax (root) {SAVED_REF}_1, _softmax_backward_data"]),
        ("`tanh_backward` reads `mm`", [f"tanh_backward tanh_backward tanh mm, {SAVED_REF}_1"]),
        ("forward 7 / backward 18", ["forward 7 · backward 18",  # the card, the export's header
                                     "forward (7 ops) left→right, backward (18 ops)"]),
    ],
    "06_distributed": [  # the plan check on the planted plan bug, then on the fixed plan
        ("(`matches_eager` is True on both)", ["matches_eager: {0: True, 1: True}"]),
        ("names `layers.1.attn.wkv_a.weight` in module `layers.1.attn.wkv_a`, with\n"
         "relative error 0.145 on both ranks",
         ["DIFFERS from one device", "layers.1.attn.wkv_a.weight (module "
          "'layers.1.attn.wkv_a'): relative error 0.145, max abs 0.00504, on ranks 0, 1"]),
        ("13 of the 23 gradients differ", ["23 gathered gradients (13 differ)"]),
        ("The fixed plan matches one device, all 23 gradients and both losses",
         ["matches one device 23 gathered gradients (0 differ) and 2 ranks' losses"]),
    ],
}


def _output_text(nb) -> str:
    """Every output as plain text, HTML tags and styles removed, whitespace collapsed to spaces."""
    parts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            if "text/html" in data:
                text = re.sub(r"<style.*?</style>", " ", "".join(data["text/html"]), flags=re.S)
                parts.append(html.unescape(re.sub(r"<[^>]+>", " ", text)))
            elif "image/svg+xml" in data:  # an exported figure: its text
                svg = "".join(data["image/svg+xml"])
                parts.append(html.unescape(re.sub(r"<[^>]+>", " ", svg)))
            else:
                parts.append("".join(o.get("text") or data.get("text/plain") or ""))
    return re.sub(r"\s+", " ", " ".join(parts))


def _unmet_claims(nb, name: str) -> list[str]:
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    shown = _output_text(nb)
    bad = []
    for phrase, outputs in CLAIMS.get(name, []):
        if phrase not in prose:
            bad.append(f"prose no longer says {phrase!r}")
        bad += [f"{phrase!r}: outputs do not show {o!r}" for o in outputs if o not in shown]
    return bad


#: A warning class name as Python prints it (``UserWarning``, ``SideEffectWarning``).
WARNING = re.compile(r"\b[A-Z]\w*Warning\b")


def _said_before(nb, index: int) -> str:
    """The cell's own source and the markdown cells just above it (what explains its output)."""
    said = [nb.cells[index].source]
    for cell in reversed(nb.cells[:index]):
        if cell.cell_type != "markdown":
            break
        said.append(cell.source)
    return "\n".join(said)


def _unexplained_warnings(nb) -> list[str]:
    """Warnings and stderr text a student would see that neither the cell nor its markdown
    explains: a warning is explained where its class is named (a comment, the prose above),
    other stderr text where its first line is quoted."""
    bad = []
    for i, cell in enumerate(nb.cells):
        for o in cell.get("outputs", []):
            text = "".join(o.get("text") or "") if o.get("output_type") == "stream" else ""
            if not text or (o.get("name") != "stderr" and not WARNING.search(text)):
                continue
            said = _said_before(nb, i)
            names = set(WARNING.findall(text))
            first = text.strip().splitlines()[0]
            if not (names and all(n in said for n in names)) and first not in said:
                bad.append(f"cell {i}: {text.strip()[:200]}")
    return bad


def test_unexplained_warnings_are_found_and_explained_ones_allowed():
    stream = nbformat.v4.new_output
    warned = stream("stream", name="stderr", text="/x.py:3: UserWarning: Profiler clears events\n")
    noted = stream("stream", name="stderr", text="No CUDA runtime is found, using CUDA_HOME=/x\n")
    printed = stream("stream", name="stdout", text="jointlab.SideEffectWarning: self.calls\n")
    quiet = stream("stream", name="stdout", text="peak 1.52 MiB\n")

    def nb(*cells):
        return nbformat.v4.new_notebook(cells=list(cells))

    code = nbformat.v4.new_code_cell
    md = nbformat.v4.new_markdown_cell
    assert _unexplained_warnings(nb(code("f()", outputs=[quiet]))) == []
    for out in (warned, noted, printed):
        assert len(_unexplained_warnings(nb(code("f()", outputs=[out])))) == 1
    shown = code("f()  # shows a UserWarning: ...", outputs=[warned])
    assert _unexplained_warnings(nb(shown)) == []
    assert _unexplained_warnings(nb(md("Tracing warns `SideEffectWarning` here."),
                                    code("f()", outputs=[printed]))) == []
    assert _unexplained_warnings(nb(md("It prints `No CUDA runtime is found, using CUDA_HOME=/x`"),
                                    code("f()", outputs=[noted]))) == []
    assert len(_unexplained_warnings(nb(md("about SideEffectWarning"), code("g()"),
                                        code("f()", outputs=[printed])))) == 1  # not just above


def _errors(nb) -> list[str]:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                out.append(f"{o['ename']}: {o['evalue']}")
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_without_errors(path, tmp_path, capsys):
    if path.stem == "06_distributed":  # jl.fake_world refuses before torch 2.13
        import torch

        from jointlab.torch_compat import release
        from jointlab.torch_compat.distributed import DISTRIBUTED_SINCE

        if release(torch.__version__) < DISTRIBUTED_SINCE:
            pytest.skip("06_distributed uses jl.fake_world, which needs torch 2.13 or newer "
                        f"(refused with UnsupportedTorchError); this is torch {torch.__version__}")
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", allow_errors=False,
        resources={"metadata": {"path": str(tmp_path)}})
    t0 = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - t0
    with capsys.disabled():
        print(f"\n[notebook] {path.name}: {elapsed:.1f} s")
    assert _errors(nb) == []
    # the kernel ran in tmp_path as Jupyter runs it in notebooks/: nothing may land there
    # (05 wrote backprop_mlp.svg beside itself; exports go to a temporary folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "the notebook wrote into its folder"
    assert _unmet_claims(nb, path.stem) == []
    assert _unexplained_warnings(nb) == []
    probe = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    exe, prefix = json.loads(probe.split("JL-PROBE ", 1)[1])
    assert pathlib.Path(prefix).resolve() == pathlib.Path(sys.prefix).resolve(), (exe, prefix)
    assert nb.cells[0].outputs == []  # outside Colab/Binder the setup cell does nothing

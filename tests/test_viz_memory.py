"""Memory figures: what they draw matches the profile they are given."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import pytest

import jointlab as jl
from jointlab.analysis.memory.predict import CATEGORIES
from jointlab.viz.memory import downsample, plot_lifetimes, plot_memory
from tests.fixtures import zoo


@pytest.fixture(scope="module")
def profile():
    f = zoo.FIXTURES["tiny_lm"]
    model, inputs = f.make_model(), f.make_inputs(4)
    joint = jl.trace(model, f.train_fn, inputs)
    return joint.memory(model, inputs)


def _trace(fig, name):
    return next(t for t in fig.data if t.name == name)


def test_stacked_categories_sum_to_total_and_measured_overlaid(profile):
    fig = plot_memory(profile)
    stacked = [t for t in fig.data if t.stackgroup == "pred"]
    assert {t.name for t in stacked} <= set(CATEGORIES)
    total = _trace(fig, "predicted total")
    assert np.allclose(sum(np.asarray(t.y) for t in stacked), np.asarray(total.y))
    meas = _trace(fig, "measured (graph values)")
    scale = profile.timeline["total"].max() / max(total.y)
    assert np.isclose(max(meas.y) * scale, profile.measured_peak_bytes)
    # hover carries node, module, op and shape of each step
    row = profile.timeline.iloc[int(np.argmax(total.y))]
    assert list(total.customdata[int(np.argmax(total.y))]) == [
        row["node"], row["module"], row["op"], row["shape"]]


def test_boundary_and_peak_marked(profile):
    fig = plot_memory(profile, measured=False)
    assert not any(t.name and t.name.startswith("measured") for t in fig.data)
    xs = [s.x0 for s in fig.layout.shapes]
    assert profile.boundary_step - 0.5 in xs
    peak = _trace(fig, "peak")
    assert profile.timeline["node"].iloc[peak.x[0]] == profile.peak_node
    assert any(profile.peak_node in a.text for a in fig.layout.annotations)


def _peak_label(fig):
    return next(a for a in fig.layout.annotations if a.text.startswith("peak "))


def test_peak_label_clear_of_the_top_and_the_boundary(profile):
    fig = plot_memory(profile)
    top = fig.layout.yaxis.range[1]
    peak = _trace(fig, "peak")
    label = _peak_label(fig)
    assert (label.x, label.y) == (peak.x[0], peak.y[0])
    # room above the peak for the label (28 px up in a ~300 px plot is < 15% of it)
    assert top >= 1.2 * peak.y[0]
    # the label extends away from the forward|backward line
    boundary = profile.boundary_step - 0.5
    if peak.x[0] >= boundary:
        assert label.xanchor == "left" and label.ax > 0
    else:
        assert label.xanchor == "right" and label.ax < 0
    assert label.bgcolor == "white"


def test_boundary_label_above_the_bands_and_legend_beside_the_plot(profile):
    for fig in (plot_memory(profile), plot_lifetimes(profile, top=10)):
        label = next(a for a in fig.layout.annotations if "backward" in a.text)
        assert label.yref == "paper" and label.y >= 1 and label.yanchor == "bottom"
        assert fig.layout.legend.orientation == "v" and fig.layout.legend.x > 1


def test_lifetime_bars_labelled_by_module_and_op(profile):
    fig = plot_lifetimes(profile, top=30)
    life = profile.lifetimes.set_index("storage")
    ticks = dict(zip(fig.layout.yaxis.tickvals, fig.layout.yaxis.ticktext))
    assert set(ticks) == {y for t in fig.data for y in t.y}
    for storage, text in ticks.items():
        row = life.loc[storage]
        op = (row["filled_by"] or row["op"]).removeprefix("aten.")
        assert text == html.escape(f"{row['module'] or '(root)'} · {op}")  # plotly renders HTML
    assert fig.layout.yaxis.tickfont.size >= 12
    # CPU dropout draws its mask into an empty_like: the label names the draw, not the empty
    masks = life[(life["op"] == "aten.empty_like") & (life["module"] == "drop")]
    assert len(masks) and (masks["filled_by"] == "aten.bernoulli_").all()
    assert "drop · bernoulli_" in ticks.values()
    assert not any(t.endswith("empty_like") for t in ticks.values())


def test_downsampling_keeps_peaks_and_bounds_points():
    rng = np.random.default_rng(0)
    n = 50_000
    tl = pd.DataFrame({"total": rng.integers(0, 10_000, n)})
    tl.loc[31_337, "total"] = 99_999
    small = downsample(tl, 1000)
    assert len(small) <= 1000
    assert small["total"].max() == 99_999
    assert small.index.is_monotonic_increasing
    # every bucket's kept row is that bucket's maximum
    bucket = np.arange(n) * 1000 // n
    assert (small["total"].to_numpy() == tl.groupby(bucket)["total"].max().to_numpy()).all()


def test_long_timelines_are_downsampled_in_the_figure(profile):
    fig = plot_memory(profile, max_points=50)
    assert all(len(t.x) <= 50 for t in fig.data)
    scale = profile.timeline["total"].max() / max(_trace(plot_memory(profile), "predicted total").y)
    assert np.isclose(max(_trace(fig, "predicted total").y) * scale, profile.peak_bytes)
    assert _trace(fig, "peak").x[0] == int(profile.timeline["total"].argmax())


def test_lifetime_gantt_shows_largest_storages(profile):
    fig = plot_lifetimes(profile, top=10)
    shown = {y: (b, x) for t in fig.data if t.type == "bar"
             for y, b, x in zip(t.y, t.base, t.x)}
    assert len(shown) == 10
    life = profile.lifetimes.set_index("storage")
    for name, (base, width) in shown.items():
        assert base == life.loc[name, "first_step"]
        assert base + width - 1 == life.loc[name, "last_step"]
    rest = life.drop(index=list(shown))
    rest = rest[~rest.category.isin(["param", "buffer", "input"])]
    assert rest["bytes"].max() <= life.loc[list(shown), "bytes"].min()
    with_state = plot_lifetimes(profile, top=3, include_state=True)
    names = {y for t in with_state.data for y in t.y}
    assert names & set(life.index[life.category == "param"])


_FIRST_VIEW = """
import sys
from IPython.core.interactiveshell import InteractiveShell
import jointlab as jl
from tests.fixtures import zoo
f = zoo.FIXTURES["tiny_lm"]
model, inputs = f.make_model(), f.make_inputs(4)
prof = jl.trace(model, f.train_fn, inputs).memory(model, inputs)
fmt = InteractiveShell.instance().display_formatter
for view in (jl.plot_memory(prof), jl.plot_lifetimes(prof)):
    data, _ = fmt.format(view)
    assert "<svg" in data["text/html"], list(data)
print("PLOTLY", sorted(m for m in sys.modules if m.split(".")[0] in
                       ("plotly", "nbformat", "jsonschema")))
"""


def test_first_view_imports_no_plotly():
    """The notebook display of both figures is our SVG: plotly's import path is never taken."""
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-c", _FIRST_VIEW], capture_output=True, text=True,
                       timeout=300, cwd=str(root))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "PLOTLY []" in r.stdout


def _hover_data(view):
    import json
    import re

    text = view._repr_mimebundle_()["text/html"]
    raw = re.search(r"<script type='application/json'>(.*?)</script>", text, re.S).group(1)
    return text, json.loads(raw)


def test_hover_rows_read_the_timeline(profile):
    """Each hover row names the step's node and module and its predicted and measured bytes."""
    text, hover = _hover_data(plot_memory(profile))
    tl = profile.timeline
    assert hover["x"] == list(range(len(tl)))  # short timeline: every step
    scale = 1024.0  # tiny_lm peaks in KiB
    assert "live KiB" in text
    for i in (0, int(tl["total"].argmax()), len(tl) - 1):
        row, lines = tl.iloc[i], hover["rows"][i].splitlines()
        assert lines[0] == f"step {i}: {row['node']}"
        assert lines[1] == f"module {row['module'] or '(root)'}"
        assert f"predicted {row['total'] / scale:.3f} KiB" in lines
        assert f"measured {row['measured'] / scale:.3f} KiB" in lines
        for c in CATEGORIES:
            if tl[c].any():
                assert f"{c}: {row[c] / scale:.3f} KiB" in lines


def test_the_plotly_figure_once_built_is_what_is_shown(profile, tmp_path):
    """An edit through a plotly attribute is drawn: the view displays through plotly then."""
    view = plot_memory(profile)
    assert "text/html" in view._repr_mimebundle_()
    view.update_layout(title="my title")
    assert view.figure.layout.title.text == "my title"
    assert "jl-plot" not in str(view._repr_mimebundle_())  # plotly's own bundle now
    svg = jl.export_figure(view, tmp_path / "m.svg").read_text()
    assert "my title" in svg
    assert not hasattr(view, "no_such_attribute")


@pytest.mark.parametrize("peak", [900, 1536, 1.52 * 2**20, 3 * 2**30])
def test_the_plot_reads_in_the_unit_the_cards_use(peak):
    """1.52 MiB is '1.52 MiB' in the plot as on the memory card, not '1556.48 KiB'."""
    from jointlab.units import human_bytes
    from jointlab.viz.memory import _unit

    scale, unit = _unit(peak)
    assert human_bytes(peak) == f"{peak / scale:.3g} {unit}"

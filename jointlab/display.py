"""The one hand-off from a result to its notebook rendering (IPython's ``_repr_html_``).

Data never renders itself: a result's ``_repr_html_`` calls :func:`rich_html`
with the kind of view it wants, and the renderer in :mod:`jointlab.viz.cards`
builds the HTML by reading the object. This module is the only place outside
``viz/`` and ``widgets/`` that reaches into them for a card, so the analysis
layer imports no renderer.
"""

from __future__ import annotations

from typing import Any, Literal

Kind = Literal["graph", "memory", "comparison", "modules"]


def rich_html(kind: Kind, obj: Any) -> str:
    """The notebook HTML of ``obj`` drawn as ``kind``.

    Args:
        kind: ``"graph"`` (summary card), ``"memory"`` (memory card) or
            ``"comparison"`` (styled comparison summary) or ``"modules"`` (the
            module summary table of a ``module_summary`` DataFrame).
        obj: The JointGraph, MemoryProfile or Comparison to draw.

    Returns:
        An HTML fragment.
    """
    from jointlab.viz.cards import card_html

    return card_html(kind, obj)

"""Registers jointlab's renderers for the kinds of view its results ask for.

Imported by ``jointlab`` itself, so registration costs nothing but three small
functions: each imports its renderer (``viz/`` or ``widgets/``) on first use,
keeping ``import jointlab`` free of plotly, pandas styling and ipywidgets. This
module sits in the api layer, above every renderer, so its imports point down.
"""

from __future__ import annotations

from typing import Any

from jointlab.display import register_renderer

__all__ = ["register_all"]


def _card(obj: Any, *, kind: str) -> str:
    from jointlab.viz.cards import card_html

    return card_html(kind, obj)


def _frame(obj: Any) -> str:
    from jointlab.viz.frames import frame_html

    return frame_html(obj)


def _stepper_widget(stepper: Any, **options: Any) -> Any:
    from jointlab.widgets._stepper import stepper_widget

    return stepper_widget(stepper, **options)


def register_all() -> None:
    """Register the card, table and stepper-panel renderers (idempotent)."""
    register_renderer("card", _card)
    register_renderer("frame", _frame)
    register_renderer("stepper_widget", _stepper_widget)


register_all()

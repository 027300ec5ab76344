"""The display registry: results ask for a rendering by kind, renderers register themselves.

Data never renders itself and no data class imports a renderer. A result's
``_repr_html_`` (or ``Stepper.widget``) calls :func:`render` with the kind of
view it wants; the function that draws that kind is registered here from
above, by the api layer (:mod:`jointlab.renderers`, imported with
``jointlab``), so every import between the layers points down.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from jointlab.errors import RendererMissingError

Kind = Literal["graph", "memory", "comparison", "modules", "plan"]

#: kind -> the function that draws it (``fn(obj, **options)``).
_RENDERERS: dict[str, Callable[..., Any]] = {}


def register_renderer(kind: str, fn: Callable[..., Any]) -> None:
    """Register ``fn`` to draw views of ``kind`` (a later registration replaces it).

    Args:
        kind: The view's kind, e.g. ``"card"``, ``"frame"`` or ``"stepper_widget"``.
        fn: Called as ``fn(obj, **options)``; returns HTML or a widget.
    """
    _RENDERERS[kind] = fn


def render(view: str, obj: Any, **options: Any) -> Any:
    """Draw ``obj`` with the renderer registered for ``kind``.

    Args:
        view: The view's kind (a registered name).
        obj: The object to read.
        **options: Passed to the renderer.

    Returns:
        What the renderer returns (HTML, or a widget).

    Raises:
        RendererMissingError: Nothing is registered for ``kind``.
    """
    fn = _RENDERERS.get(view)
    if fn is None:
        raise RendererMissingError(
            f"no renderer is registered for {view!r} views ({sorted(_RENDERERS)} are). "
            "They are registered by `import jointlab` (jointlab.renderers): import it first.")
    return fn(obj, **options)


def rich_html(kind: Kind, obj: Any) -> str:
    """The notebook HTML of ``obj`` drawn as the card ``kind``.

    Args:
        kind: ``"graph"`` (summary card), ``"memory"`` (memory card),
            ``"comparison"`` (styled comparison summary), ``"plan"`` (a plan
            check) or ``"modules"`` (the module summary table of a
            ``module_summary`` DataFrame).
        obj: The JointGraph, MemoryProfile or Comparison to draw.

    Returns:
        An HTML fragment.
    """
    return render("card", obj, kind=kind)

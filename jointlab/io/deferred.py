"""A graph module that generates its Python code when first needed, not when built.

``fx.GraphModule(root, graph)`` generates and compiles Python source for the
whole graph at once; for a loaded joint graph that is about a third of
:func:`jointlab.load`, yet tables, memory, plots, the Stepper and ``jl.compare``'s
interpreter never run that code. :class:`DeferredGraphModule` postpones that
first code generation until ``forward`` is called or ``code`` (or ``str``) is
read; after it, the module behaves as an ordinary GraphModule.

The analysis stamp (:func:`jointlab.passes.analyze.graph_fingerprint`) uses a
graph module's generated code, a new string on every ``recompile()``. This
module offers :attr:`DeferredGraphModule.code_version` instead: an object that
the deferred first generation keeps and every explicit ``recompile()``
(which ``gm.graph = ...`` also runs) replaces, so staleness is detected exactly
as before without generating code.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx


class DeferredGraphModule(fx.GraphModule):
    """An ``fx.GraphModule`` whose first ``recompile`` waits for ``forward``/``code``."""

    def __init__(self, root: torch.nn.Module, graph: fx.Graph) -> None:
        """Build the module without generating its code.

        Args:
            root: The module holding the attributes ``get_attr`` nodes read.
            graph: The graph to run.
        """
        self.__dict__["_jl_building"] = True
        super().__init__(root, graph)  # its ``self.graph = graph`` calls recompile()
        self.__dict__["_jl_building"] = False
        self.__dict__["code_version"] = object()

    def recompile(self) -> Any:
        """Generate the code now (after an edit) and start a new code version.

        Returns:
            The ``PythonCode`` of ``fx.GraphModule.recompile`` (None while building).
        """
        if self.__dict__.get("_jl_building"):
            return None
        self.__dict__["code_version"] = object()
        return super().recompile()

    def generate_code(self) -> None:
        """Run the deferred first code generation, if it has not run yet."""
        if not has_generated_code(self):
            fx.GraphModule.recompile(self)  # not self.recompile: the version stays

    @property
    def code(self) -> str:
        """The generated Python code (generated now on first access)."""
        self.generate_code()
        return self.__dict__["_code"]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Generate the code, then run it (code generation replaces this method).

        Args:
            *args: The graph's inputs.
            **kwargs: Keyword inputs.

        Returns:
            The graph's outputs.
        """
        self.generate_code()
        return type(self).forward(self, *args, **kwargs)

    def __str__(self) -> str:
        """The module's repr with its generated code, as ``fx.GraphModule`` prints it."""
        self.generate_code()
        return super().__str__()


def has_generated_code(gm: fx.GraphModule) -> bool:
    """True when ``gm`` has generated its Python code (always, for a plain GraphModule)."""
    return "_code" in gm.__dict__

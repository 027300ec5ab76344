"""The stepper's private RNG stream, and moving a graph's constants to a device."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx


# -- RNG kept apart from the user's --------------------------------------------
class StepRng:
    """The stepper's own RNG stream, swapped in only around random ops.

    The seeded start state is computed once: on CPU from a private
    ``torch.Generator`` (the same state ``torch.manual_seed`` gives the default
    generator), so creating or resetting a stepper never touches the user's RNG
    and costs no global reseed.

    Without a seed the stream is the user's own: drawn live from the global
    generators, or, with ``snapshot=True``, from a copy of their state when the
    stream was made: what one call of the graph (``c.run``) made at that moment
    would draw, again on each :meth:`reset`, the user's generators left alone.
    """

    def __init__(self, seed: int | None, device: torch.device, *,
                 snapshot: bool = False) -> None:
        """Compute the start state (see the class docstring).

        Args:
            seed: Seed the stream as ``torch.manual_seed(seed)`` would, or None.
            device: The graph's device (its CUDA generator is swapped too).
            snapshot: Without a seed, start from the user's generators' state now.
        """
        self.seed, self.cuda = seed, device.type == "cuda"
        self.device = device
        self.state: tuple[torch.Tensor, torch.Tensor | None] | None = None
        if seed is not None:
            self._start = self._seeded(seed)
        else:
            self._start = self._get() if snapshot else None
        self.reset()

    @contextlib.contextmanager
    def drawing(self) -> Iterator[None]:
        """Within: the global generators hold the start state (the user's put back after)."""
        with torch.random.fork_rng(devices=[self.device] if self.cuda else []):
            if self._start is not None:
                self._set(self._start)
            yield

    def _get(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        cuda = torch.cuda.get_rng_state(self.device) if self.cuda else None
        return torch.get_rng_state(), cuda

    def _set(self, state: tuple[torch.Tensor, torch.Tensor | None]) -> None:
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], self.device)

    def _seeded(self, seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The generator states ``torch.manual_seed(seed)`` would set, the user's left alone."""
        if not self.cuda:
            return torch.Generator().manual_seed(seed).get_state(), None
        user = self._get()
        torch.manual_seed(seed)
        start = self._get()
        self._set(user)
        return start

    def reset(self) -> None:
        """Start the stream from ``seed`` again (no-op without a seed)."""
        self.state = self._start

    def enter(self) -> Any:
        """Swap the stepper's stream in; return the user's to hand to :meth:`exit`."""
        if self.state is None:
            return None
        user = self._get()
        self._set(self.state)
        return user

    def exit(self, user: Any) -> None:
        """Save the stepper's stream and restore the user's."""
        if user is not None:
            self.state = self._get()
            self._set(user)


def retarget(gm: fx.GraphModule, device: torch.device) -> fx.GraphModule:
    """Copy ``gm`` with every ``device=`` keyword pointing at ``device``."""
    gm = copy.deepcopy(gm)
    for node in gm.graph.nodes:
        if isinstance(node.kwargs.get("device"), torch.device):
            node.kwargs = {**node.kwargs, "device": device}
    gm.recompile()
    return gm

"""The garbage collector around jointlab's two big builders: a trace and a load.

Both build a large heap that stays alive; CPython's collector would walk it
again and again only to find it alive. This module holds jointlab's two
policies for that, the only places jointlab touches the collector.

**A trace: no full collection while it runs.** A trace builds a large,
long-lived heap: graph nodes, their meta dicts, fake tensors, captured stacks.
CPython runs a full (oldest-generation) collection each time the objects that
survived the young collections grow by a quarter since the last one, and each
full collection walks every tracked object. On a growing heap that is a
collection every few seconds, each larger than the last: measured on the
385-layer, 50k-node GPT-2 of ``bench/bench_trace.py``, 3 to 5 full
collections took 3.4 to 4.5 s of a 35 to 45 s trace (young collections: under
1 s), and they find almost nothing to free, since the graph stays alive.

:func:`no_full_collection` raises the oldest generation's threshold while the
trace runs, so young collections go on as usual (short-lived cycles are still
freed at once) but no full collection starts. On exit the thresholds are put
back and CPython's own rule decides: if a full collection fell due meanwhile,
it runs at the next young collection after the trace, once, over the whole
heap (``bench/bench_trace.py`` times a ``gc.collect()`` after each trace, ours
and the bare one, so that walk counts). Peak memory of the 385-layer trace:
981 MB with the pause, 982 MB without. When the collector is disabled, or the
interpreter has no generational thresholds, nothing changes. Thresholds the
user set are kept; a call to ``gc.set_threshold`` inside ``train_fn`` is
undone on exit.

**A giant trace pays its own walk.** A trace of :data:`COLLECT_AT_NODES` nodes
or more made so many objects (about a hundred tracked objects a node) that the
full collection CPython held back falls due at its very next young collection:
left to CPython it lands in whatever the user runs next, typically the first
view (0.5 s of a first ``joint.nodes`` at 61 DeepSeek-V3 layers, whose table
takes 0.17 s). :func:`collect_held_back` runs it as the trace returns, once.

**A load (``jl.load``): no collection at all, then what it made is aged.**
:func:`collector_paused` (a load makes ~100 objects a node and frees none).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["COLLECT_AT_NODES", "collect_held_back", "collector_paused", "no_full_collection"]

#: The oldest generation's threshold while paused: never reached.
_NEVER = 1 << 30
#: A trace of at least this many graph nodes runs the held-back full collection itself.
COLLECT_AT_NODES = 5000


@contextlib.contextmanager
def no_full_collection() -> Iterator[None]:
    """Run the block with young collections only; CPython's rule resumes on exit.

    Yields:
        Nothing. Young collections run as usual inside the block.
    """
    thresholds = gc.get_threshold()
    if not gc.isenabled() or len(thresholds) != 3 or thresholds[2] >= _NEVER:
        yield  # collector off, another scheme, or an outer pause already holds
        return
    gc.set_threshold(thresholds[0], thresholds[1], _NEVER)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def collect_held_back() -> None:
    """Run, now, the full collection a :func:`no_full_collection` block held back.

    Call it after the block, when the block made a heap that large; nothing
    happens when the collector is off or automatic collection is disabled
    (a first threshold of 0), as CPython would run none either.
    """
    if gc.isenabled() and gc.get_threshold()[0] > 0:
        gc.collect()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the collector for the block, then move what it made to the oldest generation.

    The young-generation passes would otherwise walk every object of a freshly
    loaded graph twice just after the load (about a tenth of the load's own time),
    only to find them alive. ``gc.freeze(); gc.unfreeze()`` moves all tracked
    objects into the oldest generation without walking them; full collections
    still examine them as usual. That step is skipped when the process has frozen
    objects of its own (unfreezing would release them).

    Yields:
        Nothing; the collector is on again on exit if it was on before.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        if was_enabled:
            gc.enable()

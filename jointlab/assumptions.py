"""What a joint graph assumes about the Python state it was traced in.

A joint graph is a specialisation of ``train_fn``: tracing reads Python state
once and bakes what it read into the graph. A module's ``training`` flag picks
dropout or not; a parameter's ``requires_grad`` decides which gradients are
outputs; ``p``, ``eps`` or ``momentum`` become constants; autocast decides the
casts. Change any of them after tracing and the graph silently computes the
old step. :class:`Assumptions` records these facts at trace time and
:meth:`Assumptions.check` refuses a later call whose state differs, before
anything runs, naming the module or parameter, the traced value and the
value now.

Recorded (each row of :meth:`Assumptions.table`):

- ``training``: every module's ``training`` flag.
- ``requires_grad``: every parameter's ``requires_grad``.
- ``read``: every attribute the traced step read from a module or an object
  reached through one (dropout ``p``, ``eps``, HF's ``config.hidden_dropout``,
  a dict of options), with a plain value (:mod:`jointlab.trace.reads`). What
  was not read is not guarded; what the step wrote itself is a side effect,
  reported, never guarded.
- ``variable``: every global and closure variable with a plain value that the
  traced code names (:mod:`jointlab.trace.code_reads`), read again on each run.
- ``class``: every module's class (a module swapped for another class).
- ``hooks``: every module's forward, pre- and backward hooks and every
  parameter's tensor hooks, by function (the graph ran the ones it had).
- ``hyperparameter``: in archives saved before reads were recorded, every
  public plain attribute of a module.
- ``global``: the process-wide settings this graph bakes (autocast per device
  type and its dtype; the SDPA backend flags where it holds an attention
  kernel; oneDNN where it holds oneDNN's LSTM layer; the default dtype where
  it creates a tensor without naming a dtype...): the table and each
  setting's predicate are in :mod:`jointlab.global_state`. Settings the
  graph's ops read as they run (deterministic algorithms, float32 matmul
  precision) are followed as eager follows them and are not recorded.
- ``rank``: every rank the user's code read while traced (``dist.get_rank()``,
  ``mesh.get_local_rank("tp")``...; :mod:`jointlab.runtime.rank_reads`), with
  the value read, the user's line and the world ranks that read the same
  value: the only ranks the graph may run as (a branch on the rank is baked).
  Also (attr ``"coordinate"``) each mesh coordinate torch's DTensor read to
  choose values (the chunk a ``Replicate -> Shard`` redistribute keeps, a
  vocab-parallel embedding's mask offset), sequence parallel's and torchtitan's
  plans among them.

Values are plain Python data, so the record is saved with the graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from jointlab.errors import AssumptionError
from jointlab.facts import KINDS as KINDS
from jointlab.facts import Assumption as Assumption
from jointlab.global_state import SETTINGS, read_all, relevant
from jointlab.guard_text import checks, describe_all, what_to_do
from jointlab.guard_values import same_form
from jointlab.live_state import (
    INSTALLED,
    MISSING,
    ROOT,
    UNKNOWN,
    Live,
    class_name,
    current,
    hooks_now,
)

if TYPE_CHECKING:
    import pandas as pd
    import torch.fx as fx

__all__ = ["Assumption", "Assumptions", "global_settings", "hooks_fact", "model_facts"]

_ROOT = ROOT
def model_facts(model: nn.Module) -> list[Assumption]:
    """The model's flags, classes, hooks and ``requires_grad``, as they are now.

    Args:
        model: The user's model (real tensors or meta; nothing is read from tensors).

    Returns:
        One assumption per module flag, module class and parameter. The trace adds
        the hooks (:func:`hooks_fact`) and what the step read (``read`` facts).
    """
    src = "model at jl.trace"
    out: list[Assumption] = []
    for fqn, mod in model.named_modules():
        where = fqn or _ROOT
        out.append(Assumption("training", where, "training", bool(mod.training), src))
        out.append(Assumption("class", where, "class", class_name(mod), src))
    out.extend(Assumption("requires_grad", fqn, "requires_grad", bool(p.requires_grad), src)
               for fqn, p in model.named_parameters())
    return out


def hooks_fact(model: nn.Module, installed: list[str]) -> Assumption:
    """Every hook on the model, as one fact, with those the traced step registers itself.

    A library may register hooks on its first forward (transformers' output capturing
    does); the trace undoes that, eager's next step does it again, and the graph ran
    with them: those names (``installed``) are allowed to be there or not.

    Args:
        model: The model as the trace left it.
        installed: Names of the hooks the traced step registered.

    Returns:
        The ``hooks`` fact.
    """
    value: dict[str, Any] = hooks_now(model)
    if installed:
        value[INSTALLED] = tuple(sorted(set(installed)))
    return Assumption("hooks", _ROOT, "hooks", value, "model at jl.trace")


#: Process-wide settings a graph may depend on, read the same way at trace and run time
#: (the table, and when each one matters for a graph: :mod:`jointlab.global_state`).
GLOBALS: dict[str, Callable[[], Any]] = {s.name: s.read for s in SETTINGS}


def global_settings() -> list[Assumption]:
    """Every process-wide setting of :data:`GLOBALS`, as it is now.

    The trace keeps those that matter for its graph (:meth:`Assumptions.relevant_to`).
    """
    return [Assumption("global", "torch", name, value, "torch at jl.trace")
            for name, value in read_all().items()]


@dataclass(frozen=True)
class Assumptions:
    """Every Python-state fact a joint graph was traced under.

    Attributes:
        facts: The recorded facts, model facts first, then the global settings.
        recorded: False for a graph loaded from an archive written before
            assumptions were recorded: nothing is checked, and the table says so.
    """

    facts: tuple[Assumption, ...] = ()
    recorded: bool = True

    @classmethod
    def record(cls, model: nn.Module) -> Assumptions:
        """Record ``model``'s facts and the global settings, as they are now.

        Args:
            model: The model about to be traced.

        Returns:
            The record.
        """
        return cls(tuple(model_facts(model) + global_settings()))

    def relevant_to(self, gm: fx.GraphModule) -> Assumptions:
        """These facts less the global settings ``gm`` does not depend on.

        Args:
            gm: The graph traced under these facts.

        Returns:
            A copy keeping a ``"global"`` fact only where
            :func:`jointlab.global_state.relevant` says the graph bakes it.
        """
        keep = tuple(f for f in self.facts
                     if f.kind != "global" or relevant(f.attr, gm, f.value))
        return dataclasses.replace(self, facts=keep)

    def violations(self, model: nn.Module) -> list[tuple[Assumption, Any]]:
        """Every recorded fact that differs now, with its current value.

        Args:
            model: The live model.

        Returns:
            ``(fact, value now)`` pairs, in record order; empty when all hold.
        """
        live = Live.of(model)
        out = []
        for fact in self.facts:
            if fact.kind == "rank":
                continue  # checked for the ranks a graph runs as: check_ranks
            now = current(fact, live)
            if now is UNKNOWN:
                continue  # the table says it is not checked here
            if now is MISSING or not same_form(now, fact.value):
                out.append((fact, now))
        return out

    def check(self, model: nn.Module, where: str = "The joint graph") -> None:
        """Refuse when the model or torch's settings differ from trace time.

        Args:
            model: The live model.
            where: What is refused, for the message (``"The joint graph"``).

        Raises:
            AssumptionError: A fact differs; the message names each one (first five),
                its traced value and its value now, and what to do.
        """
        self.check_ranks(None, where)
        bad = self.violations(model)
        if not bad:
            return
        advice = what_to_do(bad, sum(1 for _ in model.modules()))
        raise AssumptionError(
            f"{where} was traced under other conditions than hold now: {describe_all(bad)}. "
            f"{advice} See joint.guards for everything the graph assumes.")

    def rank_facts(self) -> tuple[Assumption, ...]:
        """The ranks the user's code read while traced (``rank`` facts), in read order."""
        return tuple(f for f in self.facts if f.kind == "rank")

    def ranks_allowed(self, world: tuple[int, ...]) -> tuple[int, ...]:
        """The ranks of ``world`` that read what the trace read at every rank read."""
        return tuple(r for r in world if all(r in (f.ranks or ()) for f in self.rank_facts()))

    def check_ranks(self, ranks: tuple[int, ...] | None, where: str = "The joint graph"
                    ) -> None:
        """Refuse running as a rank that reads another value than the trace read.

        Args:
            ranks: The world ranks the graph is about to run as; None for this
                process's rank (``torch.distributed.get_rank()``, as the world reports it).
            where: What is refused, for the message.

        Raises:
            AssumptionError: One of ``ranks`` reads another value at a recorded rank
                read (or no process group is initialised to say which rank this is).
        """
        facts = self.rank_facts()
        if not facts:
            return
        if ranks is None:
            ranks = _this_rank(where, facts[0])
        for fact in facts:
            other = [r for r in ranks if r not in (fact.ranks or ())]
            if other:
                who, holds = (("torch read", "the piece of a tensor it chose for them")
                              if fact.attr == "coordinate" else
                              ("the user's code read", "another rank's branch"))
                raise AssumptionError(
                    f"{where} cannot run as rank {other[0]}: {who} "
                    f"{fact.target} = {fact.value!r} at {fact.source} when traced, which only "
                    f"ranks {list(fact.ranks or ())} read; rank {other[0]} reads another value "
                    f"there, so the graph holds {holds}. Trace every rank with "
                    "jl.trace_ranks(model, train_fn, inputs), which traces the ranks that "
                    "read different values separately, and run them with jl.run_all_ranks. "
                    "See joint.guards.")

    def headline(self) -> dict[str, Any]:
        """The few facts a summary card shows.

        Returns:
            ``recorded``, ``count`` (every fact), ``train``/``eval`` (module counts),
            ``trainable``/``frozen`` (parameter counts), ``dropout`` (distinct ``p``
            values the step read from its modules) and ``autocast`` (device type to
            dtype, only where on).
        """
        kinds = [f.kind for f in self.facts]
        train = [f.value for f in self.facts if f.kind == "training"]
        grads = [f.value for f in self.facts if f.kind == "requires_grad"]
        dropout = sorted({f.value for f in self.facts if f.kind in ("read", "hyperparameter")
                          and f.attr == "p" and isinstance(f.value, float)})
        autocast = {f.attr[len("autocast["):-1]: f.value for f in self.facts
                    if f.kind == "global" and f.attr.startswith("autocast[") and f.value}
        return dict(recorded=self.recorded, count=len(kinds), train=sum(train),
                    eval=len(train) - sum(train), trainable=sum(grads),
                    frozen=len(grads) - sum(grads), dropout=dropout, autocast=autocast)

    def table(self) -> pd.DataFrame:
        """One row per fact: kind, target, attribute, traced value, what it checks, source.

        Returns:
            A DataFrame (columns ``kind, target, attr, traced, checks, source``).
        """
        import pandas as pd

        rows = [dict(kind=f.kind, target=f.target, attr=f.attr, traced=f.value,
                     checks=checks(f), source=f.source) for f in self.facts]
        if not self.recorded:
            rows.append(dict(kind="unknown", target="", attr="", traced=None,
                             checks="nothing: this archive was saved before jointlab "
                                    "recorded the state a graph assumes",
                             source="archive"))
        return pd.DataFrame(rows, columns=["kind", "target", "attr", "traced", "checks",
                                           "source"])


def _this_rank(where: str, fact: Assumption) -> tuple[int, ...]:
    """This process's world rank, as the (simulated) world reports it now."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise AssumptionError(
            f"{where} was traced reading the rank ({fact.target} = {fact.value!r} at "
            f"{fact.source}), but no process group is initialised now, so nothing says which "
            "rank runs it. Run it inside the world it was traced in (jl.fake_world).")
    return (int(dist.get_rank()),)

"""Legend of a labelled DAG colouring (``color_by="kernel"`` and other label layers).

A compiled joint has dozens of kernel calls, whose names Inductor spells out
as every fused op (``cpp_fused_add_native_layer_norm_native_layer_norm_backward_view_5``),
and a node covered by several calls is labelled with all of them. Listed in full,
such a legend is taller than the graph. Here the labels are ranked by how many
nodes carry them: the first :data:`LEGEND_LEVELS` get the palette's colours (greys
left to "mixed" and "none") and a legend entry with a short name (at most
:data:`LABEL_MAX` characters, the full name in its tooltip and in the node's detail
panel); the rest get paler golden-angle hues, so small fused groups still show, and
share one ``+N more`` entry.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

#: Most labels with a colour and a legend entry of their own.
LEGEND_LEVELS = 12
#: Longest legend label, in characters.
LABEL_MAX = 32

_FUSED = re.compile(r"(?:cpp|triton_[a-z]+)_fused_(?P<ops>.+)_(?P<num>\d+)(?::(?P<call>\d+))?")
_EXTERN = re.compile(r"(?:extern_kernels|torch\.ops\.[a-z_]+)\.(?P<op>[\w.]+?)(?:\.default)?"
                     r"(?::(?P<call>\d+))?")
#: Spellings shortened inside Inductor's fused op lists and extern op names.
_ABBREV = ((re.compile(r"_?scaled_dot_product_\w*?attention(?:_for_cpu)?"), "sdpa"),
           (re.compile(r"native_(layer|batch|group)_norm"), r"\1_norm"),
           (re.compile(r"_backward(?:_data)?"), "_bwd"),
           (re.compile(r"_forward(?=_|$)"), ""),
           (re.compile(r"(?:^|(?<=_))_(?=[a-z])"), ""),
           (re.compile(r"(?<![a-z])([a-z]\w*?)_\1_bwd"), r"\1+bwd"))
#: Ops that only index, reshape or fill: they name no work of their own.
_NOISE = re.compile(r"(?:^|_)(?:view|transpose|expand|permute|split|unsqueeze|squeeze|clone|"
                    r"arange|scalar_tensor|ones_like|zeros_like|full|alias|select|slice)"
                    r"(?=_|$)")


def rank_levels(values: Sequence[str | None]) -> list[str]:
    """Distinct labels, most frequent first (ties in order of first appearance).

    Args:
        values: One label per node; ``None`` or ``""`` for nodes without one.

    Returns:
        The distinct non-empty labels.
    """
    counts = Counter(v for v in values if v)
    first = {v: i for i, v in reversed(list(enumerate(values)))}
    return sorted(counts, key=lambda v: (-counts[v], first[v]))


def _abbreviate(text: str) -> str:
    for pattern, repl in _ABBREV:
        text = pattern.sub(repl, text)
    return text


def cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the last one an ellipsis when cut."""
    return text if len(text) <= limit else text[:max(limit - 1, 0)] + "…"


def short_call(name: str, limit: int = LABEL_MAX) -> str:
    """A readable short form of one kernel call, at most ``limit`` characters.

    ``cpp_fused_add_native_layer_norm_view_5:17`` -> ``add_layer_norm #5@17`` (kernel 5,
    debug handle 17); ``extern_kernels.addmm:56`` -> ``addmm @56``;
    ``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default:3`` -> ``sdpa @3``.
    Any other name is only cut.
    """
    fused, extern = _FUSED.fullmatch(name), _EXTERN.fullmatch(name)
    if fused:
        ops = _abbreviate(fused["ops"])
        ops = _NOISE.sub("", ops).strip("_") or ops
        tag = f" #{fused['num']}" + (f"@{fused['call']}" if fused["call"] else "")
    elif extern:
        ops = _abbreviate(extern["op"])
        tag = f" @{extern['call']}" if extern["call"] else ""
    else:
        return cut(name, limit)
    return cut(ops, max(limit - len(tag), 1)) + tag


def short_label(label: str, limit: int = LABEL_MAX) -> str:
    """Legend text of a layer label: its first kernel call shortened, ``+k`` for the others.

    Kernel labels join the calls covering a node with ``", "`` (see
    :func:`jointlab.analysis.kernels.kernel_layer`). The result has at most ``limit``
    characters.
    """
    calls = label.split(", ")
    more = f" +{len(calls) - 1}" if len(calls) > 1 else ""
    return short_call(calls[0], max(limit - len(more), 1)) + more


def _is_grey(color: str) -> bool:
    r, g, b = (color[i:i + 2] for i in (1, 3, 5))
    return r == g == b


def level_colors(levels: Sequence[str], palette: Sequence[str]) -> list[str]:
    """Colour of each ranked level.

    The first :data:`LEGEND_LEVELS` take the palette's non-grey ``#rrggbb`` colours in
    order (greys mean "mixed" and "none"), the rest paler golden-angle hues.
    """
    hues = [c for c in palette if not _is_grey(c)][:LEGEND_LEVELS]
    return [hues[k] if k < len(hues) else f"hsl({k * 137.508 % 360:.0f},40%,68%)"
            for k in range(len(levels))]

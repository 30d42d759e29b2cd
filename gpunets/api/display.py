"""Pictures of a network: Graphviz source, and an SVG for notebooks.

The SVG comes from Graphviz (the ``graphviz`` Python package, or the ``dot``
program) where the ``dot`` program is installed, and otherwise from a small
pure-Python layout that draws each node once, training edges included.  Jupyter
front-ends get it through ``_repr_mimebundle_``, so one display renders once.

>>> import numpy as np, gpunets as gn
>>> from sklearn.linear_model import Ridge
>>> X, y = gn.source(np.eye(3), name="X"), gn.source(np.ones(3), name="y")
>>> p = gn.machine(Ridge(), X, y).predict(X)
>>> fallback_svg([p]).startswith("<svg")
True
>>> sorted(mimebundle([p]))
['image/svg+xml', 'text/plain']
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpunets.core.graph import all_nodes
from gpunets.core.machines import labels
from gpunets.core.nodes import AbstractNode, Node, Source

__all__ = ["to_dot", "repr_svg", "graphviz_svg", "fallback_svg", "mimebundle", "repr_html", "to_text"]


# --- the graph, once: what every picture draws ---------------------------------------------------

@dataclass
class _Item:
    id: str
    label: str
    kind: str   # "source", "node" or "machine"


@dataclass
class _Graph:
    items: list[_Item] = field(default_factory=list)
    edges: list[tuple[str, str, str]] = field(default_factory=list)   # (from, to, "data" | "train" | "model")


def _slug(text: str) -> str:
    s = re.sub(r"\W+", "_", text).strip("_") or "node"
    return s if not s[0].isdigit() else f"_{s}"


def _graph(targets: Sequence[AbstractNode]) -> _Graph:
    """Sources, nodes and machines upstream of ``targets``, each once, with readable unique ids."""
    nodes = all_nodes(list(targets))
    machines = []
    for n in nodes:
        m = getattr(n, "machine", None)
        if m is not None and m not in machines:
            machines.append(m)
    names = labels(machines)
    g = _Graph()
    used: dict[str, int] = {}
    ids: dict[int, str] = {}

    def new_id(base: str) -> str:
        base = _slug(base)
        used[base] = used.get(base, 0) + 1
        return base if used[base] == 1 else f"{base}_{used[base]}"

    for n in nodes:
        if isinstance(n, Source):
            ids[n._uid] = new_id(n.label)
            g.items.append(_Item(ids[n._uid], n.label, "source"))
        else:
            assert isinstance(n, Node)
            if n.machine is not None:
                label = f"{n.op_name}({names[n.machine]})"
                ids[n._uid] = new_id(n.name or f"{n.op_name}_{names[n.machine]}")
            else:
                label = n.name or n.op_name
                ids[n._uid] = new_id(label)
            g.items.append(_Item(ids[n._uid], label, "node"))
    for m in machines:
        ids[m._uid] = new_id(f"machine_{names[m]}")
        g.items.append(_Item(ids[m._uid], names[m], "machine"))
        for a in m.args:
            g.edges.append((ids[a._uid], ids[m._uid], "train"))
    for n in nodes:
        for a in n.args:
            if isinstance(a, AbstractNode):
                g.edges.append((ids[a._uid], ids[n._uid], "data"))
        m = getattr(n, "machine", None)
        if m is not None:
            g.edges.append((ids[m._uid], ids[n._uid], "model"))
    return g


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(targets: Sequence[AbstractNode]) -> str:
    """Graphviz source: sources as ellipses, nodes as boxes, machines as rounded blue boxes.

    Training edges (data a machine is fitted on) are dashed; node ids are readable
    (``X``, ``transform_StandardScaler``, ``machine_Ridge``).

    >>> import gpunets as gn
    >>> print(gn.source(name="X").to_dot())
    digraph gpunets {
      rankdir=LR;
      node [fontname="Helvetica", fontsize=10];
      X [label="X", shape=ellipse];
    }
    """
    g = _graph(targets)
    lines = ["digraph gpunets {", "  rankdir=LR;", '  node [fontname="Helvetica", fontsize=10];']
    style = {"source": "shape=ellipse", "node": "shape=box", "machine": "shape=box, style=rounded, color=blue"}
    for it in g.items:
        lines.append(f"  {it.id} [label={_q(it.label)}, {style[it.kind]}];")
    edge = {"data": "", "train": " [style=dashed, color=blue]", "model": " [color=blue]"}
    for a, b, kind in g.edges:
        lines.append(f"  {a} -> {b}{edge[kind]};")
    lines.append("}")
    return "\n".join(lines)


# --- SVG ------------------------------------------------------------------------------------------

def graphviz_svg(targets: Sequence[AbstractNode]) -> str | None:
    """SVG laid out by Graphviz, or None where the ``dot`` program is not installed (or fails)."""
    if shutil.which("dot") is None:
        return None
    source = to_dot(targets)
    try:
        import graphviz
    except ImportError:
        graphviz = None
    if graphviz is not None:
        try:
            return graphviz.Source(source).pipe(format="svg", encoding="utf-8")
        except Exception:  # noqa: BLE001 - a failing Graphviz falls back to the pure-Python picture
            return None
    try:
        out = subprocess.run(["dot", "-Tsvg"], input=source.encode(), capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode() if out.returncode == 0 and b"<svg" in out.stdout else None


_CHAR_W, _BOX_H, _ROW_H, _GAP_X, _PAD = 6.6, 26, 42, 46, 12


def fallback_svg(targets: Sequence[AbstractNode]) -> str:
    """A pure-Python SVG of the network: one column per depth, each node drawn once.

    Sources are ellipses, nodes boxes, machines rounded blue boxes; training
    edges are dashed blue, a machine's edges to its operations solid blue.
    """
    g = _graph(targets)
    preds: dict[str, list[str]] = {it.id: [] for it in g.items}
    for a, b, _ in g.edges:
        preds[b].append(a)
    rank: dict[str, int] = {}

    def depth(i: str) -> int:
        if i not in rank:
            rank[i] = 0   # guards against cycles (there are none in a valid network)
            rank[i] = 1 + max((depth(p) for p in preds[i]), default=-1)
        return rank[i]

    columns: dict[int, list[_Item]] = {}
    for it in g.items:
        columns.setdefault(depth(it.id), []).append(it)
    width = {it.id: max(40.0, _CHAR_W * len(it.label) + 2 * _PAD) for it in g.items}
    pos: dict[str, tuple[float, float]] = {}   # left x, centre y
    x = 10.0
    tallest = max((len(c) for c in columns.values()), default=1)
    for r in sorted(columns):
        col = columns[r]
        top = 10 + (tallest - len(col)) * _ROW_H / 2
        for k, it in enumerate(col):
            pos[it.id] = (x, top + k * _ROW_H + _BOX_H / 2)
        x += max(width[it.id] for it in col) + _GAP_X
    total_w, total_h = x - _GAP_X + 10, 20 + tallest * _ROW_H
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0f}" height="{total_h:.0f}" '
           f'viewBox="0 0 {total_w:.0f} {total_h:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="11">',
           '<defs><marker id="gn-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="context-stroke"/></marker></defs>']
    for a, b, kind in g.edges:
        (ax_, ay), (bx, by) = pos[a], pos[b]
        x1, x2 = ax_ + width[a], bx
        mid = (x1 + x2) / 2
        color = "#1f4fd1" if kind != "data" else "#333"
        dash = ' stroke-dasharray="5,3"' if kind == "train" else ""
        out.append(f'<path d="M{x1:.1f},{ay:.1f} C{mid:.1f},{ay:.1f} {mid:.1f},{by:.1f} {x2:.1f},{by:.1f}" '
                   f'fill="none" stroke="{color}"{dash} marker-end="url(#gn-arrow)"/>')
    for it in g.items:
        x0, cy = pos[it.id]
        w = width[it.id]
        text = html.escape(it.label)
        if it.kind == "source":
            shape = (f'<ellipse cx="{x0 + w / 2:.1f}" cy="{cy:.1f}" rx="{w / 2:.1f}" ry="{_BOX_H / 2}" '
                     'fill="#f4f4f4" stroke="#333"/>')
        else:
            rx, stroke = (8, "#1f4fd1") if it.kind == "machine" else (0, "#333")
            shape = (f'<rect x="{x0:.1f}" y="{cy - _BOX_H / 2:.1f}" width="{w:.1f}" height="{_BOX_H}" rx="{rx}" '
                     f'fill="white" stroke="{stroke}"/>')
        out.append(f'<g class="gn-{it.kind}" id="{html.escape(it.id)}"><title>{text}</title>{shape}'
                   f'<text x="{x0 + w / 2:.1f}" y="{cy + 4:.1f}" text-anchor="middle">{text}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


def repr_svg(targets: Sequence[AbstractNode]) -> str:
    """SVG of the network: Graphviz's layout where ``dot`` is installed, else :func:`fallback_svg`."""
    return graphviz_svg(targets) or fallback_svg(targets)


def mimebundle(targets: Sequence[AbstractNode], text: str | None = None) -> dict[str, str]:
    """What Jupyter displays for a network: its SVG (rendered once) and a text fallback."""
    return {"text/plain": text if text is not None else "\n".join(repr(t) for t in targets),
            "image/svg+xml": repr_svg(targets)}


# --- text -----------------------------------------------------------------------------------------

def to_text(targets: Sequence[AbstractNode]) -> str:
    """An indented text tree of the network."""
    lines: list[str] = []

    def walk(n: Any, depth: int) -> None:
        pad = "  " * depth
        if isinstance(n, Source):
            lines.append(f"{pad}{n.label} (source)")
            return
        if not isinstance(n, Node):
            return   # a constant argument (a parameter of the operation), not part of the graph
        head = f"{n.op_name}[{n.machine.label}]" if n.machine is not None else (n.name or n.op_name)
        lines.append(f"{pad}{head}")
        if depth > 8:
            lines.append(f"{pad}  …")
            return
        for a in n.args:
            walk(a, depth + 1)

    for t in targets:
        walk(t, 0)
    return "\n".join(lines)


def repr_html(targets: Sequence[AbstractNode]) -> str:
    """The network as inline SVG inside HTML (for objects whose display is HTML, e.g. machines)."""
    svg = repr_svg(targets)
    return f'<div class="gpunets-graph">{svg[svg.find("<svg"):]}</div>'

"""Pictures of a network: Graphviz source, SVG in Jupyter when Graphviz is there, text otherwise."""

from __future__ import annotations

import html
import shutil
import subprocess
from typing import Any, Sequence

from .graph import all_nodes
from .machines import labels
from .nodes import AbstractNode, Node, Source

__all__ = ["to_dot", "repr_svg", "repr_html", "to_text"]


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(targets: Sequence[AbstractNode]) -> str:
    """Graphviz source: sources as ellipses, nodes as boxes, machines as dashed training edges."""
    nodes = all_nodes(list(targets))
    machines = []
    for n in nodes:
        m = getattr(n, "machine", None)
        if m is not None and m not in machines:
            machines.append(m)
    names = labels(machines)
    lines = ["digraph gpunets {", "  rankdir=LR;", '  node [fontname="Helvetica", fontsize=10];']
    for n in nodes:
        nid = f"n{n._uid}"
        if isinstance(n, Source):
            lines.append(f"  {nid} [label={_q(n.label)}, shape=ellipse];")
        else:
            assert isinstance(n, Node)
            label = f"{n.op_name}({names[n.machine]})" if n.machine is not None else (n.name or n.op_name)
            lines.append(f"  {nid} [label={_q(label)}, shape=box];")
    for m in machines:
        lines.append(f"  m{m._uid} [label={_q(names[m])}, shape=box, style=rounded, color=blue];")
        for a in m.args:
            lines.append(f"  n{a._uid} -> m{m._uid} [style=dashed, color=blue];")
    for n in nodes:
        for a in n.args:
            if isinstance(a, AbstractNode):
                lines.append(f"  n{a._uid} -> n{n._uid};")
        m = getattr(n, "machine", None)
        if m is not None:
            lines.append(f"  m{m._uid} -> n{n._uid} [color=blue];")
    lines.append("}")
    return "\n".join(lines)


def repr_svg(targets: Sequence[AbstractNode]) -> str | None:
    """SVG of the network through the ``dot`` program, or None when Graphviz is not installed."""
    dot = shutil.which("dot")
    if dot is None:
        return None
    try:
        out = subprocess.run([dot, "-Tsvg"], input=to_dot(targets).encode(), capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode() if out.returncode == 0 else None


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
    return "<pre>" + html.escape(to_text(targets)) + "</pre>"



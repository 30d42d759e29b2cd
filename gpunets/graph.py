"""Traversals of a network: origins, upstream machines, topological orders.

Two kinds of edge leave a node: *operation edges* to its arguments, and, for a
machine operation, *training edges* from its machine to the machine's
training arguments.  Nodes and machines are immutable once built, so a
network cannot hold a cycle; the traversals are iterative (no recursion
limit on long chains).

>>> import numpy as np, gpunets as gn
>>> from sklearn.linear_model import Ridge
>>> X, y = gn.source(np.ones((3, 1)), name="X"), gn.source(np.ones(3), name="y")
>>> m = gn.machine(Ridge(), X, y)
>>> p = m.predict(X)
>>> [s.name for s in origins(p)], [s.name for s in all_sources([p])]
(['X'], ['X', 'y'])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

from .exceptions import CycleError
from .nodes import AbstractNode, Node, Source, is_node

if TYPE_CHECKING:  # pragma: no cover
    from .machines import Machine

__all__ = ["op_nodes", "origins", "all_sources", "upstream_machines", "machine_parents", "all_nodes"]


def op_nodes(targets: Sequence[AbstractNode]) -> list[AbstractNode]:
    """Nodes reached from ``targets`` through operation edges, dependencies first."""
    order: list[AbstractNode] = []
    seen: set[int] = set()
    for t in targets:
        stack: list[tuple[AbstractNode, bool]] = [(t, False)]
        while stack:
            n, expanded = stack.pop()
            if expanded:
                order.append(n)
                continue
            if n._uid in seen:
                continue
            seen.add(n._uid)
            stack.append((n, True))
            for a in reversed(n.args):
                if is_node(a) and a._uid not in seen:
                    stack.append((a, False))
    return order


def origins(n: AbstractNode) -> tuple[Source, ...]:
    """The sources reached from ``n`` through operation edges, in first-seen order."""
    return tuple(x for x in op_nodes([n]) if isinstance(x, Source))


def all_nodes(targets: Sequence[AbstractNode]) -> list[AbstractNode]:
    """Every node upstream through operation and training edges, dependencies first."""
    order: list[AbstractNode] = []
    seen: set[int] = set()
    pending = list(targets)
    while pending:
        layer = [n for n in op_nodes(pending) if n._uid not in seen]
        pending = []
        for n in layer:
            seen.add(n._uid)
            order.append(n)
            m = getattr(n, "machine", None)
            if m is not None:
                pending.extend(a for a in m.args if a._uid not in seen)
    # Re-sort so that training arguments of a machine come before the machine's nodes.
    return _topo(order)


def _deps(n: AbstractNode) -> list[AbstractNode]:
    out = [a for a in n.args if is_node(a)]
    m = getattr(n, "machine", None)
    if m is not None:
        out.extend(m.args)
    return out


def _topo(nodes: Iterable[AbstractNode]) -> list[AbstractNode]:
    nodes = list(nodes)
    order: list[AbstractNode] = []
    done: set[int] = set()
    active: set[int] = set()          # expanded, not finished: reaching one again closes a cycle
    for t in nodes:
        stack: list[tuple[AbstractNode, bool]] = [(t, False)]
        while stack:
            n, expanded = stack.pop()
            if expanded:
                if n._uid not in done:
                    done.add(n._uid)
                    active.discard(n._uid)
                    order.append(n)
                continue
            if n._uid in done:
                continue
            if n._uid in active:
                raise CycleError(_cycle_message(n))
            active.add(n._uid)
            stack.append((n, True))
            for a in reversed(_deps(n)):
                if a._uid not in done:
                    stack.append((a, False))
    return order


def _cycle_message(start: AbstractNode) -> str:
    """Name a cycle through ``start`` (only on the error path: graphlib finds it)."""
    import graphlib

    graph: dict[int, list[int]] = {}
    by_uid: dict[int, AbstractNode] = {}
    pending = [start]
    while pending:
        n = pending.pop()
        if n._uid in graph:
            continue
        by_uid[n._uid] = n
        deps = _deps(n)
        graph[n._uid] = [a._uid for a in deps]
        pending.extend(deps)
    try:
        graphlib.TopologicalSorter(graph).prepare()
        cycle = [start._uid, start._uid]
    except graphlib.CycleError as e:
        cycle = list(e.args[1])
    names = " -> ".join(by_uid[u]._short() for u in reversed(cycle))
    machines = sorted({by_uid[u].machine.label for u in cycle if getattr(by_uid[u], "machine", None) is not None})
    return (f"The network has a cycle: {names} (each depends on the next through an operation or a "
            f"machine's training arguments). It was closed by reassigning a machine's args "
            f"(machines on the cycle: {machines}); give the machine training arguments that do not depend "
            "on its own operations.")


def all_sources(targets: Sequence[AbstractNode]) -> tuple[Source, ...]:
    """Every source upstream through either kind of edge."""
    return tuple(n for n in all_nodes(targets) if isinstance(n, Source))


def upstream_machines(targets: Sequence[AbstractNode]) -> tuple["Machine", ...]:
    """Every machine upstream of ``targets``, each after the machines it depends on."""
    seen: set[int] = set()
    out: list[Machine] = []
    for n in all_nodes(targets):
        m = getattr(n, "machine", None)
        if m is not None and m._uid not in seen:
            seen.add(m._uid)
            out.append(m)
    return tuple(out)


def machine_parents(m: "Machine") -> tuple["Machine", ...]:
    """Machines whose operations feed ``m``'s training data (through operation edges only)."""
    seen: set[int] = set()
    out: list[Machine] = []
    for n in op_nodes(list(m.args)):
        pm = n.machine if isinstance(n, Node) else None
        if pm is not None and pm._uid not in seen:
            seen.add(pm._uid)
            out.append(pm)
    return tuple(out)


def machine_sources(m: "Machine") -> tuple[Source, ...]:
    """Sources whose data reaches ``m``'s training data, through any edge."""
    return all_sources(list(m.args))

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

from collections.abc import Callable, Container, Iterable, Sequence
from hashlib import blake2b
from typing import TYPE_CHECKING

from gpunets.base.exceptions import CycleError
from gpunets.core.nodes import AbstractNode, Node, Source, is_node
from gpunets.devices.fingerprint import fingerprint

if TYPE_CHECKING:  # pragma: no cover
    from gpunets.core.machines import Machine

__all__ = ["op_nodes", "origins", "all_sources", "upstream_machines", "machine_parents", "all_nodes", "Upstream"]


def op_nodes(targets: Sequence[AbstractNode], done: Container[int] = ()) -> list[AbstractNode]:
    """Nodes reached from ``targets`` through operation edges, dependencies first.

    Nodes whose uid is in ``done`` are neither entered nor listed (nor is anything
    reached only through them): a caller that memoises its own walk passes what it has.
    """
    order: list[AbstractNode] = []
    seen: set[int] = set()
    if done:
        seen = {t._uid for t in targets if t._uid in done}
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
                if is_node(a) and a._uid not in seen and a._uid not in done:
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
        # Nodes seen in an earlier layer are not walked again: everything below them was listed with them.
        layer = op_nodes(pending, done=seen)
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
    on_cycle = [getattr(by_uid[u], "machine", None) for u in cycle]
    machines = sorted({m.label for m in on_cycle if m is not None})
    return (f"The network has a cycle: {names} (each depends on the next through an operation or a "
            f"machine's training arguments). It was closed by reassigning a machine's args "
            f"(machines on the cycle: {machines}); give the machine training arguments that do not depend "
            "on its own operations.")


def all_sources(targets: Sequence[AbstractNode]) -> tuple[Source, ...]:
    """Every source upstream through either kind of edge."""
    return tuple(n for n in all_nodes(targets) if isinstance(n, Source))


def upstream_machines(targets: Sequence[AbstractNode]) -> tuple[Machine, ...]:
    """Every machine upstream of ``targets``, each after the machines it depends on."""
    seen: set[int] = set()
    out: list[Machine] = []
    for n in all_nodes(targets):
        m = getattr(n, "machine", None)
        if m is not None and m._uid not in seen:
            seen.add(m._uid)
            out.append(m)
    return tuple(out)


def machine_parents(m: Machine) -> tuple[Machine, ...]:
    """Machines whose operations feed ``m``'s training data (through operation edges only)."""
    seen: set[int] = set()
    out: list[Machine] = []
    for n in op_nodes(list(m.args)):
        pm = n.machine if isinstance(n, Node) else None
        if pm is not None and pm._uid not in seen:
            seen.add(pm._uid)
            out.append(pm)
    return tuple(out)


def machine_sources(m: Machine) -> tuple[Source, ...]:
    """Sources whose data reaches ``m``'s training data, through any edge."""
    return all_sources(list(m.args))


# --- memoised upstream facts (one walk per compile) -------------------------------------------

_LEAF = b""


def _digest(*parts: bytes) -> bytes:
    return blake2b(b"".join(parts), digest_size=16).digest()


def _source_stamp(s: Source) -> bytes:
    """What a source contributes to the stamps of the machines it feeds: its data's version and content.

    Stamps name no object ids (the structure they are built along tells
    sources apart), so a copied or unpickled network keeps its stamps.
    """
    return _digest(b"s", s._version.to_bytes(8, "little"), repr(fingerprint(s._data)).encode())


def _machine_stamp(m: Machine, version: int) -> bytes:
    return _digest(b"m", version.to_bytes(8, "little"))


class Upstream:
    """What feeds each machine's training data, computed once per node and memoised.

    For a machine ``m`` (both answered in time linear in the network, however many
    machines ask):

    * :meth:`changing`: does a machine whose action is not ``"skip"`` feed ``m``'s
      training data through operation edges (what :func:`machine_parents` lists)?
    * :meth:`stamp`: a digest of the versions of those machines and of every
      source reaching ``m``'s training data through any edge (what
      :func:`machine_sources` lists).  A network's structure is immutable, so two
      stamps of one machine are equal exactly when all those versions are
      (up to a 128-bit hash collision); it replaces a dict of versions, whose size
      grows with the depth of the network (quadratic on a chain of machines).

    ``action(machine)`` gives each upstream machine's action in the fit being
    compiled (default: every machine skips, i.e. the current state).  Stamps
    with ``expected=True`` use the versions machines will have once this fit's
    fits have committed.

    >>> import numpy as np, gpunets as gn
    >>> from sklearn.preprocessing import StandardScaler
    >>> X = gn.source(np.ones((3, 1)), name="X")
    >>> a = gn.machine(StandardScaler(), X)
    >>> b = gn.machine(StandardScaler(), a.transform(X))
    >>> up = Upstream(lambda m: "train" if m is a else "skip")
    >>> up.changing(b), up.changing(a)
    (True, False)
    >>> up.stamp(b) == up.stamp(b, expected=True)
    False
    """

    __slots__ = ("action", "memo", "visits", "nearest")

    def __init__(self, action: Callable[[Machine], str] | None = None) -> None:
        self.action = action if action is not None else (lambda m: "skip")
        # node uid -> (changing, machines stamp now, machines stamp after this fit, sources stamp)
        self.memo: dict[int, tuple[bool, bytes, bytes, bytes]] = {}
        self.visits = 0   # nodes whose facts were computed (each once): the walk's whole cost
        self.nearest: dict[int, tuple[Machine, ...]] = {}   # node uid -> nearest machines through op edges

    def changing(self, m: Machine) -> bool:
        """True if a machine retraining or updating in this fit feeds ``m`` through operation edges."""
        return any(self._facts(a)[0] for a in m.args)

    def stamp(self, m: Machine, expected: bool = False) -> bytes:
        """The digest of the versions of what ``m`` trains on (see the class docstring)."""
        parts: list[bytes] = [b"u"]
        for a in m.args:
            f = self._facts(a)
            parts += (f[2] if expected else f[1], f[3])
        return _digest(*parts)

    def parents(self, m: Machine, expected: bool = False) -> tuple[tuple[Machine, int], ...]:
        """The nearest machines feeding ``m``'s training data through operation edges, with their versions.

        What a fitted state records so that a call can tell that a state was trained on an upstream
        state other than the one the call uses (never mixing two fits).  With ``expected=True`` the
        versions are those the machines will have once this fit's fits have committed.
        """
        seen: dict[int, Machine] = {}
        for a in m.args:
            for p in self._nearest(a):
                seen.setdefault(p._uid, p)
        bump = (lambda p: int(self.action(p) != "skip")) if expected else (lambda p: 0)
        return tuple((p, p._version + bump(p)) for p in seen.values())

    def _nearest(self, n: AbstractNode) -> tuple[Machine, ...]:
        memo = self.nearest
        stack: list[tuple[AbstractNode, bool]] = [(n, False)]
        while stack:
            x, expanded = stack.pop()
            if x._uid in memo:
                continue
            m = x.machine if isinstance(x, Node) else None
            if isinstance(x, Source) or m is not None:
                memo[x._uid] = (m,) if m is not None else ()
                continue
            if not expanded:
                stack.append((x, True))
                stack.extend((a, False) for a in x.args if is_node(a) and a._uid not in memo)
                continue
            out: dict[int, Machine] = {}
            for a in x.args:
                if is_node(a):
                    for p in memo[a._uid]:
                        out.setdefault(p._uid, p)
            memo[x._uid] = tuple(out.values())
        return memo[n._uid]

    def _facts(self, n: AbstractNode) -> tuple[bool, bytes, bytes, bytes]:
        memo = self.memo
        hit = memo.get(n._uid)
        if hit is not None:
            return hit
        stack: list[tuple[AbstractNode, bool]] = [(n, False)]
        while stack:
            x, expanded = stack.pop()
            if x._uid in memo:
                continue
            if not expanded:
                stack.append((x, True))
                stack.extend((a, False) for a in _deps(x) if a._uid not in memo)
                continue
            memo[x._uid] = self._make(x)
            self.visits += 1
        return memo[n._uid]

    def _make(self, x: AbstractNode) -> tuple[bool, bytes, bytes, bytes]:
        memo = self.memo
        if isinstance(x, Source):
            return False, _LEAF, _LEAF, _source_stamp(x)
        args = [memo[a._uid] for a in x.args if is_node(a)]
        m = x.machine if isinstance(x, Node) else None
        if m is None:
            if len(args) == 1:    # a fixed structure: a one-argument node adds nothing to tell apart
                return args[0]
            return (any(f[0] for f in args), _digest(b"n", *[f[1] for f in args]),
                    _digest(b"n", *[f[2] for f in args]), _digest(b"n", *[f[3] for f in args]))
        trains = self.action(m) != "skip"
        now = _machine_stamp(m, m._version)
        after = _machine_stamp(m, m._version + 1) if trains else now
        train_args = [memo[a._uid][3] for a in m.args]
        return (trains or any(f[0] for f in args), _digest(b"o", now, *[f[1] for f in args]),
                _digest(b"o", after, *[f[2] for f in args]),
                _digest(b"o", *[f[3] for f in args], b"|", *train_args))

"""Sources and nodes: the pure graph of a learning network.

A network is made of three kinds of object (machines live in
:mod:`gpunets.core.machines`):

* a :class:`Source` wraps data;
* a :class:`Node` applies an operation to the values of its arguments: either
  any callable (``gn.node(fn, a, b)``), or an operation of a trained machine
  (``mach.predict(W)``);
* a machine binds a model to its training arguments.

Calling a node evaluates it (``N`` below is ``op(mach, a1, a2)`` or
``fn(a1, a2)``; ``s`` ranges over the node's *origins*, the sources it reaches
through operation edges, never through a machine's training edges)::
    N()             = op(mach, a1(), a2())                       sources' own data
    N(rows=r)       = op(mach, a1(rows=r), a2(rows=r))           those rows of it
    N(Xnew)         = op(mach, a1(Xnew), a2(Xnew))               the single origin replaced
    N(X=Xnew, Z=Z)  = ... origins replaced by name

A node reached by two paths is computed once per call.

>>> import numpy as np, gpunets as gn
>>> a = gn.source(np.arange(3.0), name="a")
>>> b = 2 * a + 1
>>> b
<Node add(mul(2, a), 1)>
>>> b()
array([1., 3., 5.])
>>> b(np.ones(2))
array([3., 3.])
"""

from __future__ import annotations

import itertools
import operator
import random
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from gpunets.base import verbs
from gpunets.core.fitted_machine import MACHINE_VALUE
from gpunets.devices.data import check_placeable
from gpunets.devices.placement import Device, current_placement

if TYPE_CHECKING:  # pragma: no cover
    from gpunets.api.report import FitReport
    from gpunets.core.machines import Machine

__all__ = ["AbstractNode", "Source", "Node", "source", "node", "is_node"]

# Unique across processes (a random base), so that identities never collide.  A copy (``copy.deepcopy``,
# ``pickle``) is a new node with a new identity: it must never be mistaken for its original in one graph.
_uids = itertools.count(random.getrandbits(40) << 22)

# Sources rebuilt by ``gn.load`` without their training data (never saved): errors say so, and how to rebind.
_DATA_NOT_SAVED: weakref.WeakSet[Source] = weakref.WeakSet()


def mark_data_not_saved(s: Source) -> None:
    """Record that ``s`` was loaded by :func:`gpunets.load`, which never restores training data."""
    _DATA_NOT_SAVED.add(s)


def data_not_saved(s: Source) -> bool:
    """Whether ``s`` came from :func:`gpunets.load` and has been given no data since."""
    return s in _DATA_NOT_SAVED


#: Keywords of ``node(...)`` calls; a source cannot take one as its name.
CALL_KEYWORDS = ("rows", "executor", "workers", "output", "keep_training", "trace", "graphs")


def is_node(x: object) -> bool:
    """True for a :class:`Source` or :class:`Node`."""
    return isinstance(x, AbstractNode)


class AbstractNode:
    """What sources and nodes share: calling, fitting, arithmetic, display."""

    __array_ufunc__ = None  # so that ``np.float64(2) * node`` defers to Node.__rmul__
    __slots__ = ("_uid", "name", "__weakref__")
    _uid: int
    name: str | None

    def __setstate__(self, state: Any) -> None:
        """Restore a copy (deepcopy, unpickling) under a new identity."""
        d, slots = state if isinstance(state, tuple) else (state, None)
        for k, v in {**(d or {}), **(slots or {})}.items():
            object.__setattr__(self, k, v)
        self._uid = next(_uids)

    # --- graph -------------------------------------------------------------------
    @property
    def args(self) -> tuple[Any, ...]:
        return ()

    @property
    def origins(self) -> tuple[Source, ...]:
        """The sources reached through operation edges (not training edges), in order."""
        return verbs.get("origins")(self)   # graph.py builds on these classes: no import back

    @property
    def sources(self) -> tuple[Source, ...]:
        """Every source upstream, through operation and training edges."""
        return verbs.get("all_sources")([self])

    @property
    def machines(self) -> tuple[Machine, ...]:
        """Every machine upstream, dependencies first."""
        return verbs.get("upstream_machines")([self])

    # --- calling and fitting ----------------------------------------------------------
    def __call__(self, *data: Any, rows: Any = None, executor: Any = None, workers: int | None = None,
                 output: str | None = None, keep_training: Sequence[str] = (), graphs: bool | str | None = None,
                 **named: Any) -> Any:
        """Evaluate the node: ``n()``, ``n(rows=r)``, ``n(Xnew)`` or ``n(X=Xnew)``.

        Parameters
        ----------
        *data : array-like, optional
            New data for the node's single origin.
        rows : index, slice or mask, optional
            Evaluate on these rows of the sources' data.
        executor, workers : optional
            Where tasks run (see :func:`gpunets.fit`); default from :func:`gpunets.base.config`.
        output : {"auto", "device", "numpy", "pandas"}, optional
            Default ``gn.get_config()["output"]`` (``"auto"``): values on the device and in the
            array/frame family of the data given (a frame an operation returns comes back as a
            pandas frame for pandas input; an array stays an array); ``"device"`` where they were
            computed; ``"numpy"`` / ``"pandas"`` converted on the host.
        keep_training : sequence of str, optional
            Origins (by source name) that keep their own data when others are given new data;
            without it, new data for some origins and not others is an error.
        graphs : bool or "auto", optional
            Replay captured CUDA graphs when called again with inputs of the same shapes (default
            ``gn.get_config()["graphs"]``; ``"auto"``: where earlier calls were measured host-bound;
            docs/devices.md, "Graph mode").
        **named : array-like
            New data for origins, by source name.
        """
        return verbs.get("evaluate")(self, *data, rows=rows, executor=executor, workers=workers, output=output,
                                     keep_training=keep_training, graphs=graphs, **named)

    def fit(self, *data: Any, rows: Any = None, force: bool = False, executor: Any = None,
            workers: int | None = None, device: Any = None, progress: bool | None = None) -> FitReport:
        """Train every machine upstream of this node on its sources' data; see :func:`gpunets.fit`.

        Takes no data (``node.fit(X, y)`` raises a ``TypeError`` that says where data goes).
        """
        verbs.get("reject_fit_data")(self, data)
        return verbs.get("fit")(self, rows=rows, force=force, executor=executor, workers=workers, device=device,
                                progress=progress)

    # --- arithmetic builds nodes ------------------------------------------------------
    def __add__(self, other: Any) -> Node:
        return Node(operator.add, (self, other))

    def __radd__(self, other: Any) -> Node:
        return Node(operator.add, (other, self))

    def __sub__(self, other: Any) -> Node:
        return Node(operator.sub, (self, other))

    def __rsub__(self, other: Any) -> Node:
        return Node(operator.sub, (other, self))

    def __mul__(self, other: Any) -> Node:
        return Node(operator.mul, (self, other))

    def __rmul__(self, other: Any) -> Node:
        return Node(operator.mul, (other, self))

    def __truediv__(self, other: Any) -> Node:
        return Node(operator.truediv, (self, other))

    def __rtruediv__(self, other: Any) -> Node:
        return Node(operator.truediv, (other, self))

    def __pow__(self, other: Any) -> Node:
        return Node(operator.pow, (self, other))

    def __matmul__(self, other: Any) -> Node:
        return Node(operator.matmul, (self, other))

    def __neg__(self) -> Node:
        return Node(operator.neg, (self,))

    def __abs__(self) -> Node:
        return Node(operator.abs, (self,))

    def __getitem__(self, key: Any) -> Node:
        return Node(operator.getitem, (self, key))

    def __bool__(self) -> bool:
        return True

    def __iter__(self):
        msg = (f"{self!r} is a node, not data: it cannot be iterated. "
               "Call it (node()) to get its value, or build nodes with gn.node(fn, ...).")
        raise TypeError(msg)

    # --- display --------------------------------------------------------------------
    def _short(self, depth: int = 0) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._short()}>"

    def to_dot(self) -> str:
        """Graphviz source of the network upstream of this node.

        >>> import gpunets as gn
        >>> print(gn.source(name="X").to_dot().splitlines()[0])
        digraph gpunets {
        """
        return verbs.get("to_dot")([self])

    def _repr_svg_(self) -> str:
        return verbs.get("repr_svg")([self])

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        """Jupyter shows the graph as SVG (Graphviz where ``dot`` exists, else a pure-Python layout)."""
        return verbs.get("mimebundle")([self], text=repr(self))


class Source(AbstractNode):
    """A source of data: the leaves of a network.

    Setting ``source.data`` replaces the data; machines trained on the old
    data retrain on the next ``fit``.

    >>> import gpunets as gn
    >>> s = gn.source([[1.0, 2.0]], name="X")
    Traceback (most recent call last):
    ...
    TypeError: source 'X': data of type list cannot be placed; ...
    """

    __slots__ = ("_data", "_version")

    def __init__(self, data: Any = None, name: str | None = None) -> None:
        if name is not None and not isinstance(name, str):
            msg = f"source name must be a string, got {name!r} of type {type(name).__name__}."
            raise TypeError(msg)
        if name in CALL_KEYWORDS:
            msg = (f"source name {name!r} is a keyword of node calls ({', '.join(CALL_KEYWORDS)}), so new data "
                   f"could never be passed for it by name (node({name}=...)). Choose another name, e.g. "
                   f"{name + '_data'!r}.")
            raise ValueError(msg)
        self._uid = next(_uids)
        self.name = name
        self._version = 0
        self._data = None
        if data is not None:
            self.data = data

    @property
    def data(self) -> Any:
        return self._data

    @data.setter
    def data(self, value: Any) -> None:
        if value is not None:
            _check_data(value, what=f"source {self.label!r}")
            _DATA_NOT_SAVED.discard(self)
        self._data = value
        self._version += 1

    @property
    def label(self) -> str:
        return self.name if self.name is not None else "source"

    @property
    def origins(self) -> tuple[Source, ...]:
        return (self,)

    def _short(self, depth: int = 0) -> str:
        return self.label

    def __repr__(self) -> str:
        d = self._data
        if d is None:
            what = "no data"
        else:
            shape = getattr(d, "shape", None)
            what = f"{type(d).__name__}{tuple(shape) if shape is not None else ''}"
        return f"<Source {self.label}: {what}>"


class Node(AbstractNode):
    """An operation applied to the values of its arguments.

    Use :func:`node`, machine operations (``mach.predict(X)``) or arithmetic
    on nodes rather than this constructor.
    """

    __slots__ = ("operation", "machine", "_args", "device", "_cost")

    def __init__(self, operation: Callable[..., Any] | str, args: Sequence[Any], machine: Machine | None = None,
                 name: str | None = None, device: Any = None) -> None:
        if machine is None and not callable(operation):
            msg = f"gn.node needs a callable as its operation, got {operation!r} of type {type(operation).__name__}."
            raise TypeError(msg)
        self._uid = next(_uids)
        self.operation = operation
        self.machine = machine
        self._args = tuple(args)
        self.name = name
        if device is None:
            device = current_placement()
        elif device != "auto":
            device = Device.parse(device)
        self.device = device

    @property
    def args(self) -> tuple[Any, ...]:
        return self._args

    @property
    def op_name(self) -> str:
        if self.machine is not None:
            return str(self.operation)
        op = self.operation
        return getattr(op, "__name__", None) or type(op).__name__

    def _short(self, depth: int = 0) -> str:
        if self.name is not None and depth > 0:
            return self.name
        if depth >= 3:
            return "…"
        parts = [self.machine.label] if self.machine is not None else []
        parts += [a._short(depth + 1) if is_node(a) else _const_repr(a) for a in self._args]
        head = self.name if (self.name is not None and depth == 0) else self.op_name
        return f"{head}({', '.join(parts)})"


def _const_repr(x: Any) -> str:
    if isinstance(x, (int, float, str, bool)) or x is None:
        r = repr(x)
    elif hasattr(x, "shape"):
        r = f"{type(x).__name__}{tuple(x.shape)}"
    else:
        r = type(x).__name__
    return r if len(r) <= 20 else r[:17] + "..."


def _check_data(value: Any, *, what: str) -> None:
    check_placeable(value, what=what, device="cpu")


def source(data: Any = None, name: str | None = None) -> Source:
    """Wrap data as a source node.

    Parameters
    ----------
    data : array-like, optional
        NumPy array, pandas DataFrame/Series, CuPy array or cuDF object. May be
        set later with ``s.data = ...``.
    name : str, optional
        The keyword used to pass new data: ``node(X=Xnew)``.

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> X = gn.source(np.zeros((4, 2)), name="X")
    >>> X
    <Source X: ndarray(4, 2)>
    >>> X(rows=[0, 1]).shape
    (2, 2)
    """
    return Source(data, name=name)


def node(fn: Callable[..., Any], *args: Any, name: str | None = None, device: Any = None) -> Node:
    """A node that applies ``fn`` to the values of ``args`` (nodes, machines or constants).

    A machine among ``args`` is a dependency (MLJ's ``node(f, mach)``): fitting the node trains
    it, and ``fn`` receives a :class:`~gpunets.core.fitted_machine.FittedMachine`, a snapshot of its
    fitted state (``.fitted_params()``, ``.report()``, ``.estimator_``), on every executor.

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> X = gn.source(np.array([[1.0, 2.0], [3.0, 4.0]]), name="X")
    >>> total = gn.node(np.sum, X, name="total")
    >>> total
    <Node total(X)>
    >>> float(total())
    10.0
    """
    # a machine (machines.py builds on this module, so it is recognised by its class's marker, not imported)
    args = tuple(Node(MACHINE_VALUE, (), machine=a, device=a.device) if getattr(type(a), "_gn_is_machine", False)
                 else a for a in args)
    return Node(fn, args, name=name, device=device)


def as_node(x: Any, *, what: str, position: int | None = None) -> AbstractNode:
    """Return ``x`` if it is a node, else wrap data in a source; reject anything else."""
    if is_node(x):
        return x
    names = ("X", "y", "sample_weight")
    name = names[position] if position is not None and position < len(names) else None
    return Source(x, name=name)


def iter_nodes(values: Iterable[Any]) -> Iterable[AbstractNode]:
    return (v for v in values if is_node(v))

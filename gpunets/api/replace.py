"""``gn.replace``: a copy of a network with some models, machines or sources replaced (MLJ's ``replace``).

The network upstream of the target (through operation and training edges) is
rebuilt with the replacements given as ``{old: new}``:

* ``source -> source`` (or ``source -> data``, wrapped in a new source of the
  same name): the copy reads the new source;
* ``machine -> machine``: the copy uses the given machine as it is (its own
  training arguments, its fitted state if it has one);
* ``model -> model``: every machine of that model is replaced by a new,
  untrained machine of the new model on the (copied) same training arguments.

What no replacement reaches is *unchanged*; ``copy_unchanged`` says what the
copy does with it:

* ``False`` (default): shared.  Unchanged sources, machines and nodes are the
  original objects, so the copy reuses their training (fitting it trains only
  what the replacements changed) and a change to a shared model shows in both
  networks.  A machine downstream of a replacement is new and untrained, with
  the original's model object.
* ``True``: copied deeply (MLJ's ``copy_unspecified_deeply=true``).  Every
  source, machine and model of the copy is a new object; unchanged machines keep
  a copy of their fitted state (a fit skips them as it would the originals),
  machines downstream of a replacement are new and untrained.  Nothing is shared
  with the original but the operations (functions) and constants of its nodes.

New machines are never frozen; their ``name``, ``device``, ``warm`` and ``cache`` settings and their keyword
training arguments (``sample_weight=w``) are the originals'.

>>> import numpy as np, gpunets as gn
>>> from sklearn.linear_model import Ridge
>>> X, y = gn.source(np.eye(3), name="X"), gn.source(np.arange(3.0), name="y")
>>> model = Ridge(alpha=1.0)
>>> yhat = gn.machine(model, X, y).predict(X)
>>> _ = yhat.fit()
>>> yhat2 = gn.replace(yhat, {model: Ridge(alpha=10.0)})
>>> yhat2.fit().actions.by_label()
{'Ridge': 'train'}
>>> bool(yhat2()[2] < yhat()[2])
True
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from gpunets.core.graph import all_nodes
from gpunets.core.machines import Machine, params_equal, snapshot_params
from gpunets.core.nodes import AbstractNode, Node, Source, is_node

__all__ = ["replace"]


def _describe(x: Any) -> str:
    if isinstance(x, Machine):
        return f"machine {x.label}"
    if isinstance(x, Source):
        return f"source {x.label!r}"
    if is_node(x):
        return f"node {x._short()}"
    return f"{x!r} of type {type(x).__name__}"


def _pairs(mapping: Any) -> list[tuple[Any, Any]]:
    if isinstance(mapping, Mapping):
        return list(mapping.items())
    if isinstance(mapping, Iterable) and not isinstance(mapping, (str, bytes)):
        pairs = list(mapping)
        if all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
            return pairs
    msg = (f"gn.replace: replacements must be a dict {{old: new}} (or a list of (old, new) pairs, for models that "
           f"cannot be dict keys); got {mapping!r} of type {type(mapping).__name__}. Hint: "
           "gn.replace(node, {old_model: new_model, X: gn.source(X_new, name='X')}).")
    raise TypeError(msg)


def _targets(target: Any) -> tuple[list[AbstractNode], Any]:
    """The nodes to copy and how to shape the answer like ``target``."""
    if is_node(target):
        return [target], None
    if isinstance(target, Mapping) and target and all(is_node(v) for v in target.values()):
        return list(target.values()), list(target)
    if isinstance(target, (list, tuple)) and target and all(is_node(v) for v in target):
        return list(target), type(target)
    msg = (f"gn.replace needs a node (or a non-empty list, tuple or dict of nodes) to copy the network upstream "
           f"of; got {target!r} of type {type(target).__name__}. Hint: pass the network's output node, e.g. "
           "gn.replace(yhat, {...}).")
    raise TypeError(msg)


class _Replacements:
    """The replacements sorted by kind, each checked against the network (before anything is built)."""

    def __init__(self, pairs: list[tuple[Any, Any]], nodes: list[AbstractNode]) -> None:
        sources = {n._uid: n for n in nodes if isinstance(n, Source)}
        machines: dict[int, Machine] = {}
        for n in nodes:
            m = getattr(n, "machine", None)
            if m is not None:
                machines.setdefault(m._uid, m)
        models = {id(m.model): m.model for m in machines.values()}
        self.sources: dict[int, Source] = {}
        self.machines: dict[int, Machine] = {}
        self.models: dict[int, Any] = {}
        unknown: list[str] = []
        for old, new in pairs:
            if isinstance(old, Source):
                if old._uid not in sources:
                    unknown.append(_describe(old))
                    continue
                self.sources[old._uid] = self._new_source(old, new)
            elif isinstance(old, Machine):
                if old._uid not in machines:
                    unknown.append(_describe(old))
                    continue
                if not isinstance(new, Machine):
                    msg = (f"gn.replace: {_describe(old)} must be replaced by a machine; got {_describe(new)}. "
                           f"Hint: gn.machine(new_model, *training_nodes), or replace its model instead: "
                           f"{{old_model: new_model}}.")
                    raise TypeError(msg)
                self.machines[old._uid] = new
            elif is_node(old):
                msg = (f"gn.replace: {_describe(old)} cannot be replaced: only sources, machines and models can. "
                       "Hint: replace the source, machine or model it is built from.")
                raise TypeError(msg)
            elif id(old) in models:
                if isinstance(new, type) or not callable(getattr(new, "fit", None)):
                    msg = (f"gn.replace: the model {type(old).__name__} must be replaced by a model (an object "
                           f"with a fit method); got {_describe(new)}."
                           + (" It is a class: pass an instance." if isinstance(new, type) else ""))
                    raise TypeError(msg)
                self.models[id(old)] = new
            else:
                unknown.append(_describe(old))
        if unknown:
            have = ([_describe(s) for s in sources.values()] + [_describe(m) for m in machines.values()]
                    + [f"model {type(v).__name__}" for v in models.values()])
            msg = (f"gn.replace: not in the network upstream of the target, so they cannot be replaced: "
                   f"{'; '.join(unknown)}. What can be: {'; '.join(have)}. Hint: pass the objects themselves "
                   "(by identity), e.g. the model object given to gn.machine, not an equal one.")
            raise ValueError(msg)

    @staticmethod
    def _new_source(old: Source, new: Any) -> Source:
        if isinstance(new, Source):
            return new
        if isinstance(new, (Machine, AbstractNode)) or new is None:
            msg = (f"gn.replace: {_describe(old)} must be replaced by a source or by data; got {_describe(new)}. "
                   f"Hint: gn.source(data, name={old.name!r}).")
            raise TypeError(msg)
        return Source(new, name=old.name)   # checks the data (a TypeError naming the source)


def replace(target: Any, replacements: Any, *, copy_unchanged: bool = False) -> Any:
    """A copy of the network upstream of ``target`` with some sources, machines or models replaced.

    Parameters
    ----------
    target : Node, or list, tuple or dict of nodes
        The network's output(s); the answer has the same shape (the copies of these nodes).
    replacements : dict or list of (old, new) pairs
        ``{old_source: new_source_or_data, old_machine: new_machine, old_model: new_model}``; keys are
        matched by identity.
    copy_unchanged : bool
        ``False`` (default): what no replacement reaches is shared with the original network
        (same sources, machines, nodes: their training is reused).  ``True``: copied deeply
        (new sources with copied data, new machines with copied models and fitted states).

    Returns
    -------
    Node (or list, tuple, dict of nodes)
        The copy of ``target``.

    Raises
    ------
    TypeError
        ``target``, ``replacements`` or ``copy_unchanged`` of the wrong type, or a replacement of the
        wrong kind (a machine by a model...).
    ValueError
        Keys that are not in the network upstream of ``target`` (named in the message).

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> from sklearn.preprocessing import StandardScaler
    >>> X = gn.source(np.array([[0.0], [2.0]]), name="X")
    >>> W = gn.machine(StandardScaler(), X).transform(X)
    >>> W2 = gn.replace(W, {X: np.array([[0.0], [4.0], [8.0]])})
    >>> _ = W2.fit()
    >>> W2().ravel().round(3).tolist()
    [-1.225, 0.0, 1.225]
    >>> gn.replace(W, {StandardScaler(): StandardScaler()})
    Traceback (most recent call last):
    ...
    ValueError: gn.replace: not in the network upstream of the target, so they cannot be replaced: StandardScaler() ...
    """
    if not isinstance(copy_unchanged, bool):
        msg = (f"gn.replace: copy_unchanged must be True (copy what no replacement reaches) or False (share it); "
               f"got {copy_unchanged!r} of type {type(copy_unchanged).__name__}.")
        raise TypeError(msg)
    targets, shape = _targets(target)
    nodes = all_nodes(targets)
    r = _Replacements(_pairs(replacements), nodes)
    new = _Copier(r, copy_unchanged).run(nodes)
    copies = [new[t._uid] for t in targets]
    if shape is None:
        return copies[0]
    if isinstance(shape, list):
        return dict(zip(shape, copies))
    return shape(copies)


class _Copier:
    """Rebuilds nodes dependencies first; ``changed`` holds the uids of what a replacement reaches."""

    def __init__(self, r: _Replacements, deep: bool) -> None:
        self.r, self.deep = r, deep
        self.nodes: dict[int, AbstractNode] = {}
        self.machines: dict[int, Machine] = {}
        self.changed: set[int] = set()
        self.memo: dict[int, Any] = {}      # deepcopy memo: one copy of a model shared by two machines

    def run(self, nodes: list[AbstractNode]) -> dict[int, AbstractNode]:
        for n in nodes:    # dependencies first (training arguments before the machine's nodes)
            self.nodes[n._uid] = self._source(n) if isinstance(n, Source) else self._node(n)  # type: ignore[arg-type]
        return self.nodes

    def _source(self, s: Source) -> Source:
        if s._uid in self.r.sources:
            self.changed.add(s._uid)
            return self.r.sources[s._uid]
        # a deep copy keeps the source's version, so the stamps of the machines trained on it still match
        return copy.deepcopy(s, self.memo) if self.deep else s

    def _node(self, n: Node) -> AbstractNode:
        m = n.machine
        nm = self._machine(m) if m is not None else None
        reached = (m is not None and m._uid in self.changed) or any(
            is_node(a) and a._uid in self.changed for a in n.args)
        if reached:
            self.changed.add(n._uid)
        elif not self.deep:
            return n
        args = [self.nodes[a._uid] if is_node(a) else a for a in n.args]
        new = Node(n.operation, args, machine=nm, name=n.name, device="auto")
        new.device = n.device
        return new

    def _machine(self, m: Machine) -> Machine:
        done = self.machines.get(m._uid)
        if done is not None:
            return done
        r = self.r
        if m._uid in r.machines:
            self.changed.add(m._uid)
            nm = r.machines[m._uid]
        else:
            args = [self.nodes[a._uid] for a in m.args]
            replaced = id(m.model) in r.models
            if replaced or any(a._uid in self.changed for a in m.args):
                self.changed.add(m._uid)
                model = r.models[id(m.model)] if replaced else (
                    copy.deepcopy(m.model, self.memo) if self.deep else m.model)
                # the original's training arguments as it had them (keywords such as sample_weight= stay
                # keywords) and its settings (warm updates, output cache)
                k = len(args) - len(m.fit_keywords)
                nm = Machine(model, *args[:k], device="auto", name=m.name, warm=m.warm, cache=m.cache,
                             **dict(zip(m.fit_keywords, args[k:])))
                nm.device = m.device
            elif self.deep:
                nm = self._copy_machine(m, args)
            else:
                nm = m
        self.machines[m._uid] = nm
        return nm

    def _copy_machine(self, m: Machine, args: list[AbstractNode]) -> Machine:
        """An unchanged machine copied deeply: same training (a copy of its state), new objects."""
        nm = copy.copy(m)    # a new identity (Machine.__setstate__); args, model and state replaced below
        nm.args = tuple(args)
        nm.model = copy.deepcopy(m.model, self.memo)
        st = m._state
        if st is not None:
            parents = tuple((self.machines.get(p._uid, p), v) for p, v in st.parents)
            # nested models are compared by identity: a copy in step with its state gets its own snapshot
            params = snapshot_params(nm.model) if params_equal(st.params, snapshot_params(m.model)) else st.params
            nm._state = dataclasses.replace(st, stored=copy.deepcopy(st.estimator, self.memo), parents=parents,
                                            params=params)
        return nm

"""Machines: a model bound to its training arguments.

A machine never fits the model object it was given: ``mach.model`` stays the
hyperparameter specification that users change (``mach.model.alpha = 2`` or
``mach.model.set_params(...)``); each training fits a fresh
:func:`sklearn.base.clone` of it, kept at ``mach.estimator_`` once the fit has
succeeded.  A failed fit leaves the previous state untouched.

Retraining rules (MLJ's ``fit_only!``), applied by :func:`gpunets.fit` to each
machine upstream of the target, dependencies first:

1. a frozen machine (``freeze()``) always skips;
2. an untrained machine, ``force=True``, ``rows`` different from its last fit,
   new data in an upstream source (replaced, or changed in place: compared
   by :mod:`fingerprint <gpunets.devices.fingerprint>`), or an upstream machine that retrained
   (in this call or since this machine's last fit) → ``"train"``;
3. its own model's hyperparameters changed since its last fit (nested
   estimators' parameters included) → ``"update"``: a fresh clone with the new
   hyperparameters; or ``"update (warm)"`` when the change is only the growth of
   iteration-like hyperparameters (``gn.config(warm_params=...)``) and the
   machine can continue from its fitted state (``warm=``, below);
4. otherwise → ``"skip"``.

Warm updates (MLJ's ``update``): with ``warm="auto"`` (the default) a machine
whose estimator has ``warm_start=True`` continues from its fitted state when
only an iteration-like hyperparameter grew (``n_estimators`` 100 → 200 fits
100 more trees); with ``warm="partial_fit"`` it calls ``partial_fit`` once per
unit of growth (``max_iter`` 5 → 8: three more passes).  The continuation
works on a deep copy of the fitted estimator, never on the committed state.

A machine with no training arguments (``machine(FunctionTransformer(f))``) is
*static*: it never trains, its "fit" only takes a copy of the model
(action ``"static"``), and its operations apply to the data they are called on.

>>> import numpy as np, gpunets as gn
>>> from sklearn.linear_model import Ridge
>>> X, y = np.arange(8.0).reshape(4, 2), np.arange(4.0)
>>> mach = gn.machine(Ridge(), X, y)
>>> mach
<Machine Ridge(X, y)>
>>> dict(mach.fit().actions) == {mach: "train"}
True
>>> mach.model.alpha = 2.0
>>> mach.fit().actions[mach], mach.fit().actions[mach]
('update', 'skip')
"""

from __future__ import annotations

import copy
import itertools
import numbers
import random
from dataclasses import dataclass, field
from typing import Any

from gpunets.base import verbs
from gpunets.base.config import get_config
from gpunets.base.exceptions import NotFittedError
from gpunets.compute.estimators import apply_estimator, fresh_estimator
from gpunets.core.fitted_machine import learned_attributes
from gpunets.core.graph import Upstream
from gpunets.core.nodes import AbstractNode, Node, Source, as_node
from gpunets.core.params import (
    WARM_MODES,
    _check_argument,
    _check_warm,
    _equal,
    _same_rows,
    labels,
    params_equal,
    snapshot_params,
)
from gpunets.core.weights import keyword_nodes
from gpunets.devices.fingerprint import fingerprint
from gpunets.devices.placement import Device, current_placement

__all__ = ["Machine", "machine", "labels", "OPERATIONS", "WARM_UPDATE", "STATIC", "WARM_MODES", "RemoteEstimator"]

#: How many past fit actions a machine's report keeps (``n_fits`` counts them all).
HISTORY_LENGTH = 100

OPERATIONS = ("predict", "predict_proba", "predict_log_proba", "decision_function", "transform",
              "inverse_transform", "fit_transform", "score")

#: The action of a machine that continues from its fitted state (warm_start or partial_fit).
WARM_UPDATE = "update (warm)"
#: The action of a static machine (no training arguments) taking a copy of its model.
STATIC = "static"

# Unique across processes (a random base), so that identities never collide; a copy gets a new one.
_uids = itertools.count(random.getrandbits(40) << 22)


@dataclass(frozen=True)
class PendingFit:
    """A fit decided at plan time: the fresh estimator and the state it will commit."""

    machine: Machine
    action: str
    estimator: Any
    params: dict[str, Any]
    rows_key: Any
    upstream: bytes
    parents: tuple[tuple[Machine, int], ...] = ()   # nearest upstream machines and their versions after this fit
    warm: tuple[str, int] | None = None   # a warm update: (method, times), e.g. ("partial_fit", 3)
    key: bytes | None = None              # its store key (gpunets.planning.stored), when a store is in force


class RemoteEstimator:
    """A fitted estimator held elsewhere (on a Dask worker), fetched to the client only when asked for.

    An executor that keeps fitted states where they were fitted commits one of these instead of the
    estimator: :attr:`FittedState.estimator` calls :meth:`gather` (once, thread-safe), and what a report
    needs without the estimator comes from :meth:`peek`.  Pickling it pickles the gathered estimator.
    """

    #: True once the state was lost (its worker died and no copy was left): the machine retrains on its next fit
    lost: bool = False

    def gather(self) -> Any:  # pragma: no cover - the executors' subclasses implement it
        """The fitted estimator, fetched to this process (once)."""
        raise NotImplementedError

    def peek(self, name: str, default: Any = None) -> Any:
        """A small attribute known without fetching the estimator (``report_``, ``fit_report_``), else fetched."""
        return getattr(self.gather(), name, default)

    def release(self) -> None:
        """Drop the remote copy (the machine retrained); a copy already fetched stays usable."""

    def __reduce__(self) -> Any:
        return _identity, (self.gather(),)


def _identity(x: Any) -> Any:
    return x


@dataclass(frozen=True)
class FittedState:
    """Everything a successful fit leaves behind; replaced as a whole, never mutated.

    ``stored`` is the fitted estimator, or a :class:`RemoteEstimator` when an executor left it on the
    worker that fitted it; :attr:`estimator` fetches that on first use.
    """

    stored: Any
    params: dict[str, Any]
    rows: Any
    upstream: bytes                  # digest of the upstream machines' versions and sources' versions and contents
    version: int
    action: str
    seconds: float
    device: str = "cpu"
    path: str = "sklearn"
    n_rows: int | None = None
    history: tuple[str, ...] = field(default=())
    # the nearest upstream machines (by object, so a copied network's states name the copies) and the
    # versions this state was trained on: what a call checks so that it never mixes two fits' states
    parents: tuple[tuple[Machine, int], ...] = field(default=())
    asked: str = "auto"              # the placement asked for when it was fitted (its own, a block's, the config's)
    key: bytes | None = None         # the store key it was fitted (or loaded) under (gpunets.planning.stored)
    # its transform of its training input gives its fit_transform's output bit for bit (checked when it was
    # fitted, for the estimators where they may differ: gpunets.planning.outputs)
    same_output: bool = False

    @property
    def estimator(self) -> Any:
        """The fitted estimator (fetched from the worker that holds it, the first time, if remote)."""
        e = self.stored
        return e.gather() if isinstance(e, RemoteEstimator) else e

    @property
    def is_remote(self) -> bool:
        return isinstance(self.stored, RemoteEstimator)

    def peek(self, name: str, default: Any = None) -> Any:
        """An attribute of the fitted estimator; a remote one answers the small ones without being fetched."""
        e = self.stored
        return e.peek(name, default) if isinstance(e, RemoteEstimator) else getattr(e, name, default)


class Machine:
    """A model bound to its training arguments (nodes).

    Parameters
    ----------
    model : estimator
        Anything with a ``fit`` method, usually a scikit-learn or cuML estimator.
    *args : nodes or data
        Training arguments, passed to ``fit`` positionally (``X``, ``y``, ...).
        Raw data is wrapped in a source.
    device : str, optional
        Where the machine trains and predicts (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
    name : str, optional
        A label for reports (default: the model's class name).
    warm : {"auto", False, "partial_fit"}, default "auto"
        How an update whose only change is grown iteration-like hyperparameters (``gn.config(warm_params=...)``)
        runs: ``"auto"`` continues from the fitted state when the estimator has ``warm_start=True``;
        ``"partial_fit"`` calls ``partial_fit`` once per unit of growth on a copy of the fitted estimator;
        ``False`` always refits a fresh clone.
    cache : bool, optional
        Keep the outputs of this machine's operations on the training data, so a refit that
        needs them again does not recompute them (default: ``gn.get_config()["cache"]``);
        see :mod:`gpunets.devices.cache`.
    **fit_keywords : nodes or data
        Training arguments passed to ``fit`` by name (``sample_weight=w``).
    """

    #: names of the trailing ``args`` that ``fit`` takes as keywords (``sample_weight=w``); see :mod:`gpunets.core.weights`
    fit_keywords: tuple[str, ...] = ()
    #: how :func:`gpunets.core.nodes.node` recognises a machine argument without importing this module
    _gn_is_machine = True

    def __init__(self, model: Any, *args: Any, device: Any = None, name: str | None = None,
                 warm: Any = "auto", cache: bool | None = None, **fit_keywords: Any) -> None:
        if isinstance(model, type) or not callable(getattr(model, "fit", None)):
            hint = (" It is a class: pass an instance, e.g. machine(Ridge(), X, y)."
                    if isinstance(model, type) else "")
            msg = (f"machine() needs a model with a fit method (a scikit-learn-style estimator); "
                   f"got {model!r} of type {type(model).__name__}.{hint}")
            raise TypeError(msg)
        _check_warm(model, warm, bool(args))
        if cache is not None and not isinstance(cache, bool):
            msg = (f"machine({type(model).__name__}, ...): cache={cache!r} must be True, False or None "
                   "(None: the setting gn.set_config(cache=...)).")
            raise TypeError(msg)
        nodes = []
        for i, a in enumerate(args):
            _check_argument(a, f"argument {i} of machine({type(model).__name__}, ...)")
            nodes.append(as_node(a, what=f"argument {i} of machine {type(model).__name__}", position=i))
        keywords = keyword_nodes(model, fit_keywords)   # None values left out
        nodes.extend(keywords.values())
        self._uid = next(_uids)
        self.model = model
        self.args: tuple[AbstractNode, ...] = tuple(nodes)
        self.fit_keywords = tuple(keywords)
        self.name = name
        if device is None:
            device = current_placement()
        elif device != "auto":
            device = Device.parse(device)
        self.device = device
        self.frozen = False
        self.warm = warm
        self.cache = cache
        self._state: FittedState | None = None
        self._version = 0
        self.n_fits = 0

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore a copy (deepcopy, unpickling) under a new identity.

        Fitted states name their upstream machines and sources by object, so a
        copied network's states point at the copied upstream objects.
        """
        self.__dict__.update(state)
        self._uid = next(_uids)

    # --- identity & display --------------------------------------------------------------
    @property
    def label(self) -> str:
        return self.name or type(self.model).__name__

    def __repr__(self) -> str:
        k = len(self.args) - len(self.fit_keywords)
        args = ", ".join([a._short(1) for a in self.args[:k]]
                         + [f"{n}={a._short(1)}" for n, a in zip(self.fit_keywords, self.args[k:])])
        return f"<Machine {self.label}({args})>"

    def _repr_html_(self) -> str:
        from html import escape

        st = self._state
        state = "not trained" if st is None else f"trained ({st.action}, {st.device}, {st.n_rows} rows)"
        frozen = ", frozen" if self.frozen else ""
        return (f"<p><b>Machine {escape(self.label)}</b>: {escape(repr(self.model))}; {state}{frozen}</p>"
                + verbs.get("repr_html")(list(self.args)))

    @property
    def static(self) -> bool:
        """A machine with no training arguments: it never trains (see :func:`machine`)."""
        return not self.args

    # --- operations return nodes ---------------------------------------------------------
    def _operation(self, op: str, *args: Any, name: str | None = None) -> Node:
        if not callable(getattr(self.model, op, None)):
            msg = (f"{self.label} has no method {op!r}, so machine.{op}(...) cannot be built. "
                   f"Operations it offers: {[o for o in OPERATIONS if callable(getattr(self.model, o, None))]}.")
            raise AttributeError(msg)
        if not args and self.static:
            msg = (f"Machine {self.label} is static (no training arguments), so {op}() has no default input: "
                   f"pass the data it applies to, e.g. mach.{op}(X) with X a source or a node.")
            raise TypeError(msg)
        if not args:
            args = self.args[:1]
        for i, a in enumerate(args):
            _check_argument(a, f"argument {i} of {self.label}.{op}(...)")
        nodes = [as_node(a, what=f"argument {i} of {self.label}.{op}", position=i) for i, a in enumerate(args)]
        return Node(op, nodes, machine=self, name=name, device=self.device)

    def predict(self, X: Any = None, **kw: Any) -> Node:
        """A node: ``estimator_.predict(X)``."""
        return self._operation("predict", *([X] if X is not None else []), **kw)

    def predict_proba(self, X: Any = None, **kw: Any) -> Node:
        """A node: ``estimator_.predict_proba(X)``."""
        return self._operation("predict_proba", *([X] if X is not None else []), **kw)

    def predict_log_proba(self, X: Any = None, **kw: Any) -> Node:
        """A node: ``estimator_.predict_log_proba(X)``."""
        return self._operation("predict_log_proba", *([X] if X is not None else []), **kw)

    def decision_function(self, X: Any = None, **kw: Any) -> Node:
        """A node: ``estimator_.decision_function(X)``."""
        return self._operation("decision_function", *([X] if X is not None else []), **kw)

    def transform(self, X: Any = None, **kw: Any) -> Node:
        """A node: ``estimator_.transform(X)``."""
        return self._operation("transform", *([X] if X is not None else []), **kw)

    def inverse_transform(self, X: Any = None, **kw: Any) -> Node:
        """A node: ``estimator_.inverse_transform(X)``."""
        return self._operation("inverse_transform", *([X] if X is not None else []), **kw)

    # --- state ---------------------------------------------------------------------------
    @property
    def is_fitted(self) -> bool:
        return self._state is not None

    @property
    def estimator_(self) -> Any:
        """The fitted clone of ``model``."""
        if self._state is None:
            raise NotFittedError(self._not_fitted_message())
        return self._state.estimator

    def _not_fitted_message(self) -> str:
        frozen = " It is frozen: thaw() it first." if self.frozen else ""
        return (f"Machine {self.label} is not trained yet, so its operations cannot be evaluated. "
                f"Call fit() on the node (or gn.fit(node)) first.{frozen}")

    def freeze(self) -> Machine:
        """Never retrain this machine (until :meth:`thaw`)."""
        self.frozen = True
        return self

    def thaw(self) -> Machine:
        """Undo :meth:`freeze`."""
        self.frozen = False
        return self

    def fit(self, *data: Any, rows: Any = None, force: bool = False, only: bool = False, **kw: Any) -> Any:
        """Train this machine and every machine upstream of it; see :func:`gpunets.fit`.

        With ``only=True`` train this machine alone (MLJ's ``fit_only!``): on the values its upstream
        machines compute with their current fitted states, retraining none of them; an upstream
        machine that is not fitted raises :class:`~gpunets.base.exceptions.NotFittedError` naming it.

        Takes no data (``mach.fit(X, y)`` raises a ``TypeError`` that says where data goes).
        """
        verbs.get("reject_fit_data")(self, data)
        if only is not False:   # passed on only when asked for: gn.fit(mach) stays as it was
            kw["only"] = only
        return verbs.get("fit")(self, rows=rows, force=force, **kw)

    # --- the retraining rule -------------------------------------------------------------
    def _upstream_versions(self, upstream: Any = None) -> bytes:
        """The digest of the current versions of the machines and sources this machine trains on.

        ``upstream`` is a :class:`gpunets.core.graph.Upstream` shared by a whole compile (memoised walks).
        Sources contribute their version and their data's fingerprint, so data changed in place is seen.
        """
        return (upstream if upstream is not None else Upstream()).stamp(self)

    def _decide(self, rows_key: Any, force: bool, upstream_changing: bool, upstream: Any = None) -> str:
        """What :func:`gpunets.fit` will do with this machine (rules in the module docstring)."""
        if self.frozen:
            return "skip"
        st = self._state
        if self.static:   # no data: rows and sources never matter (MLJ's Static)
            return STATIC if st is None or force or not params_equal(st.params, snapshot_params(self.model)) else "skip"
        if st is None or force or upstream_changing or not _same_rows(st.rows, rows_key) or _lost(st):
            return "train"
        if st.upstream != self._upstream_versions(upstream):
            return "train"
        params = snapshot_params(self.model)
        if not params_equal(st.params, params):
            return WARM_UPDATE if self._warm_steps(st, params) is not None else "update"
        return "skip"

    def _warm_steps(self, st: FittedState, params: dict[str, Any]) -> tuple[str, int] | None:
        """How ``st`` can continue to ``params`` (``("fit", 1)``, ``("partial_fit", k)``), or None: refit.

        Only when every changed hyperparameter is a top-level, iteration-like one
        (``gn.config(warm_params=...)``) whose integer value grew, and the machine's ``warm``
        mode applies: ``"auto"`` needs ``warm_start=True``, ``"partial_fit"`` a ``partial_fit``
        method.  Routes where another class was fitted (a cuML twin) and composites refit instead.
        """
        if (self.warm is False or st.path == "cuml" or type(st.estimator) is not type(self.model)
                or getattr(st.estimator, "_gn_incremental", False)):
            return None
        iteration = get_config()["warm_params"]
        changed = [k for k in set(st.params) | set(params)
                   if k not in st.params or k not in params or not _equal(st.params[k], params[k])]
        growth = 0
        for k in changed:
            old, new = st.params.get(k), params.get(k)
            if (k not in iteration or "__" in k or not isinstance(old, numbers.Integral) or not isinstance(new, numbers.Integral)
                    or isinstance(new, bool) or new <= old):
                return None
            growth = max(growth, int(new) - int(old))
        if self.warm == "partial_fit":
            if len(changed) != 1 or not callable(getattr(st.estimator, "partial_fit", None)):
                return None
            return ("partial_fit", growth)
        if params.get("warm_start") is not True:
            return None
        return ("fit", 1)

    def _prepare_fit(self, action: str, rows_key: Any, upstream: bytes,
                     parents: tuple[tuple[Machine, int], ...] = ()) -> PendingFit:
        """What a fit task needs, taken now (when the plan is compiled), so the task is pure.

        ``upstream`` is the digest of the versions the upstream machines will have once
        this plan's fits have committed (:meth:`gpunets.core.graph.Upstream.stamp`).
        """
        previous = self._state
        params = snapshot_params(self.model)
        warm = None
        if action == "update" and previous is not None and previous.peek("_gn_incremental", False):
            est = previous.estimator._gn_updated_copy(self.model)
        elif action == WARM_UPDATE and previous is not None and (warm := self._warm_steps(previous, params)):
            # a deep copy: the committed state is never trained further (atomic fits, safe concurrent calls)
            est = copy.deepcopy(previous.estimator)
            own = self.model.get_params(deep=False)
            est.set_params(**{k: own[k] for k in params if k in own and not _equal(previous.params.get(k), params[k])})
        else:
            if action == WARM_UPDATE:   # the state changed since the plan was decided: refit
                action = "update"
            est = fresh_estimator(self.model)
        return PendingFit(self, action, est, params, rows_key, upstream, parents, warm)

    def _commit(self, pending: PendingFit, est: Any, info: dict[str, Any]) -> None:
        """Install the result of a successful fit (called on the client, in the scheduler)."""
        previous = self._state
        hist = ((previous.history if previous else ()) + (pending.action,))[-HISTORY_LENGTH:]
        self._state = FittedState(est, pending.params, pending.rows_key, pending.upstream, self._version + 1,
                                  pending.action, info.get("seconds", 0.0), info.get("device", "cpu"),
                                  info.get("path", "sklearn"), info.get("n_rows"), hist, pending.parents,
                                  info.get("asked", "auto"), pending.key, bool(info.get("same_output", False)))
        self._version += 1
        self.n_fits += 1
        # a previous state kept remotely is released when the last reference to it goes (at once, unless a
        # call running in another thread still uses it: that call finishes with it)

    def _apply(self, op: str, values: tuple[Any, ...]) -> Any:
        if self._state is None:
            raise NotFittedError(self._not_fitted_message())
        return apply_estimator(self._state.estimator, op, values, self._state.path)

    # --- what it learned -----------------------------------------------------------------
    def fitted_params(self) -> dict[str, Any]:
        """The learned attributes of the fitted estimator (scikit-learn's trailing ``_``; a composite's
        components' under ``"components"``)."""
        return learned_attributes(self.estimator_)

    def report(self) -> dict[str, Any]:
        """What happened when this machine last trained: action, time, rows, device."""
        st = self._state
        base = {"label": self.label, "model": type(self.model).__name__, "frozen": self.frozen,
                "trained": st is not None, "n_fits": self.n_fits}
        if self.static:
            base["static"] = True
        if st is None:
            return base
        base.update(action=st.action, seconds=st.seconds, n_rows=st.n_rows, device=st.device, path=st.path,
                    history=list(st.history))
        extra = st.peek("report_")
        if isinstance(extra, dict):
            base["components"] = extra
        return base


def _lost(st: FittedState) -> bool:
    """A state kept on a worker that died with it (no copy left): the machine trains again."""
    return st.is_remote and bool(st.stored.lost)


def source_state(s: Source) -> tuple[int, Any]:
    """What a fit records of a source: its version (data replaced) and its data's fingerprint (changed in place)."""
    return s._version, fingerprint(s._data)


def machine(model: Any, *args: Any, device: Any = None, name: str | None = None, warm: Any = "auto",
            cache: bool | None = None, **fit_keywords: Any) -> Machine:
    """Bind ``model`` to its training arguments.

    Parameters
    ----------
    model : estimator
        An object with ``fit`` (scikit-learn, cuML, a gpunets composite, ...).
    *args : nodes or data
        Training arguments, e.g. ``X`` and ``y``. Raw data is wrapped in a source.
    device : str, optional
        Placement: ``"cpu"``, ``"cuda"``, ``"cuda:N"``; default the enclosing
        ``gn.device`` block, else the config default.
    name : str, optional
        Label for reports.
    warm : {"auto", False, "partial_fit"}, default "auto"
        How an update that only grows iteration-like hyperparameters runs (see :class:`Machine`).
    cache : bool, optional
        Keep this machine's outputs on the training data for the next fit or call
        (default: ``gn.get_config()["cache"]``); see :mod:`gpunets.devices.cache`.
    **fit_keywords : nodes or data
        Training arguments passed to ``fit`` by name, e.g. ``sample_weight=w``
        (see :mod:`gpunets.core.weights`); ``model.fit`` must take them.

    Notes
    -----
    With no training arguments the machine is *static* (MLJ's ``Static``): the model must be
    stateless (``FunctionTransformer``, ``Normalizer``: scikit-learn's ``requires_fit`` tag is
    False), it is never fitted, and its operations need their data, e.g. ``mach.transform(X)``.

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> from sklearn.preprocessing import StandardScaler
    >>> X = gn.source(np.array([[0.0], [2.0]]), name="X")
    >>> scale = gn.machine(StandardScaler(), X)
    >>> W = scale.transform(X)
    >>> W
    <Node transform(StandardScaler, X)>
    >>> _ = W.fit()
    >>> W().ravel().tolist()
    [-1.0, 1.0]
    """
    return Machine(model, *args, device=device, name=name, warm=warm, cache=cache, **fit_keywords)


# --- hyperparameter snapshots ----------------------------------------------------------



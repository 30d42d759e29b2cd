"""Composite models: a learning network exported as a scikit-learn estimator.

A subclass writes ``__init__`` (storing its arguments unchanged, scikit-learn
style) and ``network(self, X, y)``, which receives *sources* and returns the
node the model exposes, or a dict ``{operation: node}``.  That is MLJ's
``NetworkComposite``/``prefit``: the composite's hyperparameters are its
``__init__`` arguments, including component models (nested ``first__alpha``),
plus ``executor`` and ``device`` (default ``"auto"``), used for the
composite's own network whenever it is fitted or called.

Fitting (``fit(X, y)``):

1. the input is validated as scikit-learn does (``n_features_in_``,
   ``feature_names_in_``, ``classes_`` for classifiers, NaN/inf, sparse);
2. ``network(X, y)`` is called on sources named ``"X"`` and ``"y"`` holding the
   data (pandas input is passed on as given, other input as validated);
3. when the data are the same as at the previous fit (by content: a
   fingerprint taken at the previous fit, so data changed in place count as
   new, see :mod:`gpunets.devices.fingerprint`), the machines of the new graph adopt the fitted state of the
   machines of the previous graph whose training inputs are the same
   (:mod:`gpunets.compose._composite_ops`), so the core's retraining rules apply:
   unchanged machines skip, a component with new parameters or replaced by
   another model updates, and what is downstream of it retrains;
4. ``gn.fit`` runs the network with the composite's ``executor``/``device``;
   its :class:`~gpunets.FitReport` is kept as ``fit_report_``.

New data retrain everything.  A failed fit leaves the previous network (and
predictions) in place, and every fitted attribute (``n_features_in_``,
``feature_names_in_``, ``classes_``, ...) as it was: they are committed
together, only when the fit succeeds.

Which operations a composite has is decided by its network: ``hasattr(model,
"predict_proba")`` is true exactly when the dict returned by ``network`` has
that key.  Once fitted, the fitted network answers; before, the network is
built on empty sources (only the graph, no data and no training) to find out;
a subclass whose network needs data to be built can declare the class
attribute ``operations = ("predict", ...)`` instead.

Beside operations, the dict may hold ``"report"`` and ``"fitted_params"``,
each ``{name: node}`` (MLJ's ``prefit`` returning ``report=`` /
``fitted_params=``): fitting trains what they need, evaluates them on the
training data, and their values join ``report_`` / ``fitted_params_``
(:mod:`gpunets.compose._composite_extras`).

Examples
--------
>>> import numpy as np, gpunets as gn
>>> from sklearn.linear_model import Ridge, LinearRegression
>>> class Averaged(gn.CompositeRegressor):
...     def __init__(self, first=None, second=None, weight=0.5, executor="auto", device="auto"):
...         self.first, self.second, self.weight = first, second, weight
...         self.executor, self.device = executor, device
...     def network(self, X, y):
...         a = gn.machine(self.first or Ridge(), X, y)
...         b = gn.machine(self.second or LinearRegression(), X, y)
...         return {"predict": gn.mean(a.predict(X), b.predict(X), weights=[self.weight, 1 - self.weight])}
>>> rng = np.random.default_rng(0)
>>> X, y = rng.normal(size=(40, 3)), rng.normal(size=40)
>>> model = Averaged(first=Ridge(alpha=3.0)).fit(X, y)
>>> model.predict(X[:2]).shape
(2,)
>>> model.set_params(first__alpha=1.0).fit(X, y).fit_report_.actions.by_label()
{'first': 'update', 'LinearRegression': 'skip'}
>>> hasattr(model, "predict_proba")
False
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, TransformerMixin, clone
from sklearn.utils._set_output import _wrap_data_with_container
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import _check_feature_names_in, check_is_fitted

from gpunets.api.network import evaluate, fit_with_outputs
from gpunets.api.network import fit as gn_fit
from gpunets.base._warn import _OWNER
from gpunets.base.config import config
from gpunets.compose._composite_extras import check_extra_names, evaluate_extras, extra_nodes
from gpunets.compose._composite_ops import adopt_states, carry_frozen, frozen_names, match_machines
from gpunets.compose._composite_state import (
    COMPOSITE_OPERATIONS,
    CompositeChecks,
    CompositeViews,
    NetworkState,
    _has_operation,
    _is_estimator,
    _is_pandas,
    _relabel,
    _same_param,
    feature_names_of,
)
from gpunets.compose.routing import (
    check_fit_metadata,
    composite_members,
    members_router,
    route_to_members,
    routed_names,
)
from gpunets.compute.estimators import is_frozen_estimator
from gpunets.core.graph import upstream_machines
from gpunets.core.machines import Machine, labels
from gpunets.core.nodes import AbstractNode, Source
from gpunets.devices.fingerprint import fingerprint, scope
from gpunets.devices.placement import override_placement
from gpunets.executors import get_executor

__all__ = ["Composite", "CompositeRegressor", "CompositeClassifier", "CompositeTransformer", "COMPOSITE_OPERATIONS"]

#: The operations a composite's network may expose.


class Composite(CompositeChecks, CompositeViews, BaseEstimator):
    """Base class of composite models: a learning network as a scikit-learn estimator.

    Subclasses define ``__init__`` (storing arguments unchanged) and
    :meth:`network`.  ``executor`` (``"auto"``, ``"serial"``, ``"threads"``,
    ``"streams"`` or an executor object), ``device`` (``"auto"``, ``"cpu"``,
    ``"cuda"``...) and ``workers`` are read from the instance when the
    subclass defines them, else default to ``"auto"``, ``"auto"``, None.

    Attributes
    ----------
    fit_report_ : FitReport
        What the last fit did (``fit_report_.actions``).
    report_ : dict
        ``{component name: machine report}`` for every machine of the network;
        a machine whose model is a hyperparameter is keyed by that
        hyperparameter's name, others by their gpunets label.  With the
        values of the network's report nodes (``network`` returning
        ``{"report": {name: node}, ...}``, see :mod:`gpunets.compose._composite_extras`).
    fitted_params_ : dict
        ``{component name: learned attributes}``, keyed like ``report_``, with
        the values of the network's ``"fitted_params"`` nodes.
    n_features_in_, feature_names_in_ : as in scikit-learn.

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> from sklearn.linear_model import Ridge
    >>> class Scaled(gn.CompositeRegressor):
    ...     def __init__(self, model=None):
    ...         self.model = model
    ...     def network(self, X, y):
    ...         return gn.machine(self.model or Ridge(), X, y).predict(X)
    >>> m = Scaled(Ridge(alpha=2.0)).fit(np.eye(3), np.arange(3.0))
    >>> sorted(m.report_), m.executor, m.fit(np.eye(3), np.arange(3.0)).fit_report_.actions.by_label()
    (['model'], 'auto', {'model': 'skip'})
    """

    #: fitted estimators of composites are refit incrementally by the core (see ``_gn_updated_copy``)
    _gn_incremental = True
    #: the operation a network returning a single node exposes
    _default_operation = "predict"
    #: operations declared without building the network (None: build it on empty sources to find out)
    operations: tuple[str, ...] | None = None

    executor: Any = "auto"
    device: Any = "auto"
    workers: int | None = None
    #: ``fit(..., sample_weight=w)`` reaches the members (:mod:`gpunets.compose.routing`)
    _gn_routes_metadata = True
    #: names of components frozen after their first fit (a subclass exposes it as ``freeze=()`` in ``__init__``)
    freeze: tuple[str, ...] = ()

    # --- what subclasses write ---------------------------------------------------------
    def network(self, X: Source, y: Source) -> AbstractNode | Mapping[str, AbstractNode]:
        """Build the network on sources ``X`` and ``y``; return a node or ``{operation: node}``."""
        msg = (f"{type(self).__name__} must define network(self, X, y), returning the node the model "
               "exposes or a dict such as {'predict': mach.predict(X)}.")
        raise NotImplementedError(msg)

    # --- building ------------------------------------------------------------------------
    def _gn_build(self, sources: dict[str, Source], extra: dict[str, Any] | None = None) -> dict[str, AbstractNode]:
        kwargs = {k: v for k, v in sources.items() if k not in ("X", "y")}
        kwargs.update(extra or {})
        result = self.network(sources["X"], sources["y"], **kwargs)
        return self._gn_check_outputs(result)

    def _gn_explain_missing(self, op: str) -> None:
        """Hook: raise the ``AttributeError`` of the component that lacks ``op`` (subclasses)."""

    def _gn_available_operations(self) -> tuple[str, ...]:
        st = self.__dict__.get("_gn_state")
        if st is not None:
            return tuple(st.outputs)
        declared = type(self).operations
        if declared is not None:
            return tuple(declared)
        try:
            outs = self._gn_build({"X": Source(name="X"), "y": Source(name="y")})
        except Exception:  # the network needs data to be built: claim every operation
            return COMPOSITE_OPERATIONS
        return tuple(outs)

    # --- hyperparameters -----------------------------------------------------------------------
    def _gn_components(self) -> dict[str, Any]:
        """``{hyperparameter name: component model}`` for naming machines in reports."""
        return {k: v for k, v in self.get_params(deep=False).items() if _is_estimator(v)}

    def _gn_plain_params(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in self.get_params(deep=False).items():
            if _is_estimator(v):
                out[k] = ("<estimator>", type(v))
            else:
                try:
                    out[k] = copy.deepcopy(v)
                except Exception:
                    out[k] = ("<uncopyable>", id(v))
        return out

    def _gn_names(self, machines: tuple[Machine, ...]) -> dict[int, str]:
        by_id = {id(v): k for k, v in self._gn_components().items()}
        labs = labels(machines)
        count: dict[str, int] = {}
        out: dict[int, str] = {}
        for m in machines:
            k = by_id.get(id(m.model))
            if k is None:
                out[id(m)] = labs[m]
                continue
            count[k] = count.get(k, 0) + 1
            out[id(m)] = k if count[k] == 1 else f"{k}#{count[k]}"
        return out

    def _gn_run_options(self) -> dict[str, Any]:
        executor = getattr(self, "executor", "auto")
        device = getattr(self, "device", "auto")
        return {"executor": executor, "workers": getattr(self, "workers", None),
                "device": None if device is None or isinstance(device, Mapping) or device == "auto" else device}

    # --- validation ----------------------------------------------------------------------------
    def _gn_check_params(self, X: Any, y: Any) -> None:
        """Check hyperparameters before any work (subclasses extend)."""
        get_executor(getattr(self, "executor", "auto"), getattr(self, "workers", None))

    # --- fit --------------------------------------------------------------------------------------
    def fit(self, X: Any, y: Any = None, **fit_params: Any) -> Composite:
        """Validate the data, build the network (or re-use the previous one) and fit it.

        Extra keyword arguments that are arrays become sources of that name,
        passed to ``network`` as keyword arguments (others are passed as given).
        ``sample_weight`` (and, with metadata routing on, other metadata), when
        ``network`` does not take it, is routed to the members of the network
        (:mod:`gpunets.compose.routing`).

        Returns
        -------
        self
        """
        self._gn_check_params(X, y)
        saved = dict(self.__dict__)   # fitted attributes are committed together, only if the fit succeeds
        try:
            Xo, yo = self._gn_validate_fit(X, y)
            fit_params = check_fit_metadata(self, Xo, fit_params)
            self._gn_fit_network(Xo, yo, fit_params)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            raise
        return self

    def _gn_fit_and_output(self, op: str, X: Any, y: Any, fit_params: dict[str, Any]) -> Any:
        """``fit``, and the value of the network's ``op`` node on the training data from the same run."""
        self.__dict__["_gn_want_output"] = op
        try:
            self.fit(X, y, **fit_params)
            value = self.__dict__.pop("_gn_fit_output", None)
        finally:
            self.__dict__.pop("_gn_want_output", None)
        if value is None:      # the network has no such node (a subclass's own operations): fit, then call
            value = self._gn_call(op, X)
        return value

    def _gn_fit_network(self, X: Any, y: Any, fit_params: dict[str, Any]) -> None:
        with scope():   # the data are fingerprinted once, here and by the core's retraining rules
            self._gn_fit_network_scoped(X, y, fit_params)

    def _gn_fit_network_scoped(self, X: Any, y: Any, fit_params: dict[str, Any]) -> None:
        old: NetworkState | None = self.__dict__.get("_gn_state")
        data = {"X": X, "y": y}
        extra: dict[str, Any] = {}
        for k, v in fit_params.items():
            if hasattr(v, "shape") or _is_pandas(v):
                data[k] = v
            else:
                extra[k] = v
        fps = {k: fingerprint(v) for k, v in data.items()}
        # the same X and y: the fitted states carry over (new metadata, e.g. new sample weights, retrain only
        # the machines that take them: each source's content is part of its dependants' fitted-state stamp)
        same = old is not None and all(k in old.fingerprints and old.fingerprints[k] == fps[k] for k in ("X", "y"))
        if old is not None and same:
            sources = {k: old.sources[k] if old.fingerprints.get(k) == fps[k] and k in old.sources
                       else Source(v, name=k) for k, v in data.items()}
        else:
            sources = {k: Source(v, name=k) for k, v in data.items()}
        routed = routed_names(self, fit_params)   # metadata for the members, not for network()
        outputs = self._gn_build({k: v for k, v in sources.items() if k not in routed}, extra)
        extras = getattr(outputs, "extras", {})
        machines = upstream_machines([*outputs.values(), *extra_nodes(extras)])
        names = self._gn_names(machines)
        check_extra_names(type(self).__name__, extras, set(names.values()))
        route_to_members(self, machines, names, {k: sources[k] for k in routed})   # before any training
        plain = self._gn_plain_params()
        if old is not None and same:
            strict = plain.keys() != old.plain_params.keys() or not all(
                _same_param(plain[k], v) for k, v in old.plain_params.items())
            mapping = match_machines(machines, old.machines, new_names=names, old_names=old.names, strict=strict)
            adopt_states(machines, mapping)
        to_freeze = self._gn_freeze(machines, names, old)
        opts = self._gn_run_options()
        token = _OWNER.set(self)   # fallback warnings name this estimator, not its internal machines
        try:
            want = self.__dict__.get("_gn_want_output")
            if want is not None and want in outputs:   # fit_transform: the output as the fit passes it on
                report, (value,) = fit_with_outputs([*outputs.values(), *extra_nodes(extras)], [outputs[want]],
                                                    **opts)
                self.__dict__["_gn_fit_output"] = value
            else:
                report = gn_fit(*outputs.values(), *extra_nodes(extras), **opts)
            extra_values = evaluate_extras(extras, opts)
        finally:
            _OWNER.reset(token)
        _relabel(report, names)
        for m in to_freeze:   # components named in ``freeze`` that trained now: frozen from here on
            m.frozen = True
        self.__dict__.pop("_gn_frozen_carry", None)
        self._gn_state = NetworkState(sources, data, outputs, machines, names, plain, fps, extra_values)
        self.fit_report_ = report
        self._gn_after_fit(self._gn_state)

    def _gn_freeze(self, machines: tuple[Machine, ...], names: dict[int, str],
                   old: NetworkState | None) -> list[Machine]:
        """Keep frozen components frozen (docs/composites.md, "Freezing components"); return the
        components named in ``freeze`` that have no fitted state yet (they train now, then freeze).

        Carried over: the machines frozen in the previous network (``machines_[name].freeze()``), those
        of the composite this one was cloned from, and the fitted components named in ``freeze``.
        """
        freeze = frozen_names(getattr(self, "freeze", ()), names.values(), type(self).__name__)
        carried: dict[str, Machine] = dict(self.__dict__.get("_gn_frozen_carry") or {})
        if old is not None:
            for m in old.machines:
                name = old.names.get(id(m))
                if name is not None and m.is_fitted and (m.frozen or name in freeze):
                    carried[name] = m
        carry_frozen(machines, names, carried)
        return [m for m in machines if (names[id(m)] in freeze or is_frozen_estimator(m.model)) and not m.frozen]

    def _gn_frozen_components(self) -> dict[str, Machine]:
        """``{component name: machine}`` of the fitted components that stay frozen (kept by a clone)."""
        out: dict[str, Machine] = dict(self.__dict__.get("_gn_frozen_carry") or {})
        st = self.__dict__.get("_gn_state")
        if st is not None:
            out.update({st.names[id(m)]: m for m in st.machines if m.frozen and m.is_fitted})
        return out

    def __sklearn_clone__(self) -> Composite:
        """scikit-learn's ``clone``: the same hyperparameters, unfitted, except frozen components.

        A frozen component keeps its fitted state through a clone (as scikit-learn's
        ``FrozenEstimator`` does), so ``cross_val_score`` refits the other components on each fold
        and never the frozen ones.
        """
        new = super().__sklearn_clone__()
        frozen = self._gn_frozen_components()
        if frozen:
            new._gn_frozen_carry = frozen
        return new

    def _gn_after_fit(self, state: NetworkState) -> None:
        """Hook: set fitted attributes from the trained network (subclasses)."""

    # --- calling -----------------------------------------------------------------------------------
    def _gn_call(self, op: str, X: Any) -> Any:
        check_is_fitted(self, "fit_report_")
        st: NetworkState = self._gn_state
        if op not in st.outputs:
            msg = (f"This {type(self).__name__} has no operation {op!r}; its network exposes "
                   f"{list(st.outputs)}.")
            raise AttributeError(msg)
        Xv = self._gn_validate_call(X, op)
        node = st.outputs[op]
        origins = node.origins
        named = {"X": Xv} if any(s.name == "X" for s in origins) else {}
        keep = tuple(s.name for s in origins if s.name not in (None, "X")) if named else ()
        opts = self._gn_run_options()
        token = _OWNER.set(self)   # fallback warnings name this estimator, not its internal nodes
        try:
            if opts["device"] is not None:
                with config(device=opts["device"]), override_placement(opts["device"]):
                    return evaluate(node, executor=opts["executor"], workers=opts["workers"], keep_training=keep,
                                    **named)
            return evaluate(node, executor=opts["executor"], workers=opts["workers"], keep_training=keep, **named)
        finally:
            _OWNER.reset(token)

    @available_if(_has_operation("predict"))
    def predict(self, X: Any) -> Any:
        """The network's ``predict`` node evaluated on ``X``."""
        return self._gn_call("predict", X)

    @available_if(_has_operation("predict_proba"))
    def predict_proba(self, X: Any) -> Any:
        """The network's ``predict_proba`` node evaluated on ``X``."""
        return self._gn_call("predict_proba", X)

    @available_if(_has_operation("predict_log_proba"))
    def predict_log_proba(self, X: Any) -> Any:
        """The network's ``predict_log_proba`` node evaluated on ``X``."""
        return self._gn_call("predict_log_proba", X)

    @available_if(_has_operation("decision_function"))
    def decision_function(self, X: Any) -> Any:
        """The network's ``decision_function`` node evaluated on ``X``."""
        return self._gn_call("decision_function", X)

    @available_if(_has_operation("transform"))
    def transform(self, X: Any) -> Any:
        """The network's ``transform`` node evaluated on ``X``."""
        return self._gn_call("transform", X)

    @available_if(_has_operation("inverse_transform"))
    def inverse_transform(self, X: Any) -> Any:
        """The network's ``inverse_transform`` node evaluated on ``X``."""
        return self._gn_call("inverse_transform", X)

    # --- metadata routing ----------------------------------------------------------------------------
    def get_metadata_routing(self) -> Any:
        """scikit-learn's routing of ``fit`` metadata to the members of the network (:mod:`gpunets.compose.routing`).

        Returns
        -------
        sklearn.utils.metadata_routing.MetadataRouter
            One child per machine of the network, keyed as in ``report_``, ``fit`` routed to ``fit``.
        """
        return members_router(self, composite_members(self))

    # --- incremental refit by an outer network -------------------------------------------------------
    def _gn_updated_copy(self, spec: Any) -> Any:
        """A copy of this fitted composite with ``spec``'s hyperparameters, sharing the trained network.

        Called by the core when a machine whose model is a composite
        "updates": fitting the copy retrains only the components that
        changed.  The copy builds a new network (its machines adopt the
        states of this one's), so this fitted composite is left untouched and
        stays usable if the copy's fit fails.
        """
        if type(spec) is not type(self) or "_gn_state" not in self.__dict__:
            return clone(spec)
        cp = copy.copy(self)
        cp.set_params(**clone(spec).get_params(deep=False))
        return cp

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        return tags


class CompositeRegressor(RegressorMixin, Composite):
    """A composite whose network predicts continuous targets (``score`` is R²).

    >>> import numpy as np, gpunets as gn
    >>> from sklearn.linear_model import Ridge
    >>> class One(gn.CompositeRegressor):
    ...     def __init__(self, model=None, executor="auto"):
    ...         self.model, self.executor = model, executor
    ...     def network(self, X, y):
    ...         return gn.machine(self.model or Ridge(), X, y).predict(X)
    >>> round(One().fit(np.eye(4), np.arange(4.0)).score(np.eye(4), np.arange(4.0)), 3)
    0.75
    """


class CompositeClassifier(ClassifierMixin, Composite):
    """A composite classifier: ``classes_`` is set from ``y`` and targets must be class labels.

    >>> import numpy as np, gpunets as gn
    >>> from sklearn.linear_model import LogisticRegression
    >>> class Logit(gn.CompositeClassifier):
    ...     def __init__(self, model=None):
    ...         self.model = model
    ...     def network(self, X, y):
    ...         m = gn.machine(self.model or LogisticRegression(), X, y)
    ...         return {"predict": m.predict(X), "predict_proba": m.predict_proba(X)}
    >>> clf = Logit().fit(np.array([[0.0], [1.0], [5.0], [6.0]]), np.array(["a", "a", "b", "b"]))
    >>> clf.classes_.tolist(), clf.predict(np.array([[0.5]])).tolist(), hasattr(clf, "decision_function")
    (['a', 'b'], ['a'], False)
    """

    def _gn_validate_fit(self, X: Any, y: Any) -> tuple[Any, Any]:
        Xo, yo = super()._gn_validate_fit(X, y)
        yv = np.asarray(yo)
        try:
            check_classification_targets(yv)
        except ValueError as e:
            msg = (f"{e} {type(self).__name__} is a classifier: y must hold class labels (integers, strings "
                   "or booleans), not continuous values. Hint: use a regressor composite for continuous targets.")
            raise ValueError(msg) from None
        self.classes_ = np.unique(yv) if yv.ndim == 1 else [np.unique(c) for c in yv.T]
        return Xo, yo


# scikit-learn's _SetOutputMixin.__init_subclass__ takes auto_wrap_output_keys; mypy sees the untyped sklearn bases
# as Any and checks the keyword against object.__init_subclass__
class CompositeTransformer(TransformerMixin, Composite, auto_wrap_output_keys=None):  # type: ignore[call-arg]
    """A composite whose network transforms ``X`` (``y`` is optional); a single node is its ``transform``.

    Output feature names (:meth:`get_feature_names_out`) are derived from the
    network and ``set_output(transform="pandas")`` (or ``"polars"``) works as
    on scikit-learn's transformers.

    >>> import numpy as np, gpunets as gn
    >>> from sklearn.preprocessing import StandardScaler
    >>> class Scale(gn.CompositeTransformer):
    ...     def __init__(self, scaler=None):
    ...         self.scaler = scaler
    ...     def network(self, X, y):
    ...         return gn.machine(self.scaler or StandardScaler(), X).transform(X)
    >>> Scale().fit_transform(np.array([[0.0], [2.0]])).ravel().tolist()
    [-1.0, 1.0]
    >>> Scale().fit(np.array([[0.0], [2.0]])).get_feature_names_out().tolist()
    ['x0']
    """

    _default_operation = "transform"

    def fit_transform(self, X: Any, y: Any = None, **fit_params: Any) -> Any:
        """Fit, and give the network's ``transform`` node on the training data as the fit passes it on.

        As scikit-learn's ``Pipeline.fit_transform``: a machine whose ``fit_transform`` differs from
        ``fit(X).transform(X)`` (``TargetEncoder``'s cross-fitting) gives its ``fit_transform``'s output, in the
        same run as the fit (docs/learning-networks.md, "Training outputs").
        """
        value = self._gn_fit_and_output("transform", X, y, fit_params)
        return _wrap_data_with_container("transform", value, X, self)

    @available_if(_has_operation("transform"))
    def transform(self, X: Any) -> Any:
        """The network's ``transform`` node evaluated on ``X`` (in the container chosen by ``set_output``)."""
        return _wrap_data_with_container("transform", self._gn_call("transform", X), X, self)

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        """Names of the columns of ``transform``'s output, derived from the fitted network.

        The rule: source ``X`` has the input features (``input_features``,
        else ``feature_names_in_``, else ``x0, x1, ...``, as scikit-learn's
        ``_check_feature_names_in``); ``mach.transform(a)`` has its fitted
        estimator's ``get_feature_names_out(names of a)``; ``gn.hstack(a, b,
        ...)`` has the names of ``a``, then ``b``, ...  A subclass whose
        ``transform`` ends otherwise (a ``gn.node`` function, a ``predict``)
        defines its own ``get_feature_names_out``.

        Raises
        ------
        AttributeError
            Naming the node through which the names cannot be derived.
        """
        check_is_fitted(self, "fit_report_")
        names = _check_feature_names_in(self, input_features)
        st: NetworkState = self._gn_state
        owner = type(self).__name__
        if "transform" not in st.outputs:
            msg = (f"{owner}.get_feature_names_out: the network has no 'transform' output (it exposes "
                   f"{list(st.outputs)}), so there are no output features to name.")
            raise AttributeError(msg)
        return np.asarray(feature_names_of(st.outputs["transform"], names, owner), dtype=object)


CompositeTransformer._sklearn_auto_wrap_output_keys = {"transform"}   # transform wraps itself (keeps available_if)

"""Stacking as one learning network: a branch per (base model, fold).

:class:`StackingRegressor` and :class:`StackingClassifier` take
scikit-learn's arguments (``estimators``, ``final_estimator``, ``cv``,
``stack_method``, ``passthrough``) and, for a deterministic ``cv``, give the
same predictions as :class:`sklearn.ensemble.StackingRegressor` /
:class:`~sklearn.ensemble.StackingClassifier`.  The network they build is::

    X, y                                  sources
    Xtr[k], ytr[k], Xte[k]                take_rows nodes, one set per fold k
    fold[e, k] = machine(e, Xtr[k], ytr[k])            one branch per (model, fold)
    oof[e]     = assemble(fold[e, 0].method(Xte[0]), ...)   out-of-fold, original row order
    full[e]    = machine(e, X, y)                      full-data refit, concurrent with the folds
    final      = machine(final_estimator, hstack(oof[...], [X]), y)
    predict    = final.predict(hstack(full[e].method(X) ..., [X]))
    report     = machine(MemberSummary(), summarize(oof[...], y))   named "[cv report]": cv_scores_, widths
    transform  = report.transform(hstack(full[e].method(X) ..., [X]))  (the identity; fitting it fits the report)

With ``cv_ensemble=True`` there is no ``full[e]``: ``full[e].method(X)`` is
the average of ``fold[e, k].method(X)`` over the folds (MLJ's cv-ensemble).
With ``cv="prefit"`` there are no folds: the given fitted members are called
as they are and the final estimator trains on their outputs on all rows.

Every fit task is independent of the others except the final estimator's,
which waits only on the out-of-fold predictions, so an executor keeps all
cores busy with (model, fold) fits.  Being composites, stacks retrain only
what changed: after ``set_params(ridge__alpha=2.0)`` only the ridge
machines (its folds and full refit) and the final estimator retrain.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from numbers import Integral
from typing import Any

import numpy as np
from sklearn.base import ClassifierMixin, RegressorMixin, TransformerMixin, is_classifier, is_regressor
from sklearn.exceptions import NotFittedError
from sklearn.preprocessing import LabelEncoder
from sklearn.utils._param_validation import validate_parameter_constraints
from sklearn.utils.metadata_routing import MethodMapping
from sklearn.utils.metaestimators import _BaseComposition, available_if
from sklearn.utils.multiclass import check_classification_targets, type_of_target
from sklearn.utils.validation import _check_feature_names_in, check_is_fitted, validate_data

from gpunets.compose._stack_network import (  # noqa: F401 - also here, their path in files saved before the split
    SUMMARY,
    MemberSummary,
    StackNetwork,
    _fold_order,
    _is_model,
    assemble_folds,
    average_folds,
    concat_predictions,
    decode_labels,
    decode_multilabel,
    multilabel_proba,
    prefit_output,
    summarize_members,
    take_rows,
)
from gpunets.compose.composite import Composite, NetworkState, _has_operation, _is_pandas
from gpunets.compose.routing import members_router
from gpunets.compute.estimators import apply_estimator
from gpunets.core.nodes import node
from gpunets.devices.data import to_device
from gpunets.devices.placement import CPU, Device

__all__ = ["StackingRegressor", "StackingClassifier"]


# --- the estimators ------------------------------------------------------------------------------------------

class _BaseStacking(StackNetwork, TransformerMixin, _BaseComposition, Composite):
    """What the stacking regressor and classifier share (one network, see the module docstring)."""

    _required_parameters = ["estimators"]

    def __init__(self, estimators: Sequence[tuple[str, Any]], final_estimator: Any = None, *, cv: Any = None,
                 stack_method: str = "auto", passthrough: bool = False, cv_ensemble: bool = False,
                 executor: Any = "auto", device: Any = "auto", workers: int | None = None) -> None:
        self.estimators = estimators
        self.final_estimator = final_estimator
        self.cv = cv
        self.stack_method = stack_method
        self.passthrough = passthrough
        self.cv_ensemble = cv_ensemble
        self.executor = executor
        self.device = device
        self.workers = workers

    # --- parameters (nested by estimator name, as in scikit-learn's ensembles) ---------------------------
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Parameters, with each base estimator by its name (``ridge__alpha``)."""
        return self._get_params("estimators", deep=deep)

    def set_params(self, **params: Any) -> _BaseStacking:
        """Set parameters; ``name=est`` replaces a base estimator, ``name="drop"`` drops it."""
        self._set_params("estimators", **params)
        return self

    @property
    def named_estimators(self) -> dict[str, Any]:
        """The base estimators by name."""
        from sklearn.utils import Bunch

        return Bunch(**dict(self.estimators))

    def _gn_components(self) -> dict[str, Any]:
        out = {name: est for name, est in self.estimators if est != "drop"}
        if self.final_estimator is not None:
            out["final_estimator"] = self.final_estimator
        return out

    def _gn_plain_params(self) -> dict[str, Any]:
        p = super()._gn_plain_params()
        p["estimators"] = tuple((n, "drop" if e == "drop" else type(e)) for n, e in self.estimators)
        for n, _ in self.estimators:
            p.pop(n, None)
        return p

    def _gn_names(self, machines: tuple[Any, ...]) -> dict[int, str]:
        return {id(m): m.name for m in machines}

    # --- validation (all before any training) -----------------------------------------------------------
    def _default_final(self) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def _validate_estimators(self) -> tuple[list[str], list[Any]]:
        cls = type(self).__name__
        ests = self.estimators
        if not isinstance(ests, (list, tuple)) or len(ests) == 0 or not all(
                isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str) for item in ests):
            msg = (f"{cls}: invalid 'estimators' {ests!r}; expected a non-empty list of (name, estimator) "
                   "tuples, e.g. [('ridge', Ridge()), ('rf', RandomForestRegressor())].")
            raise ValueError(msg)
        names = [n for n, _ in ests]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            msg = (f"{cls}: estimator names must be unique; {dup} appear more than once in {names}. "
                   "Hint: give each base estimator its own name, e.g. ('ridge_a', ...), ('ridge_b', ...).")
            raise ValueError(msg)
        clash = sorted(set(names) & set(self._get_param_names()))   # the constructor's own parameters
        if clash:
            msg = (f"Estimator names conflict with constructor arguments: {clash!r} ({cls}: rename those members, "
                   f"e.g. ('{clash[0]}_model', ...)).")
            raise ValueError(msg)
        bad = [n for n in names if "__" in n]
        if bad:
            msg = f"{cls}: estimator names must not contain '__': {bad}."
            raise ValueError(msg)
        kept = [(n, e) for n, e in ests if not (isinstance(e, str) and e == "drop")]
        if not kept:
            msg = f"{cls}: all estimators are dropped; at least one must be an estimator."
            raise ValueError(msg)
        # A classifier stack accepts regressors on purpose, as scikit-learn's does (e.g. ordinal regression).
        want, kind = (_is_model, "classifier or regressor") if is_classifier(self) else (is_regressor, "regressor")
        for n, e in kept:
            if not want(e):
                msg = (f"{cls}: the estimator {n!r} ({type(e).__name__}) should be a {kind}. "
                       f"Hint: pass {kind}s as base estimators, or 'drop' to leave it out.")
                raise ValueError(msg)
        return [n for n, _ in kept], [e for _, e in kept]

    def _validate_final(self) -> Any:
        est = self.final_estimator if self.final_estimator is not None else self._default_final()
        want, kind = (is_classifier, "classifier") if is_classifier(self) else (is_regressor, "regressor")
        if not want(est):
            msg = (f"{type(self).__name__}: 'final_estimator' parameter should be a {kind}. "
                   f"Got {est!r}.")
            raise ValueError(msg)
        return est

    def _validate_cv(self) -> None:
        cv, cls = self.cv, type(self).__name__
        hint = "Hint: cv=5, or a splitter such as KFold(n_splits=5)."
        ens = self.cv_ensemble
        if not isinstance(ens, (bool, np.bool_)):
            msg = (f"{cls}: cv_ensemble={ens!r} of type {type(ens).__name__}; expected True or False. Hint: "
                   "cv_ensemble=True predicts with the average of the fold models instead of refitting each "
                   "member on all rows.")
            raise ValueError(msg)
        if isinstance(cv, str) and cv == "prefit":
            if ens:
                msg = (f"{cls}: cv='prefit' and cv_ensemble=True contradict each other: prefit members are used "
                       "as they are, so there are no fold models to average. Hint: cv_ensemble=False with "
                       "cv='prefit', or cv=5 with cv_ensemble=True.")
                raise ValueError(msg)
            for name, est in self.estimators:
                if isinstance(est, str) and est == "drop":
                    continue
                try:
                    check_is_fitted(est)
                except NotFittedError:
                    msg = (f"{cls}: cv='prefit' but the estimator {name!r} ({type(est).__name__}) is not fitted. "
                           f"Hint: fit it before fitting the stack, or use cv=5 to have the stack fit it.")
                    raise NotFittedError(msg) from None
            return
        if isinstance(cv, str):
            msg = (f"{cls}: cv={cv!r} is not supported; expected None, an integer >= 2, a splitter, an iterable "
                   f"of (train, test) splits or 'prefit'. {hint}")
            raise ValueError(msg)
        if isinstance(cv, Integral) and not isinstance(cv, bool) and cv < 2:
            msg = f"{cls}: cv={cv!r} gives fewer than 2 folds; stacking needs at least 2. {hint}"
            raise ValueError(msg)
        if hasattr(cv, "get_n_splits") and not isinstance(cv, Integral):
            try:
                n = cv.get_n_splits()
            except Exception:
                n = None
            if n is not None and n < 2:
                msg = f"{cls}: cv={cv!r} gives {n} fold(s); stacking needs at least 2. {hint}"
                raise ValueError(msg)

    def _gn_check_params(self, X: Any, y: Any) -> None:
        super()._gn_check_params(X, y)
        self._validate_estimators()
        self._validate_final()
        self._validate_cv()
        self._validate_devices()
        # scikit-learn's own check and error class (InvalidParameterError): "False" is not False
        validate_parameter_constraints({"passthrough": ["boolean"]}, {"passthrough": self.passthrough},
                                       caller_name=type(self).__name__)
        if self.stack_method not in ("auto", "predict_proba", "decision_function", "predict"):
            msg = (f"{type(self).__name__}: stack_method={self.stack_method!r}; expected one of "
                   "'auto', 'predict_proba', 'decision_function', 'predict'.")
            raise ValueError(msg)

    def _methods(self, names: list[str], ests: list[Any]) -> list[str]:
        return ["predict"] * len(ests)

    def _devices(self) -> dict[str, Any]:
        d = self.device
        return dict(d) if isinstance(d, Mapping) else {}

    def _validate_devices(self) -> None:
        d = self.device
        if not isinstance(d, Mapping):
            return
        valid = [n for n, _ in self.estimators] + ["final_estimator"]
        unknown = sorted(str(k) for k in d if k not in valid)
        if unknown:
            msg = (f"{type(self).__name__}: device={dict(d)!r} names {unknown}, which are not estimators of this "
                   f"stack. Valid names are: {valid}.")
            raise ValueError(msg)

    # --- sample weights and metadata routing (scikit-learn's rules) ------------------------------------------
    #: the only metadata a stack's fit takes (as scikit-learn's)
    _gn_routable = ("sample_weight",)

    def get_metadata_routing(self) -> Any:
        """scikit-learn's routing: each base estimator's ``fit`` from ``fit``, the final estimator's ``predict``.

        Returns
        -------
        sklearn.utils.metadata_routing.MetadataRouter
        """
        router = members_router(self, {name: est for name, est in self.estimators})
        final = self.__dict__.get("final_estimator_", self.final_estimator)
        router.add(final_estimator_=final, method_mapping=MethodMapping().add(caller="predict", callee="predict"))
        return router

    def _gn_explain_missing(self, op: str) -> None:
        est = self.final_estimator if self.final_estimator is not None else self._default_final()
        getattr(est, op)   # the final estimator's own AttributeError, chained as __cause__ by available_if

    def _gn_available_operations(self) -> tuple[str, ...]:
        st = self.__dict__.get("_gn_state")
        if st is not None:
            return tuple(st.outputs)
        est = self.final_estimator if self.final_estimator is not None else self._default_final()
        return ("transform",) + tuple(op for op in ("predict", "predict_proba", "decision_function")
                                      if hasattr(est, op))

    def _gn_after_fit(self, state: NetworkState) -> None:
        by_name = {m.name: m for m in state.machines}
        names = self._gn_full_names
        prefit = isinstance(self.cv, str) and self.cv == "prefit"
        if prefit:        # scikit-learn's: the given (already fitted) objects
            fitted = {n: dict(self.estimators)[n] for n in names}
        elif self.cv_ensemble:   # no full refit: each member's fold models
            fitted = {n: [by_name[f"{n}[fold {k}]"].estimator_ for k in range(self._gn_n_folds)] for n in names}
        else:
            fitted = {n: by_name[n].estimator_ for n in names}
        self.estimators_ = [fitted[n] for n in names]
        from sklearn.utils import Bunch

        named = Bunch()
        for n, _e in self.estimators:
            named[n] = fitted.get(n, "drop")
        self.named_estimators_ = named
        self.final_estimator_ = by_name["final_estimator"].estimator_
        self.stack_method_ = self._methods(names, [dict(self.estimators)[n] for n in names])
        summary = by_name[SUMMARY].estimator_.summary_
        self._n_feature_outs = [int(w) for w in summary[:, 0]]
        self.__dict__.pop("cv_scores_", None)
        if not prefit:
            self.cv_scores_ = {n: summary[i, 1:] for i, n in enumerate(names)}

    # --- scikit-learn's feature names, set_output and predict_params ------------------------------------
    def transform(self, X: Any) -> Any:
        """The members' stacked outputs for ``X`` (and ``X`` with ``passthrough``), as scikit-learn's.

        In the container chosen by ``set_output(transform=...)``.
        """
        return self._gn_call("transform", X)

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        """scikit-learn's names of ``transform``'s columns.

        ``stackingregressor_<name>`` (``stackingclassifier_<name><i>`` for a
        member with several columns, such as class probabilities), then the
        input features with ``passthrough=True``.
        """
        check_is_fitted(self, "fit_report_")
        input_features = _check_feature_names_in(self, input_features, generate_names=bool(self.passthrough))
        class_name = type(self).__name__.lower()
        meta_names: list[str] = []
        for est, width in zip(self._gn_full_names, self._n_feature_outs):
            if width == 1:
                meta_names.append(f"{class_name}_{est}")
            else:
                meta_names.extend(f"{class_name}_{est}{i}" for i in range(width))
        if self.passthrough:
            return np.concatenate((meta_names, input_features))
        return np.asarray(meta_names, dtype=object)

    @available_if(_has_operation("predict"))
    def predict(self, X: Any, **predict_params: Any) -> Any:
        """Predict with the network; ``predict_params`` go to the final estimator's ``predict``.

        As scikit-learn's: ``stack.predict(X, return_std=True)`` with a
        ``BayesianRidge`` final estimator returns ``(mean, std)`` (the
        uncertainty of the final estimator only).
        """
        if not predict_params:
            return self._gn_call("predict", X)
        check_is_fitted(self, "fit_report_")
        final = self.final_estimator_
        sig = inspect.signature(final.predict)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
            unknown = sorted(k for k in predict_params if k not in sig.parameters)
            if unknown:
                msg = (f"{type(self).__name__}.predict: {unknown} are not parameters of the final estimator's "
                       f"predict ({type(final).__name__}.predict{sig}); predict_params are forwarded to it. "
                       "Hint: pass only what the final estimator's predict takes, e.g. return_std=True for "
                       "BayesianRidge or GaussianProcessRegressor.")
                raise TypeError(msg)
        # the final estimator runs where it was fitted (on a GPU: the meta-features go there), as in the network
        st = self.machines_["final_estimator"]._state
        assert st is not None   # the stack is fitted (machines_ checks it), so is its final machine
        meta = self._gn_call("transform", X)
        dev = Device.parse(st.device)
        if dev.is_cuda:
            meta = to_device(meta, dev, frames="array" if st.path == "array_api" else "auto")
        y_pred = apply_estimator(final, "predict", (meta,), st.path, params=predict_params)
        if dev.is_cuda:   # back where the caller's results are: the host
            y_pred = tuple(to_device(v, CPU) for v in y_pred) if isinstance(y_pred, tuple) else to_device(y_pred, CPU)
        return self._decode(y_pred)

    def _decode(self, y_pred: Any) -> Any:
        return y_pred

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        try:
            first = next(e for _, e in self.estimators if not (isinstance(e, str) and e == "drop"))
            from sklearn.utils import get_tags

            tags.input_tags.allow_nan = get_tags(first).input_tags.allow_nan
            tags.input_tags.sparse = all(get_tags(e).input_tags.sparse for _, e in self.estimators
                                         if not (isinstance(e, str) and e == "drop"))
        except Exception:
            pass
        return tags


class StackingRegressor(RegressorMixin, _BaseStacking):
    """Stack regressors with a final regressor, as one network (same predictions as scikit-learn's).

    Parameters
    ----------
    estimators : list of (str, estimator)
        Base regressors; an estimator may be ``"drop"``.
    final_estimator : estimator, default=None
        Fitted on the out-of-fold predictions; default :class:`~sklearn.linear_model.RidgeCV`.
    cv : int, splitter, iterable or "prefit", default=None
        Folds for the out-of-fold predictions (None: 5-fold ``KFold``);
        ``"prefit"``: the estimators are already fitted and used as they are,
        the final estimator trains on their predictions of all rows.
    passthrough : bool, default=False
        Also give ``X`` to the final estimator.
    cv_ensemble : bool, default=False
        Predict with the average of each member's fold models instead of
        refitting it on all rows (MLJ's cv-ensemble: K fits per member instead
        of K + 1).  ``estimators_`` then holds, per member, its K fold models.
    executor, device, workers
        Where the network runs (see :class:`gpunets.Composite`); ``device`` may
        also be a dict ``{estimator name or "final_estimator": device}``
        placing individual models.

    Attributes
    ----------
    estimators_, named_estimators_, final_estimator_, stack_method_, n_features_in_, fit_report_
    cv_scores_ : dict
        ``{member name: array of its score on each cv fold}`` (R² for
        regressors, accuracy for classifiers), from the out-of-fold
        predictions the final estimator trains on: no extra fit.  Absent with
        ``cv="prefit"``.

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> from sklearn.linear_model import Ridge, LinearRegression
    >>> from sklearn.tree import DecisionTreeRegressor
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(60, 3)), rng.normal(size=60)
    >>> stack = gn.StackingRegressor([("ridge", Ridge()), ("tree", DecisionTreeRegressor(random_state=0))],
    ...                              final_estimator=LinearRegression(), cv=3, executor="serial").fit(X, y)
    >>> stack.predict(X[:2]).shape, len(stack.fit_report_.actions)
    ((2,), 10)
    >>> stack.set_params(ridge__alpha=3.0).fit(X, y).fit_report_.actions["tree"]
    'skip'
    """

    def __init__(self, estimators: Sequence[tuple[str, Any]], final_estimator: Any = None, *, cv: Any = None,
                 passthrough: bool = False, cv_ensemble: bool = False, executor: Any = "auto", device: Any = "auto",
                 workers: int | None = None) -> None:
        super().__init__(estimators, final_estimator, cv=cv, stack_method="predict", passthrough=passthrough,
                         cv_ensemble=cv_ensemble, executor=executor, device=device, workers=workers)

    def _default_final(self) -> Any:
        from sklearn.linear_model import RidgeCV

        return RidgeCV()

    def _outputs(self, final: Any, meta: Any, transform: Any) -> dict[str, Any]:
        return {"predict": final.predict(meta), "transform": transform}


class StackingClassifier(ClassifierMixin, _BaseStacking):
    """Stack classifiers with a final classifier, as one network (same predictions as scikit-learn's).

    ``y`` may be 1-D class labels or a multilabel-indicator matrix (2-D, 0/1),
    as in scikit-learn; ``classes_`` is then a list (one array per label).

    Parameters
    ----------
    estimators : list of (str, estimator)
        Base classifiers (regressors are accepted too, as in scikit-learn: they
        contribute ``predict`` on the encoded labels); an estimator may be ``"drop"``.
    final_estimator : estimator, default=None
        Default :class:`~sklearn.linear_model.LogisticRegression`.
    cv : int, splitter, iterable or "prefit", default=None
        None or an int: ``StratifiedKFold`` (unshuffled); ``"prefit"`` as in
        :class:`StackingRegressor`.
    stack_method : {"auto", "predict_proba", "decision_function", "predict"}
        What each base model contributes; ``"auto"`` takes the first it has.
    passthrough : bool, default=False
    cv_ensemble : bool, default=False
        As in :class:`StackingRegressor`: fold models' probabilities and
        decision values are averaged, their class predictions (``"predict"``)
        take the majority (ties: the smallest label).
    executor, device, workers
        As in :class:`StackingRegressor`.

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> from sklearn.linear_model import LogisticRegression
    >>> from sklearn.naive_bayes import GaussianNB
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(60, 2)); y = np.where(X[:, 0] > 0, "yes", "no")
    >>> clf = gn.StackingClassifier([("lr", LogisticRegression()), ("nb", GaussianNB())], cv=3,
    ...                             executor="serial").fit(X, y)
    >>> clf.classes_.tolist(), clf.stack_method_, clf.predict(X[:1]).tolist() == y[:1].tolist()
    (['no', 'yes'], ['predict_proba', 'predict_proba'], True)
    """

    def __init__(self, estimators: Sequence[tuple[str, Any]], final_estimator: Any = None, *, cv: Any = None,
                 stack_method: str = "auto", passthrough: bool = False, cv_ensemble: bool = False,
                 executor: Any = "auto", device: Any = "auto", workers: int | None = None) -> None:
        super().__init__(estimators, final_estimator, cv=cv, stack_method=stack_method, passthrough=passthrough,
                         cv_ensemble=cv_ensemble, executor=executor, device=device, workers=workers)

    def _default_final(self) -> Any:
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression()

    def _gn_validate_fit(self, X: Any, y: Any) -> tuple[Any, Any]:
        if y is not None and not hasattr(y, "format"):
            shape = np.shape(np.asarray(y))
            if len(shape) == 2 and shape[1] > 1:   # a column vector is raveled with scikit-learn's warning
                return self._gn_validate_multilabel(X, y)
        Xo, yo = Composite._gn_validate_fit(self, X, y)
        yv = np.asarray(yo)
        try:
            check_classification_targets(yv)
        except ValueError as e:
            msg = (f"{e} {type(self).__name__} is a classifier: y must hold class labels, not continuous "
                   "values. Hint: use gn.StackingRegressor for regression targets.")
            raise ValueError(msg) from None
        le = LabelEncoder().fit(yv)
        self._label_encoder = le
        self.classes_ = le.classes_
        return Xo, le.transform(yv)

    def _gn_validate_multilabel(self, X: Any, y: Any) -> tuple[Any, Any]:
        """A 2-D ``y``: multilabel-indicator targets, one label encoder per column (as scikit-learn's)."""
        cls = type(self).__name__
        kind = type_of_target(y)
        if kind != "multilabel-indicator":
            msg = (f"{cls}: y is 2-D of type {kind!r}; a stack classifies 1-D class labels or multilabel-indicator "
                   "targets (a 2-D array of 0/1), as scikit-learn's. Hint: for several multiclass outputs, wrap "
                   "it: sklearn.multioutput.MultiOutputClassifier(gn.StackingClassifier(...)).")
            raise ValueError(msg)
        tags = self.__sklearn_tags__()
        Xv, yv = validate_data(self, X, y, reset=True, multi_output=True, dtype="numeric",
                               accept_sparse=["csr", "csc"] if tags.input_tags.sparse else False,
                               ensure_all_finite="allow-nan" if tags.input_tags.allow_nan else True)
        encoders = [LabelEncoder().fit(col) for col in np.asarray(yv).T]
        self._label_encoder = encoders
        self.classes_ = [le.classes_ for le in encoders]
        y_enc = np.array([le.transform(col) for le, col in zip(encoders, np.asarray(yv).T)]).T
        return (X if _is_pandas(X) and getattr(X, "ndim", 2) == 2 else Xv), y_enc

    def _decode(self, y_pred: Any) -> Any:
        if isinstance(self.classes_, list):
            return decode_multilabel(tuple(self.classes_), y_pred)
        return decode_labels(self.classes_, y_pred)

    def _methods(self, names: list[str], ests: list[Any]) -> list[str]:
        from sklearn.utils._response import _check_response_method

        out = []
        for name, est in zip(names, ests):
            method = (["predict_proba", "decision_function", "predict"] if self.stack_method == "auto"
                      else self.stack_method)
            try:
                out.append(_check_response_method(est, method).__name__)
            except AttributeError as e:
                msg = f"Underlying estimator {name} does not implement the method {method}."
                raise ValueError(msg) from e
        return out

    def _gn_check_params(self, X: Any, y: Any) -> None:
        super()._gn_check_params(X, y)
        names, ests = self._validate_estimators()
        self._methods(names, ests)

    def _outputs(self, final: Any, meta: Any, transform: Any) -> dict[str, Any]:
        multilabel = isinstance(self.classes_, list)
        decode = (node(decode_multilabel, tuple(self.classes_), final.predict(meta), name="predict") if multilabel
                  else node(decode_labels, self.classes_, final.predict(meta), name="predict"))
        out = {"predict": decode, "transform": transform}
        for op in ("predict_proba", "decision_function"):
            if hasattr(final.model, op):
                out[op] = getattr(final, op)(meta)
        if multilabel and "predict_proba" in out:
            out["predict_proba"] = node(multilabel_proba, out["predict_proba"], name="predict_proba")
        return out

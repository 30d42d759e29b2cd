"""The composites :func:`from_sklearn` returns: a gpunets network that keeps the original's face.

Parameters are the original's (``get_params()`` / ``set_params()`` with its
nested names, e.g. ``columntransformer__num__scaler__with_mean``) plus
``executor``, ``device``, ``workers``, ``reuse_fitted``, ``split_forests`` and
``sklearn_estimator`` (the composition itself, a clone of what was given).
The network is rebuilt from the composition at each ``fit``; machines whose
inputs are unchanged keep their fitted state, so only what changed retrains.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import ClassifierMixin, RegressorMixin, TransformerMixin, clone
from sklearn.utils.validation import check_is_fitted

from gpunets.base.exceptions import EvaluationError, FitError
from gpunets.compose.composite import COMPOSITE_OPERATIONS, Composite
from gpunets.compose.routing import routing_enabled
from gpunets.compute.estimators import training_output_differs
from gpunets.core.graph import upstream_machines
from gpunets.sklearn_import._base import Context, build, converts_as, first_part, is_passthrough, operations
from gpunets.sklearn_import.errors import as_sklearn, check_columns, used_columns
from gpunets.sklearn_import.fit_params import route_fit_params
from gpunets.sklearn_import.forests import n_chunks
from gpunets.sklearn_import.names import feature_names_out
from gpunets.sklearn_import.reuse import adopt

__all__ = ["OWN_PARAMS", "FromSklearnClassifier", "FromSklearnRegressor", "FromSklearnTransformer"]

#: the composite's own parameters; every other parameter name is the original's
OWN_PARAMS = ("sklearn_estimator", "executor", "device", "workers", "reuse_fitted", "split_forests")


def _as_input(X: Any) -> Any:
    if X is None or hasattr(X, "shape") or hasattr(X, "columns"):
        return X
    if hasattr(X, "__array__"):
        return np.asarray(X)
    return np.asarray(X, dtype=object) if any(isinstance(v, str) for v in X) else np.asarray(X)


class _FromSklearn(Composite):
    def __init__(self, sklearn_estimator: Any, *, executor: Any = "auto", device: Any = "auto",
                 workers: int | None = None, reuse_fitted: bool = False, split_forests: bool | None = None) -> None:
        self.sklearn_estimator = sklearn_estimator
        self.executor = executor
        self.device = device
        self.workers = workers
        self.reuse_fitted = reuse_fitted
        self.split_forests = split_forests

    # --- parameters: the original's names --------------------------------------------------------------
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The composite's own parameters and, with ``deep``, the original's (by its own names)."""
        out = {k: getattr(self, k) for k in OWN_PARAMS}
        if deep:
            for k, v in self.sklearn_estimator.get_params(deep=True).items():
                out.setdefault(k, v)
        return out

    def set_params(self, **params: Any) -> _FromSklearn:
        """Set the composite's own parameters, and the original's by its names (``ridge__alpha=2``)."""
        own = {k: params.pop(k) for k in list(params) if k in OWN_PARAMS}
        for k, v in own.items():
            setattr(self, k, v)
        nested = {k.removeprefix("sklearn_estimator__"): v
                  for k, v in params.items()}
        if nested:
            self.sklearn_estimator.set_params(**nested)
        return self

    # --- the network ------------------------------------------------------------------------------------
    def _gn_available_operations(self) -> tuple[str, ...]:
        st = self.__dict__.get("_gn_state")
        if st is not None:
            return tuple(st.outputs)
        return operations(self.sklearn_estimator)

    def network(self, X: Any, y: Any, **fit_params: Any) -> dict[str, Any]:
        """The original composition as a network, recursively (see :mod:`gpunets.sklearn_import`).

        ``fit_params`` (sources for arrays) reach the parts that take them by scikit-learn's rules
        (:mod:`gpunets.sklearn_import.fit_params`).
        """
        chunks = 1 if self.reuse_fitted else n_chunks(self.executor, self.workers, self.split_forests)
        ctx = Context(data=X.data, root_X=X, cache=self.__dict__.setdefault("_gn_cache", {}), forest_chunks=chunks,
                      fit_params=route_fit_params(self.sklearn_estimator, fit_params))
        outs = build(self.sklearn_estimator, X, None if y.data is None else y, "", ctx)
        self._gn_ctx = ctx
        original = self.__dict__.pop("_gn_adopt_from", None)
        if original is not None:
            done = adopt(upstream_machines(list(outs.values())), original)
            for name, what in done.items():
                ctx.parts.setdefault(name, {"kind": "helper", "estimator": "", "notes": []})["notes"].append(
                    "reuse_fitted: " + what)
        wanted = operations(self.sklearn_estimator)
        return {op: outs[op] for op in wanted if op in outs and op in COMPOSITE_OPERATIONS}

    def _gn_names(self, machines: tuple[Any, ...]) -> dict[int, str]:
        return {id(m): m.label for m in machines}

    def _gn_check_params(self, X: Any, y: Any) -> None:
        super()._gn_check_params(X, y)
        if not callable(getattr(self.sklearn_estimator, "fit", None)):
            from gpunets.sklearn_import.convert import not_an_estimator  # lazy: convert.py builds on this module

            raise not_an_estimator(self.sklearn_estimator)

    # --- validation: the leaves validate, as in scikit-learn's meta-estimators -------------------------------
    def _gn_validate_fit(self, X: Any, y: Any) -> tuple[Any, Any]:
        from sklearn.utils.validation import _check_feature_names, _check_n_features

        if y is None and self.__sklearn_tags__().target_tags.required:
            msg = (f"This {type(self).__name__} estimator requires y to be passed, but the target y is None. "
                   f"Its composition, {type(self.sklearn_estimator).__name__}, needs targets to fit.")
            raise ValueError(msg)
        X, y = _as_input(X), (y if y is None or hasattr(y, "shape") else np.asarray(y))
        _check_feature_names(self, X, reset=True)
        try:
            _check_n_features(self, X, reset=True)
        except (TypeError, ValueError):  # 1-D input (text): no n_features_in_, as in scikit-learn
            pass
        from sklearn.compose import ColumnTransformer

        first = first_part(self.sklearn_estimator)
        self._gn_used_columns = (used_columns(first, X) if converts_as(first, ColumnTransformer)
                                 and hasattr(X, "columns") else None)
        return X, y

    def _gn_validate_call(self, X: Any, op: str) -> Any:
        from sklearn.compose import ColumnTransformer
        from sklearn.utils.validation import _check_feature_names

        X = _as_input(X)
        if not converts_as(first_part(self.sklearn_estimator), ColumnTransformer):  # it selects by name itself
            _check_feature_names(self, X, reset=False)
        else:   # scikit-learn's "columns are missing", before anything runs
            check_columns(self.__dict__.get("_gn_used_columns"), X)
        return X

    def _gn_call(self, op: str, X: Any) -> Any:
        try:
            return super()._gn_call(op, X)
        except (FitError, EvaluationError) as e:   # scikit-learn's exception, then where it happened
            new = as_sklearn(e, op, self.sklearn_estimator)
            if new is None:
                raise
            raise new from e

    def _gn_fit_network(self, X: Any, y: Any, fit_params: dict[str, Any]) -> None:
        if fit_params and routing_enabled():
            msg = (f"from_sklearn composites route fit parameters by scikit-learn's rules without metadata "
                   f"routing; with sklearn's enable_metadata_routing=True they do not yet (got {sorted(fit_params)}). "
                   "Hint: turn metadata routing off for this fit (sklearn.config_context("
                   "enable_metadata_routing=False)), or fit the original scikit-learn object.")
            raise TypeError(msg)
        route_fit_params(self.sklearn_estimator, fit_params)   # every routing error before anything trains
        original = self.__dict__.get("_gn_fitted_original")
        if self.reuse_fitted and original is not None and "_gn_state" not in self.__dict__:
            self._gn_adopt_from = original  # read (once) by network(), which installs the fitted states
        try:
            super()._gn_fit_network(X, y, fit_params)
        except (FitError, EvaluationError) as e:   # scikit-learn's exception, then where it happened
            new = as_sklearn(e, "fit", self.sklearn_estimator)
            if new is None:
                raise
            raise new from e
        finally:
            self.__dict__.pop("_gn_adopt_from", None)

    # --- reports -----------------------------------------------------------------------------------------
    @property
    def conversion_(self) -> dict[str, dict[str, Any]]:
        """``{path: {"kind", "estimator", "notes"}}``: how each part of the original was converted."""
        check_is_fitted(self, "fit_report_")
        return {k: {kk: vv for kk, vv in v.items() if kk != "columns"} for k, v in self._gn_ctx.parts.items()}

    @property
    def report_(self) -> dict[str, dict[str, Any]]:
        """``{machine name: machine report}`` plus, per machine, how its part was converted (``kind``, ``notes``)."""
        out = super().report_
        parts = self._gn_ctx.parts
        for name, rep in out.items():
            part = parts.get(name)
            if part is not None:
                rep["kind"] = part["kind"]
                rep["notes"] = list(part["notes"])
        return out

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        """Output feature names, computed from the fitted parts by scikit-learn's rules."""
        from sklearn.utils.validation import _check_feature_names_in

        check_is_fitted(self, "fit_report_")
        names_in = _check_feature_names_in(self, input_features)
        machines = self.machines_
        return feature_names_out(self.sklearn_estimator, "", names_in, lambda n: machines[n].estimator_,
                                 self._gn_ctx.parts)

    # --- display: the original structure -------------------------------------------------------------------
    def __repr__(self, N_CHAR_MAX: int = 700) -> str:
        opts = [f"{k}={getattr(self, k)!r}" for k, d in (("executor", "auto"), ("device", "auto"),
                                                          ("workers", None), ("reuse_fitted", False),
                                                          ("split_forests", None))
                if getattr(self, k) != d]
        inner = repr(self.sklearn_estimator)
        return f"from_sklearn({inner}{', ' if opts else ''}{', '.join(opts)})"

    def _sk_visual_block_(self) -> Any:
        from sklearn.utils._repr_html.estimator import _VisualBlock

        where = ", ".join(f"{k}={getattr(self, k)!r}" for k in ("executor", "device"))
        return _VisualBlock("serial", [self.sklearn_estimator], names=[f"gpunets network ({where})"],
                            name_details=[str(self.sklearn_estimator)], dash_wrapped=True)

    def __sklearn_tags__(self):
        from sklearn.utils import get_tags

        tags = super().__sklearn_tags__()
        try:
            inner = get_tags(self.sklearn_estimator)
            tags.input_tags = inner.input_tags
            tags.target_tags = inner.target_tags
            tags.input_tags.allow_nan = _allows_nan(self.sklearn_estimator)
        except Exception:  # noqa: BLE001, S110 - tags are advisory
            pass
        return tags


def _allows_nan(est: Any) -> bool:
    """Whether ``est`` takes NaN in its input: a Pipeline when every step does (scikit-learn's own Pipeline
    leaves its ``allow_nan`` tag False; a network of steps that all take NaN does take it), else its tag.

    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from sklearn.linear_model import Ridge
    >>> _allows_nan(make_pipeline(StandardScaler())), _allows_nan(make_pipeline(StandardScaler(), Ridge()))
    (True, False)
    """
    from sklearn.pipeline import Pipeline
    from sklearn.utils import get_tags

    if converts_as(est, Pipeline):
        steps = [s for _, s in est.steps if not is_passthrough(s)]
        return bool(steps) and all(_allows_nan(s) for s in steps)
    return bool(get_tags(est).input_tags.allow_nan)


class FromSklearnRegressor(RegressorMixin, _FromSklearn):
    """A scikit-learn regressor composition converted to a gpunets network (see :func:`gpunets.from_sklearn`)."""


class FromSklearnClassifier(ClassifierMixin, _FromSklearn):
    """A scikit-learn classifier composition converted to a gpunets network; ``classes_`` as scikit-learn."""

    def _gn_validate_fit(self, X: Any, y: Any) -> tuple[Any, Any]:
        X, y = super()._gn_validate_fit(X, y)
        yv = np.asarray(y)
        self.classes_ = np.unique(yv) if yv.ndim == 1 else [np.unique(c) for c in yv.T]
        return X, y


class FromSklearnTransformer(TransformerMixin, _FromSklearn):
    """A scikit-learn transformer composition converted to a gpunets network."""

    _default_operation = "transform"

    def fit_transform(self, X: Any, y: Any = None, **fit_params: Any) -> Any:
        """Fit, and give the composition's output on ``X`` as its ``fit_transform`` does in scikit-learn: each
        part's ``fit_transform`` output (``TargetEncoder``'s cross-fitting), from the same run as the fit."""
        return self._gn_fit_and_output("transform", X, y, fit_params)

    def transform(self, X: Any) -> Any:
        """The composition's output on ``X`` (in the container its ``set_output`` asks for, as ``fit_transform``)."""
        return self._gn_call("transform", X)

    def _gn_training_output_differs(self) -> bool:
        """Whether its ``fit_transform`` may differ from ``fit(X).transform(X)``: as its composition's."""
        return training_output_differs(self.sklearn_estimator)


def make_composite(est: Any, **kw: Any) -> _FromSklearn:
    """The composite class matching ``est``'s kind (classifier, regressor, else transformer)."""
    from sklearn.base import is_classifier, is_regressor

    cls = (FromSklearnClassifier if is_classifier(est) else FromSklearnRegressor if is_regressor(est)
           else FromSklearnTransformer)
    return cls(clone(est), **kw)

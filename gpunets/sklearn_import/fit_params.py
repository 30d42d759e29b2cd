"""Fit parameters of a converted composition, routed to its parts by scikit-learn's rules.

``model.fit(X, y, ridge__sample_weight=w)`` on a converted ``Pipeline`` gives
``w`` to the step ``ridge``, as ``Pipeline.fit`` does; the routing follows each
composition's own rules (scikit-learn without metadata routing):

* ``Pipeline``: ``step__param`` goes to that step (recursively: an inner
  pipeline gets ``inner_step__param``); a name without ``__`` is an error;
* ``VotingRegressor`` / ``VotingClassifier`` and stacks: ``sample_weight`` only,
  to every member (a stack cuts it per fold and gives it to its final estimator);
* ``FeatureUnion``: every parameter to every transformer;
* ``TransformedTargetRegressor``: every parameter to the regressor;
* ``ColumnTransformer``: none (scikit-learn takes them only with metadata routing);
* any other estimator: its own ``fit`` parameters.

Everything is checked before anything trains: a parameter that no part can take
raises a ``TypeError`` naming the part, where scikit-learn would fail in the
middle of the fit.  Array values become sources (cut with the rows, like
``X``); other values are passed as they are.
"""

from __future__ import annotations

import inspect
from typing import Any

from gpunets.sklearn_import._base import converts_as, is_drop, is_passthrough, join, root_name

__all__ = ["route_fit_params"]


def _takes(est: Any, name: str) -> bool:
    try:
        params = inspect.signature(est.fit).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _only_weights(est: Any, params: dict[str, Any], path: str) -> None:
    extra = sorted(set(params) - {"sample_weight"})
    if extra:
        cls = type(est).__name__
        msg = (f"{cls}.fit (at {path or 'the top'!r}) got unexpected argument(s) {extra}: without metadata routing "
               f"scikit-learn's {cls} takes only sample_weight, which it gives to every member. Hint: pass "
               "sample_weight alone, or set the other values as estimator parameters.")
        raise TypeError(msg)


def route_fit_params(est: Any, params: dict[str, Any], path: str = "") -> dict[str, dict[str, Any]]:
    """``{path of the part that consumes them: {name: value}}`` for ``est.fit(X, y, **params)``.

    The paths are the parameter paths of :func:`gpunets.from_sklearn` (``""`` for the top).

    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from sklearn.linear_model import Ridge
    >>> route_fit_params(make_pipeline(StandardScaler(), Ridge()), {"ridge__sample_weight": [1, 2]})
    {'ridge': {'sample_weight': [1, 2]}}
    """
    from sklearn.compose import ColumnTransformer, TransformedTargetRegressor
    from sklearn.ensemble import StackingClassifier, StackingRegressor, VotingClassifier, VotingRegressor
    from sklearn.pipeline import FeatureUnion, Pipeline

    if not params:
        return {}
    out: dict[str, dict[str, Any]] = {}

    def merge(routed: dict[str, dict[str, Any]]) -> None:
        for k, v in routed.items():
            out.setdefault(k, {}).update(v)

    if converts_as(est, Pipeline):
        steps = dict(est.steps)
        per_step: dict[str, dict[str, Any]] = {}
        for key, value in params.items():
            if "__" not in key:
                msg = (f"Pipeline.fit does not accept the {key} parameter. You can pass parameters to specific "
                       "steps of your pipeline using the stepname__parameter format, e.g. "
                       "`Pipeline.fit(X, y, logisticregression__sample_weight=sample_weight)`.")
                raise ValueError(msg)
            step, name = key.split("__", 1)
            if step not in steps:
                msg = (f"Pipeline.fit got {key!r}, but the pipeline{f' at {path!r}' if path else ''} has no step "
                       f"named {step!r}; its steps are {list(steps)}. Hint: use stepname__parameter.")
                raise ValueError(msg)
            per_step.setdefault(step, {})[name] = value
        for step, sub in per_step.items():
            if not is_passthrough(steps[step]):   # scikit-learn ignores parameters of passthrough steps
                merge(route_fit_params(steps[step], sub, join(path, step)))
        return out
    if converts_as(est, VotingRegressor, VotingClassifier):
        _only_weights(est, params, path)
        for name, member in est.estimators:
            if not is_drop(member):
                merge(route_fit_params(member, params, join(path, name)))
        return out
    if converts_as(est, StackingRegressor, StackingClassifier):
        _only_weights(est, params, path)
        return {path: dict(params)}      # the stack routes its weights itself (per fold, to the final estimator)
    if converts_as(est, FeatureUnion):
        for name, trans in est.transformer_list:
            if not is_drop(trans) and not is_passthrough(trans):
                merge(route_fit_params(trans, params, join(path, name)))
        return out
    if converts_as(est, TransformedTargetRegressor):
        from sklearn.linear_model import LinearRegression

        reg = est.regressor if est.regressor is not None else LinearRegression()
        return route_fit_params(reg, params, join(path, "regressor"))
    if converts_as(est, ColumnTransformer):
        msg = (f"ColumnTransformer.fit (at {path or 'the top'!r}) got {sorted(params)}: scikit-learn's "
               "ColumnTransformer takes fit parameters only with metadata routing, which from_sklearn composites "
               "do not offer yet. Hint: set them as estimator parameters of the transformers.")
        raise TypeError(msg)
    refused = [k for k in params if not _takes(est, k)]
    if refused:
        where = path or root_name(est)
        msg = (f"{type(est).__name__}.fit (at {where!r}) does not take {refused}: the fit parameter"
               f"{'s' if len(refused) > 1 else ''} would fail when it trains; nothing was trained. Hint: route "
               "it to a step that takes it (stepname__parameter).")
        raise TypeError(msg)
    return {path: dict(params)}

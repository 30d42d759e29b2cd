"""An iteration budget as successive halving's resource, warm-started across rungs.

With ``resource="n_estimators"`` (or ``max_iter``, any parameter of ``gn.config(warm_params=...)``)
scikit-learn's halving refits every survivor from scratch at each rung.  gpunets continues it: the
survivor's last step, fitted in the previous rung on the same fold, is copied and fitted further with
``warm_start=True`` and the grown budget (the rule of :mod:`gpunets.core.machines`' warm updates).  For forests
with an integer ``random_state`` the trees added are those a cold fit would grow, so the scores equal a
cold search's exactly; for estimators whose warm start is not exact (gradient boosting draws its
subsamples from a new random stream; solvers restart from the previous coefficients), ``warm_start=False``
on the search gives scikit-learn's cold rungs.

>>> from sklearn.ensemble import RandomForestRegressor
>>> warm_target(RandomForestRegressor(), "n_estimators")
('RandomForestRegressor', 'n_estimators')
"""

from __future__ import annotations

import copy
import time
import traceback
from collections.abc import Hashable
from typing import Any

from gpunets.base.config import get_config
from gpunets.base.saved import saved_operation
from gpunets.tuning.networks import is_composite, pipeline_steps
from gpunets.tuning.tasks import Failed, Stage, aligned, moved, on_device, score_fit

__all__ = ["WarmPlan", "check_warm", "warm_fit_and_score", "warm_target"]


def warm_target(estimator: Any, resource: str) -> tuple[str, str] | None:
    """``(the step's name, its parameter)`` that ``resource`` names on the estimator's last step, when a
    warm update can continue it; None when it cannot (see :func:`check_warm` for why)."""
    return None if _why_not(estimator, resource) else _target(estimator, resource)


def _target(estimator: Any, resource: str) -> tuple[str, str]:
    steps = pipeline_steps(estimator)
    if steps is None:
        return type(estimator).__name__, resource
    name, _, param = resource.partition("__")
    return name, param


def _why_not(estimator: Any, resource: str) -> str | None:
    """Why ``resource`` cannot be warm-started on ``estimator``; None when it can."""
    known = tuple(get_config()["warm_params"])
    if is_composite(estimator):
        return f"{type(estimator).__name__} is a gpunets composite: its rungs are refitted (warm updates continue one estimator)"
    steps = pipeline_steps(estimator)
    if steps is None:
        last, param = estimator, resource
    else:
        name, sep, param = resource.partition("__")
        if not sep or name != steps[-1][0]:
            return (f"resource={resource!r} is not a parameter of the pipeline's last step {steps[-1][0]!r} "
                    f"(e.g. {steps[-1][0]}__n_estimators)")
        last = steps[-1][1]
    if "__" in param or param not in known:
        return f"the warm-update rules know {list(known)} (gn.config(warm_params=...)), not {param!r}"
    if "warm_start" not in last.get_params(deep=False):
        return f"{type(last).__name__} has no warm_start parameter to continue a fit with"
    return None


def check_warm(search: Any) -> bool:
    """Whether the search warm-starts its rungs; a ValueError when ``warm_start=True`` cannot be honoured."""
    mode = search.warm_start
    if mode not in ("auto", True, False) or (mode is not True and mode is not False and mode != "auto"):
        msg = (f"warm_start={mode!r} is not a warm-start mode: expected 'auto' (warm where the warm-update rules "
               "allow it), True (warm, or an error) or False (refit each rung, as scikit-learn). Hint: pass "
               "warm_start=False for scikit-learn's cold rungs.")
        raise ValueError(msg)
    if search.resource == "n_samples" or mode is False:
        return False
    why = _why_not(search.estimator, search.resource)
    if why is None:
        return True
    if mode is True:
        known = list(get_config()["warm_params"])
        msg = (f"{type(search).__name__}(resource={search.resource!r}, warm_start=True): cannot warm-start it: "
               f"{why}. Warm-startable resources: {known} on an estimator with warm_start (a pipeline's last "
               "step: 'step__n_estimators'). Hint: pass warm_start=False to refit each rung as scikit-learn does, "
               "or gn.config(warm_params=(..., 'name')) if a fit with a grown value continues the previous one.")
        raise ValueError(msg)
    return False


class WarmPlan:
    """For one rung: per (candidate, fold), the fitted last step of the previous rung to continue from.

    ``keys[c]`` is candidate ``c``'s key without its resource, ``folds[f]`` fold ``f``'s key; the memory's
    ``fitted`` maps ``(candidate key, fold key)`` to ``(resource value, fitted step)``."""

    def __init__(self, param: str, keys: list[Hashable | None], folds: list[Hashable], fitted: dict[Any, Any]) -> None:
        self.param, self.keys, self.folds, self.fitted = param, keys, folds, fitted

    def step(self, c: int, f: int) -> tuple[Any, str]:
        """``(the fitted step to continue, or None, the step's parameter)``."""
        key = self.keys[c]
        hit = None if key is None else self.fitted.get((key, self.folds[f]))
        return (None if hit is None else hit[1]), self.param


def _warm_estimator(est: Any, previous: Any, param: str, route: Any) -> tuple[Any, bool]:
    """The estimator to fit: a copy of ``previous`` with the grown budget, else a fresh one set to warm-start
    later; and whether the fit is needed (not when the budget did not grow: the previous fit is the answer)."""
    from sklearn.base import clone

    spec = est if route is None else route.estimator
    if route is not None and getattr(route, "path", None) == "cuml":   # a cuML twin: no warm start
        return clone(spec), True
    if previous is None or isinstance(previous, Failed):
        return clone(spec).set_params(warm_start=True), True
    new = spec.get_params(deep=False)[param]
    if getattr(previous, param) == new:
        return previous, False
    out = copy.deepcopy(previous)   # the previous rung's fit stays as it was (a resumed rung may read it)
    out.set_params(**{param: new})
    return out, True


@saved_operation
def warm_fit_and_score(est: Any, previous: Any, param: str, route: Any, fit_params: dict[str, Any], X: Any, y: Any,
                       users: tuple[int, ...], head: tuple[Any, ...], X_test: Any, y_test: Any, X_train: Any,
                       y_train: Any) -> dict[str, Any]:
    """Fit a candidate's last step, continuing ``previous`` (its fit on this fold in the previous rung) when
    there is one, and score it: scikit-learn's ``_fit_and_score`` output, the fitted step under ``_fitted``."""
    if isinstance(X, Stage):
        X_stage: Any = X
        X = X.train
    else:
        X_stage = None
    start = time.perf_counter()
    if isinstance(X, Failed):
        step: tuple[Any, Any, float] = (X.as_fit(), None, 0.0)
    else:
        X, y = aligned(X, y)
        fit_params = dict(zip(fit_params, aligned(*fit_params.values())))
        try:
            fitted, needed = _warm_estimator(est, previous, param, route)
            if needed:
                with on_device(route):
                    Xm, ym = moved(route, X, y)
                    fitted.fit(Xm, **fit_params) if ym is None else fitted.fit(Xm, ym, **fit_params)
            step = (fitted, None, time.perf_counter() - start)
        except Exception as e:  # noqa: BLE001 - reported by candidate through error_score
            failed = Failed(e, traceback.format_exc(), time.perf_counter() - start)
            step = (failed, None, failed.seconds)
    if X_stage is not None:
        X_test = X_stage
    out = score_fit(route, users, head, step, X_test, y_test, X_train, y_train)
    if not isinstance(step[0], Failed):
        out["_fitted"] = step[0]
    return out

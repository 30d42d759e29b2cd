"""Hyperparameter search as one learning network: every candidate and fold in one graph.

:class:`GridSearchCV` and :class:`RandomizedSearchCV` take scikit-learn's
arguments and give the same fitted attributes (``cv_results_``,
``best_params_``, ``best_score_``, ``best_index_``, ``best_estimator_``,
``scorer_``, ``n_splits_``, ``refit_time_``, ``multimetric_``).  Instead of
fitting every (candidate, fold) pair on its own, the search builds one network:

* the estimator is cut into *steps*: the steps of a scikit-learn
  :class:`~sklearn.pipeline.Pipeline`, else the estimator as one step;
* in each fold, step ``i`` of two candidates is **one fit** when steps
  ``0..i`` are equal: same class and same hyperparameters of each step
  (``get_params(deep=False)``, estimator-valued parameters compared
  recursively), hence the same training inputs;
* a shared step also transforms the fold's test rows once for every
  candidate that shares it; the scores are nodes;
* the whole graph runs at once on the chosen executor (threads on a CPU,
  streams on a GPU, Dask), and a fitted step is dropped as soon as the last
  score that needs it has been computed (the scheduler frees values with no
  consumer left).

``search_report_`` tells how many step fits ran and how many a
candidate-by-candidate search would have run.

>>> import numpy as np, gpunets as gn
>>> from sklearn.pipeline import make_pipeline
>>> from sklearn.preprocessing import StandardScaler
>>> from sklearn.linear_model import Ridge
>>> rng = np.random.default_rng(0)
>>> X, y = rng.normal(size=(60, 4)), rng.normal(size=60)
>>> search = gn.GridSearchCV(make_pipeline(StandardScaler(), Ridge()), {"ridge__alpha": [0.1, 1.0, 10.0]}, cv=3)
>>> search.fit(X, y).best_params_
{'ridge__alpha': 10.0}
>>> search.search_report_.fits
{'standardscaler': 3, 'ridge': 9}
"""

from __future__ import annotations

import numbers
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.base import _fit_context, clone, is_classifier
from sklearn.model_selection import ParameterGrid, ParameterSampler, check_cv
from sklearn.model_selection._search import BaseSearchCV
from sklearn.model_selection._validation import (_insert_error_scores, _score,
                                                 _warn_or_raise_about_fit_failures)
from sklearn.pipeline import Pipeline
from sklearn.utils._param_validation import HasMethods, Interval, StrOptions
from sklearn.utils.validation import _check_method_params, indexable

__all__ = ["GridSearchCV", "RandomizedSearchCV", "SearchReport"]


# --- the values flowing through the search network (module level, so they pickle for Dask) -------------

class _Failed:
    """A fit or a score that raised: the exception and its traceback, passed downstream instead of a value."""

    def __init__(self, error: BaseException, tb: str, seconds: float = 0.0) -> None:
        self.error, self.tb, self.seconds = error, tb, seconds


def _take(value: Any, rows: np.ndarray) -> Any:
    """``value`` at ``rows``: gpunets' type-aware selection, scikit-learn's for lists and the like."""
    from .data import take_rows

    if value is None:
        return None
    try:
        return take_rows(value, rows)
    except TypeError:
        from sklearn.utils import _safe_indexing

        return _safe_indexing(value, rows)


def _take_pairwise(value: Any, rows: np.ndarray, columns: np.ndarray) -> Any:
    """Rows of a precomputed kernel, restricted to the training columns (scikit-learn's ``_safe_split``)."""
    return _take(value, rows)[:, columns]


def _as_node(value: Any, name: str) -> Any:
    """A source for data gpunets can place; the data itself (a constant) for lists and other sequences."""
    from .data import check_placeable
    from .nodes import source

    if value is None:
        return None
    try:
        check_placeable(value, what=name, device="cpu")
    except TypeError:
        return value
    return source(value, name=name)


def _fit_step(est: Any, last: bool, fit_params: dict[str, Any], X: Any, y: Any) -> tuple[Any, Any, float]:
    """Fit one step: ``(fitted, transformed training rows or None, seconds)``, as Pipeline's fit does."""
    if isinstance(X, _Failed):
        return X, X, 0.0
    start = time.perf_counter()
    try:
        if last:
            est.fit(X, **fit_params) if y is None else est.fit(X, y, **fit_params)
            out = None
        elif hasattr(est, "fit_transform"):
            out = est.fit_transform(X, y, **fit_params)
        else:
            out = est.fit(X, y, **fit_params).transform(X)
    except Exception as e:  # noqa: BLE001 - reported by candidate through error_score
        failed = _Failed(e, traceback.format_exc(), time.perf_counter() - start)
        return failed, failed, failed.seconds
    return est, out, time.perf_counter() - start


def _fitted(step: tuple[Any, Any, float]) -> Any:
    return step[0]


def _transformed(step: tuple[Any, Any, float]) -> Any:
    return step[1]


def _seconds(step: tuple[Any, Any, float]) -> float:
    return step[2]


def _transform(est: Any, X: Any) -> Any:
    if isinstance(est, _Failed):
        return est
    if isinstance(X, _Failed):
        return X
    try:
        return est.transform(X)
    except Exception as e:  # noqa: BLE001
        return _Failed(e, traceback.format_exc())


def _score_one(scorer: Any, error_score: Any, train: bool, n_test: int, n_scores: tuple[str, ...] | None,
               est: Any, X_test: Any, y_test: Any, X_train: Any, y_train: Any, *seconds: float) -> dict[str, Any]:
    """One entry of scikit-learn's ``_fit_and_score`` output for one (candidate, fold)."""
    fit_time = float(sum(seconds))
    failed = next((v for v in (est, X_test, X_train) if isinstance(v, _Failed)), None)
    out: dict[str, Any] = {"n_test_samples": n_test, "fit_time": fit_time}
    if failed is not None:
        err = error_score if n_scores is None else {name: error_score for name in n_scores}
        out.update(fit_error=failed.tb, test_scores=err, score_time=0.0, _error=failed.error)
        if train:
            out["train_scores"] = err
        return out
    start = time.perf_counter()
    try:
        out["test_scores"] = _score(est, X_test, y_test, scorer, {}, error_score)
        if train:
            out["train_scores"] = _score(est, X_train, y_train, scorer, {}, error_score)
    except Exception as e:  # noqa: BLE001 - error_score="raise": raised by the search, by candidate
        err = error_score if n_scores is None else {name: error_score for name in n_scores}
        out.update(fit_error=traceback.format_exc(), test_scores=err, score_time=0.0, _error=e)
        if train:
            out["train_scores"] = err
        return out
    out["score_time"] = time.perf_counter() - start
    out["fit_error"] = None
    return out


def _collect(*outs: dict[str, Any]) -> list[dict[str, Any]]:
    return list(outs)


# --- comparing steps --------------------------------------------------------------------------------------------

def _is_estimator(v: Any) -> bool:
    return not isinstance(v, type) and callable(getattr(v, "get_params", None))


def step_key(v: Any) -> Any:
    """A hashable summary of a step: class and ``get_params(deep=False)``, estimators recursively.

    >>> from sklearn.linear_model import Ridge
    >>> step_key(Ridge(alpha=2.0)) == step_key(Ridge(alpha=2.0)), step_key(Ridge()) == step_key(Ridge(alpha=2.0))
    (True, False)
    """
    if _is_estimator(v):
        params = v.get_params(deep=False)
        return ("estimator", type(v), tuple(sorted((k, step_key(p)) for k, p in params.items())))
    if isinstance(v, (list, tuple)):
        return (type(v), tuple(step_key(x) for x in v))
    if isinstance(v, dict):
        return (dict, tuple(sorted((repr(k), step_key(x)) for k, x in v.items())))
    if isinstance(v, np.ndarray):
        return ("array", v.dtype.str, v.shape, v.tobytes())
    try:
        hash(v)
    except TypeError:
        return ("object", id(v))  # unhashable, unknown: never shared
    if isinstance(v, float) and v != v:
        return ("nan",)
    return (type(v), v)


def _steps(est: Any) -> list[tuple[str, Any]] | None:
    """The steps of a plain (memory-free) Pipeline, passthrough steps dropped; None for other estimators."""
    if type(est) is not Pipeline:
        return None
    steps = [(name, s) for name, s in est.steps if s is not None and s != "passthrough"]
    if not steps or steps[-1][0] != est.steps[-1][0]:
        return None  # a passthrough final step: search the pipeline as one step
    return steps


# --- the report ----------------------------------------------------------------------------------------------

@dataclass
class SearchReport:
    """Step fits done by the search against those a candidate-by-candidate search would do.

    Attributes
    ----------
    fits : dict
        ``{step label: fits done}`` over every fold (the refit excluded).
    naive : dict
        ``{step label: candidates × folds}``: what a search fitting each candidate on its own would do.
    transforms : int
        Test-row transforms done by shared steps (a candidate-by-candidate search does one per
        step, candidate and fold).
    seconds : float
        Wall time of the search network.
    """

    fits: dict[str, int] = field(default_factory=dict)
    naive: dict[str, int] = field(default_factory=dict)
    transforms: int = 0
    seconds: float = 0.0

    @property
    def total(self) -> tuple[int, int]:
        """``(fits done, fits a candidate-by-candidate search would do)``."""
        return sum(self.fits.values()), sum(self.naive.values())

    def __repr__(self) -> str:
        done, naive = self.total
        lines = [f"SearchReport ({done} fits instead of {naive}, {self.seconds:.3f} s)",
                 f"  {'step':<24} {'fits':>6} {'naive':>6}"]
        lines += [f"  {k:<24} {self.fits[k]:>6} {self.naive[k]:>6}" for k in self.fits]
        return "\n".join(lines)


# --- the searches ----------------------------------------------------------------------------------------------

class _NetworkSearch(BaseSearchCV):
    """What both searches share: scikit-learn's ``BaseSearchCV`` with ``fit`` run as one gpunets network."""

    _parameter_constraints: dict = {
        "estimator": [HasMethods(["fit"])],
        "scoring": BaseSearchCV._parameter_constraints["scoring"],
        "refit": ["boolean", str, callable],
        "cv": ["cv_object"],
        "error_score": [StrOptions({"raise"}), numbers.Real],
        "return_train_score": ["boolean"],
        "executor": "no_validation",
        "device": "no_validation",
        "workers": [Interval(numbers.Integral, 1, None, closed="left"), None],
    }

    def _candidates(self) -> list[dict[str, Any]]:  # pragma: no cover - subclasses
        raise NotImplementedError

    def _run_search(self, evaluate_candidates: Any, *, callback_ctx: Any = None) -> None:
        evaluate_candidates(self._candidates())

    @_fit_context(prefer_skip_nested_validation=False)
    def fit(self, X: Any, y: Any = None, **params: Any) -> "_NetworkSearch":
        """Run every candidate on every fold as one network, then refit the best on all rows.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,), optional
        **params : dict
            ``groups`` goes to the splitter; other parameters to the estimator's ``fit``
            (split with the rows, as scikit-learn does).

        Returns
        -------
        self
        """
        # --- everything that can be wrong is checked here, before any fit ---
        scorers, refit_metric = self._get_scorers()
        X, y = indexable(X, y)
        params = _check_method_params(X, params=params)
        groups = params.pop("groups", None)
        candidates = self._candidates()
        if not candidates:
            msg = (f"{type(self).__name__} has no candidate to evaluate: the parameter grid is empty. "
                   "Hint: give at least one value per parameter, e.g. {'alpha': [0.1, 1.0]}.")
            raise ValueError(msg)
        base = clone(self.estimator)
        specs = [clone(base).set_params(**clone(p, safe=False)) for p in candidates]  # unknown names raise here
        cv = check_cv(self.cv, y, classifier=is_classifier(self.estimator))
        self.n_splits_ = cv.get_n_splits(X, y, groups)
        splits = list(cv.split(X, y, groups))
        if len(splits) != self.n_splits_:
            msg = (f"cv.split and cv.get_n_splits return inconsistent results. Expected {self.n_splits_} "
                   f"splits, got {len(splits)}")
            raise ValueError(msg)

        outs, report = self._run_network(specs, X, y, splits, scorers, params)
        self.search_report_ = report
        if self.error_score == "raise":
            first = next((o for o in outs if o.get("_error") is not None), None)
            if first is not None:
                raise first["_error"]
        for o in outs:
            o.pop("_error", None)
        _warn_or_raise_about_fit_failures(outs, self.error_score)
        if callable(self.scoring):
            _insert_error_scores(outs, self.error_score)
        results = self._format_results(candidates, self.n_splits_, outs)
        self.multimetric_ = isinstance(outs[0]["test_scores"], dict)
        if callable(self.scoring) and self.multimetric_:
            self._check_refit_for_multimetric(outs[0]["test_scores"])
            refit_metric = self.refit

        if self.refit or not self.multimetric_:
            self.best_index_ = self._select_best_index(self.refit, refit_metric, results)
            if not callable(self.refit):
                self.best_score_ = results[f"mean_test_{refit_metric}"][self.best_index_]
            self.best_params_ = results["params"][self.best_index_]
        if self.refit:
            self.best_estimator_ = clone(base).set_params(**clone(self.best_params_, safe=False))
            start = time.time()
            if y is not None:
                self.best_estimator_.fit(X, y, **params)
            else:
                self.best_estimator_.fit(X, **params)
            self.refit_time_ = time.time() - start
            if hasattr(self.best_estimator_, "feature_names_in_"):
                self.feature_names_in_ = self.best_estimator_.feature_names_in_
        from sklearn.metrics._scorer import _MultimetricScorer

        self.scorer_ = scorers._scorers if isinstance(scorers, _MultimetricScorer) else scorers
        self.cv_results_ = results
        return self

    # --- the network ---------------------------------------------------------------------------------
    def _run_network(self, specs: list[Any], X: Any, y: Any, splits: list[tuple[np.ndarray, np.ndarray]],
                     scorers: Any, params: dict[str, Any]) -> tuple[list[dict[str, Any]], SearchReport]:
        from sklearn.metrics._scorer import _MultimetricScorer

        from .network import evaluate
        from .nodes import node
        from sklearn.utils import get_tags

        steps = [None if params else _steps(s) for s in specs]
        if any(s is None for s in steps):
            label = type(self.estimator).__name__
            steps = [[(label, s)] for s in specs]
        names = [n for n, _ in steps[0]]
        report = SearchReport(fits={n: 0 for n in names}, naive={n: len(specs) * len(splits) for n in names})
        n_scores = tuple(scorers._scorers) if isinstance(scorers, _MultimetricScorer) else None
        train_score = bool(self.return_train_score)
        Xs, ys = _as_node(X, "X"), _as_node(y, "y")
        pairwise = get_tags(self.estimator).input_tags.pairwise
        score_nodes = []
        folds = []
        for train, test in splits:
            if pairwise:
                Xtr, Xte = node(_take_pairwise, Xs, train, train), node(_take_pairwise, Xs, test, train)
            else:
                Xtr, Xte = node(_take, Xs, train), node(_take, Xs, test)
            ytr = None if ys is None else node(_take, ys, train)
            yte = None if ys is None else node(_take, ys, test)
            fp = _check_method_params(X, params=params, indices=train)
            folds.append((Xtr, Xte, ytr, yte, fp, len(test)))
        for Xtr, Xte, ytr, yte, fp, n_test in folds:
            shared: dict[Any, tuple[Any, Any, Any, Any]] = {}
            per_candidate = []
            for cand_steps in steps:
                key: Any = ()
                up_train, up_test, up_score = Xtr, Xte, Xtr   # fit input, test rows, train rows for scoring
                times = []
                fitted = None
                for i, (name, est) in enumerate(cand_steps):
                    last = i == len(cand_steps) - 1
                    key = (key, step_key(est))
                    hit = shared.get(key)
                    if hit is None:
                        step = node(_fit_step, clone(est), last, fp if last else {}, up_train, ytr)
                        fitted = node(_fitted, step)
                        report.fits[name] += 1
                        if last:
                            hit = (fitted, None, None, node(_seconds, step), None)
                        else:
                            report.transforms += 1
                            hit = (fitted, node(_transformed, step), node(_transform, fitted, up_test),
                                   node(_seconds, step),
                                   node(_transform, fitted, up_score) if train_score else None)
                        shared[key] = hit
                    fitted, up_train, next_test, t, next_score = hit
                    times.append(t)
                    if not last:
                        up_test, up_score = next_test, next_score
                per_candidate.append(node(_score_one, scorers, self.error_score, train_score, n_test, n_scores,
                                          fitted, up_test, yte, up_score if train_score else None,
                                          ytr if train_score else None, *times))
            score_nodes.append(per_candidate)
        # scikit-learn's order: candidate-major, fold-minor
        ordered = [score_nodes[f][c] for c in range(len(specs)) for f in range(len(splits))]
        target = node(_collect, *ordered)
        opts = {"executor": None if self.executor == "auto" else self.executor, "workers": self.workers}
        start = time.perf_counter()
        device = self.device
        if device is not None and device != "auto":
            from .config import config
            from .devices import override_placement

            with config(device=device), override_placement(device):
                outs = evaluate(target, output="device", **opts)
        else:
            outs = evaluate(target, output="device", **opts)
        report.seconds = time.perf_counter() - start
        return outs, report


class GridSearchCV(_NetworkSearch):
    """Exhaustive search over a parameter grid, run as one learning network.

    A drop-in for :class:`sklearn.model_selection.GridSearchCV` (same
    ``cv_results_``, ranks and best candidate); steps that candidates share are
    fitted once per fold (see :mod:`gpunets.tuning`).

    Parameters
    ----------
    estimator : estimator
        A scikit-learn Pipeline (each step shared where candidates agree), a
        gpunets composite or stack, or any estimator.
    param_grid : dict or list of dicts
        As in scikit-learn (``step__param`` names for pipelines).
    scoring, refit, cv, error_score, return_train_score :
        As in scikit-learn.
    executor : {"auto", "serial", "threads", "streams", "dask"} or Executor
        Where the search network runs.
    device : str
        ``"auto"``, ``"cpu"``, ``"cuda"``...: placement of the network.
    workers : int, optional
        Threads or lanes (default: the cores).

    Attributes
    ----------
    cv_results_, best_params_, best_score_, best_index_, best_estimator_, scorer_, n_splits_, refit_time_,
    multimetric_ :
        As in scikit-learn.
    search_report_ : SearchReport
        Step fits done against those of a candidate-by-candidate search.

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> from sklearn.linear_model import Ridge
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(40, 3)), rng.normal(size=40)
    >>> s = gn.GridSearchCV(Ridge(), {"alpha": [0.1, 10.0]}, cv=2).fit(X, y)
    >>> s.best_params_, s.cv_results_["rank_test_score"].tolist()
    ({'alpha': 10.0}, [2, 1])
    """

    _parameter_constraints: dict = {**_NetworkSearch._parameter_constraints, "param_grid": [dict, list]}

    def __init__(self, estimator: Any, param_grid: Any, *, scoring: Any = None, refit: Any = True, cv: Any = None,
                 error_score: Any = np.nan, return_train_score: bool = False, executor: Any = "auto",
                 device: Any = "auto", workers: int | None = None) -> None:
        self.estimator = estimator
        self.param_grid = param_grid
        self.scoring = scoring
        self.refit = refit
        self.cv = cv
        self.error_score = error_score
        self.return_train_score = return_train_score
        self.executor = executor
        self.device = device
        self.workers = workers

    def _candidates(self) -> list[dict[str, Any]]:
        return list(ParameterGrid(self.param_grid))


class RandomizedSearchCV(_NetworkSearch):
    """Search over ``n_iter`` candidates sampled from distributions, run as one learning network.

    A drop-in for :class:`sklearn.model_selection.RandomizedSearchCV` (the
    same candidates for the same ``random_state``); parameters as
    :class:`GridSearchCV` plus ``param_distributions``, ``n_iter`` and
    ``random_state``.

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> from scipy.stats import loguniform
    >>> from sklearn.linear_model import Ridge
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(40, 3)), rng.normal(size=40)
    >>> s = gn.RandomizedSearchCV(Ridge(), {"alpha": loguniform(1e-2, 1e2)}, n_iter=4, cv=2, random_state=0)
    >>> len(s.fit(X, y).cv_results_["params"])
    4
    """

    _parameter_constraints: dict = {
        **_NetworkSearch._parameter_constraints,
        "param_distributions": [dict, list],
        "n_iter": [Interval(numbers.Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
    }

    def __init__(self, estimator: Any, param_distributions: Any, *, n_iter: int = 10, scoring: Any = None,
                 refit: Any = True, cv: Any = None, random_state: Any = None, error_score: Any = np.nan,
                 return_train_score: bool = False, executor: Any = "auto", device: Any = "auto",
                 workers: int | None = None) -> None:
        self.estimator = estimator
        self.param_distributions = param_distributions
        self.n_iter = n_iter
        self.scoring = scoring
        self.refit = refit
        self.cv = cv
        self.random_state = random_state
        self.error_score = error_score
        self.return_train_score = return_train_score
        self.executor = executor
        self.device = device
        self.workers = workers

    def _candidates(self) -> list[dict[str, Any]]:
        return list(ParameterSampler(self.param_distributions, self.n_iter, random_state=self.random_state))

"""Successive halving as learning networks: :class:`HalvingGridSearchCV`, :class:`HalvingRandomSearchCV`.

scikit-learn's successive-halving searches (its ``BaseSuccessiveHalving``: the same parameters, the same
candidates per rung, the same ``cv_results_``, ``n_resources_``, ``n_candidates_``, ``n_iterations_``...)
with each rung's ``evaluate_candidates`` run as one gpunets network, as :class:`~gpunets.GridSearchCV`
runs its candidates: steps the rung's candidates share are fitted once per fold and resource size.

With an iteration budget as the resource (``resource="n_estimators"``, ``max_iter``...: a parameter of
``gn.config(warm_params=...)``) each survivor's last step continues its fit of the previous rung with a
warm update instead of being refitted (:mod:`gpunets.tuning.warm`; ``warm_start=False`` refits as
scikit-learn does).  ``search_report_.rungs`` gives each rung's fits, warm updates and shared fits saved.

>>> import numpy as np, gpunets as gn
>>> from sklearn.linear_model import Ridge
>>> rng = np.random.default_rng(0)
>>> X, y = rng.normal(size=(120, 4)), rng.normal(size=120)
>>> s = gn.HalvingGridSearchCV(Ridge(), {"alpha": [0.01, 0.1, 1.0, 10.0]}, cv=3, factor=2, random_state=0)
>>> s.fit(X, y).n_candidates_, s.n_resources_
([4, 2, 1], [30, 60, 120])
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
from sklearn.base import _fit_context, clone

try:   # scikit-learn >= 1.10: out of experimental
    from sklearn.model_selection import HalvingGridSearchCV as _SkHalvingGrid
    from sklearn.model_selection import HalvingRandomSearchCV as _SkHalvingRandom
except ImportError:   # the private module needs no experimental flag
    from sklearn.model_selection._search_successive_halving import HalvingGridSearchCV as _SkHalvingGrid
    from sklearn.model_selection._search_successive_halving import HalvingRandomSearchCV as _SkHalvingRandom
from sklearn.model_selection._search_successive_halving import BaseSuccessiveHalving
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import _num_samples

from gpunets.tuning import dropin, memory, stored, warm
from gpunets.tuning.report import SearchReport
from gpunets.tuning.search import _NetworkSearch

__all__ = ["HalvingGridSearchCV", "HalvingRandomSearchCV"]

_GN_CONSTRAINTS: dict = {
    "executor": "no_validation",
    "device": "no_validation",
    "workers": [Interval(numbers.Integral, 1, None, closed="left"), None],
    "warm_start": ["boolean", StrOptions({"auto"})],
}


class _Halving(_NetworkSearch):
    """What both halving searches add to :class:`~gpunets.tuning.search._NetworkSearch`: scikit-learn's
    rungs (its ``_run_search``), its checks, and warm-started iteration budgets."""

    _run_search = BaseSuccessiveHalving._run_search

    def _check_candidates(self) -> None:
        return None   # HalvingRandomSearchCV's candidates need min_resources_: checked with the input

    def _check_search_input(self, X: Any, y: Any, split_params: dict[str, Any]) -> None:
        self._check_input_parameters(X=X, y=y, split_params=split_params)   # scikit-learn's refusals
        self._gn_warm = warm.check_warm(self)
        grid = getattr(self, "param_grid", None)
        if grid is not None and not list(self._generate_candidate_params()):
            msg = (f"{type(self).__name__} has no candidate to evaluate: the parameter grid is empty. "
                   "Hint: give at least one value per parameter, e.g. {'alpha': [0.1, 1.0]}.")
            raise ValueError(msg)

    @_fit_context(prefer_skip_nested_validation=False)
    def fit(self, X: Any, y: Any = None, **params: Any) -> Any:
        """Run the rungs, each as one network, then refit the best candidate of the last rung on all rows.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,), optional
        **params : dict
            ``groups`` goes to the splitter; other parameters to the estimator's ``fit``.

        Returns
        -------
        self
        """
        return self._halving_fit(X, y, **params)

    def _halving_fit(self, X: Any, y: Any, **params: Any) -> Any:
        self._n_samples_orig = _num_samples(X)
        self._fit(X, y, **params)
        # BaseSearchCV leaves best_score_ unset when refit is a callable: scikit-learn's halving sets it
        self.best_score_ = self.cv_results_["mean_test_score"][self.best_index_]
        return self

    def _search_report(self, reports: list[SearchReport]) -> SearchReport:
        return SearchReport.merged(reports)

    # --- warm-started iteration budgets ------------------------------------------------------------
    def _resource_free_keys(self, candidates: list[dict[str, Any]]) -> list[Any]:
        base = clone(self.estimator)
        keys = []
        for cand in candidates:
            rest = {k: v for k, v in cand.items() if k != self.resource}
            keys.append(memory.candidate_key(clone(base).set_params(**clone(rest, safe=False))))
        return keys

    def _warm_plan(self, candidates: list[dict[str, Any]], splits: Any, mem: Any) -> Any:
        if not getattr(self, "_gn_warm", False):
            return None
        _, param = warm.warm_target(self.estimator, self.resource) or (None, self.resource)
        # a rung of few tasks: its forests grow their trees on every lane (the lanes idle at its end help)
        jobs = warm.inner_jobs(len(candidates) * len(splits), warm.lanes(self.executor, dropin.workers(self)))
        budgets = [c.get(self.resource) for c in candidates]
        plan = warm.WarmPlan(param, self._resource_free_keys(candidates), mem.fold_keys(splits), mem.fitted, jobs,
                             budgets, mem.grown)
        mem.plan = plan
        return plan

    def _after_run(self, candidates: list[dict[str, Any]], splits: Any, outs: list[dict[str, Any]],
                   mem: Any) -> None:
        fitted = [o.pop("_fitted", None) for o in outs]
        if not getattr(self, "_gn_warm", False):
            return
        keys, folds = self._resource_free_keys(candidates), mem.fold_keys(splits)
        plan, mem.plan = mem.plan, None
        for i, est in enumerate(fitted):
            c, f = divmod(i, len(splits))
            if keys[c] is None or outs[i] is None or not stored.keepable(outs[i]):
                continue
            budget = candidates[c][self.resource]
            lineage = (None if plan is None else plan.lineage(c, f)) or (budget,)
            mem.grown[(keys[c], folds[f])] = (budget, lineage)   # the budgets it grew through: the next rung's keys
            if est is not None:
                mem.fitted[(keys[c], folds[f])] = (budget, est, lineage)
        # only this rung's fits can be continued: the previous rung's are dropped
        live = {(keys[c], folds[f]) for c in range(len(candidates)) for f in range(len(splits))}
        for k in [k for k in mem.fitted if k not in live]:
            del mem.fitted[k]


class HalvingGridSearchCV(_Halving, _SkHalvingGrid):
    """Successive halving over a parameter grid, each rung run as one learning network.

    A drop-in for scikit-learn's :class:`~sklearn.model_selection.HalvingGridSearchCV` (same parameters,
    rungs, ``cv_results_``, ``n_resources_``, ``n_candidates_``, ``n_iterations_``, best candidate); the
    steps a rung's candidates share are fitted once per fold.

    Parameters
    ----------
    estimator : estimator
        A scikit-learn Pipeline (steps shared where candidates agree), a gpunets composite or stack, or
        any estimator.
    param_grid : dict or list of dicts
        As in scikit-learn.
    factor, resource, max_resources, min_resources, aggressive_elimination, cv, scoring, refit, error_score, return_train_score, random_state :
        As in scikit-learn (its refusals of bad values, before any fit).
    n_jobs : int, optional
        scikit-learn's name for ``workers``: ``-1`` all cores, ``None`` the executor's default.
    verbose : int
        As in scikit-learn (the rung summaries and one line per rung).
    executor : {"auto", "serial", "threads", "streams", "dask"} or Executor
        Where each rung's network runs.
    device : str
        ``"auto"``, ``"cpu"``, ``"cuda"``...: placement of the networks.
    workers : int, optional
        Threads or lanes (default: the cores).
    warm_start : {"auto", True, False}, default "auto"
        With an iteration budget as ``resource``: continue each survivor's fit of the previous rung
        (``"auto"``: where the warm-update rules allow it; ``True``: or raise, listing the resources they
        know); ``False``: refit each rung, as scikit-learn does.

    Attributes
    ----------
    cv_results_, best_params_, best_score_, best_index_, best_estimator_, scorer_, n_splits_, refit_time_, multimetric_, n_resources_, n_candidates_, n_remaining_candidates_, n_iterations_, n_possible_iterations_, n_required_iterations_, min_resources_, max_resources_ :
        As in scikit-learn.
    search_report_ : SearchReport
        Step fits done against a candidate-by-candidate search; ``rungs``: each rung's report.

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> from sklearn.ensemble import RandomForestRegressor
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(80, 3)), rng.normal(size=80)
    >>> s = gn.HalvingGridSearchCV(RandomForestRegressor(random_state=0), {"max_depth": [2, 3, 4]}, cv=2,
    ...                            resource="n_estimators", min_resources=2, max_resources=6, random_state=0)
    >>> s.fit(X, y).n_resources_, s.search_report_.warm
    ([2, 6], 2)
    """

    _parameter_constraints: dict = {**_SkHalvingGrid._parameter_constraints, **_GN_CONSTRAINTS}

    def __init__(self, estimator: Any, param_grid: Any, *, factor: float = 3, resource: str = "n_samples",
                 max_resources: Any = "auto", min_resources: Any = "exhaust", aggressive_elimination: bool = False,
                 cv: Any = 5, scoring: Any = None, refit: Any = True, error_score: Any = np.nan,
                 return_train_score: bool = True, random_state: Any = None, n_jobs: int | None = None,
                 verbose: int = 0, executor: Any = "auto", device: Any = "auto", workers: int | None = None,
                 warm_start: Any = "auto") -> None:
        super().__init__(estimator, param_grid, factor=factor, resource=resource, max_resources=max_resources,
                         min_resources=min_resources, aggressive_elimination=aggressive_elimination, cv=cv,
                         scoring=scoring, refit=refit, error_score=error_score,
                         return_train_score=return_train_score, random_state=random_state, n_jobs=n_jobs,
                         verbose=verbose)
        self.executor = executor
        self.device = device
        self.workers = workers
        self.warm_start = warm_start


class HalvingRandomSearchCV(_Halving, _SkHalvingRandom):
    """Successive halving over sampled candidates, each rung run as one learning network.

    A drop-in for scikit-learn's :class:`~sklearn.model_selection.HalvingRandomSearchCV` (the same
    candidates for the same ``random_state``); parameters as :class:`HalvingGridSearchCV` with
    ``param_distributions`` and ``n_candidates`` instead of ``param_grid``.

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> from scipy.stats import loguniform
    >>> from sklearn.linear_model import Ridge
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(90, 3)), rng.normal(size=90)
    >>> s = gn.HalvingRandomSearchCV(Ridge(), {"alpha": loguniform(1e-2, 1e2)}, n_candidates=6, cv=3,
    ...                              random_state=0).fit(X, y)
    >>> s.n_candidates_
    [6, 2]
    """

    _parameter_constraints: dict = {**_SkHalvingRandom._parameter_constraints, **_GN_CONSTRAINTS}

    def __init__(self, estimator: Any, param_distributions: Any, *, n_candidates: Any = "exhaust",
                 factor: float = 3, resource: str = "n_samples", max_resources: Any = "auto",
                 min_resources: Any = "smallest", aggressive_elimination: bool = False, cv: Any = 5,
                 scoring: Any = None, refit: Any = True, error_score: Any = np.nan, return_train_score: bool = True,
                 random_state: Any = None, n_jobs: int | None = None, verbose: int = 0, executor: Any = "auto",
                 device: Any = "auto", workers: int | None = None, warm_start: Any = "auto") -> None:
        super().__init__(estimator, param_distributions, n_candidates=n_candidates, factor=factor,
                         resource=resource, max_resources=max_resources, min_resources=min_resources,
                         aggressive_elimination=aggressive_elimination, cv=cv, scoring=scoring, refit=refit,
                         error_score=error_score, return_train_score=return_train_score,
                         random_state=random_state, n_jobs=n_jobs, verbose=verbose)
        self.executor = executor
        self.device = device
        self.workers = workers
        self.warm_start = warm_start

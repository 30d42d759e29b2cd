"""``n_jobs=k`` on a search fits its candidates side by side (issue 35 item 11)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from sklearn.ensemble import RandomForestRegressor
from sklearn.linear_model import Ridge

import gpunets as gn


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 5))
    return X, X @ rng.normal(size=5) + rng.normal(size=120)


def _executors(search) -> set[str]:
    report = search.search_report_
    return {r.trace.executor.split(" ")[0] for r in getattr(report, "rungs", None) or [report]}


@pytest.mark.parametrize(("n_jobs", "expected"), [(2, "threads"), (-1, "threads"), (1, "serial")])
@pytest.mark.parametrize("halving", [False, True], ids=["grid", "halving"])
def test_n_jobs_on_auto_runs_candidates_side_by_side(n_jobs, expected, halving, data, executor):
    """Where the executor is left to "auto", n_jobs=k (or -1) runs the (candidate, fold) fits on k threads
    (before: auto chose serial, one lane); n_jobs=1 on one."""
    X, y = data
    est, grid = RandomForestRegressor(n_estimators=5, random_state=0), {"max_depth": [2, 4, None]}
    with gn.config(executor="auto"):
        if halving:
            s = gn.HalvingGridSearchCV(est, grid, cv=3, resource="n_samples", random_state=0, n_jobs=n_jobs)
        else:
            s = gn.GridSearchCV(est, grid, cv=3, n_jobs=n_jobs)
        s.fit(X, y)
    assert _executors(s) == {expected}
    limit = n_jobs if n_jobs > 0 else os.cpu_count()
    assert all(len(lanes) <= limit for lanes in s.search_report_.where.values())
    # the same answers as scikit-learn's search (n_jobs changes where fits run, never what they give)
    from sklearn.model_selection import GridSearchCV

    if not halving:
        sk = GridSearchCV(est, grid, cv=3).fit(X, y)
        np.testing.assert_allclose(s.cv_results_["mean_test_score"], sk.cv_results_["mean_test_score"], rtol=1e-12)


def test_n_jobs_keeps_a_chosen_executor(data, executor):
    """An executor the user chose (configured, as each executor fixture does, or given) is kept: n_jobs gives
    it its workers only."""
    X, y = data
    s = gn.GridSearchCV(Ridge(), {"alpha": [0.1, 1.0]}, cv=3, n_jobs=2).fit(X, y)
    assert _executors(s) == {executor.name}
    given = gn.GridSearchCV(Ridge(), {"alpha": [0.1, 1.0]}, cv=3, n_jobs=2, executor="serial").fit(X, y)
    assert _executors(given) == {"serial"}


def test_n_jobs_none_leaves_auto_its_choice(data, executor):
    X, y = data
    with gn.config(executor="auto"):
        s = gn.GridSearchCV(Ridge(), {"alpha": [0.1, 1.0]}, cv=3).fit(X, y)
    assert _executors(s) == {"serial"}   # auto's choice for short fits on one device, as before

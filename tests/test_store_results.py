"""What a search remembers and stores of its (candidate, fold) results (issue 35 items 3 and 7): a failure is
never kept, and a warm-started result is keyed as one (a cold search never gets it)."""

import os
import warnings

import numpy as np
import pytest
from sklearn import model_selection as skms
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.exceptions import FitFailedWarning
from sklearn.linear_model import Ridge

import gpunets as gn


class Flaky(RegressorMixin, BaseEstimator):
    """A Ridge whose fit (or predict) fails for alpha > 0.5 while the file ``fault`` exists: a passing fault."""

    def __init__(self, alpha=1.0, fault="", where="fit"):
        self.alpha, self.fault, self.where = alpha, fault, where

    def _check(self, where):
        if self.where == where and self.alpha > 0.5 and os.path.exists(self.fault):
            raise ValueError("resource busy (for now)")

    def fit(self, X, y):
        self._check("fit")
        self.model_ = Ridge(alpha=self.alpha).fit(X, y)
        return self

    def predict(self, X):
        self._check("predict")
        return self.model_.predict(X)


def _data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(90, 4))
    return X, X @ rng.normal(size=4) + rng.normal(scale=0.1, size=90)


def _fit_quietly(search, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FitFailedWarning)
        warnings.simplefilter("ignore", UserWarning)
        return search.fit(X, y)


@pytest.mark.parametrize("where", ["fit", "predict"])
def test_a_failure_is_not_remembered_by_the_search(tmp_path, executor, where):
    X, y = _data()
    fault = tmp_path / "fault"
    fault.write_text("")
    grid = {"alpha": [0.1, 1.0]}
    search = gn.GridSearchCV(Flaky(fault=str(fault), where=where), grid, cv=3, executor=executor)
    first = _fit_quietly(search, X, y).cv_results_["mean_test_score"]
    assert np.isnan(first[1]) and not np.isnan(first[0])
    fault.unlink()   # the fault is gone: the same search object fits the failed candidate again
    again = search.fit(X, y)
    theirs = skms.GridSearchCV(Flaky(fault=str(fault), where=where), grid, cv=3).fit(X, y)
    np.testing.assert_array_equal(again.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"])
    assert again.search_report_.remembered == 3   # the candidate that succeeded, from memory


@pytest.mark.parametrize("where", ["fit", "predict"])
def test_a_failure_is_not_stored(tmp_path, executor, where):
    X, y = _data()
    fault = tmp_path / "fault"
    fault.write_text("")
    grid = {"alpha": [0.1, 1.0]}
    with gn.config(store=gn.Store(tmp_path / "store")):
        first = _fit_quietly(gn.GridSearchCV(Flaky(fault=str(fault), where=where), grid, cv=3, executor=executor),
                             X, y)
        assert np.isnan(first.cv_results_["mean_test_score"][1])
        fault.unlink()
        again = gn.GridSearchCV(Flaky(fault=str(fault), where=where), grid, cv=3, executor=executor).fit(X, y)
    theirs = skms.GridSearchCV(Flaky(fault=str(fault), where=where), grid, cv=3).fit(X, y)
    np.testing.assert_array_equal(again.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"])
    assert again.search_report_.remembered == 3   # the candidate that succeeded, from the store


# --- item 3: a warm-started result is keyed as one ------------------------------------------------------

def _net():
    from sklearn.neural_network import MLPRegressor

    # a warm continuation restarts the optimiser (Adam's moments) from the previous weights: its scores differ
    return MLPRegressor(hidden_layer_sizes=(4,), random_state=0, learning_rate_init=0.05)


def _halving(cls, executor=None, **kw):
    params = dict(resource="max_iter", min_resources=2, max_resources=18, factor=3, cv=3, random_state=0,
                  return_train_score=False)
    if executor is not None:
        params["executor"] = executor
    return cls(_net(), {"alpha": [1e-4, 1e-2, 1.0, 3.0, 10.0]}, **params, **kw)


def _sk_halving():
    from sklearn.experimental import enable_halving_search_cv  # noqa: F401

    return _halving(skms.HalvingGridSearchCV).fit(*_data())


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_a_warm_result_is_not_served_to_the_same_search_set_cold(executor):
    X, y = _data()
    search = _halving(gn.HalvingGridSearchCV, executor).fit(X, y)
    assert search.search_report_.warm > 0
    warm_scores = search.cv_results_["mean_test_score"].copy()
    again = search.fit(X, y)   # warm again: the warm results from memory
    np.testing.assert_array_equal(again.cv_results_["mean_test_score"], warm_scores)
    assert again.search_report_.fitted == 0
    cold = search.set_params(warm_start=False).fit(X, y)
    theirs = _sk_halving()
    assert not np.array_equal(warm_scores, theirs.cv_results_["mean_test_score"])   # the warm start is inexact
    np.testing.assert_array_equal(cold.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"])
    assert cold.best_params_ == theirs.best_params_


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_a_warm_result_is_not_served_from_the_store_to_a_cold_search(tmp_path, executor):
    X, y = _data()
    with gn.config(store=gn.Store(tmp_path / "store")):
        warm = _halving(gn.HalvingGridSearchCV, executor).fit(X, y)
        assert warm.search_report_.warm > 0
        res = warm.cv_results_
        rung = [p["alpha"] for p, it in zip(res["params"], res["iter"]) if it == 1]
        grid = {"alpha": rung, "max_iter": [6]}   # the second rung's candidates, fitted cold
        ours = gn.GridSearchCV(_net(), grid, cv=3, executor=executor).fit(X, y)
        cold = _halving(gn.HalvingGridSearchCV, executor, warm_start=False).fit(X, y)
        rerun = _halving(gn.HalvingGridSearchCV, executor).fit(X, y)   # warm again: its own results, stored
    theirs = skms.GridSearchCV(_net(), grid, cv=3).fit(X, y)
    np.testing.assert_array_equal(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"])
    np.testing.assert_array_equal(cold.cv_results_["mean_test_score"], _sk_halving().cv_results_["mean_test_score"])
    np.testing.assert_array_equal(rerun.cv_results_["mean_test_score"], res["mean_test_score"])
    assert rerun.search_report_.fitted == 0   # a new search object: every rung, the warm ones too, from the store

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

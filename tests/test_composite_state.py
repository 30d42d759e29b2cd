"""Composites and stacks (issue 12): a failed fit changes nothing; ``executor="auto"`` follows gn.config."""

import numpy as np
import pandas as pd
import pytest
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge

import gpunets as gn


class Flaky(ClassifierMixin, BaseEstimator):
    """A logistic regression that fails to fit when told to."""

    def __init__(self, fail=False):
        self.fail = fail

    def fit(self, X, y):
        if self.fail:
            raise ValueError("planted failure in Flaky")
        self.lr_ = LogisticRegression().fit(X, y)
        self.classes_ = self.lr_.classes_
        return self

    def predict_proba(self, X):
        return self.lr_.predict_proba(X)

    def predict(self, X):
        return self.lr_.predict(X)


def test_a_failed_composite_fit_keeps_every_fitted_attribute(executor):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = np.where(X[:, 0] > 0, "a", "b")
    clf = gn.StackingClassifier([("lr", LogisticRegression()), ("flaky", Flaky())], cv=3).fit(X, y)
    before = clf.predict_proba(X)
    frame = pd.DataFrame(rng.normal(size=(60, 4)), columns=list("pqrs"))
    y3 = np.array(["a", "b", "c"] * 20)
    clf.set_params(flaky__fail=True)
    with pytest.raises(gn.FitError, match="planted failure"):
        clf.fit(frame, y3)
    assert clf.n_features_in_ == 3 and not hasattr(clf, "feature_names_in_")
    assert clf.classes_.tolist() == ["a", "b"]
    np.testing.assert_array_equal(clf.predict_proba(X), before)


def test_executor_auto_follows_the_configured_executor():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 3)), rng.normal(size=40)
    stack = gn.StackingRegressor([("ridge", Ridge()), ("lr", LinearRegression())], cv=3)
    for name in ("serial", "threads", "streams"):
        with gn.config(executor=name):
            stack.fit(X, y)
            assert stack.fit_report_.executor.startswith(name)
            stack.predict(X)
            assert gn.last_trace().executor.startswith(name)
    gn.set_config(executor="streams")
    try:
        assert stack.fit(X, y).fit_report_.executor.startswith("streams")
    finally:
        gn.set_config(executor="auto")

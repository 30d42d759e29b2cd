"""What the stacking test modules share: fitting counters, counting estimators and the data fixtures.

Import the fixtures into a test module (``from tests.stacking_support import reg_data, ...``) to use them.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.linear_model import LogisticRegression, Ridge

FITS: collections.Counter = collections.Counter()


class CountingRegressor(RegressorMixin, BaseEstimator):
    def __init__(self, tag="r", alpha=1.0):
        self.tag, self.alpha = tag, alpha

    def fit(self, X, y):
        FITS[self.tag] += 1
        self.model_ = Ridge(alpha=self.alpha).fit(X, y)
        return self

    def predict(self, X):
        return self.model_.predict(X)


class CountingClassifier(ClassifierMixin, BaseEstimator):
    def __init__(self, tag="c"):
        self.tag = tag

    def fit(self, X, y):
        FITS[self.tag] += 1
        self.model_ = LogisticRegression().fit(X, y)
        self.classes_ = self.model_.classes_
        return self

    def predict_proba(self, X):
        return self.model_.predict_proba(X)

    def predict(self, X):
        return self.model_.predict(X)


@pytest.fixture(autouse=True)
def _reset():
    FITS.clear()


@pytest.fixture
def reg_data():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(150, 5))
    y = X[:, 0] - 2 * X[:, 1] ** 2 + 0.1 * rng.normal(size=150)
    return X, y


@pytest.fixture
def clf_data():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(150, 4))
    y = np.array(["cat", "dog", "eel"])[(X[:, 0] > 0).astype(int) + (X[:, 1] > 0.3).astype(int)]
    return X, y

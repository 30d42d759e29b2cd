"""scikit-learn's estimator checks on composites and stacks (small, fast models, serial executor)."""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge
from sklearn.naive_bayes import GaussianNB
from sklearn.preprocessing import LabelEncoder
from sklearn.tree import DecisionTreeRegressor
from sklearn.utils.estimator_checks import parametrize_with_checks

import gpunets as gn


def _wmean(w, *values):
    return sum(wi * v for wi, v in zip(w, values)) / sum(w)


def _argmax(p):
    return np.argmax(p, axis=1)


class AveragedRegressor(gn.CompositeRegressor):
    """Weighted average of two regressors."""

    def __init__(self, first=None, second=None, weight=0.5, executor="serial", device="auto"):
        self.first, self.second, self.weight = first, second, weight
        self.executor, self.device = executor, device

    def network(self, X, y):
        from functools import partial

        a = gn.machine(self.first if self.first is not None else Ridge(), X, y)
        b = gn.machine(self.second if self.second is not None else LinearRegression(), X, y)
        return {"predict": gn.node(partial(_wmean, (self.weight, 1 - self.weight)), a.predict(X), b.predict(X))}


class AveragedClassifier(gn.CompositeClassifier):
    """Average of two classifiers' probabilities; predict decodes the argmax."""

    def __init__(self, first=None, second=None, executor="serial", device="auto"):
        self.first, self.second = first, second
        self.executor, self.device = executor, device

    def network(self, X, y):
        from functools import partial

        le = gn.machine(LabelEncoder(), y)
        a = gn.machine(self.first if self.first is not None else LogisticRegression(), X, y)
        b = gn.machine(self.second if self.second is not None else GaussianNB(), X, y)
        proba = gn.node(partial(_wmean, (1.0, 1.0)), a.predict_proba(X), b.predict_proba(X))
        return {"predict_proba": proba, "predict": le.inverse_transform(gn.node(_argmax, proba))}


ESTIMATORS = [
    AveragedRegressor(),
    AveragedClassifier(),
    gn.StackingRegressor([("ridge", Ridge()), ("tree", DecisionTreeRegressor(max_depth=3, random_state=0))],
                         final_estimator=LinearRegression(), cv=3, executor="serial"),
    gn.StackingClassifier([("lr", LogisticRegression()), ("nb", GaussianNB())], cv=3, executor="serial"),
]

@parametrize_with_checks(ESTIMATORS)   # every check passes: no expected failures (issue 35 item 15)
def test_sklearn_compatible(estimator, check):
    check(estimator)

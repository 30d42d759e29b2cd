"""Estimators that are not thread-safe run one at a time on every executor."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import LinearSVC

import gpunets as gn
from gpunets.compute.threadsafety import unsafe_groups

_ACTIVE = {"now": 0, "max": 0}
_LOCK = threading.Lock()


def _enter() -> None:
    with _LOCK:
        _ACTIVE["now"] += 1
        _ACTIVE["max"] = max(_ACTIVE["max"], _ACTIVE["now"])
    time.sleep(0.03)
    with _LOCK:
        _ACTIVE["now"] -= 1


class Overlap(RegressorMixin, BaseEstimator):
    """Records how many of its fits and calls overlap in time."""

    def __init__(self, k=0):
        self.k = k

    def fit(self, X, y):
        _enter()
        self.mean_ = float(np.mean(y)) + self.k
        return self

    def predict(self, X):
        _enter()
        return np.full(len(X), self.mean_)


class DeclaredUnsafe(Overlap):
    __gpunets_thread_safe__ = False


class SharesLiblinear(Overlap):
    __gpunets_thread_safe__ = "liblinear"


def _network(cls, n=4):
    X = gn.source(np.ones((8, 2)), name="X")
    y = gn.source(np.arange(8.0), name="y")
    return gn.hstack(*[gn.machine(cls(k=i), X, y).predict(X) for i in range(n)])


def _max_overlap(node, executor):
    _ACTIVE.update(now=0, max=0)
    node.fit(force=True, executor=executor, workers=4)
    node(executor=executor, workers=4)
    return _ACTIVE["max"]


@pytest.mark.parametrize("executor", ["threads", "streams"])
def test_declared_estimators_fit_and_run_one_at_a_time(executor):
    assert _max_overlap(_network(Overlap), executor) > 1      # the measure sees overlap when allowed
    assert _max_overlap(_network(DeclaredUnsafe), executor) == 1
    with gn.config(thread_unsafe=[Overlap]):
        assert _max_overlap(_network(Overlap), executor) == 1
    with gn.config(thread_unsafe=[f"{__name__}.Overlap"]):
        assert _max_overlap(_network(Overlap), executor) == 1


def test_groups_of_builtin_user_and_meta_estimators():
    assert unsafe_groups(make_pipeline(StandardScaler(), LinearSVC())) == ("liblinear",)
    assert unsafe_groups(SharesLiblinear()) == ("liblinear",)
    assert unsafe_groups(SharesLiblinear(), calls=True) == ("liblinear",)
    assert unsafe_groups(LinearSVC(), calls=True) == ()      # liblinear's state is used while fitting only
    assert unsafe_groups(DeclaredUnsafe()) == (f"{__name__}.DeclaredUnsafe",)
    assert unsafe_groups(Overlap()) == ()


class NetOfUnsafe(DeclaredUnsafe):
    """Declared not thread-safe, and its fit trains a network of such models on threads."""

    def fit(self, X, y):
        self.net_ = _network(DeclaredUnsafe, 3)
        self.net_.fit(executor="threads", workers=3)
        self.mean_ = float(np.mean(y))
        return self


def test_nested_network_inside_a_held_fit_does_not_deadlock():
    X = gn.source(np.ones((8, 2)), name="X")
    y = gn.source(np.arange(8.0), name="y")
    out = gn.hstack(*[gn.machine(NetOfUnsafe(), X, y).predict(X) for _ in range(2)])
    done = []
    t = threading.Thread(target=lambda: done.append(out.fit(executor="threads", workers=2)), daemon=True)
    t.start()
    t.join(30)
    assert done, "a nested run of the same non-thread-safe group deadlocked"


def test_bad_setting_is_refused():
    with pytest.raises(TypeError, match="thread_unsafe=.*not an estimator class"):
        gn.config(thread_unsafe=[3])

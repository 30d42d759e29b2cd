"""Property tests: random networks of real scikit-learn estimators give the same answers on every executor.

Each random network mixes transformers (StandardScaler, MinMaxScaler, PCA),
regressors (Ridge, DecisionTreeRegressor(random_state=0), KNeighborsRegressor),
at least one estimator that is not thread-safe (LinearSVR: liblinear's
process-wide random state) and sometimes a stack (gn.StackingRegressor vs
scikit-learn's).  The network is fitted and called on the executor under test
(``executor`` fixture: serial, threads, emulated streams, dask) and compared

* bit for bit with the same network on the serial executor, and
* with plain scikit-learn code doing the same steps (within 1e-8: the combine
  kernels and ``np.column_stack`` may round differently from NumPy's mean).

A second property changes the data **in place** between two fits (``X *= ...``,
``y *= -1`` on the arrays the sources hold) and asserts that the second fit
learns from the data as it is now.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import sklearn.ensemble as ske
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from sklearn.base import clone
from sklearn.decomposition import PCA
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import Ridge
from sklearn.model_selection import KFold
from sklearn.neighbors import KNeighborsRegressor
from sklearn.preprocessing import MinMaxScaler, StandardScaler
from sklearn.svm import LinearSVR
from sklearn.tree import DecisionTreeRegressor

import gpunets as gn

N_ROWS, N_COLS = 48, 4


def _transformer(kind):
    return {"scale": StandardScaler(), "minmax": MinMaxScaler(),
            "pca": PCA(n_components=2, svd_solver="full")}[kind]


def _regressor(kind, k):
    if kind == "ridge":
        return Ridge(alpha=0.5 + k)
    if kind == "tree":
        return DecisionTreeRegressor(max_depth=3, random_state=0)
    if kind == "knn":
        return KNeighborsRegressor(n_neighbors=3 + k)
    if kind == "svr":   # not thread-safe: liblinear's dual solver shuffles with a process-wide state
        return LinearSVR(C=5.0 + k, dual=True, max_iter=1000, tol=1e-8, random_state=k)
    raise ValueError(kind)


def _stack_members(k):
    return [("svr", _regressor("svr", k)), ("ridge", Ridge(alpha=1.0 + k))]


@st.composite
def networks(draw):
    """Ops building a network; every network starts with two LinearSVR on independent branches."""
    n = draw(st.integers(2, 7))
    ops = [("fit", "svr", 0, 0), ("fit", "svr", draw(st.integers(0, 50)), draw(st.integers(1, 2)))]
    for _ in range(n):
        kind = draw(st.sampled_from(["transform", "fit", "fit", "hstack", "mean", "stack"]))
        a, b = draw(st.integers(0, 50)), draw(st.integers(0, 50))
        if kind == "transform":
            ops.append((kind, draw(st.sampled_from(["scale", "minmax", "pca"])), a, 0))
        elif kind == "fit":
            ops.append((kind, draw(st.sampled_from(["ridge", "tree", "knn", "svr"])), a, draw(st.integers(0, 2))))
        elif kind == "stack":
            ops.append((kind, "stack", a, draw(st.integers(0, 1))))
        else:
            ops.append((kind, "", a, b))
    return ops


def _interpret(ops, X, y, build):
    """Run ``ops`` with ``build`` = the network builder or the scikit-learn reference.

    Values are of two kinds: matrices (features) and vectors (predictions).
    """
    mats, vecs = [build.source_X(X)], []
    for kind, what, a, b in ops:
        if kind == "transform":
            mats.append(build.transform(_transformer(what), mats[a % len(mats)]))
        elif kind == "fit":
            vecs.append(build.predict(_regressor(what, b), mats[a % len(mats)]))
        elif kind == "stack":
            vecs.append(build.stack(_stack_members(b), mats[a % len(mats)]))
        elif kind == "hstack" and vecs:
            mats.append(build.hstack(mats[a % len(mats)], vecs[b % len(vecs)]))
        elif kind == "mean" and len(vecs) >= 1:
            vecs.append(build.mean(vecs[a % len(vecs)], vecs[b % len(vecs)]))
    return build.output(vecs)


class _Network:
    """Builds the gpunets network for the ops."""

    def __init__(self, X, y):
        self.Xs, self.ys = gn.source(X, name="X"), gn.source(y, name="y")

    def source_X(self, X):
        return self.Xs

    def transform(self, est, Z):
        return gn.machine(est, Z).transform(Z)

    def predict(self, est, Z):
        return gn.machine(est, Z, self.ys).predict(Z)

    def stack(self, members, Z):
        # its own threads inside the outer task: the folds' LinearSVR fits run concurrently too
        model = gn.StackingRegressor(members, final_estimator=Ridge(), cv=KFold(3), executor="threads", workers=2)
        return gn.machine(model, Z, self.ys).predict(Z)

    def hstack(self, Z, v):
        return gn.hstack(Z, v)

    def mean(self, u, v):
        return gn.mean(u, v)

    def output(self, vecs):
        return gn.hstack(*vecs)


class _Sklearn:
    """The same steps in plain scikit-learn and NumPy, fitted on ``X``/``y``, applied to ``X_eval``."""

    def __init__(self, X, y, X_eval):
        self.y, self.X_eval = y, X_eval

    def source_X(self, X):
        return (X, self.X_eval)

    def transform(self, est, Z):
        fitted = clone(est).fit(Z[0])
        return (fitted.transform(Z[0]), fitted.transform(Z[1]))

    def predict(self, est, Z):
        fitted = clone(est).fit(Z[0], self.y)
        return (fitted.predict(Z[0]), fitted.predict(Z[1]))

    def stack(self, members, Z):
        fitted = ske.StackingRegressor(members, final_estimator=Ridge(), cv=KFold(3)).fit(Z[0], self.y)
        return (fitted.predict(Z[0]), fitted.predict(Z[1]))

    def hstack(self, Z, v):
        return (np.column_stack([Z[0], v[0]]), np.column_stack([Z[1], v[1]]))

    def mean(self, u, v):
        return ((u[0] + v[0]) / 2, (u[1] + v[1]) / 2)

    def output(self, vecs):
        return (np.column_stack([v[0] for v in vecs]), np.column_stack([v[1] for v in vecs]))


def _data(seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N_ROWS, N_COLS))
    y = X @ np.array([1.0, -2.0, 0.5, 0.0]) + np.sin(3 * X[:, 3]) + 0.1 * rng.normal(size=N_ROWS)
    return X, y


def _fit_and_call(out, X_new, executor):
    out.fit(executor=executor)
    return out(executor=executor), out(X_new, executor=executor)


def _serial_reference(ops, X, y, X_new):
    out = _interpret(ops, X.copy(), y.copy(), _Network(X.copy(), y.copy()))
    return _fit_and_call(out, X_new, "serial")


_SETTINGS = settings(max_examples=8, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        yield


@_SETTINGS
@given(ops=networks(), seed=st.integers(0, 3))
def test_random_sklearn_networks_equal_serial_and_sklearn(executor, ops, seed):
    X, y = _data(seed)
    X_new = _data(seed + 10)[0][:9]
    out = _interpret(ops, X, y, _Network(X, y))
    train, new = _fit_and_call(out, X_new, executor)
    s_train, s_new = _serial_reference(ops, X, y, X_new)
    np.testing.assert_array_equal(train, s_train)
    np.testing.assert_array_equal(new, s_new)
    r_train, r_new = _interpret(ops, X, y, _Sklearn(X, y, X_new))
    np.testing.assert_allclose(train, r_train, rtol=1e-10, atol=1e-8)
    np.testing.assert_allclose(new, r_new, rtol=1e-10, atol=1e-8)


@settings(_SETTINGS, phases=(Phase.explicit, Phase.generate))   # no shrinking: a failure is reported at once
@given(ops=networks(), seed=st.integers(0, 3))
def test_data_changed_in_place_between_fits(executor, ops, seed):
    X, y = _data(seed)
    X_new = _data(seed + 10)[0][:9]
    out = _interpret(ops, X, y, _Network(X, y))
    _fit_and_call(out, X_new, executor)
    X *= 1.5            # the very arrays the sources hold
    X[0] += 1.0
    y *= -1.0
    train, new = _fit_and_call(out, X_new, executor)
    s_train, s_new = _serial_reference(ops, X, y, X_new)
    np.testing.assert_array_equal(train, s_train)
    np.testing.assert_array_equal(new, s_new)
    r_train, r_new = _interpret(ops, X, y, _Sklearn(X, y, X_new))
    np.testing.assert_allclose(train, r_train, rtol=1e-10, atol=1e-8)
    np.testing.assert_allclose(new, r_new, rtol=1e-10, atol=1e-8)

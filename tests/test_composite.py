"""Composite models: building, smart retraining, sklearn interop, nesting, errors."""

from __future__ import annotations

import collections
import pickle
import threading
from functools import partial

import numpy as np
import pandas as pd
import pytest
from gpunets.testing import assert_allclose_any
from sklearn.base import BaseEstimator, RegressorMixin, clone
from sklearn.linear_model import Lasso, LinearRegression, LogisticRegression, Ridge
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

import gpunets as gn

FITS: collections.Counter = collections.Counter()
_LOCK = threading.Lock()


class Counting(RegressorMixin, BaseEstimator):
    """Ridge that counts its fits by ``tag`` (and can be told to fail)."""

    def __init__(self, tag="a", alpha=1.0, fail=False):
        self.tag, self.alpha, self.fail = tag, alpha, fail

    def fit(self, X, y):
        if self.fail:
            raise ValueError(f"{self.tag} was told to fail")
        with _LOCK:
            FITS[self.tag] += 1
        self.model_ = Ridge(alpha=self.alpha).fit(X, y)
        return self

    def predict(self, X):
        return self.model_.predict(X)


def _wmean(w, *values):
    return sum(wi * v for wi, v in zip(w, values)) / sum(w)


def wmean(*nodes, weights):
    return gn.node(partial(_wmean, tuple(weights)), *nodes)


class AveragedRegressor(gn.CompositeRegressor):
    def __init__(self, first=None, second=None, weight=0.5, executor="auto", device="auto"):
        self.first, self.second, self.weight = first, second, weight
        self.executor, self.device = executor, device

    def network(self, X, y):
        a = gn.machine(self.first or Ridge(), X, y)
        b = gn.machine(self.second or LinearRegression(), X, y)
        return {"predict": wmean(a.predict(X), b.predict(X), weights=[self.weight, 1 - self.weight])}


class ScaledModel(gn.CompositeRegressor):
    """scaler -> model: the model is downstream of the scaler."""

    def __init__(self, scaler=None, model=None, executor="serial"):
        self.scaler, self.model, self.executor = scaler, model, executor

    def network(self, X, y):
        s = gn.machine(self.scaler or StandardScaler(), X)
        W = s.transform(X)
        return gn.machine(self.model or Ridge(), W, y).predict(W)


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 4))
    y = X @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.1 * rng.normal(size=80)
    return X, y


@pytest.fixture(autouse=True)
def _reset():
    FITS.clear()


def test_fit_predict_matches_hand_computation(data):
    X, y = data
    m = AveragedRegressor(first=Ridge(alpha=3.0), weight=0.25, executor="serial").fit(X, y)
    expected = 0.25 * Ridge(alpha=3.0).fit(X, y).predict(X) + 0.75 * LinearRegression().fit(X, y).predict(X)
    np.testing.assert_allclose(m.predict(X), expected, rtol=1e-12)
    assert m.n_features_in_ == 4
    assert m.first.alpha == 3.0 and not hasattr(m.first, "coef_")  # the spec is never fitted


def test_smart_retraining_counts_fits(data):
    X, y = data
    m = AveragedRegressor(first=Counting("a"), second=Counting("b"), executor="serial")
    m.fit(X, y)
    assert FITS == {"a": 1, "b": 1}
    m.fit(X, y)                                   # nothing changed: nothing trains
    assert FITS == {"a": 1, "b": 1}
    assert set(m.fit_report_.actions.values()) == {"skip"}
    m.fit(X.copy(), y.copy())                     # equal data is the same data
    assert FITS == {"a": 1, "b": 1}
    m.set_params(first__alpha=10.0).fit(X, y)     # nested parameter: only `first`
    assert FITS == {"a": 2, "b": 1}
    assert m.fit_report_.actions.by_label() == {"first": "update", "second": "skip"}
    m.set_params(first=Counting("c")).fit(X, y)  # whole replacement: only its machine
    assert FITS == {"a": 2, "b": 1, "c": 1}
    assert m.fit_report_.actions.by_label() == {"first": "update", "second": "skip"}
    m.set_params(weight=0.9).fit(X, y)            # build-time hyperparameter: network rebuilt, no refit needed
    assert FITS == {"a": 2, "b": 1, "c": 1}
    np.testing.assert_allclose(
        m.predict(X), 0.9 * Ridge().fit(X, y).predict(X) + 0.1 * Ridge().fit(X, y).predict(X), rtol=1e-10)
    m.fit(X + 1.0, y)                             # new X: everything retrains
    assert FITS == {"a": 2, "b": 2, "c": 2}
    m.fit(X + 1.0, y * 2)                         # new y: everything retrains
    assert FITS == {"a": 2, "b": 3, "c": 3}


def test_retraining_downstream(data):
    X, y = data
    m = ScaledModel(scaler=StandardScaler(), model=Counting("model")).fit(X, y)
    m.set_params(model__alpha=5.0).fit(X, y)
    assert m.fit_report_.actions.by_label() == {"scaler": "skip", "model": "update"}
    m.set_params(scaler__with_mean=False).fit(X, y)
    assert m.fit_report_.actions.by_label() == {"scaler": "update", "model": "train"}
    assert FITS["model"] == 3
    expected = make_pipeline(StandardScaler(with_mean=False), Ridge(alpha=5.0)).fit(X, y).predict(X)
    np.testing.assert_allclose(m.predict(X), expected, rtol=1e-10)


def test_failed_fit_keeps_previous_network(data):
    X, y = data
    m = AveragedRegressor(first=Counting("a"), second=Counting("b"), executor="serial").fit(X, y)
    before = m.predict(X)
    m.set_params(first__fail=True, first__alpha=3.0)
    with pytest.raises(ValueError, match="told to fail"):
        m.fit(X, y)
    np.testing.assert_array_equal(m.predict(X), before)
    m.set_params(first__fail=False).fit(X, y)
    assert FITS["a"] == 2 and FITS["b"] == 1


def test_executor_and_device_are_hyperparameters(data):
    X, y = data
    on_gpu = " (on CUDA streams)" if gn.devices.placement.gpu_available() else ""   # device="auto" picks the GPU
    m = AveragedRegressor(executor="threads").fit(X, y)
    assert m.fit_report_.executor == "threads" + on_gpu
    # nothing retrains: a plan without GPU work runs on the serial executor itself
    assert m.set_params(executor="serial").fit(X, y).fit_report_.executor.startswith("serial")
    assert "executor" in m.get_params() and "device" in m.get_params()
    np.testing.assert_allclose(AveragedRegressor(device="cpu").fit(X, y).predict(X), m.predict(X))
    with pytest.raises(ValueError, match="executor"):
        AveragedRegressor(executor="bogus").fit(X, y)


def test_defaults_when_init_lacks_executor(data):
    X, y = data

    class Plain(gn.CompositeRegressor):
        def __init__(self, model=None):
            self.model = model

        def network(self, X, y):
            return gn.machine(self.model or Ridge(), X, y).predict(X)

    m = Plain().fit(X, y)
    assert m.executor == "auto" and m.device == "auto" and "executor" not in m.get_params()
    np.testing.assert_allclose(m.predict(X), Ridge().fit(X, y).predict(X))


def test_operations_are_honest(data):
    X, y = data
    assert hasattr(AveragedRegressor(), "predict")
    assert not hasattr(AveragedRegressor(), "predict_proba")
    assert not hasattr(AveragedRegressor(), "transform")

    class Clf(gn.CompositeClassifier):
        def __init__(self, model=None):
            self.model = model

        def network(self, X, y):
            m = gn.machine(self.model or LogisticRegression(), X, y)
            return {"predict": m.predict(X), "predict_proba": m.predict_proba(X)}

    yc = (y > 0).astype(int)
    assert hasattr(Clf(), "predict_proba") and not hasattr(Clf(), "decision_function")
    c = Clf().fit(X, yc)
    assert hasattr(c, "predict_proba") and not hasattr(c, "decision_function")
    np.testing.assert_allclose(c.predict_proba(X), LogisticRegression().fit(X, yc).predict_proba(X))
    assert c.classes_.tolist() == [0, 1]


def test_report_and_fitted_params_keyed_by_component(data):
    X, y = data
    m = AveragedRegressor(first=Ridge(alpha=2.0)).fit(X, y)
    assert set(m.report_) == {"first", "LinearRegression"}
    assert m.report_["first"]["action"] == "train"
    # on a GPU the fitted coefficients are device arrays: compare them through an explicit move
    assert_allclose_any(m.fitted_params_["first"]["coef_"], Ridge(alpha=2.0).fit(X, y).coef_, rtol=1e-7, atol=1e-10)
    assert set(m.machines_) == {"first", "LinearRegression"}


def test_sklearn_interop(data):
    X, y = data
    m = AveragedRegressor(first=Ridge(alpha=3.0))
    params = m.get_params()
    assert params["first__alpha"] == 3.0 and params["weight"] == 0.5
    c = clone(m)
    assert c.first is not m.first and c.first.alpha == 3.0
    g = GridSearchCV(m, {"first__alpha": [0.1, 1.0, 10.0]}, cv=3).fit(X, y)
    assert g.best_params_["first__alpha"] in (0.1, 1.0, 10.0)
    assert cross_val_score(AveragedRegressor(executor="serial"), X, y, cv=3).shape == (3,)
    pipe = Pipeline([("scale", StandardScaler()), ("avg", AveragedRegressor())]).fit(X, y)
    assert pipe.predict(X).shape == (80,)
    assert pipe.score(X, y) > 0.9


def test_pandas_input_kept(data):
    X, y = data
    Xf = pd.DataFrame(X, columns=list("abcd"))
    m = AveragedRegressor(executor="serial").fit(Xf, pd.Series(y))
    assert m.feature_names_in_.tolist() == list("abcd")
    # the inner model sees the frame on the CPU (on a GPU without cuDF it gets the values as an array)
    m = AveragedRegressor(executor="serial", device="cpu").fit(Xf, pd.Series(y))
    inner = m.machines_["Ridge"].estimator_
    assert inner.feature_names_in_.tolist() == list("abcd")
    np.testing.assert_allclose(np.asarray(m.predict(Xf)), AveragedRegressor().fit(X, y).predict(X))


def test_pickle_round_trip(data):
    X, y = data
    m = ScaledModel(model=Ridge(alpha=2.0)).fit(X, y)
    m2 = pickle.loads(pickle.dumps(m))
    np.testing.assert_array_equal(m2.predict(X), m.predict(X))
    assert m2.fit(X, y).fit_report_.actions.by_label() == {"StandardScaler": "skip", "model": "skip"}


class Outer(gn.CompositeRegressor):
    def __init__(self, inner=None, other=None, executor="auto"):
        self.inner, self.other, self.executor = inner, other, executor

    def network(self, X, y):
        a = gn.machine(self.inner, X, y)
        b = gn.machine(self.other or Ridge(), X, y)
        return wmean(a.predict(X), b.predict(X), weights=[1, 1])


EXECUTORS = ["serial", "threads", "streams", lambda: gn.ThreadsExecutor(workers=2),
             lambda: gn.StreamsExecutor(workers=2)]


def test_nested_composites_every_executor(data):
    X, y = data
    results = []
    for ex in EXECUTORS:
        ex = ex() if callable(ex) else ex
        inner = AveragedRegressor(first=Ridge(alpha=2.0), second=Lasso(alpha=0.01), executor=ex)
        outer = Outer(inner=inner, other=Ridge(alpha=5.0), executor=ex)
        Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
        top = gn.machine(outer, Xs, ys)
        yhat = wmean(top.predict(Xs), gn.machine(LinearRegression(), Xs, ys).predict(Xs), weights=[2, 1])
        gn.fit(yhat, executor=ex)
        results.append(yhat())
        results.append(yhat(X[:7]))
        # a nested parameter two levels down retrains only that component, through the core's update
        outer.set_params(inner__first__alpha=4.0)
        report = gn.fit(yhat, executor=ex)
        assert report.actions.by_label() == {"Outer": "update", "LinearRegression": "skip"}
        fitted_outer = top.estimator_
        assert fitted_outer.fit_report_.actions.by_label() == {"inner": "update", "other": "skip"}
        inner_fitted = fitted_outer.machines_["inner"].estimator_
        assert inner_fitted.fit_report_.actions.by_label() == {"first": "update", "second": "skip"}
        results.append(yhat())
    n = 3
    for i in range(n, len(results), n):
        for a, b in zip(results[:n], results[i:i + n]):
            np.testing.assert_allclose(a, b, rtol=1e-10)


def test_incremental_copy_leaves_previous_untouched(data):
    X, y = data
    m = AveragedRegressor(first=Counting("a"), second=Counting("b"), executor="serial").fit(X, y)
    before = m.predict(X)
    cp = m._gn_updated_copy(m.set_params(first__alpha=7.0) and clone(m))
    cp.fit(X, y)
    assert FITS == {"a": 2, "b": 1}
    np.testing.assert_array_equal(m.predict(X), before)
    assert not np.allclose(cp.predict(X), before)


def test_transformer_composite_in_pipeline(data):
    X, y = data

    class Scale(gn.CompositeTransformer):
        def __init__(self, scaler=None, executor="serial"):
            self.scaler, self.executor = scaler, executor

        def network(self, X, y):
            m = gn.machine(self.scaler or StandardScaler(), X)
            return {"transform": m.transform(X), "inverse_transform": m.inverse_transform(X)}

    t = Scale().fit(X)
    np.testing.assert_allclose(t.transform(X), StandardScaler().fit_transform(X))
    np.testing.assert_allclose(t.inverse_transform(t.transform(X)), X)
    pipe = make_pipeline(Scale(), Ridge()).fit(X, y)
    np.testing.assert_allclose(pipe.predict(X), make_pipeline(StandardScaler(), Ridge()).fit(X, y).predict(X))


def test_fit_params_become_sources(data):
    X, y = data

    class Weighted(gn.CompositeRegressor):
        def __init__(self, model=None):
            self.model = model

        def network(self, X, y, sample_weight=None):
            return gn.machine(self.model or Ridge(), X, y, sample_weight).predict(X)

    w = np.linspace(0.1, 1.0, len(y))
    m = Weighted().fit(X, y, sample_weight=w)
    np.testing.assert_allclose(m.predict(X), Ridge().fit(X, y, sample_weight=w).predict(X))


# --- bad input -----------------------------------------------------------------------------------

def _bad(result_fn):
    class Bad(gn.CompositeRegressor):
        def __init__(self, model=None):
            self.model = model

        def network(self, X, y):
            m = gn.machine(self.model if self.model is not None else Counting("bad"), X, y)
            return result_fn(m, X)

    return Bad()


@pytest.mark.parametrize("result_fn, exc, match", [
    (lambda m, X: 42, TypeError, r"must return a node or a dict.*int"),
    (lambda m, X: m, TypeError, r"returned the machine.*Hint"),
    (lambda m, X: {"forecast": m.predict(X)}, ValueError, r"unknown operation 'forecast'.*Valid operations"),
    (lambda m, X: {"predict": 3.0}, TypeError, r"for operation 'predict'; expected a gpunets node"),
    (lambda m, X: {}, ValueError, r"empty dict"),
])
def test_bad_network_raises_before_training(data, result_fn, exc, match):
    X, y = data
    with pytest.raises(exc, match=match):
        _bad(result_fn).fit(X, y)
    assert FITS["bad"] == 0


def test_network_not_defined(data):
    X, y = data

    class NoNetwork(gn.CompositeRegressor):
        pass

    with pytest.raises(NotImplementedError, match="must define network"):
        NoNetwork().fit(X, y)


def test_classifier_rejects_continuous_targets(data):
    X, y = data

    class Clf(gn.CompositeClassifier):
        def network(self, X, y):
            return gn.machine(LogisticRegression(), X, y).predict(X)

    with pytest.raises(ValueError, match="Unknown label type.*class labels"):
        Clf().fit(X, y)

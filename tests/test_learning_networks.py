"""Behaviour of learning networks, ported from MLJBase's
`test/composition/learning_networks/nodes.jl` (network #1, network #2, parallel
regressors and pre-processors).  Every test runs on every executor present
through the ``executor`` fixture (it is also the default executor in the test).
"""

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LinearRegression, Ridge
from sklearn.neighbors import KNeighborsRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

import gpunets as gn
from gpunets.testing import assert_allclose_any
from tests.helpers import FeatureSelector, TargetStandardizer


def actions(report):
    return report.actions.by_label()


@pytest.fixture
def regression():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 4))
    y = 2 * X[:, 0] - X[:, 1] + 0.05 * rng.normal(size=120)
    return X, y


def test_network_1_single_machine(executor, regression):
    X, y = regression
    train, test = np.arange(84), np.arange(84, 120)
    knn_ = KNeighborsRegressor(n_neighbors=7)
    Xs, ys = gn.source(X[train], name="X"), gn.source(y[train], name="y")
    knn1 = gn.machine(knn_, Xs, ys)
    assert knn1.fit().actions[knn1] == "train"
    knn_.n_neighbors = 5
    assert knn1.fit(rows=np.arange(74)).actions[knn1] == "train"
    assert knn1.fit().actions[knn1] == "train"  # rows changed back to all
    assert knn1.fit().actions[knn1] == "skip"
    yhat = knn1.predict(Xs)
    pred = yhat(X[test])
    assert np.sqrt(np.mean((pred - y[test]) ** 2)) < 1.0
    expected = KNeighborsRegressor(n_neighbors=5).fit(X[train], y[train]).predict(X[test])
    np.testing.assert_allclose(pred, expected)


def test_network_2_retraining_sequence(executor):
    rng = np.random.default_rng(1)
    N = 100
    X = pd.DataFrame({"x1": rng.random(N), "x2": rng.random(N), "x3": rng.choice(list("yn"), N),
                      "x4": rng.choice(list("yn"), N)})
    y = 2 * X.x1 - X.x2 + 0.05 * rng.random(N)
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    hot = OneHotEncoder(sparse_output=False, handle_unknown="ignore")
    enc = make_pipeline(FeatureSelector(), hot)  # nested estimator: its params are hot's params too
    hotM = gn.machine(enc, Xs)
    W = hotM.transform(Xs)
    knn = KNeighborsRegressor()
    knnM = gn.machine(knn, W, ys)
    yhat = knnM.predict(W)

    assert actions(yhat.fit()) == {"Pipeline": "train", "KNeighborsRegressor": "train"}
    assert actions(yhat.fit()) == {"Pipeline": "skip", "KNeighborsRegressor": "skip"}
    hot.drop = "first"  # a nested hyperparameter
    assert actions(yhat.fit()) == {"Pipeline": "update", "KNeighborsRegressor": "train"}
    assert actions(yhat.fit()) == {"Pipeline": "skip", "KNeighborsRegressor": "skip"}
    knn.n_neighbors = 17
    assert actions(yhat.fit()) == {"Pipeline": "skip", "KNeighborsRegressor": "update"}
    assert actions(yhat.fit(rows=np.arange(100))) == {"Pipeline": "train", "KNeighborsRegressor": "train"}
    assert actions(yhat.fit()) == {"Pipeline": "train", "KNeighborsRegressor": "train"}
    assert actions(yhat.fit(force=True)) == {"Pipeline": "train", "KNeighborsRegressor": "train"}
    assert yhat().shape == (N,)


def test_parallel_regressors_and_preprocessors(executor):
    rng = np.random.default_rng(2)
    N = 100
    X = rng.random((N, 3))
    y = 2 * X[:, 0] - X[:, 1] + 0.05 * rng.random(N)
    knn = KNeighborsRegressor(n_neighbors=4)
    ridge = Ridge(alpha=0.1)
    selector = FeatureSelector()
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    selectM = gn.machine(selector, Xs)
    Xsmall = selectM.transform(Xs)
    standM = gn.machine(TargetStandardizer(), ys)
    z = standM.transform(ys)
    knnM = gn.machine(knn, Xsmall, z)
    ridgeM = gn.machine(ridge, Xsmall, z)
    zhat = 0.5 * knnM.predict(Xsmall) + 0.5 * ridgeM.predict(Xsmall)
    yhat = standM.inverse_transform(zhat)

    first = actions(yhat.fit())
    assert first == {"FeatureSelector": "train", "TargetStandardizer": "train", "KNeighborsRegressor": "train",
                     "Ridge": "train"}
    pred = yhat()
    selector.features = [0, 1]
    assert actions(yhat.fit()) == {"FeatureSelector": "update", "TargetStandardizer": "skip",
                                   "KNeighborsRegressor": "train", "Ridge": "train"}
    knn.n_neighbors = 3
    assert actions(yhat.fit()) == {"FeatureSelector": "skip", "TargetStandardizer": "skip",
                                   "KNeighborsRegressor": "update", "Ridge": "skip"}
    standM.model.shift = 0.0  # unchanged value: nothing to do
    assert set(actions(yhat.fit()).values()) == {"skip"}
    standM.model.set_params(shift=1e-3)
    assert actions(yhat.fit()) == {"FeatureSelector": "skip", "TargetStandardizer": "update",
                                   "KNeighborsRegressor": "train", "Ridge": "train"}
    # The same network by hand, with scikit-learn alone:
    Xk = X[:, [0, 1]]
    st = TargetStandardizer(shift=1e-3).fit(y)
    zz = st.transform(y)
    expected = st.inverse_transform(0.5 * KNeighborsRegressor(n_neighbors=3).fit(Xk, zz).predict(Xk)
                                    + 0.5 * Ridge(alpha=0.1).fit(Xk, zz).predict(Xk))
    np.testing.assert_allclose(yhat(), expected)
    assert pred.shape == (N,)


def test_issue_example_and_calling_forms(executor, regression):
    X, y = regression
    X_train, X_test, y_train = X[:90], X[90:], y[:90]
    Xs, ys = gn.source(X_train, name="X"), gn.source(y_train, name="y")
    scale = gn.machine(StandardScaler(), Xs)
    W = scale.transform(Xs)
    m1 = gn.machine(Ridge(alpha=1.0), W, ys)
    m2 = gn.machine(LinearRegression(), W, ys)
    yhat = gn.mean(m1.predict(W), m2.predict(W))
    report = yhat.fit()
    assert isinstance(report, gn.FitReport)
    assert set(report.actions) == {scale, m1, m2}
    assert all(a == "train" for a in report.actions.values())
    sc = StandardScaler().fit(X_train)
    ref_models = [Ridge(alpha=1.0).fit(sc.transform(X_train), y_train),
                  LinearRegression().fit(sc.transform(X_train), y_train)]

    def ref(Xn):
        return np.mean([m.predict(sc.transform(Xn)) for m in ref_models], axis=0)

    np.testing.assert_allclose(yhat(), ref(X_train))
    np.testing.assert_allclose(yhat(X_test), ref(X_test))
    np.testing.assert_allclose(yhat(X=X_test), ref(X_test))
    np.testing.assert_allclose(yhat(rows=[0, 5, 9]), ref(X_train[[0, 5, 9]]))
    np.testing.assert_array_equal(yhat(X_test), yhat(X_test))
    # The machines fitted clones; the specs were never fitted.
    assert not hasattr(m1.model, "coef_") and hasattr(m1.estimator_, "coef_")
    assert m1.estimator_ is not m1.model


def test_machine_fits_a_clone_and_model_stays_the_spec(executor):
    X = gn.source(np.arange(20.0).reshape(10, 2), name="X")
    y = gn.source(np.arange(10.0), name="y")
    model = Ridge(alpha=1.0)
    m = gn.machine(model, X, y)
    m.fit()
    first = m.estimator_
    assert first is not model and not hasattr(model, "coef_")
    model.alpha = 5.0
    assert m.fit().actions[m] == "update"
    assert m.estimator_ is not first and m.estimator_.alpha == 5.0
    m.model.set_params(alpha=7.0)
    assert m.fit().actions[m] == "update"
    assert m.fit().actions[m] == "skip"


def test_freeze_and_thaw(executor, regression):
    X, y = regression
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    scale = gn.machine(StandardScaler(), Xs)
    W = scale.transform(Xs)
    m = gn.machine(Ridge(), W, ys)
    p = m.predict(W)
    p.fit()
    m.freeze()
    scale.model.with_mean = False
    assert actions(p.fit()) == {"StandardScaler": "update", "Ridge": "skip"}
    assert actions(p.fit(force=True)) == {"StandardScaler": "train", "Ridge": "skip"}
    m.thaw()
    # the upstream machine retrained since m's last fit: m trains.
    assert actions(p.fit()) == {"StandardScaler": "skip", "Ridge": "train"}
    assert actions(p.fit()) == {"StandardScaler": "skip", "Ridge": "skip"}


def test_second_fit_fits_nothing(executor, regression):
    from tests.helpers import FIT_COUNTS, Counting

    X, y = regression
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    a = gn.machine(Counting(tag="second-a"), Xs, ys)
    b = gn.machine(Counting(tag="second-b"), Xs, ys)
    p = gn.mean(a.predict(Xs), b.predict(Xs))
    p.fit()
    before = dict(FIT_COUNTS)
    report = p.fit()
    assert set(report.actions.values()) == {"skip"}
    assert FIT_COUNTS == before and len([r for r in report.trace.records if r.kind == "fit"]) == 0


def test_new_source_data_retrains(executor):
    X = gn.source(np.arange(20.0).reshape(10, 2), name="X")
    y = gn.source(np.arange(10.0), name="y")
    m = gn.machine(Ridge(), X, y)
    m.fit()
    y.data = np.arange(10.0) * 2
    assert m.fit().actions[m] == "train"
    assert m.fit().actions[m] == "skip"


def _tap(x):
    return x


def test_shared_subnode_is_computed_once_per_call(executor):
    X = gn.source(np.arange(6.0).reshape(3, 2), name="X")
    shared = gn.node(_tap, X)
    a, b = shared + 1, shared * 2
    out = gn.node(np.add, a, b)
    for _ in range(2):
        ev = gn.evaluate(out, trace=True)
        np.testing.assert_allclose(ev.value, np.arange(6.0).reshape(3, 2) * 3 + 1)
        # reached by two paths, computed once per call
        assert [r.label for r in ev.trace.records].count("_tap(X)") == 1


def test_fit_of_several_targets(executor):
    X, y = gn.source(np.eye(4), name="X"), gn.source(np.arange(4.0), name="y")
    a, b = gn.machine(Ridge(), X, y), gn.machine(LinearRegression(), X, y)
    report = gn.fit(a.predict(X), b)
    assert report.actions.by_label() == {"Ridge": "train", "LinearRegression": "train"}
    assert set(gn.fit(a.predict(X), b.predict(X)).actions.values()) == {"skip"}


def test_pandas_rows_and_column_names_survive(executor):
    rng = np.random.default_rng(3)
    df = pd.DataFrame(rng.normal(size=(30, 3)), columns=["a", "b", "c"], index=np.arange(100, 130))
    ys = gn.source(pd.Series(rng.normal(size=30), index=df.index, name="target"), name="y")
    Xs = gn.source(df, name="X")
    scale = gn.machine(StandardScaler().set_output(transform="pandas"), Xs)
    W = scale.transform(Xs)
    assert isinstance(W.fit().actions[scale], str)
    out = W(rows=[0, 2, 4])
    assert isinstance(out, pd.DataFrame) and list(out.columns) == ["a", "b", "c"]
    assert list(out.index) == [100, 102, 104]
    m = gn.machine(Ridge(), W, ys)
    p = m.predict(W)
    p.fit(rows=slice(0, 20))
    assert m.estimator_.n_features_in_ == 3
    if m.report()["device"] == "cpu":   # on a GPU the frame's columns reach the model as a CuPy array
        assert list(m.estimator_.feature_names_in_) == ["a", "b", "c"]
    assert p(df.iloc[:5]).shape == (5,)


def test_arithmetic_builds_nodes():
    a = gn.source(np.array([1.0, 2.0]), name="a")
    b = gn.source(np.array([3.0, 5.0]), name="b")
    for expr, expected in [(a + b, [4, 7]), (a - b, [-2, -3]), (0.5 * a, [0.5, 1]), (-a, [-1, -2]),
                           (a * 2, [2, 4]), (b / a, [3, 2.5]), (1 + a, [2, 3]), (10 - a, [9, 8]),
                           (np.float64(2.0) * a, [2, 4])]:
        assert isinstance(expr, gn.Node)
        np.testing.assert_allclose(expr(), expected)
    np.testing.assert_allclose((a + b)(a=np.array([0.0, 0.0]), b=np.array([1.0, 1.0])), [1, 1])


def test_node_with_constants_and_names():
    X = gn.source(np.ones((2, 2)), name="X")
    n = gn.node(np.add, X, 10.0, name="plus10")
    assert repr(n) == "<Node plus10(X, 10.0)>"
    np.testing.assert_allclose(n(), 11.0)


def test_raw_data_wrapped_in_sources():
    m = gn.machine(Ridge(), np.eye(3), np.ones(3))
    assert all(isinstance(a, gn.Source) for a in m.args)
    assert [a.name for a in m.args] == ["X", "y"]
    p = m.predict()
    p.fit()
    assert p().shape == (3,)


def test_repr_and_dot():
    X = gn.source(np.eye(3), name="X")
    y = gn.source(np.ones(3), name="y")
    scale = gn.machine(StandardScaler(), X)
    W = scale.transform(X)
    m = gn.machine(Ridge(), W, y)
    p = m.predict(W)
    assert repr(W) == "<Node transform(StandardScaler, X)>"
    assert repr(p) == "<Node predict(Ridge, transform(StandardScaler, X))>"
    assert repr(m) == "<Machine Ridge(transform(StandardScaler, X), y)>"
    assert repr(X) == "<Source X: ndarray(3, 3)>"
    dot = p.to_dot()
    assert dot.startswith("digraph gpunets {") and "Ridge" in dot and "StandardScaler" in dot
    assert dot.count("->") >= 5 and dot.rstrip().endswith("}")
    svg = p._repr_mimebundle_()["image/svg+xml"]
    assert "Ridge" in svg


def test_report_and_fitted_params_labels(executor):
    X = gn.source(np.arange(12.0).reshape(6, 2), name="X")
    y = gn.source(np.arange(6.0), name="y")
    r1, r2 = gn.machine(Ridge(alpha=1.0), X, y), gn.machine(Ridge(alpha=2.0), X, y)
    lin = gn.machine(LinearRegression(), X, y)
    p = gn.mean(r1.predict(X), r2.predict(X), lin.predict(X))
    p.fit()
    rep = gn.report(p)
    assert list(rep) == ["Ridge", "Ridge#2", "LinearRegression"]
    assert rep["Ridge#2"]["action"] == "train" and rep["Ridge"]["n_fits"] == 1
    fp = gn.fitted_params(p)
    assert_allclose_any(fp["Ridge"]["coef_"], r1.estimator_.coef_)   # a CuPy array where Ridge ran on a GPU
    assert "coef_" in fp["LinearRegression"]
    assert r1.report()["trained"] and r1.fitted_params()["coef_"].shape == (2,)
    assert "Ridge#2" in repr(p.fit())


def test_a_machine_that_writes_its_input_leaves_the_shared_value_alone(executor, regression):
    """StandardScaler(copy=False) scales its input in place: fed a node other machines read too, it gets its
    own copy, so what they see does not depend on the order the executor ran them in."""
    X, y = regression
    X = X + 3.0
    Xs, ys = gn.source(X.copy(), name="X"), gn.source(y, name="y")
    scaled = gn.machine(StandardScaler(copy=False), Xs).transform(Xs)
    plain = gn.machine(LinearRegression(), Xs, ys).predict(Xs)
    both = gn.node(lambda a, b: (a, b), scaled, plain)
    both.fit()
    a, b = both()
    np.testing.assert_allclose(a, StandardScaler().fit_transform(X), rtol=1e-12)
    np.testing.assert_allclose(b, LinearRegression().fit(X, y).predict(X), rtol=1e-10)
    np.testing.assert_array_equal(Xs(), X)   # the source's data is unchanged

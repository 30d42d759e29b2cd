"""Static machines (issue 14, feature 8): a machine with no training arguments never trains and applies
its operation to the data it is called on (MLJ's ``Static``).  Every behavioural test runs on every
executor present (``executor`` fixture)."""

import numpy as np
import pytest
from sklearn.linear_model import Ridge
from sklearn.preprocessing import FunctionTransformer, Normalizer, StandardScaler

import gpunets as gn


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(50, 3))
    return X, X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=50)


def test_a_static_machine_applies_its_operation_to_the_data_it_is_called_on(executor, data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    log = gn.machine(FunctionTransformer(np.log1p))
    assert log.static and repr(log) == "<Machine FunctionTransformer()>"
    W = log.transform(Xs)
    ridge = gn.machine(Ridge(), W, ys)
    out = ridge.predict(W)
    report = out.fit()
    assert report.actions.by_label() == {"FunctionTransformer": "static", "Ridge": "train"}
    assert report.why["FunctionTransformer"] == "never trained"
    np.testing.assert_allclose(W(), np.log1p(X))
    np.testing.assert_allclose(out(), Ridge().fit(np.log1p(X), y).predict(np.log1p(X)))
    np.testing.assert_allclose(W(X[:5] * 2), np.log1p(X[:5] * 2))        # new data: applied to them
    rep = log.report()
    assert rep["static"] is True and rep["action"] == "static" and rep["n_rows"] is None
    assert "static" not in ridge.report()


def test_rows_and_new_data_never_retrain_a_static_machine(executor, data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    log = gn.machine(FunctionTransformer(np.log1p))
    ridge = gn.machine(Ridge(), log.transform(Xs), ys)
    out = ridge.predict(log.transform(Xs))
    out.fit()
    assert out.fit().actions.by_label() == {"FunctionTransformer": "skip", "Ridge": "skip"}
    assert out.fit(rows=slice(0, 30)).actions.by_label() == {"FunctionTransformer": "skip", "Ridge": "train"}
    Xs.data = X + 1
    assert out.fit().actions.by_label() == {"FunctionTransformer": "skip", "Ridge": "train"}
    np.testing.assert_allclose(out(), Ridge().fit(np.log1p(X + 1), y).predict(np.log1p(X + 1)))
    assert log.n_fits == 1


def test_a_changed_hyperparameter_takes_a_new_copy_and_downstream_retrains(executor, data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    f = gn.machine(FunctionTransformer(np.log1p))
    ridge = gn.machine(Ridge(), f.transform(Xs), ys)
    out = ridge.predict(f.transform(Xs))
    out.fit()
    f.model.func = np.sqrt
    report = out.fit()
    assert report.actions.by_label() == {"FunctionTransformer": "static", "Ridge": "train"}
    assert report.why["FunctionTransformer"] == "hyperparameter func changed"
    np.testing.assert_allclose(f.transform(Xs)(), np.sqrt(X))
    assert f.report()["history"] == ["static", "static"]
    f.freeze()
    f.model.func = np.exp
    assert out.fit().actions.by_label()["FunctionTransformer"] == "skip"


def test_an_unfitted_static_machine_can_be_called_and_stays_unfitted(executor, data):
    X, _ = data
    norm = gn.machine(Normalizer())
    W = norm.transform(gn.source(X, name="X"))
    np.testing.assert_allclose(W(), Normalizer().fit_transform(X))
    assert not norm.is_fitted                       # a call changes no state: a copy of the model is applied


def test_models_that_must_be_fitted_cannot_be_static():
    with pytest.raises(TypeError, match=r"machine\(StandardScaler\) has no training arguments.*requires_fit.*"
                                        r"machine\(StandardScaler\(\), X\)"):
        gn.machine(StandardScaler())
    with pytest.raises(TypeError, match=r"warm='partial_fit'\) has no training arguments"):
        from sklearn.linear_model import SGDRegressor

        gn.machine(SGDRegressor(), warm="partial_fit")


def test_an_operation_of_a_static_machine_needs_its_data():
    log = gn.machine(FunctionTransformer(np.log1p))
    with pytest.raises(TypeError, match=r"static \(no training arguments\), so transform\(\) has no default "
                                        r"input: .*mach.transform\(X\)"):
        log.transform()

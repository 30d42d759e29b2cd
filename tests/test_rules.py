"""Errors and rules tightened by issue 12: checked early, one message per rule."""

import numpy as np
import pytest
from sklearn.ensemble import StackingClassifier as SkStackingClassifier
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge
from sklearn.tree import DecisionTreeRegressor

import gpunets as gn
from tests.helpers import Counting


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(30, 3)), rng.normal(size=30)


@pytest.mark.parametrize("weights", [[1, -1], [1, float("nan")], [1, float("inf")], ["a", "b"], "ab", [1]])
def test_combine_weights_are_checked_when_the_node_is_built(weights):
    a, b = gn.source(np.ones(3), name="a"), gn.source(np.zeros(3), name="b")
    with pytest.raises((TypeError, ValueError), match="weights"):
        gn.mean(a, b, weights=weights)


def test_var_ddof_is_checked_when_the_node_is_built():
    a, b = gn.source(np.ones(3), name="a"), gn.source(np.zeros(3), name="b")
    with pytest.raises(ValueError, match="ddof"):
        gn.var(a, b, ddof=2)
    with pytest.raises(TypeError, match="ddof"):
        gn.var(a, b, ddof="1")


@pytest.mark.parametrize("kw, err", [(dict(workers="2"), ValueError), (dict(workers=0), ValueError),
                                     (dict(progress="yes"), TypeError), (dict(force="no"), TypeError)])
def test_fit_arguments_share_the_config_rules(data, kw, err):
    X, y = data
    p = gn.machine(Ridge(), X, y).predict(gn.source(X, name="X"))
    with pytest.raises(err, match=next(iter(kw))):
        p.fit(**kw) if "force" not in kw else gn.fit(p, **kw)
    if "force" not in kw:
        with pytest.raises(err, match=next(iter(kw))):
            gn.config(**kw)


@pytest.mark.parametrize("kw, err", [(dict(workers="2"), ValueError), (dict(workers=0), ValueError),
                                     (dict(trace="x"), TypeError), (dict(output="x"), ValueError)])
def test_call_arguments_share_the_config_rules(kw, err):
    X = gn.source(np.ones(3), name="X")
    with pytest.raises(err, match=next(iter(kw))):
        gn.evaluate(X + 1, **kw)


@pytest.mark.parametrize("name", ["rows", "output", "executor", "workers", "keep_training"])
def test_source_names_that_calls_take_as_keywords_are_refused(name):
    with pytest.raises(ValueError, match=f"source name '{name}' is a keyword"):
        gn.source(np.ones(3), name=name)


def test_an_operation_on_a_string_is_refused_like_machine(data):
    X, y = data
    m = gn.machine(Ridge(), X, y)
    with pytest.raises(TypeError, match=r"'X' of type str.*gn.source\(data\)"):
        m.predict("X")


def test_stack_device_naming_an_unknown_estimator_is_refused(data):
    X, y = data
    stack = gn.StackingRegressor([("ridge", Ridge())], cv=3, device={"zz": "cpu"})
    with pytest.raises(ValueError, match=r"\['zz'\].*\['ridge', 'final_estimator'\]"):
        stack.fit(X, y)


def test_fit_error_says_exactly_what_will_retrain(executor, data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    first = gn.machine(Counting(tag="F1", fail=True), Xs, ys, name="F1")
    second = gn.machine(Counting(tag="F2"), gn.hstack(Xs, first.predict(Xs)), ys, name="F2")
    out = second.predict(gn.hstack(Xs, first.predict(Xs)))
    with pytest.raises(gn.FitError, match=r"retrains exactly: F1, F2") as e:
        out.fit()
    assert "only F1 and what depends on it" not in str(e.value)


def test_the_same_rows_in_another_form_do_not_retrain(executor, data):
    X, y = data
    m = gn.machine(Ridge(), X, y)
    assert m.fit(rows=slice(0, 10)).actions[m] == "train"
    assert m.fit(rows=np.arange(10)).actions[m] == "skip"
    assert m.fit(rows=np.arange(30) < 10).actions[m] == "skip"
    assert m.fit(rows=list(range(10))).actions[m] == "skip"
    assert m.fit(rows=slice(0, 11)).actions[m] == "train"
    assert m.fit(rows=slice(None)).actions[m] == "train"
    assert m.fit(rows=np.ones(30, dtype=bool)).actions[m] == "skip"
    assert m.fit().actions[m] == "train"   # no rows is not a list of rows (MLJ's rule)


def test_fit_history_is_bounded(data):
    from gpunets.core.machines import HISTORY_LENGTH

    X, y = data
    m = gn.machine(Ridge(), X, y)
    for _ in range(HISTORY_LENGTH + 5):
        m.fit(force=True, executor="serial")
    rep = m.report()
    assert len(rep["history"]) == HISTORY_LENGTH and rep["n_fits"] == HISTORY_LENGTH + 5


def test_a_classifier_stack_accepts_regressors_like_scikit_learn(executor):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = (X[:, 0] + 0.3 * X[:, 1] > 0).astype(int)
    members = [("lr", LogisticRegression()), ("tree", DecisionTreeRegressor(random_state=0))]
    ours = gn.StackingClassifier(members, cv=3).fit(X, y)
    theirs = SkStackingClassifier(members, cv=3).fit(X, y)
    assert ours.stack_method_ == theirs.stack_method_ == ["predict_proba", "predict"]
    np.testing.assert_allclose(ours.predict_proba(X), theirs.predict_proba(X), rtol=1e-10, atol=1e-12)


def test_missing_operation_chains_the_final_estimators_error(data):
    X, y = data
    stack = gn.StackingRegressor([("ridge", Ridge())], final_estimator=LinearRegression(), cv=3)
    with pytest.raises(AttributeError) as e:
        stack.predict_proba
    assert isinstance(e.value.__cause__, AttributeError)
    assert "LinearRegression" in str(e.value.__cause__)
    assert not hasattr(stack.fit(X, y), "predict_proba")

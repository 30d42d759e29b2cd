"""Stacking as one network: equivalence with scikit-learn, structure, retraining, errors."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
import sklearn.ensemble as ske
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge
from sklearn.model_selection import GridSearchCV, KFold, StratifiedKFold
from sklearn.naive_bayes import GaussianNB
from sklearn.neighbors import KNeighborsRegressor
from sklearn.svm import LinearSVC
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

import gpunets as gn
from gpunets.core.graph import machine_parents
from tests.helpers import as_sklearn_rtol
from tests.stacking_support import (  # noqa: F401 - the shared fixtures, used by name
    FITS,
    CountingClassifier,
    CountingRegressor,
    _reset,
    clf_data,
    reg_data,
)


def _reg_estimators():
    return [("ridge", Ridge(alpha=0.5)), ("tree", DecisionTreeRegressor(max_depth=4, random_state=0)),
            ("knn", KNeighborsRegressor(n_neighbors=7))]


@pytest.mark.parametrize("cv", [None, 3, KFold(4)])
@pytest.mark.parametrize("passthrough", [False, True])
@pytest.mark.parametrize("final", [None, LinearRegression()])
def test_regressor_equals_sklearn(reg_data, cv, passthrough, final):
    X, y = reg_data
    ours = gn.StackingRegressor(_reg_estimators(), final_estimator=final, cv=cv, passthrough=passthrough,
                                executor="serial").fit(X, y)
    ref = ske.StackingRegressor(_reg_estimators(), final_estimator=final, cv=cv, passthrough=passthrough).fit(X, y)
    np.testing.assert_allclose(ours.predict(X), ref.predict(X), atol=1e-8, rtol=0)
    np.testing.assert_allclose(ours.transform(X), ref.transform(X), atol=1e-8, rtol=0)
    assert ours.score(X, y) == pytest.approx(ref.score(X, y), abs=1e-8)
    assert len(ours.estimators_) == 3 and set(ours.named_estimators_) == {"ridge", "tree", "knn"}


def test_regressor_drop_and_pandas(reg_data):
    X, y = reg_data
    ests = _reg_estimators()
    ests[1] = ("tree", "drop")
    Xf = pd.DataFrame(X, columns=[f"f{i}" for i in range(5)])
    ours = gn.StackingRegressor(ests, cv=3, executor="serial").fit(Xf, y)
    ref = ske.StackingRegressor(ests, cv=3).fit(Xf, y)
    np.testing.assert_allclose(np.asarray(ours.predict(Xf)), ref.predict(Xf), atol=1e-8)
    assert ours.named_estimators_["tree"] == "drop"
    assert ours.feature_names_in_.tolist() == list(Xf.columns)


@pytest.mark.parametrize("stack_method", ["auto", "predict_proba", "predict"])
@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("cv", [None, 3, StratifiedKFold(4)])
def test_classifier_equals_sklearn(clf_data, stack_method, binary, cv):
    X, y = clf_data
    if binary:
        y = np.where(y == "cat", "cat", "other")
    ests = [("lr", LogisticRegression()), ("nb", GaussianNB()),
            ("dt", DecisionTreeClassifier(max_depth=3, random_state=0))]
    ours = gn.StackingClassifier(ests, stack_method=stack_method, cv=cv, executor="serial").fit(X, y)
    ref = ske.StackingClassifier(ests, stack_method=stack_method, cv=cv).fit(X, y)
    assert ours.stack_method_ == ref.stack_method_
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-8)
    np.testing.assert_allclose(ours.decision_function(X), ref.decision_function(X), atol=1e-8)
    np.testing.assert_allclose(ours.transform(X), ref.transform(X), atol=1e-8)
    assert ours.classes_.tolist() == ref.classes_.tolist()


def test_classifier_decision_function_and_passthrough(clf_data):
    X, y = clf_data
    ests = [("lr", LogisticRegression()), ("svc", LinearSVC())]
    for passthrough in (False, True):
        ours = gn.StackingClassifier(ests, cv=3, passthrough=passthrough, executor="serial").fit(X, y)
        ref = ske.StackingClassifier(ests, cv=3, passthrough=passthrough).fit(X, y)
        assert ours.stack_method_ == ["predict_proba", "decision_function"]
        np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-8)


def test_classifier_fold_missing_a_class():
    # a class present in only one fold's test rows: cross_val_predict pads the missing column
    X = np.arange(30, dtype=float).reshape(-1, 1)
    y = np.array([0] * 14 + [1] * 14 + [2] * 2)
    cv = KFold(3)
    ests = [("lr", LogisticRegression()), ("nb", GaussianNB())]
    ours = gn.StackingClassifier(ests, cv=cv, executor="serial").fit(X, y)
    ref = ske.StackingClassifier(ests, cv=cv).fit(X, y)
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-8)


def test_network_structure(reg_data):
    X, y = reg_data
    s = gn.StackingRegressor(_reg_estimators(), cv=5, executor="serial").fit(X, y)
    ms = s.machines_
    assert len(ms) == 3 * (5 + 1) + 2           # + final_estimator and the "[cv report]" (cv_scores_)
    final_parents = {m.name for m in machine_parents(ms["final_estimator"])}
    assert final_parents == {f"{e}[fold {k}]" for e in ("ridge", "tree", "knn") for k in range(5)}
    for e in ("ridge", "tree", "knn"):
        assert machine_parents(ms[e]) == ()           # full refits are independent of the folds
        for k in range(5):
            assert machine_parents(ms[f"{e}[fold {k}]"]) == ()
    assert ms["ridge[fold 2]"].report()["n_rows"] == 120
    assert ms["ridge"].report()["n_rows"] == 150


@pytest.mark.parametrize("executor", ["threads", "streams", "auto"])
def test_executors_give_same_results(reg_data, executor):
    X, y = reg_data
    serial = gn.StackingRegressor(_reg_estimators(), cv=4, executor="serial").fit(X, y).predict(X)
    other = gn.StackingRegressor(_reg_estimators(), cv=4, executor=executor, workers=2).fit(X, y)
    np.testing.assert_allclose(other.predict(X), serial, rtol=1e-12)


def test_smart_retraining(reg_data):
    X, y = reg_data
    ests = [("a", CountingRegressor("a")), ("b", CountingRegressor("b"))]
    s = gn.StackingRegressor(ests, final_estimator=CountingRegressor("final"), cv=3, executor="serial")
    s.fit(X, y)
    assert FITS == {"a": 4, "b": 4, "final": 1}
    s.fit(X, y)
    assert FITS == {"a": 4, "b": 4, "final": 1}
    s.set_params(a__alpha=3.0).fit(X, y)
    assert FITS == {"a": 8, "b": 4, "final": 2}
    acts = s.fit_report_.actions
    assert acts["a"] == "update" and acts["a[fold 0]"] == "update" and acts["b"] == "skip"
    s.set_params(final_estimator__alpha=2.0).fit(X, y)
    assert FITS == {"a": 8, "b": 4, "final": 3}
    s.fit(X, y + 1)
    assert FITS == {"a": 12, "b": 8, "final": 4}
    ref = ske.StackingRegressor([("a", Ridge(alpha=3.0)), ("b", Ridge())], final_estimator=Ridge(alpha=2.0),
                                cv=3).fit(X, y + 1)
    np.testing.assert_allclose(s.predict(X), ref.predict(X), atol=1e-8)


def test_grid_search_and_pickle(reg_data):
    X, y = reg_data
    s = gn.StackingRegressor(_reg_estimators()[:2], cv=3, executor="serial")
    g = GridSearchCV(s, {"ridge__alpha": [0.1, 10.0]}, cv=3).fit(X, y)
    assert g.best_params_["ridge__alpha"] in (0.1, 10.0)
    fitted = s.fit(X, y)
    again = pickle.loads(pickle.dumps(fitted))
    np.testing.assert_array_equal(again.predict(X), fitted.predict(X))


def test_device_dict_places_models(reg_data):
    X, y = reg_data
    s = gn.StackingRegressor(_reg_estimators()[:2], cv=3, executor="serial",
                             device={"ridge": "cpu", "final_estimator": "cpu"}).fit(X, y)
    assert str(s.machines_["ridge"].device) == "cpu" and str(s.machines_["ridge[fold 1]"].device) == "cpu"
    assert str(s.fit_report_.where("final_estimator")) == "cpu"


def test_stack_inside_composite_inside_network(reg_data):
    X, y = reg_data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    stack = gn.StackingRegressor(_reg_estimators()[:2], cv=3, executor=gn.ThreadsExecutor(workers=2))
    m = gn.machine(stack, Xs, ys)
    gn.fit(m.predict(Xs), executor=gn.ThreadsExecutor(workers=2))
    ref = ske.StackingRegressor(_reg_estimators()[:2], cv=3).fit(X, y)
    np.testing.assert_allclose(m.predict(Xs)(), ref.predict(X), atol=1e-8)


# --- bad input, all raised at fit before any training ----------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(estimators=[("a", CountingRegressor()), ("a", CountingRegressor())]), r"unique.*\['a'\].*Hint"),
    (dict(estimators=[]), r"non-empty list of \(name, estimator\)"),
    (dict(estimators=[("a", CountingRegressor())], cv=1), r"cv=1.*at least 2.*Hint"),
    (dict(estimators=[("a", CountingRegressor())], cv=[(np.arange(10), np.arange(10, 150))]), r"at least 2"),
    (dict(estimators=[("a", CountingRegressor())], cv="prefit"), r"cv='prefit'.*'a'.*not fitted.*Hint"),
    (dict(estimators=[("a", CountingRegressor())], cv="kfold"), r"not supported.*'prefit'"),
    (dict(estimators=[("a", CountingClassifier())]), r"'a'.*should be a regressor"),
    (dict(estimators=[("a", CountingRegressor())], final_estimator=LogisticRegression()), r"final_estimator"),
    (dict(estimators=[("a", "drop")]), r"all estimators are dropped"),
])
def test_regressor_bad_input(reg_data, kwargs, match):
    X, y = reg_data
    with pytest.raises(ValueError, match=match):
        gn.StackingRegressor(**kwargs, executor="serial").fit(X, y)
    assert sum(FITS.values()) == 0


def test_classifier_given_regression_targets(reg_data):
    X, y = reg_data
    with pytest.raises(ValueError, match=r"Unknown label type.*StackingRegressor"):
        gn.StackingClassifier([("c", CountingClassifier())], executor="serial").fit(X, y)
    assert sum(FITS.values()) == 0


def test_classifier_bad_stack_method(clf_data):
    X, y = clf_data
    with pytest.raises(ValueError, match="does not implement the method"):
        gn.StackingClassifier([("nb", GaussianNB())], stack_method="decision_function").fit(X, y)


def _liblinear_estimators():
    from sklearn.svm import LinearSVR

    # liblinear's dual solvers shuffle with one process-wide random state: fitted concurrently
    # on threads, the members' coefficients depend on how the fits interleave
    return [(f"svr{i}", LinearSVR(C=c, dual=True, max_iter=50, tol=1e-8, random_state=i))
            for i, c in enumerate([0.1, 1.0, 10.0])]


def test_non_thread_safe_members_give_the_serial_and_sklearn_result(reg_data, executor):
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    X, y = reg_data
    X = np.repeat(X, 8, axis=0)
    y = np.repeat(y, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ref = ske.StackingRegressor(_liblinear_estimators(), cv=4).fit(X, y).predict(X)
        serial = gn.StackingRegressor(_liblinear_estimators(), cv=4, executor="serial").fit(X, y).predict(X)
        np.testing.assert_allclose(serial, ref, rtol=as_sklearn_rtol(1e-12))
        for ex in (executor, "auto", "threads", "streams"):   # every executor, the default included
            for _ in range(2):
                other = gn.StackingRegressor(_liblinear_estimators(), cv=4, executor=ex, workers=2).fit(X, y)
                np.testing.assert_allclose(other.predict(X), serial, rtol=1e-12, err_msg=str(ex))


@pytest.mark.parametrize("kind", ["regressor", "classifier"])
@pytest.mark.parametrize("change", [
    {"passthrough": "False"}, {"passthrough": 1}, {"estimators": [("cv", None)]},
    {"estimators": [("final_estimator", None)]}, {"estimators": [("passthrough", None)]},
    {"estimators": [("stack_method", None)]},
])
def test_bad_passthrough_and_names_clashing_with_parameters_are_refused_as_scikit_learn_does(kind, change):
    """issue 23 item 13: the same exception class and message as scikit-learn, before any fit, and a stack
    fitted before keeps its fitted state."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y = X.sum(axis=1) if kind == "regressor" else (X[:, 0] > 0).astype(int)
    model = Ridge() if kind == "regressor" else LogisticRegression()
    theirs_cls = ske.StackingRegressor if kind == "regressor" else ske.StackingClassifier
    ours_cls = gn.StackingRegressor if kind == "regressor" else gn.StackingClassifier
    if "estimators" in change:
        change = {"estimators": [(change["estimators"][0][0], model)]}
    if kind == "regressor" and change.get("estimators", [("",)])[0][0] == "stack_method":
        return   # a regressor stack has no stack_method parameter: the name is free there (and here)
    ours = ours_cls([("m", model)], cv=3).fit(X, y)
    before = ours.predict(X)
    with pytest.raises(Exception) as theirs:
        theirs_cls([("m", model)], cv=3).set_params(**change).fit(X, y)
    ours.set_params(**change)
    with pytest.raises(type(theirs.value)) as got:
        ours.fit(X, y)
    assert str(got.value).startswith(str(theirs.value))
    np.testing.assert_array_equal(ours.predict(X), before)   # nothing already trained is lost

"""Stacking options scikit-learn and MLJ have: cv="prefit", predict_params, multilabel targets,
cv_scores_ (MLJ's cv_report) and the cv-ensemble (MLJ's), on every executor."""

from __future__ import annotations


import numpy as np
import pytest
import sklearn.ensemble as ske
from sklearn.datasets import make_multilabel_classification
from sklearn.exceptions import NotFittedError
from sklearn.frozen import FrozenEstimator
from sklearn.linear_model import BayesianRidge, LinearRegression, LogisticRegression, Ridge
from sklearn.model_selection import KFold, StratifiedKFold, cross_val_predict, cross_val_score, cross_validate
from sklearn.naive_bayes import GaussianNB
from sklearn.neighbors import KNeighborsClassifier
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

import gpunets as gn

from tests.stacking_support import (  # noqa: F401 - the shared fixtures, used by name
    FITS,
    _reset,
    clf_data,
    reg_data,
)
from tests.stacking_support import CountingRegressor as Counting


def _regs():
    return [("ridge", Ridge(alpha=2.0)), ("tree", DecisionTreeRegressor(max_depth=3, random_state=0))]


def _clfs():
    return [("lr", LogisticRegression()), ("nb", GaussianNB())]


# --- cv="prefit" (scikit-learn 1.9 still accepts it; FrozenEstimator members work with any cv) -------------------

def test_prefit_regressor_equals_sklearn_and_does_not_refit_members(reg_data, executor):
    X, y = reg_data
    members = [("a", Counting("a").fit(X[:40], y[:40])), ("b", Counting("b", alpha=9.0).fit(X[40:], y[40:]))]
    FITS.clear()
    ours = gn.StackingRegressor(members, final_estimator=LinearRegression(), cv="prefit").fit(X, y)
    ref = ske.StackingRegressor(members, final_estimator=LinearRegression(), cv="prefit").fit(X, y)
    assert FITS == {}                                    # members used as they are, only the final trains
    np.testing.assert_allclose(ours.predict(X), ref.predict(X), atol=1e-10)
    np.testing.assert_allclose(ours.transform(X), ref.transform(X), atol=1e-10)
    assert ours.estimators_[0] is members[0][1] and ours.named_estimators_["b"] is members[1][1]
    assert not hasattr(ours, "cv_scores_")               # no folds, no cross-validated scores
    assert set(ours.fit_report_.actions.by_label()) == {"final_estimator", "[cv report]"}


def test_prefit_member_refitted_in_place_retrains_the_final(reg_data):
    X, y = reg_data
    member = Ridge().fit(X[:40], y[:40])
    stack = gn.StackingRegressor([("r", member)], final_estimator=LinearRegression(), cv="prefit",
                                 executor="serial").fit(X, y)
    assert stack.fit(X, y).fit_report_.actions["final_estimator"] == "skip"   # nothing changed
    member.fit(X[40:], 5 * y[40:])                       # same object, new state
    assert stack.fit(X, y).fit_report_.actions["final_estimator"] == "train"
    ref = ske.StackingRegressor([("r", member)], final_estimator=LinearRegression(), cv="prefit").fit(X, y)
    np.testing.assert_allclose(stack.predict(X), ref.predict(X), atol=1e-10)


def test_switching_options_reuses_what_it_can(reg_data):
    X, y = reg_data
    stack = gn.StackingRegressor(_regs(), cv=3, executor="serial").fit(X, y)
    acts = stack.set_params(cv_ensemble=True).fit(X, y).fit_report_.actions.by_label()
    assert "ridge" not in acts and acts["ridge[fold 0]"] == "skip" and acts["final_estimator"] == "skip"
    acts = stack.set_params(cv_ensemble=False).fit(X, y).fit_report_.actions.by_label()
    assert acts["ridge"] == "train" and acts["tree[fold 2]"] == "skip"
    ref = ske.StackingRegressor(_regs(), cv=3).fit(X, y)
    np.testing.assert_allclose(stack.predict(X), ref.predict(X), atol=1e-10)


def test_prefit_classifier_equals_sklearn(clf_data, executor):
    X, y = clf_data
    members = [(n, e.fit(X[:60], y[:60])) for n, e in _clfs()]
    ours = gn.StackingClassifier(members, cv="prefit", passthrough=True).fit(X, y)
    ref = ske.StackingClassifier(members, cv="prefit", passthrough=True).fit(X, y)
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-8)
    np.testing.assert_array_equal(ours.get_feature_names_out(), ref.get_feature_names_out())


def test_frozen_members_with_cv_equal_sklearn(reg_data):
    X, y = reg_data
    members = [("r", FrozenEstimator(Ridge().fit(X[:30], y[:30]))), ("t", DecisionTreeRegressor(random_state=0))]
    ours = gn.StackingRegressor(members, cv=3, executor="serial").fit(X, y)
    ref = ske.StackingRegressor(members, cv=3).fit(X, y)
    np.testing.assert_allclose(ours.predict(X), ref.predict(X), atol=1e-10)


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(cv="prefit"), NotFittedError, r"cv='prefit' but the estimator 'b' \(Ridge\) is not fitted.*Hint"),
    (dict(cv="prefit", cv_ensemble=True), ValueError, r"cv='prefit' and cv_ensemble=True contradict.*Hint"),
    (dict(cv_ensemble="yes"), ValueError, r"cv_ensemble='yes'.*expected True or False.*Hint"),
    (dict(cv="loo"), ValueError, r"cv='loo' is not supported.*'prefit'.*Hint"),
])
def test_bad_options_raise_before_any_training(reg_data, kwargs, err, match):
    X, y = reg_data
    members = [("a", Counting("a").fit(X, y)), ("b", Ridge())]
    FITS.clear()
    stack = gn.StackingRegressor(members, final_estimator=Counting("final"), executor="serial", **kwargs)
    with pytest.raises(err, match=match):
        stack.fit(X, y)
    assert FITS == {} and not hasattr(stack, "fit_report_")


# --- predict(X, **predict_params) -----------------------------------------------------------------------------------

def test_predict_params_go_to_the_final_estimator(reg_data, executor):
    X, y = reg_data
    ours = gn.StackingRegressor(_regs(), final_estimator=BayesianRidge(), cv=3).fit(X, y)
    ref = ske.StackingRegressor(_regs(), final_estimator=BayesianRidge(), cv=3).fit(X, y)
    mean, std = ours.predict(X, return_std=True)
    ref_mean, ref_std = ref.predict(X, return_std=True)
    np.testing.assert_allclose(mean, ref_mean, atol=1e-10)
    np.testing.assert_allclose(std, ref_std, atol=1e-10)
    np.testing.assert_allclose(ours.predict(X), ref_mean, atol=1e-10)


def test_unknown_predict_params_name_the_final_estimator(reg_data):
    X, y = reg_data
    ours = gn.StackingRegressor(_regs(), final_estimator=Ridge(), cv=3, executor="serial").fit(X, y)
    with pytest.raises(TypeError, match=r"\['return_std'\] are not parameters.*Ridge\.predict.*Hint"):
        ours.predict(X, return_std=True)


def test_classifier_predict_params_decode_labels(clf_data):
    X, y = clf_data

    class Final(LogisticRegression):
        def predict(self, X, shift=0):
            return (super().predict(X) + shift) % 3

    ours = gn.StackingClassifier(_clfs(), final_estimator=Final(), cv=3, executor="serial").fit(X, y)
    ref = ske.StackingClassifier(_clfs(), final_estimator=Final(), cv=3).fit(X, y)
    np.testing.assert_array_equal(ours.predict(X, shift=1), ref.predict(X, shift=1))
    assert set(ours.predict(X, shift=1)) <= set(y)


# --- multilabel targets ----------------------------------------------------------------------------------------

@pytest.fixture
def multilabel():
    X, y = make_multilabel_classification(n_samples=120, n_features=6, n_classes=3, random_state=0)
    return X, y


@pytest.mark.parametrize("final", [KNeighborsClassifier(), ske.RandomForestClassifier(n_estimators=5, random_state=0)])
def test_multilabel_equals_sklearn(multilabel, final, executor):
    X, y = multilabel
    members = [("knn", KNeighborsClassifier()), ("rf", ske.RandomForestClassifier(n_estimators=10, random_state=0))]
    ours = gn.StackingClassifier(members, final_estimator=final, cv=3).fit(X, y)
    ref = ske.StackingClassifier(members, final_estimator=final, cv=3).fit(X, y)
    assert [c.tolist() for c in ours.classes_] == [c.tolist() for c in ref.classes_]
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-12)
    np.testing.assert_allclose(ours.transform(X), ref.transform(X), atol=1e-12)
    assert ours.predict(X).shape == y.shape
    # one name per column (scikit-learn 1.9 gives one per member here, fewer names than columns)
    assert len(ours.get_feature_names_out()) == ours.transform(X).shape[1] == 6
    assert set(ours.cv_scores_) == {"knn", "rf"} and ours.cv_scores_["knn"].shape == (3,)


def test_multiclass_multioutput_is_refused_with_a_hint(multilabel):
    X, y = multilabel
    y3 = y.copy()
    y3[:, 0] = np.arange(len(y)) % 3
    stack = gn.StackingClassifier([("knn", KNeighborsClassifier())], cv=3, executor="serial")
    with pytest.raises(ValueError, match=r"'multiclass-multioutput'.*Hint.*MultiOutputClassifier"):
        stack.fit(X, y3)
    assert not hasattr(stack, "fit_report_")


# --- cv_scores_ (MLJ's cv_report) ----------------------------------------------------------------------------------

def test_cv_scores_equal_cross_val_score(reg_data, clf_data, executor):
    X, y = reg_data
    stack = gn.StackingRegressor(_regs(), cv=KFold(4)).fit(X, y)
    for name, est in _regs():
        np.testing.assert_allclose(stack.cv_scores_[name], cross_val_score(est, X, y, cv=KFold(4)), atol=1e-10)
    Xc, yc = clf_data
    clf = gn.StackingClassifier(_clfs(), cv=3).fit(Xc, yc)
    for name, est in _clfs():
        np.testing.assert_allclose(clf.cv_scores_[name], cross_val_score(est, Xc, yc, cv=StratifiedKFold(3)))


def test_cv_scores_come_from_the_fits_already_made(reg_data):
    X, y = reg_data
    stack = gn.StackingRegressor([("a", Counting("a")), ("b", Counting("b"))], final_estimator=Ridge(), cv=3,
                                 executor="serial").fit(X, y)
    assert FITS == {"a": 4, "b": 4}                      # 3 folds + the full refit, nothing more for the scores
    before = dict(stack.cv_scores_)
    stack.set_params(final_estimator__alpha=5.0).fit(X, y)
    assert FITS == {"a": 4, "b": 4} and stack.fit_report_.actions["[cv report]"] == "skip"
    assert all(np.array_equal(before[k], v) for k, v in stack.cv_scores_.items())


def test_cv_scores_of_decision_function_members(clf_data):
    X, y = clf_data
    from sklearn.svm import LinearSVC

    yb = (y == "eel").astype(int)
    clf = gn.StackingClassifier([("svc", LinearSVC())], cv=3, executor="serial").fit(X, yb)
    assert clf.stack_method_ == ["decision_function"]
    np.testing.assert_allclose(clf.cv_scores_["svc"], cross_val_score(LinearSVC(), X, yb, cv=StratifiedKFold(3)))


# --- the cv-ensemble (MLJ's): K fits per member instead of K + 1 ----------------------------------------------------

def test_cv_ensemble_regressor_averages_the_fold_models(reg_data, executor):
    X, y = reg_data
    cv = KFold(3)
    stack = gn.StackingRegressor(_regs(), final_estimator=LinearRegression(), cv=cv, cv_ensemble=True).fit(X, y)
    meta, oof = [], []
    for _, est in _regs():
        folds = cross_validate(est, X, y, cv=cv, return_estimator=True)["estimator"]
        meta.append(np.mean([f.predict(X) for f in folds], axis=0))
        oof.append(cross_val_predict(est, X, y, cv=cv))
    final = LinearRegression().fit(np.column_stack(oof), y)
    np.testing.assert_allclose(stack.transform(X), np.column_stack(meta), atol=1e-10)
    np.testing.assert_allclose(stack.predict(X), final.predict(np.column_stack(meta)), atol=1e-10)
    assert [len(e) for e in stack.estimators_] == [3, 3]
    assert "ridge" not in stack.machines_ and "ridge[fold 2]" in stack.machines_


def test_cv_ensemble_fits_k_models_per_member(reg_data):
    X, y = reg_data
    members = [("a", Counting("a")), ("b", Counting("b"))]
    gn.StackingRegressor(members, final_estimator=Ridge(), cv=3, cv_ensemble=True, executor="serial").fit(X, y)
    assert FITS == {"a": 3, "b": 3}
    FITS.clear()
    gn.StackingRegressor(members, final_estimator=Ridge(), cv=3, executor="serial").fit(X, y)
    assert FITS == {"a": 4, "b": 4}                      # the default: K folds + the refit on all rows


def test_cv_ensemble_classifier_averages_probabilities(clf_data, executor):
    X, y = clf_data
    ours = gn.StackingClassifier(_clfs(), cv=3, cv_ensemble=True).fit(X, y)
    ref = ske.StackingClassifier(_clfs(), cv=3).fit(X, y)   # the same out-of-fold training, so the same final
    y_enc = np.unique(y, return_inverse=True)[1]
    meta = []
    for _, est in _clfs():
        folds = cross_validate(est, X, y_enc, cv=StratifiedKFold(3), return_estimator=True)["estimator"]
        meta.append(np.mean([f.predict_proba(X) for f in folds], axis=0))
    meta = np.column_stack(meta)
    np.testing.assert_allclose(ours.transform(X), meta, atol=1e-10)
    np.testing.assert_allclose(ours.predict_proba(X), ref.final_estimator_.predict_proba(meta), atol=1e-8)
    np.testing.assert_array_equal(ours.predict(X), ref.classes_[ref.final_estimator_.predict(meta)])


def test_cv_ensemble_class_predictions_take_the_majority(clf_data):
    X, y = clf_data
    members = [("tree", DecisionTreeClassifier(max_depth=2, random_state=0))]
    ours = gn.StackingClassifier(members, stack_method="predict", cv=5, cv_ensemble=True, executor="serial")
    ours.fit(X, y)
    y_enc = np.unique(y, return_inverse=True)[1]
    folds = cross_validate(members[0][1], X, y_enc, cv=StratifiedKFold(5), return_estimator=True)["estimator"]
    votes = np.stack([f.predict(X) for f in folds])
    expect = np.array([np.bincount(col, minlength=3).argmax() for col in votes.T])   # ties: the smallest label
    np.testing.assert_array_equal(ours.transform(X).ravel(), expect)

"""Freezing components of composites (issue 14, feature 3; MLJ 1.14's ``Freezable``, sklearn's ``FrozenEstimator``)."""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.frozen import FrozenEstimator
from sklearn.linear_model import Ridge
from sklearn.model_selection import KFold, cross_val_score
from sklearn.preprocessing import StandardScaler

import gpunets as gn
from gpunets.testing import assert_allclose_any


class Scaled(gn.CompositeRegressor):
    def __init__(self, encoder=None, model=None, freeze=()):
        self.encoder, self.model, self.freeze = encoder, model, freeze

    def network(self, X, y):
        W = gn.machine(self.encoder or StandardScaler(), X).transform(X)
        return gn.machine(self.model or Ridge(), W, y).predict(W)


def _data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3)) * [1.0, 5.0, 0.1] + [0.0, 3.0, -1.0]
    return X, X @ [1.0, -2.0, 0.5] + rng.normal(size=n)


def _expected(scaler, X_train, y_train, X_test, alpha=1.0):
    return Ridge(alpha=alpha).fit(scaler.transform(X_train), y_train).predict(scaler.transform(X_test))


def test_a_frozen_component_stays_frozen_when_the_composite_refits_on_new_rows(executor):
    X, y = _data()
    comp = Scaled(StandardScaler(), Ridge()).fit(X[:30], y[:30])   # MLJ: fit!(mach, rows=1:30)
    first = StandardScaler().fit(X[:30])
    comp.machines_["encoder"].freeze()
    comp.fit(X[30:], y[30:])                                       # rows 31:60: only the model retrains
    assert comp.fit_report_.actions.by_label() == {"encoder": "skip", "model": "train"}
    assert comp.report_["encoder"]["frozen"] is True
    assert_allclose_any(comp.machines_["encoder"].estimator_.mean_, first.mean_, rtol=1e-12)  # on its device
    np.testing.assert_allclose(comp.predict(X), _expected(first, X[30:], y[30:], X))
    comp.machines_["encoder"].thaw()                               # thawed: it retrains on the next rows
    comp.fit(X[:40], y[:40])
    assert comp.fit_report_.actions.by_label() == {"encoder": "train", "model": "train"}


def test_frozen_wins_over_new_hyperparameters_of_the_component():
    X, y = _data()
    comp = Scaled(StandardScaler(), Ridge()).fit(X, y)
    comp.machines_["encoder"].freeze()
    comp.set_params(encoder__with_mean=False, model__alpha=3.0).fit(X, y)
    assert comp.fit_report_.actions.by_label() == {"encoder": "skip", "model": "update"}


def test_a_clone_keeps_frozen_components_fitted_so_cross_validation_refits_only_the_others(executor):
    X, y = _data(seed=1)
    comp = Scaled(StandardScaler(), Ridge()).fit(X, y)
    comp.machines_["encoder"].freeze()
    twin = clone(comp)
    assert not hasattr(twin, "fit_report_")         # unfitted, except the frozen component it carries
    twin.fit(X[:20], y[:20])
    assert twin.fit_report_.actions.by_label() == {"encoder": "skip", "model": "train"}
    scaler = StandardScaler().fit(X)
    expected = []
    cv = KFold(3)
    for train, test in cv.split(X):
        pred = _expected(scaler, X[train], y[train], X[test])
        expected.append(1 - ((y[test] - pred) ** 2).sum() / ((y[test] - y[test].mean()) ** 2).sum())
    np.testing.assert_allclose(cross_val_score(comp, X, y, cv=cv), expected)
    # without freezing, each fold refits the encoder too: other scores
    plain = cross_val_score(Scaled(StandardScaler(), Ridge()), X, y, cv=cv)
    assert not np.allclose(plain, expected)


def test_the_freeze_hyperparameter_trains_once_then_freezes(executor):
    X, y = _data(seed=2)
    comp = Scaled(StandardScaler(), Ridge(), freeze=("encoder",)).fit(X[:30], y[:30])
    assert comp.fit_report_.actions.by_label() == {"encoder": "train", "model": "train"}
    assert comp.machines_["encoder"].frozen
    comp.fit(X[30:], y[30:])
    assert comp.fit_report_.actions.by_label() == {"encoder": "skip", "model": "train"}
    first = StandardScaler().fit(X[:30])
    np.testing.assert_allclose(comp.predict(X), _expected(first, X[30:], y[30:], X))
    folds = cross_val_score(comp, X, y, cv=KFold(2))
    assert folds.shape == (2,)
    assert clone(comp).get_params()["freeze"] == ("encoder",)


def test_scikit_learn_frozen_estimator_members_are_never_refit(executor):
    X, y = _data(seed=3)
    scaler = StandardScaler().fit(X[:10])
    comp = Scaled(FrozenEstimator(scaler), Ridge()).fit(X, y)      # a transformer: FrozenEstimator.fit needs y
    np.testing.assert_allclose(comp.predict(X), _expected(scaler, X, y, X))
    comp.fit(X[20:], y[20:])
    assert comp.fit_report_.actions.by_label() == {"encoder": "skip", "model": "train"}
    cv = KFold(3)
    expected = [Scaled(FrozenEstimator(scaler), Ridge()).fit(X[tr], y[tr]).score(X[te], y[te])
                for tr, te in cv.split(X)]
    np.testing.assert_allclose(cross_val_score(comp, X, y, cv=cv), expected)
    np.testing.assert_allclose(scaler.mean_, X[:10].mean(axis=0))   # never refit


def test_bad_freeze_names_fail_before_any_state_changes():
    X, y = _data()
    comp = Scaled(StandardScaler(), Ridge()).fit(X, y)
    before = comp.predict(X)
    comp.set_params(freeze=("encodr",))
    with pytest.raises(ValueError, match=r"freeze names \['encodr'\].*Valid names are: \['encoder', 'model'\]"):
        comp.fit(X[:10], y[:10])
    np.testing.assert_allclose(comp.predict(X), before)
    comp.set_params(freeze="encoder")
    with pytest.raises(TypeError, match=r"freeze='encoder' must be a tuple of component names"):
        comp.fit(X, y)

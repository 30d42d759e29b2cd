"""Warm updates (issue 14, feature 2): an update that only grows an iteration-like hyperparameter
continues from the fitted state (MLJ's ``update``) on a copy of it; anything else refits as before.
Every behavioural test runs on every executor present (``executor`` fixture)."""

import copy

import numpy as np
import pytest
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.ensemble import (ExtraTreesClassifier, ExtraTreesRegressor, GradientBoostingClassifier,
                              GradientBoostingRegressor, RandomForestClassifier, RandomForestRegressor)
from sklearn.linear_model import Ridge, SGDRegressor

import gpunets as gn


class Rounds(RegressorMixin, BaseEstimator):
    """Adds ``n_rounds - done`` rounds with warm_start (a custom iteration-like name); fails when told to."""

    fail_at = 13

    def __init__(self, n_rounds=2, warm_start=True):
        self.n_rounds, self.warm_start = n_rounds, warm_start

    def fit(self, X, y):
        if self.n_rounds == self.fail_at:
            raise ValueError("planted failure in Rounds")
        done = self.rounds_ if self.warm_start and hasattr(self, "rounds_") else []
        self.rounds_ = done + [float(np.mean(y))] * (self.n_rounds - len(done))
        return self

    def predict(self, X):
        return np.full(len(X), sum(self.rounds_))


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 4))
    y = X @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.1 * rng.normal(size=80)
    return X, y


def network(model, X, y, **kw):
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    mach = gn.machine(model, Xs, ys, **kw)
    return mach, mach.predict(Xs)


@pytest.mark.parametrize("cls", [RandomForestRegressor, ExtraTreesRegressor, GradientBoostingRegressor,
                                 RandomForestClassifier, ExtraTreesClassifier, GradientBoostingClassifier])
def test_growing_n_estimators_continues_and_equals_a_cold_fit(executor, data, cls):
    X, y = data
    if cls.__name__.endswith("Classifier"):
        y = (y > 0).astype(int)
    mach, yhat = network(cls(n_estimators=4, warm_start=True, random_state=0), X, y)
    assert yhat.fit().actions[mach] == "train"
    old = mach.estimator_
    old_trees = list(np.ravel(old.estimators_))
    mach.model.n_estimators = 7
    report = yhat.fit()
    assert report.actions[mach] == "update (warm)"
    assert report.why[mach.label] == "hyperparameter n_estimators (4 -> 7) grew: continued from the fitted state"
    assert mach.report()["action"] == "update (warm)" and mach.report()["history"] == ["train", "update (warm)"]
    new = mach.estimator_
    assert new is not old and len(np.ravel(new.estimators_)) == 7 * len(old_trees) // 4
    # the committed state was not trained further: the old estimator is as it was
    assert old.n_estimators == 4 and list(np.ravel(old.estimators_)) == old_trees
    cold = cls(n_estimators=7, random_state=0).fit(X, y)
    np.testing.assert_array_equal(yhat(), cold.predict(X))          # scikit-learn's guarantee
    assert yhat.fit().actions[mach] == "skip"


def test_hist_gradient_boosting_max_iter_grows_warm(executor, data):
    from sklearn.ensemble import HistGradientBoostingRegressor

    X, y = data
    mach, yhat = network(HistGradientBoostingRegressor(max_iter=5, warm_start=True, early_stopping=False,
                                                       random_state=0), X, y)
    yhat.fit()
    mach.model.max_iter = 9
    assert yhat.fit().actions[mach] == "update (warm)"
    assert mach.estimator_.n_iter_ == 9
    cold = HistGradientBoostingRegressor(max_iter=9, early_stopping=False, random_state=0).fit(X, y)
    np.testing.assert_array_equal(yhat(), cold.predict(X))


def test_every_other_change_refits_a_fresh_clone(executor, data):
    X, y = data
    mach, yhat = network(RandomForestRegressor(n_estimators=3, warm_start=True, random_state=0), X, y)
    yhat.fit()
    mach.model.set_params(n_estimators=5, max_depth=3)           # another hyperparameter changed too
    assert yhat.fit().actions[mach] == "update"
    mach.model.n_estimators = 4                                  # shrinks
    assert yhat.fit().actions[mach] == "update"
    mach.model.n_estimators = 6
    assert yhat.fit(rows=slice(0, 60)).actions[mach] == "train"  # new rows
    mach.model.n_estimators = 8
    yhat.origins[0].data = 2 * X                                 # new data
    assert yhat.fit().actions[mach] == "train"
    np.testing.assert_array_equal(
        yhat(), RandomForestRegressor(n_estimators=8, max_depth=3, random_state=0).fit(2 * X, y).predict(2 * X))


def test_without_warm_start_or_with_warm_false_an_update_is_cold(executor, data):
    X, y = data
    mach, yhat = network(RandomForestRegressor(n_estimators=3, random_state=0), X, y)
    yhat.fit()
    mach.model.n_estimators = 5
    assert yhat.fit().actions[mach] == "update"                  # warm_start=False: scikit-learn refits too
    off, out = network(RandomForestRegressor(n_estimators=3, warm_start=True, random_state=0), X, y, warm=False)
    out.fit()
    off.model.n_estimators = 5
    assert out.fit().actions[off] == "update"


def test_the_iteration_like_names_are_a_setting(executor, data):
    X, y = data
    mach, yhat = network(Rounds(n_rounds=2), X, y)
    yhat.fit()
    mach.model.n_rounds = 4
    assert yhat.fit().actions[mach] == "update"                  # n_rounds is not listed by default
    with gn.config(warm_params=gn.get_config()["warm_params"] + ("n_rounds",)):
        mach.model.n_rounds = 6
        assert yhat.fit().actions[mach] == "update (warm)"
    assert mach.estimator_.rounds_ == [float(np.mean(y))] * 6
    with gn.config(warm_params=()):                              # off everywhere
        big, out = network(RandomForestRegressor(n_estimators=2, warm_start=True), X, y)
        out.fit()
        big.model.n_estimators = 3
        assert out.fit().actions[big] == "update"


def test_a_failed_warm_update_loses_nothing(executor, data):
    X, y = data
    mach, yhat = network(Rounds(n_rounds=2), X, y)
    with gn.config(warm_params=("n_rounds",)):
        yhat.fit()
        mach.model.n_rounds = 5
        yhat.fit()
        before, state = yhat(), mach._state
        mach.model.n_rounds = Rounds.fail_at
        with pytest.raises(gn.FitError, match="planted failure"):
            yhat.fit()
        assert mach._state is state and len(state.estimator.rounds_) == 5   # nothing trained further in place
        np.testing.assert_array_equal(yhat(), before)
        mach.model.n_rounds = 7                                  # continues from the last committed state
        assert yhat.fit().actions[mach] == "update (warm)"
        assert len(mach.estimator_.rounds_) == 7


def test_partial_fit_continues_once_per_unit_of_growth(executor, data):
    X, y = data
    mach, yhat = network(SGDRegressor(max_iter=5, tol=None, random_state=0), X, y, warm="partial_fit")
    yhat.fit()
    old = mach.estimator_
    old_coef = old.coef_.copy()
    expected = copy.deepcopy(old).set_params(max_iter=8)
    for _ in range(3):
        expected.partial_fit(X, y)
    mach.model.max_iter = 8
    report = yhat.fit()
    assert report.actions[mach] == "update (warm)"
    np.testing.assert_array_equal(mach.estimator_.coef_, expected.coef_)
    assert mach.estimator_.t_ == 8 * len(X) + 1                  # 5 epochs by fit, 3 by partial_fit
    np.testing.assert_array_equal(old.coef_, old_coef)           # the committed state untouched
    mach.model.alpha = 0.01                                       # any other change: a cold refit
    assert yhat.fit().actions[mach] == "update"
    np.testing.assert_array_equal(
        yhat(), SGDRegressor(max_iter=8, tol=None, alpha=0.01, random_state=0).fit(X, y).predict(X))


def test_a_warm_update_downstream_retrains_what_depends_on_it(executor, data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    forest = gn.machine(RandomForestRegressor(n_estimators=3, warm_start=True, random_state=0), Xs, ys)
    ridge = gn.machine(Ridge(), gn.hstack(Xs, forest.predict(Xs)), ys)
    out = ridge.predict(gn.hstack(Xs, forest.predict(Xs)))
    out.fit()
    forest.model.n_estimators = 6
    assert out.fit().actions.by_label() == {"RandomForestRegressor": "update (warm)", "Ridge": "train"}


def test_bad_warm_arguments_are_named_before_anything_is_built(data):
    X, y = data
    with pytest.raises(ValueError, match=r"warm='yes' is not a warm-update mode; expected 'auto'"):
        gn.machine(Ridge(), X, y, warm="yes")
    with pytest.raises(ValueError, match="warm=True"):
        gn.machine(Ridge(), X, y, warm=True)
    with pytest.raises(TypeError, match=r"Ridge has no partial_fit method.*warm=False"):
        gn.machine(Ridge(), X, y, warm="partial_fit")
    with pytest.raises(TypeError, match=r"warm_params='max_iter' must be a list or tuple .*\('max_iter',\)"):
        gn.config(warm_params="max_iter")
    with pytest.raises(TypeError, match="warm_params"):
        gn.set_config(warm_params=[1])
    assert gn.get_config()["warm_params"] == ("n_estimators", "max_iter", "n_iter")


def test_a_warm_update_continues_only_where_its_fitted_state_lives(data):
    from gpunets.testing import fake_gpu

    X, y = data
    with fake_gpu(1), gn.config(fallback="silent", executor="serial"):
        mach, yhat = network(RandomForestRegressor(n_estimators=3, warm_start=True, random_state=0), X, y,
                             device="cuda")
        yhat.fit()
        assert mach._state.path == "cpu_fallback"       # no cuML here: the forest falls back to the CPU
        mach.model.n_estimators = 5
        assert yhat.fit().actions[mach] == "update (warm)" and len(mach.estimator_.estimators_) == 5
        mach.device = "cpu"                             # its next fit runs on another route: a fresh clone
        mach.model.n_estimators = 7
        report = yhat.fit()
        assert report.actions[mach] == "update" and mach.report()["history"][-1] == "update"
        np.testing.assert_array_equal(yhat(), RandomForestRegressor(n_estimators=7, random_state=0).fit(X, y)
                                      .predict(X))


def test_the_printed_report_keeps_its_columns_with_a_warm_update(data):
    X, y = data
    mach, yhat = network(RandomForestRegressor(n_estimators=2, warm_start=True, random_state=0), X, y)
    yhat.fit()
    mach.model.n_estimators = 3
    header, row = repr(yhat.fit()).splitlines()[1:3]
    assert row.split()[1:3] == ["update", "(warm)"]
    assert header.index("device") == row.index("cpu")


class Forested(gn.CompositeRegressor):
    def __init__(self, forest=None):
        self.forest = forest

    def network(self, X, y):
        from sklearn.preprocessing import StandardScaler

        W = gn.machine(StandardScaler(), X).transform(X)
        return gn.machine(self.forest, W, y, name="forest").predict(W)


def test_a_composite_component_grown_by_set_params_continues(executor, data):
    X, y = data
    comp = Forested(RandomForestRegressor(n_estimators=3, warm_start=True, random_state=0)).fit(X, y)
    comp.set_params(forest__n_estimators=6)
    comp.fit(X, y)
    assert comp.fit_report_.actions.by_label() == {"StandardScaler": "skip", "forest": "update (warm)"}
    cold = Forested(RandomForestRegressor(n_estimators=6, random_state=0)).fit(X, y)
    np.testing.assert_array_equal(comp.predict(X), cold.predict(X))

"""The store and the fits that are not a plain first fit (issue 26): a state continued by a warm update is stored
under a key chained to the state it continued, so the same growth in another network (or session) loads it
instead of growing it; a search's refit on all rows looks in the store like its folds' fits."""

import numpy as np
import pytest
from sklearn.ensemble import RandomForestRegressor
from sklearn.linear_model import SGDRegressor

import gpunets as gn


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 4))
    return X, X @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.1 * rng.normal(size=120)


def _net(model, X, y, **kw):
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    mach = gn.machine(model, Xs, ys, **kw)
    return mach, mach.predict(Xs)


def test_a_warm_update_is_stored_and_loaded_by_the_same_growth_elsewhere(tmp_path, executor, data):
    X, y = data
    with gn.config(store=gn.Store(tmp_path / "s")):
        mach, yhat = _net(RandomForestRegressor(n_estimators=4, warm_start=True, random_state=0), X, y)
        yhat.fit(executor=executor)
        mach.model.n_estimators = 8
        assert yhat.fit(executor=executor).actions[mach] == "update (warm)"
        grown = yhat()
        assert gn.store_info().entries == 2
        other, out = _net(RandomForestRegressor(n_estimators=4, warm_start=True, random_state=0), X, y)
        assert out.fit(executor=executor).actions[other] == "stored"
        other.model.n_estimators = 8
        report = out.fit(executor=executor)
        assert report.actions[other] == "stored"          # the growth was done once
        assert "loaded instead of fitted" in report.why[other.label]
        np.testing.assert_array_equal(out(), grown)
        assert len(other.fitted_params()["estimators_"]) == 8
        other.model.n_estimators = 12                      # a growth not stored yet: continued, then stored
        assert out.fit(executor=executor).actions[other] == "update (warm)"
        assert gn.store_info().entries == 3


def test_partial_fit_growth_is_chained_too(tmp_path, executor, data):
    X, y = data
    with gn.config(store=gn.Store(tmp_path / "s")):
        mach, yhat = _net(SGDRegressor(max_iter=5, tol=None, random_state=0), X, y, warm="partial_fit")
        yhat.fit(executor=executor)
        mach.model.max_iter = 7
        assert yhat.fit(executor=executor).actions[mach] == "update (warm)"
        grown = yhat()
        other, out = _net(SGDRegressor(max_iter=5, tol=None, random_state=0), X, y, warm="partial_fit")
        out.fit(executor=executor)
        other.model.max_iter = 7
        assert out.fit(executor=executor).actions[other] == "stored"
        np.testing.assert_array_equal(out(), grown)
        assert other.fitted_params()["t_"] == mach.fitted_params()["t_"]


def test_a_state_fitted_without_a_store_grows_as_before(tmp_path, executor, data):
    X, y = data
    mach, yhat = _net(RandomForestRegressor(n_estimators=4, warm_start=True, random_state=0), X, y)
    yhat.fit(executor=executor)
    with gn.config(store=gn.Store(tmp_path / "s")):
        mach.model.n_estimators = 8
        assert yhat.fit(executor=executor).actions[mach] == "update (warm)"
        assert gn.store_info().entries == 0                # its state had no key: nothing to chain to


class _CountingScaler(__import__("sklearn.preprocessing", fromlist=["StandardScaler"]).StandardScaler):
    fits = 0

    def fit(self, X, y=None, sample_weight=None):
        type(self).fits += 1
        return super().fit(X, y, sample_weight=sample_weight)


def test_a_search_refit_looks_in_the_store_too(tmp_path, data):
    """The refit of the best candidate on all rows is a fit like the others: its upstream steps are stored, and
    the same search run again (a new object) fits no step at all, with the same best estimator."""
    from sklearn.decomposition import PCA
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline

    X, y = data

    def search():
        pipe = make_pipeline(_CountingScaler(), PCA(3, svd_solver="full"), Ridge())
        return gn.GridSearchCV(pipe, {"ridge__alpha": [0.1, 1.0]}, cv=3)

    with gn.config(store=gn.Store(tmp_path / "s")):
        first = search().fit(X, y)
        assert first.search_report_.refit_stored == 0
        _CountingScaler.fits = 0
        hits = gn.store_info().hits
        again = search().fit(X, y)
        assert _CountingScaler.fits == 0              # the folds' and the refit's scalers: all loaded
        assert again.search_report_.refit_stored == 3   # the refit's three steps, the last one too
        assert gn.store_info().hits - hits == 6 + 3     # each (candidate, fold) result and refit step: one hit
        assert "3 steps of the refit loaded" in str(again.search_report_)
    np.testing.assert_array_equal(again.best_estimator_.predict(X), first.best_estimator_.predict(X))
    cold = search().fit(X, y)
    np.testing.assert_array_equal(cold.best_estimator_.predict(X), first.best_estimator_.predict(X))


def test_a_refit_with_a_new_best_loads_its_upstream_and_fits_the_last_step(tmp_path, data):
    """A grid widened with a better candidate: the refit loads the stored upstream steps, transforms the rows
    through them and fits the new best's last step, as a cold search's refit does, to the last bit."""
    from sklearn.decomposition import PCA
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline

    X, y = data

    def search(alphas):
        return gn.GridSearchCV(make_pipeline(_CountingScaler(), PCA(3), Ridge()), {"ridge__alpha": alphas}, cv=3)

    with gn.config(store=gn.Store(tmp_path / "s")):
        search([30.0, 100.0]).fit(X, y)
        _CountingScaler.fits = 0
        wide = search([30.0, 100.0, 0.01]).fit(X, y)
        assert wide.best_params_ == {"ridge__alpha": 0.01}
        assert _CountingScaler.fits == 0
        assert wide.search_report_.refit_stored == 2     # the scaler and the PCA; the new Ridge is fitted
    cold = search([30.0, 100.0, 0.01]).fit(X, y)
    np.testing.assert_array_equal(wide.best_estimator_.predict(X), cold.best_estimator_.predict(X))
    np.testing.assert_array_equal(wide.cv_results_["mean_test_score"], cold.cv_results_["mean_test_score"])

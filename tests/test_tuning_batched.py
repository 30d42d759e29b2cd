"""Last steps fitted and scored together (gpunets.tuning.batched): equal to scikit-learn's own, bit for bit."""

import warnings

import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.experimental import enable_halving_search_cv  # noqa: F401
from sklearn.linear_model import Lasso, Ridge
from sklearn.model_selection import GridSearchCV, HalvingGridSearchCV, KFold
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

import gpunets as gn
from gpunets.tuning import batched
from gpunets.tuning.onepass_search import enabled
from gpunets.tuning.report import SearchReport, batch_fit_name

ALPHAS = [0.001, 0.1, 1.0, 10.0, 1000.0]


@pytest.fixture(autouse=True)
def _network_path():
    """These tests are about the batch rules of the network path: the one-pass path (which takes these linear
    pipelines first, tests/test_tuning_onepass.py) is turned off."""
    with enabled(False):
        yield


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(240, 8)) @ rng.normal(size=(8, 8))
    y = X[:, :3].sum(axis=1) + rng.normal(size=240)
    return X, y


def _pipe(last=None):
    return Pipeline([("scale", StandardScaler()), ("pca", PCA(n_components=5)), ("ridge", last or Ridge())])


KEYS = ("mean_test_score", "mean_train_score", *(f"split{i}_test_score" for i in range(4)),
        *(f"split{i}_train_score" for i in range(4)), "rank_test_score")


def _same(ours, theirs, keys=KEYS):
    """The same results as scikit-learn's, to 1e-12: each batched fit is its own fit's computation, but the
    BLAS of a worker thread (gpunets caps its native threads) may round a Gram matrix otherwise than the
    calling thread's, in the last bit, with or without batches."""
    for k in keys:
        if k in theirs.cv_results_:
            np.testing.assert_allclose(ours.cv_results_[k], theirs.cv_results_[k], rtol=1e-12, atol=1e-15, err_msg=k)
    assert ours.best_params_ == theirs.best_params_


@pytest.mark.parametrize("scoring", [None, "r2", "neg_mean_squared_error", "neg_root_mean_squared_error",
                                     "neg_mean_absolute_error", "explained_variance", "neg_median_absolute_error"])
def test_ridges_over_alpha_are_fitted_together_and_score_as_scikit_learn_bit_for_bit(executor, data, scoring):
    X, y = data
    kw = dict(cv=KFold(4), scoring=scoring, return_train_score=True)
    ours = gn.GridSearchCV(_pipe(), {"ridge__alpha": ALPHAS}, **kw).fit(X, y)
    theirs = GridSearchCV(_pipe(), {"ridge__alpha": ALPHAS}, **kw).fit(X, y)
    _same(ours, theirs)
    rep = ours.search_report_
    assert rep.batched == len(ALPHAS) * 4
    assert rep.ran in (None, rep.fits)   # a batch task counts the fits it did (None: Dask without a trace)
    np.testing.assert_allclose(ours.best_estimator_.predict(X), theirs.best_estimator_.predict(X), rtol=1e-12)


def test_a_single_ridge_a_two_stage_grid_and_a_multimetric_scorer(executor, data):
    X, y = data
    kw = dict(cv=KFold(4), return_train_score=True)
    ours = gn.GridSearchCV(Ridge(), {"alpha": ALPHAS, "fit_intercept": [True, False]}, **kw).fit(X, y)
    theirs = GridSearchCV(Ridge(), {"alpha": ALPHAS, "fit_intercept": [True, False]}, **kw).fit(X, y)
    _same(ours, theirs)
    assert ours.search_report_.batched == 2 * len(ALPHAS) * 4   # one batch per fold and fit_intercept
    grid = {"pca__n_components": [3, 5], "ridge__alpha": ALPHAS}
    scoring = {"r2": "r2", "mse": "neg_mean_squared_error"}
    ours = gn.GridSearchCV(_pipe(), grid, scoring=scoring, refit="r2", **kw).fit(X, y)
    theirs = GridSearchCV(_pipe(), grid, scoring=scoring, refit="r2", **kw).fit(X, y)
    _same(ours, theirs, ("mean_test_r2", "mean_test_mse", "mean_train_r2", "split0_test_mse"))
    assert ours.search_report_.batched == 2 * len(ALPHAS) * 4   # fitted together, scored one by one


def test_halving_over_alpha_equals_scikit_learn(executor, data):
    X, y = data
    kw = dict(cv=KFold(3), factor=2, random_state=0)
    ours = gn.HalvingGridSearchCV(_pipe(), {"ridge__alpha": ALPHAS}, **kw).fit(X, y)
    theirs = HalvingGridSearchCV(_pipe(), {"ridge__alpha": ALPHAS}, **kw).fit(X, y)
    _same(ours, theirs, ("mean_test_score", "mean_train_score", "split2_test_score", "iter", "n_resources"))
    assert ours.search_report_.batched > 0
    assert sum(r.batched for r in ours.search_report_.rungs) == ours.search_report_.batched


@pytest.mark.parametrize("case", ["svd solver", "positive", "copy_X=False", "array alpha", "lasso", "equal alphas",
                                  "sample_weight"])
def test_what_the_rule_does_not_cover_is_fitted_one_by_one(data, case):
    X, y = data
    last, grid, params = Ridge(), {"ridge__alpha": ALPHAS}, {}
    if case == "svd solver":
        last = Ridge(solver="svd")
    elif case == "positive":
        last = Ridge(positive=True)
    elif case == "copy_X=False":
        last = Ridge(copy_X=False)
    elif case == "array alpha":
        grid = {"ridge__alpha": [np.array([0.1]), np.array([1.0])]}
    elif case == "lasso":
        last, grid = Lasso(), {"ridge__alpha": [0.01, 0.1]}
    elif case == "equal alphas":
        grid = {"ridge__alpha": [1.0, 1.0]}
    else:
        params = {"ridge__sample_weight": np.linspace(0.5, 1.5, len(y))}
    kw = dict(cv=KFold(3), return_train_score=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # Lasso's convergence warnings, the same on both sides
        ours = gn.GridSearchCV(_pipe(last), grid, **kw).fit(X, y, **params)
        theirs = GridSearchCV(_pipe(last), grid, **kw).fit(X, y, **params)
    _same(ours, theirs, ("mean_test_score", "mean_train_score"))
    assert ours.search_report_.batched == 0


def test_rows_the_rule_declines_at_run_time_are_fitted_one_by_one(executor):
    # more columns than rows: scikit-learn solves the kernel form; the batch declines it when it sees the rows
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(30, 40)), rng.normal(size=30)
    kw = dict(cv=KFold(3), return_train_score=True)
    ours = gn.GridSearchCV(Ridge(), {"alpha": ALPHAS}, **kw).fit(X, y)
    theirs = GridSearchCV(Ridge(), {"alpha": ALPHAS}, **kw).fit(X, y)
    _same(ours, theirs, ("mean_test_score", "mean_train_score", "split1_test_score"))
    assert ours.search_report_.batched == 0
    # float32 rows with a float64 target, and a target of integers: one by one too, the same scores
    for Xv, yv in ((X[:, :5].astype(np.float32), y), (X[:, :5], np.arange(30) % 4)):
        ours = gn.GridSearchCV(Ridge(), {"alpha": ALPHAS}, **kw).fit(Xv, yv)
        theirs = GridSearchCV(Ridge(), {"alpha": ALPHAS}, **kw).fit(Xv, yv)
        _same(ours, theirs, ("mean_test_score", "mean_train_score"))


def test_failing_folds_give_scikit_learn_error_scores(executor, data):
    X, y = data
    X = X.copy()
    X[5, 2] = np.nan   # the folds that train on row 5 fail to fit, as each candidate's own fit does
    kw = dict(cv=KFold(3), error_score=np.nan, return_train_score=True, refit=False)
    with pytest.warns(Warning):
        ours = gn.GridSearchCV(Ridge(), {"alpha": ALPHAS}, **kw).fit(X, y)
    with pytest.warns(Warning):
        theirs = GridSearchCV(Ridge(), {"alpha": ALPHAS}, **kw).fit(X, y)
    for k in ("split0_test_score", "split1_test_score", "split2_test_score", "mean_train_score"):
        np.testing.assert_allclose(ours.cv_results_[k], theirs.cv_results_[k], rtol=1e-12, err_msg=k)
    assert np.isnan(ours.cv_results_["split1_test_score"]).all()


def test_parameters_scikit_learn_refuses_fail_each_candidate_in_a_checked_kind(executor, data):
    X, y = data
    gn.GridSearchCV(Ridge(), {"alpha": ALPHAS}, cv=KFold(3)).fit(X, y)   # the kinds checked: no fit by sklearn
    # max_iter=-5: unused by the Cholesky solver, but refused by Ridge's parameter check, fit by fit
    grid = [{"alpha": ALPHAS, "max_iter": [-5]}, {"alpha": ALPHAS}]
    kw = dict(cv=KFold(3), error_score=np.nan, refit=False)
    with pytest.warns(Warning, match="max_iter"):
        ours = gn.GridSearchCV(Ridge(), grid, **kw).fit(X, y)
    with pytest.warns(Warning, match="max_iter"):
        theirs = GridSearchCV(Ridge(), grid, **kw).fit(X, y)
    _same(ours, theirs, ("mean_test_score", "split0_test_score"))
    assert np.isnan(ours.cv_results_["mean_test_score"][:len(ALPHAS)]).all()
    assert ours.search_report_.batched == len(ALPHAS) * 3   # the valid group only


def test_a_batch_that_differs_from_scikit_learn_by_a_bit_is_not_used(monkeypatch, data):
    """The self-checks: in a kind's first batch, a shared fit or a batched prediction that is not scikit-learn's
    own for the first candidate, bit for bit, makes the batch fit or score the candidates one by one."""
    X, y = data
    monkeypatch.setattr(batched, "_CHECKED", {})   # every kind unchecked
    kw = dict(cv=KFold(3), return_train_score=True)
    theirs = GridSearchCV(_pipe(), {"ridge__alpha": ALPHAS}, **kw).fit(X, y)
    real = batched.RidgeRule.predict
    monkeypatch.setattr(batched.RidgeRule, "predict", staticmethod(lambda est, Z: real(est, Z) * (1 + 1e-15)))
    ours = gn.GridSearchCV(_pipe(), {"ridge__alpha": ALPHAS}, **kw).fit(X, y)
    _same(ours, theirs)
    assert ours.search_report_.batched == len(ALPHAS) * 3   # fitted together, scored one by one
    monkeypatch.undo()
    monkeypatch.setattr(batched, "_CHECKED", {})

    import sklearn.linear_model._base as base

    pre = base._preprocess_data

    def shifted(*args, **kwargs):
        Xc, yc, X_offset, y_offset, X_scale, sw = pre(*args, **kwargs)
        return Xc, yc, X_offset, y_offset * (1 + 1e-15) + 1e-15, X_scale, sw

    monkeypatch.setattr(base, "_preprocess_data", shifted)
    ours = gn.GridSearchCV(_pipe(), {"ridge__alpha": ALPHAS}, **kw).fit(X, y)
    _same(ours, theirs)
    assert ours.search_report_.batched == 0
    # the fit's kind not checked: its next batch is checked again (the scores, batched, were checked)
    assert [k[0] for k in batched._CHECKED] == ["score"]


@pytest.mark.parametrize("checked", [False, True])
def test_each_fitted_candidate_equals_its_own_fit(monkeypatch, data, checked):
    X, y = data
    monkeypatch.setattr(batched, "_CHECKED", {})
    if checked:   # the kind already checked: no fit by scikit-learn in the batch
        batched.RidgeRule.fit([Ridge(), Ridge(alpha=2.0)], X, y)
        assert len(batched._CHECKED) == 1
    ests = [Ridge(alpha=a) for a in ALPHAS] + [Ridge(alpha=3)]
    rule, key = batched.rule_for(ests[0])
    assert all(batched.rule_for(e)[1] == key for e in ests)
    assert batched.rule_for(Ridge(fit_intercept=False))[1] != key and batched.rule_for(Lasso()) is None
    fitted = rule.fit(ests, X, y)
    for est, got in zip(ests, fitted):
        own = Ridge(alpha=est.alpha).fit(X, y)
        assert got.alpha == est.alpha and got is not est
        np.testing.assert_array_equal(got.coef_, own.coef_)
        assert got.intercept_ == own.intercept_ and got.n_features_in_ == own.n_features_in_
        assert {k: v for k, v in vars(got).items() if k.endswith("_") and k not in ("coef_", "intercept_")} == \
            {k: v for k, v in vars(own).items() if k.endswith("_") and k not in ("coef_", "intercept_")}
        np.testing.assert_array_equal(got.predict(X), own.predict(X))
        np.testing.assert_array_equal(rule.predict(got, X), own.predict(X))


def test_the_report_counts_a_batch_task_as_the_fits_it_did():
    from gpunets.base.trace import TraceRecord

    r = SearchReport(fits={"pca": 1, "ridge": 31})
    labels = [f"{batch_fit_name('ridge', 30)}(Stage)", "fit ridge(X)", "fit pca(X)", "score ridge(x)"]
    r.read_trace([TraceRecord(k, "node", lab, "w1", "cpu", 0.0, 1.0, "w") for k, lab in enumerate(labels)])
    assert r.ran == {"pca": 1, "ridge": 31} and r.where == {"pca": {"w1": 1}, "ridge": {"w1": 31}}


@pytest.mark.skipif(not hasattr(GridSearchCV, "set_callbacks"), reason="scikit-learn without callbacks")
def test_callbacks_watching_each_fit_see_each_candidate_fitted_on_its_own(data):
    from tests.test_tuning_halving import CountingCallback

    X, y = data
    a, b = CountingCallback(), CountingCallback()
    ours = gn.GridSearchCV(Ridge(), {"alpha": ALPHAS}, cv=KFold(3)).set_callbacks(a).fit(X, y)
    GridSearchCV(Ridge(), {"alpha": ALPHAS}, cv=KFold(3)).set_callbacks(b).fit(X, y)
    assert a.counts == b.counts and ours.search_report_.batched == 0


def test_with_a_store_each_batched_fit_is_kept_and_loaded_on_its_own(tmp_path, executor, data):
    X, y = data
    grid, kw = {"ridge__alpha": ALPHAS}, dict(cv=KFold(3), return_train_score=True)
    with gn.config(store=gn.Store(tmp_path / "s")):
        first = gn.GridSearchCV(_pipe(), grid, **kw).fit(X, y)
        assert first.search_report_.batched == len(ALPHAS) * 3
        # another scorer: no stored result, but every step fit is stored (each Ridge under its own key)
        again = gn.GridSearchCV(_pipe(), grid, scoring="neg_mean_squared_error", **kw).fit(X, y)
        wider = gn.GridSearchCV(_pipe(), {"ridge__alpha": [*ALPHAS, 50.0, 500.0]}, scoring="r2", **kw).fit(X, y)
    assert again.search_report_.batched == 0 and again.search_report_.stored >= len(ALPHAS) * 3
    assert wider.search_report_.batched == 2 * 3   # the results of the five kept, the two new fitted together
    _same(again, GridSearchCV(_pipe(), grid, scoring="neg_mean_squared_error", **kw).fit(X, y))
    _same(wider, GridSearchCV(_pipe(), {"ridge__alpha": [*ALPHAS, 50.0, 500.0]}, scoring="r2", **kw).fit(X, y))


@pytest.mark.parametrize("target", ["series", "integers", "float32 rows"])
def test_pandas_targets_integer_targets_and_float32_rows_are_batched_too(executor, data, target):
    import pandas as pd

    X, y = data
    if target == "series":
        X, y = pd.DataFrame(X, columns=[f"f{i}" for i in range(X.shape[1])]), pd.Series(y, name="y")
    elif target == "integers":
        y = np.round(y * 3).astype(np.int64)
    else:
        X = X.astype(np.float32)
    kw = dict(cv=KFold(4), return_train_score=True)
    ours = gn.GridSearchCV(_pipe(), {"ridge__alpha": ALPHAS}, **kw).fit(X, y)
    theirs = GridSearchCV(_pipe(), {"ridge__alpha": ALPHAS}, **kw).fit(X, y)
    # float32 rows round in float32: a worker thread's BLAS (capped) may round a last bit otherwise
    rtol = 1e-6 if target == "float32 rows" else 1e-12
    for k in ("mean_test_score", "mean_train_score", "split3_test_score"):
        np.testing.assert_allclose(ours.cv_results_[k], theirs.cv_results_[k], rtol=rtol, err_msg=k)
    assert ours.search_report_.batched == len(ALPHAS) * 4


def test_scores_of_many_candidates_are_taken_a_bounded_slice_at_a_time(monkeypatch, data):
    X, y = data
    monkeypatch.setattr(batched, "COLUMN_VALUES", 2 * 60)   # 60 test rows per fold: two candidates per metric call
    kw = dict(cv=KFold(4), return_train_score=True)
    ours = gn.GridSearchCV(_pipe(), {"ridge__alpha": ALPHAS}, **kw).fit(X, y)
    theirs = GridSearchCV(_pipe(), {"ridge__alpha": ALPHAS}, **kw).fit(X, y)
    _same(ours, theirs)
    assert ours.search_report_.batched == len(ALPHAS) * 4

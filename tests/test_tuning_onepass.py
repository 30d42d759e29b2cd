"""Searches in one pass over the data (gpunets.tuning.onepass*): scikit-learn's results to 1e-9, or a decline."""

import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.decomposition import PCA
from sklearn.experimental import enable_halving_search_cv  # noqa: F401
from sklearn.linear_model import Lasso, LinearRegression, Ridge
from sklearn.model_selection import (
    GridSearchCV,
    GroupKFold,
    HalvingGridSearchCV,
    KFold,
    LeaveOneGroupOut,
    RandomizedSearchCV,
    RepeatedKFold,
    ShuffleSplit,
    TimeSeriesSplit,
)
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

import gpunets as gn
from gpunets.testing import fake_gpu
from gpunets.tuning import onepass, onepass_moments, onepass_refit, onepass_search
from gpunets.tuning.onepass_search import enabled

ALPHAS = [0.001, 0.1, 1.0, 10.0, 1000.0]
KEYS = ("mean_test_score", "mean_train_score", "std_test_score", *(f"split{i}_test_score" for i in range(4)),
        *(f"split{i}_train_score" for i in range(4)))


@pytest.fixture(autouse=True)
def one_pass_on():
    """The one-pass path at any size (gn.config(one_pass=True); the default "auto" takes it from 20,000 rows on):
    on for every test here."""
    with gn.config(one_pass=True):
        yield


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(240, 8)) @ rng.normal(size=(8, 8)) + 5.0
    y = X[:, :3].sum(axis=1) + rng.normal(size=240)
    return X, y


def _same(ours, theirs):
    """scikit-learn's results, to 1e-9 relative (1e-12 absolute for scores near 0)."""
    for k in KEYS:
        if k in theirs.cv_results_:
            np.testing.assert_allclose(ours.cv_results_[k], theirs.cv_results_[k], rtol=1e-9, atol=1e-12, err_msg=k)
    # ranks: scikit-learn's wherever its scores differ by more than 1e-9 (candidates equal in exact arithmetic,
    # Ridge's solvers, tie here; scikit-learn ranks them by their last bits)
    a, r = theirs.cv_results_["mean_test_score"], ours.cv_results_["rank_test_score"]
    apart = a[:, None] - a[None, :] > 1e-9 * np.maximum(np.abs(a[:, None]), 1e-3)
    rows, cols = np.nonzero(apart)
    assert np.all(r[rows] < r[cols])
    best = theirs.cv_results_["mean_test_score"][ours.best_index_]
    np.testing.assert_allclose(best, theirs.best_score_, rtol=1e-9)


def _both(est, grid, X, y, fit_params=None, search=(gn.GridSearchCV, GridSearchCV), **kw):
    ours = search[0](est, grid, return_train_score=True, **kw).fit(X, y, **(fit_params or {}))
    theirs = search[1](est, grid, return_train_score=True, **kw).fit(X, y, **(fit_params or {}))
    _same(ours, theirs)
    return ours, theirs


def _taken(search):
    note = getattr(search, "search_report_", search).one_pass
    assert note is not None and note.taken, note
    return note


def _declined(search, words):
    note = search.search_report_.one_pass
    assert note is not None and not note.taken and words in note.why, note
    return note


PIPES = {
    "scaler ridge": (make_pipeline(StandardScaler(), Ridge()), {"ridge__alpha": ALPHAS}),
    "scaler no mean": (make_pipeline(StandardScaler(with_mean=False), Ridge()), {"ridge__alpha": ALPHAS}),
    "scaler no std": (make_pipeline(StandardScaler(with_std=False), Ridge()),
                      {"ridge__alpha": ALPHAS, "standardscaler__with_mean": [True, False]}),
    "pca int": (make_pipeline(StandardScaler(), PCA(n_components=5), Ridge()), {"ridge__alpha": ALPHAS}),
    "pca grid": (make_pipeline(StandardScaler(), PCA(), Ridge()),
                 {"pca__n_components": [2, 4, 0.6, 0.95, None], "ridge__alpha": [0.1, 10.0]}),
    "pca whiten": (make_pipeline(StandardScaler(), PCA(n_components=4, whiten=True), Ridge()),
                   {"ridge__alpha": ALPHAS, "pca__svd_solver": ["auto", "full", "covariance_eigh"]}),
    "pca alone": (make_pipeline(PCA(n_components=6), Ridge()), {"ridge__alpha": ALPHAS}),
    "no intercept": (make_pipeline(StandardScaler(), Ridge(fit_intercept=False)),
                     {"ridge__alpha": ALPHAS, "ridge__solver": ["auto", "cholesky", "svd"]}),
    "pca no intercept": (make_pipeline(StandardScaler(with_mean=False), PCA(3), Ridge(fit_intercept=False)),
                         {"ridge__alpha": [0.0, 1.0]}),
    "linear": (make_pipeline(StandardScaler(), LinearRegression()), {"linearregression__fit_intercept": [True, False]}),
    "plain ridge": (Ridge(), {"alpha": ALPHAS, "fit_intercept": [True, False]}),
    "plain linear": (LinearRegression(), {"fit_intercept": [True, False]}),
}


@pytest.mark.parametrize("which", sorted(PIPES))
@pytest.mark.parametrize("scoring", [None, "r2", "neg_mean_squared_error", "neg_root_mean_squared_error",
                                     "explained_variance"])
def test_every_step_kind_and_scorer_equals_scikit_learn(executor, data, which, scoring):
    X, y = data
    est, grid = PIPES[which]
    ours, _ = _both(est, grid, X, y, cv=KFold(4), scoring=scoring)
    note = _taken(ours)
    assert "per-fold sums" in note.splits
    rep = ours.search_report_
    last = list(rep.naive)[-1]
    assert rep.fits[last] == rep.naive[last]   # every last step, from the moments
    assert "one-pass path" in repr(rep)


def test_two_dimensional_targets(executor, data):
    X, y = data
    Y = np.column_stack([y, X[:, 4] - 2 * X[:, 5] + np.random.default_rng(1).normal(size=len(y))])
    for est, grid in (PIPES["pca int"], PIPES["no intercept"], PIPES["linear"]):
        for scoring in (None, "neg_mean_squared_error", "neg_root_mean_squared_error", "explained_variance"):
            ours, _ = _both(est, grid, X, Y, cv=4, scoring=scoring)
            _taken(ours)
    ours, _ = _both(*PIPES["scaler ridge"], X, Y[:, :1], cv=3)   # a 2-D target of one column
    _taken(ours)


@pytest.mark.parametrize("cv", ["kfold shuffled", "shuffle split", "repeated", "groups", "leave one group out",
                                "time series", "list"])
def test_every_kind_of_splitter(executor, data, cv):
    X, y = data
    groups = np.arange(len(y)) % 6
    params = {}
    splitter = {"kfold shuffled": KFold(5, shuffle=True, random_state=0),
                "shuffle split": ShuffleSplit(4, test_size=0.3, random_state=0),
                "repeated": RepeatedKFold(n_splits=3, n_repeats=2, random_state=0),
                "groups": GroupKFold(3), "leave one group out": LeaveOneGroupOut(),
                "time series": TimeSeriesSplit(4),
                "list": [(np.arange(0, 150), np.arange(150, 240)), (np.arange(60, 240), np.arange(0, 60))]}[cv]
    if cv in ("groups", "leave one group out"):
        params["groups"] = groups
    ours, _ = _both(*PIPES["pca int"], X, y, fit_params=params, cv=splitter)
    note = _taken(ours)
    partition = cv in ("kfold shuffled", "groups", "leave one group out")
    assert ("per-fold sums" in note.splits) == partition, note.splits


@pytest.mark.parametrize("where", ["ridge", "scaler", "both", "plain"])
def test_sample_weight_enters_the_moments(executor, data, where):
    X, y = data
    w = np.random.default_rng(2).uniform(0.2, 3.0, size=len(y))
    if where == "plain":
        est, grid = PIPES["plain ridge"]
        params = {"sample_weight": w}   # to the fit and to the scorer
    else:
        est, grid = PIPES["pca int"] if where != "scaler" else PIPES["scaler ridge"]
        params = {"both": {"standardscaler__sample_weight": w, "ridge__sample_weight": w},
                  "ridge": {"ridge__sample_weight": w}, "scaler": {"standardscaler__sample_weight": w}}[where]
    for scoring in (None, "neg_mean_squared_error"):
        ours, _ = _both(est, grid, X, y, fit_params=params, cv=4, scoring=scoring)
        _taken(ours)


def test_a_constant_column_is_scaled_by_one(executor, data):
    X, y = data
    X = X.copy()
    X[:, 2] = 3.25
    ours, _ = _both(*PIPES["scaler ridge"], X, y, cv=4)
    _taken(ours)


def test_a_column_constant_in_one_training_set_only_declines(executor, data):
    X, y = data
    X = X.copy()
    X[60:, 2] = 1.5   # constant in fold 0's training rows (KFold(4)), not in all rows: scale 1 there
    ours, _ = _both(*PIPES["scaler ridge"], X, y, cv=KFold(4))
    _declined(ours, "nearly constant")


def test_one_column_and_no_column(executor, data):
    X, y = data
    ours, _ = _both(make_pipeline(StandardScaler(), PCA(), Ridge()), {"ridge__alpha": [0.1, 1.0]}, X[:, :1], y, cv=3)
    _taken(ours)
    with pytest.raises(ValueError, match="0 feature"), warnings.catch_warnings():   # scikit-learn's own error
        warnings.simplefilter("ignore")
        gn.GridSearchCV(Ridge(), {"alpha": [0.1, 1.0]}, cv=3, error_score="raise").fit(X[:, :0], y)


def test_pandas_rows_and_target(executor, data):
    pd = pytest.importorskip("pandas")
    X, y = data
    frame = pd.DataFrame(X, columns=[f"c{i}" for i in range(X.shape[1])])
    ours, theirs = _both(*PIPES["pca int"], frame, pd.Series(y), cv=4)
    _taken(ours)
    assert list(ours.best_estimator_.feature_names_in_) == list(theirs.best_estimator_.feature_names_in_)


def test_halving_searches_take_it_in_every_rung(executor, data):
    X, y = data
    est, _ = PIPES["pca int"]
    grid = {"ridge__alpha": list(np.logspace(-3, 3, 9))}
    ours, theirs = _both(est, grid, X, y, search=(gn.HalvingGridSearchCV, HalvingGridSearchCV), cv=4, factor=3,
                         random_state=0)
    assert ours.n_resources_ == theirs.n_resources_
    for rung in ours.search_report_.rungs:
        _taken(rung)


def test_randomized_searches_take_it(executor, data):
    from scipy.stats import loguniform

    X, y = data
    est, _ = PIPES["pca int"]
    dist = {"ridge__alpha": loguniform(1e-3, 1e3)}
    ours, _ = _both(est, dist, X, y, search=(gn.RandomizedSearchCV, RandomizedSearchCV), n_iter=6, cv=3,
                    random_state=0)
    _taken(ours)


# --- declines: today's path, scikit-learn's results ----------------------------------------------------------

def test_float32_rows_decline(executor, data):
    X, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = gn.GridSearchCV(*PIPES["pca int"], cv=4).fit(X.astype(np.float32), y)
        theirs = GridSearchCV(*PIPES["pca int"], cv=4).fit(X.astype(np.float32), y)
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"],
                               rtol=1e-5)
    _declined(ours, "float32")


def test_ill_conditioned_and_rank_deficient_rows_decline(executor, data):
    X, y = data
    rng = np.random.default_rng(3)
    near = np.column_stack([X, X[:, 0] + 1e-7 * rng.normal(size=len(y))])   # condition number ~1e14
    ours, _ = _both(*PIPES["plain linear"], near, y, cv=4)
    _declined(ours, "condition number")
    same = np.column_stack([X, X[:, 0]])                                    # exactly singular
    ours = gn.GridSearchCV(*PIPES["plain linear"], cv=4).fit(same, y)
    theirs = GridSearchCV(*PIPES["plain linear"], cv=4).fit(same, y)
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"], rtol=1e-6)
    note = ours.search_report_.one_pass
    assert not note.taken and ("singular" in note.why or "condition" in note.why), note


def test_nan_in_the_rows_gives_scikit_learns_error_before_any_moments(executor, data, monkeypatch):
    X, y = data
    X = X.copy()
    X[3, 1] = np.nan
    monkeypatch.setattr(onepass_moments, "moments", None)   # never reached
    with pytest.raises(ValueError) as ours, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gn.GridSearchCV(*PIPES["scaler ridge"], cv=3).fit(X, y)
    with pytest.raises(ValueError) as theirs, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        GridSearchCV(*PIPES["scaler ridge"], cv=3).fit(X, y)
    assert type(ours.value) is type(theirs.value)   # the refit on all rows: "Input X contains NaN."
    assert str(ours.value).splitlines()[0] == str(theirs.value).splitlines()[0]
    ours_inf = gn.GridSearchCV(Ridge(), {"alpha": [1.0]}, cv=3)
    X[3, 1] = np.inf
    with pytest.raises(ValueError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours_inf.fit(X, y)


def test_too_many_columns_decline(executor):
    rng = np.random.default_rng(4)
    X, y = rng.normal(size=(60, 30)), rng.normal(size=60)
    ours, _ = _both(Ridge(), {"alpha": [1.0, 10.0]}, X, y, cv=5)
    _declined(ours, "cost more than the rows")


@pytest.mark.parametrize("case", ["lasso", "mae scorer", "randomized pca", "mle"])
def test_steps_or_scorers_without_a_rule_decline(executor, data, case):
    X, y = data
    est, grid, kw = make_pipeline(StandardScaler(), Ridge()), {"ridge__alpha": [0.1, 1.0]}, {}
    if case == "lasso":
        est, grid = make_pipeline(StandardScaler(), Lasso()), {"lasso__alpha": [0.1, 1.0]}
    elif case == "mae scorer":
        kw = {"scoring": "neg_mean_absolute_error"}
    elif case == "randomized pca":
        est = make_pipeline(StandardScaler(), PCA(3, svd_solver="randomized", random_state=0), Ridge())
    else:
        est = make_pipeline(StandardScaler(), PCA("mle"), Ridge())
    ours, _ = _both(est, grid, X, y, cv=3, **kw)
    _declined(ours, {"lasso": "no statistics rule", "mae scorer": "scorer", "randomized pca": "randomized",
                     "mle": "n_components"}[case])


def test_a_step_that_takes_no_weights_fails_as_in_scikit_learn(executor, data):
    X, y = data
    w = np.ones(len(y))
    for search in (gn.GridSearchCV, GridSearchCV):
        with pytest.raises(ValueError, match="fits failed"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            search(*PIPES["pca int"], cv=3).fit(X, y, pca__sample_weight=w)


@pytest.mark.parametrize("off", ["enabled(False)", "gn.config(one_pass=False)"])
def test_turned_off_the_network_runs(data, off):
    X, y = data
    with enabled(False) if off == "enabled(False)" else gn.config(one_pass=False):
        ours, _ = _both(*PIPES["pca int"], X, y, cv=3)
    _declined(ours, "off (gn.config(one_pass=False)")
    assert ours.search_report_.ran is None or ours.search_report_.where["ridge"] != {"one-pass": 15}


def test_the_default_takes_the_path_from_20000_rows_on(executor):
    """one_pass="auto" (the default): the search's network below 20,000 rows (bit for bit scikit-learn's, and
    cheap there), the moments from 20,000 rows on; both equal scikit-learn's."""
    assert gn.get_config()["one_pass"] is True   # this module's fixture; the default is "auto":
    with gn.config(one_pass="auto"):
        rng = np.random.default_rng(3)
        for rows, taken in ((19_999, False), (20_000, True)):
            X = rng.normal(size=(rows, 5)) @ rng.normal(size=(5, 5)) + 2.0
            y = X @ np.arange(1.0, 6.0) + rng.normal(size=rows)
            ours, theirs = _both(*PIPES["pca int"], X, y, cv=3)
            note = ours.search_report_.one_pass
            assert note.taken is taken, note
            if not taken:
                assert "one_pass='auto' (the default) takes it from 20,000 rows on" in note.why, note
                assert np.array_equal(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"])
            np.testing.assert_allclose(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"],
                                       rtol=1e-9, atol=0)
            assert ours.best_params_ == theirs.best_params_


@pytest.mark.parametrize("bad", [1, "yes", None, 0.5])
def test_bad_one_pass_settings_are_refused(bad):
    with pytest.raises(TypeError, match=r"one_pass=.* is not a setting: expected True .* or 'auto' \(the default"):
        with gn.config(one_pass=bad):
            pass


# --- equality, checked -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["pca int", "pca whiten", "no intercept", "linear", "plain ridge"])
def test_the_rules_fitted_steps_equal_scikit_learns(which, data):
    """Coefficients, components (with svd_flip's signs), means and scales: to 1e-9 of scikit-learn's."""
    X, y = data
    est, grid = PIPES[which]
    train, test = np.arange(60, 240), np.arange(60)
    splits = [(train, test)]
    folds, _, _ = onepass_moments.folds(X, y[:, None], np, splits, {}, {None})
    plan = onepass_search._plan([est], {}, {}, len(y))[0][0]
    state = onepass.fit_chain(plan, folds[0], onepass_search._prefix_keys(plan))
    theirs = clone(est).fit(X[train], y[train])
    steps = theirs.steps if hasattr(theirs, "steps") else [("", theirs)]
    for (_, fitted), mine in zip(steps, state.fitted):
        for attr, value in mine.items():
            if value is not None and not attr.startswith("_"):   # "_...": what the refit's attributes need
                floor = 1.0 if attr == "mean_" else 0.0
                ref = np.ravel(getattr(fitted, attr))
                np.testing.assert_allclose(np.ravel(value), ref, rtol=0,
                                           atol=1e-9 * max(np.max(np.abs(ref)), floor), err_msg=attr)
    np.testing.assert_allclose(((X[test] - folds[0].x0) @ state.A + state.b)[:, 0], theirs.predict(X[test]),
                               rtol=1e-9)


def test_the_self_check_declines_a_rule_that_differs(executor, data, monkeypatch):
    X, y = data
    real = onepass.LinearRule.fit_many

    def off(ests, state, m, fold):
        W, c, err, fitted = real(ests, state, m, fold)
        for one in fitted:
            one["coef_"] = one["coef_"] * (1 + 1e-6)
        return W, c, err, fitted

    monkeypatch.setattr(onepass.LinearRule, "fit_many", staticmethod(off))
    monkeypatch.setattr(onepass_search, "_CHECKED", {})
    ours, _ = _both(*PIPES["scaler ridge"], X, y, cv=3)
    _declined(ours, "self-check")


@pytest.mark.parametrize("cv", ["kfold", "shuffled", "shuffle split"])
def test_on_the_fake_gpu_the_moments_are_formed_on_the_device(data, cv):
    X, y = data
    est, grid = PIPES["pca int"]
    splitter = {"kfold": KFold(4), "shuffled": KFold(4, shuffle=True, random_state=0),
                "shuffle split": ShuffleSplit(3, random_state=0)}[cv]
    w = np.random.default_rng(5).uniform(0.5, 2.0, size=len(y))
    theirs = GridSearchCV(est, grid, cv=splitter, return_train_score=True).fit(X, y, ridge__sample_weight=w)
    with fake_gpu(1) as cp:
        Xd, yd = cp.asarray(X), cp.asarray(y)
        ours = gn.GridSearchCV(est, grid, cv=splitter, return_train_score=True).fit(Xd, yd, ridge__sample_weight=w)
        note = _taken(ours)
    assert ("per-fold sums" in note.splits) == (cv != "shuffle split")
    for k in ("mean_test_score", "mean_train_score"):
        np.testing.assert_allclose(ours.cv_results_[k], theirs.cv_results_[k], rtol=1e-9, atol=1e-12)
    assert ours.best_params_ == theirs.best_params_


def test_device_cuda_with_host_rows_refits_as_the_network_path_would(data):
    X, y = data
    est, grid = PIPES["pca int"]
    theirs = GridSearchCV(est, grid, cv=3).fit(X, y)
    with fake_gpu(1):
        ours = gn.GridSearchCV(est, grid, cv=3, device="cuda").fit(X, y)
        _taken(ours)
        assert ours.search_report_.refit_route is not None   # the refit's route on the search's GPU
        np.testing.assert_allclose(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"],
                                   rtol=1e-9)


def test_report_names_the_path_of_every_step(data):
    X, y = data
    est = Pipeline([("scale", StandardScaler()), ("pca", PCA(4)), ("ridge", Ridge())])
    s = gn.GridSearchCV(est, {"ridge__alpha": ALPHAS}, cv=4).fit(X, y)
    note = _taken(s)
    assert set(note.steps) == {"scale", "pca", "ridge"}
    assert s.search_report_.fits == {"scale": 4, "pca": 4, "ridge": 20}
    assert note.checked in (0, 1)


# --- the refit from the moments ------------------------------------------------------------------------------

def _refit_equal(ours, X, y, **fit_params):
    """best_estimator_ built from the moments: every attribute scikit-learn's own fit of the same candidate on
    all rows leaves, with its types and shapes, the values to 1e-9, and its predictions."""
    note = _taken(ours)
    assert note.refit.startswith("from the moments of all rows"), note
    theirs = clone(ours.best_estimator_).fit(X, y, **fit_params)
    assert onepass_refit.differs(ours.best_estimator_, theirs) is None, onepass_refit.differs(ours.best_estimator_,
                                                                                             theirs)
    np.testing.assert_allclose(ours.best_estimator_.predict(X), theirs.predict(X), rtol=1e-9,
                               atol=1e-9 * np.max(np.abs(theirs.predict(X))))
    assert ours.refit_time_ >= 0
    if hasattr(theirs, "feature_names_in_"):
        assert list(ours.feature_names_in_) == list(theirs.feature_names_in_)
    return theirs


@pytest.mark.parametrize("which", sorted(PIPES))
def test_best_estimator_from_the_moments_equals_scikit_learns_refit(executor, data, which):
    X, y = data
    est, grid = PIPES[which]
    ours, _ = _both(est, grid, X, y, cv=KFold(4))
    _refit_equal(ours, X, y)


def test_refit_from_the_moments_with_every_pca_and_target_option(executor, data):
    X, y = data
    Y = np.column_stack([y, X[:, 4] - 2 * X[:, 5] + np.random.default_rng(1).normal(size=len(y))])
    pca = make_pipeline(StandardScaler(), PCA(), Ridge())
    for n_components in (3, np.int64(3), 0.8, None):
        for target in (y, Y, Y[:, :1]):
            ours = gn.GridSearchCV(pca, {"pca__n_components": [n_components], "pca__whiten": [True, False]},
                                   cv=3).fit(X, target)
            _refit_equal(ours, X, target)
    for est, grid in (PIPES["linear"], PIPES["no intercept"], PIPES["plain linear"]):
        ours = gn.GridSearchCV(est, grid, cv=3).fit(X, Y)
        _refit_equal(ours, X, Y)


@pytest.mark.parametrize("where", ["ridge", "scaler", "both", "plain", "linear"])
def test_refit_from_the_moments_with_weights(executor, data, where):
    X, y = data
    w = np.random.default_rng(2).uniform(0.2, 3.0, size=len(y))
    est, grid = PIPES["pca int"]
    params = {"both": {"standardscaler__sample_weight": w, "ridge__sample_weight": w},
              "ridge": {"ridge__sample_weight": w}, "scaler": {"standardscaler__sample_weight": w}}.get(where)
    if where == "plain":
        (est, grid), params = PIPES["plain ridge"], {"sample_weight": w}
    elif where == "linear":
        est, grid = PIPES["plain linear"]
        params = {"sample_weight": w}
    ours, _ = _both(est, grid, X, y, fit_params=params, cv=4)
    _refit_equal(ours, X, y, **params)


def test_refit_from_the_moments_keeps_feature_names(executor, data):
    pd = pytest.importorskip("pandas")
    X, y = data
    frame = pd.DataFrame(X, columns=[f"c{i}" for i in range(X.shape[1])])
    for est, grid in (PIPES["pca int"], PIPES["plain ridge"]):
        ours, theirs = _both(est, grid, frame, pd.Series(y), cv=4)
        _refit_equal(ours, frame, pd.Series(y))
        assert list(ours.best_estimator_.feature_names_in_) == list(theirs.best_estimator_.feature_names_in_)
    mixed = frame.set_axis(["a", 1, *frame.columns[2:]], axis=1)   # scikit-learn's error, from each fit
    with pytest.raises(TypeError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gn.GridSearchCV(*PIPES["pca int"], cv=3, error_score="raise").fit(mixed, y)


def test_a_declined_search_refits_with_scikit_learn(executor, data):
    X, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = gn.GridSearchCV(*PIPES["pca int"], cv=4).fit(X.astype(np.float32), y)
    _declined(ours, "float32")
    assert ours.search_report_.one_pass.refit == ""
    theirs = clone(ours.best_estimator_).fit(X.astype(np.float32), y)
    np.testing.assert_array_equal(ours.best_estimator_.predict(X.astype(np.float32)),
                                  theirs.predict(X.astype(np.float32)))   # scikit-learn's own fit: to the bit


def test_the_refit_declines_where_the_built_steps_differ_on_a_fold(executor, data, monkeypatch):
    X, y = data
    real = onepass_refit._linear

    def off(est, raw, flat):
        out = real(est, raw, flat)
        out["coef_"] = out["coef_"] * (1 + 1e-6)
        return out

    monkeypatch.setattr(onepass_refit, "_linear", off)
    monkeypatch.setattr(onepass_search, "_CHECKED", {})
    ours, _ = _both(*PIPES["scaler ridge"], X, y, cv=3)
    note = _taken(ours)   # the scores are the rules' (they agreed): only the refit is scikit-learn's
    assert note.refit.startswith("scikit-learn's own fit") and "Ridge.coef_ differs" in note.refit, note
    theirs = clone(ours.best_estimator_).fit(X, y)
    np.testing.assert_array_equal(ours.best_estimator_.predict(X), theirs.predict(X))


def test_the_refit_declines_where_the_whole_datas_system_is_not_promised(executor, data, monkeypatch):
    X, y = data
    real = onepass.LinearRule.fit

    def ill(est, state, m, fold):
        if m.rows == len(y):   # the refit's moments: all rows
            raise onepass.Decline("ridge (condition number 1e+15)")
        return real(est, state, m, fold)

    monkeypatch.setattr(onepass.LinearRule, "fit", staticmethod(ill))
    ours, _ = _both(*PIPES["scaler ridge"], X, y, cv=3)
    note = _taken(ours)
    assert note.refit == "scikit-learn's own fit (ridge (condition number 1e+15))", note
    assert "refit: scikit-learn's own fit" in str(note)
    theirs = clone(ours.best_estimator_).fit(X, y)
    np.testing.assert_array_equal(ours.best_estimator_.predict(X), theirs.predict(X))


def test_the_moments_are_dropped_after_the_fit(executor, data):
    import pickle

    X, y = data
    for refit in (True, False):
        ours = gn.GridSearchCV(*PIPES["pca int"], cv=3, refit=refit).fit(X, y)
        _taken(ours)
        assert "_gn_one_pass" not in ours.__dict__
        assert "_gn_one_pass" not in pickle.loads(pickle.dumps(ours)).__dict__


# --- halving: rungs from the chunks' moments -------------------------------------------------------------------

def test_chunked_moments_equal_each_groups_own(data):
    X, y = data
    Y = y[:, None]
    rng = np.random.default_rng(7)
    w = rng.uniform(0.5, 2.0, size=len(y))
    n = len(y)
    groups = [rng.choice(n, size, replace=False) for size in (2, 17, 100, 200, 235, n)]
    groups += [np.arange(10, 200), np.r_[np.arange(0, 120), rng.choice(np.arange(120, n), 30, replace=False)],
               np.array([3, 3, 4, 5])]   # a repeated row: summed as it is
    memo, _ = onepass_moments._memo(X, Y, np, X, Y)
    got = onepass_moments._chunked(X, Y, np, groups, {"w": w}, {None, "w"}, memo)
    direct = onepass_moments.moments(X, Y, np, groups, {"w": w}, {None, "w"}, memo)
    for g, a, b in zip(groups, got, direct):
        for k in (None, "w"):
            assert a[k].rows == b[k].rows == len(g)
            np.testing.assert_allclose(a[k].n, b[k].n, rtol=1e-13)
            np.testing.assert_allclose(a[k].s, b[k].s, rtol=0, atol=1e-11 * np.max(np.abs(b[k].G)))
            np.testing.assert_allclose(a[k].G, b[k].G, rtol=0, atol=1e-13 * np.max(np.abs(b[k].G)))
    assert len(memo.bounds) - 1 == onepass_moments.CHUNKS
    # nested subsamples (a halving search's rungs): the earlier groups' moments plus those of the rows added
    order = rng.permutation(n)
    small, large = [order[:40], order[100:130]], [order[:90], order[100:190]]
    onepass_moments._chunked(X, Y, np, small, {"w": w}, {None, "w"}, memo)
    got = onepass_moments._chunked(X, Y, np, large, {"w": w}, {None, "w"}, memo)
    assert memo.read == 50 + 60   # the rows the larger groups add
    for a, b in zip(got, onepass_moments.moments(X, Y, np, large, {"w": w}, {None, "w"}, memo)):
        for k in (None, "w"):
            np.testing.assert_allclose(a[k].G, b[k].G, rtol=0, atol=1e-13 * np.max(np.abs(b[k].G)))


@pytest.mark.parametrize("case", ["kfold", "shuffled", "shuffle split", "weights", "linear 2-D", "random"])
def test_halving_equals_scikit_learn_with_its_refit_from_the_moments(executor, data, case):
    from sklearn.model_selection import HalvingRandomSearchCV

    X, y = data
    X, y = np.vstack([X, X * 1.1 + 0.5]), np.r_[y, y * 0.9 + 1.0]
    est, _ = PIPES["pca int"]
    grid = {"ridge__alpha": list(np.logspace(-3, 3, 9))}
    cv = {"shuffled": KFold(4, shuffle=True, random_state=1), "shuffle split": ShuffleSplit(3, random_state=2)}.get(
        case, KFold(4))
    target, params, search, kw = y, {}, (gn.HalvingGridSearchCV, HalvingGridSearchCV), {}
    if case == "weights":
        params = {"ridge__sample_weight": np.random.default_rng(3).uniform(0.5, 2.0, size=len(y))}
    elif case == "linear 2-D":
        est, grid = PIPES["linear"]
        target = np.column_stack([y, X[:, 4] + np.random.default_rng(4).normal(size=len(y))])
    elif case == "random":
        search, kw = (gn.HalvingRandomSearchCV, HalvingRandomSearchCV), {"min_resources": 80}
    ours, theirs = _both(est, grid, X, target, fit_params=params, search=search, cv=cv, factor=3, random_state=0,
                         **kw)
    assert ours.n_resources_ == theirs.n_resources_ and ours.n_candidates_ == theirs.n_candidates_
    assert ours.best_params_ == theirs.best_params_
    np.testing.assert_allclose(ours.best_score_, theirs.best_score_, rtol=1e-9)
    for rung in ours.search_report_.rungs:
        _taken(rung)
    if ours.n_resources_[0] < len(y):   # a rung on a subsample of the rows: its moments from the chunks'
        assert "chunks" in ours.search_report_.rungs[0].one_pass.splits
    _refit_equal(ours, X, target, **params)


def test_on_the_fake_gpu_the_refit_and_the_halving_rungs_come_from_the_moments(data):
    X, y = data
    est, grid = PIPES["pca int"]
    with fake_gpu(1) as cp:
        Xd, yd = cp.asarray(X), cp.asarray(y)
        ours = gn.GridSearchCV(est, grid, cv=3).fit(Xd, yd)
        half = gn.HalvingGridSearchCV(est, {"ridge__alpha": list(np.logspace(-3, 3, 9))}, cv=4, factor=3,
                                      random_state=0).fit(Xd, yd)
    theirs = HalvingGridSearchCV(est, {"ridge__alpha": list(np.logspace(-3, 3, 9))}, cv=4, factor=3,
                                 random_state=0).fit(X, y)
    np.testing.assert_allclose(half.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"],
                               rtol=1e-9, atol=1e-12)
    assert half.best_params_ == theirs.best_params_
    for search in (ours, half):
        note = _taken(search)
        if search.search_report_.last.refit_route[0] == "array_api":   # scikit-learn's array-API twins refit
            assert "GPU" in note.refit, note
        else:   # on the host, from the moments formed on the device
            _refit_equal(search, X, y)

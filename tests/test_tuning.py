"""Hyperparameter search as one network: equality with scikit-learn, sharing, errors, every executor."""

from __future__ import annotations

import collections
import pickle
import warnings
import weakref

import numpy as np
import pytest
import sklearn.model_selection as skms
from scipy.stats import loguniform
from sklearn.base import BaseEstimator, RegressorMixin, TransformerMixin
from sklearn.decomposition import PCA
from sklearn.exceptions import FitFailedWarning
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge
from sklearn.model_selection import KFold, StratifiedKFold
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.tree import DecisionTreeRegressor
from sklearn.utils.estimator_checks import parametrize_with_checks

import gpunets as gn

FITS: collections.Counter = collections.Counter()


class CountingScaler(TransformerMixin, BaseEstimator):
    """StandardScaler that counts its fits (by tag)."""

    def __init__(self, tag="scale", with_mean=True):
        self.tag, self.with_mean = tag, with_mean

    def fit(self, X, y=None):
        FITS[self.tag] += 1
        self.scaler_ = StandardScaler(with_mean=self.with_mean).fit(X)
        return self

    def transform(self, X):
        return self.scaler_.transform(X)


class FailingRidge(RegressorMixin, BaseEstimator):
    """Ridge that raises for alpha < 0 (a failing candidate)."""

    def __init__(self, alpha=1.0):
        self.alpha = alpha

    def fit(self, X, y):
        if self.alpha < 0:
            raise ValueError("negative alpha")
        self.model_ = Ridge(alpha=self.alpha).fit(X, y)
        return self

    def predict(self, X):
        return self.model_.predict(X)


class Averaged(gn.CompositeRegressor):
    def __init__(self, first=None, second=None, executor="serial"):
        self.first, self.second, self.executor = first, second, executor

    def network(self, X, y):
        a = gn.machine(self.first if self.first is not None else Ridge(), X, y)
        b = gn.machine(self.second if self.second is not None else LinearRegression(), X, y)
        return gn.mean(a.predict(X), b.predict(X))


@pytest.fixture(scope="module")
def reg_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(90, 6))
    y = X @ rng.normal(size=6) + rng.normal(size=90)
    return X, y


@pytest.fixture(scope="module")
def clf_data():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(90, 5))
    y = (X[:, 0] + 0.5 * rng.normal(size=90) > 0).astype(int)
    return X, y


def assert_same_search(ours, theirs, train=False):
    r, s = ours.cv_results_, theirs.cv_results_
    assert sorted(r) == sorted(s)
    assert r["params"] == s["params"]
    for k in s:
        if "test_" in k or "train_" in k:
            if k.startswith("rank"):
                np.testing.assert_array_equal(r[k], s[k])
                assert r[k].dtype == s[k].dtype
            else:
                np.testing.assert_allclose(r[k], s[k], rtol=0, atol=1e-12, err_msg=k)
        elif k.startswith("param_"):
            assert list(r[k]) == list(s[k])
    if getattr(theirs, "refit", True) is not False:
        assert ours.best_params_ == theirs.best_params_
        assert ours.best_index_ == theirs.best_index_
        np.testing.assert_allclose(ours.best_score_, theirs.best_score_, rtol=0, atol=1e-12)
    assert ours.n_splits_ == theirs.n_splits_
    assert ours.multimetric_ == theirs.multimetric_


CASES = {
    "pipeline-regressor": lambda: (make_pipeline(StandardScaler(), PCA(n_components=3), Ridge()),
                                   {"pca__n_components": [2, 4], "ridge__alpha": [0.1, 1.0, 10.0]}, "reg", None),
    "plain-classifier": lambda: (LogisticRegression(), {"C": [0.1, 1.0, 10.0]}, "clf", "accuracy"),
    "pipeline-classifier": lambda: (make_pipeline(StandardScaler(), LogisticRegression()),
                                    {"logisticregression__C": [0.01, 1.0]}, "clf", ["accuracy", "roc_auc"]),
    "composite": lambda: (Averaged(Ridge(), LinearRegression()), {"first__alpha": [0.1, 5.0], "second": [LinearRegression(), Ridge(2.0)]},
                          "reg", "neg_mean_squared_error"),
    "stack": lambda: (gn.StackingRegressor([("ridge", Ridge()), ("tree", DecisionTreeRegressor(max_depth=2,
                                                                                               random_state=0))],
                                           final_estimator=LinearRegression(), cv=3, executor="serial"),
                      {"ridge__alpha": [0.5, 5.0]}, "reg", None),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("train", [False, True])
def test_equals_sklearn(case, train, reg_data, clf_data):
    est, grid, kind, scoring = CASES[case]()
    X, y = reg_data if kind == "reg" else clf_data
    cv = KFold(4, shuffle=True, random_state=0) if kind == "reg" else StratifiedKFold(3)
    refit = "accuracy" if isinstance(scoring, list) else True
    kw = dict(scoring=scoring, cv=cv, return_train_score=train, refit=refit)
    theirs = skms.GridSearchCV(est, grid, **kw).fit(X, y)
    ours = gn.GridSearchCV(est, grid, executor="serial", **kw).fit(X, y)
    assert_same_search(ours, theirs)
    np.testing.assert_allclose(ours.predict(X[:5]), theirs.predict(X[:5]), rtol=0, atol=1e-12)
    np.testing.assert_allclose(ours.score(X, y), theirs.score(X, y), rtol=0, atol=1e-12)
    assert ours.refit_time_ >= 0


def test_same_on_every_executor(executor, reg_data):
    X, y = reg_data
    est = make_pipeline(StandardScaler(), PCA(n_components=3), Ridge())
    grid = {"pca__n_components": [2, 3], "ridge__alpha": [0.1, 1.0, 10.0]}
    serial = gn.GridSearchCV(est, grid, cv=3, executor="serial", return_train_score=True).fit(X, y)
    ours = gn.GridSearchCV(est, grid, cv=3, executor=executor, return_train_score=True).fit(X, y)
    for k, v in serial.cv_results_.items():
        if "score" in k and "time" not in k:
            np.testing.assert_array_equal(ours.cv_results_[k], v)
    assert ours.search_report_.fits == serial.search_report_.fits


def test_shared_steps_fit_once_per_fold(reg_data):
    X, y = reg_data
    FITS.clear()
    est = Pipeline([("scale", CountingScaler()), ("ridge", Ridge())])
    s = gn.GridSearchCV(est, {"ridge__alpha": [0.1, 1.0, 10.0, 100.0]}, cv=5, refit=False).fit(X, y)
    assert FITS["scale"] == 5
    assert s.search_report_.fits == {"scale": 5, "ridge": 20}
    assert s.search_report_.naive == {"scale": 20, "ridge": 20}
    assert s.search_report_.total == (25, 40)
    assert "25 fits instead of 40" in repr(s.search_report_)


def test_partial_sharing_two_stage_grid(reg_data):
    X, y = reg_data
    FITS.clear()
    est = Pipeline([("scale", CountingScaler()), ("pca", PCA()), ("ridge", Ridge())])
    grid = {"scale__with_mean": [True, False], "pca__n_components": [2, 3, 4], "ridge__alpha": [1.0, 2.0]}
    s = gn.GridSearchCV(est, grid, cv=3).fit(X, y)
    assert FITS["scale"] == 2 * 3 + 1  # one per value and fold, plus the refit
    assert s.search_report_.fits == {"scale": 6, "pca": 18, "ridge": 36}
    theirs = skms.GridSearchCV(est, grid, cv=3).fit(X, y)
    assert_same_search(s, theirs)


def test_randomized_same_candidates_as_sklearn(reg_data):
    X, y = reg_data
    est = make_pipeline(StandardScaler(), Ridge())
    dist = {"ridge__alpha": loguniform(1e-3, 1e3), "ridge__fit_intercept": [True, False]}
    theirs = skms.RandomizedSearchCV(est, dist, n_iter=6, cv=3, random_state=0).fit(X, y)
    ours = gn.RandomizedSearchCV(est, dist, n_iter=6, cv=3, random_state=0).fit(X, y)
    assert_same_search(ours, theirs)


def test_failing_candidate_error_score_nan(reg_data):
    X, y = reg_data
    grid = {"alpha": [1.0, -1.0, 3.0]}
    with pytest.warns(FitFailedWarning, match="negative alpha"):
        theirs = skms.GridSearchCV(FailingRidge(), grid, cv=3, return_train_score=True).fit(X, y)
    with pytest.warns(FitFailedWarning, match="negative alpha"):
        ours = gn.GridSearchCV(FailingRidge(), grid, cv=3, return_train_score=True).fit(X, y)
    assert_same_search(ours, theirs)
    assert np.isnan(ours.cv_results_["mean_test_score"][1])
    assert ours.search_report_.errors == {1: ({"alpha": -1.0}, "ValueError: negative alpha")}
    assert "candidate 1 {'alpha': -1.0} failed: ValueError: negative alpha" in repr(ours.search_report_)
    assert ours.best_params_ in ({"alpha": 1.0}, {"alpha": 3.0})


def test_failing_candidate_error_score_raise(reg_data):
    X, y = reg_data
    search = gn.GridSearchCV(FailingRidge(), {"alpha": [1.0, -1.0]}, cv=3, error_score="raise")
    with pytest.raises(ValueError, match="negative alpha"):
        search.fit(X, y)


def test_failing_pipeline_step_only_fails_its_candidates(reg_data):
    X, y = reg_data
    est = make_pipeline(StandardScaler(), FailingRidge())
    with pytest.warns(FitFailedWarning):
        s = gn.GridSearchCV(est, {"failingridge__alpha": [-1.0, 1.0]}, cv=2, error_score=-5.0).fit(X, y)
    assert s.cv_results_["mean_test_score"][0] == -5.0
    assert np.isfinite(s.cv_results_["mean_test_score"][1])


def test_unknown_parameter_lists_valid_ones(reg_data):
    X, y = reg_data
    FITS.clear()
    est = Pipeline([("scale", CountingScaler()), ("ridge", Ridge())])
    with pytest.raises(ValueError, match=r"Invalid parameter 'alhpa' for estimator Ridge\(\).*Valid parameters"):
        gn.GridSearchCV(est, {"ridge__alhpa": [1.0]}).fit(X, y)
    assert FITS["scale"] == 0


class _NoSplits:
    """A splitter that says it has 3 splits and yields none."""

    def get_n_splits(self, X=None, y=None, groups=None):
        return 3

    def split(self, X, y=None, groups=None):
        return iter(())


@pytest.mark.parametrize("cv", [[], _NoSplits()])
def test_an_empty_cv_iterator_is_refused_as_scikit_learn_refuses_it(cv, reg_data):
    from sklearn.model_selection import GridSearchCV

    X, y = reg_data
    with pytest.raises(ValueError) as theirs:
        GridSearchCV(Ridge(), {"alpha": [1.0]}, cv=cv).fit(X, y)
    with pytest.raises(type(theirs.value)) as ours:
        gn.GridSearchCV(Ridge(), {"alpha": [1.0]}, cv=cv).fit(X, y)
    assert str(ours.value).startswith(str(theirs.value))


@pytest.mark.parametrize("make, match", [
    (lambda: gn.GridSearchCV(Ridge(), []), "grid is empty"),
    (lambda: gn.GridSearchCV(Ridge(), {"alpha": []}), "non-empty sequence"),
    (lambda: gn.RandomizedSearchCV(Ridge(), {"alpha": 3}), "not iterable or a distribution"),
    (lambda: gn.RandomizedSearchCV(Ridge(), {"alpha": [1.0]}, n_iter=0), "n_iter"),
    (lambda: gn.GridSearchCV(Ridge(), {"alpha": [1.0]}, scoring="accuracyy"), "scoring"),
    (lambda: gn.GridSearchCV(Ridge(), {"alpha": [1.0]}, executor="bogus"), "not an executor"),
    # a splitter that yields no split: scikit-learn's message (issue 23 item 16), not an IndexError
    (lambda: gn.GridSearchCV(Ridge(), {"alpha": [1.0]}, cv=[]), "No fits were performed. Was the CV iterator empty"),
    (lambda: gn.GridSearchCV(Ridge(), {"alpha": [1.0]}, cv=_NoSplits()), "inconsistent results. Expected 3"),
])
def test_bad_input_before_any_fit(make, match, reg_data):
    """Refused as scikit-learn refuses, with the same exception class (checked against GridSearchCV where
    scikit-learn has the same refusal)."""
    X, y = reg_data
    with pytest.raises((ValueError, TypeError), match=match):
        make().fit(X, y)


def test_delegation_and_pickle(clf_data):
    X, y = clf_data
    s = gn.GridSearchCV(LogisticRegression(), {"C": [0.1, 1.0]}, cv=3).fit(X, y)
    assert s.predict_proba(X[:3]).shape == (3, 2)
    assert s.decision_function(X[:3]).shape == (3,)
    assert not hasattr(s, "transform")
    assert list(s.classes_) == [0, 1]
    s2 = pickle.loads(pickle.dumps(s))
    np.testing.assert_array_equal(s2.predict(X), s.predict(X))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nofit = gn.GridSearchCV(LogisticRegression(), {"C": [0.1]}, refit=False).fit(X, y)
    assert not hasattr(nofit, "predict")


# Every check passes (issue 35 item 15: no expected failure that passes); scikit-learn's own searches fail
# check_supervised_y_2d, ours take the estimator's multi_output tag.
@parametrize_with_checks([
    gn.GridSearchCV(Ridge(), {"alpha": [0.1, 1.0]}, cv=2, error_score="raise", executor="serial"),
    gn.GridSearchCV(Pipeline([("pca", PCA()), ("lr", LogisticRegression())]), {"lr__C": [0.1, 1.0]}, cv=2,
                    error_score="raise", executor="serial"),
    gn.RandomizedSearchCV(Pipeline([("pca", PCA()), ("ridge", Ridge())]), {"ridge__alpha": [0.1, 1.0]},
                          n_iter=2, cv=2, error_score="raise", executor="serial", random_state=0),
])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def test_composite_machines_shared_across_candidates(executor, reg_data):
    X, y = reg_data
    est = Averaged(Ridge(), LinearRegression())
    grid = {"first__alpha": [0.1, 1.0, 10.0]}
    s = gn.GridSearchCV(est, grid, cv=3, executor=executor, return_train_score=True).fit(X, y)
    assert s.search_report_.fits == {"Ridge": 9, "LinearRegression": 3}
    assert s.search_report_.naive == {"Ridge": 9, "LinearRegression": 9}
    serial = gn.GridSearchCV(est, grid, cv=3, executor="serial", return_train_score=True).fit(X, y)
    for k in ("mean_test_score", "split0_test_score", "mean_train_score"):
        np.testing.assert_array_equal(s.cv_results_[k], serial.cv_results_[k])


def test_stack_shares_untouched_base_models(reg_data):
    X, y = reg_data
    est = gn.StackingRegressor([("ridge", Ridge()), ("tree", DecisionTreeRegressor(max_depth=2, random_state=0))],
                               final_estimator=LinearRegression(), cv=3, executor="serial")
    s = gn.GridSearchCV(est, {"ridge__alpha": [0.5, 5.0]}, cv=2).fit(X, y)
    fits, naive = s.search_report_.fits, s.search_report_.naive
    assert fits["tree"] * 2 == naive["tree"]        # the tree does not change: fitted once per fold
    assert fits["ridge"] == naive["ridge"]
    assert s.search_report_.total[0] < s.search_report_.total[1]


class TrackedScaler(CountingScaler):
    """A scaler whose fitted copies are tracked by weak reference."""

    ALIVE: weakref.WeakSet | None = None

    def fit(self, X, y=None):
        TrackedScaler.ALIVE.add(self)
        return super().fit(X, y)


def test_fitted_copies_are_released(reg_data):
    import gc

    X, y = reg_data
    TrackedScaler.ALIVE = weakref.WeakSet()
    est = Pipeline([("scale", TrackedScaler()), ("ridge", Ridge())])
    s = gn.GridSearchCV(est, {"scale__with_mean": [True, False], "ridge__alpha": [1.0, 2.0]}, cv=3).fit(X, y)
    gc.collect()
    assert s.search_report_.fits["scale"] == 6
    assert list(TrackedScaler.ALIVE) == [s.best_estimator_.named_steps["scale"]]  # only the refit's


def test_failing_composite_candidate(reg_data):
    X, y = reg_data
    est = Averaged(FailingRidge(), LinearRegression())
    grid = {"first__alpha": [1.0, -1.0]}
    with pytest.warns(FitFailedWarning, match="negative alpha"):
        theirs = skms.GridSearchCV(est, grid, cv=3).fit(X, y)
    with pytest.warns(FitFailedWarning, match="negative alpha"):
        ours = gn.GridSearchCV(est, grid, cv=3).fit(X, y)
    assert_same_search(ours, theirs)
    assert list(ours.search_report_.errors) == [1]
    with pytest.raises(ValueError, match="negative alpha"):
        gn.GridSearchCV(est, grid, cv=3, error_score="raise").fit(X, y)


def test_gpu_mode_of_the_benchmark_on_the_fake_gpu(tmp_path):
    """benchmarks/bench_tuning.py --gpu: a search on CuPy data, device="cuda", streams and serial equal to the CPU."""
    import json
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    env = {**os.environ, "GPUNETS_FAKE_GPU": "1", "SCIPY_ARRAY_API": "1",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    out = tmp_path / "tuning_gpu.json"
    proc = subprocess.run([sys.executable, "-W", "ignore", "benchmarks/bench_tuning.py", "--gpu", "--quick",
                           "--rows", "600", "--out", str(out)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote {out}" in proc.stdout, proc.stdout[-2000:]   # the shared runner's last line
    res = json.loads(out.read_text())
    assert res["fake_gpu"] and "error" not in res, res
    assert res["scores_equal_cpu"]["met"], res
    for ex in ("serial", "streams"):
        assert res[ex]["same_best_params"] and res[ex]["fits"] == {"scale": 5, "pca": 5, "ridge": 50}
        assert res[ex]["refit_route"].startswith("('array_api'"), res[ex]
    halving = res["halving"]   # the halving search on the GPU too: its rungs and scores as on the CPU
    assert halving["scores_equal_cpu"]["met"] and len(halving["candidates"]) >= 2, halving
    for ex in ("serial", "streams"):
        assert halving[ex]["same_best_params"], halving
        assert len(halving[ex]["fits_per_rung"]) == len(halving["candidates"]), halving


class WeightedScaler(CountingScaler):
    """CountingScaler whose fit takes (and uses) sample_weight."""

    def fit(self, X, y=None, sample_weight=None):
        FITS[self.tag] += 1
        self.scaler_ = StandardScaler(with_mean=self.with_mean).fit(X, sample_weight=sample_weight)
        return self


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("case", ["pipeline-last-step", "pipeline-two-steps", "plain", "plain-multimetric"])
def test_fit_params_equal_sklearn_and_keep_sharing(case, train, reg_data):
    """sample_weight goes to the steps that take it (sliced per fold) and, for a plain estimator, to the scorer."""
    X, y = reg_data
    w = np.random.default_rng(1).uniform(0.1, 3.0, size=len(y))
    scoring = None
    if case.startswith("pipeline"):
        est = Pipeline([("scale", CountingScaler()), ("pca", PCA(n_components=3)), ("ridge", Ridge())])
        grid = {"ridge__alpha": [0.1, 1.0, 10.0]}
        params = {"ridge__sample_weight": w}
        if case == "pipeline-two-steps":
            est = Pipeline([("scale", WeightedScaler()), ("ridge", Ridge())])
            params = {"scale__sample_weight": w, "ridge__sample_weight": w}
    else:
        est, grid, params = Ridge(), {"alpha": [0.1, 1.0, 10.0]}, {"sample_weight": w}
        scoring = ["r2", "neg_mean_squared_error"] if case == "plain-multimetric" else None
    kw = {"cv": KFold(4, shuffle=True, random_state=0), "return_train_score": train, "scoring": scoring,
          "refit": "r2" if scoring else True}
    theirs = skms.GridSearchCV(est, grid, **kw).fit(X, y, **params)
    FITS.clear()
    ours = gn.GridSearchCV(est, grid, executor="serial", **kw).fit(X, y, **params)
    assert_same_search(ours, theirs)
    np.testing.assert_allclose(ours.predict(X[:5]), theirs.predict(X[:5]), rtol=0, atol=1e-12)
    if case.startswith("pipeline"):
        assert FITS["scale"] == 4 + 1      # the scaler (with or without fit params) is still shared: one per fold
        assert ours.search_report_.fits["ridge"] == 12


CLOCK = [0.0]


class ClockedRidge(RegressorMixin, BaseEstimator):
    """Ridge whose fit advances the test's clock by ``cost`` seconds (a fit time known exactly)."""

    def __init__(self, alpha=1.0, cost=1.0):
        self.alpha, self.cost = alpha, cost

    def fit(self, X, y):
        CLOCK[0] += self.cost
        self.model_ = Ridge(alpha=self.alpha).fit(X, y)
        return self

    def predict(self, X):
        return self.model_.predict(X)


class ClockedScaler(CountingScaler):
    def fit(self, X, y=None):
        CLOCK[0] += 1.0
        return super().fit(X, y)


@pytest.mark.parametrize("shape", ["composite", "pipeline"])
def test_fit_time_is_shared_out_among_candidates(shape, reg_data, monkeypatch):
    """mean_fit_time: each fit a candidate needed, a shared one divided among the candidates sharing it."""
    import types

    from gpunets.tuning import tasks

    monkeypatch.setattr(tasks, "time", types.SimpleNamespace(perf_counter=lambda: CLOCK[0]))
    X, y = reg_data
    if shape == "composite":   # first shared by the 4 candidates of a fold (cost 1), second their own (cost 2)
        est, grid = Averaged(ClockedRidge(cost=1.0), ClockedRidge(cost=2.0)), {"second__alpha": [0.1, 1, 10, 100]}
    else:                      # the scaler shared (cost 1), the final step each candidate's own (cost 2)
        est = Pipeline([("scale", ClockedScaler()), ("ridge", ClockedRidge(cost=2.0))])
        grid = {"ridge__alpha": [0.1, 1, 10, 100]}
    s = gn.GridSearchCV(est, grid, cv=3, executor="serial", refit=False).fit(X, y)
    np.testing.assert_allclose(s.cv_results_["mean_fit_time"], 1.0 / 4 + 2.0)
    np.testing.assert_allclose(s.cv_results_["std_fit_time"], 0.0, atol=1e-12)


# --- issue 23 items 6 and 16, issue 24 item 3 ------------------------------------------------------------------

class NoSplits:
    """A splitter that yields nothing."""

    def get_n_splits(self, X=None, y=None, groups=None):
        return 0

    def split(self, X, y=None, groups=None):
        return iter(())


def test_empty_cv_iterator_says_so_like_sklearn(executor, reg_data):
    X, y = reg_data
    with pytest.raises(ValueError, match="iterator was empty|Was the CV iterator empty") as theirs:
        skms.GridSearchCV(Ridge(), {"alpha": [1.0]}, cv=NoSplits()).fit(X, y)
    FITS.clear()
    est = make_pipeline(CountingScaler(), Ridge())
    with pytest.raises(ValueError, match="Was the CV iterator empty") as ours:
        gn.GridSearchCV(est, {"ridge__alpha": [1.0]}, cv=NoSplits(), executor=executor).fit(X, y)
    assert str(theirs.value) in str(ours.value)
    assert not FITS    # refused before any fit


def _recorded(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn()
    return out, w


def _categories():
    X = np.array([["a"]] * 10 + [["b"]] * 10 + [["c"]] * 10, dtype=object)
    return X, np.arange(30.0)


@pytest.mark.parametrize("scoring", [None, ["r2", "neg_mean_absolute_error"]])
def test_unseen_test_category_is_a_score_failure_like_sklearn(executor, scoring):
    """A shared step that cannot transform a fold's test rows: NaN scores and "Scoring failed", not a fit failure."""
    from sklearn.preprocessing import OneHotEncoder

    X, y = _categories()
    est = make_pipeline(OneHotEncoder(handle_unknown="error"), Ridge())
    grid = {"ridge__alpha": [0.1, 1.0]}
    kw = {"cv": KFold(3), "return_train_score": True, "scoring": scoring, "refit": "r2" if scoring else True}
    theirs, tw = _recorded(lambda: skms.GridSearchCV(est, grid, **kw).fit(X, y))
    ours, ow = _recorded(lambda: gn.GridSearchCV(est, grid, executor=executor, **kw).fit(X, y))
    for k, v in theirs.cv_results_.items():
        if "score" in k and "time" not in k:
            np.testing.assert_array_equal(ours.cv_results_[k], v, err_msg=k)
    def kinds(w):
        return collections.Counter((x.category, str(x.message).split(".")[0]) for x in w)
    assert kinds(ow) == kinds(tw)
    assert not any(issubclass(x.category, FitFailedWarning) for x in ow)
    assert kinds(ow)[(UserWarning, "Scoring failed")] == 2 * 3 * (2 if scoring else 1)
    assert not ours.search_report_.errors
    with pytest.raises(ValueError, match="unknown categor"):
        gn.GridSearchCV(est, grid, executor=executor, cv=KFold(3), error_score="raise").fit(X, y)


class EmptyTestFold:
    """Two folds, the second with no test rows."""

    def get_n_splits(self, X=None, y=None, groups=None):
        return 2

    def split(self, X, y=None, groups=None):
        n = len(X)
        yield np.arange(n // 2), np.arange(n // 2, n)
        yield np.arange(n), np.arange(0)


def test_empty_test_fold_is_a_score_failure_like_sklearn(executor, reg_data):
    X, y = reg_data
    est = make_pipeline(StandardScaler(), Ridge())
    grid = {"ridge__alpha": [0.1, 1.0]}
    theirs, tw = _recorded(lambda: skms.GridSearchCV(est, grid, cv=EmptyTestFold()).fit(X, y))
    ours, ow = _recorded(lambda: gn.GridSearchCV(est, grid, cv=EmptyTestFold(), executor=executor).fit(X, y))
    for k, v in theirs.cv_results_.items():
        if "score" in k and "time" not in k:
            np.testing.assert_array_equal(ours.cv_results_[k], v, err_msg=k)
    assert ([str(x.message).split(".")[0] for x in ow if x.category is UserWarning]
            == [str(x.message).split(".")[0] for x in tw if x.category is UserWarning])
    assert not any(issubclass(x.category, FitFailedWarning) for x in ow)


def test_scorer_returning_a_non_number_stops_the_search_like_sklearn(executor, reg_data):
    X, y = reg_data

    def bad(est, X, y):
        return "high"

    with pytest.raises(ValueError, match="scoring must return a number") as theirs:
        skms.GridSearchCV(Ridge(), {"alpha": [1.0]}, cv=3, scoring=bad).fit(X, y)
    with pytest.raises(ValueError, match="scoring must return a number") as ours:
        gn.GridSearchCV(Ridge(), {"alpha": [1.0]}, cv=3, scoring=bad, executor=executor).fit(X, y)
    assert str(ours.value).split(" at 0x")[0] == str(theirs.value).split(" at 0x")[0]   # a dask copy: other address


@pytest.mark.parametrize("device", ["cpu", "auto"])
@pytest.mark.parametrize("shape", ["plain", "pipeline"])
def test_cpu_search_with_fit_params_stays_on_the_host(executor, device, shape, reg_data):
    """On a machine with a GPU (the fake-GPU lane), a search of NumPy data keeps its own nodes (rows, fit and score
    parameters) and every fold on the host: scikit-learn gets NumPy, scores equal scikit-learn's."""
    X, y = reg_data
    w = np.random.default_rng(1).uniform(0.1, 3.0, size=len(y))
    if shape == "plain":
        est, grid, params = Ridge(), {"alpha": [0.1, 1.0]}, {"sample_weight": w}
    else:
        est, grid, params = (make_pipeline(StandardScaler(), Ridge()), {"ridge__alpha": [0.1, 1.0]},
                             {"ridge__sample_weight": w})
    theirs = skms.GridSearchCV(est, grid, cv=3).fit(X, y, **params)
    ours = gn.GridSearchCV(est, grid, cv=3, executor=executor, device=device).fit(X, y, **params)
    assert_same_search(ours, theirs)
    trace = gn.last_trace()
    if trace is not None and trace.records:
        assert {r.device for r in trace.records} == {"cpu"}


# --- issue 23 item 2: frozen components of a searched composite -------------------------------------------------

class Encoded(gn.CompositeRegressor):
    def __init__(self, encoder=None, model=None, freeze=(), executor="serial"):
        self.encoder, self.model, self.freeze, self.executor = encoder, model, freeze, executor

    def network(self, X, y):
        W = gn.machine(self.encoder if self.encoder is not None else CountingScaler("frozen"), X).transform(X)
        return gn.machine(self.model if self.model is not None else Ridge(), W, y).predict(W)


@pytest.mark.parametrize("how", ["freeze=", "machines_.freeze()"])
def test_search_keeps_frozen_components_like_sklearn(executor, how, reg_data):
    """The encoder fitted on other rows and frozen: every fold and the refit keep it (scikit-learn's clone does)."""
    X, y = reg_data
    X0 = X[:30] * 3.0 + 1.0   # other rows: a frozen encoder that differs from a per-fold refit
    if how == "freeze=":
        comp = Encoded(CountingScaler("frozen"), Ridge(), freeze=("encoder",)).fit(X0, y[:30])
    else:
        comp = Encoded(CountingScaler("frozen"), Ridge()).fit(X0, y[:30])
        comp.machines_["encoder"].freeze()
    grid = {"model__alpha": [0.1, 10.0]}
    theirs = skms.GridSearchCV(comp, grid, cv=3, return_train_score=True).fit(X, y)
    FITS.clear()
    ours = gn.GridSearchCV(comp, grid, cv=3, executor=executor, return_train_score=True).fit(X, y)
    assert_same_search(ours, theirs)
    assert FITS["frozen"] == 0 or executor == "dask"   # never refitted (on Dask the fits ran elsewhere)
    assert "encoder" not in {k for k, v in ours.search_report_.fits.items() if v}
    np.testing.assert_allclose(ours.predict(X[:5]), theirs.predict(X[:5]), rtol=0, atol=1e-12)


# --- issue 23 item 4: metadata routing, as scikit-learn's BaseSearchCV ---------------------------------------------

def _routing_cases():
    import sklearn.metrics as skm

    def r2w():
        return skm.make_scorer(skm.r2_score).set_score_request(sample_weight=True)

    def r2n():
        return skm.make_scorer(skm.r2_score).set_score_request(sample_weight=False)

    def pipe(scale, ridge):
        s, r = WeightedScaler("routed"), Ridge()
        if scale is not None:
            s.set_fit_request(sample_weight=scale)
        if ridge is not None:
            r.set_fit_request(sample_weight=ridge)
        return Pipeline([("scale", s), ("ridge", r)])

    grid = {"ridge__alpha": [0.1, 10.0]}
    return {
        "scaler-takes-ridge-declines": lambda: (pipe(True, False), grid, None),
        "scaler-declines-ridge-takes-scorer-takes": lambda: (pipe(False, True), grid, r2w()),
        "both-take-scorer-declines": lambda: (pipe(True, True), grid, r2n()),
        "multimetric": lambda: (pipe(False, True), grid, {"w": r2w(), "n": r2n(), "mse": "neg_mean_squared_error"}),
        "plain-takes-scorer-takes": lambda: (Ridge().set_fit_request(sample_weight=True), {"alpha": [0.1, 10.0]},
                                             r2w()),
        "plain-declines-default-score": lambda: (
            Ridge().set_fit_request(sample_weight=False).set_score_request(sample_weight=True),
            {"alpha": [0.1, 10.0]}, None),
        "pipeline-default-score-unset": lambda: (pipe(True, False), grid, None),
        "unset-step": lambda: (pipe(None, True), grid, r2w()),
    }


ROUTING = _routing_cases()


def _outcome(make):
    try:
        return _recorded(make)
    except Exception as e:  # noqa: BLE001 - compared with scikit-learn's
        return e, None


@pytest.mark.parametrize("case", sorted(ROUTING))
def test_metadata_routing_equals_sklearn(executor, case, reg_data):
    """Under sklearn.set_config(enable_metadata_routing=True): the same requests, errors and cv_results_."""
    import sklearn

    with sklearn.config_context(enable_metadata_routing=True):
        _routing_equals_sklearn(executor, case, reg_data)


def _routing_equals_sklearn(executor, case, reg_data):
    X, y = reg_data
    w = np.random.default_rng(1).uniform(0.1, 3.0, size=len(y))
    est, grid, scoring = ROUTING[case]()
    refit = "w" if isinstance(scoring, dict) else True
    kw = {"cv": KFold(3, shuffle=True, random_state=0), "scoring": scoring, "refit": refit,
          "return_train_score": True}
    theirs, tw = _outcome(lambda: skms.GridSearchCV(est, grid, **kw).fit(X, y, sample_weight=w))
    ours, ow = _outcome(lambda: gn.GridSearchCV(est, grid, executor=executor, **kw).fit(X, y, sample_weight=w))
    if isinstance(theirs, Exception):
        assert type(ours) is type(theirs), ours
        assert str(ours).split("\n")[0] == str(theirs).split("\n")[0]
        return
    assert not isinstance(ours, Exception), ours
    for k, v in theirs.cv_results_.items():
        if "score" in k and "time" not in k:
            np.testing.assert_allclose(ours.cv_results_[k], v, rtol=0, atol=1e-12, err_msg=k)
    assert ([str(x.message).split(".")[0] for x in ow if x.category is UserWarning]
            == [str(x.message).split(".")[0] for x in tw if x.category is UserWarning])
    np.testing.assert_allclose(ours.predict(X[:5]), theirs.predict(X[:5]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("how", ["unrequested", "unrouted"])
def test_metadata_routing_errors_before_any_fit(executor, how, reg_data):
    import sklearn
    from sklearn.exceptions import UnsetMetadataPassedError

    X, y = reg_data
    FITS.clear()
    est = Pipeline([("scale", WeightedScaler("routed")), ("ridge", Ridge())])
    params = {"sample_weight": np.ones(len(y))} if how == "unrequested" else {"groups": np.arange(len(y)) % 3}
    err = UnsetMetadataPassedError if how == "unrequested" else TypeError
    with sklearn.config_context(enable_metadata_routing=True):
        with pytest.raises(err) as theirs:
            skms.GridSearchCV(Ridge(), {"alpha": [1.0]}, cv=3).fit(X, y, **params)
        with pytest.raises(err) as ours:
            gn.GridSearchCV(Ridge(), {"alpha": [1.0]}, cv=3, executor=executor).fit(X, y, **params)
        assert str(ours.value) == str(theirs.value)
        if how == "unrouted":   # with a splitter that asks for groups, they reach it
            s = skms.GroupKFold(3)
            ok = gn.GridSearchCV(est, {"ridge__alpha": [1.0]}, cv=s, executor=executor).fit(X, y, **params)
            ref = skms.GridSearchCV(est, {"ridge__alpha": [1.0]}, cv=s).fit(X, y, **params)
            np.testing.assert_allclose(ok.cv_results_["mean_test_score"], ref.cv_results_["mean_test_score"])
    if getattr(executor, "name", executor) != "dask":   # on Dask the fold fits run in the workers
        assert FITS["routed"] == (2 * 3 + 2 if how == "unrouted" else 0)
    else:
        assert FITS["routed"] == (3 + 2 if how == "unrouted" else 0)   # scikit-learn's 3 + 1, our refit


def test_a_step_whose_fit_output_is_its_transform_scores_the_training_rows_once():
    """A step with scikit-learn's fit_transform (fit then transform) passes its fit output on as the transformed
    rows to score; one that overrides it (PCA) transforms them again; the train scores equal scikit-learn's."""
    from gpunets.tuning import tasks

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(60, 5)), rng.normal(size=60)
    scaled = tasks.fit_stage(StandardScaler(), None, {}, True, y, X, X[:10], X)
    assert scaled.score is scaled.train
    np.testing.assert_array_equal(scaled.train, StandardScaler().fit(X).transform(X))
    reduced = tasks.fit_stage(PCA(n_components=2), None, {}, True, y, scaled)
    assert reduced.score is not reduced.train
    np.testing.assert_array_equal(reduced.score, PCA(n_components=2).fit(scaled.train).transform(scaled.train))
    apart = tasks.fit_stage(StandardScaler(), None, {}, True, y, X, X[:10], X.copy())   # other rows to score
    assert apart.score is not apart.train
    pipe = make_pipeline(StandardScaler(), PCA(n_components=3), Ridge())
    grid = {"ridge__alpha": [0.1, 10.0]}
    ours = gn.GridSearchCV(pipe, grid, cv=3, return_train_score=True, executor="threads", workers=2).fit(X, y)
    theirs = skms.GridSearchCV(pipe, grid, cv=3, return_train_score=True).fit(X, y)
    for key in ("mean_train_score", "mean_test_score"):
        np.testing.assert_allclose(ours.cv_results_[key], theirs.cv_results_[key], rtol=0, atol=1e-12)


def test_short_search_tasks_run_in_the_calling_thread_on_threads():
    """executor="threads": tasks shorter than SERIAL_TASK_SECONDS run in the caller (small fits hold the GIL)."""
    import threading

    from gpunets.tuning.search import SERIAL_TASK_SECONDS

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 3)), rng.normal(size=40)
    from gpunets.tuning.onepass_search import enabled

    with enabled(False):   # the network's tasks (a Ridge search otherwise takes the one-pass path)
        s = gn.GridSearchCV(Ridge(), {"alpha": [0.1, 1.0, 10.0]}, cv=2, executor="threads", workers=2).fit(X, y)
    recs = s.search_report_.trace.records
    slow = [r for r in recs if r.seconds >= SERIAL_TASK_SECONDS]
    if len(slow) < 2:   # a loaded machine may slow two tasks down: then the threads took over, as they should
        assert {r.thread for r in recs} == {threading.current_thread().name}
    assert s.search_report_.ran == s.search_report_.fits == {"Ridge": 6}


@pytest.mark.parametrize("which", ["ridge copy_X=False", "scaler copy=False"])
def test_steps_that_write_their_input_do_not_change_what_other_candidates_see(executor, which):
    """A step with copy=False / copy_X=False writes into the rows it is given; the search shares a fold's rows
    among candidates, so each such step gets its own copy, and the scores are scikit-learn's (which gives each
    (candidate, fold) its own rows)."""
    from sklearn.linear_model import Ridge as R
    from sklearn.model_selection import GridSearchCV as SkGrid
    from sklearn.model_selection import KFold
    from sklearn.pipeline import Pipeline as P
    from sklearn.preprocessing import StandardScaler as S

    rng = np.random.default_rng(0)
    X = rng.normal(size=(150, 6)) + 5.0   # far from centred: a centred copy scores very differently
    y = X[:, :3].sum(axis=1) + rng.normal(size=150)
    if which == "ridge copy_X=False":
        est, grid = R(copy_X=False), {"alpha": [0.1, 1.0, 10.0]}
    else:
        est, grid = P([("scale", S(copy=False)), ("ridge", R())]), {"ridge__alpha": [0.1, 1.0, 10.0]}
    kw = dict(cv=KFold(3), return_train_score=True, refit=False)
    ours = gn.GridSearchCV(est, grid, **kw).fit(X.copy(), y)
    theirs = SkGrid(est, grid, **kw).fit(X.copy(), y)
    for k in ("mean_test_score", "mean_train_score", "split0_test_score", "split2_train_score"):
        np.testing.assert_allclose(ours.cv_results_[k], theirs.cv_results_[k], rtol=1e-12, atol=1e-14, err_msg=k)


@pytest.mark.parametrize("grid", [{"p": ["passthrough", PCA(3)], "r__alpha": [0.1, 1.0]},
                                  {"s": [StandardScaler(), "passthrough", None], "r__alpha": [0.1, 3.0]},
                                  {"p": ["passthrough"], "r__alpha": [1.0, 2.0]}],
                         ids=["pca-or-passthrough", "scaler-passthrough-none", "all-passthrough"])
@pytest.mark.parametrize("search", ["GridSearchCV", "HalvingGridSearchCV"])
def test_a_grid_that_swaps_a_step_for_passthrough_equals_sklearn(executor, reg_data, grid, search):
    """A step swapped for "passthrough" (or None) in some candidates: the first candidate need not fit every step
    (this raised KeyError when the first candidate's steps were taken for all)."""
    import sklearn.experimental.enable_halving_search_cv  # noqa: F401

    X, y = reg_data
    pipe = Pipeline([("s", StandardScaler()), ("p", PCA(3)), ("r", Ridge())])
    kw = {"cv": 3, **({"random_state": 0, "min_resources": 30} if search.startswith("Halving") else {})}
    theirs = getattr(skms, search)(pipe, grid, **kw).fit(X, y)
    for one_pass in (False, True):
        with gn.config(one_pass=one_pass):
            ours = getattr(gn, search)(pipe, grid, **kw).fit(X, y)
        np.testing.assert_allclose(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"],
                                   rtol=1e-9, atol=1e-12)
        assert ours.best_params_ == theirs.best_params_
        # bit for bit on the local executors; on Dask a halving search's scores differ from scikit-learn's in the
        # last bit in some runs, with or without passthrough (3 of 8 runs of a plain alpha grid; not found why)
        if not one_pass and getattr(executor, "name", "") != "dask":
            assert np.array_equal(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"])

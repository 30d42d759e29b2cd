"""Successive halving as networks (issue 27): scikit-learn's halving scenarios by behaviour, equality with
scikit-learn on every executor, warm-started iteration budgets, the drop-in parameters, callbacks, and the
search's memory (resume after an interrupt, a grid grown)."""

from __future__ import annotations

import collections
import pickle
import threading
from math import ceil

import numpy as np
import pytest
import sklearn.model_selection as skms
from scipy.stats import expon, loguniform
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.datasets import make_classification
from sklearn.decomposition import PCA
from sklearn.ensemble import RandomForestRegressor
from sklearn.experimental import enable_halving_search_cv  # noqa: F401
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import GroupKFold, KFold, LeaveOneGroupOut, ShuffleSplit, StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC, LinearSVC

import gpunets as gn

HALVINGS = {"grid": (gn.HalvingGridSearchCV, skms.HalvingGridSearchCV),
            "random": (gn.HalvingRandomSearchCV, skms.HalvingRandomSearchCV)}
FITS: collections.Counter = collections.Counter()
_LOCK = threading.Lock()


class Letters(ClassifierMixin, BaseEstimator):
    """A classifier with parameters ``a`` .. ``e`` and ``n_estimators`` that change nothing: predicts the
    majority class of its training rows (deterministic, fast); counts its fits."""

    def __init__(self, a=0, b=0, c=0, d=0, e=0, n_estimators=1, fail_fit=False, fail_predict=False):
        self.a, self.b, self.c, self.d, self.e = a, b, c, d, e
        self.n_estimators, self.fail_fit, self.fail_predict = n_estimators, fail_fit, fail_predict

    def fit(self, X, y):
        with _LOCK:
            FITS["letters"] += 1
        if self.fail_fit:
            raise ValueError("fitting failed")
        self.classes_, counts = np.unique(y, return_counts=True)
        self.majority_ = self.classes_[np.argmax(counts)]
        return self

    def predict(self, X):
        if self.fail_predict:
            raise ValueError("predict failed")
        return np.full(len(X), self.majority_)


class CountingRidge(RegressorMixin, BaseEstimator):
    """Ridge that counts its fits; raises KeyboardInterrupt at the fit ``interrupt_at`` (a Ctrl-C)."""

    interrupt_at: int | None = None

    def __init__(self, alpha=1.0):
        self.alpha = alpha

    def fit(self, X, y):
        with _LOCK:
            FITS["ridge"] += 1
            n = FITS["ridge"]
        if CountingRidge.interrupt_at is not None and n == CountingRidge.interrupt_at:
            raise KeyboardInterrupt
        self.model_ = Ridge(alpha=self.alpha).fit(X, y)
        return self

    def predict(self, X):
        return self.model_.predict(X)


@pytest.fixture(scope="module")
def reg_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(240, 6))
    y = X @ rng.normal(size=6) + rng.normal(size=240)
    return X, y


@pytest.fixture(scope="module")
def clf_data():
    return make_classification(n_samples=1000, random_state=0)


def assert_same_halving(ours, theirs):
    r, s = ours.cv_results_, theirs.cv_results_
    assert sorted(r) == sorted(s)
    assert list(r["params"]) == list(s["params"])
    for k in s:
        if "time" in k or k == "params":
            continue
        a, b = r[k], s[k]
        if k.startswith("param_"):   # masked where a candidate has no such parameter
            assert np.ma.getmaskarray(a).tolist() == np.ma.getmaskarray(b).tolist(), k
            assert a.compressed().tolist() == b.compressed().tolist(), k
            continue
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-12, err_msg=k)
        else:
            assert a.tolist() == b.tolist(), k
    for attr in ("n_resources_", "n_candidates_", "n_iterations_", "n_remaining_candidates_",
                 "n_possible_iterations_", "n_required_iterations_", "min_resources_", "max_resources_",
                 "best_params_", "best_index_", "n_splits_"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    np.testing.assert_allclose(ours.best_score_, theirs.best_score_, rtol=0, atol=1e-12)


# --- equality with scikit-learn, on every executor --------------------------------------------------------------

def _cases():
    pipe = make_pipeline(StandardScaler(), PCA(n_components=4), Ridge())
    return {
        "grid-pipeline": ("grid", pipe, {"pca__n_components": [3, 4], "ridge__alpha": list(np.logspace(-2, 2, 6))}, {}),
        "random-pipeline": ("random", pipe, {"ridge__alpha": loguniform(1e-3, 1e3)}, {"n_candidates": 9}),
        "grid-factor2-train": ("grid", Ridge(), {"alpha": list(np.logspace(-3, 3, 8))},
                               {"factor": 2, "return_train_score": True, "scoring": "neg_mean_squared_error"}),
    }


@pytest.mark.parametrize("case", sorted(_cases()))
def test_equals_sklearn_on_every_executor(executor, case, reg_data):
    X, y = reg_data
    kind, est, grid, kw = _cases()[case]
    ours_cls, sk_cls = HALVINGS[kind]
    kw = {"cv": KFold(3, shuffle=True, random_state=0), "random_state": 0, **kw}
    theirs = sk_cls(est, grid, **kw).fit(X, y)
    ours = ours_cls(est, grid, executor=executor, **kw).fit(X, y)
    assert_same_halving(ours, theirs)
    np.testing.assert_allclose(ours.predict(X[:5]), theirs.predict(X[:5]), rtol=0, atol=1e-12)
    assert len(ours.search_report_.rungs) == ours.n_iterations_


def test_each_rung_is_one_network_with_shared_steps(reg_data):
    X, y = reg_data
    pipe = make_pipeline(StandardScaler(), PCA(n_components=4), Ridge())
    s = gn.HalvingGridSearchCV(pipe, {"ridge__alpha": list(np.logspace(-2, 2, 9))}, cv=3, random_state=0,
                               executor="serial").fit(X, y)
    rep = s.search_report_
    assert s.n_candidates_ == [9, 3, 1]
    assert [r.fits for r in rep.rungs] == [{"standardscaler": 3, "pca": 3, "ridge": 9 * 3},
                                           {"standardscaler": 3, "pca": 3, "ridge": 3 * 3},
                                           {"standardscaler": 3, "pca": 3, "ridge": 3}]
    assert rep.fits == {"standardscaler": 9, "pca": 9, "ridge": 39}
    assert rep.naive == {k: 39 for k in rep.fits}
    assert "rung 0: 9 candidates" in repr(rep)


# --- an iteration budget warm-started ---------------------------------------------------------------------------

def test_warm_budget_equals_cold_and_sklearn(executor, reg_data):
    X, y = reg_data
    rf = RandomForestRegressor(random_state=0, max_features=0.5)
    grid = {"max_depth": [2, 3, 4, None], "min_samples_leaf": [1, 3, 5]}
    kw = dict(cv=3, factor=3, resource="n_estimators", min_resources=2, max_resources=18, random_state=0)
    theirs = skms.HalvingGridSearchCV(rf, grid, **kw).fit(X, y)
    warm = gn.HalvingGridSearchCV(rf, grid, executor=executor, **kw).fit(X, y)
    cold = gn.HalvingGridSearchCV(rf, grid, executor=executor, warm_start=False, **kw).fit(X, y)
    assert_same_halving(warm, theirs)
    assert_same_halving(cold, theirs)
    assert theirs.n_resources_ == [2, 6, 18]
    assert warm.n_candidates_ == [12, 4, 2]
    assert [r.warm for r in warm.search_report_.rungs] == [0, 4 * 3, 2 * 3]
    assert cold.search_report_.warm == 0
    assert "warm" in repr(warm.search_report_)


def test_warm_budget_on_a_pipelines_last_step(reg_data):
    X, y = reg_data
    pipe = make_pipeline(StandardScaler(), RandomForestRegressor(random_state=0, max_depth=3))
    grid = {"randomforestregressor__min_samples_leaf": [1, 3, 9]}
    kw = dict(cv=2, resource="randomforestregressor__n_estimators", min_resources=3, max_resources=9,
              random_state=0)
    theirs = skms.HalvingGridSearchCV(pipe, grid, **kw).fit(X, y)
    ours = gn.HalvingGridSearchCV(pipe, grid, executor="serial", warm_start=True, **kw).fit(X, y)
    assert_same_halving(ours, theirs)
    assert ours.search_report_.warm == 2   # one survivor, two folds


JOBS: list = []


class SpyForest(RandomForestRegressor):
    """A forest that notes the ``n_jobs`` its fits run with."""

    def fit(self, X, y, sample_weight=None):
        with _LOCK:
            JOBS.append(self.n_jobs)
        return super().fit(X, y, sample_weight=sample_weight)


def test_forests_of_a_small_rung_and_the_refit_grow_on_the_lanes_threads(reg_data):
    """A rung of few tasks fits its forests on every lane (the lanes idle at its end help); the refit too:
    the trees, scores and best estimator are scikit-learn's, ``n_jobs`` is the user's after."""
    from gpunets.tuning import warm

    assert (warm.inner_jobs(5, 2), warm.inner_jobs(135, 2), warm.inner_jobs(5, 1)) == (2, 1, 1)
    assert warm.lanes("serial", 4) == 1 and warm.lanes("threads", 3) == 3
    X, y = reg_data
    first = RandomForestRegressor(4, random_state=0, max_depth=5, warm_start=True).fit(X, y)
    grown = warm._continuable_copy(first).set_params(n_estimators=9)
    with warm.threaded_trees(grown, 2):
        assert grown.n_jobs == 2
        grown.fit(X, y)
    assert grown.n_jobs is None and len(first.estimators_) == 4 and len(grown.estimators_) == 9
    cold = RandomForestRegressor(9, random_state=0, max_depth=5).fit(X, y)
    assert np.array_equal(grown.predict(X), cold.predict(X))
    JOBS.clear()
    rf = SpyForest(random_state=0, max_features=0.5)
    grid = {"max_depth": [2, 4, None], "min_samples_leaf": [1, 3, 5]}
    kw = dict(cv=2, factor=3, resource="n_estimators", min_resources=2, max_resources=18, random_state=0)
    ours = gn.HalvingGridSearchCV(rf, grid, executor="threads", workers=2, **kw).fit(X, y)
    assert ours.n_candidates_ == [9, 3, 1]
    assert JOBS.count(2) == 3 * 2 + 2 + 1 and JOBS.count(None) == 9 * 2   # rungs 1, 2 (< 8 tasks), the refit
    JOBS.clear()
    theirs = skms.HalvingGridSearchCV(rf, grid, **kw).fit(X, y)
    assert set(JOBS) == {None}
    assert_same_halving(ours, theirs)
    assert ours.best_estimator_.n_jobs is None
    assert np.array_equal(ours.best_estimator_.predict(X), theirs.best_estimator_.predict(X))


def test_warm_start_true_on_an_unknown_resource_lists_the_known_ones(reg_data):
    X, y = reg_data
    rf = RandomForestRegressor(random_state=0, n_estimators=3)
    s = gn.HalvingGridSearchCV(rf, {"min_samples_leaf": [1, 2]}, resource="max_depth", max_resources=4,
                               warm_start=True, cv=2)
    with pytest.raises(ValueError, match=r"n_estimators.*max_iter.*Hint: pass warm_start=False"):
        s.fit(X, y)
    with pytest.raises(ValueError, match="Ridge has no warm_start parameter"):
        gn.HalvingGridSearchCV(Ridge(), {"alpha": [1.0, 2.0]}, resource="max_iter", max_resources=9,
                               warm_start=True, cv=2).fit(X, y)
    # "auto" (the default): the rungs refitted, as scikit-learn's
    kw = dict(resource="max_depth", max_resources=4, cv=2, random_state=0)
    theirs = skms.HalvingGridSearchCV(rf, {"min_samples_leaf": [1, 2]}, **kw).fit(X, y)
    ours = gn.HalvingGridSearchCV(rf, {"min_samples_leaf": [1, 2]}, executor="serial", **kw).fit(X, y)
    assert_same_halving(ours, theirs)
    assert ours.search_report_.warm == 0


def test_bad_warm_start_value(reg_data):
    X, y = reg_data
    with pytest.raises(ValueError, match="warm_start"):
        gn.HalvingGridSearchCV(Ridge(), {"alpha": [1.0]}, warm_start="yes").fit(X, y)


# --- scikit-learn's halving scenarios, by behaviour -------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::sklearn.exceptions.FitFailedWarning")
@pytest.mark.filterwarnings("ignore:Scoring failed:UserWarning")
@pytest.mark.filterwarnings("ignore:One or more of the:UserWarning")
@pytest.mark.parametrize("kind", sorted(HALVINGS))
@pytest.mark.parametrize("fail_at", ["fit", "predict"])
def test_failures_rank_last(kind, fail_at, clf_data):
    X, y = clf_data
    ours_cls, sk_cls = HALVINGS[kind]
    kw = dict(resource="n_estimators", max_resources=6, min_resources=1, factor=2, random_state=0)
    grid = {f"fail_{fail_at}": [False, True], "a": [0, 1, 2]}
    ours = ours_cls(Letters(), grid, executor="serial", **kw).fit(X, y)
    theirs = sk_cls(Letters(), grid, **kw).fit(X, y)
    assert_same_halving(ours, theirs)
    assert not ours.best_params_[f"fail_{fail_at}"]
    scores, ranks = ours.cv_results_["mean_test_score"], ours.cv_results_["rank_test_score"]
    assert np.isnan(scores).any()
    assert len(np.unique(ranks[np.isnan(scores)])) == 1
    assert (ranks[np.isnan(scores)][0] >= ranks).all()


@pytest.mark.parametrize("kind", sorted(HALVINGS))
@pytest.mark.parametrize("aggressive, limited, n_iter, n_cands, n_res", [
    (True, True, 4, [60, 20, 7, 3], [20, 20, 60, 180]),     # the first rung repeated
    (False, True, 3, [60, 20, 7], [20, 60, 180]),
    (True, False, 4, [60, 20, 7, 3], [37, 111, 333, 999]),  # unlimited: no effect
    (False, False, 4, [60, 20, 7, 3], [37, 111, 333, 999]),
])
def test_aggressive_elimination(kind, aggressive, limited, n_iter, n_cands, n_res, clf_data, capsys):
    X, y = clf_data
    ours_cls, sk_cls = HALVINGS[kind]
    kw = dict(aggressive_elimination=aggressive, max_resources=180 if limited else 1000, factor=3, verbose=1,
              random_state=0)
    if kind == "random":
        kw.update(n_candidates=60, min_resources="exhaust")
    grid = {"a": ["l1", "l2"], "b": list(range(30))}
    ours = ours_cls(Letters(), grid, executor="serial", **kw).fit(X, y)
    assert (ours.n_iterations_, ours.n_candidates_, ours.n_resources_) == (n_iter, n_cands, n_res)
    assert ceil(ours.n_candidates_[-1] / ours.factor) == ours.n_remaining_candidates_
    assert "n_required_iterations" in capsys.readouterr().out   # verbose: scikit-learn's summary
    if kind == "grid":
        assert_same_halving(ours, sk_cls(Letters(), grid, **kw).fit(X, y))


@pytest.mark.parametrize("kind", sorted(HALVINGS))
@pytest.mark.parametrize("min_res, max_res, n_iter, n_possible, n_res", [
    ("smallest", "auto", 2, 4, [20, 60]),
    (50, "auto", 2, 3, [50, 150]),
    ("smallest", 30, 1, 1, [20]),
    ("exhaust", "auto", 2, 2, [333, 999]),
    ("exhaust", 599, 2, 2, [199, 597]),
    ("exhaust", 50, 1, 1, [20]),
])
def test_min_max_resources(kind, min_res, max_res, n_iter, n_possible, n_res, clf_data):
    X, y = clf_data
    ours_cls, _ = HALVINGS[kind]
    kw = dict(factor=3, min_resources=min_res, max_resources=max_res)
    if kind == "random":
        kw["n_candidates"] = 6
    s = ours_cls(Letters(), {"a": [1, 2], "b": [1, 2, 3]}, executor="serial", **kw).fit(X, y)
    assert (s.n_iterations_, s.n_required_iterations_, s.n_possible_iterations_) == (n_iter, 2, n_possible)
    assert s.n_resources_ == n_res


@pytest.mark.parametrize("kind", sorted(HALVINGS))
def test_resource_parameter_budget_per_rung(kind, clf_data):
    X, y = clf_data
    ours_cls, sk_cls = HALVINGS[kind]
    kw = dict(resource="c", max_resources=10, factor=3, random_state=0)
    if kind == "random":
        kw["n_candidates"] = 9
    grid = {"a": [1, 2], "b": [10, 12, 13]}
    ours = ours_cls(Letters(), grid, executor="serial", **kw).fit(X, y)
    theirs = sk_cls(Letters(), grid, **kw).fit(X, y)
    assert_same_halving(ours, theirs)
    for itr, n in enumerate(ours.n_resources_):
        rows = ours.cv_results_["iter"] == itr
        assert {p["c"] for p in np.asarray(ours.cv_results_["params"])[rows]} == {n}
        assert (ours.cv_results_["n_resources"][rows] == n).all()


def test_random_search_candidates_and_list_of_dicts(clf_data):
    X, y = make_classification(n_samples=150, n_features=4, random_state=42)
    params = [{"kernel": ["rbf"], "C": expon(scale=10), "gamma": expon(scale=0.1)},
              {"kernel": ["poly"], "degree": [2, 3]}]
    kw = dict(cv=3, random_state=0, n_candidates=8, factor=2)
    ours = gn.HalvingRandomSearchCV(SVC(), params, executor="serial", **kw).fit(X, y)
    theirs = skms.HalvingRandomSearchCV(SVC(), params, **kw).fit(X, y)
    assert_same_halving(ours, theirs)
    for k in ("param_C", "param_degree", "param_gamma", "param_kernel"):
        assert k in ours.cv_results_


@pytest.mark.parametrize("kind", sorted(HALVINGS))
@pytest.mark.parametrize("params, match", [
    ({"resource": "not_a_parameter"}, "Cannot use resource=not_a_parameter which is not supported"),
    ({"resource": "a", "max_resources": 100}, "Cannot use parameter a as the resource since it is part of"),
    ({"max_resources": "auto", "resource": "b"}, "resource can only be 'n_samples' when max_resources='auto'"),
    ({"min_resources": 15, "max_resources": 14}, "min_resources_=15 is greater than max_resources_=14"),
    ({"cv": KFold(shuffle=True)}, "must yield consistent folds"),
    ({"cv": ShuffleSplit()}, "must yield consistent folds"),
    ({"factor": 0}, "factor"),
    ({"factor": "3"}, "factor"),
    ({"min_resources": -1}, "min_resources"),
    ({"max_resources": 0}, "max_resources"),
    ({"resource": 3}, "resource"),
    ({"aggressive_elimination": "yes"}, "aggressive_elimination"),
    ({"scoring": ["accuracy", "f1"]}, "scoring"),
])
def test_bad_halving_params_refused_as_sklearn_before_any_fit(kind, params, match):
    X, y = make_classification(100, random_state=0)
    ours_cls, sk_cls = HALVINGS[kind]
    with pytest.raises(Exception) as theirs:
        sk_cls(Letters(), {"a": [1]}, **params).fit(X, y)
    FITS.clear()
    with pytest.raises(type(theirs.value), match=match):
        ours_cls(Letters(), {"a": [1]}, executor="serial", **params).fit(X, y)
    assert FITS["letters"] == 0


def test_random_exhaust_twice_refused():
    X, y = make_classification(100, random_state=0)
    with pytest.raises(ValueError, match="cannot be both set to 'exhaust'"):
        gn.HalvingRandomSearchCV(Letters(), {"a": [1]}, n_candidates="exhaust", min_resources="exhaust").fit(X, y)


def test_empty_grid_is_refused():
    X, y = make_classification(100, random_state=0)
    with pytest.raises(ValueError, match="grid is empty"):
        gn.HalvingGridSearchCV(Letters(), []).fit(X, y)


@pytest.mark.parametrize("kind", sorted(HALVINGS))
def test_min_resources_null(kind):
    ours_cls, _ = HALVINGS[kind]
    with pytest.raises(ValueError, match="min_resources_=0: you might have passed an empty dataset X."):
        ours_cls(Letters(), {"a": [1]}, min_resources="smallest").fit(np.empty((0, 3)), [])


@pytest.mark.parametrize("kind", sorted(HALVINGS))
def test_groups_go_to_the_splitter(kind):
    X, y = make_classification(n_samples=50, n_classes=2, random_state=0)
    groups = np.random.RandomState(0).randint(0, 3, 50)
    ours_cls, sk_cls = HALVINGS[kind]
    for cv in (LeaveOneGroupOut(), GroupKFold(n_splits=3)):
        s = ours_cls(LinearSVC(random_state=0), {"C": [1, 2]}, cv=cv, random_state=0, executor="serial")
        with pytest.raises(ValueError, match="The 'groups' parameter should not be None."):
            s.fit(X, y)
        s.fit(X, y, groups=groups)
        t = sk_cls(LinearSVC(random_state=0), {"C": [1, 2]}, cv=cv, random_state=0).fit(X, y, groups=groups)
        assert_same_halving(s, t)
    ours_cls(LinearSVC(random_state=0), {"C": [1]}, cv=StratifiedKFold(), executor="serial").fit(X, y)


@pytest.mark.parametrize("kind", sorted(HALVINGS))
def test_best_candidate_comes_from_the_last_rung(kind):
    ours_cls, _ = HALVINGS[kind]
    results = {"iter": np.array([0, 0, 0, 0, 1, 1, 2, 2, 2]),
               "mean_test_score": np.array([4, 3, 5, 1, 11, 10, 5, 6, 9]),
               "params": np.array(list("abcdefghi"))}
    assert ours_cls._select_best_index(None, None, results) == 8


def test_pickle_and_clone_leave_the_memory_behind(reg_data):
    X, y = reg_data
    s = gn.HalvingGridSearchCV(Ridge(), {"alpha": [0.1, 1.0, 10.0]}, cv=3, random_state=0, executor="serial").fit(X, y)
    assert "_gn_memory" in s.__dict__
    s2 = pickle.loads(pickle.dumps(s))
    assert "_gn_memory" not in s2.__dict__
    np.testing.assert_array_equal(s2.predict(X[:4]), s.predict(X[:4]))
    assert "_gn_memory" not in s.forget().__dict__


# --- scikit-learn's drop-in parameters -------------------------------------------------------------------------

ALL_FOUR = {
    "grid": lambda **kw: gn.GridSearchCV(Ridge(), {"alpha": [0.1, 1.0, 10.0]}, cv=3, **kw),
    "random": lambda **kw: gn.RandomizedSearchCV(Ridge(), {"alpha": [0.1, 1.0, 10.0]}, n_iter=3, cv=3,
                                                 random_state=0, **kw),
    "halving-grid": lambda **kw: gn.HalvingGridSearchCV(Ridge(), {"alpha": [0.1, 1.0, 10.0]}, cv=3,
                                                        random_state=0, **kw),
    "halving-random": lambda **kw: gn.HalvingRandomSearchCV(Ridge(), {"alpha": [0.1, 1.0, 10.0]}, n_candidates=3,
                                                            cv=3, random_state=0, **kw),
}


@pytest.mark.parametrize("which", sorted(ALL_FOUR))
def test_n_jobs_verbose_pre_dispatch_accepted(which, reg_data, capsys):
    X, y = reg_data
    extra = {} if which.startswith("halving") else {"pre_dispatch": "2*n_jobs"}
    ref = ALL_FOUR[which](executor="serial").fit(X, y)
    for n_jobs in (-1, None, 2, 1):
        s = ALL_FOUR[which](n_jobs=n_jobs, verbose=1, **extra).fit(X, y)
        np.testing.assert_array_equal(s.cv_results_["mean_test_score"], ref.cv_results_["mean_test_score"])
    assert "Fitting 3 folds for each of" in capsys.readouterr().out
    with pytest.raises(ValueError, match="n_jobs=0 has no meaning"):
        ALL_FOUR[which](n_jobs=0).fit(X, y)
    with pytest.raises(ValueError, match="disagree"):
        ALL_FOUR[which](n_jobs=2, workers=3).fit(X, y)


def test_n_jobs_minus_one_in_a_notebook_style_script(tmp_path):
    """As a notebook cell would: ``n_jobs=-1`` on every search, in a fresh interpreter."""
    import os
    import subprocess
    import sys

    script = tmp_path / "cell.py"
    script.write_text(
        "import numpy as np, gpunets as gn\n"
        "from sklearn.linear_model import Ridge\n"
        "X = np.random.default_rng(0).normal(size=(120, 3)); y = X.sum(1)\n"
        "for S in (gn.GridSearchCV, gn.HalvingGridSearchCV):\n"
        "    s = S(Ridge(), {'alpha': [0.1, 1.0, 10.0]}, cv=3, n_jobs=-1).fit(X, y)\n"
        "    print(type(s).__name__, s.best_params_)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "HalvingGridSearchCV {'alpha'" in out.stdout


class CountingCallback:
    """A fit callback that counts its hooks per task name."""

    def __init__(self):
        self.counts = collections.Counter()

    def setup(self, estimator, context):
        self.counts["setup"] += 1

    def teardown(self, estimator, context):
        self.counts["teardown"] += 1

    def on_fit_task_begin(self, estimator, context):
        self.counts[("begin", context.task_name)] += 1

    def on_fit_task_end(self, estimator, context):
        self.counts[("end", context.task_name)] += 1


@pytest.mark.skipif(not hasattr(skms.GridSearchCV, "set_callbacks"), reason="scikit-learn without callbacks")
@pytest.mark.parametrize("which", ["grid", "halving-grid"])
def test_callbacks_fire_as_on_sklearn(which, reg_data):
    X, y = reg_data
    grid = {"alpha": [0.1, 1.0, 10.0, 100.0]}
    if which == "grid":
        ours, theirs = gn.GridSearchCV(Ridge(), grid, cv=3), skms.GridSearchCV(Ridge(), grid, cv=3)
    else:
        ours = gn.HalvingGridSearchCV(Ridge(), grid, cv=3, factor=2, random_state=0)
        theirs = skms.HalvingGridSearchCV(Ridge(), grid, cv=3, factor=2, random_state=0)
    a, b = CountingCallback(), CountingCallback()
    ours.set_callbacks(a).fit(X, y)
    theirs.set_callbacks(b).fit(X, y)
    assert a.counts == b.counts
    assert a.counts[("end", "candidate-split-evaluation")] > 0


def _callback_utils():
    """scikit-learn's own test estimator and recording callbacks (its callback API's tests use them)."""
    if not hasattr(skms.GridSearchCV, "set_callbacks"):
        pytest.skip("scikit-learn without callbacks")
    return pytest.importorskip("sklearn.callback.tests._utils")


def _callback_searches(mod, lib):
    """The four searches of scikit-learn's callback tests, with duplicate candidates (randint(1, 4), 3 draws) and
    rungs of equal resources (aggressive elimination)."""
    from scipy.stats import randint

    est = mod.MaxIterEstimator()
    return [lib.GridSearchCV(est, {"max_iter": [1, 2, 3]}, cv=2, scoring="r2"),
            lib.RandomizedSearchCV(est, {"max_iter": randint(1, 4)}, cv=2, n_iter=3, scoring="r2", random_state=42),
            lib.HalvingGridSearchCV(est, {"max_iter": [1, 2, 3]}, cv=2, aggressive_elimination=True, scoring="r2",
                                    random_state=0),
            lib.HalvingRandomSearchCV(est, {"max_iter": randint(1, 4)}, cv=2, aggressive_elimination=True,
                                      scoring="r2", random_state=42)]


@pytest.mark.parametrize("which", range(4))
def test_auto_propagated_callbacks_reach_each_evaluations_estimator(which, executor):
    """scikit-learn propagates auto-propagated callbacks (``ProgressBar``...) into the estimator each (candidate,
    fold) evaluation fits: its own hooks fire too. The same counts here, duplicate candidates and rungs of equal
    resources included (with callbacks, each evaluation fits its own estimator); on Dask, where the evaluations
    run in other processes, the search's own hooks fire, in the same counts, and the estimators' do not."""
    mod = _callback_utils()
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=60, random_state=0)
    ours, theirs = _callback_searches(mod, gn)[which], _callback_searches(mod, skms)[which]
    a, b = mod.RecordingAutoPropagatedCallback(), mod.RecordingCallback()
    ours.set_callbacks(a, b).fit(X, y)
    c, d = mod.RecordingAutoPropagatedCallback(), mod.RecordingCallback()
    theirs.set_callbacks(c, d).fit(X, y)
    assert ours.cv_results_["params"] == theirs.cv_results_["params"]
    for hook in ("setup", "on_fit_task_begin", "on_fit_task_end", "teardown"):
        assert b.count_hooks(hook) == d.count_hooks(hook), hook      # the search's own tasks
    dask = "dask" in type(executor).__module__ or executor == "dask"
    inner = sum(p["max_iter"] for p in theirs.cv_results_["params"]) * 2 + theirs.best_estimator_.n_iter_
    assert c.count_hooks("on_fit_task_begin") == d.count_hooks("on_fit_task_begin") + inner
    assert a.count_hooks("on_fit_task_begin") == (
        c.count_hooks("on_fit_task_begin") - (inner - theirs.best_estimator_.n_iter_ if dask else 0))
    assert a.count_hooks("on_fit_task_end") == a.count_hooks("on_fit_task_begin")


def test_evaluation_hooks_get_the_folds_rows_and_sample_weight(executor):
    """As in scikit-learn's ``_fit_and_score``: each evaluation's hooks get its training rows, ``y`` and
    ``sample_weight`` (on Dask, where they fire once the network has run, none of them)."""
    mod = _callback_utils()
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=60, random_state=0)
    w = np.random.RandomState(0).randint(1, 5, size=len(y)).astype(float)
    cb = mod.RecordingCallback()
    gn.GridSearchCV(mod.MaxIterEstimator(), {"max_iter": [1, 2]}, cv=2, scoring="r2").set_callbacks(cb).fit(
        X, y, sample_weight=w)
    evals = [e for e in cb.record if e["context"].task_name == "candidate-split-evaluation"]
    assert len(evals) == 2 * 2 * 2          # begin and end of 2 candidates x 2 folds
    if "dask" in type(executor).__module__ or executor == "dask":
        return
    for e in evals:
        kw = e["kwargs"]
        assert kw["X"].shape == (30, X.shape[1]) and len(kw["y"]) == 30
        assert kw["metadata"]["sample_weight"].shape == (30,)


@pytest.mark.parametrize("verbose", [1, 2, 3, 10])
@pytest.mark.parametrize("which", ["grid", "halving-grid"])
def test_verbose_prints_sklearns_lines(which, verbose, executor, capsys, reg_data):
    """``verbose`` as in scikit-learn: the same lines (times aside), the per-evaluation ones in its order, with
    train and test scores of several metrics."""
    import re

    X, y = reg_data
    grid = {"alpha": [0.1, 1.0, 10.0, 100.0]}
    kw: dict = dict(cv=3, verbose=verbose, return_train_score=True)
    if which == "grid":   # several metrics (a halving search takes one)
        kw.update(scoring=["r2", "neg_mean_squared_error"], refit="r2")
    if which == "grid":
        ours, theirs = gn.GridSearchCV(Ridge(), grid, **kw), skms.GridSearchCV(Ridge(), grid, **kw)
    else:
        ours = gn.HalvingGridSearchCV(Ridge(), grid, factor=2, random_state=0, **kw)
        theirs = skms.HalvingGridSearchCV(Ridge(), grid, factor=2, random_state=0, **kw)
    capsys.readouterr()
    theirs.fit(X, y)
    expected = capsys.readouterr().out
    ours.fit(X, y)
    got = capsys.readouterr().out

    def untimed(text):
        return re.sub(r"total time=.*", "total time=T", text)

    assert untimed(got) == untimed(expected)
    assert ("[CV" in got) == (verbose > 1)


@pytest.mark.parametrize("which", ["grid", "random", "halving-grid", "halving-random"])
def test_a_precomputed_kernel_as_a_list_is_refused_before_any_fit(which, executor):
    """scikit-learn's refusal (a ValueError from ``_safe_split``) for a pairwise estimator given a list, raised
    before any fit; the kernel as an array searches as scikit-learn's."""
    X, y = make_classification(n_samples=120, n_features=10, random_state=0)
    K = X @ X.T
    kw = {"grid": {}, "random": dict(n_iter=2, random_state=0), "halving-grid": dict(random_state=0),
          "halving-random": dict(random_state=0, n_candidates=2)}[which]
    make = {"grid": gn.GridSearchCV, "random": gn.RandomizedSearchCV, "halving-grid": gn.HalvingGridSearchCV,
            "halving-random": gn.HalvingRandomSearchCV}[which]
    grid_key = "param_grid" if "grid" in which else "param_distributions"
    search = make(SVC(kernel="precomputed"), **{grid_key: {"C": [0.1, 1.0]}}, cv=3, **kw)
    with pytest.raises(ValueError, match="Precomputed kernels or affinity matrices have to be passed as arrays"):
        search.fit(K.tolist(), y)
    assert not hasattr(search, "cv_results_")
    theirs = getattr(skms, make.__name__)(SVC(kernel="precomputed"), **{grid_key: {"C": [0.1, 1.0]}}, cv=3, **kw)
    np.testing.assert_allclose(search.fit(K, y).cv_results_["mean_test_score"],
                               theirs.fit(K, y).cv_results_["mean_test_score"], rtol=1e-12)


# --- resume and grow ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ex", ["serial", "threads"])
def test_fit_again_after_an_interrupt_continues(ex, reg_data):
    X, y = reg_data
    grid = {"alpha": [0.01, 0.1, 1.0, 10.0, 100.0]}
    fresh = gn.GridSearchCV(CountingRidge(), grid, cv=4, executor=ex).fit(X, y)
    s = gn.GridSearchCV(CountingRidge(), grid, cv=4, executor=ex)
    FITS.clear()
    CountingRidge.interrupt_at = 12
    try:
        with pytest.raises(BaseException):   # noqa: B017 - KeyboardInterrupt, or the executor's wrapping of it
            s.fit(X, y)
    finally:
        CountingRidge.interrupt_at = None
    done = len(s._gn_memory)
    assert 1 <= done <= 11
    FITS.clear()
    s.fit(X, y)
    assert FITS["ridge"] == 20 - done + 1   # the pairs not done, and the refit
    assert s.search_report_.remembered == done
    np.testing.assert_array_equal(s.cv_results_["mean_test_score"], fresh.cv_results_["mean_test_score"])


def test_a_widened_grid_fits_only_the_new_candidates(executor, reg_data):
    X, y = reg_data
    s = gn.GridSearchCV(CountingRidge(), {"alpha": [0.1, 1.0, 10.0]}, cv=3, executor=executor).fit(X, y)
    s.set_params(param_grid={"alpha": [0.1, 1.0, 10.0, 30.0, 100.0]}).fit(X, y)
    assert s.search_report_.fits == {"CountingRidge": 2 * 3}   # (on Dask the fits run in other processes)
    assert s.search_report_.remembered == 9
    fresh = gn.GridSearchCV(CountingRidge(), {"alpha": [0.1, 1.0, 10.0, 30.0, 100.0]}, cv=3,
                            executor=executor).fit(X, y)
    np.testing.assert_array_equal(s.cv_results_["mean_test_score"], fresh.cv_results_["mean_test_score"])
    s.fit(X + 1.0, y)   # new data: nothing remembered
    assert s.search_report_.fits == {"CountingRidge": 5 * 3} and s.search_report_.remembered == 0


def test_changed_scoring_or_data_in_place_starts_afresh(reg_data):
    X, y = reg_data
    X = X.copy()
    s = gn.GridSearchCV(CountingRidge(), {"alpha": [0.1, 1.0]}, cv=3, executor="serial").fit(X, y)
    FITS.clear()
    s.set_params(scoring="neg_mean_absolute_error").fit(X, y)
    assert FITS["ridge"] == 2 * 3 + 1
    X[0, 0] += 1.0
    FITS.clear()
    s.fit(X, y)
    assert FITS["ridge"] == 2 * 3 + 1


class CountingScaler(StandardScaler):
    """StandardScaler that counts its fits."""

    def fit(self, X, y=None, sample_weight=None):
        with _LOCK:
            FITS["scaler"] += 1
        return super().fit(X, y, sample_weight=sample_weight)


class FailingScaler(StandardScaler):
    """StandardScaler whose fit fails when ``fail`` is set (class-wide: the search clones it)."""

    fail = False

    def fit(self, X, y=None, sample_weight=None):
        if FailingScaler.fail:
            raise ValueError("scaler failed")
        return super().fit(X, y, sample_weight=sample_weight)


@pytest.mark.parametrize("ex", ["serial", "threads"])
def test_a_widened_grid_reuses_the_fitted_shared_steps(ex, reg_data):
    """Grown from 3 to 5 alphas: the scaler and PCA kept per fold are not fitted again (nor in the refit),
    and everything equals a fresh search's."""
    X, y = reg_data
    pipe = make_pipeline(CountingScaler(), PCA(n_components=3, random_state=0), Ridge())
    small, wide = {"ridge__alpha": [0.1, 1.0, 10.0]}, {"ridge__alpha": [0.1, 1.0, 10.0, 30.0, 100.0]}
    s = gn.GridSearchCV(pipe, small, cv=3, executor=ex).fit(X, y)
    assert s.search_report_.reused == {} and s.search_report_.refit_reused == 0
    FITS.clear()
    s.set_params(param_grid=wide).fit(X, y)
    assert FITS["scaler"] == 0
    report = s.search_report_
    assert report.reused == {"countingscaler": 3, "pca": 3} and report.refit_reused == 2
    assert report.fits == {"countingscaler": 0, "pca": 0, "ridge": 2 * 3} and report.remembered == 9
    assert "6 upstream step fits reused" in repr(report)
    fresh = gn.GridSearchCV(pipe, wide, cv=3, executor=ex).fit(X, y)
    np.testing.assert_array_equal(s.cv_results_["mean_test_score"], fresh.cv_results_["mean_test_score"])
    np.testing.assert_array_equal(s.predict(X), fresh.predict(X))
    kept = [v for v, _ in s._gn_memory.steps.values() if isinstance(v, tuple) and not hasattr(v, "seconds")]
    assert all(s.best_estimator_[i] is not est for est, _ in kept for i in range(3))   # copies, not the memory's
    # a new PCA (its pairs are new): the scaler kept, the PCA fitted
    FITS.clear()
    s.set_params(param_grid={"pca__n_components": [3, 4], "ridge__alpha": [1.0]}).fit(X, y)
    assert FITS["scaler"] == 0 and s.search_report_.fits["pca"] == 3
    assert s.search_report_.reused == {"countingscaler": 3}


def test_kept_steps_are_bounded_forgotten_and_not_pickled(reg_data, monkeypatch):
    from gpunets.tuning.memory import Memory

    X, y = reg_data
    pipe = make_pipeline(CountingScaler(), Ridge())
    s = gn.GridSearchCV(pipe, {"ridge__alpha": [0.1, 1.0]}, cv=3, executor="serial").fit(X, y)
    assert len(s._gn_memory.steps) == 3 + 1 and s._gn_memory.steps_bytes > 0   # per fold, and the refit
    assert "_gn_memory" not in pickle.loads(pickle.dumps(s)).__dict__
    assert "_gn_memory" not in s.forget().__dict__
    FITS.clear()
    s.set_params(param_grid={"ridge__alpha": [0.1, 1.0, 10.0]}).fit(X, y)
    assert FITS["scaler"] == 3 + 1   # forgotten: fitted again
    monkeypatch.setattr(Memory, "budget", X[:1].nbytes * 100)   # room for about one fold's stage
    s.forget().fit(X, y)
    assert s._gn_memory.steps_bytes <= Memory.budget and len(s._gn_memory.steps) <= 1
    FITS.clear()
    s.set_params(param_grid={"ridge__alpha": [0.1, 1.0, 10.0, 100.0]}).fit(X, y)
    assert FITS["scaler"] >= 3 and s.search_report_.remembered == 9
    fresh = gn.GridSearchCV(pipe, {"ridge__alpha": [0.1, 1.0, 10.0, 100.0]}, cv=3, executor="serial").fit(X, y)
    np.testing.assert_array_equal(s.cv_results_["mean_test_score"], fresh.cv_results_["mean_test_score"])


def test_another_estimator_on_the_same_grid_is_not_taken_for_the_first(reg_data):
    X, y = reg_data
    grid = {"ridge__alpha": [0.1, 10.0], "ridge__fit_intercept": [True]}
    s = gn.GridSearchCV(make_pipeline(StandardScaler(), Ridge()), grid, cv=3, executor="serial").fit(X, y)
    other = make_pipeline(StandardScaler(with_mean=False), Ridge())
    s.set_params(estimator=other).fit(X, y)
    fresh = gn.GridSearchCV(other, grid, cv=3, executor="serial").fit(X, y)
    assert s.search_report_.remembered == 0 and s.search_report_.reused == {}
    np.testing.assert_array_equal(s.cv_results_["mean_test_score"], fresh.cv_results_["mean_test_score"])


def test_a_failed_shared_step_is_not_kept(reg_data):
    X, y = reg_data
    s = gn.GridSearchCV(make_pipeline(FailingScaler(), Ridge()), {"ridge__alpha": [0.1]}, cv=3, executor="serial",
                        refit=False)
    FailingScaler.fail = True
    try:
        with pytest.raises(ValueError, match="fits failed"):
            s.fit(X, y)
    finally:
        FailingScaler.fail = False
    assert not s._gn_memory.steps   # failed fits are never kept: the next fit fits the scaler
    s.set_params(param_grid={"ridge__alpha": [0.1, 1.0]}).fit(X, y)
    assert s.search_report_.reused == {} and s.search_report_.fits["failingscaler"] == 3


def test_set_callbacks_without_sklearn_callbacks_is_refused_clearly(reg_data):
    """What a scikit-learn without the callback API gives (simulated: its BaseSearchCV lacks set_callbacks)."""
    from gpunets.tuning.dropin import MissingAPI, Unavailable

    Old = type("GridSearchCV", (gn.GridSearchCV,), {"set_callbacks": Unavailable("scikit-learn's callback API",
                                                                                 "1.9")})
    s = Old(Ridge(), {"alpha": [0.1, 1.0]}, cv=3)
    assert not hasattr(s, "set_callbacks")   # code testing for the API sees none, as on that scikit-learn
    with pytest.raises(MissingAPI, match=r"GridSearchCV.set_callbacks is scikit-learn's callback API.*Hint"):
        s.set_callbacks(object())
    assert isinstance(MissingAPI("x"), AttributeError)
    s.fit(*reg_data)   # the search itself runs


def test_classifier_halving_on_a_pipeline_equals_sklearn(clf_data):
    X, y = clf_data
    pipe = make_pipeline(StandardScaler(), LogisticRegression())
    kw = dict(cv=StratifiedKFold(3), random_state=0, scoring="accuracy")
    grid = {"logisticregression__C": list(np.logspace(-3, 2, 6))}
    assert_same_halving(gn.HalvingGridSearchCV(pipe, grid, executor="threads", **kw).fit(X, y),
                        skms.HalvingGridSearchCV(pipe, grid, **kw).fit(X, y))


def test_halving_on_a_gpu_equals_the_cpu(reg_data):
    """Each rung's network on the search's GPU (CuPy data, ``device="cuda"``), streams and serial: the CPU's
    results (the fake-GPU lane runs it without a GPU)."""
    from gpunets.devices import _gpulibs
    from gpunets.devices.placement import gpu_available

    if not gpu_available():
        pytest.skip("no GPU here (the fake-GPU lane: GPUNETS_FAKE_GPU=1)")
    cp = _gpulibs.cupy()
    X, y = reg_data
    pipe = make_pipeline(StandardScaler(), PCA(n_components=4), Ridge(solver="svd"))
    grid = {"ridge__alpha": list(np.logspace(-2, 2, 6))}
    kw = dict(cv=KFold(3), random_state=0, factor=2)
    cpu = gn.HalvingGridSearchCV(pipe, grid, executor="serial", **kw).fit(X, y)
    for ex in ("serial", "streams"):
        s = gn.HalvingGridSearchCV(pipe, grid, executor=ex, device="cuda", **kw).fit(cp.asarray(X), cp.asarray(y))
        assert s.best_params_ == cpu.best_params_ and s.n_candidates_ == cpu.n_candidates_
        np.testing.assert_allclose(s.cv_results_["mean_test_score"], cpu.cv_results_["mean_test_score"], atol=1e-8)
        assert s.search_report_.fits == cpu.search_report_.fits

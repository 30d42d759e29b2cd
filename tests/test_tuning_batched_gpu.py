"""Batched candidates on the GPU route (gpunets.tuning.batched_gpu, issue 37 item 3), on the fake GPU.

A search on ``device="cuda"`` fits ``Ridge(solver="svd")`` candidates that differ only in ``alpha`` together: one
SVD per fold, one metric call and one copy to the host per fold. Its results equal the same search without
batching bit for bit on the fake GPU (NumPy), and scikit-learn's GridSearchCV on the CPU within 1e-9.

The GPU route needs scikit-learn's array-API dispatch, which needs ``SCIPY_ARRAY_API=1`` before SciPy is imported:
in the fake-GPU lane these tests run here; elsewhere
:func:`test_the_gpu_batch_tests_pass_in_a_process_with_array_api_dispatch` runs this file in a fresh process with
the lane's environment.
"""

import collections
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import sklearn
from sklearn.decomposition import PCA
from sklearn.linear_model import Ridge
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

import gpunets as gn
from gpunets.compute.models import scipy_array_api_enabled
from gpunets.devices import fakegpu
from gpunets.testing import fake_gpu
from gpunets.tuning import batched, batched_gpu
from gpunets.tuning.onepass_search import enabled
from gpunets.tuning.report import SearchReport
from tests.helpers import run_in_the_lane

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALPHAS = [0.001, 0.1, 1.0, 10.0, 1000.0]
FOLDS = 4
LANE = scipy_array_api_enabled()
in_lane = pytest.mark.skipif(not LANE, reason="array-API fits on the fake GPU need SCIPY_ARRAY_API=1 before SciPy "
                             "is imported: run in a fresh process by the test below")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")   # StandardScaler's 0/0 on the fake GPU


@pytest.fixture(autouse=True)
def _network_path():
    """The network path's batches (the one-pass path, which takes these linear pipelines first, is off)."""
    with enabled(False):
        yield


@pytest.fixture
def cp():
    with fake_gpu(1) as mod:
        yield mod


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(240, 8)) @ rng.normal(size=(8, 8))
    y = X[:, :3].sum(axis=1) + rng.normal(size=240)
    return X, y


def _pipe(**ridge):
    return Pipeline([("scale", StandardScaler()), ("pca", PCA(n_components=5)),
                     ("ridge", Ridge(**{"solver": "svd", **ridge}))])


KEYS = ("mean_test_score", "mean_train_score", "std_test_score", "rank_test_score",
        *(f"split{i}_test_score" for i in range(FOLDS)), *(f"split{i}_train_score" for i in range(FOLDS)))


def _unbatched(monkeypatch):
    """The GPU search without batches: no rule batches a candidate."""
    monkeypatch.setattr(batched_gpu, "rule_for", lambda est, route: None)


def _search(est, grid, executor, **kw):
    kw = {"cv": KFold(FOLDS), "return_train_score": True, **kw}
    return gn.GridSearchCV(est, grid, device="cuda", executor=executor, **kw)


def _bitwise(ours, theirs, keys=KEYS):
    for k in keys:
        if k in theirs.cv_results_:
            np.testing.assert_array_equal(ours.cv_results_[k], theirs.cv_results_[k], err_msg=k)
    assert ours.best_params_ == theirs.best_params_


def _close(ours, theirs, keys=KEYS, rtol=1e-9):
    for k in keys:
        if k in theirs.cv_results_ and not k.startswith("std"):
            np.testing.assert_allclose(ours.cv_results_[k], theirs.cv_results_[k], rtol=rtol, atol=1e-12, err_msg=k)
    assert ours.best_params_ == theirs.best_params_


@in_lane
@pytest.mark.parametrize("scoring", [None, "neg_mean_squared_error", "explained_variance"])
def test_ridges_over_alpha_on_the_gpu_are_batched_and_equal_the_unbatched_search(monkeypatch, cp, executor, data,
                                                                                 scoring):
    X, y = data
    grid = {"ridge__alpha": ALPHAS}
    ours = _search(_pipe(), grid, executor, scoring=scoring).fit(X, y)
    rep = ours.search_report_
    assert rep.batched == rep.batched_gpu == len(ALPHAS) * FOLDS
    assert rep.batched_close == 0   # the fake GPU computes with NumPy: the scores too are bit for bit
    assert f"{len(ALPHAS) * FOLDS} on the GPU (one SVD per fold; fits bit for bit" in str(rep)
    assert rep.refit_route is not None and rep.refit_route[0] == "array_api"
    cpu = GridSearchCV(_pipe(), grid, cv=KFold(FOLDS), return_train_score=True, scoring=scoring).fit(X, y)
    _close(ours, cpu)
    _unbatched(monkeypatch)
    plain = _search(_pipe(), grid, executor, scoring=scoring).fit(X, y)
    assert plain.search_report_.batched == 0
    _bitwise(ours, plain)


@in_lane
def test_a_single_ridge_and_a_two_value_intercept_grid(monkeypatch, cp, executor, data):
    X, y = data
    grid = {"alpha": ALPHAS, "fit_intercept": [True, False]}
    ours = _search(Ridge(solver="svd"), grid, executor).fit(X, y)
    assert ours.search_report_.batched_gpu == 2 * len(ALPHAS) * FOLDS   # one batch per fold and fit_intercept
    _close(ours, GridSearchCV(Ridge(solver="svd"), grid, cv=KFold(FOLDS), return_train_score=True).fit(X, y))
    _unbatched(monkeypatch)
    _bitwise(ours, _search(Ridge(solver="svd"), grid, executor).fit(X, y))


@in_lane
def test_each_fitted_candidate_equals_its_own_fit_bit_for_bit(monkeypatch, cp, data):
    X, y = data
    monkeypatch.setattr(batched_gpu, "_CHECKED", {})
    ests = [Ridge(solver="svd", alpha=a) for a in [*ALPHAS, 0, 3]]
    with sklearn.config_context(array_api_dispatch=True):
        for rows in (X, X.astype(np.float32)):
            Xd, yd = cp.asarray(rows), cp.asarray(y)
            fitted = batched_gpu.RidgeSVDRule.fit(ests, Xd, yd)
            for est, got in zip(ests, fitted):
                own = Ridge(solver="svd", alpha=est.alpha).fit(Xd, yd)
                assert got.alpha == est.alpha and got is not est
                np.testing.assert_array_equal(cp.asnumpy(got.coef_), cp.asnumpy(own.coef_))
                np.testing.assert_array_equal(cp.asnumpy(got.intercept_), cp.asnumpy(own.intercept_))
                assert got.coef_.dtype == own.coef_.dtype and (got.n_features_in_, got.solver_, got.n_iter_) == \
                    (own.n_features_in_, own.solver_, own.n_iter_)
                np.testing.assert_array_equal(cp.asnumpy(got.predict(Xd)), cp.asnumpy(own.predict(Xd)))
    assert len(batched_gpu._CHECKED) == 2   # one fit kind per dtype, checked once each
    assert batched_gpu.RidgeSVDRule.fit(ests, cp.asarray(X), cp.asarray(y)) is None   # not under dispatch


@in_lane
def test_the_scores_of_a_fold_reach_the_host_in_one_copy(monkeypatch, cp, executor, data):
    """Host reads (each a synchronisation on a real GPU) of the batched search against the unbatched one: the
    per-candidate reads of the scores (one ``float()`` per score in the metric) become one copy per fold."""
    if getattr(executor, "name", "") == "dask":
        pytest.skip("dask's workers are other processes: their host reads are not logged here")
    X, y = data
    grid = {"ridge__alpha": ALPHAS}
    _search(_pipe(), grid, executor).fit(X, y)   # the kinds checked (their first batch reads more)
    copies = []
    real = batched_gpu.to_device

    def counted(value, device, **kw):
        before = len(fakegpu.host_reads())
        out = real(value, device, **kw)
        copies.append(len(fakegpu.host_reads()) - before)
        return out

    monkeypatch.setattr(batched_gpu, "to_device", counted)
    fakegpu.reset_log()
    _search(_pipe(), grid, executor).fit(X, y)
    ours = fakegpu.host_reads()
    # test and training scores of every candidate: one copy per fold (other tasks may read meanwhile on threads)
    assert len(copies) == FOLDS and (copies == [1] * FOLDS or getattr(executor, "name", "") != "serial")
    assert not any("batched_gpu.py" in r or "_regression.py" in r for r in ours), ours
    _unbatched(monkeypatch)
    fakegpu.reset_log()
    _search(_pipe(), grid, executor).fit(X, y)
    plain = fakegpu.host_reads()
    scores = 2 * len(ALPHAS) * FOLDS   # one read per test and training score of each candidate
    assert collections.Counter(r for r in plain if "_regression.py" in r).total() == scores, plain
    assert len(ours) == len(plain) - scores + FOLDS


@in_lane
@pytest.mark.parametrize("case", ["solver auto", "copy_X=False", "sample_weight", "one alpha", "store",
                                  "2-d target", "equal alphas"])
def test_what_the_rule_does_not_cover_is_fitted_one_by_one(monkeypatch, cp, data, tmp_path, case):
    X, y = data
    est, grid, params, ctx = _pipe(), {"ridge__alpha": ALPHAS}, {}, gn.config()
    if case == "solver auto":
        est = _pipe(solver="auto")
    elif case == "copy_X=False":
        est = _pipe(copy_X=False)
    elif case == "sample_weight":
        params = {"ridge__sample_weight": np.linspace(0.5, 1.5, len(y))}
    elif case == "one alpha":
        grid = {"ridge__alpha": [1.0], "pca__n_components": [3, 5]}
    elif case == "store":
        ctx = gn.config(store=gn.Store(tmp_path / "s"))
    elif case == "2-d target":
        y = np.c_[y, -y]
    else:
        grid = {"ridge__alpha": [1.0, 1.0]}
    with ctx, warnings.catch_warnings():
        warnings.simplefilter("ignore")   # solver="auto" under array-API dispatch warns, batched or not
        ours = _search(est, grid, "serial").fit(X, y, **params)
        _unbatched(monkeypatch)
        plain = _search(est, grid, "serial").fit(X, y, **params)
    assert ours.search_report_.batched == 0
    _bitwise(ours, plain)


@in_lane
def test_a_batch_whose_fit_differs_from_scikit_learn_by_a_bit_is_not_used(monkeypatch, cp, executor, data):
    if getattr(executor, "name", "") == "dask":
        pytest.skip("a monkeypatch of this process does not reach dask's worker processes, where the batch runs")
    X, y = data
    grid = {"ridge__alpha": ALPHAS}
    monkeypatch.setattr(batched_gpu, "_CHECKED", {})
    import sklearn.linear_model._base as base

    pre = base._preprocess_data

    def shifted(*args, **kwargs):   # only the batch's centring (scikit-learn's Ridge imported its own)
        Xc, yc, X_offset, y_offset, X_scale, sw = pre(*args, **kwargs)
        return Xc, yc, X_offset, y_offset * (1 + 1e-15) + 1e-15, X_scale, sw

    monkeypatch.setattr(base, "_preprocess_data", shifted)
    ours = _search(_pipe(), grid, executor).fit(X, y)
    assert ours.search_report_.batched == 0
    assert not any(k[0] == "Ridge.fit svd" for k in batched_gpu._CHECKED)   # checked again next time
    monkeypatch.undo()
    _unbatched(monkeypatch)
    _bitwise(ours, _search(_pipe(), grid, executor).fit(X, y))


@in_lane
def test_a_batched_prediction_that_differs_by_a_bit_is_scored_one_by_one(monkeypatch, cp, data):
    X, y = data
    grid = {"ridge__alpha": ALPHAS}
    monkeypatch.setattr(batched_gpu, "_CHECKED", {})
    real = batched_gpu.RidgeSVDRule.predict
    monkeypatch.setattr(batched_gpu.RidgeSVDRule, "predict", staticmethod(lambda est, Z: real(est, Z) * (1 + 1e-15)))
    ours = _search(_pipe(), grid, "serial").fit(X, y)
    rep = ours.search_report_
    assert rep.batched == rep.batched_gpu == len(ALPHAS) * FOLDS and rep.batched_close == 0   # fitted together
    monkeypatch.undo()
    _unbatched(monkeypatch)
    _bitwise(ours, _search(_pipe(), grid, "serial").fit(X, y))


@in_lane
@pytest.mark.parametrize("off", [1e-13, 1e-6])
def test_scores_within_1e9_relative_are_used_and_said_others_are_not(monkeypatch, cp, data, off):
    """A metric whose column scores differ from the scorer's own (as a CuPy column reduction may, in the last
    bits): within 1e-9 relative the batch's scores are used and the report says so; beyond, one by one."""
    X, y = data
    grid = {"ridge__alpha": ALPHAS}
    monkeypatch.setattr(batched_gpu, "_CHECKED", {})
    real = batched.column_metric

    def shifted(scorer, est):
        metric, sign, kw = real(scorer, est)
        return (lambda yt, yp, **k: metric(yt, yp, **k) * (1 + off)), sign, kw

    monkeypatch.setattr(batched, "column_metric", shifted)
    ours = _search(_pipe(), grid, "serial").fit(X, y)
    monkeypatch.undo()
    rep = ours.search_report_
    assert rep.batched_gpu == len(ALPHAS) * FOLDS
    _unbatched(monkeypatch)
    plain = _search(_pipe(), grid, "serial").fit(X, y)
    if off < 1e-9:
        assert rep.batched_close == len(ALPHAS) * FOLDS and "scored within 1e-9 relative" in str(rep)
        _close(ours, plain, rtol=1e-9)
        assert not np.array_equal(ours.cv_results_["mean_test_score"], plain.cv_results_["mean_test_score"])
    else:
        assert rep.batched_close == 0
        _bitwise(ours, plain)


@in_lane
@pytest.mark.parametrize("error_score", [np.nan, -1.0, "raise"])
def test_failing_folds_give_the_error_scores_of_the_unbatched_search(monkeypatch, cp, executor, data, error_score):
    X, y = data
    X = X.copy()
    X[5, 2] = np.nan   # the folds that train on row 5 fail to fit, as each candidate's own fit does
    kw = dict(error_score=error_score, refit=False)
    grid = {"alpha": ALPHAS}
    if error_score == "raise":
        with pytest.raises(ValueError, match="NaN"):
            _search(Ridge(solver="svd"), grid, executor, **kw).fit(X, y)
        return
    with pytest.warns(Warning):
        ours = _search(Ridge(solver="svd"), grid, executor, **kw).fit(X, y)
    _unbatched(monkeypatch)
    with pytest.warns(Warning):
        plain = _search(Ridge(solver="svd"), grid, executor, **kw).fit(X, y)
    keys = [k for k in KEYS if not k.startswith(("rank", "std", "mean"))]
    _bitwise(ours, plain, keys)
    # folds 1-3 fail to fit; fold 0 fits (in a batch: its training rows are finite), its scoring fails (row 5 is
    # one of its test rows): scored one by one, which warns and gives error_score as each candidate's own would
    for k in range(FOLDS):
        failed = ours.cv_results_[f"split{k}_test_score"]
        assert np.isnan(failed).all() if np.isnan(error_score) else (failed == error_score).all()
    assert ours.search_report_.batched == len(ALPHAS)


@in_lane
def test_a_candidate_the_rule_refuses_fails_alone_and_the_others_are_batched(monkeypatch, cp, executor, data):
    X, y = data
    grid = {"alpha": [-1.0, *ALPHAS]}   # a negative alpha: scikit-learn's parameter check fails its fits
    with pytest.warns(Warning):
        ours = _search(Ridge(solver="svd"), grid, executor, error_score=np.nan, refit=False).fit(X, y)
    assert ours.search_report_.batched_gpu == len(ALPHAS) * FOLDS
    assert np.isnan(ours.cv_results_["mean_test_score"][0]) and np.isfinite(ours.cv_results_["mean_test_score"][1:]).all()
    _unbatched(monkeypatch)
    with pytest.warns(Warning):
        plain = _search(Ridge(solver="svd"), grid, executor, error_score=np.nan, refit=False).fit(X, y)
    _bitwise(ours, plain, [k for k in KEYS if not k.startswith("rank")])


@in_lane
def test_parameters_scikit_learn_refuses_fail_each_candidate_in_a_checked_kind(monkeypatch, cp, executor, data):
    X, y = data
    _search(Ridge(solver="svd"), {"alpha": ALPHAS}, executor).fit(X, y)   # the kinds checked: no fit by sklearn
    # max_iter=-5: unused by the SVD solver, but refused by Ridge's parameter check, fit by fit
    grid = [{"alpha": ALPHAS, "max_iter": [-5]}, {"alpha": ALPHAS}]
    with pytest.warns(Warning, match="InvalidParameterError|max_iter"):
        ours = _search(Ridge(solver="svd"), grid, executor, error_score=np.nan, refit=False).fit(X, y)
    scores = ours.cv_results_["mean_test_score"]
    assert np.isnan(scores[:len(ALPHAS)]).all() and np.isfinite(scores[len(ALPHAS):]).all()
    assert ours.search_report_.batched == len(ALPHAS) * FOLDS   # the valid group only


@in_lane
def test_halving_on_the_gpu_batches_each_rung(monkeypatch, cp, data):
    from sklearn.experimental import enable_halving_search_cv  # noqa: F401

    X, y = data
    kw = dict(cv=KFold(3), factor=2, random_state=0, device="cuda")
    grid = {"ridge__alpha": ALPHAS}
    ours = gn.HalvingGridSearchCV(_pipe(), grid, **kw).fit(X, y)
    rep = ours.search_report_
    assert rep.batched_gpu > 0 and sum(r.batched_gpu for r in rep.rungs) == rep.batched_gpu == rep.batched
    _unbatched(monkeypatch)
    plain = gn.HalvingGridSearchCV(_pipe(), grid, **kw).fit(X, y)
    assert plain.search_report_.batched == 0
    _bitwise(ours, plain, ("mean_test_score", "split2_test_score", "iter", "n_resources"))


def test_the_report_says_which_equality_the_gpu_batches_promise():
    r = SearchReport(fits={"ridge": 20})
    r.count_batched([True] * 4 + ["gpu"] * 10 + ["gpu close"] * 6 + [None, False])
    assert (r.batched, r.batched_gpu, r.batched_close) == (20, 16, 6)
    assert ("20 last-step fits done in batches (gpunets.tuning.batched), 16 on the GPU (one SVD per fold; fits "
            "bit for bit, 10 scored bit for bit and 6 scored within 1e-9 relative)") in str(r)
    m = SearchReport.merged([r, r])
    assert (m.batched, m.batched_gpu, m.batched_close) == (40, 32, 12)
    plain = SearchReport(fits={"ridge": 4})
    plain.count_batched([True] * 4)
    assert "on the GPU" not in str(plain) and plain.batched == 4


@pytest.mark.skipif(LANE, reason="in the lane the tests above run in this process")
def test_the_gpu_batch_tests_pass_in_a_process_with_array_api_dispatch():
    run_in_the_lane("test_tuning_batched_gpu.py")


def test_the_gpu_batch_benchmark_runs_on_the_fake_gpu_without_claiming_a_target(tmp_path):
    """benchmarks/bench_tuning.py --gpu-batch: batched against unbatched on the fake GPU, both equal to scikit-learn's
    search on the CPU, every candidate fit batched; the fake's timings claim no target."""
    import json

    env = {**os.environ, "GPUNETS_FAKE_GPU": "1", "SCIPY_ARRAY_API": "1", "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": "1",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    out = tmp_path / "tuning_gpu_batch.json"
    proc = subprocess.run([sys.executable, "-W", "ignore", "benchmarks/bench_tuning.py", "--gpu-batch", "--quick",
                           "--rows", "300", "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["fake_gpu"] and "error" not in res, res
    assert res["scores_equal_cpu"]["met"] and res["all_batched"]["met"] and res["batched_vs_unbatched"]["value"] == 0
    assert "target" not in res["ratio_batched_vs_unbatched"] and "ratio_vs_before" not in res, res
    assert res["batched"]["batched"] == 50 and res["unbatched"]["batched"] == 0

"""The one-network search on Dask: the same results as serial, each shared fit once on one worker.

The cluster is ``gpunets.testing``'s session ``LocalCluster`` (``gn_dask_client``: 2 worker processes,
1 thread each), shared with the ``executor`` fixture's dask runs; its client is the default client, so
``executor="dask"`` runs there too.  Fits are counted on the workers themselves (an attribute of the
``distributed.Worker`` that ran them), not through the search's own report.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")

from sklearn.base import BaseEstimator, TransformerMixin  # noqa: E402
from sklearn.decomposition import PCA  # noqa: E402
from sklearn.exceptions import FitFailedWarning  # noqa: E402
from sklearn.linear_model import Lasso, LinearRegression, Ridge  # noqa: E402
from sklearn.pipeline import Pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

import gpunets as gn  # noqa: E402
from gpunets.tuning.onepass_search import enabled  # noqa: E402

pytestmark = pytest.mark.dask

# Workers cannot import this test module: ship its classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class WorkerCountedScaler(TransformerMixin, BaseEstimator):
    """A StandardScaler that counts its fits on the Dask worker running them (by tag)."""

    def __init__(self, tag="scale", with_mean=True):
        self.tag, self.with_mean = tag, with_mean

    def fit(self, X, y=None):
        try:
            w = distributed.get_worker()
        except ValueError:   # on the client (the refit)
            w = None
        if w is not None:
            counts = w.__dict__.setdefault("_gn_test_fits", {})
            counts[self.tag] = counts.get(self.tag, 0) + 1
        self.scaler_ = StandardScaler(with_mean=self.with_mean).fit(X)
        return self

    def transform(self, X):
        return self.scaler_.transform(X)


class NegativeFails(Ridge):
    """A Ridge that raises for alpha < 0 (a failing candidate)."""

    def fit(self, X, y, sample_weight=None):
        if self.alpha < 0:
            raise ValueError("negative alpha")
        return super().fit(X, y, sample_weight=sample_weight)


class Averaged(gn.CompositeRegressor):
    def __init__(self, first=None, second=None):
        self.first, self.second = first, second

    def network(self, X, y):
        a = gn.machine(self.first, X, y)
        b = gn.machine(self.second, X, y)
        return gn.mean(a.predict(X), b.predict(X))


def _pop_fits(dask_worker):
    return dask_worker.__dict__.pop("_gn_test_fits", {})


def worker_fits(client):
    """``{worker address: {tag: fits}}`` since the last call (the counters reset)."""
    return client.run(_pop_fits)


@pytest.fixture
def client(gn_dask_client):
    gn_dask_client.wait_for_workers(2, timeout=60)
    worker_fits(gn_dask_client)   # counters of earlier tests: gone
    return gn_dask_client


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 5))
    y = X @ rng.normal(size=5) + 0.1 * rng.normal(size=120)
    return X, y


def _same_scores(ours, ref):
    for k, v in ref.cv_results_.items():
        if "score" in k and "time" not in k:
            np.testing.assert_array_equal(ours.cv_results_[k], v, err_msg=k)
    assert ours.best_params_ == ref.best_params_
    assert ours.best_index_ == ref.best_index_


@pytest.mark.parametrize("spec", ["dask", "executor"])
def test_same_results_as_serial_and_threads(client, data, spec):
    X, y = data
    est = Pipeline([("scale", StandardScaler()), ("pca", PCA(n_components=3)), ("ridge", Ridge())])
    grid = {"pca__n_components": [2, 3], "ridge__alpha": [0.1, 1.0, 10.0]}
    ex = "dask" if spec == "dask" else gn.DaskExecutor(client)
    ours = gn.GridSearchCV(est, grid, cv=4, executor=ex, return_train_score=True).fit(X, y)
    for ref_ex in ("serial", "threads"):
        ref = gn.GridSearchCV(est, grid, cv=4, executor=ref_ex, return_train_score=True).fit(X, y)
        _same_scores(ours, ref)
        assert ours.search_report_.fits == ref.search_report_.fits
    np.testing.assert_array_equal(ours.predict(X[:5]), ref.predict(X[:5]))


def test_shared_step_fitted_once_per_fold_on_one_worker(client, data):
    X, y = data
    est = Pipeline([("scale", WorkerCountedScaler()), ("ridge", Ridge())])
    grid = {"ridge__alpha": [0.01, 0.1, 1.0, 10.0], "ridge__fit_intercept": [True, False]}
    s = gn.GridSearchCV(est, grid, cv=5, executor=gn.DaskExecutor(client)).fit(X, y)
    counted = worker_fits(client)
    workers = set(client.scheduler_info()["workers"])
    # five scaler fits in all (one per fold, not one per candidate and fold), each on one worker
    assert sum(c.get("scale", 0) for c in counted.values()) == 5
    rep = s.search_report_
    assert rep.fits == {"scale": 5, "ridge": 40} and rep.naive == {"scale": 40, "ridge": 40}
    assert rep.ran == rep.fits                     # read from the trace: each fit task ran once
    for step, lanes in rep.where.items():
        assert set(lanes) <= workers               # it ran on the cluster's workers, not on the client
        assert sum(lanes.values()) == rep.ran[step]
    assert {a: c["scale"] for a, c in counted.items() if c.get("scale")} == rep.where["scale"]
    assert "ran  where" in repr(rep) and "on tcp://" in repr(rep)


def test_fit_parameters_and_failures_on_dask(client, data):
    X, y = data
    w = np.random.default_rng(1).uniform(0.5, 2.0, size=len(y))
    est = Pipeline([("scale", StandardScaler()), ("ridge", NegativeFails())])
    grid = {"ridge__alpha": [1.0, -1.0, 3.0]}
    runs = {}
    for ex in ("serial", gn.DaskExecutor(client)):
        with pytest.warns(FitFailedWarning, match="negative alpha"):
            runs[str(ex)] = gn.GridSearchCV(est, grid, cv=3, executor=ex).fit(X, y, ridge__sample_weight=w)
    serial, ours = runs.values()
    _same_scores(ours, serial)
    assert ours.search_report_.errors == {1: ({"ridge__alpha": -1.0}, "ValueError: negative alpha")}
    assert ours.search_report_.ran == {"scale": 3, "ridge": 9}
    with pytest.raises(ValueError, match="negative alpha"):
        gn.GridSearchCV(est, grid, cv=3, executor=gn.DaskExecutor(client), error_score="raise").fit(X, y)


def test_composite_machines_merged_on_dask(client, data):
    X, y = data
    est = Averaged(Ridge(), LinearRegression())
    grid = {"first__alpha": [0.1, 1.0, 10.0]}
    ours = gn.GridSearchCV(est, grid, cv=3, executor=gn.DaskExecutor(client)).fit(X, y)
    serial = gn.GridSearchCV(est, grid, cv=3, executor="serial").fit(X, y)
    _same_scores(ours, serial)
    assert ours.search_report_.fits == {"Ridge": 9, "LinearRegression": 3}
    assert ours.search_report_.ran == ours.search_report_.fits


def test_report_reads_the_fits_that_ran_on_every_executor(executor, data):
    X, y = data
    est = Pipeline([("scale", StandardScaler()), ("pca", PCA(n_components=2)), ("ridge", Ridge())])
    s = gn.GridSearchCV(est, {"ridge__alpha": [0.1, 1.0, 10.0]}, cv=3, executor=executor).fit(X, y)
    rep = s.search_report_
    assert rep.ran == rep.fits == {"scale": 3, "pca": 3, "ridge": 9}
    assert {k: sum(v.values()) for k, v in rep.where.items()} == rep.ran


def test_no_trace_no_ran(client, data):
    X, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no large-graph warning either
        with enabled(False):   # the network's tasks (a Ridge search otherwise takes the one-pass path)
            s = gn.GridSearchCV(Ridge(), {"alpha": [0.1, 1.0]}, cv=2,
                                executor=gn.DaskExecutor(client, trace=False)).fit(X, y)
    assert s.search_report_.fits == {"Ridge": 4}
    assert s.search_report_.ran is None and s.search_report_.where is None
    assert "where" not in repr(s.search_report_)


def test_equal_candidates_share_their_last_step(client, data):
    X, y = data
    est = Pipeline([("scale", StandardScaler()), ("ridge", Ridge())])
    grid = {"ridge__alpha": [1.0, 1.0, 2.0]}    # two equal candidates: one Ridge fit per fold for both
    ours = gn.GridSearchCV(est, grid, cv=3, executor=gn.DaskExecutor(client), return_train_score=True).fit(X, y)
    serial = gn.GridSearchCV(est, grid, cv=3, executor="serial", return_train_score=True).fit(X, y)
    _same_scores(ours, serial)
    assert ours.search_report_.fits == ours.search_report_.ran == {"scale": 3, "ridge": 6}
    times = ours.cv_results_["mean_fit_time"]
    assert times[0] == times[1] > 0


def test_fold_parameters_sent_once_per_fold(client):
    # sample weights are cut to each fold's rows: the graph holds them once per fold, not once per candidate
    import dask

    rng = np.random.default_rng(2)
    X = rng.normal(size=(6000, 2))
    y = X.sum(axis=1) + rng.normal(size=6000)
    w = rng.uniform(0.5, 2.0, size=6000)
    est = Pipeline([("scale", StandardScaler()), ("ridge", Ridge())])
    grid = {"ridge__alpha": list(np.logspace(-2, 2, 10))}   # 30 Ridge fits, 32 KB of weights each
    with dask.config.set({"distributed.admin.large-graph-warning-threshold": "600kB"}), warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*large graph.*")
        ours = gn.GridSearchCV(est, grid, cv=3, executor=gn.DaskExecutor(client)).fit(X, y, ridge__sample_weight=w)
    serial = gn.GridSearchCV(est, grid, cv=3, executor="serial").fit(X, y, ridge__sample_weight=w)
    _same_scores(ours, serial)


def test_a_search_is_few_large_tasks(executor, data):
    # per fold: 4 row selections, one task per upstream step, one per candidate (its fit and score); + collect
    X, y = data
    est = Pipeline([("scale", StandardScaler()), ("pca", PCA(n_components=2)), ("lasso", Lasso())])
    gn.GridSearchCV(est, {"lasso__alpha": [0.1, 1.0, 10.0]}, cv=3, executor=executor).fit(X, y)
    assert len(gn.last_trace().records) == 3 * (4 + 2 + 3) + 1
    # Ridges that differ only in alpha: one task fits and scores them together (gpunets.tuning.batched), and
    # a task per candidate picks its entry
    est = Pipeline([("scale", StandardScaler()), ("pca", PCA(n_components=2)), ("ridge", Ridge())])
    with enabled(False):   # the network path's tasks (this pipeline otherwise takes the one-pass path)
        s = gn.GridSearchCV(est, {"ridge__alpha": [0.1, 1.0, 10.0]}, cv=3, executor=executor).fit(X, y)
    assert len(gn.last_trace().records) == 3 * (4 + 2 + 1 + 3) + 1
    assert s.search_report_.batched == 9 and s.search_report_.ran == s.search_report_.fits


# ------------------------------------------------------------------------------------------
# a failing fit of any exception kind comes back (issue 35 item 7): never a hang
# ------------------------------------------------------------------------------------------
class TwoArgError(Exception):
    """An exception whose __init__ takes an extra required argument: standard pickling cannot rebuild it."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


class LockedError(ValueError):
    """An exception carrying an unpicklable attribute."""

    def __init__(self, message):
        super().__init__(message)
        import threading

        self.lock = threading.Lock()


FAILURES = {
    "OSError": lambda: OSError(28, "No space left on device", "/tmp/x"),
    "MemoryError": lambda: MemoryError("cannot allocate 8 GiB"),
    "RuntimeError": lambda: RuntimeError("flaky resource"),
    "TwoArgError": lambda: TwoArgError("two-arg failure", 7),
    "LockedError": lambda: LockedError("locked failure"),
}


class RaisesKind(Ridge):
    """A Ridge whose fit raises ``FAILURES[kind]`` for alpha < 0."""

    def __init__(self, alpha=1.0, kind="OSError"):
        super().__init__(alpha=alpha)
        self.kind = kind

    def fit(self, X, y, sample_weight=None):
        if self.alpha < 0:
            raise FAILURES[self.kind]()
        return super().fit(X, y, sample_weight=sample_weight)


class _Hung(BaseException):
    pass


class no_hang:  # noqa: N801 - a context manager used like a function
    """Fail (instead of hanging the test session) if the block runs longer than ``seconds`` (SIGALRM)."""

    def __init__(self, seconds=90):
        self.seconds = seconds

    def _alarm(self, signum, frame):
        raise _Hung(f"hung for {self.seconds} s")

    def __enter__(self):
        import signal

        self._old = signal.signal(signal.SIGALRM, self._alarm)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        import signal

        signal.alarm(0)
        signal.signal(signal.SIGALRM, self._old)


def _check_failed_search(ex, kind, data):
    X, y = data
    est = Pipeline([("scale", StandardScaler()), ("ridge", RaisesKind(kind=kind))])
    grid = {"ridge__alpha": [1.0, -1.0]}
    message = str(FAILURES[kind]())
    with no_hang():
        with pytest.warns(FitFailedWarning, match=kind):
            ours = gn.GridSearchCV(est, grid, cv=3, executor=ex).fit(X, y)
        with pytest.raises(Exception) as info:
            gn.GridSearchCV(est, grid, cv=3, executor=ex, error_score="raise").fit(X, y)
    with pytest.warns(FitFailedWarning):
        serial = gn.GridSearchCV(est, grid, cv=3, executor="serial").fit(X, y)
    _same_scores(ours, serial)
    assert np.isnan(ours.cv_results_["mean_test_score"][1])
    err = info.value
    if type(err).__name__ == kind:                 # rebuilt as raised: class, message, attributes
        assert str(err) == message
        if kind == "OSError":
            assert (err.errno, err.filename) == (28, "/tmp/x")
        if kind == "TwoArgError":
            assert err.code == 7
    else:                                          # cannot travel as itself: a gn error naming it
        assert kind == "LockedError" and getattr(ex, "name", ex) == "dask"
        assert isinstance(err, gn.EvaluationError) and isinstance(err, ValueError)
        assert f"LockedError({message!r})" in str(err) and "in fit" in str(err)


@pytest.mark.parametrize("kind", list(FAILURES))
def test_failed_fit_of_any_kind_comes_back_from_a_dask_search(client, data, kind):
    _check_failed_search(gn.DaskExecutor(client), kind, data)


@pytest.mark.parametrize("kind", list(FAILURES))
def test_failed_fit_of_any_kind_in_a_search_on_every_executor(executor, data, kind):
    _check_failed_search(executor, kind, data)


def test_halving_search_with_an_oserror_on_dask(client, data):
    from sklearn.experimental import enable_halving_search_cv  # noqa: F401

    X, y = data
    est = Pipeline([("scale", StandardScaler()), ("ridge", RaisesKind(kind="OSError"))])
    grid = {"ridge__alpha": [1.0, -1.0, 2.0, 3.0]}
    with no_hang(), pytest.warns(FitFailedWarning, match="OSError"):
        s = gn.HalvingGridSearchCV(est, grid, cv=2, executor=gn.DaskExecutor(client), min_resources=30,
                                   random_state=0).fit(X, y)
    assert s.best_params_["ridge__alpha"] != -1.0

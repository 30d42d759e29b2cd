"""The store of fitted states on Dask (issue 26): workers that share the store's folder read and write entries
themselves (the client sends keys, not states); where they do not, the store stays the client's.  Networks and
searches: a search run again fits nothing, a widened grid only the new candidates, a stopped one what was left."""

import os
import pickle
import sys
import time

import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.linear_model import Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import gpunets as gn
from gpunets.devices import store as store_mod

pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")
from gpunets.executors import _dask_store  # noqa: E402
from gpunets.executors.dask import DaskExecutor  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])   # the workers cannot import this module


def _net():
    rng = np.random.default_rng(0)
    X, y = gn.source(rng.normal(size=(120, 6)), name="X"), gn.source(rng.normal(size=120), name="y")
    Z = gn.machine(StandardScaler(), X).transform(X)
    P = gn.machine(PCA(3), Z).transform(Z)
    return gn.machine(Ridge(), P, y).predict(P)


@pytest.fixture
def expected():
    net = _net()
    net.fit(executor="serial")
    return net()


@pytest.mark.parametrize("share", [True, False])
def test_workers_that_share_the_store_read_and_write_it(gn_dask_client, tmp_path, monkeypatch, expected, share):
    store = gn.Store(tmp_path / "s")
    ex = DaskExecutor(gn_dask_client)
    where = (gn_dask_client.scheduler.address, store.path)
    if not share:   # as on a cluster whose workers do not see the folder
        monkeypatch.setitem(_dask_store._SHARED, where, False)
    sent = []
    real = _dask_store.worker_functions
    monkeypatch.setattr("gpunets.executors.dask.worker_functions",
                        lambda tasks, s: sent.append(out := real(tasks, s)) or out)
    with gn.config(store=store):
        first = _net()
        assert set(first.fit(executor=ex).actions.by_label().values()) == {"train"}
        assert _dask_store.shared(gn_dask_client, store) is share   # a LocalCluster sees the folder
        assert gn.store_info().entries == 3
        # shared: the workers wrote the entries (the client wrote none, fetched none); else the client did
        assert store.writes == (0 if share else 3)
        again = _net()
        report = again.fit(executor=ex)
        assert report.actions.by_label() == {"StandardScaler": "stored", "PCA": "stored", "Ridge": "stored"}
        loads = {type(f.func).__name__ if not hasattr(f.func, "__name__") else f.func.__name__
                 for f in sent[-1].values()}
        if share:
            assert loads == {"load_on_worker"}   # the loads went to the workers as keys
        np.testing.assert_array_equal(again(executor=ex), expected)
        np.testing.assert_array_equal(first(executor=ex), expected)


def test_workers_that_do_not_see_the_folder_are_said_once(tmp_path, caplog):
    class Blind:   # a client whose one worker does not see the marker
        class scheduler:
            address = f"tcp://blind-{tmp_path.name}:1"

        def run(self, fn, *args, **kw):
            return {"tcp://w:2": False}

    store = gn.Store(tmp_path / "b")
    with caplog.at_level("INFO", logger="gpunets"):
        assert _dask_store.shared(Blind(), store) is False and _dask_store.shared(Blind(), store) is False
    said = [r.getMessage() for r in caplog.records if "do not all see the store" in r.getMessage()]
    assert len(said) == 1 and store.path in said[0] and "client's only" in said[0]


def test_the_marker_is_asked_once_per_cluster_and_removed(gn_dask_client, tmp_path):
    store = gn.Store(tmp_path / "m")
    assert _dask_store.shared(gn_dask_client, store) is True
    assert not any(p.name.startswith(".gpunets-shared-") for p in (tmp_path / "m").iterdir())
    calls = []
    real = gn_dask_client.run
    gn_dask_client.run = lambda *a, **k: calls.append(a) or real(*a, **k)
    try:
        assert _dask_store.shared(gn_dask_client, store) is True and calls == []
    finally:
        del gn_dask_client.run


# --- searches ----------------------------------------------------------------------------------------

TRAP = None   # a file: while it exists, Ridge(alpha=10.0) stops its task (as Ctrl-C or a lost worker would)


class Stopped(BaseException):
    """Not an Exception: the search's tasks do not catch it, so the Dask run fails."""


class TrapRidge(Ridge):
    def fit(self, X, y, sample_weight=None):
        if self.alpha == 10.0 and TRAP is not None and os.path.exists(TRAP):
            time.sleep(1.0)   # the other tasks finish first
            raise Stopped("stopped")
        return super().fit(X, y, sample_weight=sample_weight)


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(300, 10)), rng.normal(size=300)


def _search(alphas, executor, ridge=Ridge):
    return gn.GridSearchCV(make_pipeline(StandardScaler(), PCA(4), ridge()), {f"{ridge.__name__.lower()}__alpha": alphas},
                           cv=3, executor=executor, refit=False)


def _same_scores(ours, ref):
    for k, v in ref.cv_results_.items():
        if "score" in k and "time" not in k:
            np.testing.assert_array_equal(ours.cv_results_[k], v, err_msg=k)


def _results(store):
    """The (candidate, fold) results on disk (the step fits are estimators)."""
    out = []
    for root, _, files in os.walk(store.path):
        for f in files:
            if f.endswith(".gnst"):
                with open(os.path.join(root, f), "rb") as fh:
                    out += [1] if isinstance(pickle.loads(store_mod._decode(fh.read())), dict) else []
    return len(out)


@pytest.fixture(scope="module")
def reference():
    X, y = _data()
    return _search([0.1, 1.0, 10.0], "serial").fit(X, y)   # no store


@pytest.mark.parametrize("share", [True, False])
def test_a_search_on_dask_again_fits_nothing_and_a_wider_grid_only_the_new(gn_dask_client, tmp_path, monkeypatch,
                                                                           reference, share):
    X, y = _data()
    store = gn.Store(tmp_path / "s")
    ex = DaskExecutor(gn_dask_client)
    if not share:   # as on a cluster whose workers do not see the folder: the client's store only
        monkeypatch.setitem(_dask_store._SHARED, (gn_dask_client.scheduler.address, store.path), False)
    with gn.config(store=store):
        first = _search([0.1, 1.0], ex).fit(X, y).search_report_
        assert first.fitted == 3 + 3 + 6 and first.stored == 0
        assert first.ran == first.fits == {"standardscaler": 3, "pca": 3, "ridge": 6}   # the trace reads the tasks
        # shared: the workers wrote every step fit and result (the client none); else the client its results only
        assert gn.store_info().entries == (12 + 6 if share else 6) and _results(store) == 6
        assert store.writes == (0 if share else 6)
        again = _search([0.1, 1.0], ex).fit(X, y)   # a new search object: every result from the store
        assert again.search_report_.fitted == 0 and again.search_report_.remembered == 6
        wide = _search([0.1, 1.0, 10.0], ex).fit(X, y)
        rep = wide.search_report_
        assert rep.remembered == 6
        if share:   # the new alpha's Ridge in each fold; the scaler and the PCA of each fold loaded on the workers
            assert (rep.fitted - sum(rep.again.values()), rep.stored) == (3, 6)   # (PCAs fitted again for output)
        else:       # the workers have no store: the new candidate's steps fit in each fold
            assert (rep.fitted, rep.stored) == (3 + 3 + 3, 0)
        assert _results(store) == 9
    _same_scores(wide, reference)   # results with the store equal results without it
    np.testing.assert_array_equal(again.cv_results_["mean_test_score"], reference.cv_results_["mean_test_score"][:2])


def _idle(client, timeout=20.0):
    """Wait until no task runs on the cluster (a task released by a failed run may still finish and write)."""
    end = time.monotonic() + timeout
    while any(client.processing().values()) and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(0.5)   # a task forgotten by the scheduler while it ran finishes on its worker (milliseconds here)


def test_a_stopped_search_on_dask_fits_only_what_was_left(gn_dask_client, tmp_path, monkeypatch, reference):
    X, y = _data()
    store = gn.Store(tmp_path / "s")
    trap = tmp_path / "trap"
    trap.write_text("")
    monkeypatch.setattr(sys.modules[__name__], "TRAP", str(trap))
    with gn.config(store=store):
        with pytest.raises(BaseException, match="stopped"):   # whatever Dask wraps it in
            _search([0.1, 1.0, 10.0], DaskExecutor(gn_dask_client, retries=0), TrapRidge).fit(X, y)
        _idle(gn_dask_client)
        kept, results = gn.store_info().entries, _results(store)
        assert kept >= 2 and results <= 6   # the steps that finished (a fold's scaler and PCA at least)
        trap.unlink()
        again = _search([0.1, 1.0, 10.0], DaskExecutor(gn_dask_client), TrapRidge).fit(X, y)
        rep = again.search_report_
        assert rep.remembered == results                       # no (candidate, fold) scored twice
        assert 3 <= rep.fitted < 3 + 3 + 9                     # the stopped Ridges, and only what was left
        # every entry written once: the run wrote the step fits it fitted and the results it scored
        assert gn.store_info().entries - kept == rep.fitted + 9 - results
        assert gn.store_info().entries == 3 + 3 + 9 + 9
        third = _search([0.1, 1.0, 10.0], DaskExecutor(gn_dask_client), TrapRidge).fit(X, y)
        assert third.search_report_.fitted == 0 and third.search_report_.remembered == 9
    _same_scores(again, reference)

"""The Dask executor: equality with serial, what moves over the network, placement, faults.

One module-scoped ``LocalCluster`` (2 worker processes, 1 thread each) serves every test
but the one that checks that ``executor="dask"`` starts and closes its own cluster.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")

import dask  # noqa: E402
from sklearn.base import BaseEstimator, RegressorMixin  # noqa: E402
from sklearn.linear_model import LinearRegression, Ridge  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

import gpunets as gn  # noqa: E402
from gpunets.executors import _dask_state  # noqa: E402
from gpunets.executors import dask as gdask  # noqa: E402
from gpunets.executors.dask import DaskExecutor  # noqa: E402
from gpunets.testing import assert_allclose_any  # noqa: E402

pytestmark = pytest.mark.dask

# Workers cannot import this test module: ship its classes and functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

HAS_KERNELS = importlib.util.find_spec("gpunets.kernels") is not None


def gn_fake_gpus():
    from gpunets.devices import _gpulibs

    return _gpulibs.fake_gpu_count()


# ------------------------------------------------------------------------------------------
# fixtures and models
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster_client():
    # one retry on a worker death, so the "always dies" test is quick
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           host="127.0.0.1", dashboard_address="127.0.0.1:0")
        client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.fixture
def client(cluster_client):
    cluster_client.wait_for_workers(2, timeout=60)  # a killed worker is restarted by its nanny
    return cluster_client


class Spy:
    """Count calls of a client's methods (scatter, get, submit, compute, run)."""

    def __init__(self, client, monkeypatch):
        self.calls: dict[str, list] = {}
        for name in ("scatter", "get", "submit", "compute", "map", "run"):
            orig = getattr(client, name)
            monkeypatch.setattr(client, name, self._wrap(name, orig))

    def _wrap(self, name, orig):
        def wrapper(*a, **kw):
            self.calls.setdefault(name, []).append((a, kw))
            return orig(*a, **kw)
        return wrapper

    def n(self, name=None):
        if name is None:
            return sum(len(v) for v in self.calls.values())
        return len(self.calls.get(name, []))


def _cols(a, b):
    return np.column_stack([a, b])


def _avg(a, b):
    return (np.asarray(a) + np.asarray(b)) / 2


def network(seed=0, n=120):
    rng = np.random.default_rng(seed)
    Xd = rng.normal(size=(n, 4))
    yd = Xd @ np.array([1.0, -2.0, 0.5, 3.0]) + rng.normal(scale=0.1, size=n)
    X = gn.source(Xd, name="X")
    y = gn.source(yd, name="y")
    scale = gn.machine(StandardScaler(), X)
    W = scale.transform(X)
    ridge = gn.machine(Ridge(alpha=0.5), W, y)
    ols = gn.machine(LinearRegression(), W, y)
    p1, p2 = ridge.predict(W), ols.predict(W)
    yhat = gn.mean(p1, p2) if HAS_KERNELS else gn.node(_avg, p1, p2, name="avg")
    return yhat, {"scale": scale, "ridge": ridge, "ols": ols}


class KillOnce(BaseEstimator, RegressorMixin):
    """Kills its worker process the first time it is fitted (a marker file remembers)."""

    def __init__(self, marker="", always=False):
        self.marker = marker
        self.always = always

    def fit(self, X, y):
        if self.always or not os.path.exists(self.marker):
            if self.marker:
                open(self.marker, "w").close()
            os._exit(1)
        self.mean_ = float(np.mean(y))
        return self

    def predict(self, X):
        return np.full(len(X), self.mean_)


class FailOnce(BaseEstimator, RegressorMixin):
    """Raises the first time it is fitted."""

    def __init__(self, marker=""):
        self.marker = marker

    def fit(self, X, y):
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            raise RuntimeError("transient failure")
        self.mean_ = float(np.mean(y))
        return self

    def predict(self, X):
        return np.full(len(X), self.mean_)


class _AlwaysFails(BaseEstimator, RegressorMixin):
    def fit(self, X, y):
        raise RuntimeError("planted failure")

    def predict(self, X):
        return np.zeros(len(X))


class Locky(BaseEstimator, RegressorMixin):
    """Holds a lock, so it cannot be pickled."""

    def __init__(self, alpha=1.0):
        self.alpha = alpha
        self._lock = threading.Lock()

    def fit(self, X, y):
        self.mean_ = float(np.mean(y))
        return self

    def predict(self, X):
        return np.full(len(X), self.mean_)


class Sleepy(BaseEstimator, RegressorMixin):
    def __init__(self, seconds=1.0):
        self.seconds = seconds

    def fit(self, X, y):
        time.sleep(self.seconds)
        self.mean_ = 0.0
        return self

    def predict(self, X):
        return np.zeros(len(X))


def _xy(n=40, seed=1):
    rng = np.random.default_rng(seed)
    return gn.source(rng.normal(size=(n, 3)), name="X"), gn.source(rng.normal(size=n), name="y")


def _walk(obj):
    if isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _walk(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _walk(o)
    else:
        yield obj


# ------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------
def test_fit_equals_serial_and_predicts_locally(client):
    ref, ref_m = network()
    ref.fit(executor="serial")
    yhat, ms = network()
    report = yhat.fit(executor=DaskExecutor(client))
    assert dict(report.actions.by_label()) == {"StandardScaler": "train", "Ridge": "train",
                                                "LinearRegression": "train"}
    for name in ms:
        assert ms[name].is_fitted
    assert_allclose_any(ms["ridge"].estimator_.coef_, ref_m["ridge"].estimator_.coef_, rtol=1e-7)
    assert_allclose_any(ms["ols"].estimator_.coef_, ref_m["ols"].estimator_.coef_, rtol=1e-7)
    # fitted on Dask, predicts locally afterwards
    Xnew = np.random.default_rng(5).normal(size=(7, 4))
    np.testing.assert_allclose(yhat(Xnew, executor="serial"), ref(Xnew, executor="serial"))
    # and on Dask
    np.testing.assert_allclose(yhat(Xnew, executor=DaskExecutor(client)), ref(Xnew, executor="serial"))
    np.testing.assert_allclose(yhat(executor="dask"), ref(executor="serial"))   # the default client


def test_trace_has_one_record_per_task_with_worker_lanes(client):
    yhat, _ = network()
    yhat.fit(executor=DaskExecutor(client))
    trace = gn.last_trace()
    assert trace.executor == "dask"
    assert sorted(r.label for r in trace.records if r.kind == "fit") == [
        "fit LinearRegression", "fit Ridge", "fit StandardScaler"]
    # 3 fits + the scaler's transform (+ the sources' moves to the device where a GPU plan places them)
    assert len([r for r in trace.records if r.kind != "move"]) == 4
    workers = set(client.scheduler_info()["workers"])
    assert set(trace.lanes()) <= workers
    assert all(r.end >= r.start >= 0 for r in trace.records)


def test_second_fit_skips_and_touches_nothing(client, monkeypatch):
    yhat, ms = network()
    ex = DaskExecutor(client)
    yhat.fit(executor=ex)
    spy = Spy(client, monkeypatch)
    monkeypatch.setattr(gdask, "_default_client", lambda: pytest.fail("the cluster was looked up"))
    monkeypatch.setattr(DaskExecutor, "_start_cluster", lambda self: pytest.fail("a cluster was started"))
    report = yhat.fit(executor=ex)
    assert set(report.actions.by_label().values()) == {"skip"}
    assert spy.n() == 0
    report = yhat.fit(executor="dask")   # no client given: still nothing looked up or started
    assert set(report.actions.by_label().values()) == {"skip"}
    # changing one hyperparameter ships only that machine's fit
    ms["ridge"].model.alpha = 2.0
    monkeypatch.undo()
    spy = Spy(client, monkeypatch)
    report = yhat.fit(executor=ex)
    assert report.actions["Ridge"] == "update" and report.actions["LinearRegression"] == "skip"
    (graph_args, _), = spy.calls["get"]
    # two futures: Ridge's fit summary (gathered) and its fitted state's key (kept on the workers)
    assert sorted(k.split("-")[1] for k in graph_args[1]) == ["state", "summary"]


def test_sources_scattered_once_and_intermediates_stay(client, monkeypatch):
    yhat, _ = network()
    spy = Spy(client, monkeypatch)
    yhat.fit(executor=DaskExecutor(client))
    assert spy.n("scatter") == 1 and spy.n("submit") == 0 and spy.n("compute") == 0
    (scatter_args, _), = spy.calls["scatter"]
    assert len(scatter_args[0]) == 2                         # X and y, once each
    (get_args, _), = spy.calls["get"]
    graph, wanted = get_args[0], get_args[1]
    moves = sum(r.kind == "move" for r in gn.last_trace().records)   # on a GPU: the sources go to the device
    assert len(graph) == 4 + 2 * 3 + moves                   # 3 fits + 1 transform; a state and a summary per fit
    assert not any(isinstance(v, np.ndarray) for v in _walk(list(graph.values())))
    assert sorted(k.split("-")[1] for k in wanted) == ["state"] * 3 + ["summary"] * 3
    # an evaluation brings back only its output
    spy2 = Spy(client, monkeypatch)
    yhat(np.ones((3, 4)), executor=DaskExecutor(client))
    (get_args, _), = spy2.calls["get"]
    assert len(get_args[1]) == 1
    (scatter_args, _), = spy2.calls["scatter"]
    assert len(scatter_args[0]) == 1                         # the new X only


# ------------------------------------------------------------------------------------------
# fitted states stay on the workers
# ------------------------------------------------------------------------------------------
def _state_keys(client):
    return client.run_on_scheduler(
        lambda dask_scheduler: sorted(str(k) for k, ts in dask_scheduler.tasks.items()
                                      if str(k).startswith("gpunets-state") and ts.state == "memory"))


def _wait_for(pred, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.05)
    return pred()


def test_fitted_states_stay_on_the_workers_and_evaluations_send_no_model(client, monkeypatch):
    from sklearn.base import BaseEstimator as Est

    yhat, ms = network(n=4000)
    ex = DaskExecutor(client)
    yhat.fit(executor=ex)
    for m in ms.values():   # nothing fetched: each state is a key on the cluster, one per machine
        assert m._state.is_remote and not m._state.stored.fetched
    assert len(_state_keys(client)) == 3
    keys = {name: m._state.stored.key for name, m in ms.items()}
    spy = Spy(client, monkeypatch)
    Xnew = np.random.default_rng(3).normal(size=(50, 4))
    out = yhat(Xnew, executor=ex)
    (get_args, _), = spy.calls["get"]
    graph = get_args[0]
    import pickle

    assert not any(isinstance(v, Est) for v in _walk(list(graph.values())))
    assert len(pickle.dumps(graph)) < 20_000         # task descriptions only (the data went by scatter)
    (scatter_args, _), = spy.calls["scatter"]
    assert [np.shape(v) for v in scatter_args[0]] == [(50, 4)]   # only the new data
    assert not any(m._state.stored.fetched for m in ms.values())
    # the client gets a state when asked for it, once; results agree with a local evaluation
    assert set(ms["ridge"].fitted_params()) >= {"coef_", "intercept_"}
    assert ms["ridge"]._state.stored.fetched
    got = []   # fetched once, whichever thread asks first
    threads = [threading.Thread(target=lambda: got.append(ms["ols"].estimator_)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(g is got[0] for g in got)
    assert ms["scale"].report()["trained"] and not ms["scale"]._state.stored.fetched   # a report fetches nothing
    np.testing.assert_allclose(out, yhat(Xnew, executor="serial"))
    # a refit of one machine changes only its key; the old one is released
    ms["ridge"].model.alpha = 3.0
    yhat.fit(executor=ex)
    assert ms["ridge"]._state.stored.key != keys["ridge"]
    assert ms["scale"]._state.stored.key == keys["scale"] and ms["ols"]._state.stored.key == keys["ols"]
    assert _wait_for(lambda: keys["ridge"] not in _state_keys(client))
    # pickling (gn.save) takes the estimators from the workers
    import pickle as pk

    copy = pk.loads(pk.dumps(yhat))
    np.testing.assert_allclose(copy(Xnew, executor="serial"), yhat(Xnew, executor="serial"))
    # closing the executor fetches the states and releases every key; the network stays usable
    ex.close()
    assert all(m._state.stored.fetched for m in ms.values())
    assert _wait_for(lambda: _state_keys(client) == [])
    np.testing.assert_allclose(yhat(Xnew, executor=DaskExecutor(client)), yhat(Xnew, executor="serial"))


def test_a_collected_machine_releases_its_state_key(client):
    import gc

    X, y = _xy()
    m = gn.machine(Ridge(), X, y)
    m.fit(executor=DaskExecutor(client))
    key = m._state.stored.key
    assert key in _state_keys(client)
    del m
    gc.collect()
    assert _wait_for(lambda: key not in _state_keys(client))


def _die():
    os._exit(1)


def test_state_lost_with_its_worker_is_rebuilt(client):
    yhat, ms = network()
    ex = DaskExecutor(client, timeout=60)
    yhat.fit(executor=ex)
    versions = {n: m._version for n, m in ms.items()}
    ref = yhat(executor="serial")   # fetches every state: the client copies are dropped below
    for m in ms.values():
        m._state.stored._local = _dask_state._MISSING
    where = client.who_has()[ms["scale"]._state.stored.key]
    client.run(_die, workers=list(where), on_error="ignore")
    assert _wait_for(lambda: not client.who_has().get(ms["scale"]._state.stored.key), 30)
    before = {n: m._state.stored.key for n, m in ms.items()}
    np.testing.assert_allclose(yhat(executor=ex), ref)      # rebuilt on the workers, no refit on the client
    assert {n: m._version for n, m in ms.items()} == versions
    # a rebuild computes under keys never used before (issue 23 item 11): not the old key, and not another
    # rebuild's (states of one fit share upstream tasks: each rebuild has its own suffix)
    rebuilt = {n: m._state.stored.key for n, m in ms.items() if m._state.stored.rebuilds}
    assert rebuilt and all(k != before[n] for n, k in rebuilt.items())
    suffixes = [k.rsplit("-r", 1)[1] for k in rebuilt.values()]
    assert len(set(suffixes)) == len(suffixes)
    assert not any(m._state.stored.lost for m in ms.values())
    report = yhat.fit(executor=ex)
    assert set(report.actions.by_label().values()) == {"skip"}


def test_state_lost_with_its_client_says_fit_again_and_retrains(client):
    X, y = _xy()
    m = gn.machine(Ridge(), X, y, name="lonely")
    with distributed.Client(client.scheduler.address, set_as_default=False) as other:
        m.fit(executor=DaskExecutor(other))
    with pytest.raises(gn.NotFittedError, match=r"lonely.*no longer available.*Fit the network again"):
        m.estimator_
    with pytest.raises(gn.EvaluationError, match=r"lonely"):
        m.predict(X)(executor=DaskExecutor(client))
    assert m.fit(executor=DaskExecutor(client)).actions["lonely"] == "train"
    assert m.predict(X)(executor="serial").shape == (40,)


def test_a_plan_of_sources_only_needs_no_cluster(monkeypatch):
    monkeypatch.setattr(gdask, "_default_client", lambda: pytest.fail("the cluster was looked up"))
    X = gn.source(np.arange(3.0), name="X")
    assert X(executor=DaskExecutor()).tolist() == [0.0, 1.0, 2.0]


# ------------------------------------------------------------------------------------------
# placement (CPU-only check of the mapping; the real one is test_gpu_placement)
# ------------------------------------------------------------------------------------------
def _set_visible(value):
    if value is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = value


def _first_visible(x):
    return os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0]


def test_cuda_tasks_run_on_the_worker_owning_the_gpu(client):
    addrs = sorted(client.scheduler_info()["workers"])
    for i, a in enumerate(addrs):   # pretend each worker owns one GPU, listed first (as dask-cuda does)
        client.run(_set_visible, f"{i},{1 - i}", workers=[a])
    try:
        assert gdask.gpu_owners(client) == {0: [addrs[0]], 1: [addrs[1]]}
        X = gn.source(np.ones(3), name="X")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nodes = [gn.node(_first_visible, X, device=f"cuda:{g}", name=f"on{g}") for g in (0, 1) * 3]
        ex = DaskExecutor(client)
        for g, nd in zip((0, 1) * 3, nodes):
            assert nd(executor=ex) == str(g)
        assert {r.lane for r in gn.last_trace().records} == {addrs[1]}
    finally:
        client.run(_set_visible, None)


# ------------------------------------------------------------------------------------------
# faults
# ------------------------------------------------------------------------------------------
def test_worker_killed_during_fit_is_retried(client, tmp_path):
    X, y = _xy()
    m = gn.machine(KillOnce(marker=str(tmp_path / "killed")), X, y)
    report = m.predict(X).fit(executor=DaskExecutor(client, timeout=60))
    assert report.actions["KillOnce"] == "train"
    assert (tmp_path / "killed").exists()
    assert m.is_fitted
    np.testing.assert_allclose(m.predict(X)(executor="serial"), np.mean(y.data))


def test_worker_always_killed_names_the_task_and_keeps_finished_state(client):
    X, y = _xy()
    first = gn.machine(Ridge(), X, y, name="first")
    # killer trains on first's output, so first has finished (and committed) before killer starts
    P = gn.node(_cols, first.predict(X), first.predict(X), name="P")
    killer = gn.machine(KillOnce(always=True), P, y, name="killer")
    t = time.perf_counter()
    with pytest.raises(gn.FitError, match="killer") as info:
        killer.predict(P).fit(executor=DaskExecutor(client, timeout=60))
    assert time.perf_counter() - t < 60
    assert "died" in str(info.value)
    assert first.is_fitted and not killer.is_fitted
    killer.model = Ridge()   # fixed: only killer retrains
    report = killer.predict(P).fit(executor=DaskExecutor(client))
    assert report.actions["first"] == "skip" and report.actions["killer"] == "train"


def test_a_quick_failure_keeps_the_fits_that_were_running(client):
    """issue 23 item 11: as on the other executors, where running tasks finish and commit, a sibling's quick
    failure on Dask does not discard a fit already running on a worker: it commits, and the next fit skips it."""
    X, y = _xy()
    slow = gn.machine(Sleepy(seconds=1.5), X, y, name="slow")
    bad = gn.machine(_AlwaysFails(), X, y, name="bad")
    out = gn.mean(slow.predict(X), bad.predict(X))
    with pytest.raises(gn.FitError, match="bad"):
        out.fit(executor=DaskExecutor(client))
    assert slow.is_fitted and not bad.is_fitted
    bad.model = Ridge()
    report = out.fit(executor=DaskExecutor(client))
    assert report.actions["slow"] == "skip" and report.actions["bad"] == "train"


def test_exceptions_are_retried_per_retries(client, tmp_path):
    X, y = _xy()
    m = gn.machine(FailOnce(marker=str(tmp_path / "a")), X, y)
    assert m.fit(executor=DaskExecutor(client, retries=1)).actions["FailOnce"] == "train"
    m2 = gn.machine(FailOnce(marker=str(tmp_path / "b")), X, y, name="fragile")
    with pytest.raises(gn.FitError, match="fragile.*transient failure") as info:
        m2.fit(executor=DaskExecutor(client, retries=0))
    assert isinstance(info.value, RuntimeError)
    assert not m2.is_fitted


def _orphans(dask_scheduler):
    # a run's key is an orphan unless it is a kept fitted state, or the released lineage of one
    # (tasks the scheduler remembers, holding no data, so that it can recompute a lost state)
    return sorted(str(k) for k, ts in dask_scheduler.tasks.items()
                  if "gpunets" in str(k) and not str(k).startswith("gpunets-state")
                  and (ts.state != "released" or not ts.dependents))


def _run_keys(client):
    """The keys of gpunets runs the scheduler still knows (fitted states and their lineage excepted)."""
    return client.run_on_scheduler(_orphans)


def _no_run_keys_left(client, seconds=10.0):
    deadline = time.monotonic() + seconds
    while _run_keys(client) and time.monotonic() < deadline:   # releases reach the scheduler asynchronously
        time.sleep(0.05)
    return _run_keys(client) == [] and not any("gpunets" in str(k) and not str(k).startswith("gpunets-state")
                                               for k, w in client.who_has().items() if w)


def test_failed_fit_leaves_the_users_other_futures_and_no_keys(client, caplog):
    import logging

    X, y = _xy()
    held = client.submit(lambda: 41, pure=False)
    assert held.result(timeout=30) == 41
    pending = client.submit(time.sleep, 1.0, pure=False)      # still running across the failed fit
    slow = gn.machine(Sleepy(seconds=0.5), X, y, name="slow")
    P = gn.node(_cols, slow.predict(X), slow.predict(X), name="P")   # an intermediate depending on a fit
    top = gn.machine(Ridge(), P, y, name="top")
    bad = gn.machine(_AlwaysFails(), X, y, name="bad")
    out = gn.node(_avg, top.predict(P), bad.predict(X))
    with caplog.at_level(logging.ERROR):
        with pytest.raises(gn.FitError, match="bad"):
            out.fit(executor=DaskExecutor(client, retries=0))
        assert held.result(timeout=30) == 41            # the user's futures are untouched ...
        assert pending.result(timeout=30) is None
        assert client.status == "running"
        assert _no_run_keys_left(client)               # ... and the run left no key behind
    crashes = [r for r in caplog.records if r.exc_info and r.name.startswith(("distributed.scheduler",
                                                                               "distributed.core", "asyncio"))]
    assert not crashes, [r.getMessage() for r in crashes]


def test_successful_fit_leaves_no_keys(client):
    yhat, _ = network()
    yhat.fit(executor=DaskExecutor(client), force=True)
    yhat(executor=DaskExecutor(client))
    assert _no_run_keys_left(client)


def test_timeout_does_not_leave_the_client_hanging(client):
    X, y = _xy()
    m = gn.machine(Sleepy(seconds=1.5), X, y, name="slow")
    t = time.perf_counter()
    with pytest.raises(gn.FitError, match=r"slow.*timeout") as info:
        m.fit(executor=DaskExecutor(client, timeout=0.3))
    assert time.perf_counter() - t < 1.4
    assert isinstance(info.value, TimeoutError)
    time.sleep(1.3)   # let the worker finish the cancelled sleep


def test_unpicklable_model_fails_before_anything_is_sent(client, monkeypatch):
    X, y = _xy()
    ok = gn.machine(Ridge(), X, y)
    bad = gn.machine(Locky(), X, y, name="locky")
    yhat = gn.node(_avg, ok.predict(X), bad.predict(X))
    spy = Spy(client, monkeypatch)
    with pytest.raises(gn.FitError, match=r"locky.*cannot be pickled.*Nothing was sent") as info:
        yhat.fit(executor=DaskExecutor(client))
    assert isinstance(info.value, TypeError)
    assert spy.n() == 0
    assert not ok.is_fitted and not bad.is_fitted
    # a machine fitted locally whose fitted estimator cannot be pickled: evaluation fails the same way
    bad.fit(executor="serial")
    with pytest.raises(gn.EvaluationError, match=r"locky.*cannot be pickled"):
        bad.predict(X)(executor=DaskExecutor(client))
    assert spy.n() == 0


# ------------------------------------------------------------------------------------------
# installation and the cluster's lifetime
# ------------------------------------------------------------------------------------------
def test_missing_dask_says_what_to_install(monkeypatch):
    from gpunets.executors import get_executor

    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(ImportError, match=r'pip install "gpunets\[dask\]"'):
        gn.DaskExecutor()
    with pytest.raises(ImportError, match=r'pip install "gpunets\[dask\]"'):
        get_executor("dask")
    X = gn.source(np.ones(2), name="X")
    with pytest.raises(ImportError, match=r"gpunets\[dask\]"):
        (X + 1)(executor="dask")


def test_import_gpunets_does_not_import_dask():
    code = ("import sys, gpunets, gpunets.executors; "
            "bad = [m for m in ('dask', 'distributed') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_executor_dask_without_client_starts_and_closes_a_local_cluster(monkeypatch):
    started = []
    orig = DaskExecutor._start_cluster

    def recording(self):
        out = orig(self)
        started.append(out)
        return out

    # as if no client existed, for distributed itself too (as_completed/wait look one up)
    monkeypatch.setattr(distributed.client, "_get_global_client", lambda: None)
    with pytest.raises(ValueError):
        distributed.default_client()
    monkeypatch.setattr(DaskExecutor, "_start_cluster", recording)
    yhat, ms = network()
    ref, _ = network()
    ref.fit(executor="serial")
    yhat.fit(executor="dask")
    assert len(started) == 1
    client, cluster = started[0]
    assert client.status == "closed"
    assert cluster.status.name == "closed"
    np.testing.assert_allclose(yhat(executor="serial"), ref(executor="serial"))


def _stack_network(executor):
    rng = np.random.default_rng(3)
    Xd = rng.normal(size=(90, 3))
    yd = Xd @ np.array([1.0, -1.0, 2.0]) + rng.normal(scale=0.1, size=90)
    X, y = gn.source(Xd, name="X"), gn.source(yd, name="y")
    stack = gn.StackingRegressor(estimators=[("ridge", Ridge(alpha=0.5)), ("ols", LinearRegression())],
                                 final_estimator=LinearRegression(), cv=3, executor=executor)
    return gn.machine(stack, X, y).predict(X)


def test_nested_dask_run_inside_a_dask_task_uses_the_workers_client(client):
    # the stacking model's own network runs with executor="dask" while the outer fit is itself a
    # task on a (one-thread) worker: it must use the worker's client and secede, not start a
    # cluster from a daemon process, and must not hang
    ref = _stack_network("serial")
    ref.fit(executor="serial")
    yhat = _stack_network("dask")
    yhat.fit(executor=DaskExecutor(client, timeout=120))
    np.testing.assert_allclose(yhat(executor="serial"), ref(executor="serial"), rtol=1e-10, atol=1e-10)


def test_repr_and_validation():
    with pytest.raises(ValueError, match="retries"):
        DaskExecutor(retries=-1)
    with pytest.raises(ValueError, match="timeout"):
        DaskExecutor(timeout=0)
    assert "LocalCluster(n_workers=3)" in repr(DaskExecutor(workers=3))


@pytest.mark.parametrize("kwargs, match, exc", [
    ({"timeout": "a"}, r"timeout='a'.*number of seconds", TypeError),
    ({"timeout": float("nan")}, r"timeout=nan.*positive, finite", ValueError),
    ({"timeout": True}, r"timeout=True", TypeError),
    ({"client": "x"}, r"client=.*the string 'x'.*distributed.Client.*tcp://", TypeError),
    ({"client": 3}, r"client=.*a int", TypeError),
    ({"workers": "2"}, r"workers='2'", ValueError),
    ({"keep_cluster": "no"}, r"keep_cluster='no'.*True or False", TypeError),
    ({"trace": 1}, r"trace=1.*True or False", TypeError),
    ({"cluster_kwargs": [("n_workers", 2)]}, r"cluster_kwargs=.*dict", TypeError),
    ({"security": "tls"}, r"security=.*a str.*distributed.Security.*Security.temporary\(\)", TypeError),
    ({"security": True}, r"security=.*a bool.*distributed.Security", TypeError),
    ({"cluster": "gpu"}, r"cluster='gpu'.*'local', 'cuda'", ValueError),
    ({"cluster": 2}, r"cluster=.*a int.*cluster object", TypeError),
    ({"rmm_pool_size": "1GB"}, r"rmm_pool_size='1GB'.*cluster='cuda' only", ValueError),
])
def test_bad_arguments_fail_at_construction(kwargs, match, exc):
    with pytest.raises(exc, match=match):
        DaskExecutor(**kwargs)


def test_executor_with_a_client_clones_and_pickles_as_its_address(client):
    import copy
    import pickle

    from sklearn.base import clone

    ex = DaskExecutor(client, retries=2, timeout=60)
    stack = gn.StackingRegressor([("a", Ridge()), ("b", Ridge(alpha=3.0))], cv=3, executor=ex)
    assert clone(stack).executor.client is client           # a copy uses the same cluster
    assert copy.deepcopy(ex).client is client
    again = pickle.loads(pickle.dumps(stack))                 # the live client cannot travel: its address does
    assert again.executor.client == client.scheduler.address
    assert (again.executor.retries, again.executor.timeout) == (2, 60)
    X, y = _xy(60)
    ref = stack.fit(X.data, y.data).predict(X.data)
    np.testing.assert_allclose(again.fit(X.data, y.data).predict(X.data), ref, rtol=1e-12)
    again.executor.close()   # the client it connected from the address (never the user's)
    assert client.status == "running"


def test_a_copy_uses_the_cluster_an_executor_keeps(client):
    import copy

    ex = DaskExecutor(keep_cluster=True)
    ex._own = (client, None)   # as after its first run: a LocalCluster it started and keeps
    twin = copy.deepcopy(ex)
    assert twin.client is client and twin._own is None   # uses it, does not own it (never closes it)
    ex._own = None


# ------------------------------------------------------------------------------------------
# real GPUs (dask-cuda): runs unchanged on a multi-GPU box
# ------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_evaluation_failure_leaves_the_users_futures_and_no_keys(client, caplog):
    import logging

    X, y = _xy()
    good = gn.machine(Ridge(), X, y, name="good")
    good.fit(executor=DaskExecutor(client))
    state_key = good._state.stored.key
    held = client.submit(lambda: 41, pure=False)
    assert held.result(timeout=30) == 41
    pending = client.submit(time.sleep, 1.0, pure=False)
    out = gn.node(_explode, good.predict(X), name="explode")
    with caplog.at_level(logging.ERROR):
        with pytest.raises(gn.EvaluationError, match="explode.*planted evaluation failure"):
            out(executor=DaskExecutor(client, retries=0))
        assert held.result(timeout=30) == 41 and pending.result(timeout=30) is None
        assert client.status == "running"
        assert _no_run_keys_left(client)
    assert state_key in _state_keys(client)          # the machine's kept state is untouched
    crashes = [r for r in caplog.records if r.exc_info and r.name.startswith(("distributed.scheduler",
                                                                               "distributed.core", "asyncio"))]
    assert not crashes, [r.getMessage() for r in crashes]
    np.testing.assert_allclose(good.predict(X)(executor=DaskExecutor(client)), good.predict(X)(executor="serial"))


def _explode(a):
    raise ValueError("planted evaluation failure")


def _listening_hosts(dask_scheduler):
    hosts = {dask_scheduler.listener.contact_address.split("://")[1].rsplit(":", 1)[0]}
    http = getattr(dask_scheduler, "http_server", None)
    for sock in (getattr(http, "_sockets", {}) or {}).values():
        hosts.add(sock.getsockname()[0])
    return sorted(hosts)


def test_a_cluster_it_starts_listens_on_loopback_only_and_takes_tls(monkeypatch):
    monkeypatch.setattr(distributed.client, "_get_global_client", lambda: None)   # as if no client existed
    X = gn.source(np.ones((4, 2)), name="X")
    with DaskExecutor(workers=1) as ex:
        assert (X + 1)(executor=ex).sum() == 16
        client = ex._own[0]
        assert _listening_hosts_of(client) == ["127.0.0.1"]
        assert all(a.startswith("tcp://127.0.0.1:") for a in client.scheduler_info()["workers"])
    pytest.importorskip("cryptography")
    with DaskExecutor(workers=1, security=distributed.Security.temporary()) as ex:
        assert (X + 1)(executor=ex).sum() == 16
        client = ex._own[0]
        assert client.scheduler.address.startswith("tls://127.0.0.1:")
        assert all(a.startswith("tls://127.0.0.1:") for a in client.scheduler_info()["workers"])
        assert _listening_hosts_of(client) == ["127.0.0.1"]


def _listening_hosts_of(client):
    return client.run_on_scheduler(_listening_hosts)


def test_closed_or_unreachable_client_is_a_clear_error():
    X = gn.source(np.ones(3), name="X")
    t = time.perf_counter()
    with pytest.raises(ConnectionError, match=r"tcp://127\.0\.0\.1:9 within 1"):
        (X + 1)(executor=DaskExecutor("tcp://127.0.0.1:9", timeout=1))
    assert time.perf_counter() - t < 10
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                       dashboard_address="127.0.0.1:0")
    closed = distributed.Client(cluster, set_as_default=False)
    address = cluster.scheduler_address
    ex = DaskExecutor(closed)
    closed.close()
    cluster.close()
    with pytest.raises(ConnectionError, match=f"scheduler at {address} is closed"):
        (X + 1)(executor=ex)


def test_an_executor_given_a_client_closed_before_names_its_address():
    """issue 23 item 18: a client made from an address and closed before the executor saw it."""
    X = gn.source(np.ones(3), name="X")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address="127.0.0.1:0") as cluster:
        address = cluster.scheduler_address
        client = distributed.Client(address, set_as_default=False)
        client.close()
        ex = DaskExecutor(client)
        with pytest.raises(ConnectionError, match=f"scheduler at {address} is closed"):
            (X + 1)(executor=ex)


def test_cuda_cluster_without_dask_cuda_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "dask_cuda", None)
    ex = DaskExecutor(cluster="cuda", rmm_pool_size="1GB")
    with pytest.raises(ImportError, match="pip install dask-cuda"):
        (gn.source(np.ones(2), name="X") + 1)(executor=ex)


@pytest.mark.skipif(gn_fake_gpus() < 2, reason="the fake-GPU lane with two devices (GPUNETS_FAKE_GPU=2)")
def test_two_fake_gpus_map_placements_to_their_workers():
    # one worker per GPU, as dask-cuda starts them: each lists its own GPU first in CUDA_VISIBLE_DEVICES
    workers = {f"gpu{i}": {"cls": distributed.Nanny, "options": {
        "nthreads": 1, "env": {"CUDA_VISIBLE_DEVICES": f"{i},{1 - i}", "GPUNETS_FAKE_GPU": "2"}}} for i in (0, 1)}
    scheduler = {"cls": distributed.Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": None}}
    with distributed.SpecCluster(workers=workers, scheduler=scheduler) as cluster:
        ex = DaskExecutor(cluster=cluster)
        try:
            X = gn.source(np.ones(3), name="X")
            for g in (0, 1, 1, 0):
                assert gn.node(_first_visible, X, device=f"cuda:{g}", name=f"on{g}")(executor=ex) == str(g)
            client = ex._own[0]
            owners = gdask.gpu_owners(client)
            assert sorted(owners) == [0, 1]
            Xd, yd = np.random.default_rng(0).normal(size=(64, 3)), np.random.default_rng(1).normal(size=64)
            Xs, ys = gn.source(Xd, name="X"), gn.source(yd, name="y")
            ms = [gn.machine(Ridge(), Xs, ys, device=f"cuda:{g}", name=f"ridge{g}") for g in (0, 1)]
            preds = [m.predict(Xs) for m in ms]
            gn.fit(*preds, executor=ex)
            lanes = {r.label: r.lane for r in gn.last_trace().records if r.kind == "fit"}
            assert lanes["fit ridge0"] in owners[0] and lanes["fit ridge1"] in owners[1]
            assert client.who_has()[ms[1]._state.stored.key][0] in owners[1]   # the state stays with its GPU
            # fetched to the client (whose current device is 0), a state comes back on the GPU it was fitted on:
            # CuPy unpickles onto the current device, so it is moved back where its record says (issue 24 item 7)
            for g, m in enumerate(ms):
                coef = m.estimator_.coef_
                assert m.report()["device"] == f"cuda:{g}" and coef.device.id == g
            # no worker owns GPU 1 any more: an error before any task is sent
            client.run(_set_visible, "0", workers=owners[1])
            ex._gpu_map = None
            with pytest.raises(gn.EvaluationError, match=r"cuda:1.*no worker of the Dask cluster owns GPU 1"):
                gn.node(_first_visible, X, device="cuda:1", name="on1")(executor=ex)
        finally:
            ex.close()


def test_gpu_placement_with_local_cuda_cluster():
    cupy = pytest.importorskip("cupy")
    dask_cuda = pytest.importorskip("dask_cuda")
    if not cupy.cuda.is_available():
        pytest.skip("no usable GPU")
    n_gpus = cupy.cuda.runtime.getDeviceCount()
    with dask_cuda.LocalCUDACluster() as cluster, distributed.Client(cluster) as client:
        owners = gdask.gpu_owners(client)
        assert sorted(owners) == list(range(n_gpus))
        X = gn.source(np.ones(3), name="X")
        ex = DaskExecutor(client)
        for g in range(n_gpus):
            nd = gn.node(_first_visible, X, device=f"cuda:{g}", name=f"on{g}")
            assert nd(executor=ex) == str(g)
            assert {r.lane for r in gn.last_trace().records} == set(owners[g])
        # fits placed on each GPU run on their owner
        Xd, yd = np.random.default_rng(0).normal(size=(64, 3)), np.random.default_rng(1).normal(size=64)
        Xs, ys = gn.source(Xd, name="X"), gn.source(yd, name="y")
        ms = [gn.machine(Ridge(), Xs, ys, device=f"cuda:{g}", name=f"ridge{g}") for g in range(n_gpus)]
        gn.fit(*[m.predict(Xs) for m in ms], executor=ex)
        lanes = {r.label: r.lane for r in gn.last_trace().records if r.kind == "fit"}
        for g in range(n_gpus):
            assert lanes[f"fit ridge{g}"] in owners[g]


# ------------------------------------------------------------------------------------------
# a fit raising any kind of exception stops the run, naming the machine (issue 35 item 7)
# ------------------------------------------------------------------------------------------
class _TwoArgError(Exception):
    def __init__(self, message, code):   # an extra required argument: pickle cannot rebuild it
        super().__init__(message)
        self.code = code


class _LockedError(ValueError):
    def __init__(self, message):   # an unpicklable attribute
        super().__init__(message)
        self.lock = threading.Lock()


_FAILURES = {
    "OSError": lambda: OSError(28, "No space left on device"),
    "MemoryError": lambda: MemoryError("cannot allocate 8 GiB"),
    "RuntimeError": lambda: RuntimeError("flaky resource"),
    "TwoArgError": lambda: _TwoArgError("two-arg failure", 7),
    "LockedError": lambda: _LockedError("locked failure"),
}


class _RaisesKind(BaseEstimator, RegressorMixin):
    def __init__(self, kind="OSError"):
        self.kind = kind

    def fit(self, X, y):
        raise _FAILURES[self.kind]()

    def predict(self, X):
        return np.zeros(len(X))


def _alarm(signum, frame):
    raise TimeoutError("the fit hung")


@pytest.mark.parametrize("kind", list(_FAILURES))
def test_a_fit_raising_any_exception_stops_the_run_naming_it(executor, kind):
    import signal

    X, y = _xy()
    first = gn.machine(Ridge(), X, y, name="first")
    P = gn.node(_cols, first.predict(X), first.predict(X), name="P")   # bad trains after first committed
    bad = gn.machine(_RaisesKind(kind=kind), P, y, name="bad")
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(90)
    try:
        with pytest.raises(gn.FitError, match=r"bad.*" + kind.split("Error")[0]) as info:
            bad.predict(P).fit(executor=executor)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert str(_FAILURES[kind]()).split("]")[-1].strip() in str(info.value)
    assert first.is_fitted and not bad.is_fitted
    bad.model = Ridge()   # fixed: only bad retrains
    report = bad.predict(P).fit(executor=executor)
    assert report.actions["first"] == "skip" and report.actions["bad"] == "train"

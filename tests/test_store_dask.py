"""The store of fitted states on Dask (issue 26): workers that share the store's folder read and write entries
themselves (the client sends keys, not states); where they do not, the store stays the client's."""

import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler

import gpunets as gn

pytest.importorskip("distributed")
from gpunets.executors import _dask_store  # noqa: E402
from gpunets.executors.dask import DaskExecutor  # noqa: E402


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

"""The cache of node outputs on the training data (issue 14, feature 4; MLJ's ``cache=true``)."""

import gc
import threading

import numpy as np
import pytest
from sklearn.linear_model import Ridge
from sklearn.preprocessing import PolynomialFeatures, StandardScaler

import gpunets as gn
from gpunets.devices.cache import NodeCache, digest, nbytes


def _is_dask(executor):
    return getattr(executor, "name", executor) == "dask"


def _cached_labels(trace):
    return [r.label for r in trace.records if r.label.endswith("(cached)")]


def _network(rng, n=40, cache=True):
    X = gn.source(rng.normal(size=(n, 3)), name="X")
    y = gn.source(rng.normal(size=n), name="y")
    poly = gn.machine(PolynomialFeatures(2), X, cache=cache)
    W = poly.transform(X)
    final = gn.machine(Ridge(alpha=1.0), W, y)
    return X, y, poly, W, final, final.predict(W)


@pytest.fixture(autouse=True)
def _empty_cache():
    gn.cache_clear()
    yield
    gn.cache_clear()


def test_refit_after_a_downstream_change_takes_the_upstream_output_from_the_cache(executor):
    rng = np.random.default_rng(0)
    X, y, poly, W, final, yhat = _network(rng)
    assert yhat.fit().actions.by_label() == {"PolynomialFeatures": "train", "Ridge": "train"}
    final.model.alpha = 5.0
    report = yhat.fit()
    assert report.actions.by_label() == {"PolynomialFeatures": "skip", "Ridge": "update"}
    info = gn.cache_info()
    if _is_dask(executor):   # off on Dask: the intermediate values stay on the workers
        assert _cached_labels(report.trace) == [] and info.hits == info.stores == 0
    else:
        assert _cached_labels(report.trace) == ["transform(PolynomialFeatures, X) (cached)"]
        assert info.hits == 1 and info.stores == 1 and info.entries == 1
        assert info.bytes == nbytes(W()) == 40 * 10 * 8
    # the same answer as a network without the cache
    _, _, _, _, final2, yhat2 = _network(np.random.default_rng(0), cache=False)
    final2.model.alpha = 5.0
    yhat2.fit()
    np.testing.assert_allclose(yhat(), yhat2())


def test_a_call_on_the_training_data_uses_the_cache(executor):
    X, y, poly, W, final, yhat = _network(np.random.default_rng(1))
    yhat.fit()
    first = yhat()
    r = gn.evaluate(yhat, trace=True)
    np.testing.assert_allclose(r.value, first)
    assert bool(_cached_labels(r.trace)) is not _is_dask(executor)
    # new data are never looked up: the cache holds outputs on the training data
    before = gn.cache_info()
    yhat(np.ones((2, 3)))
    assert (gn.cache_info().hits, gn.cache_info().misses) == (before.hits, before.misses)


@pytest.mark.parametrize("change", ["in_place", "retrain", "rows", "replace"])
def test_a_stale_entry_is_never_served(change):
    rng = np.random.default_rng(2)
    X, y, poly, W, final, yhat = _network(rng)
    yhat.fit(executor="serial")
    final.model.alpha = 3.0
    rows = None
    if change == "in_place":
        X.data *= 2.0                    # same object, new content
    elif change == "retrain":
        poly.model.degree = 3            # upstream machine updates: a new fitted estimator
    elif change == "rows":
        rows = np.arange(20)
    else:
        X.data = X.data + 1.0
    report = yhat.fit(executor="serial", rows=rows)
    assert _cached_labels(report.trace) == []
    Xd, yd = (X.data, y.data) if rows is None else (X.data[:20], y.data[:20])
    P = PolynomialFeatures(poly.model.degree).fit_transform(Xd)
    np.testing.assert_allclose(yhat(rows=rows), Ridge(alpha=3.0).fit(P, yd).predict(P))


def test_a_value_changed_in_place_by_its_reader_is_dropped_not_served():
    X = gn.source(np.arange(6.0).reshape(3, 2), name="X")
    scale = gn.machine(StandardScaler(), X, cache=True)
    W = scale.transform(X)
    W.fit(executor="serial")
    value = W(executor="serial")         # computed (a miss) and kept
    again = W(executor="serial")         # taken from the cache
    assert (gn.cache_info().misses, gn.cache_info().hits) == (1, 1)
    on_gpu = scale.report()["device"] != "cpu"
    # on the CPU the cached array itself is served; on a GPU the cache keeps the device value and each call
    # gets its own host copy, which a consumer may write into without reaching the cache
    assert (again is value) is not on_gpu
    value += 100.0                       # a consumer writes into what it was given
    fresh = W(executor="serial")
    assert fresh is not value and float(np.abs(fresh).max()) < 2.0
    assert gn.cache_info().misses == (1 if on_gpu else 2)   # the changed entry is dropped, never served


def test_machine_setting_wins_over_the_global_setting():
    rng = np.random.default_rng(3)
    with gn.config(cache=True):
        X, y, poly, W, final, yhat = _network(rng, cache=None)
        yhat.fit(executor="serial")
        final.model.alpha = 2.0
        assert _cached_labels(yhat.fit(executor="serial").trace) == ["transform(PolynomialFeatures, X) (cached)"]
        gn.cache_clear()
        _, _, _, _, final, yhat = _network(rng, cache=False)
        yhat.fit(executor="serial")
        final.model.alpha = 2.0
        assert _cached_labels(yhat.fit(executor="serial").trace) == []
        assert gn.cache_info().stores == 0
    # default: off
    _, _, _, _, final, yhat = _network(rng, cache=None)
    yhat.fit(executor="serial")
    assert gn.cache_info().stores == 0


def test_memory_is_bounded_by_the_byte_budget():
    rng = np.random.default_rng(4)
    with gn.config(cache_bytes=40 * 10 * 8 - 1):    # one output is 3,200 bytes: over the budget, not kept
        X, y, poly, W, final, yhat = _network(rng)
        yhat.fit(executor="serial")
        assert gn.cache_info().entries == 0 and gn.cache_info().stores == 0
    c = NodeCache()
    for i in range(5):
        assert c.put(digest(bytes([i])), np.zeros(10), budget=250)   # 80 bytes each: 3 fit
    info = c.info()
    assert (info.entries, info.bytes, info.evictions) == (3, 240, 2)
    assert c.get(digest(bytes([0]))) is None and c.get(digest(bytes([4]))) is not None
    c.get(digest(bytes([2])))          # the least recently used is now 3
    c.put(digest(b"new"), np.zeros(10), budget=250)
    assert c.get(digest(bytes([3]))) is None and c.get(digest(bytes([2]))) is not None


def test_entries_go_with_their_estimator():
    X = gn.source(np.arange(8.0).reshape(4, 2), name="X")
    scale = gn.machine(StandardScaler(), X, cache=True)
    W = scale.transform(X)
    W.fit(executor="serial")
    W(executor="serial")
    assert gn.cache_info().entries == 1
    scale.fit(executor="serial", force=True)   # the old fitted estimator is dropped
    gc.collect()
    assert gn.cache_info().entries == 0


def test_the_store_is_thread_safe():
    c = NodeCache()
    errors = []

    def work(seed):
        try:
            for i in range(300):
                k = digest(bytes([seed, i % 7]))
                if c.get(k) is None:
                    c.put(k, np.full(4, float(i % 7)), budget=600)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    info = c.info()
    assert not errors and info.bytes == 32 * info.entries <= 600


def test_a_composite_refit_after_a_final_hyperparameter_change_hits(executor):
    class Poly(gn.CompositeRegressor):
        def __init__(self, model=None, executor="auto"):
            self.model, self.executor = model, executor

        def network(self, X, y):
            W = gn.machine(PolynomialFeatures(2), X, cache=True).transform(X)
            return gn.machine(self.model or Ridge(), W, y).predict(W)

    rng = np.random.default_rng(5)
    Xd, yd = rng.normal(size=(30, 3)), rng.normal(size=30)
    comp = Poly(Ridge(alpha=1.0)).fit(Xd, yd)
    comp.set_params(model__alpha=4.0).fit(Xd, yd)
    assert comp.fit_report_.actions.by_label() == {"PolynomialFeatures": "skip", "model": "update"}
    assert bool(_cached_labels(comp.fit_report_.trace)) is not _is_dask(executor)
    np.testing.assert_allclose(comp.predict(Xd), Ridge(alpha=4.0).fit(
        PolynomialFeatures(2).fit_transform(Xd), yd).predict(PolynomialFeatures(2).fit_transform(Xd)))


def test_bad_settings_name_the_parameter():
    with pytest.raises(TypeError, match="cache='yes' must be True, False or None"):
        gn.machine(Ridge(), np.ones((2, 1)), np.ones(2), cache="yes")
    with pytest.raises(ValueError, match="cache_bytes=-1 must be a non-negative integer"):
        gn.set_config(cache_bytes=-1)
    with pytest.raises(TypeError, match="cache=1 must be True or False"):
        gn.config(cache=1)
    assert gn.get_config()["cache"] is False


def test_nbytes_of_frames_and_sparse():
    import pandas as pd
    import scipy.sparse as sp

    df = pd.DataFrame({"a": np.zeros(4), "b": np.ones(4)})
    assert nbytes(df) == int(df.memory_usage(index=True).sum())
    m = sp.random(10, 10, density=0.2, format="csr", random_state=0)
    assert nbytes(m) == m.data.nbytes + m.indices.nbytes + m.indptr.nbytes


def test_on_a_gpu_the_cache_holds_the_device_value_on_every_local_executor():
    """On the fake GPU (array-API dispatch on fake CuPy): the cached output is the device array itself."""
    import os
    import subprocess
    import sys

    code = r"""
import numpy as np, warnings, gpunets as gn
import gpunets.devices.fakegpu as fg
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler
rng = np.random.default_rng(0)
X, y = gn.source(rng.normal(size=(40, 3)), name="X"), gn.source(rng.normal(size=40), name="y")
with gn.device("cuda"):
    scale = gn.machine(StandardScaler(), X, cache=True)
    W = scale.transform(X)
    final = gn.machine(Ridge(solver="svd"), W, y)
    yhat = final.predict(W)
with warnings.catch_warnings():
    warnings.filterwarnings("error", message=".*falling back to CPU")
    for ex in ("serial", "threads", "streams"):
        gn.cache_clear()
        scale.fit(force=True, executor=ex)
        yhat.fit(executor=ex)
        final.model.alpha += 1.0
        report = yhat.fit(executor=ex)
        cached = [r for r in report.trace.records if r.label.endswith("(cached)")]
        assert [(r.label, r.device) for r in cached] == [("transform(StandardScaler, X) (cached)", "cuda:0")], ex
        value = W(executor=ex, output="device")
        assert type(value).__module__.startswith("gpunets.devices.fakegpu"), type(value)
        assert W(executor=ex, output="device") is value            # the device array itself, kept
        assert gn.cache_info().bytes == 40 * 3 * 8
        ref = Ridge(solver="svd", alpha=final.model.alpha).fit(StandardScaler().fit_transform(X.data), y.data)
        np.testing.assert_allclose(yhat(executor=ex), ref.predict(StandardScaler().fit_transform(X.data)),
                                   rtol=1e-6, atol=1e-8)
assert fg.implicit_conversions() == []
print("ok")
"""
    env = dict(os.environ, GPUNETS_FAKE_GPU="1", SCIPY_ARRAY_API="1", CUPY_CUDA_PER_THREAD_DEFAULT_STREAM="1",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok"]


def test_branches_store_concurrently_and_functions_between_keep_their_keys(executor):
    """Six caching branches behind arithmetic and a NumPy function: stored from worker threads, all hit."""
    rng = np.random.default_rng(6)
    X = gn.source(rng.normal(size=(50, 4)), name="X")
    y = gn.source(rng.normal(size=50), name="y")
    Z = gn.node(np.abs, X * 2.0 + 1.0)
    branches = [gn.machine(PolynomialFeatures(2 + i % 2), Z, cache=True, name=f"poly{i}").transform(Z)
                for i in range(6)]
    W = gn.hstack(*branches)
    final = gn.machine(Ridge(), W, y)
    yhat = final.predict(W)
    yhat.fit()
    first = yhat()
    final.model.alpha = 4.0
    report = yhat.fit()
    n = 0 if _is_dask(executor) else 6
    assert len(_cached_labels(report.trace)) == n
    assert gn.cache_info().hits >= n
    P = [PolynomialFeatures(2 + i % 2).fit_transform(np.abs(X.data * 2.0 + 1.0)) for i in range(6)]
    ref = Ridge(alpha=4.0).fit(np.hstack(P), y.data).predict(np.hstack(P))
    np.testing.assert_allclose(yhat(), ref)
    assert not np.allclose(first, ref)

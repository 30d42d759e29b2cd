"""Executors on a real GPU (marked ``gpu``: skipped without one, run unchanged by benchmarks/gpu_check.sh).

Only NumPy, scikit-learn, CuPy and numba-cuda are needed (no cuDF, cuML, dask or hypothesis), as on the GPU image.
"""

import threading

import numpy as np
import pytest

import gpunets as gn
from gpunets.executors import pool

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    cupy = pytest.importorskip("cupy")
    if not cupy.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return cupy


def _work(cp):
    def work(x, k):   # enough GPU work per branch that a missing wait or an early free would show
        w = x.T[:, : x.shape[1]]
        y = x
        for _ in range(3):
            y = cp.tanh(y @ w) * 0.5 + 0.01 * k
        return y
    return work


def _branches(cp, n=6, rows=2000, cols=256):
    work = _work(cp)
    Xg = cp.random.default_rng(0).standard_normal((rows, cols), dtype=cp.float32)
    with gn.device("cuda"):
        X = gn.source(Xg, name="X")
        branches = [gn.node(work, X, k, name=f"b{k}") for k in range(n)]
    return X, branches, work


@pytest.mark.parametrize("func", ["mean", "wmean", "weighted_sum", "var", "sum", "min", "max"])
def test_bool_kernels_compile_and_match_the_cpu(cp, func):
    from gpunets import kernels

    rng = np.random.default_rng(1)
    host = [rng.random(1000) < p for p in (0.2, 0.5, 0.7)]
    dev = [cp.asarray(a) for a in host]
    w = [0.5, 1.0, 2.0]
    call = {"mean": lambda a, t: kernels.mean(a, target=t), "wmean": lambda a, t: kernels.mean(a, w, target=t),
            "weighted_sum": lambda a, t: kernels.weighted_sum(a, w, target=t),
            "var": lambda a, t: kernels.var(a, target=t), "sum": lambda a, t: kernels.sum(a, target=t),
            "min": lambda a, t: kernels.min(a, target=t), "max": lambda a, t: kernels.max(a, target=t)}[func]
    got = call(dev, "cuda")
    assert isinstance(got, cp.ndarray)
    np.testing.assert_allclose(cp.asnumpy(got), call(host, "cpu"), rtol=1e-6)


@pytest.mark.filterwarnings("ignore")   # CPU fallbacks of models without a GPU route here are allowed
def test_stack_on_device_auto_equals_the_cpu_stack(cp):
    from sklearn.datasets import make_regression
    from sklearn.linear_model import Ridge

    X, y = make_regression(n_samples=300, n_features=8, noise=1.0, random_state=0)
    models = [("a", Ridge(alpha=1.0)), ("b", Ridge(alpha=10.0))]
    gpu = gn.StackingRegressor(models, device="auto").fit(X, y)
    cpu = gn.StackingRegressor(models, device="cpu").fit(X, y)
    pred = gpu.predict(X)
    pred = cp.asnumpy(pred) if isinstance(pred, cp.ndarray) else np.asarray(pred)
    np.testing.assert_allclose(pred, cpu.predict(X), rtol=1e-4, atol=1e-4)


def test_threads_and_serial_on_gpu_values_equal_streams(cp):
    X, branches, work = _branches(cp)
    out = gn.mean(*branches) + gn.node(work, branches[0], 9, name="tail")
    want = cp.asnumpy(out(executor=gn.StreamsExecutor(workers=4), output="device"))
    for ex, name in [(gn.ThreadsExecutor(workers=4), "threads (on CUDA streams)"),
                     (gn.SerialExecutor(), "serial (on CUDA streams)")]:
        for _ in range(3):
            ev = gn.evaluate(out, executor=ex, output="device", trace=True)
            assert ev.trace.executor == name
            np.testing.assert_allclose(cp.asnumpy(ev.value), want, rtol=1e-4, atol=1e-5)


def test_traced_gpu_run_records_gpu_time(cp):
    X, branches, _ = _branches(cp, n=4)
    ev = gn.evaluate(gn.mean(*branches), executor=gn.StreamsExecutor(workers=4), output="device", trace=True)
    gpu = [r for r in ev.trace.records if r.device.startswith("cuda")]
    assert gpu and all(r.issued is not None and r.end >= r.start for r in gpu)
    assert all(r.end >= r.issued[0] for r in gpu)   # the GPU finishes a task after the host issued it


@pytest.mark.parametrize("kind", ["ptds", "new"])
def test_twenty_streams_runs_grow_neither_threads_nor_the_pool(cp, kind):
    X, branches, _ = _branches(cp, n=6)
    out = gn.mean(*branches)
    ex = gn.StreamsExecutor(workers=6, stream=kind)
    mempool = cp.get_default_memory_pool()
    for _ in range(3):   # warm-up: workers made, kernels compiled, pool grown
        out(executor=ex, output="device")
    cp.cuda.Device().synchronize()
    threads, workers, held = threading.active_count(), pool.pool_threads(), mempool.total_bytes()
    want = cp.asnumpy(out(executor="serial", output="device"))
    for _ in range(20):
        got = out(executor=ex, output="device")
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-4, atol=1e-5)
    cp.cuda.Device().synchronize()
    assert threading.active_count() == threads and pool.pool_threads() == workers
    assert mempool.total_bytes() <= held * 1.1 + (1 << 20), (held, mempool.total_bytes())


@pytest.mark.parametrize("kind", ["ptds", "new"])
def test_early_release_stress_with_many_lanes(cp, kind):
    """Values read across lanes and released as soon as their last reader was issued: any early free
    (CuPy's pool handing the memory to another stream while a reader still runs) shows in the result."""
    work = _work(cp)
    Xg = cp.random.default_rng(2).standard_normal((1500, 384), dtype=cp.float32)
    n = 16
    with gn.device("cuda"):
        X = gn.source(Xg, name="X")
        base = [gn.node(work, X, k, name=f"base{k}") for k in range(n)]
        tails = [gn.node(lambda a, b, k: work(a, k) + b * 0.5, base[k], base[(k + 1) % n], k, name=f"tail{k}")
                 for k in range(n)]
        out = gn.mean(*tails)
    want = cp.asnumpy(out(executor="serial", output="device"))
    ex = gn.StreamsExecutor(workers=16, stream=kind)
    for _ in range(8):
        np.testing.assert_allclose(cp.asnumpy(out(executor=ex, output="device")), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("executor", ["serial", "streams"])
def test_search_on_cuda_equals_the_cpu_search(cp, executor):
    """gn.GridSearchCV on CuPy data, device="cuda" (array-API twins without cuML): the CPU search's results."""
    from sklearn.decomposition import PCA
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import KFold
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    from gpunets.compute.models import scipy_array_api_enabled

    if not scipy_array_api_enabled():
        pytest.skip("SCIPY_ARRAY_API=1 not set before scipy was imported")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 30)) @ rng.normal(size=(30, 30))
    y = X[:, :5].sum(axis=1) + rng.normal(size=3000)
    pipe = Pipeline([("scale", StandardScaler()), ("pca", PCA(n_components=10)), ("ridge", Ridge(solver="svd"))])
    grid = {"ridge__alpha": [0.01, 1.0, 100.0, 1e4]}
    cpu = gn.GridSearchCV(pipe, grid, cv=KFold(4), executor="serial").fit(X, y)
    gpu = gn.GridSearchCV(pipe, grid, cv=KFold(4), executor=executor, device="cuda").fit(cp.asarray(X), cp.asarray(y))
    for k in ["mean_test_score", "std_test_score"] + [f"split{i}_test_score" for i in range(4)]:
        np.testing.assert_allclose(gpu.cv_results_[k], cpu.cv_results_[k], rtol=0, atol=1e-8, err_msg=k)
    assert gpu.best_params_ == cpu.best_params_
    assert gpu.search_report_.fits == {"scale": 4, "pca": 4, "ridge": 16}
    import sklearn

    with sklearn.config_context(array_api_dispatch=True):   # the refit ran on the GPU: it predicts CuPy arrays
        pred = gpu.predict(cp.asarray(X[:5]))
    np.testing.assert_allclose(cp.asnumpy(pred), cpu.predict(X[:5]), rtol=1e-8, atol=1e-8)



def test_one_thread_issues_the_branches_and_the_trace_says_how_busy_the_gpu_was(cp):
    """Issue 36: on a GPU the non-blocking tasks of several lanes are issued by one thread, each onto its
    lane's stream; the values equal serial's; a traced run has GPU spans, host spans and a GPU-busy fraction."""
    X, branches, work = _branches(cp)
    out = gn.mean(*branches)
    want = cp.asnumpy(out(executor="serial", output="device"))
    ev = gn.evaluate(out, executor=gn.StreamsExecutor(workers=4), output="device", trace=True)
    np.testing.assert_allclose(cp.asnumpy(ev.value), want, rtol=1e-5, atol=1e-6)
    gpu = ev.trace.gpu_records()
    assert gpu and {r.thread.split(".")[0] for r in gpu} == {"gpunets-cuda-issue"}
    assert 0 < ev.trace.gpu_busy <= 1.0 + 1e-9
    assert ev.trace.gpu_summary().startswith("GPU busy")

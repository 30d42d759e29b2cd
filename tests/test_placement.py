"""Device placement in networks: fallback policy, moves as plan tasks, CPU fallback path, GPU equivalence."""


import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LinearRegression, Ridge
from sklearn.preprocessing import StandardScaler

import gpunets as gn
from gpunets.devices._gpulibs import fake_gpu_count as gn_fake_gpus
from gpunets.devices.placement import gpu_available
from gpunets.planning.placement import placed_reason
from gpunets.planning.plan import compile_call, compile_fit

no_gpu = pytest.mark.skipif(gpu_available(), reason="checks the behaviour where no GPU exists")


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 3))
    return X, X @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=50)


@no_gpu
def test_cuda_node_without_gpu_warns_once_and_runs_on_cpu(data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    m = gn.machine(Ridge(), Xs, ys, device="cuda")
    p = m.predict(Xs)
    with pytest.warns(gn.DeviceFallbackWarning, match=r"machine Ridge is placed on cuda:0.*running it on the CPU"):
        report = p.fit()
    assert report.where(m) == "cpu"
    assert report.rows()[0]["device"] == "cpu"
    np.testing.assert_allclose(p(), Ridge().fit(X, y).predict(X))


@no_gpu
def test_cuda_placement_without_gpu_raises_with_fallback_raise(data):
    X, y = data
    Xs = gn.source(X, name="X")
    with gn.device("cuda:0"):
        n = gn.node(np.abs, Xs, name="absolute")
    assert n.device == gn.Device("cuda:0")
    with gn.config(fallback="raise"):
        with pytest.raises(gn.DeviceUnavailableError, match=r"node absolute\(X\) is placed on cuda:0.*Place it on 'cpu'"):
            n()
    m = gn.machine(Ridge(), Xs, gn.source(y, name="y"), device="cuda:1")
    with gn.config(fallback="raise"), pytest.raises(gn.DeviceUnavailableError, match="machine Ridge"):
        m.fit()
    assert not m.is_fitted


def test_device_block_and_explicit_placement():
    with gn.device("cuda"):
        a = gn.source(np.ones(2), name="a") + 1
        b = gn.node(np.abs, a, device="cpu")
    assert a.device == gn.Device("cuda:0") and b.device == gn.Device("cpu")
    c = gn.source(np.ones(2), name="c") + 1
    assert c.device is None  # decided at fit/call time from the config default


def test_cpu_fallback_path_overrides_every_placement(data, recwarn):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    with gn.device("cuda"):
        m1 = gn.machine(Ridge(), Xs, ys)
        m2 = gn.machine(LinearRegression(), Xs, ys)
        out = gn.mean(m1.predict(Xs), m2.predict(Xs))
    report = out.fit(device="cpu")
    assert set(report.devices.values()) == {"cpu"}
    assert not [w for w in recwarn if issubclass(w.category, gn.DeviceFallbackWarning)]
    plan = compile_fit([out], force=True)
    assert all(t.kind != "move" for t in plan.tasks) or gpu_available()


def test_pandas_in_pandas_out_and_no_moves_on_cpu():
    df = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [0.5, 0.1, 0.2]}, index=[7, 8, 9])
    Xs = gn.source(df, name="X")
    scale = gn.machine(StandardScaler().set_output(transform="pandas"), Xs)
    W = scale.transform(Xs)
    W.fit(device="cpu")
    out = W(df.iloc[:2])
    assert isinstance(out, pd.DataFrame) and list(out.index) == [7, 8]
    plan = compile_call([W], {})
    assert [t.kind for t in plan.tasks] == ["source", "eval"]


def test_unplaceable_data_is_a_type_error_naming_the_source():
    with pytest.raises(TypeError, match=r"source 'X'.*Accepted: NumPy arrays"):
        gn.source([[1, 2], [3, 4]], name="X")
    X = gn.source(np.ones((2, 2)), name="X")
    with pytest.raises(TypeError, match=r"the data given for source 'X'"):
        (X + 1)(X={"a": 1})


@pytest.mark.gpu
def test_moves_are_plan_tasks_and_gpu_results_match_cpu(data):
    cp = pytest.importorskip("cupy")
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    with gn.device("cuda"):
        doubled = gn.node(lambda a: a * 2, Xs, name="double")
        tripled = gn.node(lambda a: a * 3, Xs, name="triple")
    out = gn.node(np.add, doubled, tripled, device="cpu")
    plan = compile_call([out], {})
    moves = [t for t in plan.tasks if t.kind == "move"]
    # X moves to the GPU once (shared by both nodes); each result moves back once
    assert sorted(t.device for t in moves) == ["cpu", "cpu", "cuda:0"]
    ev = gn.evaluate(out, trace=True, executor="streams")
    assert {r.kind for r in ev.trace.records} == {"eval", "move"}
    np.testing.assert_allclose(ev.value, 5 * X)
    assert isinstance(ev.value, np.ndarray)
    gpu_val = out(output="device")
    assert isinstance(gpu_val, np.ndarray)  # `out` is on the CPU
    assert isinstance(doubled(output="device"), cp.ndarray) and isinstance(doubled(), np.ndarray)


@pytest.mark.gpu
def test_assert_same_results_cpu_and_cuda(data):
    pytest.importorskip("cupy")
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    with gn.device("cuda"):
        a = gn.node(lambda v: v * 2.0, Xs)
        b = gn.node(lambda v: v + 1.0, Xs)
        out = gn.mean(a, b)
    res = gn.testing.assert_same_results(out, devices=["cpu", "cuda"], executors=["serial", "streams"], rtol=1e-6)
    assert ("cuda:0", "streams") in res or ("cuda", "streams") in res


def test_array_constants_of_operation_nodes_go_where_the_node_runs(data, executor):
    """``W @ np.ones(3)`` with W on a GPU: the NumPy constant moves to the node's device (CuPy refuses it as
    it is); on the CPU it is used as it is. Same answers on every device present."""
    X, y = data
    Xs = gn.source(X, name="X")
    W = gn.machine(StandardScaler(), Xs).transform(Xs)
    out = (W @ np.ones(3)) * np.linspace(1.0, 2.0, 50) + np.float64(0.5)
    expected = StandardScaler().fit_transform(X) @ np.ones(3) * np.linspace(1.0, 2.0, 50) + 0.5
    for dev in gn.testing.devices_present():
        out.fit(force=True, device=dev, executor=executor)
        with gn.device(dev):
            np.testing.assert_allclose(gn.testing._to_numpy(out()), expected, rtol=1e-12)


def _weights():
    return np.array([0.5, 2.0, 1.0])


def _host_only_sum(X, w):
    assert isinstance(X, np.ndarray) and isinstance(w, np.ndarray), (type(X), type(w))   # no device array
    return X @ w


def test_an_input_less_node_follows_its_consumers(data, executor):
    """issue 24 item 3: a node without inputs (a constant) is made on the host and moved once to each
    consumer's device; it never drags a CPU consumer to a GPU, where one is present (here, a fake one)."""
    X, _ = data
    lane = gn_fake_gpus()   # Dask's workers see the fake GPU only in the lane (set before they started)
    with gn.testing.fake_gpu(1):
        Xs = gn.source(X, name="X")
        w = gn.node(_weights, name="weights")
        host = gn.node(_host_only_sum, Xs, w)                          # its inputs are on the host: it runs there
        on_gpu = gn.node(np.multiply, gn.hstack(Xs, device="cuda"), w)  # a GPU consumer gets w on its device
        plan = compile_call([host, on_gpu], {})
        where = {t.label: t.device for t in plan.tasks if t.kind == "eval"}
        assert where["weights()"] == "cpu" and where["_host_only_sum(X, weights)"] == "cpu"
        assert where["multiply(hstack(X), weights)"] == "cuda:0"
        np.testing.assert_allclose(host(executor=executor), X @ _weights())
        if executor.name != "dask" or lane:
            got = on_gpu(executor=executor)
            np.testing.assert_allclose(gn.testing._to_numpy(got), X * _weights())


def test_a_cpu_search_with_fit_parameters_stays_on_the_cpu_where_a_gpu_is(data, executor):
    """issue 24 item 3: the search's own input-less nodes (its score parameters) go where its steps run."""
    import sklearn.model_selection as skms

    X, y = data
    w = np.random.default_rng(1).uniform(0.1, 3.0, size=len(y))
    theirs = skms.GridSearchCV(Ridge(), {"alpha": [0.1, 1.0]}, cv=3).fit(X, y, sample_weight=w)
    with gn.testing.fake_gpu(1) as cp:
        cp.reset_log()
        ours = gn.GridSearchCV(Ridge(), {"alpha": [0.1, 1.0]}, cv=3, device="cpu", executor=executor).fit(
            X, y, sample_weight=w)
        assert cp.implicit_conversions() == []
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"],
                               rtol=1e-12)


# ---- device="auto" follows the measured crossover (issue 36 item 7) ---------------------------------------------

def _placed_after(out, m, **fit):
    compile_fit([out], **fit)
    return placed_reason(m)


def _scaled_ridge(X, y, **ridge):
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    scale = gn.machine(StandardScaler(), Xs)
    W = scale.transform(Xs)
    ridge_m = gn.machine(Ridge(), W, ys, **ridge)
    return scale, ridge_m, ridge_m.predict(W)


def test_auto_placement_keeps_a_machine_below_its_crossover_on_the_cpu(data, executor):
    """A machine placed by default trains on the GPU only from the crossover rows of its kind; the report
    says why each machine went where it did. Same predictions either way."""
    X, y = data   # 50 rows
    lane = gn_fake_gpus()
    W = StandardScaler().fit_transform(X)
    expected = Ridge().fit(W, y).predict(W)
    gpu_paths = ("array_api", "cpu_fallback")   # cpu_fallback: without SCIPY_ARRAY_API=1 (outside the lane)
    with gn.testing.fake_gpu(1):
        for table, on_gpu, why, scale_why in [
                ({"Ridge": 51}, False, "auto: 50 rows < 51, the GPU crossover for Ridge",
                 "auto: a GPU is here (no crossover for StandardScaler)"),
                ({"Ridge": 50}, True, "auto: 50 rows >= 50, the GPU crossover for Ridge",
                 "auto: a GPU is here (no crossover for StandardScaler)"),
                ({"default": 10**6, "StandardScaler": 0}, False,
                 "auto: 50 rows < 1,000,000, the GPU crossover (default)",
                 "auto: 50 rows >= 0, the GPU crossover for StandardScaler")]:
            scale, ridge_m, out = _scaled_ridge(X, y)
            with gn.config(gpu_crossover=table):
                plan = compile_fit([out])
                assert placed_reason(ridge_m) == why and placed_reason(scale) == scale_why
                fit_dev = {str(t.device) for t in plan.tasks if t.kind == "fit" and t.machine is ridge_m}
                assert fit_dev == ({"cuda:0"} if on_gpu and lane else {"cuda:0", "cpu"} & fit_dev if on_gpu
                                   else {"cpu"}), fit_dev
                if executor.name == "dask" and not lane:
                    continue   # Dask's workers see the fake GPU only in the lane
                report = out.fit(executor=executor)
                row = {r["machine"]: r for r in report.rows()}["Ridge"]
                assert report.placed["Ridge"] == row["placed"] == why
                assert (row["path"] in gpu_paths) if on_gpu else (row["path"], row["device"]) == ("sklearn", "cpu")
                np.testing.assert_allclose(gn.testing._to_numpy(out(executor=executor)), expected, rtol=1e-10)


def test_a_placement_asked_for_ignores_the_crossover(data, executor):
    X, y = data
    with gn.testing.fake_gpu(1), gn.config(gpu_crossover={"default": 10**9}):
        _, ridge_m, out = _scaled_ridge(X, y, device="cuda")
        compile_fit([out])
        assert placed_reason(ridge_m) == "asked for cuda:0"   # 10^9 rows not reached: the GPU all the same
        with gn.device("cuda"):
            scale, ridge_m, out = _scaled_ridge(X, y)
        compile_fit([out])
        assert placed_reason(scale) == placed_reason(ridge_m) == "asked for cuda:0"
        with gn.config(device="cpu"):
            scale, ridge_m, out = _scaled_ridge(X, y)
            compile_fit([out])
        assert placed_reason(scale) == placed_reason(ridge_m) == "asked for cpu"


def test_the_crossover_counts_the_rows_a_fit_takes(data):
    X, y = data
    with gn.testing.fake_gpu(1), gn.config(gpu_crossover={"Ridge": 30}):
        _, ridge_m, out = _scaled_ridge(X, y)
        assert _placed_after(out, ridge_m, rows=np.arange(20)) == "auto: 20 rows < 30, the GPU crossover for Ridge"
        assert _placed_after(out, ridge_m, rows=np.arange(40)).startswith("auto: 40 rows >= 30")
        assert _placed_after(out, ridge_m, rows=slice(10, None, 2)).startswith("auto: 20 rows < 30")


def test_without_a_gpu_auto_says_so(data):
    X, y = data
    with gn.testing.no_gpu():
        _, ridge_m, out = _scaled_ridge(X, y)
        compile_fit([out])
        assert placed_reason(ridge_m) == "auto: no GPU here"
        report = out.fit()
        assert report.placed["Ridge"] == "auto: no GPU here" and report.where(ridge_m) == "cpu"


def test_the_shipped_table_applies_on_real_gpus_and_the_config_updates_it(monkeypatch):
    from gpunets.devices import _gpulibs
    from gpunets.planning import crossover

    monkeypatch.setattr(crossover, "MEASURED", {"Ridge": 100_000, "PCA": 50_000})
    monkeypatch.setattr(_gpulibs, "fake_gpu_count", lambda: 0)    # as on a real GPU
    assert crossover.table() == {"Ridge": 100_000, "PCA": 50_000}
    with gn.config(gpu_crossover={"Ridge": 0, "default": 7}):
        assert crossover.table() == {"Ridge": 0, "PCA": 50_000, "default": 7}
        assert crossover.decide("Ridge", 1, crossover.table())[0] is True
        assert crossover.decide("KNeighborsRegressor", 6, crossover.table()) == (
            False, "auto: 6 rows < 7, the GPU crossover (default)")
    monkeypatch.setattr(_gpulibs, "fake_gpu_count", lambda: 1)    # the fake GPU: the configured table alone
    assert crossover.table() == {}


@pytest.mark.parametrize("bad", [{"Ridge": -1}, {"Ridge": 1.5}, {"Ridge": True}, {"": 3}, [("Ridge", 3)], 5])
def test_a_bad_crossover_table_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match=r"gpu_crossover=.*estimator class name \(or 'default'\) to a row count"):
        gn.config(gpu_crossover=bad)
    with pytest.raises(ValueError, match="gpu_crossover"):
        gn.set_config(gpu_crossover=bad)
    assert gn.get_config()["gpu_crossover"] is None

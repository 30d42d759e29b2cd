"""The fake GPU (gpunets.devices.fakegpu, GPUNETS_FAKE_GPU) and data-driven placement of operation nodes.

These tests switch the fake on themselves (``gn.testing.fake_gpu``), so they run in every lane;
the fake-GPU lane (``GPUNETS_FAKE_GPU=1``) also runs the whole suite with it on.
"""

import os
import subprocess
import sys
import threading

import numpy as np
import pandas as pd
import pytest
from sklearn.ensemble import StackingClassifier as SkStackingClassifier
from sklearn.ensemble import StackingRegressor as SkStackingRegressor
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import KFold, StratifiedKFold
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

import gpunets as gn
from gpunets import StreamOrderError
from gpunets.devices._gpulibs import fake_gpu_count
from gpunets.devices.data import device_of, to_device
from gpunets.devices.placement import Device, gpu_available, gpu_count, host_only, resolve
from gpunets.testing import assert_allclose_any, fake_gpu

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


_LANE = os.environ.get("GPUNETS_FAKE_GPU")   # read at collection, before any fake_gpu() block sets it


def _needs_fake_on_the_workers(executor):
    """Dask runs tasks in worker processes, which see the fake GPU only through the environment (the lane
    sets GPUNETS_FAKE_GPU before they start); a fake turned on in this process alone stops at the client."""
    if getattr(executor, "name", "") == "dask" and _LANE is None:
        pytest.skip("dask workers are other processes: run the fake-GPU lane (GPUNETS_FAKE_GPU=1) for this case")


@pytest.fixture
def cp():
    with fake_gpu(1) as mod:
        yield mod


@pytest.fixture
def cp2():
    with fake_gpu(2) as mod:
        yield mod


# ----------------------------------------------------------------- the switch


@pytest.mark.parametrize("value", ["3", "0", "yes", "1.5"])
def test_bad_env_value_is_a_clear_error(monkeypatch, value):
    from gpunets.devices.placement import _gpu_probe

    monkeypatch.setenv("GPUNETS_FAKE_GPU", value)
    _gpu_probe.cache_clear()
    try:
        with pytest.raises(ValueError, match=rf"GPUNETS_FAKE_GPU='{value}' is not allowed: set it to 1 or 2"):
            gpu_available()
    finally:
        monkeypatch.delenv("GPUNETS_FAKE_GPU")
        _gpu_probe.cache_clear()


def test_fake_gpu_is_seen_as_cuda_devices(cp2):
    assert gpu_available() and gpu_count() == 2 and fake_gpu_count() == 2
    assert resolve("auto") == Device("cuda", 0)
    assert cp.__name__ if False else cp2.cuda.runtime.getDeviceCount() == 2
    assert cp2.cuda.is_available()
    assert not gn.devices.data.installed("cudf") and not gn.devices.data.installed("cuml")


def test_fake_gpu_block_restores_detection():
    before = gpu_available()
    with fake_gpu(1):
        assert gpu_available()
    assert gpu_available() == before


# ----------------------------------------------------------------- as strict as CuPy


def test_no_implicit_conversion_to_host(cp):
    x = cp.asarray(np.arange(6.0).reshape(2, 3))
    for convert in (np.asarray, lambda v: v.__array__(), float, pd.Series, lambda v: np.mean(v) + np.zeros(1)):
        with pytest.raises(TypeError):
            convert(x if convert is not float else x[0])
    assert len(cp.implicit_conversions()) >= 3
    assert cp.asnumpy(x).tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert x.get().sum() == 15.0 and float(x.sum()) == 15.0      # 0-d: allowed, as in CuPy
    with pytest.raises(TypeError, match="Unsupported type"):
        cp.concatenate([x, np.ones((1, 3))])                       # no host array inside a device op
    first = x.flat[4]                                              # CuPy's flatiter: a device array
    assert isinstance(first, cp.ndarray) and float(first) == 4.0 and len(x.flat) == 6


def test_devices_do_not_mix(cp2):
    x = cp2.ones(3)
    with cp2.cuda.Device(1):
        y = cp2.ones(3)
        assert cp2.cuda.Device().id == 1
    assert x.device.id == 0 and y.device.id == 1
    with pytest.raises(ValueError, match="different from the current device"):
        _ = x + y
    assert (to_device(y, "cuda:0") + x).device.id == 0
    with pytest.raises(gn.base.exceptions.DeviceUnavailableError if hasattr(gn, "exceptions") else Exception):
        to_device(np.ones(2), "cuda:2")


def test_current_device_and_stream_are_per_thread(cp2):
    seen = {}
    with cp2.cuda.Device(1):
        s = cp2.cuda.Stream(non_blocking=True)   # a stream belongs to the device current when it is made
    with cp2.cuda.Device(1), s:
        def other():
            seen["device"] = cp2.cuda.Device().id
            seen["stream"] = cp2.cuda.get_current_stream()
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert cp2.cuda.get_current_stream() is s
    assert seen["device"] == 0 and seen["stream"] is not s
    assert cp2.cuda.Stream.null.ptr == 0 and cp2.cuda.Stream.ptds.ptr == 2


def test_reading_another_streams_value_needs_an_event(cp):
    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with a:
        x = cp.ones(4) * 2
    with b, pytest.raises(StreamOrderError, match="without waiting for an event"):
        _ = x + 1
    ev = cp.cuda.Event(disable_timing=True)
    with a:
        y = x * 3
        ev.record(a)
    b.wait_event(ev)
    with b:
        assert cp.asnumpy(y + 1).tolist() == [7.0] * 4
    with a:
        z = y + 1
    a.synchronize()                 # the host waited: later work on any stream is ordered after it
    with b:
        _ = z * 2
    assert len(cp.order_violations()) == 1


def test_legacy_stream_work_is_recorded(cp):
    x = cp.ones(2)                   # on this thread's per-thread default stream
    assert cp.legacy_work() == []
    with cp.cuda.Stream.null:
        _ = x + 1
    assert cp.legacy_work() == ["__add__"]


def test_value_pickles_through_the_host(cp):
    import pickle

    x = cp.arange(3)
    y = pickle.loads(pickle.dumps(x))
    assert isinstance(y, cp.ndarray) and cp.asnumpy(y).tolist() == [0, 1, 2]


# ----------------------------------------------------------------- placement (issue 11, section 3.1)


def _data(n=80, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.rand(n, 4)
    return X, X @ np.array([1.0, -2.0, 3.0, 0.5]) + 0.1 * rng.rand(n)


def test_stacking_regressor_on_auto_device_gives_the_cpu_answer(cp, gn_executor):
    X, y = _data()
    ests = [("r", Ridge(alpha=1.0)), ("t", DecisionTreeRegressor(max_depth=3, random_state=0))]
    cv = KFold(4, shuffle=True, random_state=0)
    got = gn.StackingRegressor(ests, Ridge(), cv=cv).fit(X, y).predict(X)
    ref = SkStackingRegressor(ests, Ridge(), cv=cv).fit(X, y).predict(X)
    assert_allclose_any(got, ref, rtol=1e-6, atol=1e-8)
    assert cp.implicit_conversions() == [] and cp.legacy_work() == []


def test_stacking_classifier_on_auto_device_gives_the_cpu_answer(cp, gn_executor):
    X, y = _data()
    labels = np.where(y > np.median(y), "hi", "lo")
    ests = [("l", LogisticRegression()), ("t", DecisionTreeClassifier(max_depth=3, random_state=0))]
    cv = StratifiedKFold(4, shuffle=True, random_state=0)
    st = gn.StackingClassifier(ests, LogisticRegression(), cv=cv).fit(X, labels)
    ref = SkStackingClassifier(ests, LogisticRegression(), cv=cv).fit(X, labels)
    assert (st.predict(X) == ref.predict(X)).all()
    assert_allclose_any(st.predict_proba(X), ref.predict_proba(X), rtol=1e-6, atol=1e-8)
    assert cp.implicit_conversions() == [] and cp.legacy_work() == []


def _on_gpu(v):
    return gn.node(lambda a: a * 2, v, name="double")


def test_operation_nodes_follow_their_inputs(cp):
    X = gn.source(np.arange(6.0), name="X")
    with gn.device("cuda"):
        moved = gn.node(lambda a: a + 1, X, name="plus")    # placed on the GPU explicitly (block)
    follow = gn.node(lambda a: a * 2, moved, name="double")  # no placement: runs where `moved` lives
    seen = gn.node(lambda a: str(device_of(a)), follow, device="cuda")
    assert seen() == "cuda:0"
    assert follow(output="device").device.id == 0
    host = gn.node(np.sum, follow, device="cpu")               # explicit CPU: the input moves to the host
    assert float(host()) == 42.0
    assert cp.implicit_conversions() == []


def test_host_only_helpers_run_on_the_cpu_even_when_forced(cp):
    X = gn.source(np.arange(4.0), name="X")
    on_gpu = gn.node(lambda a: a + 0, X, device="cuda")
    total = gn.node(host_only(lambda a: float(np.asarray(a).sum())), on_gpu)
    assert total() == 6.0
    total.fit(device="cuda")                                   # override_placement: host-only still wins
    with gn.devices.placement.override_placement("cuda"):
        assert total() == 6.0
    assert cp.implicit_conversions() == []


def test_user_numpy_node_on_gpu_values_fails_loudly(cp):
    X = gn.source(np.arange(4.0), name="X")
    on_gpu = gn.node(lambda a: a + 0, X, device="cuda")
    bad = gn.node(lambda a: np.asarray(a).sum(), on_gpu)        # follows its GPU input; NumPy refuses it
    with pytest.raises(Exception, match="Implicit conversion"):
        bad()


def test_host_only_rejects_what_it_cannot_mark():
    with pytest.raises(TypeError, match="host_only: cannot mark"):
        host_only(len)


# ----------------------------------------------------------------- array-API twins on the fake GPU


def test_array_api_twins_run_on_the_fake_gpu():
    code = """
import warnings, numpy as np, gpunets as gn
from sklearn.linear_model import Ridge
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler
import gpunets.devices.fakegpu as fg
rng = np.random.RandomState(0); X = rng.rand(50, 4); y = X @ [1.0, 2.0, 3.0, 4.0]
Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
Z = gn.machine(StandardScaler(), Xs).transform(Xs)
P = gn.machine(PCA(3), Z).transform(Z)
m = gn.machine(Ridge(solver="svd"), P, ys)
with warnings.catch_warnings():
    warnings.filterwarnings("error", message=".*falling back to CPU")  # every model ran on the fake GPU
    m.predict(P).fit(device="cuda")
print(m._state.path, str(m._state.device))
from sklearn.pipeline import make_pipeline
ref = make_pipeline(StandardScaler(), PCA(3), Ridge(solver="svd")).fit(X, y).predict(X)
np.testing.assert_allclose(m.predict(P)(), ref, rtol=1e-6, atol=1e-8)
assert fg.implicit_conversions() == [] and fg.legacy_work() == []
print("ok")
"""
    env = dict(os.environ, GPUNETS_FAKE_GPU="1", SCIPY_ARRAY_API="1", CUPY_CUDA_PER_THREAD_DEFAULT_STREAM="1",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["array_api", "cuda:0", "ok"]


# ----------------------------------------------------------------- two devices


def test_cuda1_placement_and_moves_between_devices(cp2, gn_executor):
    if getattr(gn_executor, "name", "") == "dask":
        pytest.skip("the session's dask workers were started with the lane's device count, not this block's")
    X = gn.source(np.arange(12.0).reshape(6, 2), name="X")
    on1 = gn.node(lambda a: a * 2, X, device="cuda:1", name="on1")
    on0 = gn.node(lambda a: a + 1, on1, device="cuda:0", name="on0")   # moved cuda:1 -> cuda:0 by the plan
    follow = gn.node(lambda a: a - 1, on0, name="follow")               # follows its input: cuda:0
    assert on1(output="device").device.id == 1
    assert follow(output="device").device.id == 0
    np.testing.assert_array_equal(follow(), np.arange(12.0).reshape(6, 2) * 2)
    assert cp2.implicit_conversions() == []


def test_mean_of_branches_on_two_devices_runs_where_the_config_says(cp2):
    X = gn.source(np.arange(4.0), name="X")
    a = gn.node(lambda v: v + 0, X, device="cuda:0", name="a")
    b = gn.node(lambda v: v * 3, X, device="cuda:1", name="b")
    with gn.config(device="cuda:1"):
        out = gn.mean(a, b)                                              # inputs disagree: the config decides
        assert out(output="device").device.id == 1
        np.testing.assert_array_equal(out(), np.arange(4.0) * 2)


# ----------------------------------------------------------------- acceptance (issue 11 §1)


def test_every_executor_gives_the_cpu_answer_on_the_fake_gpu(cp, gn_executor):
    from gpunets.testing import assert_same_results

    _needs_fake_on_the_workers(gn_executor)
    X, y = _data(60)
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    stack = gn.StackingRegressor([("r", Ridge(solver="svd")), ("t", DecisionTreeRegressor(max_depth=2, random_state=0))],
                                 Ridge(solver="svd"), cv=KFold(3))
    yhat = gn.mean(gn.machine(Ridge(solver="svd"), Xs, ys).predict(Xs), gn.machine(stack, Xs, ys).predict(Xs))
    results = assert_same_results(yhat, devices=["cpu", "cuda"], executors=["serial", gn_executor], rtol=1e-6,
                                  atol=1e-9)
    assert ("cuda", "serial") in results
    assert cp.implicit_conversions() == [] and cp.legacy_work() == [] and cp.order_violations() == []


def test_fingerprint_hashes_device_arrays_on_the_device(cp):
    from gpunets.devices.fingerprint import fingerprint

    x = cp.asarray(np.arange(13.0).reshape(13, 1))
    first = fingerprint(x)
    assert first[:4] == ("array", "ndarray", (13, 1), "<f8")     # the array route, not a pickle through the host
    x[3] = 99.0
    assert fingerprint(x) != first and fingerprint(cp.asarray(np.arange(13.0).reshape(13, 1))) == first


# ----------------------------------------------------------------- data no GPU array can hold


def test_machines_placed_by_default_keep_host_only_data_on_the_cpu(cp, gn_executor):
    """Strings and sparse matrices cannot live in a GPU array: a machine placed by default trains on the
    CPU (the data decide), an explicit GPU placement of such data stays an error."""
    import scipy.sparse as sp
    from sklearn.linear_model import Ridge
    from sklearn.preprocessing import LabelEncoder

    _needs_fake_on_the_workers(gn_executor)
    y = gn.source(np.array(["b", "a", "b", "c"]), name="y")
    enc = gn.machine(LabelEncoder(), y)
    codes = enc.transform(y)
    codes.fit(executor=gn_executor)
    assert gn.report(codes)["LabelEncoder"]["device"] == "cpu"
    np.testing.assert_array_equal(np.asarray(codes(output="numpy")), [1, 0, 1, 2])
    X = gn.source(sp.random(20, 3, density=0.5, format="csr", random_state=0), name="X")
    t = gn.source(np.arange(20.0), name="t")
    m = gn.machine(Ridge(), X, t)
    m.fit(executor=gn_executor)
    assert gn.report(m.predict(X))["Ridge"]["device"] == "cpu"
    forced = gn.machine(Ridge(), X, t, device="cuda")
    try:   # explicit placement: an error naming the sparse data where the GPU route needs it on the device,
        forced.fit(executor=gn_executor)   # else the usual logged CPU fallback
    except Exception as e:  # noqa: BLE001 - checked below
        assert "sparse" in str(e), e
    else:
        assert gn.report(forced.predict(X))["Ridge"]["device"].startswith("cpu")
    assert cp.implicit_conversions() == []


# ----------------------------------------------------------------- as strict as CuPy (issue 24 items 9-11)


def test_a_stream_of_another_device_cannot_be_made_current(cp2):
    s0 = cp2.cuda.Stream(non_blocking=True)           # made on device 0
    assert s0.device_id == 0 and cp2.cuda.Stream.null.device_id == -1
    with cp2.cuda.Device(1):
        with pytest.raises(RuntimeError, match=r"stream is created on \(0\) does not match with the current device \(1\)"):
            with s0:
                pass
        with pytest.raises(RuntimeError, match="does not match"):
            s0.use()
        s1 = cp2.cuda.Stream(non_blocking=True)
        with s1:
            assert cp2.cuda.get_current_stream() is s1
    with s0:   # the current stream is per device, as CuPy's
        assert cp2.cuda.get_current_stream() is s0
        with cp2.cuda.Device(1):
            assert cp2.cuda.get_current_stream() is not s0
            assert cp2.cuda.get_current_stream(0) is s0


def test_an_event_recorded_on_another_devices_stream_fails(cp2):
    ev0 = cp2.cuda.Event(disable_timing=True)          # belongs to device 0
    with cp2.cuda.Device(1):
        s1 = cp2.cuda.Stream(non_blocking=True)
        with pytest.raises(cp2.cuda.runtime.CUDARuntimeError, match="invalid resource handle"):
            ev0.record(s1)
        with pytest.raises(RuntimeError, match="invalid resource handle"):
            ev0.record()                                    # the current (device 1) stream
        with pytest.raises(RuntimeError, match="invalid resource handle"):
            s1.record(ev0)
        ev1 = s1.record(cp2.cuda.Event(disable_timing=True))  # made here: fine
    cp2.cuda.get_current_stream().wait_event(ev1)           # waiting on another device's event is allowed (CUDA)


def test_events_do_not_complete_at_once_so_a_missing_wait_shows(cp):
    import gpunets.devices.fakegpu as fg

    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    answers, caught = [], 0
    for _ in range(40):
        with a:
            x = cp.ones(3) + 1
            ev = a.record(cp.cuda.Event(disable_timing=True))
        answers.append(ev.done)      # polled once: done or not, at random
        if not answers[-1]:          # not done and no wait: reading it on b is a race, and is caught
            with b, pytest.raises(StreamOrderError):
                _ = x * 2
            caught += 1
        ev.synchronize()             # now it has finished: done stays True, and b may read x
        assert ev.done
        with b:
            _ = x * 2
    assert True in answers and False in answers and caught == answers.count(False)
    fg.seed(7)
    first = [a.record(cp.cuda.Event()).done for _ in range(20)]
    fg.seed(7)
    assert [a.record(cp.cuda.Event()).done for _ in range(20)] == first   # seeded: a failure replays


def test_non_blocking_streams_are_not_ordered_by_the_legacy_stream(cp):
    with cp.cuda.Stream.null:
        x = cp.ones(3)
    with cp.cuda.Stream():                              # a blocking stream waits for legacy work
        _ = x + 1
    with cp.cuda.Stream(non_blocking=True), pytest.raises(StreamOrderError, match="without waiting"):
        _ = x + 1                                       # a non-blocking one does not (stream="new")
    nb = cp.cuda.Stream(non_blocking=True)
    with nb:
        y = cp.ones(2)
    with cp.cuda.Stream.null, pytest.raises(StreamOrderError):
        _ = y * 2                                       # nor does legacy work wait for it


def test_get_elapsed_time_as_cupy(cp):
    t0, t1 = cp.cuda.Event(), cp.cuda.Event()
    s = cp.cuda.get_current_stream()
    t0.record(s)
    _ = cp.ones(4) * 2
    t1.record(s)
    with pytest.raises(RuntimeError, match="NotReady"):
        cp.cuda.get_elapsed_time(t0, t1)      # before the events have completed
    t1.synchronize()   # as on CUDA, the earlier event of the same stream has completed too (stream order)
    assert cp.cuda.get_elapsed_time(t0, t1) >= 0.0
    t2, t3 = cp.cuda.Event(), cp.cuda.Event()
    _ = cp.ones(4) * 4
    t2.record(s)
    with cp.cuda.Stream(non_blocking=True) as other:
        _ = cp.ones(4) * 3
        t3.record(other)
    t3.synchronize()   # another stream's event says nothing of this one's
    with pytest.raises(RuntimeError, match="NotReady"):
        cp.cuda.get_elapsed_time(t2, t3)
    quiet = cp.cuda.Event(disable_timing=True)
    quiet.record(s)
    quiet.synchronize()
    with pytest.raises(RuntimeError, match="invalid resource handle"):
        cp.cuda.get_elapsed_time(t0, quiet)


def test_an_unpickled_array_lands_on_the_current_device(cp2):
    import pickle

    with cp2.cuda.Device(1):
        x = cp2.arange(3.0)
        blob = pickle.dumps(x)
    y = pickle.loads(blob)                     # as CuPy: the current device (0), not the one it came from
    assert y.device.id == 0
    with pytest.raises(ValueError, match="different from the current device"):
        _ = x + y
    with cp2.cuda.Device(1):
        assert pickle.loads(blob).device.id == 1


def test_index_as_cupy(cp):
    import operator

    assert operator.index(cp.asarray(3)) == 3 and [10, 11, 12][cp.asarray(np.uint8(1))] == 11
    for bad in (cp.asarray(True), cp.asarray(1.0)):
        with pytest.raises(TypeError, match="integer scalar"):
            operator.index(bad)
    with pytest.raises(TypeError):
        operator.index(cp.arange(2))


def test_numpy_functions_on_device_arrays_as_cupy(cp):
    x = cp.arange(4.0)
    m = np.mean(x)                                  # CuPy has mean: np.mean runs cupy.mean, on the device
    assert isinstance(m, cp.ndarray) and m.device.id == 0 and float(m) == 1.5
    with pytest.raises(TypeError, match="no implementation found"):
        np.einsum_path("i,i", x, x)                 # no cupy.einsum_path: NumPy refuses
    with pytest.raises(TypeError):
        np.concatenate([x, np.ones(2)])             # a host operand: cupy.concatenate refuses it
    with pytest.raises(TypeError):
        np.add(x, np.ones(4))
    assert any("einsum_path" in c for c in cp.implicit_conversions())


def _cupy_names_gpunets_uses():
    """Every ``cp.cuda...`` / ``cupy.cuda...`` attribute chain in gpunets' source (the CuPy API it relies on)."""
    import re
    from pathlib import Path

    root = Path(gn.__file__).parent
    names = set()
    for path in root.rglob("*.py"):
        if path.name == "fakegpu.py":
            continue
        for m in re.finditer(r"\b(?:cp|cupy|_cupy\(\)|cupy\(\))\.(cuda(?:\.\w+)+)", path.read_text()):
            names.add(m.group(1))
    return sorted(names)


def test_the_fake_has_every_cupy_api_gpunets_uses(cp2):
    names = _cupy_names_gpunets_uses()
    assert "cuda.get_elapsed_time" in names and "cuda.Stream.ptds" in names and "cuda.runtime.getDeviceCount" in names
    missing = []
    for name in names:
        obj = cp2
        for part in name.split("."):
            if not hasattr(obj, part):
                missing.append(name)
                break
            obj = getattr(obj, part)
    assert not missing, f"gpunets uses these CuPy APIs, which the fake GPU lacks: {missing}"
    with cp2.cuda.Device(1):
        x = cp2.ones(2)
        s = cp2.cuda.Stream(non_blocking=True)
    assert cp2.cuda.runtime.pointerGetAttributes(x.data.ptr).device == 1
    assert cp2.cuda.Stream.from_external(s) is s and cp2.cuda.ExternalStream(s.ptr) is s


def test_traced_runs_on_the_fake_gpu(cp, gn_executor):
    _needs_fake_on_the_workers(gn_executor)
    X = gn.source(np.arange(6.0), name="X")
    with gn.device("cuda"):
        out = gn.mean(X + 1, X * 2)
    ev = gn.evaluate(out, executor=gn_executor, trace=True)
    np.testing.assert_allclose(ev.value, (np.arange(6.0) + 1 + np.arange(6.0) * 2) / 2)
    assert ev.trace.records
    assert cp.order_violations() == []


def test_combine_kernels_take_their_real_cuda_launch_path_on_the_fake_gpu(cp, gn_executor, monkeypatch):
    """Under numba's simulator the fake GPU's arrays go through gpunets.kernels._cuda's GPU path (stream
    conversion, event wait, output allocation on the kernel's stream, launch configuration); only the
    kernel itself runs in the simulator."""
    from gpunets.kernels import _cuda

    if not _cuda.SIMULATOR:
        pytest.skip("the fake GPU's kernels need numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1)")
    _needs_fake_on_the_workers(gn_executor)
    calls = {"numba_stream": 0, "launch_config": 0, "run": 0, "empty": 0}

    def counting(obj, name):
        real = getattr(obj, name)

        def call(*a, **k):
            calls[name] += 1
            return real(*a, **k)

        monkeypatch.setattr(obj, name, call)

    counting(_cuda, "numba_stream")
    counting(_cuda, "launch_config")
    counting(_cuda._Launch, "run")
    counting(_cuda._Launch, "empty")
    X = gn.source(np.arange(6.0), name="X")
    with gn.device("cuda"):
        out = gn.mean(X + 1, X * 2)
    np.testing.assert_allclose(out(executor=gn_executor), (3 * np.arange(6.0) + 1) / 2)
    if getattr(gn_executor, "name", "") != "dask":   # dask runs the kernel in its worker processes
        assert all(n >= 1 for n in calls.values()), calls

    # the launch path's own event wait is what orders the kernel's stream after the inputs' stream
    a, b = cp.ones(3), cp.full(3, 3.0)
    kernel_stream = cp.cuda.Stream(non_blocking=True)
    m = gn.kernels.mean([a, b], target="cuda", stream=kernel_stream)
    assert cp.asnumpy(m, stream=kernel_stream).tolist() == [2.0] * 3   # the result is the kernel stream's
    producer = cp.cuda.Stream(non_blocking=True)
    with producer:
        c = cp.ones(3)            # made on a stream nobody waits for
    with pytest.raises(StreamOrderError):
        gn.kernels.mean([a, c], target="cuda", stream=kernel_stream)


def test_cpu_lanes_wait_for_gpu_producers_on_blocking_events_and_gpu_lanes_on_the_gpu(cp, monkeypatch):
    """issue 24 item 14: a GPU consumer of another lane's value waits on the GPU (Stream.wait_event, no host
    wait); a CPU consumer waits on the host for an event made with block=True, so its thread sleeps instead of
    spinning a core."""
    from gpunets.devices.fakegpu import Event, Stream

    host_waits, gpu_waits = [], []
    real_sync, real_wait = Event.synchronize, Stream.wait_event

    def sync(self):
        host_waits.append(self.block)
        return real_sync(self)

    def wait(self, event):
        gpu_waits.append(event)
        return real_wait(self, event)

    monkeypatch.setattr(Event, "synchronize", sync)
    monkeypatch.setattr(Stream, "wait_event", wait)
    X = gn.source(np.arange(12.0).reshape(6, 2), name="X")
    a, b = gn.hstack(X, device="cuda"), gn.hstack(X * 2, device="cuda")   # two GPU lanes
    on_gpu = gn.mean(a, b, device="cuda")                                   # a GPU consumer of both
    on_cpu = gn.node(np.sum, on_gpu, device="cpu")                          # a CPU consumer of a GPU value
    got = on_cpu(executor=gn.StreamsExecutor(workers=2))
    assert float(got) == float(np.sum((np.arange(12.0).reshape(6, 2) * 3) / 2))
    assert gpu_waits                                    # the GPU consumer waited on the GPU
    assert host_waits and all(host_waits)               # every host wait is on a blocking event


def test_output_conversion_in_the_callers_thread_does_not_use_the_legacy_stream():
    """Issue 24 item 13: without per-thread default streams, the caller's thread copies a streams run's
    outputs to the host on a non-blocking stream of its own (the run's outputs are ready: the executor
    waited for their events), not on the legacy default stream, which would serialise a concurrent run."""
    with fake_gpu(1, per_thread_default_stream=False) as cp:
        X = gn.source(cp.asarray(np.arange(6.0)), name="X")
        a = gn.node(lambda v: v * 2, X, name="a")
        b = gn.node(lambda v: v + 1, X, name="b")
        out = gn.mean(a, b)
        cp.reset_log()
        for output in ("numpy", "pandas"):
            got = out(executor=gn.StreamsExecutor(workers=2, stream="new"), output=output)
            np.testing.assert_array_equal(np.asarray(got), (np.arange(6.0) * 3 + 1) / 2)
        assert cp.legacy_work() == [] and cp.order_violations() == [] and cp.implicit_conversions() == []

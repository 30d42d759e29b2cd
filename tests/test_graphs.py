"""Graph mode (gpunets.executors.graphs): a fitted network called again replays captured CUDA graphs.

On the fake GPU (``gn.testing.fake_gpu``, switched on here, so these run in every lane) on every executor; the
test marked ``gpu`` runs the same on a real GPU.
"""

import os
import threading

import numpy as np
import pytest
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler

import gpunets as gn
from gpunets.compute.models import scipy_array_api_enabled
from gpunets.executors import _capture, graphs
from gpunets.testing import fake_gpu
from tests.helpers import run_in_the_lane

_LANE = os.environ.get("GPUNETS_FAKE_GPU")
# The networks' estimators run on the (fake) GPU only through scikit-learn's array-API dispatch, which needs
# SCIPY_ARRAY_API=1 before SciPy is imported: elsewhere they fall back to the CPU, and nothing is left to capture.
# There the file runs in a fresh process with the lane's environment (the last test).
ARRAY_API = scipy_array_api_enabled()
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def cp(executor):
    if not ARRAY_API:
        pytest.skip("needs SCIPY_ARRAY_API=1 before SciPy is imported: run in a fresh process by "
                    "test_the_graph_tests_pass_in_a_process_with_array_api_dispatch")
    if getattr(executor, "name", "") == "dask" and _LANE is None:
        pytest.skip("dask workers are other processes: run the fake-GPU lane (GPUNETS_FAKE_GPU=1) for this case")
    graphs.clear()
    with fake_gpu(1) as mod:
        yield mod
    graphs.clear()


def _network(seed=0, rows=60):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((rows, 4))
    y = X @ np.arange(1.0, 5.0)
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    scaler = gn.machine(StandardScaler(), Xs)
    W = scaler.transform(Xs)
    a = gn.node(lambda w: w * 2.0 + 1.0, W, name="a")
    b = gn.node(lambda w: (w - 1.0) ** 2, W, name="b")
    ridge = gn.machine(Ridge(solver="svd"), W, ys)
    out = gn.mean(a[:, 0], b[:, 1], ridge.predict(W))
    return Xs, ys, scaler, ridge, out


def _call(out, X, **kw):
    return gn.evaluate(out, X, graphs=True, trace=True, **kw)


def _host(v, cp):
    return cp.asnumpy(v) if isinstance(v, cp.ndarray) else np.asarray(v)


def _off_on_dask(executor):
    """On Dask (tasks in worker processes) graph mode does not apply: a call that asks for it runs eagerly, gives
    the eager call's value and says why. True there (the caller's graph-mode checks do not apply), else False."""
    if getattr(executor, "name", "") != "dask":
        return False
    _, _, _, _, out = _network()
    out.fit()
    Xn = np.random.default_rng(1).standard_normal((20, 4))
    eager = out(Xn)
    r = _call(out, Xn)
    assert r.trace.graphs.mode == "off" and "dask" in str(r.trace.graphs), r.trace.graphs
    assert np.array_equal(r.value, eager)
    return True


def test_replay_equals_eager_bit_for_bit(cp, executor):
    _, _, _, _, out = _network()
    out.fit()
    Xn = np.random.default_rng(1).standard_normal((20, 4))
    eager = out(Xn)
    modes = []
    for _ in range(4):
        r = _call(out, Xn)
        modes.append(r.trace.graphs.mode)
        assert np.array_equal(r.value, eager), modes   # bit for bit
    if getattr(executor, "name", "") == "dask":
        assert modes == ["off"] * 4 and "dask" in str(r.trace.graphs)
        return
    assert modes == ["trial", "capture", "replay", "replay"]
    rep = r.trace.graphs
    assert r.graphs is rep and gn.last_trace().graphs is rep
    assert len(rep.segments) == 2 and rep.held_bytes > 0
    assert any("transform(StandardScaler" in s for s in rep.segments[0])
    eager_why = dict(rep.eager)
    assert "NotImplementedError: calling cuBLAS API" in next(w for k, w in eager_why.items() if "predict" in k)
    assert "host-to-device" in next(w for k, w in eager_why.items() if k.startswith("move X"))
    assert "graphs: replayed 2 segment(s)" in str(rep)
    assert [rec.lane for rec in r.trace.records].count("graph") == sum(len(s) for s in rep.segments)
    entry = next(iter(graphs._CACHE.values()))
    assert entry.sides, "the independent branches a and b were captured on a side stream, forked and joined"


def test_outputs_are_copies_never_the_graphs_buffers(cp, executor):
    if _off_on_dask(executor):   # graph mode does not apply there: checked to say so and run eagerly
        return
    _, _, _, _, out = _network()
    out.fit()
    rng = np.random.default_rng(2)
    X1, X2 = cp.asarray(rng.standard_normal((20, 4))), cp.asarray(rng.standard_normal((20, 4)))
    want1, want2 = _host(out(X1), cp), _host(out(X2), cp)
    for _ in range(2):
        _call(out, X1)
    r1 = _call(out, X1).value
    assert _call(out, X1).trace.graphs.mode == "replay"
    r2 = _call(out, X2).value                      # a replay with other inputs in the same static buffers
    assert np.array_equal(_host(r1, cp), want1)   # the first result is untouched
    assert np.array_equal(_host(r2, cp), want2)


def test_a_host_read_ends_a_segment_and_the_verdict_is_cached(cp, executor, monkeypatch):
    if _off_on_dask(executor):   # graph mode does not apply there: checked to say so and run eagerly
        return
    X = gn.source(cp.asarray(np.arange(12.0).reshape(6, 2)), name="X")
    first = gn.node(lambda x: x * 3.0, X, name="first")
    reads = gn.node(lambda x: x / float(x.sum()), first, name="reads")   # a host read: invalidates a capture
    last = gn.node(lambda x: x + 1.0, reads, name="last")
    eager = _host(last(), cp)
    tried = []
    real = _capture.run_trial
    monkeypatch.setattr(graphs, "run_trial", lambda t, *a: (tried.append(t.label), real(t, *a))[1])
    r = _call(last, X.data)
    rep = r.trace.graphs
    assert np.array_equal(_host(r.value, cp), eager)
    assert rep.segments == [["first(X)"], ["last(reads)"]]
    assert "cudaErrorStreamCapture" in dict(rep.eager)["reads(first)"]
    assert tried.count("reads(first)") == 1
    for _ in range(3):
        r = _call(last, X.data)
        assert np.array_equal(_host(r.value, cp), eager)
    assert r.trace.graphs.mode == "replay" and len(r.trace.graphs.segments) == 2
    graphs._CACHE.clear()                           # the graphs gone, the verdicts kept: no second trial of it
    r = _call(last, X.data)
    assert r.trace.graphs.mode == "trial" and tried.count("reads(first)") == 1
    assert np.array_equal(_host(r.value, cp), eager)


def test_a_segment_invalidated_midway_runs_eagerly_from_then_on(cp, executor, monkeypatch):
    if _off_on_dask(executor):   # graph mode does not apply there: checked to say so and run eagerly
        return
    calls = []

    def moody(x):   # captured alone on the first call; reads the host when the segment is captured
        calls.append(1)
        return x * (float(x.sum()) if len(calls) == 2 else 2.0)

    X = gn.source(cp.asarray(np.arange(4.0)), name="X")
    out = gn.node(lambda y: y + 1.0, gn.node(moody, X, name="moody"), name="plus")
    tries = []
    real = graphs.Entry.capture
    monkeypatch.setattr(graphs.Entry, "capture", lambda self, seg, *a: (tries.append(1), real(self, seg, *a))[1])
    assert _call(out, X.data).graphs.mode == "trial"
    r = _call(out, X.data)
    assert r.graphs.mode == "capture" and r.graphs.segments == []
    why = dict(r.graphs.eager)
    assert "its segment's capture failed (CUDARuntimeError: cudaErrorStreamCapture" in why["moody(X)"], why
    assert _host(r.value, cp).tolist() == [1.0, 3.0, 5.0, 7.0]      # eager, right
    r = _call(out, X.data)
    assert r.graphs.mode == "replay" and len(r.graphs.eager) == 2 and tries == [1]   # not tried again
    assert _host(r.value, cp).tolist() == [1.0, 3.0, 5.0, 7.0]


def test_another_shape_captures_anew_never_replays_the_wrong_buffers(cp, executor):
    if _off_on_dask(executor):   # graph mode does not apply there: checked to say so and run eagerly
        return
    _, _, _, _, out = _network()
    out.fit()
    rng = np.random.default_rng(3)
    big, small = rng.standard_normal((20, 4)), rng.standard_normal((10, 4))
    for _ in range(3):
        _call(out, big)
    r = _call(out, small)
    assert r.trace.graphs.mode == "trial" and np.array_equal(r.value, out(small))
    r = _call(out, big)
    assert r.trace.graphs.mode == "replay" and np.array_equal(r.value, out(big))
    assert graphs.entries() == 2


def test_a_refit_drops_the_graphs_and_the_next_call_captures_anew(cp, executor):
    if _off_on_dask(executor):   # graph mode does not apply there: checked to say so and run eagerly
        return
    Xs, _, _, _, out = _network()
    out.fit()
    Xn = np.random.default_rng(4).standard_normal((20, 4))
    for _ in range(3):
        _call(out, Xn)
    assert graphs.entries() == 1
    Xs.data = np.random.default_rng(5).standard_normal((60, 4)) * 3.0
    out.fit()
    r = _call(out, Xn)
    assert r.trace.graphs.mode == "trial" and graphs.entries() == 1   # the old entry dropped
    assert np.array_equal(r.value, out(Xn))


def test_a_refit_during_a_replay_finishes_on_the_old_state(cp, executor, monkeypatch):
    if _off_on_dask(executor):   # graph mode does not apply there: checked to say so and run eagerly
        return
    Xs, _, _, _, out = _network()
    out.fit()
    Xn = np.random.default_rng(6).standard_normal((20, 4))
    old = out(Xn)
    for _ in range(2):
        _call(out, Xn)
    inside, release = threading.Event(), threading.Event()
    from gpunets.devices import _fakegraph

    launch = _fakegraph.Graph.launch

    def slow_launch(self, stream=None):
        if threading.current_thread().name == "replayer":
            inside.set()
            release.wait(10)
        return launch(self, stream)

    monkeypatch.setattr(_fakegraph.Graph, "launch", slow_launch)
    got = {}
    th = threading.Thread(target=lambda: got.setdefault("r", _call(out, Xn)), name="replayer")
    th.start()
    assert inside.wait(10)
    busy = _call(out, Xn)                          # a second caller while it replays: eager, right
    assert busy.trace.graphs.mode == "busy" and np.array_equal(busy.value, old)
    Xs.data = np.random.default_rng(7).standard_normal((60, 4)) * 2.0
    out.fit()                                      # a refit while the replay is in flight
    release.set()
    th.join(10)
    assert got["r"].trace.graphs.mode == "replay" and np.array_equal(got["r"].value, old)
    new = _call(out, Xn)
    assert new.trace.graphs.mode == "trial" and np.array_equal(new.value, out(Xn))
    assert not np.array_equal(new.value, old)


def test_array_constants_a_graph_reads_stay_alive(cp, executor):
    if _off_on_dask(executor):   # graph mode does not apply there: checked to say so and run eagerly
        return
    import gc

    X = gn.source(cp.asarray(np.ones((5, 3))), name="X")
    out = gn.node(lambda x, c: x * c + 1.0, X, np.array([1.0, 2.0, 3.0]))   # a NumPy constant, moved per plan
    want = _host(out(), cp)
    for _ in range(4):
        r = _call(out, X.data)
        gc.collect()
        grabbed = [cp.zeros(3) for _ in range(4)]   # default-pool arrays of the constant's size
        assert np.array_equal(_host(r.value, cp), want)
        for g in grabbed:
            assert float(g.sum()) == 0.0   # no array was handed the memory of a constant a graph still reads
    assert r.graphs.mode == "replay"


def test_the_graphs_use_a_private_pool(cp, executor):
    if _off_on_dask(executor):   # graph mode does not apply there: checked to say so and run eagerly
        return
    _, _, _, _, out = _network()
    out.fit()
    Xn = np.random.default_rng(8).standard_normal((20, 4))
    for _ in range(3):
        r = _call(out, Xn)
    entry = next(iter(graphs._CACHE.values()))
    assert entry.pool.used_bytes() > 0 and r.trace.graphs.held_bytes == entry.pool.total_bytes()
    # arrays of every size the graphs use, from the default pool: none is handed a graph's buffer
    sizes = {a.nbytes for seg in entry.steps if isinstance(seg, _capture.Segment) for a in seg.values.values()}
    others = [cp.zeros(n // 8) for n in sizes if n % 8 == 0]
    for o in others:
        assert float(o.sum()) == 0.0
    r = _call(out, Xn)
    assert np.array_equal(r.value, out(Xn))
    for o in others:
        assert float(o.sum()) == 0.0


def test_the_configured_setting_and_the_node_output_cache(cp, executor):
    if _off_on_dask(executor):   # graph mode does not apply there: checked to say so and run eagerly
        return
    _, _, _, _, out = _network()
    out.fit()
    Xn = np.random.default_rng(9).standard_normal((20, 4))
    want = out(Xn)
    with gn.config(graphs=True, cache=True):   # gn.config(graphs=True): every call in the block
        for mode in ("trial", "capture", "replay"):
            assert np.array_equal(out(Xn), want)
            assert gn.last_trace().graphs.mode == mode
        first = out()                                     # on the training data: outputs cached, never captured
        rep = gn.last_trace().graphs
        assert any("node-output cache" in why for _, why in rep.eager), str(rep)
        assert np.array_equal(first, out(graphs=False)) and np.array_equal(first, out())


def test_a_nested_call_inside_a_task_runs_eagerly(cp, executor):
    if _off_on_dask(executor):   # graph mode does not apply there: checked to say so and run eagerly
        return
    Z = gn.source(cp.ones(3), name="Z")
    inner = Z * 2.0
    seen = []

    def outer_fn(x):
        r = gn.evaluate(inner, x, graphs=True, trace=True)
        seen.append(str(r.graphs))
        return r.value + 1.0

    X = gn.source(cp.ones(3), name="X")
    out = gn.node(outer_fn, X)
    for _ in range(3):
        assert _host(out(cp.ones(3) * 4.0, graphs=True), cp).tolist() == [9.0] * 3
    assert seen == ["graphs: graphs=True does nothing inside another run's task (a nested network): it ran "
                    "eagerly."] * 3


def test_graphs_on_the_cpu_is_a_no_op_said_in_one_line(executor):
    Xs = gn.source(np.ones((4, 2)), name="X")
    node = gn.node(lambda x: x + 1, Xs, device="cpu")
    r = gn.evaluate(node, graphs=True, trace=True)
    assert r.trace.graphs.mode == "off"
    assert r.trace.graphs.lines() == ["graphs: graphs=True does nothing here: no task of this call runs on a GPU "
                                      "(the CPU runs it eagerly)."]
    assert np.array_equal(r.value, np.full((4, 2), 2.0))
    assert gn.evaluate(node, trace=True).trace.graphs is None


@pytest.mark.parametrize("bad", ["yes", 1, None, "AUTO"])
def test_bad_graphs_values_are_refused(bad):
    with pytest.raises(TypeError, match=r"graphs=.* is not a setting: expected True .* or 'auto'"):
        gn.config(graphs=bad).__enter__()
    Xs = gn.source(np.ones(2), name="X")
    if bad is not None:   # a call's None means "the configured default"
        with pytest.raises(TypeError, match="is not a setting"):
            (Xs + 1)(graphs=bad)
    with gn.config(graphs=True):
        assert gn.get_config()["graphs"] is True
    assert gn.get_config()["graphs"] is False


def test_auto_replays_where_earlier_calls_were_host_bound(cp, executor):
    """graphs="auto": the first call runs eagerly with its GPU tasks timed; replay follows where they were
    host-bound (GPU time under half of the host's issue time), eager where the GPU was busy."""
    from gpunets.executors import gpu_auto

    _, _, _, _, out = _network()
    out.fit()
    Xn = np.random.default_rng(1).standard_normal((20, 4))
    eager = out(Xn)
    gpu_auto._SEEN.clear()
    first = gn.evaluate(out, Xn, graphs="auto", trace=True)
    assert np.array_equal(first.value, eager)
    if getattr(executor, "name", "") == "dask":   # the workers time nothing here that the client keeps per node
        assert first.trace.graphs.mode == "off"
        return
    assert first.trace.graphs.mode == "off" and "timed before" in first.trace.graphs.note, first.trace.graphs
    timed = list(gpu_auto._SEEN.keys())
    assert timed, "the first call timed its GPU tasks"
    for n in timed:   # what a host-bound H200 call looks like: 10 us of GPU work per 300 us of Python
        gpu_auto._SEEN[n] = (1e-5, 3e-4)
    modes = []
    for _ in range(3):
        r = gn.evaluate(out, Xn, graphs="auto", trace=True)
        modes.append(r.trace.graphs.mode)
        assert np.array_equal(r.value, eager)
        assert "host-bound" in r.trace.graphs.note, r.trace.graphs
    assert modes == ["trial", "capture", "replay"], modes
    for n in timed:   # GPU-bound: replay would save little
        gpu_auto._SEEN[n] = (3e-3, 3e-4)
    with gn.config(graphs="auto"):
        r = gn.evaluate(out, Xn, trace=True)
    assert r.trace.graphs.mode == "off" and "kept the GPU busy" in r.trace.graphs.note
    assert np.array_equal(r.value, eager)


def test_a_source_cannot_be_named_graphs():
    with pytest.raises(ValueError, match="keyword of node calls"):
        gn.source(np.ones(2), name="graphs")


@pytest.mark.gpu
def test_replay_equals_eager_on_a_real_gpu():
    real = pytest.importorskip("cupy")
    if not real.cuda.is_available():
        pytest.skip("no CUDA GPU")
    graphs.clear()
    X = real.random.default_rng(0).standard_normal((2048, 24), dtype=real.float32)
    with gn.device("cuda"):
        Xs = gn.source(X, name="X")
        branches = [gn.node(lambda x, k=k: real.tanh(x * 0.5 + 0.01 * k) * 1.5, Xs) for k in range(4)]
        out = gn.mean(*branches)
    eager = real.asnumpy(out(X))
    for mode in ("trial", "capture", "replay", "replay"):
        r = gn.evaluate(out, X, graphs=True, trace=True)
        assert r.trace.graphs.mode == mode
        assert np.array_equal(real.asnumpy(r.value), eager)
    graphs.clear()


@pytest.mark.skipif(ARRAY_API, reason="with array-API dispatch the tests above run in this process")
def test_the_graph_tests_pass_in_a_process_with_array_api_dispatch():
    run_in_the_lane("test_graphs.py")

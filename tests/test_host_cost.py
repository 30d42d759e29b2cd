"""Issue 36 items 2-4: gpunets' own host cost on a GPU, counted on the fake GPU (no timed asserts).

* host reads (each a synchronisation on a real GPU) of a fitted network's predict and of a GPU search:
  the sources are checked for finiteness once per call, the estimator calls then skip scikit-learn's
  finite checks (``assume_finite=True``);
* events only where an edge crosses streams and on the outputs, from a pool; device ordinals resolved
  once per plan; the graveyard of values kept for other streams swept in O(1) per release;
* one thread issues the GPU tasks that do not block the host, in plan order; the race checker and the
  fake GPU's order checks cover that order.

The budgets need scikit-learn's array-API dispatch, which needs ``SCIPY_ARRAY_API=1`` before SciPy is
imported: in the fake-GPU lane they run here, elsewhere in a fresh process with the fake GPU on.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.impute import SimpleImputer
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler

import gpunets as gn
from gpunets.planning.plan import compile_call, compile_fit
from gpunets.testing import fake_gpu

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

#: Host reads allowed (issue 36 item 4): a fitted network's predict on 50 rows (the source's finite check and
#: the output read on the host), and a 5-fold, 3-alpha GridSearchCV of the same pipeline on the GPU.
PREDICT_BUDGET, SEARCH_BUDGET = 3, 87


@pytest.fixture
def cp():
    with fake_gpu(1) as mod:
        yield mod


def _data():
    rng = np.random.RandomState(0)
    X = rng.rand(50, 4)
    return X, X @ [1.0, 2.0, 3.0, 4.0] + 0.01 * rng.rand(50)


def count_host_reads(executor: str, what: str, device_source: bool = False) -> list[str]:
    """The host reads of one predict (``what="predict"``) or one GPU search (``"search"``) on the fake GPU."""
    import warnings

    from sklearn.pipeline import make_pipeline

    from gpunets.devices import fakegpu

    warnings.simplefilter("ignore")
    X, y = _data()
    ex = executor
    with fake_gpu(1) as cp:
        if what == "predict":
            Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
            Z = gn.machine(StandardScaler(), Xs).transform(Xs)
            P = gn.machine(PCA(3), Z).transform(Z)
            m = gn.machine(Ridge(solver="svd"), P, ys)
            yhat = m.predict(P)
            yhat.fit(device="cuda", executor=ex)
            assert m._state.path == "array_api", m._state.path
            data = cp.asarray(X) if device_source else X
            cp.cuda.Device().synchronize()
            fakegpu.reset_log()
            out = yhat(data, executor=ex, output="numpy")
            np.testing.assert_allclose(out, make_pipeline(StandardScaler(), PCA(3), Ridge(solver="svd"))
                                       .fit(X, y).predict(X), rtol=1e-6, atol=1e-8)
        else:
            search = gn.GridSearchCV(make_pipeline(StandardScaler(), PCA(3), Ridge(solver="svd")),
                                     {"ridge__alpha": [0.1, 1.0, 10.0]}, cv=5, device="cuda", executor=ex)
            fakegpu.reset_log()
            search.fit(X, y)
            assert search.best_params_["ridge__alpha"] in (0.1, 1.0, 10.0)
        assert cp.implicit_conversions() == [] and cp.order_violations() == []
        return fakegpu.host_reads()


def _in_process() -> bool:
    from gpunets.compute.models import scipy_array_api_enabled

    return scipy_array_api_enabled()


def _reads(executor: str, what: str, device_source: bool = False) -> list[str]:
    if _in_process():
        return count_host_reads(executor, what, device_source)
    code = ("import json, tests.test_host_cost as t; "
            f"print(json.dumps(t.count_host_reads({executor!r}, {what!r}, {device_source!r})))")
    env = dict(os.environ, SCIPY_ARRAY_API="1", CUPY_CUDA_PER_THREAD_DEFAULT_STREAM="1",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    env.pop("GPUNETS_FAKE_GPU", None)   # the test turns the fake on itself
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    return json.loads(out.stdout.strip().splitlines()[-1])


_EXECUTORS = ["serial", "threads", "streams"]   # dask's workers are other processes: their reads are not counted here


@pytest.mark.parametrize("executor", _EXECUTORS)
@pytest.mark.parametrize("device_source", [False, True], ids=["host-source", "device-source"])
def test_a_fitted_networks_predict_reads_the_host_at_most_three_times(executor, device_source):
    reads = _reads(executor, "predict", device_source)
    assert len(reads) <= PREDICT_BUDGET, reads
    assert not any("validation.py" in r for r in reads), reads   # no finite check inside the estimators


@pytest.mark.parametrize("executor", _EXECUTORS)
def test_a_gpu_grid_search_reads_the_host_at_most_87_times(executor):
    reads = _reads(executor, "search")
    assert len(reads) <= SEARCH_BUDGET, (len(reads), reads)


# ----------------------------------------------------------------- bad input: the same error as before


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_nan_source_meets_the_same_error_on_the_gpu_as_on_the_cpu(cp, gn_executor, bad):
    from gpunets.devices.finite import all_finite, refuse_nonfinite, run_config

    X, y = _data()
    X[7, 2] = bad
    assert all_finite(X) is False and all_finite(cp.asarray(X)) is False
    errors = {}
    for device in ("cpu", "cuda"):
        Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
        P = gn.machine(PCA(3), Xs).transform(Xs)
        m = gn.machine(Ridge(solver="svd"), P, ys)
        with pytest.raises(gn.FitError) as info:
            m.predict(P).fit(device=device, executor=gn_executor)
        assert m._state is None   # nothing was trained
        errors[device] = str(info.value)
    assert "NaN" in errors["cpu"] or "infinity" in errors["cpu"]
    # on the GPU the one finite check refuses it at the source, before any task: scikit-learn's message for the
    # input (the CPU's own, from the estimator that refused it there), naming the source and its readers
    sk = "Input X contains NaN." if np.isnan(bad) else "Input X contains infinity"
    assert sk in errors["cpu"] and sk in errors["cuda"], errors
    if os.environ.get("SCIPY_ARRAY_API") == "1":   # the machines run on the (fake) GPU: refused at the source
        assert "Source 'X' cannot be read by PCA" in errors["cuda"] and "nothing was fitted" in errors["cuda"]
    else:   # without array-API dispatch they fall back to the CPU: the CPU's error
        assert errors["cuda"] == errors["cpu"]
    Xs = gn.source(X, name="X")
    pca = gn.machine(PCA(3), Xs)
    plan = compile_fit([pca.transform(Xs)])
    with pytest.raises(gn.FitError, match="Source 'X' cannot be read by PCA: Input X contains") as info:
        refuse_nonfinite(plan, plan.tasks[0])
    assert isinstance(info.value, ValueError) and pca._state is None
    imputed = gn.machine(SimpleImputer(), Xs)   # a reader that takes NaN: the estimators' own checks decide
    plan = compile_fit([pca.transform(Xs), imputed.transform(Xs)])
    assert refuse_nonfinite(plan, plan.tasks[0]) is None
    plan = compile_fit([gn.machine(PCA(3), Xs + 0).transform(Xs + 0)])   # an operation reads it: not refused
    assert refuse_nonfinite(plan, plan.tasks[0]) is None
    with gn.device("cuda"):
        plan = compile_call([gn.source(X, name="X") + 1], {})
    assert not (run_config(plan) or {}).get("assume_finite")   # the estimators check it themselves


def test_finite_sources_of_a_gpu_run_let_estimators_skip_their_checks(cp):
    from gpunets.devices.finite import run_config

    X, _ = _data()
    with gn.device("cuda"):
        on_gpu = compile_call([gn.source(X, name="X") + 1], {})
    with gn.device("cpu"):
        on_cpu = compile_call([gn.source(X, name="X") + 1], {})
    assert run_config(on_gpu) == {"assume_finite": True}
    assert not run_config(on_cpu)   # a CPU run is left as it was


# ----------------------------------------------------------------- events, ordinals, the graveyard


def _chain(n, device="cuda"):
    X = gn.source(np.ones(4), name="X")
    with gn.device(device):
        node = X
        for _ in range(n):
            node = gn.node(_same, node)
    return node


def _same(x):
    return x


def test_a_chain_on_one_stream_records_one_event_and_reuses_pooled_events(cp, monkeypatch):
    from gpunets.devices import _fakecuda

    made = []
    init = _fakecuda.Event.__init__

    def counted(self, *a, **k):
        made.append(1)
        init(self, *a, **k)

    out = _chain(50)
    ex = gn.StreamsExecutor(workers=4)
    plan = compile_call([out], {})
    run = ex.run(plan)
    assert run.error is None
    assert sum(ex.last_layout.needs_event) == 1   # the output only: one stream, no edge crosses
    monkeypatch.setattr(_fakecuda.Event, "__init__", counted)
    assert ex.run(compile_call([out], {})).error is None
    assert made == []   # the start and output events came from the pool
    assert cp.order_violations() == []


def test_device_ordinals_are_resolved_once_per_plan(cp, monkeypatch):
    from gpunets.executors import _cuda_streams

    calls = []
    real = _cuda_streams.local_ordinal
    monkeypatch.setattr(_cuda_streams, "local_ordinal", lambda i: calls.append(i) or real(i))
    plan = compile_call([_chain(100)], {})
    assert gn.StreamsExecutor(workers=2).run(plan).error is None
    assert len(calls) <= 2, len(calls)   # one device name in the plan (cpu is no CUDA ordinal)


def _fan_in_done_calls(n, monkeypatch):
    from gpunets.executors import _cuda_streams

    calls = [0]
    real = _cuda_streams.EmulatedBackend.done

    def done(self, event):
        calls[0] += 1
        return real(self, event)

    monkeypatch.setattr(_cuda_streams.EmulatedBackend, "done", done)
    X = gn.source(np.ones(2), name="X")
    parts = [gn.node(_same, X) for _ in range(n)]
    out = gn.node(lambda *xs: xs[0] + len(xs), *parts)
    np.testing.assert_array_equal(out(executor=gn.StreamsExecutor(workers=4, emulate=True)), np.ones(2) + n)
    return calls[0]


def test_fan_in_costs_linear_work_in_the_graveyard(monkeypatch):
    small, large = _fan_in_done_calls(100, monkeypatch), _fan_in_done_calls(1000, monkeypatch)
    assert large <= 15 * max(small, 1), (small, large)   # O(N): ~10x for 10x the inputs (O(N^2) is ~100x)


# ----------------------------------------------------------------- one issuing thread


def test_non_blocking_gpu_tasks_are_issued_by_one_thread_and_fits_get_lane_threads(cp):
    X, y = _data()
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    with gn.device("cuda"):
        branches = [gn.machine(Ridge(alpha=a, solver="svd"), Xs, ys).predict(Xs) for a in (0.1, 1.0, 10.0)]
        out = gn.mean(*[b * 2 for b in branches])
    report = gn.fit(out, executor=gn.StreamsExecutor(workers=3))
    fits = [r for r in report.trace.records if r.kind == "fit"]
    # lane threads (a GPU lane, or a CPU one where the fit fell back to the CPU), never the issuer
    assert len(fits) == 3 and all(r.thread.startswith(("gpunets-cuda-0-", "gpunets-cpu-")) for r in fits), fits
    ev = gn.evaluate(out, executor=gn.StreamsExecutor(workers=3), trace=True)
    rest = [r for r in ev.trace.records if r.device.startswith("cuda")]
    assert len(rest) >= 7 and {r.thread.split(".")[0] for r in rest} == {"gpunets-cuda-issue"}, rest
    np.testing.assert_allclose(ev.value, out(executor="serial"), rtol=1e-9)
    assert cp.order_violations() == []


@pytest.mark.parametrize("seed", range(3))
def test_the_fake_gpu_catches_a_missing_wait_in_the_issue_order(cp, seed):
    cp.cuda.Device().synchronize()
    X = gn.source(cp.asarray(np.arange(6.0)), name="X")
    with gn.device("cuda"):
        a, b = X + 1, X * 2
        out = gn.node(lambda u, v: u + v, a, b, name="join")
    plan = compile_call([out], {}, max_lanes=2)
    assert plan.n_lanes == 2
    ok = gn.StreamsExecutor(workers=2).run(plan)
    assert ok.error is None and cp.order_violations() == []
    plan = compile_call([out], {}, max_lanes=2)
    ex = gn.StreamsExecutor(workers=2, skip_wait=lambda consumer, producer: True)
    run = ex.run(plan)
    assert isinstance(run.error, gn.EvaluationError) and isinstance(run.error.__cause__ or run.error._gn_original,
                                                                     gn.StreamOrderError)
    assert cp.order_violations()


def test_the_race_checker_covers_the_issue_order():
    X = gn.source(np.arange(6.0), name="X")
    a, b = X + 1, X * 2
    out = gn.node(lambda u, v: u + v, a, b, name="join")
    plan = compile_call([out], {}, max_lanes=2)
    good = gn.StreamsExecutor(workers=2, emulate=True, issuer=True, check=True, delays=(0, 0.002), seed=1)
    assert good.run(plan).error is None and not good.last_checker.violations
    assert set(good.last_layout.threads) == {("cuda", "issue")}
    bad = gn.StreamsExecutor(workers=2, emulate=True, issuer=True, check=True,
                             skip_wait=lambda consumer, producer: True)
    run = bad.run(compile_call([out], {}, max_lanes=2))
    assert isinstance(getattr(run.error, "_gn_original", run.error), gn.StreamOrderError)
    assert bad.last_checker.violations


# ----------------------------------------------------------------- out of GPU memory


def _workers_without_a_gpu(executor) -> bool:
    """A Dask executor whose workers (other processes) see no GPU, not even the fake one: the fake GPU of the
    ``cp`` fixture is this process's. (In the fake-GPU lane the workers inherit it, and these tests run there.)"""
    if getattr(executor, "name", "") != "dask":
        return False
    from gpunets.devices._gpulibs import fake_gpu_count

    client = getattr(executor, "client", None)
    if client is None:
        return not fake_gpu_count()
    return not all(client.run(fake_gpu_count).values())


def _greedy(z):   # module level: the Dask workers unpickle it by reference
    from gpunets.devices import _fakegraph  # lazy: the fake GPU's error (cupy.cuda.memory), where the task runs

    raise _fakegraph.OutOfMemoryError(8_000_000_000, 1_234_567)


def test_out_of_gpu_memory_names_the_task_device_bytes_and_what_held_memory(cp, gn_executor):
    if _workers_without_a_gpu(gn_executor):
        pytest.skip("the Dask workers see no GPU here (in the fake-GPU lane they do, and this runs there)")
    X, _ = _data()
    Xs = gn.source(X, name="X")
    first = gn.machine(StandardScaler(), Xs)
    Z = first.transform(Xs)

    with gn.device("cuda"):
        big = gn.node(lambda z: z * 2, Z, name="big")
        boom = gn.node(_greedy, big, name="greedy")
    with pytest.raises(gn.EvaluationError) as info:
        gn.fit(boom, executor=gn_executor)
        boom(executor=gn_executor)
    err = info.value
    assert isinstance(err, MemoryError)
    msg = str(err)
    assert "greedy" in msg and "cuda:0" in msg and "8,000,000,000 bytes" in msg, msg
    assert "held" in msg and "Hint:" in msg, msg
    assert first._state is not None   # the fit committed before the failure is kept


class _GreedyRidge(Ridge):
    """A Ridge that runs out of GPU memory when it is fitted on device arrays (the fake GPU's OutOfMemoryError)."""

    def fit(self, X, y, sample_weight=None):
        from gpunets.devices.value_types import is_cupy_array

        if is_cupy_array(X):
            from gpunets.devices import _gpulibs

            raise _gpulibs.cupy().cuda.memory.OutOfMemoryError(8_000_000_000, 1_234_567)
        return super().fit(X, y, sample_weight=sample_weight)


def oom_fallback_outcome(executor: str) -> dict:
    """What an out-of-memory array-API fit does on the fake GPU, with and without ``fallback="cpu"``."""
    import warnings

    warnings.simplefilter("ignore")
    X, y = _data()
    out: dict = {}
    with fake_gpu(1):
        Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
        first = gn.machine(StandardScaler(), Xs)
        Z = first.transform(Xs)
        m = gn.machine(_GreedyRidge(solver="svd"), Z, ys)
        try:
            m.predict(Z).fit(device="cuda", executor=executor)
        except MemoryError as e:
            out["error"], out["kept"] = str(e), first._state is not None and m._state is None
        with gn.config(fallback="cpu"):
            report = m.predict(Z).fit(device="cuda", executor=executor)
        out["path"], out["device"], out["report"] = m._state.path, str(m._state.device), repr(report)
        pred = m.predict(Z)(executor=executor, output="numpy")
        ref = Ridge(solver="svd").fit(StandardScaler().fit_transform(X), y).predict(StandardScaler().fit_transform(X))
        out["same"] = bool(np.allclose(pred, ref, rtol=1e-6, atol=1e-8))
    return out


@pytest.mark.parametrize("executor", _EXECUTORS)
def test_out_of_gpu_memory_in_a_fit_stops_the_run_or_refits_on_the_cpu_with_fallback_cpu(executor):
    if _in_process():
        res = oom_fallback_outcome(executor)
    else:
        code = f"import json, tests.test_host_cost as t; print(json.dumps(t.oom_fallback_outcome({executor!r})))"
        env = dict(os.environ, SCIPY_ARRAY_API="1", CUPY_CUDA_PER_THREAD_DEFAULT_STREAM="1",
                   PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
        env.pop("GPUNETS_FAKE_GPU", None)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        import json

        res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "_GreedyRidge" in res["error"] and "cuda:0" in res["error"] and "8,000,000,000 bytes" in res["error"]
    assert res["kept"]   # the scaler fitted before the failure keeps its state, the Ridge has none
    assert (res["path"], res["device"]) == ("cpu_fallback", "cpu")
    assert "_GreedyRidge cpu_fallback" in res["report"], res["report"]
    assert res["same"]


@pytest.mark.parametrize("issuer", [True, None], ids=["issuer", "lane-threads"])
def test_a_fan_in_waits_once_per_producer_stream_and_the_checker_agrees(issuer):
    X = gn.source(np.arange(3.0), name="X")
    parts = [gn.node(_same, X + i) for i in range(40)]
    out = gn.node(lambda *xs: sum(xs), *parts, name="join")
    plan = compile_call([out], {}, max_lanes=4)
    ex = gn.StreamsExecutor(workers=4, emulate=True, issuer=issuer, check=True, delays=(0, 0.0003), seed=2)
    run = ex.run(plan)
    assert run.error is None and not ex.last_checker.violations
    np.testing.assert_array_equal(run.values[plan.outputs[0]], sum(np.arange(3.0) + i for i in range(40)))
    join = plan.outputs[0]
    waits = [e for e in ex.last_checker.log if e[0] == "wait" and e[1] == join]
    assert 1 <= len(waits) <= 3, waits   # one per other lane: stream order covers the other 12-13 each
    assert sum(ex.last_layout.needs_event) <= 4   # the last task of each other lane, and the join (the output)


# ----------------------------------------------------------------- item 1: see the host


def test_a_gpu_fit_reports_its_gpu_busy_fraction_routes_and_host_spans(cp, gn_executor):
    if _workers_without_a_gpu(gn_executor):
        pytest.skip("the Dask workers see no GPU here (in the fake-GPU lane they do, and this runs there)")
    X, y = _data()
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    with gn.device("cuda"):
        W = (Xs * 2.0) + 1.0   # GPU tasks whatever the estimators' routes (array API, or the CPU without it)
        Z = gn.machine(StandardScaler(), W).transform(W)
        yhat = gn.machine(Ridge(solver="svd"), Z, ys).predict(Z)
    report = gn.fit(yhat, executor=gn_executor)
    gpu = report.trace.gpu_records()
    assert gpu and all(r.issued is not None for r in gpu)   # each GPU task: its host span and its GPU span
    assert report.gpu_busy is not None and 0 < report.gpu_busy <= 1 + 1e-9
    assert set(report.routes.values()) <= {"array_api", "cpu_fallback", "cuml", "sklearn"}
    text = repr(report)
    assert "GPU busy" in text and "routes:" in text, text
    ev = gn.evaluate(yhat, executor=gn_executor, trace=True)
    assert ev.trace.gpu_busy is not None and "GPU busy" in repr(ev.trace)
    pytest.importorskip("matplotlib")
    assert "GPU busy" in ev.trace.to_svg()


def test_a_host_bound_run_says_so_in_one_line():
    from gpunets.base.trace import Trace, TraceRecord

    t = Trace(executor="streams")
    t.records.extend([TraceRecord(0, "eval", "a", 0, "cuda:0", 0.010, 0.011, "w", issued=(0.0, 0.010)),
                      TraceRecord(1, "eval", "b", 1, "cuda:0", 0.030, 0.031, "w", issued=(0.011, 0.030))])
    assert round(t.gpu_busy, 3) == round(0.002 / 0.031, 3) and t.host_bound
    line = t.gpu_summary()
    assert "\n" not in line and "host-bound" in line
    busy = Trace(executor="streams")
    busy.records.append(TraceRecord(0, "eval", "a", 0, "cuda:0", 0.001, 0.1, "w", issued=(0.0, 0.001)))
    assert not busy.host_bound and "host-bound" not in busy.gpu_summary()
    assert Trace().gpu_busy is None and Trace().gpu_summary() == ""

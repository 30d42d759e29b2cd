"""Plans and executors: same results everywhere, stream checking, nesting, failures, traces."""

import json
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.linear_model import LinearRegression, Ridge

import gpunets as gn
from gpunets.executors import choose_auto, get_executor, pool
from gpunets.planning.plan import compile_call, compile_fit
from tests.helpers import Counting, NetModel


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 4))
    return X, X @ np.arange(1.0, 5.0) + 0.1 * rng.normal(size=60)


def serial_reference(build):
    out = build()
    out.fit(executor="serial")
    return out(executor="serial")


def test_lanes_follow_grcuda_policy():
    X = gn.source(np.ones(3), name="X")
    a = X + 1          # root: lane 0
    b = a * 2          # a's first child: inherits lane 0
    c = a * 3          # a's second child: a new lane
    d = b + c          # join: inherits b's lane
    plan = compile_call([d], {})
    assert plan.n_lanes == 2     # lanes are assigned on first use
    lanes = {t.label: t.lane for t in plan.tasks if t.kind != "source"}
    assert lanes["add(X, 1)"] == lanes["mul(add(X, 1), 2)"] == lanes["add(mul(add(X, 1), 2), mul(add(X, 1), 3))"]
    assert lanes["mul(add(X, 1), 3)"] != lanes["add(X, 1)"]
    assert plan.n_lanes == 2


def test_lanes_are_capped_and_free_lanes_reused():
    X = gn.source(np.ones(3), name="X")
    branches = [X + i for i in range(6)]
    plan = compile_call([gn.mean(*branches)], {}, max_lanes=2)
    assert plan.n_lanes == 2
    chain = X
    for i in range(5):
        chain = chain + i
    plan = compile_call([chain], {})
    assert plan.n_lanes == 1


def test_skipped_machines_cost_no_task(data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    a, b = gn.machine(Ridge(), Xs, ys), gn.machine(LinearRegression(), Xs, ys)
    out = gn.mean(a.predict(Xs), b.predict(Xs))
    out.fit()
    b.model.fit_intercept = False
    plan = compile_fit([out])
    assert [t.label for t in plan.tasks if t.kind == "fit"] == ["fit LinearRegression"]
    assert plan.actions[a] == "skip"


def test_every_executor_gives_the_serial_result(executor, data):
    X, y = data

    def build():
        Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
        ms = [gn.machine(Ridge(alpha=a), Xs, ys) for a in (0.1, 1.0, 10.0)]
        return gn.mean(*[m.predict(Xs) for m in ms]) + gn.machine(LinearRegression(), Xs, ys).predict(Xs)

    expected = serial_reference(build)
    out = build()
    report = out.fit()
    assert report.executor.startswith(executor.name)
    np.testing.assert_array_equal(out(), expected)
    np.testing.assert_array_equal(out(X[:7]), expected[:7])


@pytest.fixture
def on_the_cpu():
    """Machines placed on the CPU: for tests of what the executors do with a CPU plan (GPU plans: below)."""
    with gn.config(device="cpu"):
        yield


def test_config_block_sets_the_default_executor(data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    out = gn.mean(gn.machine(Ridge(), Xs, ys).predict(Xs), gn.machine(LinearRegression(), Xs, ys).predict(Xs))
    gpu = gn.devices.placement.gpu_available()   # device="auto" puts the machines on the GPU: CUDA streams run them
    with gn.config(executor="serial"):
        assert out.fit().executor == ("serial (on CUDA streams)" if gpu else "serial")
    with gn.config(executor="threads", workers=2):
        assert out.fit(force=True).executor == ("threads (on CUDA streams)" if gpu else "threads")
    assert out.fit(force=True, executor="streams", workers=2).executor == ("streams" if gpu else "streams (emulated)")


@pytest.mark.usefixtures("on_the_cpu")
def test_auto_picks_by_width_and_size(data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    single = gn.machine(Ridge(), Xs, ys).predict(Xs)
    assert choose_auto(compile_fit([single])) == "serial"  # too small to gain
    wide = gn.mean(*[gn.machine(Ridge(alpha=a), Xs, ys).predict(Xs) for a in (1, 2, 3)])
    assert choose_auto(compile_fit([wide], max_lanes=2)) == "threads"
    assert wide.fit().executor == "threads"


def test_streams_checker_passes_a_correct_plan():
    X = gn.source(np.arange(5.0), name="X")
    branches = [(X + i) * 2 for i in range(4)]
    out = gn.mean(*branches) + branches[0]
    ex = gn.StreamsExecutor(workers=3, delays=(0.0, 0.003), seed=1, check=True)
    for _ in range(3):
        np.testing.assert_array_equal(out(executor=ex), serial_reference(lambda: out))
    checker = ex.last_checker
    assert not checker.violations
    waits = [e for e in checker.log if e[0] == "wait"]
    assert waits, "cross-lane edges must have been waited on"


def test_streams_checker_catches_a_missing_wait():
    X = gn.source(np.arange(5.0), name="X")

    def slow(x):
        time.sleep(0.05)
        return x + 1

    a = gn.node(slow, X)
    b = gn.node(slow, X)        # another lane
    out = a + b                 # join: waits on b's lane
    plan = compile_call([out], {}, max_lanes=2)
    assert plan.n_lanes == 2
    drop = lambda consumer, producer: consumer.label.startswith("add")  # noqa: E731 - plant a missing wait
    ex = gn.StreamsExecutor(workers=2, check=True, skip_wait=drop)
    with pytest.raises(gn.StreamOrderError, match="cross-lane edge without a wait"):
        out(executor=ex)
    assert any("without waiting" in v for v in ex.last_checker.violations)
    # the same plan with its wait in place is fine
    np.testing.assert_array_equal(out(executor=gn.StreamsExecutor(workers=2, check=True)), np.arange(5.0) * 2 + 2)


class Const(BaseEstimator, RegressorMixin):
    """Deterministic model: predicts X @ w + c with w from params (exact across executors)."""

    def __init__(self, c=0.0):
        self.c = c

    def fit(self, X, y):
        self.w_ = np.linspace(0.5, 1.5, np.asarray(X).shape[1]) * (1 + self.c)
        self.b_ = float(np.mean(y)) + self.c
        return self

    def predict(self, X):
        return np.asarray(X) @ self.w_ + self.b_


@st.composite
def networks(draw):
    """Random networks: fan-out, fan-in, chains and shared sub-nodes of deterministic models."""
    n_ops = draw(st.integers(2, 12))
    ops = []
    for i in range(n_ops):
        kind = draw(st.sampled_from(["machine", "add", "scale", "mean", "chain"]))
        a = draw(st.integers(0, i)) if i else 0
        b = draw(st.integers(0, i)) if i else 0
        ops.append((kind, a, b, draw(st.floats(-2, 2, allow_nan=False))))
    return ops


def _row_sum(x):
    return x.sum(axis=1)


def build_random(ops, X, y):
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    nodes = [Xs]
    vec_of_x = gn.node(_row_sum, Xs)   # a shared sub-node

    def vec(n):
        return vec_of_x if n is Xs else n

    for kind, a, b, c in ops:
        na, nb = nodes[a % len(nodes)], nodes[b % len(nodes)]
        c = round(c, 3)
        if kind == "machine":
            src = Xs if na is Xs else gn.hstack(Xs, na)
            nodes.append(gn.machine(Const(c=c), src, ys).predict(src))
        elif kind == "add":
            nodes.append(vec(na) + vec(nb))
        elif kind == "scale":
            nodes.append(vec(na) * c)
        elif kind == "mean":
            nodes.append(gn.mean(vec(na), vec(nb)))
        else:
            nodes.append((vec(na) + 1.0) * 0.5 + 2.0)
    leaves = [vec(n) for n in nodes[1:]]
    return gn.node(lambda *vs: np.concatenate([np.ravel(v) for v in vs]), *leaves)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=networks())
def test_random_networks_bit_for_bit_on_every_executor(ops):
    rng = np.random.default_rng(5)
    X, y = rng.normal(size=(12, 3)), rng.normal(size=12)
    expected = None
    for ex in [gn.SerialExecutor(), gn.ThreadsExecutor(workers=2),
               gn.StreamsExecutor(workers=3, delays=(0, 0.0005), seed=2, check=True)]:
        out = build_random(ops, X, y)
        out.fit(executor=ex)
        value = out(executor=ex)
        if expected is None:
            expected = value
        else:
            np.testing.assert_array_equal(value, expected)
        np.testing.assert_array_equal(out(X[:4], executor=ex), build_eval_on_new(ops, X, y, X[:4]))


def build_eval_on_new(ops, X, y, Xnew):
    out = build_random(ops, X, y)
    out.fit(executor="serial")
    return out(Xnew, executor="serial")


def test_nested_networks_three_levels_do_not_deadlock(executor, data):
    X, y = data
    innermost = NetModel(executor=executor.name if executor.name != "dask" else "threads", workers=2)
    middle = NetModel(first=innermost, second=Ridge(), executor="threads", workers=2)

    def build(model):
        Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
        a = gn.machine(model, Xs, ys)
        b = gn.machine(LinearRegression(), Xs, ys)
        return gn.mean(a.predict(Xs), b.predict(Xs))

    expected = serial_reference(lambda: build(NetModel(first=NetModel(executor="serial"), second=Ridge(),
                                                       executor="serial")))
    out = build(middle)
    done = threading.Event()
    result = {}

    def go():
        out.fit(workers=2)
        result["value"] = out(workers=2)
        done.set()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    assert done.wait(120), "nested fit deadlocked"
    np.testing.assert_allclose(result["value"], expected, rtol=1e-12)


def test_failing_task_stops_the_run_cleanly(data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    started = []

    def record(x):
        started.append(1)
        time.sleep(0.01)
        return x

    bad = gn.machine(Counting(tag="stop-bad", fail=True), Xs, ys)
    later = [gn.node(record, bad.predict(Xs) + i) for i in range(5)]
    out = gn.mean(*later)
    for ex in ["serial", gn.ThreadsExecutor(workers=2), gn.StreamsExecutor(workers=2)]:
        with pytest.raises(gn.FitError, match="Machine Counting failed to fit"):
            out.fit(executor=ex)
        assert started == []
        assert pool.busy_workers() == []   # no work outlives its run; the workers are back in the pool


def test_keyboard_interrupt_leaves_no_threads(data):
    X = gn.source(np.ones(3), name="X")

    def interrupt(x):
        raise KeyboardInterrupt

    def slow(x):
        time.sleep(0.05)
        return x

    out = gn.mean(gn.node(interrupt, X), gn.node(slow, X), gn.node(slow, X))
    for ex in [gn.ThreadsExecutor(workers=2), gn.StreamsExecutor(workers=3)]:
        with pytest.raises(KeyboardInterrupt):
            out(executor=ex)
        assert pool.busy_workers() == []   # every task of the run has returned: no stray work
        n = threading.active_count()
        with pytest.raises(KeyboardInterrupt):
            out(executor=ex)
        assert threading.active_count() == n   # the workers are reused, not left behind


@pytest.mark.parametrize("make", [lambda: gn.ThreadsExecutor(workers=3), lambda: gn.StreamsExecutor(workers=3)],
                         ids=["threads", "streams"])
def test_consecutive_runs_reuse_worker_threads(make):
    X = gn.source(np.arange(4.0), name="X")
    out = gn.mean(*[(X + i) * 2 for i in range(4)])
    ex = make()
    out(executor=ex)   # the first run may make the workers
    seen = set()

    def where(x):
        seen.add(threading.current_thread())   # the thread objects themselves: a new thread is a new object
        return x

    probe = gn.node(where, out)
    n = threading.active_count()
    for _ in range(20):
        np.testing.assert_array_equal(probe(executor=ex), out(executor="serial"))
    assert threading.active_count() == n
    assert 1 <= len(seen) <= 3, f"20 runs used {len(seen)} threads: each run must reuse the same workers"


@pytest.mark.usefixtures("on_the_cpu")
def test_trace_records_and_exports(tmp_path, data):
    X, y = data
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    out = gn.mean(gn.machine(Ridge(), Xs, ys).predict(Xs), gn.machine(LinearRegression(), Xs, ys).predict(Xs))
    report = out.fit(executor="streams", workers=2)
    trace = report.trace
    kinds = sorted(r.kind for r in trace.records)
    assert kinds == ["fit", "fit"]
    for r in trace.records:
        assert r.end >= r.start >= 0 and r.device == "cpu" and r.lane in (0, 1)
    path = trace.to_chrome(tmp_path / "fit.json")
    payload = json.loads(open(path).read())
    names = [e["name"] for e in payload["traceEvents"] if e["ph"] == "X"]
    assert sorted(names) == ["fit LinearRegression", "fit Ridge"]
    ev = gn.evaluate(out, X[:3], trace=True, executor="threads", workers=2)
    assert ev.value.shape == (3,) and {r.kind for r in ev.trace.records} == {"eval"}
    assert gn.last_trace() is ev.trace
    pytest.importorskip("matplotlib")
    ax = trace.plot(path=tmp_path / "fit.png")
    assert (tmp_path / "fit.png").stat().st_size > 1000 and len(ax.patches) == 2


def test_threads_run_branches_at_the_same_time():
    X = gn.source(np.ones(3), name="X")
    barrier = threading.Barrier(2, timeout=5)

    def meet(x):
        barrier.wait()  # only passes if both branches run at once
        return x

    out = gn.node(np.add, gn.node(meet, X), gn.node(meet, X + 0))
    np.testing.assert_array_equal(out(executor=gn.ThreadsExecutor(workers=2)), 2 + 0 * np.ones(3))
    barrier.reset()
    np.testing.assert_array_equal(out(executor=gn.StreamsExecutor(workers=2)), 2 * np.ones(3))


def test_threads_run_short_tasks_in_the_calling_thread_until_they_grow():
    """serial_below=: short tasks run in the caller, one slow task (a pause) does not start the threads, two in
    a row over the limit do; the result is the serial one, a failure raises as on the threads."""
    import time

    X = gn.source(np.ones(3), name="X")
    ran = []

    def step(x, seconds):   # busy: the rule reads the thread's CPU time
        ran.append(threading.current_thread().name)
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass
        return x + 1

    def chain(delays):
        out = X
        for d in delays:
            out = gn.node(step, out, d)
        return out

    ex = gn.ThreadsExecutor(workers=2, serial_below=0.02)
    out = chain([0.0, 0.05, 0.0, 0.0])   # one slow task among short ones
    np.testing.assert_array_equal(out(executor=ex), 5 * np.ones(3))
    assert set(ran) == {threading.current_thread().name}
    ran.clear()
    out = chain([0.0, 0.03, 0.03, 0.0, 0.0])   # two slow tasks in a row: the rest on the worker threads
    np.testing.assert_array_equal(out(executor=ex), 6 * np.ones(3))
    assert ran[:3] == [threading.current_thread().name] * 3
    assert all(t.startswith("gpunets-cpu") for t in ran[3:])

    def boom(x):
        raise ValueError("boom")

    with pytest.raises(gn.EvaluationError, match="boom"):
        gn.node(boom, X)(executor=ex)
    with pytest.raises(ValueError, match="serial_below=0"):
        gn.ThreadsExecutor(serial_below=0)


def test_threads_cap_native_thread_pools():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    seen = []

    def probe(x):
        info = threadpoolctl.threadpool_info()
        seen.append([i["num_threads"] for i in info if i["user_api"] == "blas"])
        return x

    X = gn.source(np.ones(3), name="X")
    out = gn.node(np.add, gn.node(probe, X), gn.node(probe, X + 0))
    before = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    out(executor=gn.ThreadsExecutor(workers=2))
    cap = max(1, gn.executors.base.default_workers() // 2)   # the cores shared by the 2 workers: 1 on 2 cores
    assert seen and all(s == [min(cap, b) for b in before] for s in seen), (seen, cap, before)   # never raised
    assert [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"] == before


def test_a_native_thread_cap_never_raises_a_pool():
    """A pool the user set below the cap (OPENBLAS_NUM_THREADS=1 on many cores) keeps its count in a run."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from gpunets.executors.threads import limit_native_threads

    if not threadpoolctl.threadpool_info():
        pytest.skip("threadpoolctl sees no native thread pool here")
    with threadpoolctl.threadpool_limits(limits=1):
        before = [i["num_threads"] for i in threadpoolctl.threadpool_info()]
        with limit_native_threads(8, "blas"), limit_native_threads(8, "openmp"):
            assert [i["num_threads"] for i in threadpoolctl.threadpool_info()] == before == [1] * len(before)


def test_get_executor_dispatch():
    assert get_executor("serial").name == "serial"
    ex = gn.ThreadsExecutor(workers=3)
    assert get_executor(ex) is ex


def test_auto_runs_a_one_gpu_plan_serially_and_spreads_several_gpus_on_streams():
    """Measured on an H200: from Python, one thread issues a GPU's kernels fastest (8 lanes of small CuPy steps
    ran 2.3x slower than serial), so auto picks serial on one GPU; a lane per GPU where the plan spans several."""
    from gpunets.testing import fake_gpu

    with fake_gpu(2) as cp:
        X = gn.source(cp.asarray(np.arange(6.0)), name="X")
        one = gn.mean(*[X * k for k in range(4)])
        ev = gn.evaluate(one, trace=True, output="numpy")
        assert ev.trace.executor.startswith("serial") and "one GPU (cuda:0)" in ev.executor_reason, ev.executor_reason
        np.testing.assert_array_equal(ev.value, 1.5 * np.arange(6.0))
        with gn.device("cuda:1"):
            other = X * 2
        two = gn.node(np.add, one, gn.node(lambda a: a, other, device="cuda:0"), device="cuda:0")
        ev = gn.evaluate(two, trace=True, output="numpy")
        assert ev.trace.executor == "streams" and "2 GPUs (cuda:0, cuda:1)" in ev.executor_reason, ev.executor_reason
        np.testing.assert_array_equal(ev.value, 3.5 * np.arange(6.0))
        assert gn.evaluate(one, executor="streams", trace=True).trace.executor == "streams"   # still on request


def test_auto_on_one_gpu_follows_the_measured_busy_fraction():
    """Issue 36 item 7: on one GPU, auto picks streams once earlier runs timed the plan's GPU tasks GPU-bound on
    two branches or more, serial where they were host-bound or never timed; the reason says which."""
    from gpunets.executors import gpu_auto
    from gpunets.testing import fake_gpu

    with fake_gpu(1) as cp:
        X = gn.source(cp.asarray(np.random.default_rng(0).normal(size=(160, 160))), name="X")
        left, right = gn.node(lambda a: a @ a @ a, X, name="left"), gn.node(lambda a: a.T @ a @ a, X, name="right")
        out = gn.node(lambda a, b: a + b, left, right)
        first = gn.evaluate(out, trace=True, output="numpy")
        assert first.trace.executor.startswith("serial"), first.executor_reason
        assert "0 of its 3 tasks were timed" in first.executor_reason, first.executor_reason
        plan_tasks = [left, right, out]
        for node in plan_tasks:   # what an H200 measured for GPU-bound kernels: 4 ms of GPU per 0.1 ms issued
            gpu_auto._SEEN[node] = (4e-3, 1e-4)
        busy = gn.evaluate(out, trace=True, output="numpy")
        assert busy.trace.executor == "streams", busy.executor_reason
        assert "GPU-bound in earlier runs" in busy.executor_reason and "2 independent branches" in busy.executor_reason
        np.testing.assert_array_equal(busy.value, first.value)
        for node in plan_tasks:   # host-bound: 1 ms of GPU work issued over 4 ms of Python
            gpu_auto._SEEN[node] = (1e-3, 4e-3)
        host = gn.evaluate(out, trace=True, output="numpy")
        assert host.trace.executor.startswith("serial") and "host-bound in earlier runs" in host.executor_reason
        np.testing.assert_array_equal(host.value, first.value)
        # the runs themselves leave their measurements: every timed GPU task of the last run is remembered
        assert all(gpu_auto._SEEN.get(n) not in (None, (1e-3, 4e-3)) for n in plan_tasks)


# ---- the CUDA backend on the CPU: a fake cupy.cuda that checks CUDA's rules -----------------------------------

class _FakeCupy:
    """Just the part of ``cupy.cuda`` the CUDA backend uses, with CUDA's rules checked.

    Mirrors CuPy's signatures (``Stream(null, non_blocking, ptds)``, ``Stream.ptds``,
    ``Event(block, disable_timing, interprocess)`` with ``.done``, ``.record(stream)``,
    ``.synchronize()``; ``Stream.wait_event``, ``Stream.record``; ``Device(n)`` as a context;
    ``get_current_stream()``, per thread and per device).  Like CUDA, an event never recorded
    is ``done``; a recorded one completes on ``synchronize()`` or after a few queries.
    An event is recorded only on a stream of the device it was made on.
    """

    def __init__(self) -> None:
        fake = self
        self.tls = threading.local()
        self.errors: list[str] = []
        self.synced: list[tuple] = []
        self.gpu_lag = self.lag_step = 0.0
        self.events: list = []
        self.lock = threading.Lock()
        self._next = [100]

        class Stream:
            null = ptds = None

            def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
                if null or ptds:
                    self.ptr, self.device_id = (0 if null else 2), -1
                else:
                    with fake.lock:
                        self.ptr = fake._next[0] = fake._next[0] + 1
                    self.device_id = fake.device()
                self.waited: set[int] = set()   # ids of the events this stream waited on (per thread for ptds)

            def _key(self):
                return (self.ptr, fake.device(), threading.get_ident() if self.ptr in (0, 2) else 0)

            def __enter__(self):
                dev = fake.device()
                if self.device_id not in (-1, dev):
                    fake.errors.append(f"stream of device {self.device_id} made current on device {dev}")
                fake.streams().setdefault(dev, []).append(self)
                fake.pushed().append(dev)
                return self

            def __exit__(self, *a):
                fake.streams()[fake.pushed().pop()].pop()

            def use(self):   # this thread's current stream on the current device, outside any `with stream`
                dev = fake.device()
                if self.device_id not in (-1, dev):
                    fake.errors.append(f"stream of device {self.device_id} made current on device {dev}")
                fake.used()[dev] = self
                return self

            def wait_event(self, event):
                if not isinstance(event, Event):
                    fake.errors.append(f"wait_event on a {type(event).__name__}")
                    return
                if not event.recorded:
                    fake.errors.append("wait_event on an event never recorded: a no-op in CUDA")
                fake.waits.setdefault(self._key(), set()).add(id(event))

            def record(self, event=None):
                event = event or Event()
                event.record(self)
                return event

            def synchronize(self):
                fake.synced.append(("stream", self.ptr))

        class Event:
            def __init__(self, block=False, disable_timing=False, interprocess=False):
                self.device = fake.device()
                self.recorded = self.completed = False
                self.queries = 0
                self.timing = not disable_timing
                with fake.lock:
                    fake.events.append(self)

            @property
            def done(self):
                self.queries += 1
                if self.recorded and self.queries >= 3:
                    self.completed = True
                return (not self.recorded) or self.completed

            def record(self, stream=None):
                stream = stream or fake.get_current_stream()
                dev = stream.device_id if stream.device_id != -1 else fake.device()
                if dev != self.device:
                    fake.errors.append(f"event of device {self.device} recorded on a stream of device {dev}")
                self.recorded, self.completed = True, False
                self.at = time.perf_counter() + fake.gpu_lag   # when the "GPU" reaches it
                fake.gpu_lag += fake.lag_step                  # a backlog that grows with the work issued

            def synchronize(self):
                self.completed = True

        class Device:
            def __init__(self, n=None):
                self.id = fake.device() if n is None else n

            def __enter__(self):
                fake.devices().append(self.id)
                return self

            def __exit__(self, *a):
                fake.devices().pop()

            def use(self):
                fake.devices()[0] = self.id   # the thread's device outside any `with Device`
                return self

            def synchronize(self):   # every event recorded on this device completes
                fake.synced.append(("device", self.id))
                for ev in list(fake.events):
                    if ev.device == self.id:
                        ev.completed = True

        Stream.null, Stream.ptds = Stream(null=True), Stream(ptds=True)
        self.waits: dict[tuple, set[int]] = {}
        self.cuda = type("cuda", (), {"Stream": Stream, "Event": Event, "Device": Device,
                                      "get_current_stream": staticmethod(self.get_current_stream),
                                      "is_available": staticmethod(lambda: True),
                                      "get_elapsed_time": staticmethod(self.elapsed)})

    def elapsed(self, start, end):   # milliseconds between two timed, completed events of one device
        for ev in (start, end):
            if not (ev.timing and ev.recorded and ev.completed):
                self.errors.append("get_elapsed_time on an event without timing, unrecorded or not complete")
        if start.device != end.device:
            self.errors.append("get_elapsed_time on events of two devices")
        return (end.at - start.at) * 1e3

    def devices(self):
        if not hasattr(self.tls, "devices"):
            self.tls.devices, self.tls.streams, self.tls.pushed = [0], {}, []
        return self.tls.devices

    def device(self):
        return self.devices()[-1]

    def streams(self):
        self.devices()
        return self.tls.streams

    def pushed(self):
        self.devices()
        return self.tls.pushed

    def used(self):
        self.devices()
        if not hasattr(self.tls, "used"):
            self.tls.used = {}
        return self.tls.used

    def get_current_stream(self):
        stack = self.streams().get(self.device())
        return stack[-1] if stack else self.used().get(self.device(), self.cuda.Stream.null)

    def waited_here(self):
        s = self.get_current_stream()
        return set(self.waits.get(s._key(), set())), s._key()


@pytest.fixture
def fake_cuda(monkeypatch):
    """The CUDA backend on the fake ``cupy.cuda`` above, with a GPU "present" (one place to swap fakes)."""
    from gpunets.executors import _cuda_streams, streams

    fake = _FakeCupy()
    monkeypatch.setattr(_cuda_streams, "_cupy", lambda: fake)
    monkeypatch.setattr(streams, "gpu_available", lambda: True)
    monkeypatch.setenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "1")   # as gpunets recommends (see the guard test)
    return fake


def _on_fake_gpus(plan, fake, seen, cpu=lambda t: False):
    """Place a compiled plan's tasks on cuda:0/cuda:1 (``cpu(task)``: on the CPU), recording where each ran."""
    for t in plan.tasks:
        if t.kind == "source":
            continue
        t.device = "cpu" if cpu(t) else f"cuda:{t.key % 2}"

        def wrapped(*a, _fn=t.fn, _k=t.key):
            seen[_k] = fake.waited_here() + (fake.device(), fake.get_current_stream())
            return _fn(*a)

        t.fn = wrapped


@pytest.mark.parametrize("kind", ["ptds", "new"])
def test_cuda_backend_orders_cross_stream_edges_and_keeps_values_alive(monkeypatch, fake_cuda, kind):
    from gpunets.executors import streams

    fake = fake_cuda
    X = gn.source(np.arange(6.0), name="X")
    branches = [(X + i) * 2 for i in range(5)]
    out = gn.mean(*branches) + branches[0]
    plan = compile_call([out], {}, max_lanes=3)
    assert plan.n_lanes == 3
    seen: dict[int, tuple] = {}
    _on_fake_gpus(plan, fake, seen, cpu=lambda t: t.key in plan.outputs)   # the output task on the CPU

    early: list[str] = []
    sweep = streams._StreamsRun._sweep

    def checked_sweep(self):
        sweep(self)
        for k, v in enumerate(self.values):
            if v is None and self.plan.tasks[k].kind != "source":
                for c in self.plan.consumers[k]:
                    ev = self.events[c]
                    if ev is None or not getattr(ev, "completed", True):
                        early.append(f"value {k} dropped before consumer {c} finished")

    monkeypatch.setattr(streams._StreamsRun, "_sweep", checked_sweep)
    run = gn.StreamsExecutor(workers=3, stream=kind).run(plan)
    assert run.error is None
    np.testing.assert_array_equal(run.values[plan.outputs[0]], serial_reference(lambda: out))
    assert not fake.errors, fake.errors
    assert not early, early
    tasks = plan.tasks
    for t in tasks:
        if t.kind == "source":
            continue
        waited, stream_key, dev, _ = seen[t.key]
        if t.device == "cpu":   # read on the host: every GPU producer had completed
            assert all(run.events[d].completed for d in t.deps if tasks[d].kind != "source")
            continue
        assert dev == int(t.device[-1])
        by_id = {id(ev): x for x, ev in enumerate(run.events) if ev is not None}
        for d in t.deps:
            p = tasks[d]
            if p.kind != "source" and (p.lane != t.lane or p.device != t.device):
                # an event of p's stream recorded at or after p (stream order covers the earlier tasks)
                assert any(by_id.get(w, -1) >= d and tasks[by_id[w]].lane == p.lane
                           and tasks[by_id[w]].device == p.device for w in waited), \
                    f"{t.label} did not wait for {p.label}"


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ptds", "new"])
def test_gpu_streams_executor_on_cuda_streams_equals_serial(kind):
    cp = pytest.importorskip("cupy")
    if not cp.cuda.is_available():
        pytest.skip("no CUDA GPU")
    Xg = cp.random.default_rng(0).standard_normal((2000, 500), dtype=cp.float32)

    def work(x, k):   # enough GPU work per branch that a missing wait or an early free would show
        w = x.T[:, : x.shape[1]]
        y = x
        for _ in range(4):
            y = cp.tanh(y @ w) * 0.5 + 0.01 * k
        return y

    with gn.device("cuda"):
        X = gn.source(Xg, name="X")
        branches = [gn.node(work, X, k, name=f"b{k}") for k in range(6)]
        out = gn.mean(*branches) + gn.node(work, branches[0], 9, name="tail")
    want = cp.asnumpy(out(executor="serial", output="device"))
    ex = gn.StreamsExecutor(workers=4, stream=kind)
    for _ in range(3):
        ev = gn.evaluate(out, executor=ex, output="device", trace=True)
        assert ev.trace.executor == "streams"   # the CUDA backend, not the emulated one
        got = ev.value
        assert isinstance(got, cp.ndarray)
        np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-4, atol=1e-5)
    # a CPU consumer of GPU branches (the values are moved to the host on its lane)
    with gn.device("cpu"):
        host = gn.node(lambda a, b: a + b, branches[1], branches[2], name="host_sum")
    ref = cp.asnumpy(branches[1](executor="serial", output="device") + branches[2](executor="serial", output="device"))
    # output="auto" gives the value back where the caller's data are (CuPy sources: on the GPU); ask for the host
    np.testing.assert_allclose(host(executor=ex, output="numpy"), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("issuer", [False, None], ids=["lane-threads", "issuer"])
def test_cuda_lanes_serve_one_gpu_for_life_and_are_capped(fake_cuda, issuer):
    """A lane thread never switches GPUs (cuML's per-thread handle is bound to the first one), GPU lanes
    per device are capped at the hardware queue count, and consecutive runs reuse the same threads.
    With the issuer (the default on a GPU) tasks that do not block the host all go to one thread, which
    issues onto both GPUs' lane streams."""
    from gpunets.executors import streams

    fake = fake_cuda
    X = gn.source(np.arange(6.0), name="X")
    chains = [((X + i) * 2) - 1 for i in range(12)]
    out = gn.mean(*chains)
    where: dict = {}
    for _ in range(3):
        plan = compile_call([out], {}, max_lanes=16)
        assert plan.n_lanes == 12
        seen: dict[int, tuple] = {}
        _on_fake_gpus(plan, fake, seen)    # a chain alternates cuda:0 and cuda:1 along one plan lane
        for t in plan.tasks:
            if t.kind != "source":
                fn = t.fn

                def tagged(*a, _fn=fn):
                    where.setdefault(threading.current_thread(), set()).add(fake.device())
                    return _fn(*a)

                t.fn = tagged
        run = gn.StreamsExecutor(workers=16, issuer=issuer).run(plan)
        assert run.error is None and not fake.errors, fake.errors
        np.testing.assert_array_equal(run.values[plan.outputs[0]], out(executor="serial"))
    if issuer is None:
        # one issuing thread (".1" where the pool's first issuer is still busy with another test's run)
        assert [t.name.split(".")[0] for t in where] == ["gpunets-cuda-issue"] and where[next(iter(where))] == {0, 1}, where
        return
    assert all(len(devs) == 1 for devs in where.values()), where
    per_gpu = [sum(1 for devs in where.values() if devs == {o}) for o in (0, 1)]
    assert max(per_gpu) <= streams.MAX_GPU_LANES == 8, per_gpu


@pytest.mark.parametrize("make", [lambda: gn.SerialExecutor(), lambda: gn.ThreadsExecutor(workers=3)],
                         ids=["serial", "threads"])
def test_serial_and_threads_run_gpu_tasks_with_cuda_discipline(fake_cuda, make):
    """GPU tasks under serial/threads: their device current, a lane stream (never the legacy one),
    events waited across streams, values kept alive: the streams executor's CUDA backend runs them."""
    fake = fake_cuda
    X = gn.source(np.arange(6.0), name="X")
    out = gn.mean(*[(X + i) * 2 for i in range(4)])
    plan = compile_call([out], {}, max_lanes=3)
    seen: dict[int, tuple] = {}
    _on_fake_gpus(plan, fake, seen)
    ex = make()
    run = ex.run(plan)
    assert run.error is None and not fake.errors, fake.errors
    assert run.trace.executor == f"{ex.name} (on CUDA streams)"
    np.testing.assert_array_equal(run.values[plan.outputs[0]], out(executor="serial"))
    for t in plan.tasks:
        if t.kind == "source":
            continue
        waited, _, dev, stream = seen[t.key]
        assert dev == int(t.device[-1]), f"{t.label} ran with GPU {dev} current, placed on {t.device}"
        assert stream.ptr != 0, f"{t.label} was issued on the legacy default stream"
        by_id = {id(ev): x for x, ev in enumerate(run.events) if ev is not None}
        for d in t.deps:
            p = plan.tasks[d]
            if p.kind != "source" and p.device != t.device:
                # an event of p's stream recorded at or after p (stream order covers the earlier tasks)
                assert any(by_id.get(w, -1) >= d and plan.tasks[by_id[w]].lane == p.lane
                           and plan.tasks[by_id[w]].device == p.device for w in waited), \
                    f"{t.label} did not wait for {p.label}"


@pytest.mark.parametrize("fail", [False, True])
def test_dask_gpu_tasks_run_on_a_stream_synchronized_at_the_hand_off(monkeypatch, fake_cuda, fail):
    """A Dask worker may run GPU tasks on several threads with no events between them: each task runs
    with its GPU current on its thread's per-thread default stream, synchronized before the value leaves."""
    pytest.importorskip("cloudpickle")
    import sys
    import types

    from gpunets.executors import _dask_worker as gdask  # what runs on the workers

    fake = fake_cuda
    fake_module = types.SimpleNamespace(cuda=fake.cuda)
    monkeypatch.setitem(sys.modules, "cupy", fake_module)
    monkeypatch.setattr("gpunets.devices._gpulibs.cupy", lambda: fake_module)   # also over GPUNETS_FAKE_GPU's fake
    seen = {}

    def task(x):
        seen["device"], seen["stream"] = fake.device(), fake.get_current_stream().ptr
        assert not fake.synced, "synchronized before the task's work was issued"
        if fail:
            raise ValueError("boom")
        return x + 1

    if fail:
        with pytest.raises(ValueError):
            gdask._run_on_gpu(1, "run-x", 7, task, 1)
    else:
        assert gdask._run_on_gpu(1, "run-x", 7, task, 1) == 2
    assert seen == {"device": 1, "stream": fake.cuda.Stream.ptds.ptr}
    assert fake.synced == [("stream", fake.cuda.Stream.ptds.ptr)]


def test_cpu_tasks_read_gpu_values_on_the_lane_stream_of_their_device(fake_cuda):
    """A CPU task reading GPU values (cupy.asnumpy copies on the current stream) runs with the producer's
    GPU current and its lane's stream there, never on the legacy default stream (a device-wide barrier)."""
    fake = fake_cuda
    X = gn.source(np.arange(6.0), name="X")
    a, b = X + 1, X * 2
    out = gn.node(lambda u, v: u + v, a, b, name="host")
    plan = compile_call([out], {}, max_lanes=2)
    seen: dict[int, tuple] = {}
    _on_fake_gpus(plan, fake, seen, cpu=lambda t: t.key in plan.outputs)
    for t in plan.tasks:
        if t.kind != "source" and t.device != "cpu":
            t.device = "cuda:1"
    run = gn.StreamsExecutor(workers=2).run(plan)
    assert run.error is None and not fake.errors, fake.errors
    _, _, dev, stream = seen[plan.outputs[0]]
    assert dev == 1 and stream.ptr != 0, (dev, stream.ptr)


def test_failed_run_synchronizes_before_its_gpu_values_can_be_freed(fake_cuda):
    """On failure every GPU the run used is synchronized before the run's values can be dropped: another
    lane's kernels may still read them (and CuPy's pool would hand their memory out again)."""
    fake = fake_cuda
    X = gn.source(np.arange(6.0), name="X")

    def boom(u, v):
        raise ValueError("boom")

    out = gn.node(boom, X + 1, X * 2, name="boom")
    plan = compile_call([out], {}, max_lanes=2)
    assert plan.n_lanes == 2
    seen: dict[int, tuple] = {}
    _on_fake_gpus(plan, fake, seen)
    for t in plan.tasks:
        if t.kind != "source":
            t.device = "cuda:0"
    run = gn.StreamsExecutor(workers=2).run(plan)
    assert isinstance(run.error, gn.EvaluationError) and not fake.errors, fake.errors
    recorded = [ev for ev in run.events if ev is not None and hasattr(ev, "completed")]
    assert recorded and all(ev.completed for ev in recorded), "GPU work still in flight when the run ended"
    assert ("device", 0) in fake.synced


def test_legacy_stream_guard_warns_once_and_refuses_new_streams_with_classic_cudf(fake_cuda, monkeypatch):
    import sys
    import types
    import warnings

    from gpunets.executors import _cuda_streams, streams

    monkeypatch.setattr(_cuda_streams, "_WARNED", set())
    monkeypatch.delenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", raising=False)
    monkeypatch.delenv("CUDF_PER_THREAD_STREAM", raising=False)
    X = gn.source(np.arange(4.0), name="X")
    out = X + 1
    with gn.device("cpu"):
        plan = compile_call([out], {})
    plan.tasks[-1].device = "cuda:0"
    with pytest.warns(streams.LegacyStreamWarning, match="CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1"):
        gn.StreamsExecutor(workers=1).run(plan)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gn.StreamsExecutor(workers=1).run(plan)   # once
    monkeypatch.setitem(sys.modules, "cudf", types.ModuleType("cudf"))   # classic cuDF is loaded
    with pytest.raises(gn.StreamOrderError, match="CUDF_PER_THREAD_STREAM=1"):
        gn.StreamsExecutor(workers=1, stream="new").run(plan)
    with pytest.warns(streams.LegacyStreamWarning, match="cuDF runs on CUDA's legacy default stream"):
        gn.StreamsExecutor(workers=1).run(plan)
    for merely_set in ("0", "true", "yes", ""):   # cuDF switches only for "1" (issue 24 item 8)
        monkeypatch.setenv("CUDF_PER_THREAD_STREAM", merely_set)
        with pytest.raises(gn.StreamOrderError, match="CUDF_PER_THREAD_STREAM=1"):
            gn.StreamsExecutor(workers=1, stream="new").run(plan)
    monkeypatch.setenv("CUDF_PER_THREAD_STREAM", "1")
    monkeypatch.setenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    monkeypatch.setattr(_cuda_streams, "_WARNED", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run = gn.StreamsExecutor(workers=1, stream="new").run(plan)
    assert run.error is None


def test_traced_gpu_runs_show_gpu_time_from_timed_cuda_events(fake_cuda):
    """gn.evaluate(trace=True) on the CUDA backend times each GPU task with timed CUDA events: the record's
    start/end are the GPU's (get_elapsed_time from the run's zero event), `issued` the host issue time."""
    fake = fake_cuda
    X = gn.source(np.arange(6.0), name="X")
    with gn.device("cpu"):
        out = gn.mean(X + 1, X * 2)

    real = compile_call

    def on_gpu(*a, **k):
        plan = real(*a, **k)
        for t in plan.tasks:
            if t.kind != "source":
                t.device = "cuda:0"
        return plan

    import gpunets.api.network as network

    mp = pytest.MonkeyPatch()
    mp.setattr(network, "compile_call", on_gpu)
    try:
        untimed = network.evaluate(out, executor=gn.StreamsExecutor(workers=2))
        assert not [e for e in fake.events if e.timing], "timed events only when a trace is asked for"
        fake.lag_step = 0.1    # the "GPU" falls behind the host by 0.1 s per event recorded
        ev = network.evaluate(out, executor=gn.StreamsExecutor(workers=2), trace=True)
    finally:
        mp.undo()
    np.testing.assert_array_equal(ev.value, untimed)
    assert ev.trace.executor == "streams" and not fake.errors, fake.errors
    recs = ev.trace.records
    assert len(recs) == 3 and all(r.issued is not None for r in recs)
    for r in recs:   # GPU time = host time of the zero event + elapsed: the backlog shows, host issue time does not
        assert r.end > r.start >= r.issued[0] + 0.09, (r.start, r.end, r.issued)
    zero = [e for e in fake.events if e.timing][0]
    timed = [e for e in fake.events if e.timing][1:]
    assert len(timed) == 6 and all(e.completed and e.at > zero.at - 1e-9 for e in timed)


_OVERLAP_SCRIPT = """
import threading, numpy as np, threadpoolctl, gpunets as gn

def blas():
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]

before = blas()
if not before or min(before) < 2 or gn.executors.base.default_workers() < 2:
    print("SKIP"); raise SystemExit(0)
entered = [threading.Event(), threading.Event()]
leave = [threading.Event(), threading.Event()]

def hold(i):
    def fn(x):
        entered[i].set()
        leave[i].wait(10)
        return x
    return fn

def run(i):
    X = gn.source(np.ones(3), name="X")
    gn.node(np.add, gn.node(hold(i), X), X + 1)(executor=gn.ThreadsExecutor(workers=2))

a = threading.Thread(target=run, args=(0,))
b = threading.Thread(target=run, args=(1,))
a.start(); assert entered[0].wait(10)
b.start(); assert entered[1].wait(10)
during = blas()
leave[0].set(); a.join(10)          # the first run ends first: its restore must not undo the second's cap
second_alone = blas()
leave[1].set(); b.join(10)          # the last run to end restores the original
print(before, during, second_alone, blas())
cap = [min(b, max(1, gn.executors.base.default_workers() // 2)) for b in before]   # 2 workers share the cores
assert during == cap, (during, cap)
assert second_alone == cap, (second_alone, cap)
assert blas() == before, (blas(), before)
print("OK")
"""


def test_overlapping_threads_runs_restore_the_native_thread_pools():
    # in a fresh process: OpenBLAS ignores a limit set from another thread once the main thread has set one
    import subprocess
    import sys

    pytest.importorskip("threadpoolctl")
    out = subprocess.run([sys.executable, "-c", _OVERLAP_SCRIPT], capture_output=True, text=True, timeout=120)
    if out.stdout.strip() == "SKIP":
        pytest.skip("needs a BLAS using several threads and two cores (the runs cap it to one per task)")
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stdout + out.stderr


@pytest.mark.parametrize("make, match, exc", [
    (lambda: gn.StreamsExecutor(delays="ab"), r"delays='ab'.*expected a pair", TypeError),
    (lambda: gn.StreamsExecutor(delays=(0.1, "x")), r"delays=.*numbers of seconds", TypeError),
    (lambda: gn.StreamsExecutor(delays=(0.2, 0.1)), r"delays=.*0 <= lo <= hi", ValueError),
    (lambda: gn.StreamsExecutor(delays=(0, float("inf"))), r"delays=.*finite", ValueError),
    (lambda: gn.StreamsExecutor(seed="1"), r"seed='1'.*integer", TypeError),
    (lambda: gn.StreamsExecutor(check="yes"), r"check='yes'.*True or False", TypeError),
    (lambda: gn.StreamsExecutor(emulate=1), r"emulate=1.*True, False or None", TypeError),
    (lambda: gn.StreamsExecutor(skip_wait=3), r"skip_wait=3.*function", TypeError),
    (lambda: gn.StreamsExecutor(stream="old"), r"stream='old'", ValueError),
    (lambda: gn.StreamsExecutor(workers="2"), r"workers='2'", ValueError),
    (lambda: gn.ThreadsExecutor(limit_native="no"), r"limit_native='no'.*True or False", TypeError),
    (lambda: gn.ThreadsExecutor(workers=0), r"workers=0", ValueError),
    (lambda: gn.SerialExecutor(workers=-1), r"workers=-1", ValueError),
])
def test_bad_executor_arguments_fail_at_construction(make, match, exc):
    with pytest.raises(exc, match=match):
        make()


def _executor_objects():
    return [gn.SerialExecutor(), gn.ThreadsExecutor(workers=2, limit_native=False),
            gn.StreamsExecutor(workers=2, delays=(0.0, 0.001), seed=3, check=True)]


@pytest.mark.parametrize("ex", _executor_objects(), ids=lambda e: e.name)
def test_composites_with_executor_objects_clone_and_pickle(ex):
    import copy
    import pickle

    from sklearn.base import clone

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 3)), rng.normal(size=40)
    stack = gn.StackingRegressor([("a", Ridge()), ("b", Ridge(alpha=3.0))], cv=3, executor=ex)
    fitted = clone(stack).fit(X, y)          # a run leaves state (locks, checkers) on the executor
    for obj in (stack, fitted):
        for twin in (clone(obj), copy.deepcopy(obj), pickle.loads(pickle.dumps(obj))):
            new = twin.executor
            assert type(new) is type(ex) and new is not ex
            assert repr(new) == repr(ex)
    again = pickle.loads(pickle.dumps(fitted))
    np.testing.assert_array_equal(again.predict(X), fitted.predict(X))
    np.testing.assert_array_equal(clone(stack).fit(X, y).predict(X), fitted.predict(X))
    s = pickle.loads(pickle.dumps(gn.StreamsExecutor(workers=3, delays=(0.0, 0.002), seed=5, check=True)))
    assert (s.workers, s.delays, s.seed, s.check) == (3, (0.0, 0.002), 5, True)


class _Tracked(Ridge):
    """A Ridge whose fitted instances can be watched with weak references."""


def test_nothing_a_run_made_outlives_it_except_what_the_user_holds(executor):
    """issue 24 item 1: idle pool workers keep no job, so a retrained machine's old fitted estimator and an
    output the caller dropped are freed (on a GPU: their device memory), on every executor."""
    import gc
    import weakref

    rng = np.random.default_rng(0)
    X, y = gn.source(rng.normal(size=(50, 3)), name="X"), gn.source(rng.normal(size=50), name="y")
    m1 = gn.machine(_Tracked(alpha=1.0), X, y)
    m2 = gn.machine(_Tracked(alpha=2.0), X, y)
    yhat = gn.mean(m1.predict(X), m2.predict(X))
    yhat.fit(executor=executor)
    out = yhat(executor=executor)
    old_states = [weakref.ref(m._state.estimator) for m in (m1, m2)]
    dropped = weakref.ref(out)
    del out
    yhat.fit(executor=executor, force=True)       # both machines retrain: their old states are replaced
    gc.collect()
    assert [r() for r in old_states] == [None, None]
    assert dropped() is None
    assert pool.busy_workers() == []

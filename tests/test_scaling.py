"""Planning that scales: linear compiles (counted walks), lanes without ancestor sets, auto's choice
from task costs, and fit_transform for a machine's own training output."""

import random
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.linear_model import Ridge
from sklearn.pipeline import make_pipeline

import gpunets as gn
from gpunets.core import graph
from gpunets.planning import lanes as lanes_module
from gpunets.planning import plan as plan_module
from gpunets.executors import explain_auto
from gpunets.planning.plan import assign_lanes, compile_call, compile_fit
from tests.helpers import TRANSFORM_CALLS, CountingScaler


def chain_of_machines(n):
    X = gn.source(np.zeros((4, 2)), name="X")
    prev = X
    for i in range(n):
        prev = gn.machine(CountingScaler(tag=f"chain{i}"), prev).transform(prev)
    return prev


def count_walks(monkeypatch, fn):
    """Run ``fn`` with every graph traversal counted: the number of nodes each walk lists or visits."""
    total = {"nodes": 0, "calls": 0}

    def counting(name):
        orig = getattr(graph, name)

        def wrapper(*a, **k):
            out = orig(*a, **k)
            total["calls"] += 1
            total["nodes"] += len(out)
            return out
        return wrapper

    for name in ("op_nodes", "_topo", "machine_parents", "machine_sources"):
        wrapped = counting(name)
        monkeypatch.setattr(graph, name, wrapped)
        if hasattr(plan_module, name):
            monkeypatch.setattr(plan_module, name, wrapped)
    make = graph.Upstream._make

    def counted_make(self, x):
        total["nodes"] += 1
        return make(self, x)

    monkeypatch.setattr(graph.Upstream, "_make", counted_make)
    fn()
    return total["nodes"]


@pytest.mark.parametrize("what", ["compile", "noop_fit"])
def test_fit_compile_walks_are_linear_in_the_chain(monkeypatch, what):
    work = {}
    for n in (100, 1000):
        out = chain_of_machines(n)
        if what == "compile":
            work[n] = count_walks(monkeypatch, lambda out=out: compile_fit([out]))
        else:
            out.fit(executor="serial")
            work[n] = count_walks(monkeypatch, lambda out=out: gn.fit(out, executor="serial"))
        monkeypatch.undo()
    # quadratic walks (one upstream walk per machine) would grow 100x; linear ones 10x
    assert 8 <= work[1000] / work[100] <= 12, work


def test_noop_fit_skips_everything_and_a_change_upstream_retrains_downstream():
    out = chain_of_machines(50)
    machines = out.machines
    assert set(out.fit(executor="serial").actions.values()) == {"train"}
    assert set(gn.fit(out).actions.values()) == {"skip"}
    machines[10].fit(force=True)           # retrained on its own: the 39 below it are stale
    acts = gn.fit(out).actions
    assert [acts[m] for m in machines] == ["skip"] * 11 + ["train"] * 39
    machines[0].args[0].data = np.ones((4, 2))   # new source data: everything retrains
    assert set(gn.fit(out).actions.values()) == {"train"}


def reference_lanes(p, max_lanes):
    """GrCUDA's policy with full ancestor sets (the implementation lanes replaced)."""
    tasks, anc, last, load, inherited, out = p.tasks, {}, [], [], set(), {}
    for t in tasks:
        if t.kind == "source":
            continue
        a = set()
        for d in t.deps:
            if tasks[d].kind != "source":
                a |= anc[d] | {d}
        anc[t.key] = a
        lane = next((out[d] for d in t.deps if tasks[d].kind != "source" and d not in inherited), -1)
        if lane >= 0:
            inherited.add(next(d for d in t.deps if tasks[d].kind != "source" and d not in inherited))
        else:
            free = [i for i, k in enumerate(last) if k in a]
            if free:
                lane = min(free, key=lambda i: load[i])
            elif max_lanes is None or len(last) < max_lanes:
                lane = len(last)
                last.append(t.key)
                load.append(0.0)
            else:
                lane = min(range(len(last)), key=lambda i: load[i])
        out[t.key] = lane
        last[lane] = t.key
        load[lane] += t.cost
    return out


def random_network(seed, size):
    r = random.Random(seed)
    nodes = [gn.source(np.zeros(2), name="X"), gn.source(np.ones(2), name="Z")]
    for _ in range(size):
        args = [r.choice(nodes[-6:] if r.random() < 0.7 else nodes) for _ in range(r.randint(1, 3))]
        nodes.append(gn.node(np.add, *args) if len(args) == 2 else gn.node(np.negative, args[0]))
    return r.sample(nodes[2:], min(3, len(nodes) - 2))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 40), st.sampled_from([None, 1, 2, 3, 5]))
def test_lanes_equal_the_ancestor_set_policy(seed, size, max_lanes):
    p = compile_call(random_network(seed, size), {}, max_lanes=max_lanes)
    want = reference_lanes(p, max_lanes)
    assign_lanes(p, max_lanes)
    assert {t.key: t.lane for t in p.tasks if t.kind != "source"} == want


def test_forgetful_lanes_cost_concurrency_not_correctness(monkeypatch):
    # With clocks of one lane, some free lanes look busy; every cross-lane edge is still waited on.
    monkeypatch.setattr(lanes_module, "CLOCK_LIMIT", 1)
    outs = random_network(7, 60)
    out = gn.node(lambda *xs: sum(xs), *outs)
    want = out(executor="serial")
    ex = gn.StreamsExecutor(workers=4, check=True, delays=(0.0, 0.001), seed=3)
    np.testing.assert_array_equal(out(executor=ex), want)
    assert not ex.last_checker.violations


def test_lane_assignment_memory_is_bounded_by_the_tasks_in_flight():
    import tracemalloc

    X = gn.source(np.zeros(1), name="X")
    out = X
    for _ in range(20_000):
        out = out + 1
    p = compile_call([out], {}, max_lanes=2)
    tracemalloc.start()
    try:
        assign_lanes(p, 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # ancestor bitsets took ~2.5 KB per node on this chain; clocks die with their last consumer
    assert p.n_lanes == 1 and peak / 20_000 < 100, peak


def _sleep_2ms(x):
    time.sleep(0.002)
    return x + 1


def test_auto_runs_trivial_tasks_serially_and_says_why():
    X = gn.source(np.ones(3), name="X")
    wide = gn.mean(*[(X + i) * 2 for i in range(100)])
    ev = gn.evaluate(wide, workers=2, trace=True)
    assert ev.trace.executor == "serial"
    assert ev.executor_reason.startswith("auto: 0 of 201 tasks") and "too short" in ev.executor_reason
    assert gn.evaluate(wide, executor="threads", workers=2, trace=True).executor_reason == "executor='threads'"


def test_auto_learns_measured_costs():
    X = gn.source(np.ones(3), name="X")
    out = gn.node(_sleep_2ms, X) + gn.node(_sleep_2ms, X)
    assert gn.evaluate(out, workers=2, trace=True).trace.executor == "serial"   # unknown: assumed trivial
    ev = gn.evaluate(out, workers=2, trace=True)                                 # measured: 2 ms each
    assert ev.trace.executor == "threads", ev.executor_reason
    assert "2 tasks expected to take 1 ms or more, on 2 independent branches" in ev.executor_reason


def test_auto_for_fits_unknown_then_measured(data_xy):
    """The CPU pool's choice from measured fit times (on a GPU, "auto" takes streams for any CUDA task)."""
    with gn.config(device="cpu"):
        X, y = data_xy
        Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
        out = gn.mean(*[gn.machine(Ridge(alpha=a), Xs, ys).predict(Xs) for a in (1.0, 2.0, 3.0)])
        first = out.fit(workers=2)
        assert first.executor == "threads" and "auto: 3 tasks" in first.executor_reason  # untrained: assumed long
        for m in out.machines:   # pretend the last fits were fast: now measured as trivial
            m._state = type(m._state)(**{**m._state.__dict__, "seconds": 1e-5})
        again = out.fit(force=True, workers=2)
        assert again.executor == "serial" and "too short" in again.executor_reason
        for m in out.machines:   # and slow ones: threads again
            m._state = type(m._state)(**{**m._state.__dict__, "seconds": 0.5})
        name, why = explain_auto(compile_fit([out], force=True, max_lanes=2))
        assert name == "threads" and "3 tasks" in why


@pytest.fixture
def data_xy():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 4))
    return X, X @ np.arange(1.0, 5.0) + 0.1 * rng.normal(size=80)


def test_training_output_comes_from_fit_transform(executor, data_xy):
    X, y = data_xy
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    scale = gn.machine(CountingScaler(tag="pipe"), Xs)
    W = scale.transform(Xs)
    ridge = gn.machine(Ridge(), W, ys)
    out = ridge.predict(W)
    TRANSFORM_CALLS.clear()
    out.fit()
    est = scale.estimator_
    assert getattr(est, "n_fit_transform_", 0) == 1 and getattr(est, "n_fit_", 0) == 0
    if executor.name != "dask":   # transform calls are counted in this process only
        assert TRANSFORM_CALLS.get("pipe", 0) == 0
    want = make_pipeline(CountingScaler(), Ridge()).fit(X, y).predict(X)
    np.testing.assert_allclose(out(), want, rtol=1e-12)
    # a transform of other rows or other data still calls transform
    p = compile_fit([out], force=True)
    kinds = [(t.kind, t.fn.func.__name__ if hasattr(t.fn, "func") else getattr(t.fn, "__name__", ""))
             for t in p.tasks if t.kind != "source"]
    assert ("fit", "_fit_transform_task") in kinds and ("eval", "_training_output") in kinds


def test_transform_of_other_inputs_is_not_fused(data_xy):
    X, _ = data_xy
    Xs, Zs = gn.source(X, name="X"), gn.source(X[::-1].copy(), name="Z")
    scale = gn.machine(CountingScaler(tag="other"), Xs)
    out = scale.transform(Zs)          # not its training input: fit, then transform
    TRANSFORM_CALLS.clear()
    out.fit(executor="serial")
    assert getattr(scale.estimator_, "n_fit_", 0) == 1 and TRANSFORM_CALLS.get("other", 0) == 0
    np.testing.assert_allclose(out(), X[::-1] - X.mean(axis=0))


class ScaleRidge(gn.CompositeRegressor):
    """A pipeline as a composite: CountingScaler then Ridge."""

    def __init__(self, tag="stack"):
        self.tag = tag

    def network(self, X, y):
        W = gn.machine(CountingScaler(tag=self.tag), X).transform(X)
        return gn.machine(Ridge(), W, y).predict(W)


def test_stack_of_pipelines_uses_fit_transform(data_xy):
    X, y = data_xy
    TRANSFORM_CALLS.clear()
    stack = gn.StackingRegressor(estimators=[("pipe", ScaleRidge())], final_estimator=Ridge(), cv=3)
    stack.fit(X, y)
    # 3 folds + the full refit train the pipeline 4 times; transform runs only to predict:
    # 3 held-out folds (without fit_transform it would be 4 more, one per training set)
    assert TRANSFORM_CALLS["stack"] == 3
    want = make_pipeline(CountingScaler(), Ridge()).fit(X, y).predict(X)
    np.testing.assert_allclose(stack.named_estimators_["pipe"].predict(X), want, rtol=1e-12)

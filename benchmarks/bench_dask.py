"""Dask executor: a stacking-like fit on a 2-worker LocalCluster, and per-task overhead.

1. Stacking-like network, built by hand: ``B`` base models x ``K`` folds (each fold's
   machine trained on a row-selected node, predicting its held-out rows), the
   out-of-fold predictions stacked into a meta-feature matrix, a meta model on it,
   and every base model refitted on all rows.  ``fit(force=True)`` on the
   ``DaskExecutor`` (2 worker processes, 1 thread each) against the ``threads``
   executor (2 threads) on the same data, interleaved, best of the repeats.
2. Per-task overhead on the same cluster: ``N`` independent trivial tasks fanned out
   from one source and joined by one task.  Per task:

   * ``dask.delayed`` (the same functions, the source scattered once, computed with
     the cluster's client): Dask's own per-task cost;
   * ``client.get`` of the equivalent raw graph: Dask's cheapest path;
   * gpunets' ``DaskExecutor`` evaluating the equivalent network, end to end
     (compiling the plan, pickling task functions, scatter, graph, trace collection).

   Added overhead = (gpunets - dask.delayed) / N, as a fraction of dask.delayed's per-task
   time (target: under 20%), and the same against ``client.get``.
3. Fitted states on the workers (``state``): the demo network (``python -m gpunets demo``: scaler,
   four learners, a 5-fold stacking composite, averages) fitted on the cluster, then evaluated on new
   rows.  Bytes the client process writes to the cluster per evaluation call (counted on its TCP
   comms: graph, scattered data, control messages), against the target of at most 2 x the new data
   + 100 KB, next to the size of the fitted estimators (what travelled in every graph before they
   stayed on the workers); and the evaluation latency on Dask against the ``threads`` executor.

Run: ``python benchmarks/bench_dask.py [--quick] [--out benchmarks/results/dask.json]``.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from functools import partial
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gpunets as gn  # noqa: E402
from benchmarks._runner import bench_main  # noqa: E402 - after the path set-up


def best_of(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


# --- task functions (module-level: picklable by reference) -----------------------------------
def take(idx: np.ndarray, X: Any) -> Any:
    return X[idx]


def stack_oof(order: np.ndarray, *fold_preds: Any) -> np.ndarray:
    """Out-of-fold predictions of one base model, back in the original row order."""
    out = np.empty(len(order))
    out[order] = np.concatenate(fold_preds)
    return out


def columns(*cols: Any) -> np.ndarray:
    return np.column_stack(cols)


def inc(x: Any, i: int) -> float:
    return float(x) + i


def total(*xs: float) -> float:
    return float(sum(xs))


# --- 1. stacking ----------------------------------------------------------------------------
def stacking_network(X: np.ndarray, y: np.ndarray, n_folds: int, quick: bool) -> tuple[Any, int]:
    from sklearn.ensemble import ExtraTreesRegressor, RandomForestRegressor
    from sklearn.linear_model import LinearRegression, Ridge
    from sklearn.neighbors import KNeighborsRegressor

    trees = 10 if quick else 30
    bases = [lambda: Ridge(alpha=1.0),
             lambda: RandomForestRegressor(n_estimators=trees, max_depth=10, n_jobs=1, random_state=0),
             lambda: ExtraTreesRegressor(n_estimators=trees, max_depth=10, n_jobs=1, random_state=0),
             lambda: KNeighborsRegressor(n_neighbors=10)]
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    folds = np.array_split(np.random.default_rng(0).permutation(len(y)), n_folds)
    order = np.concatenate(folds)
    meta_cols, full_preds = [], []
    n_fits = 0
    for make in bases:
        preds = []
        for k in range(n_folds):
            train = np.concatenate([f for j, f in enumerate(folds) if j != k])
            Xtr = gn.node(partial(take, train), Xs, name=f"X[-{k}]")
            ytr = gn.node(partial(take, train), ys, name=f"y[-{k}]")
            Xva = gn.node(partial(take, folds[k]), Xs, name=f"X[{k}]")
            m = gn.machine(make(), Xtr, ytr)
            preds.append(m.predict(Xva))
            n_fits += 1
        meta_cols.append(gn.node(partial(stack_oof, order), *preds, name="oof"))
        full_preds.append(gn.machine(make(), Xs, ys).predict(Xs))
        n_fits += 1
    Z = gn.node(columns, *meta_cols, name="Z")
    meta = gn.machine(LinearRegression(), Z, ys, name="meta")
    n_fits += 1
    yhat = meta.predict(gn.node(columns, *full_preds, name="Zfull"))
    return yhat, n_fits


def bench_stacking(client: Any, quick: bool) -> dict[str, Any]:
    from sklearn.datasets import make_regression

    n = 2_000 if quick else 12_000
    n_folds = 3 if quick else 5
    X, y = make_regression(n_samples=n, n_features=20, noise=1.0, random_state=0)
    yhat, n_fits = stacking_network(X, y, n_folds, quick)
    runs = {"threads": gn.ThreadsExecutor(workers=2), "dask": gn.DaskExecutor(client)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    preds: dict[str, Any] = {}
    yhat.fit(executor=runs["dask"], force=True)   # warm the workers (imports)
    for _ in range(1 if quick else 3):
        for name, ex in runs.items():   # interleaved
            t = time.perf_counter()
            yhat.fit(executor=ex, force=True)
            times[name].append(time.perf_counter() - t)
            preds[name] = yhat(executor="serial")
    best = {k: min(v) for k, v in times.items()}
    return {"rows": n, "features": 20, "base_models": 4, "folds": n_folds, "fits": n_fits,
            "threads_s": best["threads"], "dask_s": best["dask"],
            "dask_over_threads": best["dask"] / best["threads"],
            "same_predictions": bool(np.allclose(preds["threads"], preds["dask"]))}


# --- 2. per-task overhead --------------------------------------------------------------------
def bench_overhead(client: Any, quick: bool) -> dict[str, Any]:
    import dask

    n = 200 if quick else 1_000
    repeats = 3 if quick else 5
    x0 = 1.0
    X = gn.source(np.float64(x0), name="x")
    out = gn.node(total, *[gn.node(inc, X, i) for i in range(n)], name="total")
    ex = gn.DaskExecutor(client)
    expected = float(sum(x0 + i for i in range(n)))

    def run_gpunets() -> None:
        assert out(executor=ex) == expected

    def run_delayed() -> None:
        [xf] = client.scatter([np.float64(x0)], hash=False)
        xd = dask.delayed(xf)
        parts = [dask.delayed(inc, pure=False)(xd, i) for i in range(n)]
        assert dask.delayed(total, pure=False)(*parts).compute() == expected

    def run_get() -> None:
        [xf] = client.scatter([np.float64(x0)], hash=False)
        tag = uuid.uuid4().hex   # fresh keys each run, as dask.delayed(pure=False) and gpunets make
        dsk: dict[str, Any] = {f"inc-{tag}-{i}": (inc, xf, i) for i in range(n)}
        dsk[f"total-{tag}"] = (total,) + tuple(f"inc-{tag}-{i}" for i in range(n))
        assert client.get(dsk, f"total-{tag}") == expected

    for f in (run_gpunets, run_delayed, run_get):   # warm up
        f()
    t = {"gpunets": [], "delayed": [], "get": []}
    for _ in range(repeats):   # interleaved
        t["gpunets"].append(best_of(run_gpunets, 1))
        t["delayed"].append(best_of(run_delayed, 1))
        t["get"].append(best_of(run_get, 1))
    per = {k: min(v) / (n + 1) for k, v in t.items()}
    added_delayed = per["gpunets"] - per["delayed"]
    added_get = per["gpunets"] - per["get"]
    return {"tasks": n + 1, "repeats": repeats,
            "per_task_us": {k: v * 1e6 for k, v in per.items()},
            "added_vs_delayed_us": added_delayed * 1e6,
            "added_vs_delayed_fraction": added_delayed / per["delayed"],
            "added_vs_get_us": added_get * 1e6,
            "added_vs_get_fraction": added_get / per["get"],
            "added_overhead": {"value": added_delayed / per["delayed"], "target": "< 0.20 of dask.delayed's",
                               "met": bool(added_delayed / per["delayed"] < 0.20)}}


class _BytesSent:
    """Count the bytes this process writes on its TCP comms (``distributed.comm.tcp.TCP.write``)."""

    def __enter__(self) -> "_BytesSent":
        from distributed.comm import tcp

        self.n = 0
        self._orig = orig = tcp.TCP.write
        counter = self

        async def write(comm: Any, msg: Any, *a: Any, **kw: Any) -> int:
            n = await orig(comm, msg, *a, **kw)
            counter.n += n
            return n

        tcp.TCP.write = write  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        from distributed.comm import tcp

        tcp.TCP.write = self._orig  # type: ignore[method-assign]


def bench_state(client: Any, quick: bool) -> dict[str, Any]:
    """Bytes sent and latency per evaluation of the demo network fitted on the cluster (see the module doc)."""
    import pickle

    from sklearn.datasets import make_friedman1

    from gpunets.__main__ import build_network

    rows = 1000 if quick else 2000
    X, y = make_friedman1(n_samples=rows + rows // 4, n_features=10, noise=0.5, random_state=0)
    X_train, y_train, X_test = X[:rows], y[:rows], X[rows:]
    out, parts = build_network(X_train, y_train, executor="serial")   # the stack's folds inside its task
    ex = gn.DaskExecutor(client)
    out.fit(executor=ex)
    machines = list(parts["learners"].values()) + [parts["stack"].machine]
    calls = 3 if quick else 10
    out(X_test, executor=ex)   # warm: task functions, the first scatter, the task stream plugin
    sent = []
    for _ in range(calls):
        with _BytesSent() as counter:
            pred = out(X_test, executor=ex)
        sent.append(counter.n)
    fetched = any(m._state.stored.fetched for m in machines if m._state.is_remote)
    dask_s = best_of(lambda: out(X_test, executor=ex), calls)
    threads_s = best_of(lambda: out(X_test, executor="threads"), calls)
    same = bool(np.allclose(pred, out(X_test, executor="serial")))   # fetches the states (once)
    state_bytes = sum(len(pickle.dumps(m.estimator_)) for m in machines)
    data = X_test.nbytes
    per_call = int(np.median(sent))
    target = 2 * data + 100_000
    return {"rows": rows, "test_rows": len(X_test), "new_data_bytes": data, "calls": calls,
            "bytes_sent_per_eval": per_call, "bytes_sent_all": sent,
            "fitted_states_bytes": state_bytes, "states_fetched_by_evaluations": fetched,
            "bytes_per_eval": {"value": per_call, "target": f"<= 2 x new data + 100 KB = {target}",
                               "met": bool(per_call <= target)},
            "eval_seconds": {"dask": dask_s, "threads": threads_s}, "dask_over_threads": dask_s / threads_s,
            "same_predictions": same}


def run(quick: bool = False) -> dict[str, Any]:
    """Run both benchmarks on a fresh 2-worker LocalCluster; return the figures."""
    import distributed

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address="127.0.0.1:0") as cluster, distributed.Client(cluster) as client:
        res = {"quick": quick, "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count(), "workers": 2,
               "stacking": bench_stacking(client, quick), "overhead": bench_overhead(client, quick),
               "state": bench_state(client, quick)}
    return res


def summary(res: dict[str, Any]) -> None:
    s, o = res["stacking"], res["overhead"]
    print(f"stacking ({s['fits']} fits, {s['rows']} rows): threads {s['threads_s']:.2f} s, "
          f"dask {s['dask_s']:.2f} s (dask/threads {s['dask_over_threads']:.2f}), "
          f"same predictions: {s['same_predictions']}")
    pt = o["per_task_us"]
    print(f"per task ({o['tasks']} tasks): gpunets {pt['gpunets']:.0f} us, dask.delayed {pt['delayed']:.0f} us, "
          f"client.get {pt['get']:.0f} us; added vs delayed {o['added_vs_delayed_us']:+.0f} us "
          f"({o['added_vs_delayed_fraction']:+.0%}), vs client.get {o['added_vs_get_us']:+.0f} us "
          f"({o['added_vs_get_fraction']:+.0%}); target (<20% of dask.delayed) met: {o['added_overhead']['met']}")
    st = res["state"]
    print(f"state on the workers (demo network, {st['test_rows']} new rows = {st['new_data_bytes']} B): "
          f"{st['bytes_sent_per_eval']} B sent per evaluation (fitted states: {st['fitted_states_bytes']} B, "
          f"not sent); target {st['bytes_per_eval']['target']} met: {st['bytes_per_eval']['met']}; "
          f"evaluation {st['eval_seconds']['dask'] * 1e3:.0f} ms on dask vs {st['eval_seconds']['threads'] * 1e3:.0f} "
          f"ms on threads ({st['dask_over_threads']:.1f}x); same predictions: {st['same_predictions']}")


if __name__ == "__main__":
    raise SystemExit(bench_main(run, __doc__, name="dask", summary=summary))

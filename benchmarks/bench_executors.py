"""Executors: concurrency speed-up and scheduling overhead (issue 3's targets).

1. Two independent RandomForest branches (n_jobs=1, about a second each at full
   size): ``threads`` and emulated ``streams`` against ``serial``; target >= 1.7x.
2. Scheduling overhead: a network of 2,000 trivial nodes (200 chains of 10,
   fanned out from one source and joined at the end), evaluated.  Per-node
   overhead = (wall time - the bare Python cost of the same function calls) / nodes.
   ``serial`` and ``threads`` must be at most one tenth of ``dask.delayed`` with the
   threaded scheduler on the same graph, measured side by side.
3. GPU (only where CuPy sees a GPU): 8 independent branches of CuPy work and of
   scikit-learn array-API fits, ``streams`` against ``serial`` on the same GPU, with
   the timeline saved as PNG.

Run: ``python benchmarks/bench_executors.py [--quick] [--out benchmarks/results/executors.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gpunets as gn  # noqa: E402


def best_of(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def forest_branches(quick: bool) -> dict[str, Any]:
    from sklearn.datasets import make_regression
    from sklearn.ensemble import RandomForestRegressor

    n = 3_000 if quick else 40_000
    X, y = make_regression(n_samples=n, n_features=20, noise=1.0, random_state=0)
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    trees = 10 if quick else 40
    m1 = gn.machine(RandomForestRegressor(n_estimators=trees, max_depth=12, n_jobs=1, random_state=1), Xs, ys)
    m2 = gn.machine(RandomForestRegressor(n_estimators=trees, max_depth=12, n_jobs=1, random_state=2), Xs, ys)
    out = gn.mean(m1.predict(Xs), m2.predict(Xs))
    times: dict[str, float] = {}
    preds: dict[str, Any] = {}
    runs = {"serial": gn.SerialExecutor(), "threads": gn.ThreadsExecutor(workers=2),
            "streams": gn.StreamsExecutor(workers=2)}
    for rep in range(1 if quick else 2):
        for name, ex in runs.items():   # interleaved, so that noise hits every executor alike
            t = time.perf_counter()
            out.fit(executor=ex, force=True)
            dt = time.perf_counter() - t
            times[name] = min(times.get(name, dt), dt)
            preds[name] = out(executor="serial")
    for name in runs:
        np.testing.assert_array_equal(preds[name], preds["serial"])
    res = {"rows": n, "trees": trees, "seconds": times}
    from gpunets.executors import explain_auto
    from gpunets.planning.plan import compile_fit

    chosen, why = explain_auto(compile_fit([out], force=True, max_lanes=2))
    res["auto_choice"] = {"value": chosen, "target": "threads", "met": chosen == "threads", "reason": why}
    for name in ("threads", "streams"):
        sp = times["serial"] / times[name]
        res[f"speedup_{name}"] = {"value": sp, "target": ">= 1.7", "met": sp >= 1.7}
    return res


def _inc(x: Any) -> Any:
    return x + 1


def _total(*xs: Any) -> Any:
    return sum(xs)


def scheduling_overhead(quick: bool) -> dict[str, Any]:
    from dask import delayed

    width, length = (50, 10) if quick else (200, 11)
    x0 = np.zeros(1)
    X = gn.source(x0, name="X")
    ends = []
    for _ in range(width):
        n = X
        for _ in range(length - 1):
            n = gn.node(_inc, n)
        ends.append(n)
    out = gn.node(_total, *ends)
    n_nodes = width * (length - 1) + 1

    def bare() -> Any:
        vals = []
        for _ in range(width):
            v = x0
            for _ in range(length - 1):
                v = _inc(v)
            vals.append(v)
        return _total(*vals)

    d0 = delayed(np.zeros)(1)
    dends = []
    for _ in range(width):
        n = d0
        for _ in range(length - 1):
            n = delayed(_inc)(n)
        dends.append(n)
    dout = delayed(_total)(*dends)
    expected = bare()
    execs = {"serial": gn.SerialExecutor(), "threads": gn.ThreadsExecutor(workers=2)}
    for ex in execs.values():
        np.testing.assert_array_equal(out(executor=ex), expected)
    np.testing.assert_array_equal(dout.compute(scheduler="threads"), expected)
    reps = 3 if quick else 7
    times = {"bare": [], "dask.delayed": [], **{k: [] for k in execs}}
    for _ in range(reps):  # interleaved
        times["bare"].append(best_of(bare, 1))
        for k, ex in execs.items():
            times[k].append(best_of(lambda ex=ex: out(executor=ex), 1))
        times["dask.delayed"].append(best_of(lambda: dout.compute(scheduler="threads", num_workers=2), 1))
    best = {k: min(v) for k, v in times.items()}
    per_node = {k: (best[k] - best["bare"]) / n_nodes * 1e6 for k in best if k != "bare"}
    res: dict[str, Any] = {"nodes": n_nodes, "seconds": best, "overhead_us_per_node": per_node}
    for k in execs:
        ratio = per_node[k] / per_node["dask.delayed"]
        res[f"overhead_ratio_{k}_vs_dask"] = {"value": ratio, "target": "<= 0.1", "met": ratio <= 0.1}
    return res


def gpu_streams(quick: bool, png: str | None) -> dict[str, Any]:
    try:
        import cupy as cp

        if not cp.cuda.is_available():
            return {"skipped": "no GPU (cupy.cuda.is_available() is False)"}
    except ImportError:
        return {"skipped": "CuPy is not installed"}

    n = 2_000 if quick else 8_000
    rng = cp.random.default_rng(0)
    Xg = rng.standard_normal((n, n // 4), dtype=cp.float32)

    def work(x: Any, k: int) -> Any:
        w = x.T[:, : x.shape[1]]   # (n/4, n/4): y keeps its shape (n, n/4) from one step to the next
        y = x
        for _ in range(6):
            y = cp.tanh(y @ w) * 0.5 + 0.01 * k
        return y.sum(axis=1)

    with gn.device("cuda"):
        X = gn.source(Xg, name="X")
        branches = [gn.node(work, X, k, name=f"branch{k}") for k in range(8)]
        out = gn.mean(*branches)
    res: dict[str, Any] = {}
    vals = {}
    for name, ex in [("serial", gn.SerialExecutor()), ("streams", gn.StreamsExecutor(workers=8)),
                     ("streams_new", gn.StreamsExecutor(workers=8, stream="new"))]:
        out(executor=ex)  # warm-up: kernels compiled, pool grown
        cp.cuda.Device().synchronize()
        t = best_of(lambda ex=ex: (out(executor=ex, output="device"), cp.cuda.Device().synchronize()), 3)
        res[f"cupy_{name}_seconds"] = t
        vals[name] = cp.asnumpy(out(executor=ex, output="device"))
    for name in ("streams", "streams_new"):
        np.testing.assert_allclose(vals[name], vals["serial"], rtol=1e-4)
    res["cupy_speedup_streams"] = res["cupy_serial_seconds"] / res["cupy_streams_seconds"]
    res["cupy_speedup_streams_new"] = res["cupy_serial_seconds"] / res["cupy_streams_new_seconds"]
    ev = gn.evaluate(out, executor=gn.StreamsExecutor(workers=8), trace=True)
    if png:
        try:
            ev.trace.plot(path=png, title="8 CuPy branches on 8 CUDA streams")
            res["timeline_png"] = png
        except ImportError:
            pass
    return res


def run(quick: bool = False, out_dir: str | None = None) -> dict[str, Any]:
    out_dir = out_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(out_dir, exist_ok=True)
    results = {
        "benchmark": "executors",
        "quick": quick,
        "forest_branches": forest_branches(quick),
        "scheduling_overhead": scheduling_overhead(quick),
        "gpu": gpu_streams(quick, os.path.join(out_dir, "executors_gpu_timeline.png")),
    }
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes: checks the harness runs")
    p.add_argument("--out", default=None, help="JSON file to write")
    a = p.parse_args(argv)
    res = run(a.quick, os.path.dirname(a.out) if a.out else None)
    out = a.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "executors.json")
    with open(out, "w") as f:
        json.dump(res, f, indent=2, default=str)
    print(json.dumps(res, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: a scikit-learn composition converted with ``gn.from_sklearn`` against the original.

The composition: a ``ColumnTransformer`` with 3 column groups, each with its
own preprocessing (``StandardScaler``; ``QuantileTransformer``;
``OneHotEncoder`` on two categorical columns), feeding a ``VotingRegressor``
of 4 members (``Ridge``, ``RandomForestRegressor``, ``ExtraTreesRegressor``,
``DecisionTreeRegressor``), on 100k rows (``--quick``: 5k, one timed run).  Measured in one
run, each variant warm (one untimed run first), best of 3 rounds in which the variants take turns (so the
drifting load of a shared machine weighs on all alike), fit + predict:

* ``serial``: the original as written (every ``n_jobs`` unset);
* ``n_jobs2``: the original with ``n_jobs=2`` wherever scikit-learn offers it
  (the ColumnTransformer, the VotingRegressor and both forests);
* ``gpunets``: ``gn.from_sklearn(original, executor="threads", workers=2)``.

Targets on 2 cores: ``speedup_vs_serial`` (serial / gpunets) >= 1.6,
``ratio_vs_njobs2`` (gpunets / n_jobs2) <= 0.85, identical predictions (within
1e-12: BLAS thread caps and the forests' summation order move the last bits).  The
machine's load (``os.getloadavg``) is reported before and after, since a
shared machine slows every variant.

Run: ``python benchmarks/bench_from_sklearn.py [--quick]``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # run as a script
from benchmarks._runner import bench_main  # noqa: E402 - after the path set-up


def make_data(n: int, seed: int = 0) -> tuple[Any, np.ndarray]:
    import pandas as pd

    rng = np.random.default_rng(seed)
    df = pd.DataFrame(rng.normal(size=(n, 8)), columns=[f"num{i}" for i in range(8)])
    for i in range(4):
        df[f"skew{i}"] = rng.lognormal(size=n)
    df["city"] = rng.choice(["paris", "lyon", "nice", "lille", "brest"], n)
    df["kind"] = rng.choice(["a", "b", "c"], n)
    y = (df["num0"] + np.sin(2 * df["num1"]) + df["num2"] * df["num3"] + np.log(df["skew0"])
         + (df["city"] == "nice") + 0.3 * rng.normal(size=n)).to_numpy()
    return df, y


def composition(n_jobs: int | None) -> Any:
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import (
        ExtraTreesRegressor,
        RandomForestRegressor,
        VotingRegressor,
    )
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, QuantileTransformer, StandardScaler
    from sklearn.tree import DecisionTreeRegressor

    pre = ColumnTransformer([
        ("num", StandardScaler(), [f"num{i}" for i in range(8)]),
        ("skew", QuantileTransformer(n_quantiles=200, random_state=0), [f"skew{i}" for i in range(4)]),
        ("cat", OneHotEncoder(sparse_output=False), ["city", "kind"]),
    ], n_jobs=n_jobs)
    vote = VotingRegressor([
        ("ridge", Ridge(alpha=1.0)),
        ("rf", RandomForestRegressor(n_estimators=16, max_depth=12, random_state=0, n_jobs=n_jobs)),
        ("et", ExtraTreesRegressor(n_estimators=24, max_depth=12, random_state=0, n_jobs=n_jobs)),
        ("tree", DecisionTreeRegressor(max_depth=12, random_state=0)),
    ], n_jobs=n_jobs)
    return make_pipeline(pre, vote)


def _interleaved(fns: dict[str, Any], repeats: int) -> dict[str, tuple[float, list[float], Any]]:
    """Each variant warm (one untimed run), then ``repeats`` rounds running every variant once in turn,
    so that the load of a shared machine, which drifts over minutes, weighs on all variants alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    outs: dict[str, Any] = {}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            outs[k] = fn()
            times[k].append(time.perf_counter() - t)
    return {k: (min(v), v, outs[k]) for k, v in times.items()}


def ideal_speedup(tasks: dict[str, float], workers: int) -> float:
    """The best speed-up of the fits on ``workers`` given each task's time (the last gpunets fit's).

    The network has two stages (the column groups, then the voting members with the forests' chunks);
    a stage takes at least its longest task and its total over the workers.  The ratio of all tasks' total
    (one worker) to the sum of those bounds is what any scheduler could reach at best.
    """
    stages = [[v for k, v in tasks.items() if k.startswith(p) and "<" not in k]
              for p in ("columntransformer__", "votingregressor__")]
    bound = sum(max(max(st), sum(st) / workers) for st in stages if st)
    return sum(tasks.values()) / bound if bound else float("nan")


def whole(tasks: dict[str, float]) -> dict[str, float]:
    """The task times with each forest's chunks as one task (as without ``split_forests``)."""
    out: dict[str, float] = {}
    for k, v in tasks.items():
        base = k.split("[chunk", 1)[0]
        out[base] = out.get(base, 0.0) + v
    return out


def run(quick: bool = False, repeats: int | None = None) -> dict[str, Any]:
    """Run the benchmark; return the figures as a dict (``--quick``: one timed run, small data)."""
    import gpunets as gn

    repeats = repeats or (1 if quick else 3)
    n = 5_000 if quick else 100_000
    X, y = make_data(n)
    Xt, _ = make_data(20_000 if not quick else 2_000, seed=1)
    load_before = os.getloadavg()

    def serial():
        return composition(None).fit(X, y).predict(Xt)

    def njobs2():
        return composition(2).fit(X, y).predict(Xt)

    last: dict[str, Any] = {}

    def ours():
        m = gn.from_sklearn(composition(None), executor="threads", workers=2)
        last["model"] = m
        return m.fit(X, y).predict(Xt)

    res = _interleaved({"serial": serial, "n_jobs2": njobs2, "gpunets": ours}, repeats)
    best = {k: v[0] for k, v in res.items()}
    diff_serial = float(np.max(np.abs(res["gpunets"][2] - res["serial"][2])))
    diff_njobs = float(np.max(np.abs(res["gpunets"][2] - res["n_jobs2"][2])))
    speedup = best["serial"] / best["gpunets"]
    ratio = best["gpunets"] / best["n_jobs2"]
    tasks = {k: round(v.get("seconds", 0.0), 3) for k, v in last["model"].report_.items()}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    # no executor runs the serial work faster than serial / cores: when scikit-learn's own n_jobs=2 comes
    # close to that, no ratio below this one is reachable on this machine in this run
    floor = best["serial"] / min(cores, 2) / best["n_jobs2"]
    return {
        "rows": n, "test_rows": len(Xt), "repeats": repeats,
        "fit_task_seconds": tasks, "ideal_fit_speedup_2_workers": ideal_speedup(tasks, 2),
        "ideal_fit_speedup_2_workers_forests_whole": ideal_speedup(whole(tasks), 2),
        "cores": cores,
        "njobs2_speedup_vs_serial": best["serial"] / best["n_jobs2"],
        "reachable_ratio_vs_njobs2": floor,
        "load_before": load_before, "load_after": os.getloadavg(),
        "seconds": best, "all_seconds": {k: v[1] for k, v in res.items()},
        "speedup_vs_serial": {"value": speedup, "target": ">= 1.6", "met": speedup >= 1.6},
        "ratio_vs_njobs2": {"value": ratio, "target": "<= 0.85", "met": ratio <= 0.85},
        "max_abs_diff_vs_serial": diff_serial, "max_abs_diff_vs_njobs2": diff_njobs,
        # the original itself differs by ~1e-15 between n_jobs=None and n_jobs=2 (forests sum their trees'
        # predictions in another order), and the threads executor caps BLAS threads per task (another
        # blocking in Ridge's solve): "identical" is the tests' tolerance for deterministic estimators
        "identical_predictions": {"value": max(diff_serial, diff_njobs), "target": "<= 1e-12",
                                  "met": max(diff_serial, diff_njobs) <= 1e-12},
    }


if __name__ == "__main__":
    raise SystemExit(bench_main(run, __doc__, name="from_sklearn"))

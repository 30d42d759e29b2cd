"""Benchmark: gpunets stacking (one network, threads) against scikit-learn's StackingRegressor(n_jobs=2).

A stack of 4 base models x 5 folds (Ridge, RandomForestRegressor(n_jobs=1),
HistGradientBoostingRegressor, KNeighborsRegressor) on ~200k rows (``--quick``:
~20k).  Reports, measured side by side in one run:

* ``ratio_vs_sklearn``: gpunets time / scikit-learn time (fit + predict), target <= 0.85;
* ``composite_overhead``: the composite over the same network built by hand with
  ``gn.machine`` / ``gn.fit``, target < 5%;
* that the predictions are identical (max abs difference);
* ``voting``: the same 4 base models averaged (``gn.mean`` of their predictions,
  ``threads``) against ``sklearn.ensemble.VotingRegressor(n_jobs=2)``: both
  times, their ratio and the max abs difference (a peer figure, no target).

Run: ``python benchmarks/bench_stacking.py [--quick] [--out benchmarks/results/stacking.json]``.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from typing import Any

import numpy as np
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # run as a script
from benchmarks._runner import bench_main  # noqa: E402 - after the path set-up


def make_data(n: int, d: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = X[:, 0] + np.sin(2 * X[:, 1]) + X[:, 2] * X[:, 3] + 0.3 * rng.normal(size=n)
    return X, y


def base_models(quick: bool) -> list[tuple[str, Any]]:
    from sklearn.ensemble import HistGradientBoostingRegressor, RandomForestRegressor
    from sklearn.linear_model import Ridge
    from sklearn.neighbors import KNeighborsRegressor

    return [
        ("ridge", Ridge(alpha=1.0)),
        ("rf", RandomForestRegressor(n_estimators=24, max_depth=10, n_jobs=1, random_state=0)),
        ("hgb", HistGradientBoostingRegressor(max_iter=60, early_stopping=False, random_state=0)),
        ("knn", KNeighborsRegressor(n_neighbors=10)),
    ]


def bare_network(X: np.ndarray, y: np.ndarray, estimators: list[tuple[str, Any]], final: Any, n_splits: int):
    """The stacking network written by hand with gn.source / gn.machine / gn.node."""
    import gpunets as gn
    from gpunets.compose.stacking import assemble_folds, concat_predictions, take_rows
    from sklearn.model_selection import KFold

    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    splits = list(KFold(n_splits).split(X, y))
    tests = tuple(te for _, te in splits)
    folds = [(gn.node(take_rows, Xs, tr), gn.node(take_rows, ys, tr), gn.node(take_rows, Xs, te))
             for tr, te in splits]
    oof, full = [], []
    for name, est in estimators:
        preds = [gn.machine(est, Xtr, ytr, name=f"{name}[fold {k}]").predict(Xte)
                 for k, (Xtr, ytr, Xte) in enumerate(folds)]
        oof.append(gn.node(assemble_folds, tests, len(y), *preds))
        full.append(gn.machine(est, Xs, ys, name=name).predict(Xs))
    methods = ("predict",) * len(estimators)
    meta_train = gn.node(concat_predictions, methods, 0, False, *oof)
    final_m = gn.machine(final, meta_train, ys, name="final_estimator")
    return final_m.predict(gn.node(concat_predictions, methods, 0, False, *full))


def _time(fn) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def run(quick: bool = False, repeats: int = 1) -> dict[str, Any]:
    """Run the benchmark; return the figures as a dict."""
    import gpunets as gn
    from sklearn.ensemble import StackingRegressor as SkStacking
    from sklearn.linear_model import RidgeCV

    n = 20_000 if quick else 200_000
    X, y = make_data(n)
    Xt, _ = make_data(5_000, seed=1)
    ests = base_models(quick)
    n_splits = 5

    def sk():
        m = SkStacking(ests, final_estimator=RidgeCV(), cv=n_splits, n_jobs=2).fit(X, y)
        return m.predict(Xt)

    def ours():
        m = gn.StackingRegressor(ests, final_estimator=RidgeCV(), cv=n_splits, executor="threads", workers=2)
        return m.fit(X, y).predict(Xt)

    def bare():
        p = bare_network(X, y, ests, RidgeCV(), n_splits)
        gn.fit(p, executor=gn.ThreadsExecutor(workers=2))
        return p(Xt, executor="serial")

    times: dict[str, list[float]] = {"sklearn": [], "gpunets": [], "bare": []}
    preds: dict[str, Any] = {}
    for _ in range(repeats):
        for key, fn in (("sklearn", sk), ("gpunets", ours), ("bare", bare)):
            t, p = _time(fn)
            times[key].append(t)
            preds[key] = p
    best = {k: min(v) for k, v in times.items()}
    diff = float(np.max(np.abs(preds["gpunets"] - preds["sklearn"])))
    diff_bare = float(np.max(np.abs(preds["gpunets"] - preds["bare"])))
    out = {
        "rows": n, "features": X.shape[1], "folds": n_splits, "models": [name for name, _ in ests],
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "seconds": best, "all_seconds": times,
        "ratio_vs_sklearn": {"value": best["gpunets"] / best["sklearn"], "target": "<= 0.85",
                             "met": best["gpunets"] / best["sklearn"] <= 0.85},
        "composite_overhead": {"value": best["gpunets"] / best["bare"] - 1.0, "target": "<= 0.05",
                               "met": best["gpunets"] / best["bare"] - 1.0 <= 0.05},
        "max_abs_diff_vs_sklearn": diff, "max_abs_diff_vs_bare": diff_bare,
        "identical_predictions": diff <= 1e-8,
    }
    out["voting"] = voting(X, y, Xt, ests, repeats)
    return out


def voting(X: np.ndarray, y: np.ndarray, Xt: np.ndarray, ests: list[tuple[str, Any]],
           repeats: int = 1) -> dict[str, Any]:
    """The base models averaged: a gpunets network against scikit-learn's VotingRegressor(n_jobs=2)."""
    import gpunets as gn
    from sklearn.base import clone
    from sklearn.ensemble import VotingRegressor

    def sk():
        return VotingRegressor(ests, n_jobs=2).fit(X, y).predict(Xt)

    def ours():
        Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
        avg = gn.mean(*[gn.machine(clone(est), Xs, ys, name=name).predict(Xs) for name, est in ests])
        avg.fit(executor=gn.ThreadsExecutor(workers=2))
        return avg(Xt, executor="serial")

    times: dict[str, list[float]] = {"sklearn": [], "gpunets": []}
    preds: dict[str, Any] = {}
    for _ in range(repeats):
        for key, fn in (("sklearn", sk), ("gpunets", ours)):
            t, p = _time(fn)
            times[key].append(t)
            preds[key] = p
    best = {k: min(v) for k, v in times.items()}
    return {"seconds": best, "ratio_vs_sklearn": best["gpunets"] / best["sklearn"],
            "max_abs_diff_vs_sklearn": float(np.max(np.abs(preds["gpunets"] - preds["sklearn"])))}


if __name__ == "__main__":
    raise SystemExit(bench_main(run, __doc__, name="stacking",
                                options=[(["--repeats"], {"type": int, "default": 1, "help": "best of this many"})]))

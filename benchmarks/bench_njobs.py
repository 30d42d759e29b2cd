"""``n_jobs=2`` on a search, as a new user writes it: gpunets' drop-in searches against scikit-learn's own.

Issue 35 item 11: ``n_jobs=k`` is a promise of candidates fitted side by side. Three workloads, each run by
``sklearn.model_selection``'s search and by gpunets' with the same arguments (``n_jobs=2``, no ``executor=``):

* ``forest_regressor``: ``HalvingGridSearchCV(RandomForestRegressor(n_estimators=30), 24 candidates, 20 trees, cv=5,
  resource="n_samples")`` on 3k x 20 rows (``--quick``: 600 rows, 4 candidates);
* ``forest_classifier``: the same with ``RandomForestClassifier``;
* ``columns_logistic``: ``GridSearchCV`` of a ``ColumnTransformer`` (StandardScaler on 8 numeric columns,
  OneHotEncoder on 2 categorical ones) -> ``LogisticRegression`` pipeline, 12 candidates, cv=5, on a 20k-row
  DataFrame (``--quick``: 1k rows, 2 candidates).

Target: gpunets / scikit-learn <= 1.0 with ``n_jobs=2`` on 2 cores. Each ratio is measured within one run: a
warm run of each peer, then rounds of one run of each in turn, the best of 3 per peer (``--quick``: one round),
so that a load that comes and goes on a shared machine falls on both alike. Both searches must find the same
``best_params_``.

Run: ``python benchmarks/bench_njobs.py [--quick]`` or ``python -m benchmarks --only njobs``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._runner import bench_main
from benchmarks.bench_tuning import interleaved

TARGET = 1.0


def _forest(classifier: bool, quick: bool) -> tuple[Any, dict[str, list[Any]], np.ndarray, np.ndarray]:
    from sklearn.datasets import make_classification, make_regression
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

    n = 600 if quick else 3_000
    if classifier:
        X, y = make_classification(n_samples=n, n_features=20, n_informative=8, random_state=0)
        est: Any = RandomForestClassifier(n_estimators=10 if quick else 20, random_state=0)
    else:
        X, y = make_regression(n_samples=n, n_features=20, n_informative=8, noise=5.0, random_state=0)
        est = RandomForestRegressor(n_estimators=10 if quick else 20, random_state=0)
    grid: dict[str, list[Any]] = {"max_depth": [4, None], "min_samples_leaf": [1, 5]}
    if not quick:   # 24 candidates
        grid = {"max_depth": [4, 8, None], "min_samples_leaf": [1, 5], "max_features": [0.3, 0.5, 0.7, 1.0]}
    return est, grid, X, y


def _columns(quick: bool) -> tuple[Any, dict[str, list[Any]], Any, np.ndarray]:
    import pandas as pd
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    n = 1_000 if quick else 20_000
    rng = np.random.default_rng(0)
    num = [f"x{i}" for i in range(8)]
    df = pd.DataFrame(rng.normal(size=(n, 8)), columns=num)
    df["city"] = rng.choice(["a", "b", "c", "d", "e"], size=n)
    df["kind"] = rng.choice(["p", "q", "r"], size=n)
    y = ((df["x0"] + df["x1"] * (df["city"] == "a") + rng.normal(size=n)) > 0).astype(int).to_numpy()
    pre = ColumnTransformer([("num", StandardScaler(), num), ("cat", OneHotEncoder(), ["city", "kind"])])
    pipe = Pipeline([("pre", pre), ("lr", LogisticRegression(max_iter=500))])
    grid: dict[str, list[Any]] = {"lr__C": [0.1, 1.0]}
    if not quick:   # 12 candidates
        grid = {"lr__C": [0.01, 0.1, 1.0, 10.0], "lr__class_weight": [None, "balanced", {0: 1.0, 1: 2.0}]}
    return pipe, grid, df, y


def _compare(name: str, sk: Any, ours: Any, repeat: int) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def run_sk() -> None:
        found["sk"] = sk()

    def run_gn() -> None:
        found["gn"] = ours()
    res: dict[str, Any] = {"load_before": list(os.getloadavg()),
                           "repeats": f"warm run, then best of {repeat}, interleaved"}
    for peer, seconds in interleaved({"sklearn_n_jobs_2": run_sk, "gpunets_n_jobs_2": run_gn}, repeat).items():
        res[peer] = {"seconds": seconds}
        print(f"   {name} {peer}: {seconds:.3f} s", flush=True)
    v = res["gpunets_n_jobs_2"]["seconds"] / res["sklearn_n_jobs_2"]["seconds"]
    res["ratio_vs_sklearn_n_jobs_2"] = {"value": v, "target": f"<= {TARGET}", "met": v <= TARGET}
    same = found["gn"].best_params_ == found["sk"].best_params_
    res["same_best_params"] = {"value": str(same), "target": "True", "met": same}
    res["where"] = {str(k): v for k, v in found["gn"].search_report_.where.items()} \
        if hasattr(found["gn"].search_report_, "where") else None
    res["load_after"] = list(os.getloadavg())
    return res


def _halving_pair(sk_cls: Any, gn_cls: Any, est: Any, grid: Any, X: Any, y: Any) -> tuple[Any, Any]:
    """scikit-learn's and gpunets' halving searches, the same arguments (n_jobs=2, resource="n_samples")."""
    kw = dict(cv=5, factor=3, resource="n_samples", random_state=0, n_jobs=2)
    return (lambda: sk_cls(est, grid, **kw).fit(X, y)), (lambda: gn_cls(est, grid, **kw).fit(X, y))


def run(quick: bool = False) -> dict[str, Any]:
    import sklearn.model_selection as skms
    from sklearn.experimental import enable_halving_search_cv  # noqa: F401
    from sklearn.model_selection import KFold

    import gpunets as gn

    repeat = 1 if quick else 3
    out: dict[str, Any] = {"cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                           else os.cpu_count()}
    for name, classifier in (("forest_regressor", False), ("forest_classifier", True)):
        est, grid, X, y = _forest(classifier, quick)
        out[name] = _compare(name, *_halving_pair(skms.HalvingGridSearchCV, gn.HalvingGridSearchCV, est, grid, X, y),
                             repeat)
        out[name]["candidates"] = int(np.prod([len(v) for v in grid.values()]))
        out[name]["rows"] = len(X)
    pipe, grid, df, y = _columns(quick)
    out["columns_logistic"] = _compare(
        "columns_logistic", lambda: skms.GridSearchCV(pipe, grid, cv=KFold(5), n_jobs=2).fit(df, y),
        lambda: gn.GridSearchCV(pipe, grid, cv=KFold(5), n_jobs=2).fit(df, y), repeat)
    out["columns_logistic"]["candidates"] = int(np.prod([len(v) for v in grid.values()]))
    out["columns_logistic"]["rows"] = len(df)
    return out


if __name__ == "__main__":
    raise SystemExit(bench_main(run, __doc__, name="njobs"))

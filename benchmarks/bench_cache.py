"""The cache of node outputs: refit after changing only the final model's hyperparameter.

A network ``Ridge(transform(expensive, X))`` is trained, then the Ridge's
``alpha`` changes and the network is refit: the expensive transformer skips,
but without the cache its transform of the training data is recomputed for
the Ridge to train on; with ``cache=True`` (MLJ's ``cache=true``) it is taken
from the cache of node outputs (:mod:`gpunets.devices.cache`).  The transformer is a
``PolynomialFeatures(3)`` + ``QuantileTransformer`` pipeline (its transform is
the slow part).  Both networks run in one process, their refits interleaved,
best of the repeats:

* ``refit without cache / refit with cache``: target over 2;
* the cache's figures after the run (hits, misses, stores, bytes).

Run: ``python benchmarks/bench_cache.py [--quick]``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gpunets as gn  # noqa: E402
from benchmarks._runner import bench_main  # noqa: E402 - after the path set-up


def _network(X: Any, y: Any, cache: bool) -> tuple[Any, Any]:
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import PolynomialFeatures, QuantileTransformer

    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    expensive = make_pipeline(PolynomialFeatures(3), QuantileTransformer(n_quantiles=1000, random_state=0))
    W = gn.machine(expensive, Xs, cache=cache).transform(Xs)
    final = gn.machine(Ridge(alpha=1.0), W, ys)
    return final, final.predict(W)


def run(quick: bool = False) -> dict[str, Any]:
    n, p = (4_000, 8) if quick else (20_000, 10)
    repeats = 2 if quick else 5
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, p))
    y = X @ rng.normal(size=p) + rng.normal(size=n)
    gn.cache_clear()
    plain_final, plain = _network(X, y, cache=False)
    cached_final, cached = _network(X, y, cache=True)
    t0 = time.perf_counter()
    gn.fit(plain, executor="serial")
    first_plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    gn.fit(cached, executor="serial")
    first_cached = time.perf_counter() - t0
    best_plain = best_cached = float("inf")
    for i in range(repeats):   # interleaved, so that load on a shared machine hits both sides alike
        alpha = 2.0 + i
        plain_final.model.alpha = alpha
        t0 = time.perf_counter()
        r_plain = gn.fit(plain, executor="serial")
        best_plain = min(best_plain, time.perf_counter() - t0)
        cached_final.model.alpha = alpha
        t0 = time.perf_counter()
        r_cached = gn.fit(cached, executor="serial")
        best_cached = min(best_cached, time.perf_counter() - t0)
        assert r_cached.actions[cached_final] == r_plain.actions[plain_final] == "update"
    same = bool(np.allclose(plain(executor="serial"), cached(executor="serial")))
    info = gn.cache_info()
    ratio = best_plain / best_cached
    return {
        "shape": [n, p],
        "seconds": {"first_fit_without_cache": first_plain, "first_fit_with_cache": first_cached,
                    "refit_without_cache": best_plain, "refit_with_cache": best_cached},
        "same_predictions": same,
        "cache": {"hits": info.hits, "misses": info.misses, "stores": info.stores, "bytes": info.bytes,
                  "budget": info.budget},
        "refit_without_over_with_cache": {"value": ratio, "target": "> 2", "met": ratio > 2 and same},
    }


if __name__ == "__main__":
    raise SystemExit(bench_main(run, __doc__, name="cache"))

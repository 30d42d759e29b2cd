"""Cost of noticing data changed in place: the fingerprint a fit takes of each source.

A fit compares each source's data with a fingerprint taken at the previous fit
(:mod:`gpunets.devices.fingerprint`), so that ``X *= 10`` retrains.  Measured on
200,000 x 50 float64 (the issue's size), as ratios within one run:

* ``fingerprint / Ridge fit``: hashing ``X`` once against the cheapest fit on
  the same data (``Ridge().fit(X, y)``, best of the repeats); target under 0.25;
* ``skip-fit / Ridge fit``: a whole ``gn.fit`` of ``machine(Ridge(), X, y)``
  that skips (the data are unchanged, so all it does is plan and fingerprint
  ``X`` and ``y``); target under 0.3.

Run: ``python benchmarks/bench_fingerprint.py [--quick]``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gpunets as gn  # noqa: E402
from gpunets.devices.fingerprint import fingerprint  # noqa: E402
from benchmarks._runner import bench_main  # noqa: E402 - after the path set-up


def _best(fn: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def run(quick: bool = False) -> dict[str, Any]:
    from sklearn.linear_model import Ridge

    n, p = (20_000, 50) if quick else (200_000, 50)
    repeats = 3 if quick else 7
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, p))
    y = X @ rng.normal(size=p)
    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    mach = gn.machine(Ridge(), Xs, ys)
    gn.fit(mach, executor="serial")
    ridge = hashing = skip = float("inf")
    for _ in range(repeats):   # interleaved, so that load on a shared machine hits every side alike
        ridge = min(ridge, _best(lambda: Ridge().fit(X, y), 1))
        hashing = min(hashing, _best(lambda: fingerprint(X), 1))
        skip = min(skip, _best(lambda: gn.fit(mach, executor="serial"), 1))
    assert gn.fit(mach, executor="serial").actions[mach] == "skip"
    r1, r2 = hashing / ridge, skip / ridge
    return {
        "shape": [n, p],
        "seconds": {"ridge_fit": ridge, "fingerprint_X": hashing, "skip_fit": skip},
        "fingerprint_over_ridge_fit": {"value": r1, "target": "< 0.25", "met": r1 < 0.25},
        "skip_fit_over_ridge_fit": {"value": r2, "target": "< 0.3", "met": r2 < 0.3},
    }


if __name__ == "__main__":
    raise SystemExit(bench_main(run, __doc__, name="fingerprint"))

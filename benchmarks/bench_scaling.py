"""Scaling: speed-up of ``threads`` and emulated ``streams`` over ``serial`` against network width and data size.

The network is ``width`` independent branches from one pair of sources, each a
``RandomForestRegressor(n_jobs=1)`` (its tree building releases the GIL), joined
by ``gn.mean``.  Two sweeps, both with ``workers=2``:

1. **width**: 1, 2, 4 and 8 branches on one data size.  With one branch there is
   nothing to run concurrently, so the figure is the executors' overhead (ideal 1.0);
   from two branches on, the ideal on ``c`` cores is ``min(width, c)``.
2. **data size**: 4 branches on 3 data sizes.  Small fits are dominated by fixed
   costs (thread start-up, scheduling, Python), large ones by the GIL-free work, so
   the speed-up should grow with the size.

Every fit is ``fit(force=True)``.  The executors are timed in turn within each
repeat (interleaved, so that a noisy neighbour slows them alike) and the best of
the repeats is kept (the order rotates from one repeat to the next).  The predictions of every executor are checked to be equal to
the serial ones.  The plots go to ``scaling_width.png`` and ``scaling_size.png``.

Run: ``python benchmarks/bench_scaling.py [--quick] [--out benchmarks/results/scaling.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import gpunets as gn  # noqa: E402

EXECUTORS = ("serial", "threads", "streams")
WORKERS = 2
# Targets on a 2-core machine, for the full sizes (quick mode only checks that the harness runs).
TARGET_WIDE = 1.6       # threads and streams at width 8 (the ideal is 2.0)
TARGET_LARGEST = 1.6    # threads at the largest data size, 4 branches


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def make_data(n: int, d: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = X[:, 0] + np.sin(2 * X[:, 1]) + X[:, 2] * X[:, 3] + 0.3 * rng.normal(size=n)
    return X, y


def network(X: np.ndarray, y: np.ndarray, width: int, trees: int, depth: int) -> Any:
    from sklearn.ensemble import RandomForestRegressor

    Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
    branches = [gn.machine(RandomForestRegressor(n_estimators=trees, max_depth=depth, n_jobs=1, random_state=i),
                           Xs, ys).predict(Xs) for i in range(width)]
    return branches[0] if width == 1 else gn.mean(*branches)


def executor(name: str) -> Any:
    return {"serial": gn.SerialExecutor, "threads": gn.ThreadsExecutor,
            "streams": gn.StreamsExecutor}[name](workers=WORKERS) if name != "serial" else gn.SerialExecutor()


def measure(X: np.ndarray, y: np.ndarray, width: int, trees: int, depth: int, repeats: int) -> dict[str, Any]:
    """Best-of-``repeats`` fit times of each executor, interleaved, and the speed-ups over serial."""
    out = network(X, y, width, trees, depth)
    execs = {name: executor(name) for name in EXECUTORS}
    best = {name: float("inf") for name in EXECUTORS}
    preds: dict[str, Any] = {}
    out.fit(executor="serial", force=True)            # warm-up: imports, caches, first-touch allocations
    names = list(EXECUTORS)
    for rep in range(repeats):
        for name in names[rep % 3:] + names[:rep % 3]:  # interleaved, the order rotated each repeat
            ex = execs[name]
            t = time.perf_counter()
            out.fit(executor=ex, force=True)
            best[name] = min(best[name], time.perf_counter() - t)
            preds[name] = out(executor="serial")
    diff = max(float(np.max(np.abs(preds[n] - preds["serial"]))) for n in EXECUTORS)
    return {"rows": int(X.shape[0]), "width": width, "seconds": best,
            "speedup": {n: best["serial"] / best[n] for n in EXECUTORS if n != "serial"},
            "max_abs_diff_vs_serial": diff}


def _plot(xs: list[int], series: dict[str, list[float]], ideal: list[float] | None, xlabel: str, title: str,
          path: str, logx: bool = False) -> str:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, ys in series.items():
        ax.plot(xs, ys, marker="o", label=name)
    if ideal is not None:
        ax.plot(xs, ideal, linestyle="--", color="gray", label=f"ideal ({WORKERS} workers, {cores()} cores)")
    ax.axhline(1.0, color="black", linewidth=0.6)
    if logx:
        ax.set_xscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("speed-up over serial")
    ax.set_title(title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run(quick: bool = False, out_dir: str | None = None) -> dict[str, Any]:
    """Both sweeps; returns the figures as a dict (the runner writes the JSON) and saves the two plots."""
    out_dir = out_dir or os.path.join(HERE, "results")
    os.makedirs(out_dir, exist_ok=True)
    if quick:
        n_width, sizes, trees, depth, repeats = 1_500, [500, 1_500, 4_000], 4, 8, 3
    else:
        n_width, sizes, trees, depth, repeats = 10_000, [2_000, 10_000, 40_000], 10, 12, 3
    widths = [1, 2, 4, 8]
    size_width = 4
    X, y = make_data(max(sizes + [n_width]))

    by_width = [measure(X[:n_width], y[:n_width], w, trees, depth, repeats) for w in widths]
    by_size = [measure(X[:n], y[:n], size_width, trees, depth, repeats) for n in sizes]

    k = min(WORKERS, cores())
    _plot(widths, {n: [r["speedup"][n] for r in by_width] for n in ("threads", "streams")},
          [float(min(w, k)) for w in widths], "independent branches (RandomForest, n_jobs=1)",
          f"Speed-up against network width ({n_width} rows, {trees} trees each)",
          os.path.join(out_dir, "scaling_width.png"))
    _plot(sizes, {n: [r["speedup"][n] for r in by_size] for n in ("threads", "streams")},
          [float(min(size_width, k))] * len(sizes), "rows",
          f"Speed-up against data size ({size_width} branches, {trees} trees each)",
          os.path.join(out_dir, "scaling_size.png"), logx=True)

    wide, largest = by_width[-1]["speedup"], by_size[-1]["speedup"]
    res: dict[str, Any] = {
        "workers": WORKERS, "cores": cores(), "trees": trees, "max_depth": depth, "repeats": repeats,
        "quick": quick, "width": by_width, "size": by_size,
        "plots": [os.path.join(out_dir, "scaling_width.png"), os.path.join(out_dir, "scaling_size.png")],
        "max_abs_diff_vs_serial": max(r["max_abs_diff_vs_serial"] for r in by_width + by_size),
    }
    if cores() >= 2:
        res["threads_width8"] = {"value": wide["threads"], "target": f">= {TARGET_WIDE}",
                                 "met": wide["threads"] >= TARGET_WIDE}
        res["streams_width8"] = {"value": wide["streams"], "target": f">= {TARGET_WIDE}",
                                 "met": wide["streams"] >= TARGET_WIDE}
        res["threads_largest"] = {"value": largest["threads"], "target": f">= {TARGET_LARGEST}",
                                  "met": largest["threads"] >= TARGET_LARGEST}
    else:  # pragma: no cover - a one-core machine cannot show a speed-up
        res["targets"] = {"skipped": "one core: no speed-up is possible"}
    res["identical_predictions"] = {"value": res["max_abs_diff_vs_serial"], "target": "== 0",
                                    "met": res["max_abs_diff_vs_serial"] == 0.0}
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes (seconds): checks the harness runs")
    p.add_argument("--out", default=os.path.join(HERE, "results", "scaling.json"), help="JSON results file")
    a = p.parse_args(argv)
    t = time.perf_counter()
    res = run(quick=a.quick, out_dir=os.path.dirname(os.path.abspath(a.out)))
    res["seconds_total"] = time.perf_counter() - t
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2, default=str)
    for label, rows in (("width", res["width"]), ("size", res["size"])):
        for r in rows:
            sp = ", ".join(f"{k} {v:.2f}x" for k, v in r["speedup"].items())
            print(f"{label:>5}: width {r['width']}, {r['rows']} rows: serial {r['seconds']['serial'] * 1e3:.0f} ms; {sp}")
    print(f"wrote {a.out} and {', '.join(res['plots'])} in {res['seconds_total']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

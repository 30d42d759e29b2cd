"""GPU against CPU, end to end, on the same machine (issue 36, item 6).

    python benchmarks/bench_gpu_vs_cpu.py [--quick] [--out PATH] [--budget SECONDS] [--png PATH]

Three workloads, at 10^4, 10^5 and 10^6 rows x 50 columns, float64 and float32:

- ``gpu_part``: the GPU-capable part of the demo's network on its own: StandardScaler -> PCA(20) -> Ridge (svd),
  fitted, then predicting the training rows (scikit-learn's array-API twins on CuPy where there is no cuML);
- ``search``: the one-stage search, ``gn.GridSearchCV`` of StandardScaler -> PCA(20) -> Ridge, 10 alphas x 5 folds,
  then predicting the training rows;
- ``network``: the demo's network (``python -m gpunets demo``: scaler, Ridge, KNN, two forests, their stack and
  average). Where the GPU image has no RAPIDS (cuML), its KNN and forests fall back to the CPU: the ``routes``
  column says so, and ``gpu_part`` is the part that runs on the GPU.

Four modes: ``cpu_serial`` (the reference), ``cpu_best`` (the threads executor over every core, each worker's
BLAS and OpenMP capped by the executor), ``gpu_auto`` (``device="cuda"``, ``executor="auto"``) and
``gpu_streams`` (``device="cuda"``, ``executor="streams"``). End to end: a GPU mode copies its inputs to the GPU
inside the timed window and its predictions back to the host.

- **warm**: per (workload, rows, dtype), one untimed run of each mode, then rounds of one run of each mode in
  turn (interleaved), the best of 5 (3 with ``--quick``) kept;
- **cold**: each mode's first run in a fresh process (``--cold``), after its imports; the difference to its
  second run is the one-off cost (CuPy's kernel compilation, numba's, CUDA's start), reported apart.

Per mode: wall seconds, GPU-busy fraction (GPU time over wall time, where the run's trace records it; else
None), routes (where each machine ran: ``array_api``, ``cuml``, ``sklearn`` on the CPU, ``cpu_fallback``), and
the largest |difference| of the predictions from ``cpu_serial``'s. The headline is the **crossover**: per
workload and dtype, the smallest row count where a GPU mode beats ``cpu_best``, with a plot (seconds against
rows, one line per mode) written to ``--png`` (default ``docs/img/gpu_vs_cpu.png``, on a real GPU only).

A cell whose estimated time (from the same workload's smaller size) would pass the section's ``--budget``
is skipped and says so. On the fake GPU (``GPUNETS_FAKE_GPU``) and with ``--quick`` without a GPU the
section runs at tiny sizes as a harness check and claims nothing: no crossover, no plot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # run as a script
from benchmarks._runner import bench_main  # noqa: E402 - after the path set-up

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES: dict[str, tuple[str, str]] = {"cpu_serial": ("cpu", "serial"), "cpu_best": ("cpu", "threads"),
                                     "gpu_auto": ("cuda", "auto"), "gpu_streams": ("cuda", "streams")}
WORKLOADS = ("gpu_part", "search", "network")
ROWS = (10_000, 100_000, 1_000_000)
DTYPES = ("float64", "float32")
COLUMNS = 50
#: time growth per 10x rows, to estimate a cell before running it (KNN's predictions grow with rows^2)
GROWTH = {"gpu_part": 10.0, "search": 10.0, "network": 60.0}
#: seconds the first (smallest) cell of a workload is expected to take on a GPU machine: below that much budget
#: left it is skipped (the demo's network fits 2 forests 6 times and predicts with KNN, for each mode and round)
FIRST_CELL = {"network": 40.0}
#: the machine kinds of each workload (for the crossover table of ``gpunets.planning.crossover``)
KINDS = {"gpu_part": ("StandardScaler", "PCA", "Ridge"), "search": ("StandardScaler", "PCA", "Ridge")}


# ---- the workloads --------------------------------------------------------------------------------------------

def make_data(n: int, dtype: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, COLUMNS)) @ rng.normal(size=(COLUMNS, COLUMNS)) / np.sqrt(COLUMNS)
    y = X[:, :5].sum(axis=1) + rng.normal(size=n)
    return X.astype(dtype), y.astype(dtype)


def _host(x: Any) -> np.ndarray:
    return np.asarray(x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else x)


def _busy(*holders: Any) -> float | None:
    """The GPU-busy fraction a run's report or trace records (issue 36, item 1), or None where none does."""
    for h in holders:
        for name in ("gpu_busy_fraction", "gpu_busy", "busy_fraction"):
            v = getattr(h, name, None)
            v = v() if callable(v) else v
            if isinstance(v, (int, float)):
                return float(v)
    return None


def _routes(report: Any) -> dict[str, int]:
    return dict(Counter(f"{r['path']}@{r['device']}" for r in report.rows()))


def run_gpu_part(X: Any, y: Any, device: str, executor: str) -> tuple[Any, dict[str, Any]]:
    from sklearn.decomposition import PCA
    from sklearn.linear_model import Ridge
    from sklearn.preprocessing import StandardScaler

    import gpunets as gn

    with gn.device(device):
        Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
        W = gn.machine(StandardScaler(), Xs, name="scale").transform(Xs)
        Z = gn.machine(PCA(n_components=20, random_state=0), W, name="pca").transform(W)
        out = gn.machine(Ridge(solver="svd"), Z, ys, name="ridge").predict(Z)
    rep = out.fit(executor=executor)
    pred = out(executor=executor, output="numpy")
    return pred, {"routes": _routes(rep), "gpu_busy_fraction": _busy(rep, rep.trace)}


def run_search(X: Any, y: Any, device: str, executor: str) -> tuple[Any, dict[str, Any]]:
    from sklearn.model_selection import KFold

    import gpunets as gn
    from benchmarks.bench_tuning import grids, pipeline

    est = pipeline().set_params(ridge__solver="svd")
    from gpunets.tuning.onepass_search import enabled

    with enabled(False):   # the search's network on each device (the one-pass path: bench_tuning.py --one-pass)
        s = gn.GridSearchCV(est, grids()["one_stage"], cv=KFold(5), executor=executor, device=device).fit(X, y)
    import sklearn

    with sklearn.config_context(array_api_dispatch=device == "cuda"):   # the refit is the array-API twin there
        pred = _host(s.predict(X))
    rep = s.search_report_
    route = rep.refit_route
    return pred, {"routes": {f"refit {route[0]}@{route[1]}" if route else "refit sklearn@cpu": 1},
                  "gpu_busy_fraction": _busy(rep, rep.trace)}


def run_network(X: Any, y: Any, device: str, executor: str) -> tuple[Any, dict[str, Any]]:
    from gpunets.__main__ import build_network

    out, _ = build_network(X, y, device=device, executor=executor)
    rep = out.fit(executor=executor)
    pred = out(executor=executor, output="numpy")
    return pred, {"routes": _routes(rep), "gpu_busy_fraction": _busy(rep, rep.trace)}


RUNNERS: dict[str, Callable[..., tuple[Any, dict[str, Any]]]] = {
    "gpu_part": run_gpu_part, "search": run_search, "network": run_network}


def run_mode(workload: str, mode: str, X: np.ndarray, y: np.ndarray, cp: Any) -> tuple[float, np.ndarray, dict]:
    """One end-to-end run: (seconds, predictions on the host, info)."""
    import gpunets as gn

    device, executor = MODES[mode]
    workers = os.cpu_count() if mode == "cpu_best" else None
    with gn.config(fallback="silent", workers=workers):
        t = time.perf_counter()
        if device == "cuda":
            X, y = cp.asarray(X), cp.asarray(y)
        pred, info = RUNNERS[workload](X, y, device, executor)
        pred = _host(pred)
        seconds = time.perf_counter() - t
    return seconds, pred, info


# ---- warm: interleaved, best of N -----------------------------------------------------------------------------

def warm_cell(workload: str, rows: int, dtype: str, modes: Sequence[str], repeat: int, cp: Any) -> dict[str, Any]:
    X, y = make_data(rows, dtype)
    best: dict[str, float] = {}
    last: dict[str, tuple[np.ndarray, dict]] = {}
    for mode in modes:   # warm-up: compiles, fills the pools
        _, pred, info = run_mode(workload, mode, X, y, cp)
        last[mode] = (pred, info)
    for _ in range(repeat):
        for mode in modes:
            seconds, pred, info = run_mode(workload, mode, X, y, cp)
            if seconds < best.get(mode, float("inf")):
                best[mode], last[mode] = seconds, (pred, info)
    ref = last[modes[0]][0]
    out: dict[str, Any] = {}
    for mode in modes:
        pred, info = last[mode]
        out[mode] = {"seconds": round(best[mode], 5), "gpu_busy_fraction": info["gpu_busy_fraction"],
                     "routes": info["routes"],
                     "max_abs_diff_vs_cpu_serial": float(np.max(np.abs(pred.astype(np.float64) - ref)))}
    return out


def crossover(cells: dict[str, Any], rows: Sequence[int]) -> dict[str, Any]:
    """Per workload and dtype: the smallest row count where a GPU mode beats ``cpu_best`` (None if none did)."""
    out: dict[str, Any] = {}
    for key, by_rows in cells.items():
        found = None
        for n in rows:
            cell = by_rows.get(str(n), {})
            if "cpu_best" not in cell:
                continue
            gpu = [cell[m]["seconds"] for m in ("gpu_auto", "gpu_streams") if m in cell]
            if gpu and min(gpu) < cell["cpu_best"]["seconds"]:
                found = n
                break
        out[key] = found
    return out


def measured_up_to(cells: dict[str, Any]) -> dict[str, int | None]:
    """Per workload and dtype: the largest row count whose cell was measured (None: none was)."""
    return {key: max((int(n) for n, c in by_rows.items() if "cpu_best" in c), default=None)
            for key, by_rows in cells.items()}


def crossover_table(cross: dict[str, Any], upto: dict[str, int | None]) -> dict[str, int]:
    """The rows from which each machine kind is worth the GPU, from ``gpu_part``'s crossovers (over the dtypes
    measured: the largest), in the form of ``gn.config(gpu_crossover=...)``; empty when ``gpu_part`` was not
    measured. Where the GPU won at no measured size, it is kept for sizes beyond the largest measured
    (that size + 1): nothing is claimed where nothing was measured."""
    limits = []
    for key, found in cross.items():
        if not key.startswith("gpu_part/") or upto.get(key) is None:
            continue
        limits.append(found if found is not None else upto[key] + 1)   # type: ignore[operator]
    if not limits:
        return {}
    return {kind: int(max(limits)) for kind in KINDS["gpu_part"]}


def plot(cells: dict[str, Any], rows: Sequence[int], path: str, title: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    keys = list(cells)
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for mode in MODES:
            pts = [(n, cells[key][str(n)][mode]["seconds"]) for n in rows
                   if mode in cells[key].get(str(n), {})]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=mode)
        ax.set(xscale="log", yscale="log", xlabel="rows (50 columns)", ylabel="seconds (end to end)", title=key)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- cold: a fresh process per mode ---------------------------------------------------------------------------

def cold_child(workload: str, mode: str, rows: int, dtype: str) -> dict[str, Any]:
    """In a fresh process: the imports, the first run and the second, timed apart."""
    t0 = time.perf_counter()
    import gpunets  # noqa: F401
    from gpunets.devices import _gpulibs

    cp = _gpulibs.cupy() if MODES[mode][0] == "cuda" else None
    X, y = make_data(rows, dtype)
    t_import = time.perf_counter() - t0
    first, _, _ = run_mode(workload, mode, X, y, cp)
    second, _, _ = run_mode(workload, mode, X, y, cp)
    return {"import_seconds": round(t_import, 3), "first_seconds": round(first, 4),
            "second_seconds": round(second, 4), "one_off_seconds": round(max(0.0, first - second), 4)}


def cold(workloads: Sequence[str], modes: Sequence[str], rows: int, dtype: str, timeout: float) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": rows, "dtype": dtype}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    for workload in workloads:
        for mode in modes:
            cmd = [sys.executable, os.path.abspath(__file__), "--cold", workload, mode, str(rows), dtype]
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
                lines = p.stdout.strip().splitlines()
                res = json.loads(lines[-1]) if p.returncode == 0 and lines else {
                    "error": (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1][:300]}
            except subprocess.TimeoutExpired:
                res = {"error": f"over {timeout:.0f} s"}
            out[f"{workload}/{mode}"] = res
    return out


# ---- the section ----------------------------------------------------------------------------------------------

def gpu_here() -> tuple[Any, bool, str]:
    """(cupy or None, fake, why not)."""
    from gpunets.devices import _gpulibs

    try:
        cp = _gpulibs.cupy()
    except ImportError:
        return None, False, "CuPy is not installed"
    if not cp.cuda.is_available():
        return None, False, "cupy.cuda.is_available() is False: no CUDA GPU here"
    return cp, bool(_gpulibs.fake_gpu_count()), ""


def run(quick: bool = False, budget: float | None = None, png: str | None = None,
        rows: Sequence[int] | None = None, workloads: Sequence[str] = WORKLOADS,
        dtypes: Sequence[str] = DTYPES, with_cold: bool = True, repeat: int | None = None,
        cold_workloads: Sequence[str] = ("gpu_part", "search")) -> dict[str, Any]:
    """Run the section; returns the results (see the module docstring)."""
    t_start = time.perf_counter()
    cp, fake, why = gpu_here()
    real = cp is not None and not fake
    modes = list(MODES) if cp is not None else ["cpu_serial", "cpu_best"]
    if rows is None:
        rows = ROWS if real else ((300,) if quick else (1_000, 5_000))
    if quick and not real and dtypes == DTYPES:
        dtypes = ("float64",)   # a harness check (CI's python -m benchmarks --quick): one size, one dtype, one round
    repeat = repeat or (1 if quick and not real else 3 if quick or not real else 5)
    budget = budget if budget is not None else (240.0 if real else 90.0)
    res: dict[str, Any] = {"fake_gpu": fake, "real_gpu": real, "gpu": why or ("fake GPU" if fake else _gpu_name(cp)),
                           "rows": list(rows), "columns": COLUMNS, "dtypes": list(dtypes), "modes": modes,
                           "repeat": repeat, "budget_seconds": budget, "cpu_cores": os.cpu_count(),
                           "rapids": _has("cuml"),
                           "cpu_best": "executor='threads', workers = every core; BLAS/OpenMP capped per worker"}
    from gpunets.compute.models import scipy_array_api_enabled

    if cp is not None and not scipy_array_api_enabled():
        res["note_array_api"] = ("SCIPY_ARRAY_API=1 was not set before scipy was imported: no array-API twins, so "
                                 "the GPU modes' machines fall back to the CPU (routes say cpu_fallback)")
    if not res["rapids"]:
        res["note_rapids"] = ("no cuML here: the network's KNN and forests run on the CPU in the GPU modes "
                              "(routes say so); gpu_part is the part of the network that runs on the GPU")
    cells: dict[str, Any] = {}
    spent: dict[str, float] = {}
    # workload by workload, the cheap ones first: the crossover of gpu_part (the placement table's source) and of
    # the search are measured at every size before the network, the slowest, takes what is left of the budget
    for workload in workloads:
        wdtypes = dtypes[:1] if workload == "network" and quick and real else dtypes   # quick: the network in float64
        for n in rows:
            for dtype in wdtypes:
                key = f"{workload}/{dtype}"
                cells.setdefault(key, {})
                left = budget - (time.perf_counter() - t_start)
                prev = spent.get(key)
                estimate = (prev * GROWTH[workload] * (n / rows[rows.index(n) - 1]) / 10 if prev
                            else FIRST_CELL.get(workload, 0.0) if real else 0.0)
                if estimate > left:
                    cells[key][str(n)] = {"skipped": f"estimated {estimate:.0f} s, {left:.0f} s of the budget left"}
                    continue
                t = time.perf_counter()
                try:
                    cells[key][str(n)] = warm_cell(workload, n, dtype, modes,
                                                   1 if workload == "network" and quick else repeat, cp)
                except Exception as e:  # noqa: BLE001 - one cell failing is reported, the others still run
                    cells[key][str(n)] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
                spent[key] = time.perf_counter() - t
                print(f"   gpu_vs_cpu {key} {n} rows: " + ", ".join(
                    f"{m} {v['seconds']:.3f} s" for m, v in cells[key][str(n)].items() if isinstance(v, dict)
                ), flush=True)
    res["warm"] = cells
    if with_cold:
        res["cold"] = cold([w for w in cold_workloads if w in workloads], modes, rows[0], "float64", timeout=60.0)
    if real:
        cross = crossover(cells, rows)
        res["crossover_rows"] = cross
        res["measured_up_to_rows"] = upto = measured_up_to(cells)
        res["crossover_table"] = crossover_table(cross, upto)
        res["plot"] = plot(cells, rows, png or os.path.join(ROOT, "docs", "img", "gpu_vs_cpu.png"),
                           f"gpunets: GPU ({res['gpu']}) against CPU ({os.cpu_count()} cores), end to end")
    else:
        res["note"] = ("harness check only: " + ("fake GPU" if fake else why) +
                       "; no crossover, no plot and no target are claimed")
    errors = [f"{k} {n}: {v['error']}" for k, by in cells.items() for n, v in by.items() if "error" in v]
    if errors:
        res["error"] = "; ".join(errors)[:1000]
    res["section_seconds"] = round(time.perf_counter() - t_start, 1)
    return res


def _gpu_name(cp: Any) -> str:
    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _has(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def summary(res: dict[str, Any]) -> None:
    print(one_line(res))


def one_line(res: dict[str, Any]) -> str:
    """The section's summary: the crossovers on a GPU, else what ran."""
    if res.get("real_gpu"):
        cross = res.get("crossover_rows", {})
        parts = [f"{k} {'never' if v is None else f'{v:,} rows'}" for k, v in cross.items()]
        return "GPU beats CPU best from: " + ", ".join(parts)
    n = sum(1 for by in res.get("warm", {}).values() for c in by.values() if "skipped" not in c and "error" not in c)
    why = "" if res.get("fake_gpu") else f" ({res.get('gpu')})"
    return f"{n} cells run on {', '.join(res.get('modes', []))}, no crossover claimed{why}"


OPTIONS = [
    (("--budget",), {"type": float, "default": None, "help": "seconds for the warm cells (default 240 on a GPU)"}),
    (("--png",), {"default": None, "help": "the plot (default docs/img/gpu_vs_cpu.png, on a real GPU only)"}),
]

if __name__ == "__main__":
    if sys.argv[1:2] == ["--cold"]:
        w, m, r, d = sys.argv[2:6]
        print(json.dumps(cold_child(w, m, int(r), d)))
        raise SystemExit(0)
    raise SystemExit(bench_main(run, __doc__, name="gpu_vs_cpu", options=OPTIONS, summary=summary))

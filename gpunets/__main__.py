"""``python -m gpunets demo``: a real network fitted in every mode present, side by side.

The network: standardisation, four base learners (Ridge, k-nearest neighbours,
a random forest, extra trees), their out-of-fold stack (``gn.StackingRegressor``
with a linear final model) and a simple average of the base learners; the
output is the mean of the stack and the average.  The demo fits it with every
executor and device present (CPU serial, CPU threads, CPU-emulated streams, GPU
streams where a GPU exists), then prints a table of wall time, speed-up over CPU
serial and the largest difference from the CPU serial predictions.  Each mode is
fitted ``--repeat`` times (default 3) and the best time kept; a speed-up smaller
than the spread over the repeats is called "within noise".  It says whether a GPU
was found (and why not), and saves the fastest run's timeline (the stack's own
fold fits included) as PNG and as a Perfetto trace.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import gpunets as gn
from gpunets import __version__
from gpunets.devices.placement import Device, device_exists, gpu_available, gpu_count, why_unavailable
from gpunets.executors.base import default_workers

__all__ = ["main", "build_network", "demo"]


class DemoError(Exception):
    """A bad option: printed as one line, exit status 2."""


def build_network(X: Any, y: Any, *, device: str = "cpu", executor: str = "serial") -> tuple[Any, dict[str, Any]]:
    """The demo network on training data ``X, y``; returns the output node and the named parts."""
    from sklearn.ensemble import ExtraTreesRegressor, RandomForestRegressor
    from sklearn.linear_model import LinearRegression, Ridge
    from sklearn.neighbors import KNeighborsRegressor
    from sklearn.preprocessing import StandardScaler

    def base() -> list[tuple[str, Any]]:
        return [("ridge", Ridge(alpha=1.0)),
                ("knn", KNeighborsRegressor(n_neighbors=10)),
                ("forest", RandomForestRegressor(n_estimators=40, max_depth=10, n_jobs=1, random_state=0)),
                ("extra", ExtraTreesRegressor(n_estimators=40, max_depth=10, n_jobs=1, random_state=0))]

    with gn.device(device):
        Xs, ys = gn.source(X, name="X"), gn.source(y, name="y")
        scale = gn.machine(StandardScaler(), Xs, name="scale")
        W = scale.transform(Xs)
        learners = {name: gn.machine(model, W, ys, name=name) for name, model in base()}
        average = gn.mean(*[m.predict(W) for m in learners.values()], name="average")
        stack_model = gn.StackingRegressor(estimators=base(), final_estimator=LinearRegression(), cv=5,
                                           executor=executor)
        stack = gn.machine(stack_model, W, ys, name="stack").predict(W)
        out = gn.mean(stack, average, name="output")
    return out, {"stack": stack, "average": average, "learners": learners}


def modes(device: str | None, executor: str | None) -> list[tuple[str, str, str]]:
    """(label, device, executor) for every mode present, filtered by the options."""
    if device is not None:
        try:
            dev = Device.parse(device)
        except ValueError as e:
            raise DemoError(str(e)) from None
        if dev.is_cuda and not device_exists(dev):
            raise DemoError(f"--device {device}: {why_unavailable(dev)}. Use --device cpu, or leave it out to "
                            "run every device present.")
    executors = ["serial", "threads", "streams"]
    if executor is not None:
        if executor not in executors + ["dask"]:
            raise DemoError(f"--executor {executor!r} is not an executor; use one of {executors + ['dask']}.")
        executors = [executor]
    out = []
    devices = [str(Device.parse(device))] if device is not None else (["cpu", "cuda:0"] if gpu_available() else ["cpu"])
    for d in devices:
        for e in executors:
            if d.startswith("cuda") and e != "streams" and executor is None:
                continue  # on the GPU, streams is the mode that matters (serial is the reference below)
            label = f"{'GPU' if d.startswith('cuda') else 'CPU'} {e}" + (" (emulated)" if e == "streams" and d == "cpu" else "")
            out.append((label, d, e))
    if ("CPU serial", "cpu", "serial") not in out:
        out.insert(0, ("CPU serial", "cpu", "serial"))  # the reference every mode is compared with
    return out


EMULATED_STREAMS = ("emulated streams: the GPU's schedule run on the CPU, one thread per CUDA-stream lane, tasks "
                    "in stream order, so the streams executor is tested where there is no GPU.")


def gpu_line() -> str:
    """One line: the GPU the demo uses, or that none was found and why (no CuPy, no device...)."""
    if gpu_available():
        return f"GPU: {gpu_count()} found; the GPU modes run on cuda:0."
    return f"GPU: none found, so only the CPU modes run ({why_unavailable('cuda:0')})."


def demo(rows: int = 12_000, device: str | None = None, executor: str | None = None,
         out_dir: str = "demo-output", progress: bool = True, stream: Any = None,
         repeat: int = 3) -> list[dict[str, Any]]:
    """Run the demo; return one row of figures per mode.

    Each mode builds and fits the network ``repeat`` times from scratch and keeps the best time, so
    that one slow run on a busy machine does not reverse the comparison.
    """
    import numpy as np

    stream = stream or sys.stdout
    if rows < 100:
        raise DemoError(f"--rows {rows}: need at least 100 rows (5 folds of stacking, and a test set).")
    if repeat < 1:
        raise DemoError(f"--repeat {repeat}: need at least 1 run per mode (default 3, the best is kept).")
    run_modes = modes(device, executor)
    from sklearn.datasets import make_friedman1

    X, y = make_friedman1(n_samples=rows + rows // 4, n_features=10, noise=0.5, random_state=0)
    X_train, y_train, X_test, y_test = X[:rows], y[:rows], X[rows:], y[rows:]
    print(f"gpunets demo: {rows} training rows, {len(X_test)} test rows, 10 features (Friedman #1)", file=stream)
    print("network: scale -> [ridge, knn, forest, extra] -> average; StackingRegressor(same 4, cv=5) -> stack; "
          "output = mean(stack, average)", file=stream)
    print(gpu_line(), file=stream)
    if any(label.endswith("(emulated)") for label, _, _ in run_modes):
        print(EMULATED_STREAMS, file=stream)
    print(f"each mode: best of {repeat} fit{'s' if repeat > 1 else ''} from scratch, "
          f"on {_cores()} CPU cores\n", file=stream)
    results = []
    reference = None
    best = None
    for label, dev, ex in run_modes:
        times = []
        for _ in range(repeat):
            out, parts = build_network(X_train, y_train, device=dev, executor=ex)
            t = time.perf_counter()
            report = out.fit(executor=ex, workers=2 if dev == "cpu" else None, progress=progress)
            times.append(time.perf_counter() - t)
            if min(times) == times[-1]:
                kept = report
        report = kept
        seconds = min(times)
        pred = np.asarray(out(X_test, executor=ex))
        if reference is None:
            reference = pred
            print(report, file=stream)
            print(file=stream)
        rmse = float(np.sqrt(np.mean((pred - y_test) ** 2)))
        row = {"mode": label, "device": dev, "executor": ex, "seconds": seconds, "all_seconds": times,
               "max_abs_diff": float(np.max(np.abs(pred - reference))), "rmse": rmse,
               "machines": {k: v for k, v in report.actions.by_label().items()}, "trace": report.trace}
        results.append(row)
        if best is None or seconds < best["seconds"]:
            best = row
    base = results[0]
    print(f"{'mode':<24} {'wall s':>8} {'speed-up':>9} {'max |diff| vs CPU serial':>25} {'test RMSE':>10}",
          file=stream)
    for r in results:
        print(f"{r['mode']:<24} {r['seconds']:>8.2f} {base['seconds'] / r['seconds']:>8.2f}x "
              f"{r['max_abs_diff']:>25.2e} {r['rmse']:>10.4f}", file=stream)
    if repeat > 1:
        noisy = [r["mode"] for r in results[1:] if _within_noise(r, base)]
        print(f"(best of {repeat}; spread over the repeats: "
              + ", ".join(f"{r['mode']} {max(r['all_seconds']) / r['seconds'] - 1:.0%}" for r in results) + ")",
              file=stream)
        if noisy:
            print(f"within noise of CPU serial (the gap is smaller than the spread): {', '.join(noisy)}",
                  file=stream)
    os.makedirs(out_dir, exist_ok=True)
    trace = best["trace"]
    trace_path = trace.to_chrome(os.path.join(out_dir, "fastest_fit_trace.json"))
    n_inner = sum(1 for r in trace.nested if r.kind == "fit")
    print(f"\nfastest: {best['mode']}; Perfetto trace: {trace_path} (open it at ui.perfetto.dev); "
          f"{sum(1 for r in trace.records if r.kind == 'fit')} machine fits and the {n_inner} fits inside the stack",
          file=stream)
    try:
        png = os.path.join(out_dir, "fastest_fit_timeline.png")
        trace.plot(path=png, title=f"demo fit, {best['mode']}")
        print(f"timeline: {png}", file=stream)
    except ImportError:
        print("timeline PNG skipped: matplotlib is not installed (pip install 'gpunets[demo]')", file=stream)
    return results


def _cores() -> int:
    return default_workers()


def _within_noise(r: dict[str, Any], base: dict[str, Any]) -> bool:
    noise = max(max(x["all_seconds"]) / x["seconds"] - 1 for x in (r, base))
    return abs(base["seconds"] / r["seconds"] - 1) <= noise


#: The launch environment for concurrent GPU lanes (docs/devices.md): per-thread default streams for
#: CuPy and cuDF.  Both libraries read them once, when CUDA starts, so they must be set first.
LAUNCH_ENV = {"CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": "1", "CUDF_PER_THREAD_STREAM": "1"}


def set_launch_env(environ: Any = None) -> dict[str, str]:
    """Set :data:`LAUNCH_ENV` in ``environ`` (``os.environ``) where not set; return what was set.

    The demo calls this before it imports any GPU library (``import gpunets`` imports none), so
    no re-exec is needed; a value the user set is kept (their choice wins).
    """
    env = os.environ if environ is None else environ
    done = {}
    for k, v in LAUNCH_ENV.items():
        if k not in env:
            env[k] = v
            done[k] = v
    return done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpunets", description="gpunets command line")
    parser.add_argument("--version", action="version", version=f"gpunets {__version__}")
    sub = parser.add_subparsers(dest="command")
    d = sub.add_parser("demo", help="fit a real network in every CPU/GPU mode present and compare")
    d.add_argument("--rows", type=int, default=12_000, help="training rows (default 12000)")
    d.add_argument("--device", default=None, help="only this device: cpu, cuda, cuda:N (default: every one present)")
    d.add_argument("--executor", default=None, help="only this executor: serial, threads, streams, dask")
    d.add_argument("--out", default="demo-output", help="folder for the timeline PNG and trace (default demo-output)")
    d.add_argument("--repeat", type=int, default=3, help="fits per mode, the best is kept (default 3)")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.command != "demo":
        parser.print_help()
        return 2
    set_launch_env()   # before CUDA starts: the demo imports CuPy/cuDF only later
    try:
        demo(rows=args.rows, device=args.device, executor=args.executor, out_dir=args.out,
             progress=not args.no_progress, repeat=args.repeat)
    except DemoError as e:
        print(f"gpunets demo: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

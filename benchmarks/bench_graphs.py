"""Graph mode (issue 37 items 1, 4): replayed CUDA graphs against eager calls, on a GPU.

1. The mid-size workload of the executors' GPU section (8 branches of ~500 CuPy kernels on 2,048 x 24 float32
   values, then their mean), called again with the same shapes: ``graphs=True`` (replay) against the eager
   serial call; target >= 8x.
2. The same 8 branches captured as 8 graphs (raw CuPy, one private pool): each on its own stream against all 8
   replayed on one stream; target >= 1.5x (only replayed graphs overlap small kernels: Python cannot issue
   them fast enough, docs/devices.md).
3. A fitted network's call on 1,000 rows (StandardScaler -> 4 branches of elementwise features -> hstack ->
   Ridge), the latency a service sees: graph mode against eager; target <= 0.25x (Ridge.predict's GEMM cannot be
   captured, cupy#6290: it runs eagerly between replays).

Each figure is a ratio within one run (a warm-up each, then the best of ``repeats``, interleaved); results must
equal eager mode's bit for bit.  On the fake GPU (``GPUNETS_FAKE_GPU=1``) the sizes are small and no target is
claimed: the times say nothing about a GPU.

Run: ``python benchmarks/bench_graphs.py [--quick] [--out benchmarks/results/graphs.json]``.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gpunets as gn  # noqa: E402
from benchmarks._runner import bench_main  # noqa: E402 - after the path set-up
from benchmarks.bench_executors import FAKE_NOTE, _branches, gpu_cupy, midsize_work  # noqa: E402

REPLAY_TARGET = 8.0      # replay >= 8x the eager serial call
STREAMS_TARGET = 1.5     # 8 graphs on 8 streams >= 1.5x one stream
PREDICT_TARGET = 0.25    # graph mode's call <= 0.25x the eager call's time


def _best(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Best of ``repeats`` seconds of each function, interleaved (noise hits all alike)."""
    out: dict[str, float] = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            dt = time.perf_counter() - t
            out[name] = min(out.get(name, dt), dt)
    return out


def _entry(value: float, target: str, met: bool, fake: bool) -> dict[str, Any]:
    return {"value": value, "note": FAKE_NOTE} if fake else {"value": value, "target": target, "met": met}


def replay_vs_eager(cp: Any, fake: bool, quick: bool, repeats: int) -> dict[str, Any]:
    rows, cols = (256, 8) if fake else (2_048, 24)
    steps = 4 if fake else (25 if quick else 100)
    X = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    out = _branches(cp, midsize_work, X, 8, steps=steps)
    serial = gn.SerialExecutor()

    def eager() -> Any:
        v = out(executor=serial, output="device")
        cp.cuda.Device().synchronize()
        return v

    def replay() -> Any:
        v = out(executor=serial, output="device", graphs=True)
        cp.cuda.Device().synchronize()
        return v

    want = cp.asnumpy(eager())
    for _ in range(3):   # the trial call, the capture, a first replay
        got = cp.asnumpy(replay())
    ev = gn.evaluate(out, executor=serial, output="device", graphs=True, trace=True)
    seconds = _best({"eager_serial": eager, "replay": replay}, repeats)
    ratio = seconds["eager_serial"] / seconds["replay"]
    return {"branches": 8, "shape": [rows, cols], "steps": steps, "kernels_per_branch": 5 * steps + 3,
            "seconds": seconds, "bitwise_equal": bool(np.array_equal(got, want)),
            "report": ev.trace.graphs.lines(),
            "speedup_replay": _entry(ratio, f">= {REPLAY_TARGET} (replay against the eager serial call)",
                                     ratio >= REPLAY_TARGET, fake)}


def streams_of_graphs(cp: Any, fake: bool, quick: bool, repeats: int) -> dict[str, Any]:
    rows, cols = (256, 8) if fake else (2_048, 24)
    steps = 4 if fake else (25 if quick else 100)
    X = cp.asarray(np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32))
    pool = cp.cuda.MemoryPool()
    capture = cp.cuda.Stream(non_blocking=True)
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(8)]
    capture.wait_event(cp.cuda.get_current_stream().record())
    graphs, outs = [], []
    with cp.cuda.using_allocator(pool.malloc), capture:
        for k in range(8):
            capture.begin_capture()
            outs.append(midsize_work(cp, X, k, steps))
            graphs.append(capture.end_capture())
    start = cp.cuda.Event(disable_timing=True)

    def one_stream() -> None:
        for g in graphs:
            g.launch(capture)
        capture.synchronize()

    def own_streams() -> None:
        capture.record(start)
        for g, s in zip(graphs, streams, strict=True):
            s.wait_event(start)
            g.launch(s)
        for s in streams:
            s.synchronize()

    one_stream()
    want = [cp.asnumpy(o, stream=capture) for o in outs]
    own_streams()
    got = [cp.asnumpy(o, stream=capture) for o in outs]
    seconds = _best({"one_stream": one_stream, "own_streams": own_streams}, repeats)
    ratio = seconds["one_stream"] / seconds["own_streams"]
    return {"graphs": 8, "steps": steps, "seconds": seconds, "pool_bytes": int(pool.total_bytes()),
            "bitwise_equal": all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)),
            "speedup_streams": _entry(ratio, f">= {STREAMS_TARGET} (8 graphs on 8 streams against one stream)",
                                      ratio >= STREAMS_TARGET, fake)}


def features(x: Any, k: int) -> Any:
    """A branch of elementwise features (about ten kernels), written with operators only: runs anywhere."""
    ns = x.__array_namespace__()
    y = x * (0.5 + 0.1 * k)
    for _ in range(3):
        y = ns.tanh(y) * 1.5 + 0.01 * k
    return y * y


def predict_latency(cp: Any, fake: bool, quick: bool, repeats: int) -> dict[str, Any]:
    from sklearn.linear_model import Ridge
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(2)
    n_train, cols = (400, 8) if fake else (20_000, 20)
    X, Xn = rng.standard_normal((n_train, cols)), rng.standard_normal((1_000, cols))
    y = X @ rng.standard_normal(cols)
    with gn.device("cuda"):
        Xs, ys = gn.source(cp.asarray(X), name="X"), gn.source(cp.asarray(y), name="y")
        W = gn.machine(StandardScaler(), Xs).transform(Xs)
        Z = gn.hstack(W, *[gn.node(functools.partial(features, k=k), W, name=f"features{k}") for k in range(4)])
        yhat = gn.machine(Ridge(solver="svd"), Z, ys).predict(Z)
    yhat.fit()
    Xd = cp.asarray(Xn)
    serial = gn.SerialExecutor()

    def eager() -> Any:
        v = yhat(Xd, executor=serial, output="device")
        cp.cuda.Device().synchronize()
        return v

    def graph() -> Any:
        v = yhat(Xd, executor=serial, output="device", graphs=True)
        cp.cuda.Device().synchronize()
        return v

    want = cp.asnumpy(eager())
    for _ in range(3):
        got = cp.asnumpy(graph())
    ev = gn.evaluate(yhat, Xd, executor=serial, output="device", graphs=True, trace=True)
    seconds = _best({"eager": eager, "graphs": graph}, repeats)
    ratio = seconds["graphs"] / seconds["eager"]
    return {"rows": 1_000, "columns": cols, "seconds": seconds, "bitwise_equal": bool(np.array_equal(got, want)),
            "report": ev.trace.graphs.lines(),
            "ratio_graphs_vs_eager": _entry(ratio, f"<= {PREDICT_TARGET} (graph mode's call against eager)",
                                            ratio <= PREDICT_TARGET, fake)}


def graphs_section(quick: bool = False) -> dict[str, Any]:
    """The three figures (see the module); on the fake GPU at small sizes, claiming no target."""
    cp, why = gpu_cupy()
    if cp is None:
        return {"skipped": why}
    from gpunets.devices import _gpulibs
    from gpunets.executors import graphs

    fake = bool(_gpulibs.fake_gpu_count())
    repeats = 3 if (fake or quick) else 7
    res: dict[str, Any] = {"fake_gpu": fake,
                           "device": "fake GPU" if fake else cp.cuda.runtime.getDeviceProperties(0)["name"].decode()}
    if fake:
        res["note"] = FAKE_NOTE
    try:
        res["replay"] = replay_vs_eager(cp, fake, quick, repeats)
        res["streams"] = streams_of_graphs(cp, fake, quick, repeats)
        res["predict"] = predict_latency(cp, fake, quick, repeats)
    finally:
        graphs.clear()
    unequal = [k for k in ("replay", "streams", "predict") if not res[k]["bitwise_equal"]]
    if unequal:
        res["error"] = f"graph mode's results differ from eager mode's in {unequal}"
    return res


def summary(r: dict[str, Any]) -> str:
    """One line with the three figures and their verdicts (``gpu_check.sh``'s summary)."""
    def fig(entry: dict[str, Any], what: str) -> str:
        v = entry.get("value")
        text = f"{what} {v:.2f}x" if isinstance(v, (int, float)) else f"{what} ?"
        if "target" in entry:
            text += f" (target {str(entry['target']).split(' (')[0]}: {'met' if entry.get('met') else 'NOT met'})"
        return text
    parts = [fig(r.get("replay", {}).get("speedup_replay", {}), "replay/eager"),
             fig(r.get("streams", {}).get("speedup_streams", {}), "8 streams/1 stream"),
             fig(r.get("predict", {}).get("ratio_graphs_vs_eager", {}), "predict graphs/eager")]
    return ", ".join(parts) + (" [fake GPU: harness check only]" if r.get("fake_gpu") else "")


def run(quick: bool = False) -> dict[str, Any]:
    return {"benchmark": "graphs", "quick": quick, "graphs": graphs_section(quick)}


if __name__ == "__main__":
    raise SystemExit(bench_main(run, __doc__, name="graphs"))

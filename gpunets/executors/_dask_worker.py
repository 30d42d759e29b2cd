"""What runs on the Dask workers: a task, on the worker's GPU when it has one; a fit's kept state and summary.

The functions here are module-level so that they pickle by reference.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from gpunets.devices import _gpulibs
from gpunets.executors.base import task_context

__all__ = ["gpu_owners", "pop_gpu_spans"]


def _run_remote(run_id: str, key: int, payload: Any, *args: Any) -> Any:
    """Run one task on a worker: unpickle its function and call it (Dask's task stream times it)."""
    import cloudpickle

    fn = cloudpickle.loads(payload) if isinstance(payload, bytes) else payload
    try:
        return task_context().run(fn, *args)  # a nested network sees it runs inside a task
    except Exception as e:
        try:
            e._gn_dask_task = key  # type: ignore[attr-defined]  # the client names this task, not a dependent
        except Exception:  # noqa: BLE001, S110 - an exception that takes no attributes
            pass
        raise


def _state_of(fitted: tuple[Any, ...]) -> tuple[Any, dict[str, Any]]:
    """A fit task's value reduced to what evaluations need: ``(estimator, {"path": ...})`` (kept on the worker)."""
    est, info = fitted[0], fitted[1]
    return est, {"path": info.get("path", "sklearn")}


def _summary_of(fitted: tuple[Any, ...], names: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the client gets back from a fit that stays on the worker: its info and a few small attributes."""
    est, info = fitted[0], fitted[1]
    return info, {n: getattr(est, n) for n in names if hasattr(est, n)}


# (run id, task key) -> (wall-clock start of the task's GPU work, its GPU seconds): the
# GPU spans of timed tasks, kept on the worker until the client collects its run's (:func:`pop_gpu_spans`)
_GPU_SPANS: dict[tuple[str, int], tuple[float, float]] = {}
_SPANS_LOCK = threading.Lock()
_MAX_SPANS = 100_000


def pop_gpu_spans(run_id: str) -> dict[int, tuple[float, float]]:
    """This worker's GPU spans of run ``run_id`` (task key -> (wall start, GPU seconds)), forgotten once read
    (called on every worker by ``client.run`` when the client collects the run's trace)."""
    with _SPANS_LOCK:
        mine = [k for k in _GPU_SPANS if k[0] == run_id]
        return {k[1]: _GPU_SPANS.pop(k) for k in mine}


def _run_on_gpu(local_index: int, run_id: str, key: int, payload: Any, *args: Any, timed: bool = False) -> Any:
    """Run a task with GPU ``local_index`` (this process's ordinal) current, when CuPy is present.

    ``timed``: bracket its work with two CUDA timing events on its stream and keep its GPU span here
    (:func:`pop_gpu_spans`), as the streams executor does on one machine; the stream is synchronized after the
    task anyway, so the timing costs no extra wait.
    """
    try:
        cupy = _gpulibs.cupy()   # real CuPy or the fake GPU

        usable = bool(cupy.cuda.is_available())
    except Exception:  # noqa: BLE001 - no CuPy, or no driver: run as on a CPU worker
        usable = False
    if not usable:
        return _run_remote(run_id, key, payload, *args)
    # A worker may run tasks on several threads and hands values between threads and processes with no
    # CUDA event: issue the task on this thread's per-thread default stream (where cuML runs; never the
    # legacy one) and synchronize it before the value leaves the task, also on failure, so the inputs
    # are not freed (and their memory reused) while its kernels still read them.
    with cupy.cuda.Device(local_index):
        stream = cupy.cuda.Stream.ptds
        with stream:
            start = end = None
            recorded = False
            if timed:
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                wall = time.time()
                start.record(stream)
            try:
                out = _run_remote(run_id, key, payload, *args)
                if end is not None:
                    end.record(stream)
                    recorded = True
                return out
            finally:
                stream.synchronize()
                if recorded:   # the task finished: its end event is on the stream, complete after the sync
                    seconds = cupy.cuda.get_elapsed_time(start, end) / 1e3   # type: ignore[arg-type]
                    with _SPANS_LOCK:
                        if len(_GPU_SPANS) >= _MAX_SPANS:   # runs whose client never collected: drop the oldest
                            del _GPU_SPANS[next(iter(_GPU_SPANS))]
                        _GPU_SPANS[(run_id, key)] = (wall, seconds)


def _visible_devices() -> str | None:
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def gpu_owners(client: Any) -> dict[int, list[str]]:
    """Which workers own which GPU: ``{physical GPU index: [worker addresses]}``.

    A worker owns the first GPU in its ``CUDA_VISIBLE_DEVICES`` (dask-cuda's
    ``LocalCUDACluster`` starts one worker per GPU with its own GPU listed
    first).  Workers without ``CUDA_VISIBLE_DEVICES`` own no GPU in particular.

    Parameters
    ----------
    client : distributed.Client
        A connected client.

    Returns
    -------
    dict
        Physical GPU index to the addresses of the workers that own it.
    """
    return _owners(client.run(_visible_devices, on_error="ignore"))


def _owners(seen: dict[str, Any]) -> dict[int, list[str]]:
    """``{GPU: [workers]}`` from each worker's ``CUDA_VISIBLE_DEVICES`` (its first GPU is the one it owns)."""
    owners: dict[int, list[str]] = {}
    for addr, cvd in sorted(seen.items()):
        if not cvd:
            continue
        first = cvd.split(",")[0].strip()
        if first.isdigit():
            owners.setdefault(int(first), []).append(addr)
    return owners

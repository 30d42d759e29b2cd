"""What runs on the Dask workers: a task, timed, on the worker's GPU when it has one.

The functions here are module-level so that they pickle by reference; the timings of the tasks that ran in a
worker process stay in that process until the client collects them (:func:`_pop_timings`) for the trace.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from typing import Any

from .. import _gpulibs
from .base import task_context

__all__ = ["gpu_owners"]

# Worker side: timings of the tasks that ran in this process, by run id (bounded).
_TIMINGS: "OrderedDict[str, list[tuple[int, float, float, str, bool]]]" = OrderedDict()
_TIMINGS_LOCK = threading.Lock()
_MAX_RUNS_KEPT = 256


def _run_remote(run_id: str, key: int, payload: Any, *args: Any) -> Any:
    """Run one task on a worker: unpickle its function, time it, record the timing."""
    import cloudpickle

    fn = cloudpickle.loads(payload) if isinstance(payload, bytes) else payload
    start = time.time()
    failed = True
    try:
        value = task_context().run(fn, *args)  # a nested network sees it runs inside a task
        failed = False
        return value
    except Exception as e:
        try:
            e._gn_dask_task = key  # type: ignore[attr-defined]  # the client names this task, not a dependent
        except Exception:  # noqa: BLE001, S110 - an exception that takes no attributes
            pass
        raise
    finally:
        end = time.time()
        with _TIMINGS_LOCK:
            recs = _TIMINGS.get(run_id)
            if recs is None:
                recs = _TIMINGS[run_id] = []
                while len(_TIMINGS) > _MAX_RUNS_KEPT:
                    _TIMINGS.popitem(last=False)
            recs.append((key, start, end, threading.current_thread().name, failed))


def _state_of(fitted: tuple[Any, ...]) -> tuple[Any, dict[str, Any]]:
    """A fit task's value reduced to what evaluations need: ``(estimator, {"path": ...})`` (kept on the worker)."""
    est, info = fitted[0], fitted[1]
    return est, {"path": info.get("path", "sklearn")}


def _summary_of(fitted: tuple[Any, ...], names: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the client gets back from a fit that stays on the worker: its info and a few small attributes."""
    est, info = fitted[0], fitted[1]
    return info, {n: getattr(est, n) for n in names if hasattr(est, n)}


def _run_on_gpu(local_index: int, run_id: str, key: int, payload: Any, *args: Any) -> Any:
    """Run a task with GPU ``local_index`` (this process's ordinal) current, when CuPy is present."""
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
            try:
                return _run_remote(run_id, key, payload, *args)
            finally:
                stream.synchronize()


def _pop_timings(run_id: str) -> list[tuple[int, float, float, str, bool]]:
    with _TIMINGS_LOCK:
        return _TIMINGS.pop(run_id, [])


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
    seen = client.run(_visible_devices, on_error="ignore")
    owners: dict[int, list[str]] = {}
    for addr, cvd in sorted(seen.items()):
        if not cvd:
            continue
        first = cvd.split(",")[0].strip()
        if first.isdigit():
            owners.setdefault(int(first), []).append(addr)
    return owners

"""A pool of worker threads taking ready tasks from the one scheduler.

Native thread pools (BLAS, OpenMP) are capped for the run with threadpoolctl,
to ``cores // workers`` threads each, so concurrent tasks do not oversubscribe
the cores.  The threads are persistent workers of :mod:`gpunets.executors.pool`,
borrowed for the run and given back when it ends: consecutive runs reuse them,
and a nested network inside a task borrows other, idle ones (made if needed),
so nesting cannot deadlock.  Ctrl-C stops new tasks, lets running ones finish
and waits for every borrowed worker before re-raising.

A plan with a task on a GPU runs on the streams executor's CUDA backend
(:func:`gpunets.executors.streams.run_on_cuda`): a device and a stream per
lane, events on the edges between threads, values kept alive until their
readers' events complete.  Its trace says so (``threads (on CUDA streams)``).
"""

from __future__ import annotations

import sys
import threading
from functools import partial
from typing import Any

from gpunets.executors import pool
from gpunets.executors._args import check_flag, check_seconds
from gpunets.executors.base import Executor, default_workers, task_context
from gpunets.executors.scheduler import Run
from gpunets.executors.streams import run_on_cuda, wants_cuda

__all__ = ["ThreadsExecutor", "limit_native_threads"]


class _NoLimit:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


_CONTROLLER: list[Any] = [None, -1]   # a cached threadpoolctl controller and len(sys.modules) when made
_NATIVE_LOCK = threading.Lock()


def _controller() -> Any:
    """A threadpoolctl controller, cached and rebuilt only after new modules were imported."""
    from threadpoolctl import ThreadpoolController

    with _NATIVE_LOCK:
        if _CONTROLLER[0] is None or _CONTROLLER[1] != len(sys.modules):
            _CONTROLLER[0] = ThreadpoolController()
            _CONTROLLER[1] = len(sys.modules)
        return _CONTROLLER[0]


class _SharedLimit:
    """A process-wide limit held by every run inside it: the first to enter limits, the last to leave restores.

    BLAS thread pools are process-wide, so runs that overlap in time (two
    threads each running a network) share one limit: a run entering while
    another holds it lowers the cap if it needs a lower one, never raises it,
    and only the last run to leave restores the limits found by the first.
    """

    _held: dict[str | None, list[Any]] = {}   # user_api -> [count, limiter of the first entrant, cap]

    def __init__(self, n: int, user_api: str | None) -> None:
        self.n, self.user_api = n, user_api

    def __enter__(self) -> None:
        with _NATIVE_LOCK:
            held = self._held.get(self.user_api)
            if held is None:
                self._held[self.user_api] = [1, None, self.n]
            else:
                held[0] += 1
        ctl = _controller()
        with _NATIVE_LOCK:
            held = self._held[self.user_api]
            if held[1] is None:
                held[1] = _lower(ctl.select(user_api=self.user_api), self.n)
            elif self.n < held[2]:
                held[2] = self.n
                _lower(ctl.select(user_api=self.user_api), self.n)   # lower only; the first limiter restores
        return None

    def __exit__(self, *a: object) -> None:
        with _NATIVE_LOCK:
            held = self._held[self.user_api]
            held[0] -= 1
            if held[0] == 0:
                del self._held[self.user_api]
                if held[1] is not None:
                    held[1].restore_original_limits()


def _lower(ctl: Any, n: int) -> Any:
    """Limit each library of ``ctl`` to ``n`` threads, or to its own count where that is lower (a pool the user
    set to 4 threads, with ``OPENBLAS_NUM_THREADS=4``, stays at 4 on 16 cores): a cap never raises a pool."""
    limits: dict[str, int] = {}
    for lib in ctl.lib_controllers:
        limits[lib.prefix] = max(1, min(n, lib.num_threads, limits.get(lib.prefix, n)))
    return ctl.limit(limits=limits or n)


def limit_native_threads(n: int, user_api: str | None = None) -> Any:
    """A threadpoolctl limit of ``n`` native threads (a no-op if threadpoolctl is missing).

    ``user_api="blas"`` pools are process-wide: the limit is shared by the runs
    that overlap in time and restored by the last one to end (see
    :class:`_SharedLimit`).  Other pools (OpenMP) are limited per thread.
    Finding the native libraries is the slow part of threadpoolctl
    (milliseconds), so the controller is cached and rebuilt only after new
    modules were imported.
    """
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        return _NoLimit()
    if user_api == "blas":
        return _SharedLimit(n, user_api)
    ctl = _controller()   # a limiter restores every library it holds: hold only those of user_api
    return _lower(ctl if user_api is None else ctl.select(user_api=user_api), n)


class ThreadsExecutor(Executor):
    """Run ready tasks on ``workers`` threads (default: the cores).

    ``serial_below`` (seconds, default None): run the tasks in the calling thread, one after another, while
    they take less than that (CPU time of the thread: a busy machine does not lengthen them); once the last two,
    or three of the last eight, took longer, the worker threads run the rest of the run.  Short Python tasks (scikit-learn's fits and scores of small arrays) hold the GIL: a second
    thread cannot overlap them and only adds hand-overs of the GIL (the searches use it, see
    :data:`gpunets.tuning.search.SERIAL_TASK_SECONDS`).

    >>> import numpy as np, gpunets as gn
    >>> X = gn.source(np.ones(2), name="X")
    >>> gn.mean(X + 1, X * 3)(executor=ThreadsExecutor(workers=2)).tolist()
    [2.5, 2.5]
    >>> gn.mean(X + 1, X * 3)(executor=ThreadsExecutor(workers=2, serial_below=0.01)).tolist()
    [2.5, 2.5]
    """

    name = "threads"

    def __init__(self, workers: int | None = None, limit_native: bool = True,
                 serial_below: float | None = None) -> None:
        check_flag("limit_native", limit_native, "ThreadsExecutor")
        check_seconds("serial_below", serial_below, "ThreadsExecutor", "always on the worker threads")
        super().__init__(workers)
        self.limit_native = limit_native
        self.serial_below = serial_below

    def run(self, plan: Any, on_task_done: Any = None) -> Run:
        if wants_cuda(plan):
            return run_on_cuda(plan, self.workers, f"{self.name} (on CUDA streams)", on_task_done)
        run = Run(plan, executor_name=self.name, on_task_done=on_task_done)
        n_tasks = sum(1 for t in plan.tasks if t.kind != "source")
        n = max(1, min(self.workers, n_tasks))
        per_task = max(1, default_workers() // n)
        limit = limit_native_threads(per_task, "blas") if self.limit_native else _NoLimit()
        jobs = []
        with limit:
            try:
                if self.serial_below is not None and n > 1:   # short tasks first run here, one by one
                    task_context().run(run.work_short, 0, self.serial_below)
                    if run.finished:
                        return run
                for i in range(n):
                    ctx = task_context()
                    jobs.append(pool.checkout(("cpu", i)).submit(partial(ctx.run, self._work, run, i, per_task)))
                run.wait()
            except BaseException as e:  # KeyboardInterrupt: stop cleanly, leave no work behind
                run.abort(e)
                raise
            finally:
                for j in jobs:
                    j.join()
        return run

    def _work(self, run: Run, lane: int, per_task: int) -> None:
        limit = limit_native_threads(per_task, "openmp") if self.limit_native else _NoLimit()
        with limit:
            run.work(lane, block=True)

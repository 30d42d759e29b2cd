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
from typing import Any

from ..scheduler import Run
from . import pool
from .base import Executor, default_workers, task_context
from .streams import run_on_cuda, wants_cuda

__all__ = ["ThreadsExecutor", "limit_native_threads"]


class _NoLimit:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


_CONTROLLER: list[Any] = [None, -1]   # a cached threadpoolctl controller and len(sys.modules) when made


def limit_native_threads(n: int, user_api: str | None = None) -> Any:
    """A threadpoolctl limit of ``n`` native threads (a no-op if threadpoolctl is missing).

    Finding the native libraries is the slow part of threadpoolctl (milliseconds),
    so the controller is cached and rebuilt only after new modules were imported.
    """
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        return _NoLimit()
    if _CONTROLLER[0] is None or _CONTROLLER[1] != len(sys.modules):
        _CONTROLLER[0] = ThreadpoolController()
        _CONTROLLER[1] = len(sys.modules)
    return _CONTROLLER[0].limit(limits=n, user_api=user_api)


class ThreadsExecutor(Executor):
    """Run ready tasks on ``workers`` threads (default: the cores).

    >>> import numpy as np, gpunets as gn
    >>> X = gn.source(np.ones(2), name="X")
    >>> gn.mean(X + 1, X * 3)(executor=ThreadsExecutor(workers=2)).tolist()
    [2.5, 2.5]
    """

    name = "threads"

    def __init__(self, workers: int | None = None, limit_native: bool = True) -> None:
        super().__init__(workers)
        self.limit_native = limit_native

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
                for i in range(n):
                    ctx = task_context()
                    jobs.append(pool.checkout(("cpu", i)).submit(
                        lambda ctx=ctx, i=i: ctx.run(self._work, run, i, per_task)))
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

"""The reference executor: every task in the calling thread, in plan order.

A plan with a task on a GPU runs on the streams executor's CUDA backend with one
lane per device (:func:`gpunets.executors.streams.run_on_cuda`): a GPU task needs
its device current, a stream and events between devices, which a plain loop in
the calling thread does not give.  Its trace says so (``serial (on CUDA streams)``).
"""

from __future__ import annotations

from typing import Any

from gpunets.executors.base import Executor, task_context
from gpunets.executors.scheduler import Run
from gpunets.executors.streams import run_on_cuda, wants_cuda

__all__ = ["SerialExecutor"]


class SerialExecutor(Executor):
    """Run tasks one after another in the calling thread.

    >>> import numpy as np, gpunets as gn
    >>> X = gn.source(np.ones(2), name="X")
    >>> (X + 1)(executor=SerialExecutor()).tolist()
    [2.0, 2.0]
    """

    name = "serial"

    def __init__(self, workers: int | None = None) -> None:
        super().__init__(workers)   # checked, then ignored: one thread
        self.workers = 1

    def run(self, plan: Any, on_task_done: Any = None) -> Run:
        if wants_cuda(plan):
            return run_on_cuda(plan, 1, f"{self.name} (on CUDA streams)", on_task_done)
        run = Run(plan, executor_name=self.name, on_task_done=on_task_done)
        ctx = task_context()
        ctx.run(self._loop, run)
        return run

    @staticmethod
    def _loop(run: Run) -> None:
        run.work(0)

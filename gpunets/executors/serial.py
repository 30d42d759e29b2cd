"""The reference executor: every task in the calling thread, in plan order."""

from __future__ import annotations

from typing import Any

from ..scheduler import Run
from .base import Executor, task_context

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
        run = Run(plan, executor_name=self.name, on_task_done=on_task_done)
        ctx = task_context()
        ctx.run(self._loop, run)
        return run

    @staticmethod
    def _loop(run: Run) -> None:
        run.work(0)

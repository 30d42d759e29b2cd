"""The executor interface: ``run(plan) -> Run``."""

from __future__ import annotations

import contextvars
import copy
import inspect
import os
from typing import Any

__all__ = ["Executor", "inside_task", "task_context", "default_workers", "gpu_timing", "gpu_timing_requested"]

_IN_TASK: contextvars.ContextVar[int] = contextvars.ContextVar("gpunets_in_task", default=0)
_GPU_TIMING: contextvars.ContextVar[bool] = contextvars.ContextVar("gpunets_gpu_timing", default=False)


class gpu_timing:
    """Ask the runs started inside this block to time their GPU tasks with CUDA events (``trace=True``)."""

    def __init__(self, on: bool = True) -> None:
        self.on = bool(on)

    def __enter__(self) -> None:
        self._token = _GPU_TIMING.set(self.on)

    def __exit__(self, *a: object) -> None:
        _GPU_TIMING.reset(self._token)


def gpu_timing_requested() -> bool:
    """True inside a :class:`gpu_timing` block (e.g. ``gn.evaluate(..., trace=True)``)."""
    return _GPU_TIMING.get()


def inside_task() -> bool:
    """True while running inside a task of a gpunets run (a nested network)."""
    return _IN_TASK.get() > 0


def task_context() -> contextvars.Context:
    """A copy of the caller's context, marked as being inside a task, for worker threads."""
    ctx = contextvars.copy_context()
    ctx.run(_IN_TASK.set, _IN_TASK.get() + 1)
    return ctx


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class Executor:
    """Runs every task of a plan; subclasses choose where.

    Subclasses implement :meth:`run`, which creates a
    :class:`gpunets.executors.scheduler.Run`, drives it to its end and returns it.

    An executor is a parameter of composites and stacks, so it copies and
    pickles as what it was made from: ``copy.deepcopy`` (and so
    ``sklearn.base.clone``) and ``pickle`` rebuild it from its constructor
    arguments, never copying the locks, threads or connections of its runs.
    """

    name = "executor"
    _init_args: tuple[tuple[Any, ...], dict[str, Any]]   # set by __new__ (an annotation: no class attribute)

    def __new__(cls, *args: Any, **kwargs: Any) -> Executor:
        self = super().__new__(cls)
        self._init_args = (args, kwargs)   # what it was made from: copies and pickles rebuild from it
        return self

    def _constructor_args(self, for_pickle: bool) -> dict[str, Any]:
        """The constructor arguments by name (subclasses turn live resources into what rebuilds them)."""
        args, kwargs = getattr(self, "_init_args", ((), {}))
        bound = inspect.signature(type(self).__init__).bind(None, *args, **kwargs)
        named = dict(bound.arguments)
        named.pop(next(iter(named)))   # self
        return named

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self._constructor_args(for_pickle=True)))

    def __deepcopy__(self, memo: dict[int, Any]) -> Executor:
        named = self._constructor_args(for_pickle=False)
        shared = self._shared_args()
        copied = {k: (v if k in shared else copy.deepcopy(v, memo)) for k, v in named.items()}
        return type(self)(**copied)

    def _shared_args(self) -> tuple[str, ...]:
        """Constructor arguments a copy shares instead of copying (e.g. a Dask client)."""
        return ()

    def __init__(self, workers: int | None = None) -> None:
        if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
            msg = f"workers={workers!r} must be a positive integer or None (the number of cores)."
            raise ValueError(msg)
        self.workers = workers or default_workers()

    def run(self, plan: Any, on_task_done: Any = None) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(workers={self.workers})"


def _rebuild(cls: type, named: dict[str, Any]) -> Executor:
    """Unpickle an executor: make it again from its constructor arguments."""
    return cls(**named)

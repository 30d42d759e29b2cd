"""Executors: where the tasks of a plan run.  One dispatch point: :func:`get_executor`.

>>> from gpunets.executors import get_executor
>>> get_executor("serial").name, get_executor("threads", workers=2).workers
('serial', 2)
"""

from __future__ import annotations

from typing import Any

from .base import Executor, inside_task
from .serial import SerialExecutor
from .streams import StreamsExecutor
from .threads import ThreadsExecutor

__all__ = ["Executor", "SerialExecutor", "ThreadsExecutor", "StreamsExecutor", "get_executor", "check_executor_spec", "choose_auto",
           "EXECUTOR_NAMES"]

EXECUTOR_NAMES = ("auto", "serial", "threads", "streams", "dask")


def _is_executor_object(spec: Any) -> bool:
    return isinstance(spec, Executor) or (hasattr(spec, "run") and hasattr(spec, "name"))


def check_executor_spec(spec: Any) -> Any:
    """Return ``spec`` if it names an executor or is one; else raise a ``ValueError`` listing the choices."""
    if _is_executor_object(spec) or (isinstance(spec, str) and spec in EXECUTOR_NAMES):
        return spec
    msg = (f"executor={spec!r} is not an executor. Use one of {list(EXECUTOR_NAMES)} "
           "or an executor object such as gn.ThreadsExecutor(workers=2).")
    raise ValueError(msg)


def get_executor(spec: Any = None, workers: int | None = None, plan: Any = None) -> Executor:
    """Turn ``"serial"``, ``"threads"``, ``"streams"``, ``"dask"``, ``"auto"`` or an executor into an executor."""
    from ..config import get_config

    if spec is None or (spec == "auto" and not inside_task()):
        spec = get_config()["executor"]   # "auto": the configured default, else chosen per plan
    if workers is None:
        workers = get_config()["workers"]
    if _is_executor_object(check_executor_spec(spec)):
        return spec
    if spec == "auto":
        spec = choose_auto(plan) if plan is not None else "serial"
    if spec == "serial":
        return SerialExecutor()
    if spec == "threads":
        return ThreadsExecutor(workers=workers)
    if spec == "streams":
        return StreamsExecutor(workers=workers)
    from .dask import DaskExecutor  # imports dask lazily; says what to install if missing

    return DaskExecutor(workers=workers)


def choose_auto(plan: Any) -> str:
    """``auto``: ``streams`` if any task is on a CUDA device, else ``threads`` when the
    plan has at least two independent branches with enough work (two fits, or
    many tasks), else ``serial``.  Inside a task of another run ``auto`` is
    ``serial``: the outer run already uses the cores."""
    if any(str(t.device).startswith("cuda") for t in plan.tasks):
        return "streams"
    if inside_task():
        return "serial"
    n_fit = sum(1 for t in plan.tasks if t.kind == "fit")
    n_run = sum(1 for t in plan.tasks if t.kind != "source")
    if plan.n_lanes >= 2 and (n_fit >= 2 or n_run >= 64):
        return "threads"
    return "serial"

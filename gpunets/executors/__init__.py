"""Executors: where the tasks of a plan run.  One dispatch point: :func:`get_executor`.

>>> from gpunets.executors import get_executor
>>> get_executor("serial").name, get_executor("threads", workers=2).workers
('serial', 2)
"""

from __future__ import annotations

from typing import Any

from gpunets.base.config import get_config
from gpunets.executors.base import Executor, inside_task
from gpunets.executors.gpu_auto import choose_one_gpu
from gpunets.executors.serial import SerialExecutor
from gpunets.executors.streams import StreamsExecutor
from gpunets.executors.threads import ThreadsExecutor

__all__ = ["Executor", "SerialExecutor", "ThreadsExecutor", "StreamsExecutor", "get_executor", "check_executor_spec", "choose_auto",
           "explain_auto", "task_seconds", "EXECUTOR_NAMES", "MIN_PARALLEL_SECONDS"]

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

    given = spec is not None and not (spec == "auto" and not inside_task())
    if spec is None or (spec == "auto" and not inside_task()):
        spec = get_config()["executor"]   # "auto": the configured default, else chosen per plan
    if workers is None:
        workers = get_config()["workers"]
    asked = "executor=" if given else "the configured executor "
    if _is_executor_object(check_executor_spec(spec)):
        _explain(plan, f"{asked}{spec!r}")
        return spec
    if spec == "auto":
        spec, why = explain_auto(plan) if plan is not None else ("serial", "no plan to judge")
        _explain(plan, f"auto: {why}")
    else:
        _explain(plan, f"{asked}{spec!r}")
    if spec == "serial":
        return SerialExecutor()
    if spec == "threads":
        return ThreadsExecutor(workers=workers)
    if spec == "streams":
        return StreamsExecutor(workers=workers)
    from gpunets.executors.dask import DaskExecutor  # lazy: imports dask; says what to install if missing

    return DaskExecutor(workers=workers)


def _explain(plan: Any, reason: str) -> None:
    if plan is not None:
        plan.executor_reason = reason


# A task shorter than this gains nothing on another thread: handing it over costs tens of µs, and short
# Python tasks hold the GIL (measured on 2 cores: threads 1.6-2.9x slower than serial on trivial tasks).
MIN_PARALLEL_SECONDS = 1e-3


def task_seconds(task: Any) -> float:
    """The measured or estimated duration of ``task``, in seconds.

    A fit: its machine's last fit time, or :data:`MIN_PARALLEL_SECONDS` for a machine
    never trained (unknown: assumed worth a thread).  An operation: the shorter of its
    durations in the last two runs that computed it (see
    :func:`gpunets.api.network.remember_costs`), else 0 (assumed trivial).  A move: 0.
    """
    if task.kind == "fit":
        st = task.machine._state if task.machine is not None else None
        return st.seconds if st is not None and st.seconds > 0 else MIN_PARALLEL_SECONDS
    if task.kind == "eval":
        seen = getattr(task.node, "_cost", None)
        return min(seen) if seen is not None else 0.0
    return 0.0


def explain_auto(plan: Any) -> tuple[str, str]:
    """``auto``'s choice for ``plan`` and why.

    On GPUs: ``streams`` when the tasks span two GPUs or more (a lane per GPU keeps each busy).  On one GPU
    (:func:`gpunets.executors.gpu_auto.choose_one_gpu`): ``streams`` where earlier runs timed the plan's GPU
    tasks GPU-bound (their GPU time at least half of the run: the host issues faster than the GPU computes,
    so branches on their own streams can overlap) on two branches or more, else ``serial``: where the host
    sets the pace (on an H200, eight lanes of small CuPy steps ran 2.3 times slower than serial before one
    thread issued them; docs/devices.md, "What overlaps on a GPU"), or nothing was timed yet.  Inside a task of another run,
    ``serial``: the outer run already uses the cores.  Else ``threads`` when at
    least two tasks on different lanes (independent branches) are each expected to
    take :data:`MIN_PARALLEL_SECONDS` or more (:func:`task_seconds`: measured in
    earlier runs, or estimated), since only then can concurrency repay the hand-over
    between threads; otherwise ``serial``.

    >>> import numpy as np, gpunets as gn
    >>> from gpunets.planning.plan import compile_call
    >>> X = gn.source(np.ones(3), name="X")
    >>> explain_auto(compile_call([gn.mean(*[X + i for i in range(100)])], {}, max_lanes=2))[0]
    'serial'
    """
    tasks = plan.tasks
    gpus = {str(d) for d in {t.device for t in tasks} if str(d).startswith("cuda")}
    if len(gpus) > 1:
        return "streams", f"the tasks run on {len(gpus)} GPUs ({', '.join(sorted(gpus))}): a lane per GPU"
    if gpus:
        return choose_one_gpu(plan, next(iter(gpus)))
    heavy: list[Any] = []
    n_run, least = 0, MIN_PARALLEL_SECONDS
    for t in tasks:   # one cheap pass: auto must cost next to nothing beside a trivial task
        kind = t.kind
        if kind == "eval":
            n_run += 1
            seen = getattr(t.node, "_cost", None)
            if seen is not None and seen[0] >= least and seen[1] >= least:
                heavy.append(t)
        elif kind != "source":
            n_run += 1
            if task_seconds(t) >= least:
                heavy.append(t)
    if inside_task():
        return "serial", "inside a task of another run, which already uses the cores"
    limit = f"{MIN_PARALLEL_SECONDS * 1e3:g} ms"
    if len(heavy) < 2:
        return "serial", (f"{len(heavy)} of {n_run} tasks expected to take {limit} or more: "
                          "too short for threads to repay their hand-over")
    plan.n_lanes  # noqa: B018 - assigns the lanes (on first use)
    lanes = {t.lane for t in heavy}
    if len(lanes) < 2:
        return "serial", f"the {len(heavy)} tasks of {limit} or more are on one branch (nothing to overlap)"
    return "threads", (f"{len(heavy)} tasks expected to take {limit} or more, "
                       f"on {len(lanes)} independent branches")


def choose_auto(plan: Any) -> str:
    """``auto``'s choice for ``plan``: ``"streams"``, ``"threads"`` or ``"serial"`` (see :func:`explain_auto`)."""
    return explain_auto(plan)[0]

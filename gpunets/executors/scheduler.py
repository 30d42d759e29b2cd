"""The one scheduler: the state of a run and the rules that move tasks through it.

Every executor drives the same :class:`Run`.  A task is *waiting* until all
of its dependencies are *done*, then *ready*; an executor takes ready tasks
(:meth:`Run.next_ready`) and runs them where it likes (:meth:`Run.run_task`),
which records the value, wakes the dependents and appends a trace record.
Executors differ only in where and when they call those two methods:

* ``serial`` calls them in the calling thread;
* ``threads`` from a pool of worker threads;
* ``streams`` from one worker thread per lane, each running its lane's tasks
  in plan order, with events on the edges between lanes;
* ``dask`` lowers the plan to a Dask graph (its scheduler replaces this one,
  and the run's trace is rebuilt from what Dask reports).

State (all in one object, guarded by one lock):

``values[k]``        the value of task ``k`` once done (sources start done);
``missing[k]``       how many dependencies of ``k`` are not done yet;
``holders[k]``       how many consumers of ``k`` have not run yet; the value
                     is dropped when this reaches zero unless ``k`` is an output;
``ready``            keys whose dependencies are all done, not yet taken;
``error``            the first failure; once set no new task starts.

When a task fails, tasks already running finish, nothing new starts, and
:meth:`Run.raise_error` raises the error, naming the task, with the original
exception chained.  Machines trained before the failure keep their new state
(each fit commits its own state only when it succeeds).
"""

from __future__ import annotations

import collections
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from gpunets.base.exceptions import EvaluationError, FitError, GpunetsError, wrap_exception
from gpunets.base.trace import Trace
from gpunets.compute.estimators import sklearn_config
from gpunets.devices.finite import run_config
from gpunets.planning.plan import Plan, Task

__all__ = ["Run", "out_of_memory_detail"]

_SENTINEL = object()


class Run:
    """The state of one run of a plan (see the module docstring)."""

    def __init__(self, plan: Plan, *, executor_name: str = "serial",
                 on_task_done: Callable[[Task], None] | None = None) -> None:
        self.plan = plan
        n = len(plan.tasks)
        self.values: list[Any] = [_SENTINEL] * n
        self.done = [False] * n
        self.missing = [0] * n
        self.holders = [len(c) for c in plan.consumers]
        self.outputs = set(plan.outputs)
        self.ready: collections.deque[int] = collections.deque()
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.error: BaseException | None = None
        self.n_left = 0
        self.n_running = 0
        self.trace = Trace(executor=executor_name, kind=plan.kind)
        self.on_task_done = on_task_done
        # the executor waited on the host until the outputs' GPU work completed (the streams executor):
        # the caller may read them on any stream without waiting for anything
        self.outputs_ready = False
        self.t0 = time.perf_counter()
        self.trace.origin = self.t0
        # the caller's scikit-learn configuration, with assume_finite=True where the sources of a GPU run
        # were checked once here (gpunets.devices.finite): the estimators then skip their host-syncing checks
        self.sklearn_config = run_config(plan)
        for t in plan.tasks:
            if t.kind == "source":
                self.values[t.key] = t.value
                self.done[t.key] = True
        for t in plan.tasks:
            if t.kind == "source":
                continue
            self.n_left += 1
            self.missing[t.key] = sum(1 for d in t.deps if not self.done[d])
            if self.missing[t.key] == 0:
                self.ready.append(t.key)

    # --- taking work -------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.n_left == 0 or (self.error is not None and self.n_running == 0)

    def next_ready(self, block: bool = False) -> int | None:
        """Take a ready task, or None when the run is over (or has failed).

        With ``block=True`` wait until a task is ready or the run ends.
        """
        with self.lock:
            while True:
                if self.error is not None or self.n_left == 0:
                    return None
                if self.ready:
                    self.n_running += 1
                    return self.ready.popleft()
                if not block:
                    return None
                self.changed.wait()

    def claim(self, key: int) -> bool:
        """Mark ``key`` as running without taking it from ``ready`` (lane executors)."""
        with self.lock:
            if self.error is not None:
                return False
            self.n_running += 1
            return True

    def inputs(self, task: Task) -> tuple[Any, ...]:
        vals = self.values
        return tuple([vals[d] for d in task.deps])

    # --- running -----------------------------------------------------------------------
    def run_task(self, key: int, *, lane: Any = None, inputs: tuple[Any, ...] | None = None,
                 device: str | None = None, before: Callable[[], None] | None = None,
                 configured: bool = False) -> bool:
        """Run task ``key`` here and now; return False if it failed.

        ``configured=True``: the caller already runs under :attr:`sklearn_config` (a lane's whole loop).
        """
        task = self.plan.tasks[key]
        fn = task.fn
        assert fn is not None   # only source tasks have no function, and they are done before the run starts
        if inputs is None:
            inputs = self.inputs(task)
        start = time.perf_counter()
        try:
            if before is not None:
                before()
            if self.sklearn_config and not configured:   # the caller's scikit-learn configuration, here too
                with sklearn_config(self.sklearn_config):
                    value = fn(*inputs)
            else:
                value = fn(*inputs)
        except BaseException as e:  # noqa: BLE001 - re-raised by raise_error
            self._record(task, lane, start, time.perf_counter(), device, failed=True)
            self.fail(key, e)
            return False
        end = time.perf_counter()
        self._record(task, lane, start, end, device)
        self.complete(key, value)
        return True

    def _record(self, task: Task, lane: Any, start: float, end: float, device: str | None,
                failed: bool = False) -> None:
        self.trace.add(task, lane, start - self.t0, end - self.t0, threading.current_thread().name, device, failed)

    def complete(self, key: int, value: Any, take: bool = False) -> int | None:
        """Record task ``key``'s value and wake its dependents.

        With ``take=True`` the caller goes on running tasks in this thread: the
        next ready task, if any, is taken under the same lock and returned.
        """
        task = self.plan.tasks[key]
        if task.commit is not None:
            task.commit(*value)  # a fit: the machine's new state, installed before dependents run
        nxt = None
        with self.lock:
            self.values[key] = value
            self.done[key] = True
            self.n_left -= 1
            self.n_running -= 1
            missing, ready, newly = self.missing, self.ready, 0
            for c in self.plan.consumers[key]:
                missing[c] -= 1
                if missing[c] == 0:
                    ready.append(c)
                    newly += 1
            holders, outputs = self.holders, self.outputs
            for d in task.deps:
                holders[d] -= 1
                if holders[d] == 0 and d not in outputs:
                    self.release(d)
            # Wake only as many waiting workers as there is new work (the caller takes one itself);
            # everyone when the run is over.
            if self.n_left == 0:
                self.changed.notify_all()
            elif newly > 1:
                self.changed.notify(newly - 1)
            if take and ready and self.error is None:
                self.n_running += 1
                nxt = ready.popleft()
        if self.on_task_done is not None:
            self.on_task_done(task)
        return nxt

    def work(self, lane: Any, block: bool = False) -> None:
        """:meth:`_work` under the caller's scikit-learn configuration (it is per thread)."""
        if self.sklearn_config:
            with sklearn_config(self.sklearn_config):
                self._work(lane, block)
        else:
            self._work(lane, block)

    def _work(self, lane: Any, block: bool = False) -> None:
        """Run ready tasks in this thread until none is left (``block=False``) or the run is over.

        The loop of the serial executor and of each thread of the threads
        executor: :meth:`next_ready` then :meth:`run_task`, with the next task
        taken under the lock that completes the last one, and the trace
        recorded inline (this is the per-task overhead of a run).
        """
        tasks, vals, t0 = self.plan.tasks, self.values, self.t0
        record = self.trace.add
        thread = threading.current_thread().name
        perf = time.perf_counter
        k = self.next_ready(block)
        while k is not None:
            task = tasks[k]
            fn = task.fn
            assert fn is not None   # only source tasks have no function, and they are never ready
            inputs = [vals[d] for d in task.deps]
            start = perf()
            try:
                value = fn(*inputs)
            except BaseException as e:  # noqa: BLE001 - re-raised by raise_error
                record(task, lane, start - t0, perf() - t0, thread, None, True)
                self.fail(k, e)
                return
            record(task, lane, start - t0, perf() - t0, thread, None, False)
            k = self.complete(k, value, take=True)
            if k is None and block:
                k = self.next_ready(True)

    def work_short(self, lane: Any, seconds: float) -> None:
        """Run ready tasks in this thread while they take less than ``seconds`` of this thread's CPU time: return
        once the last two, or three of the last eight, took longer (one slow task, a pause of the process, does
        not count; nor does time other processes take the core), when none is ready, or when the run is over or
        has failed."""
        if self.sklearn_config:
            with sklearn_config(self.sklearn_config):
                self._work_short(lane, seconds)
        else:
            self._work_short(lane, seconds)

    def _work_short(self, lane: Any, seconds: float) -> None:
        tasks, vals, t0 = self.plan.tasks, self.values, self.t0
        thread = threading.current_thread().name
        perf = time.perf_counter
        slow: collections.deque[bool] = collections.deque(maxlen=8)   # the last tasks: each took `seconds` or more
        while True:
            k = self.next_ready(False)
            if k is None:
                return
            task = tasks[k]
            fn = task.fn
            assert fn is not None   # only source tasks have no function, and they are never ready
            inputs = [vals[d] for d in task.deps]
            start, cpu = perf(), time.thread_time()
            try:
                value = fn(*inputs)
            except BaseException as e:  # noqa: BLE001 - re-raised by raise_error
                self.trace.add(task, lane, start - t0, perf() - t0, thread, None, True)
                self.fail(k, e)
                return
            end, cpu = perf(), time.thread_time() - cpu
            self.trace.add(task, lane, start - t0, end - t0, thread, None, False)
            self.complete(k, value)
            slow.append(cpu >= seconds)
            if (slow[-1] and len(slow) > 1 and slow[-2]) or sum(slow) >= 3:
                return

    def release(self, key: int) -> None:
        """Drop an intermediate value nobody needs any more (lane executors defer this)."""
        if self.plan.tasks[key].kind != "source":
            self.values[key] = None

    def fail(self, key: int, exc: BaseException) -> None:
        with self.lock:
            self.n_running -= 1
            if self.error is None:
                self.error = self._wrap(key, exc)
            self.changed.notify_all()

    def abort(self, exc: BaseException) -> None:
        """Stop the run from outside (KeyboardInterrupt): nothing new starts."""
        with self.lock:
            if self.error is None:
                self.error = exc
            self.changed.notify_all()

    def wait(self, timeout: float | None = 0.1) -> None:
        """Block until the run is over; wakes up regularly so Ctrl-C is seen."""
        with self.lock:
            while not self.finished:
                self.changed.wait(timeout)

    # --- results -----------------------------------------------------------------------
    def _wrap(self, key: int, exc: BaseException) -> BaseException:
        if not isinstance(exc, Exception):
            return exc  # KeyboardInterrupt, SystemExit: not ours to wrap
        task = self.plan.tasks[key]
        if isinstance(exc, GpunetsError) and getattr(exc, "_gn_task_named", False):
            return exc  # already names its task (a nested network's error)
        detail = f"{type(exc).__name__}: {exc}"
        oom = isinstance(exc, MemoryError) and str(task.device).startswith("cuda")
        if oom:   # out of GPU memory: name the device, the bytes asked for and what else held memory there
            detail += "; " + out_of_memory_detail(self, task, exc)
            exc_for_type: BaseException = MemoryError(str(exc))   # CuPy's OutOfMemoryError takes (size, total)
        else:
            exc_for_type = exc
        if task.kind == "fit":
            label = self.plan.machine_label(task.machine) if task.machine is not None else task.label
            msg = (f"Machine {label} failed to fit ({detail}). Machines trained before it keep their new "
                   f"state and {label} keeps its previous one; fix the cause and call fit() again.")
            err = wrap_exception(FitError, msg, exc_for_type)
        else:
            path = " <- ".join(t.label for t in self.plan.path_to_output(key)[1:4])
            mach = f" (machine {self.plan.machine_label(task.machine)})" if task.machine is not None else ""
            where = f"; needed by {path}" if path else ""
            msg = f"Evaluating node {task.label}{mach} failed ({detail}){where}."
            err = wrap_exception(EvaluationError, msg, exc_for_type)
        err._gn_task_named = True
        err._gn_original = exc
        return err

    def raise_error(self) -> None:
        err = self.error
        if err is None:
            return
        original = getattr(err, "_gn_original", None)
        if original is not None and original is not err:
            raise err from original
        raise err

    def results(self) -> list[Any]:
        self.raise_error()
        return [self.values[k] for k in self.plan.outputs]


_OOM_BYTES = re.compile(r"allocating ([\d,]+) bytes")


def out_of_memory_detail(run: Run, task: Task, exc: BaseException) -> str:
    """What an out-of-memory error in a GPU task asked for and what else held the GPU's memory.

    The bytes come from CuPy's message (``Out of memory allocating N bytes``); the memory held, from the
    run's own values on that GPU (the largest three named by task) and CuPy's pool where it is loaded.
    """
    from gpunets.devices import _gpulibs
    from gpunets.devices.value_types import is_cupy_array

    m = _OOM_BYTES.search(str(exc))
    asked = f"asked for {int(m.group(1).replace(',', '')):,} bytes" if m else "the size asked for is unknown"
    dev = str(task.device)
    ordinal = int(dev.split(":")[1]) if ":" in dev else 0
    held: list[tuple[int, str]] = []
    for t in run.plan.tasks:
        v = run.values[t.key]
        if v is not _SENTINEL and v is not None and is_cupy_array(v):
            dv = getattr(getattr(v, "device", None), "id", ordinal)
            if dv == ordinal:
                held.append((int(v.nbytes), t.label))
    held.sort(reverse=True)
    total = sum(b for b, _ in held)
    what = ", ".join(f"{label} {b:,} B" for b, label in held[:3]) or "none"
    text = f"{asked} on {dev}; this run's values held {total:,} bytes there ({what})"
    cp = _gpulibs.loaded_cupy()
    pool = getattr(cp, "get_default_memory_pool", None) if cp is not None else None
    if pool is not None:
        try:
            p = pool()
            text += f", CuPy's pool {p.used_bytes():,} bytes in use of {p.total_bytes():,} held"
        except Exception:  # noqa: BLE001 - a report must not fail on a broken pool  # pragma: no cover
            pass
    return (text + ". Hint: free GPU memory (del large arrays, cupy.get_default_memory_pool().free_all_blocks()), "
            "use fewer streams (workers), or place this machine on the CPU")

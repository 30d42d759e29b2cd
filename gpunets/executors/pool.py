"""Persistent worker threads, one per (device, lane), shared by every run of the process.

CuPy's cuBLAS/cuSOLVER handles, cuML's handle (bound to the GPU current when
it was made) and CuPy's per-thread memory arenas live as long as their
thread, and destroying a cuBLAS handle synchronizes the device.  So the
threads and streams executors do not start threads per run: they borrow
idle workers from this pool and give them back when the run ends.

* A worker is made for one **key** (``("cpu", i)`` or ``("cuda", ordinal, i)``)
  and serves only that key for life: a GPU lane never switches GPUs.
* A run *checks out* a worker per lane; a worker runs one job at a time.
  When every worker of a key is busy (a nested network, run inside a task of
  an outer run, or two runs from two user threads) a new worker is made, so
  nesting never waits for a worker held by its own outer run.  Consecutive
  runs reuse the same workers: the number of threads does not grow.
* Workers are daemon threads, stopped at interpreter exit (``atexit``).

>>> import threading
>>> done = []
>>> h = checkout(("cpu", 0)).submit(lambda: done.append(threading.current_thread().name))
>>> _ = h.join(); done[0].startswith("gpunets-cpu-0")
True
"""

from __future__ import annotations

import atexit
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["checkout", "Worker", "pool_threads", "busy_workers", "shutdown"]

_LOCK = threading.Lock()
_IDLE: dict[tuple, list[Worker]] = {}
_ALL: list[Worker] = []
_STOPPING = [False]


class Worker:
    """One persistent thread serving one key; runs the jobs it is given, one at a time."""

    def __init__(self, key: tuple, n: int) -> None:
        self.key = key
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.busy = False
        name = "gpunets-" + "-".join(str(k) for k in key) + (f".{n}" if n else "")
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[[], Any]) -> Job:
        """Run ``fn()`` on this worker; the worker goes back to the pool when it returns."""
        job = Job()
        self.jobs.put((fn, job))
        return job

    def _loop(self) -> None:
        while True:
            item = self.jobs.get()
            if item is None:
                return
            fn, job = item
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - a job reports its own errors; keep the worker alive
                job.error = e
            finally:
                # an idle worker keeps nothing of its last run: the job's closure holds the run (outputs, data,
                # old fitted states, GPU memory), which must go when the run's caller lets it go
                item = fn = None
                _give_back(self)
                job.done.set()
                job = None


class Job:
    """A job given to a worker: ``join()`` waits for it (and wakes regularly, so Ctrl-C is seen)."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None

    def join(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            return self.done.wait(timeout)
        while not self.done.wait(0.1):
            pass
        return True


def checkout(key: tuple) -> Worker:
    """An idle worker for ``key`` (made if none is idle), marked busy until its job returns."""
    with _LOCK:
        idle = _IDLE.setdefault(key, [])
        if idle:
            w = idle.pop()
        else:
            n = sum(1 for w in _ALL if w.key == key)
            w = Worker(key, n)
            _ALL.append(w)
        w.busy = True
        return w


def _give_back(w: Worker) -> None:
    with _LOCK:
        w.busy = False
        if not _STOPPING[0]:
            _IDLE.setdefault(w.key, []).append(w)


def pool_threads() -> int:
    """How many worker threads the pool holds (busy or idle)."""
    with _LOCK:
        return len(_ALL)


def busy_workers() -> list[str]:
    """The names of the workers running a job now (empty between runs)."""
    with _LOCK:
        return [w.thread.name for w in _ALL if w.busy]


def shutdown(timeout: float = 1.0) -> None:
    """Stop the idle workers (at interpreter exit)."""
    with _LOCK:
        _STOPPING[0] = True
        idle = [w for ws in _IDLE.values() for w in ws]
        _IDLE.clear()
    for w in idle:
        w.jobs.put(None)
    for w in idle:
        w.thread.join(timeout)


atexit.register(shutdown)

"""One worker thread per lane; on a GPU each lane is a CUDA stream.

The plan's lanes (GrCUDA's policy, see :mod:`gpunets.plan`) become streams.
Each lane's worker thread runs that lane's tasks in plan order, as a CUDA
stream runs its work in issue order, so an edge inside a lane needs nothing.
An edge between lanes is an event: the producer's lane records it after the
producer, the consumer's lane waits on it before the consumer (on a GPU
``stream.wait_event``: the GPU waits, the host does not).

* **On a GPU** a lane's stream is its worker thread's per-thread default
  stream (``cupy.cuda.Stream.ptds``, where cuML runs its work, since cuML no
  longer takes a stream) or, with ``stream="new"``, a non-blocking CuPy stream;
  events are ``cupy.cuda.Event(disable_timing=True)``.  A value handed to
  another lane is kept alive until the consumer's own event has completed
  (CuPy's pool may otherwise reuse its memory too early: cupy issue 8068).
  The host blocks only on the outputs' events.
* **Without a GPU** (or with ``emulate=True``) the same executor runs on
  CPU-emulated streams: a lane is its worker thread, an event is a host-side
  flag.  ``delays=(lo, hi)`` sleeps a random time before each task, and
  ``check=True`` records every record/wait/read and raises
  :class:`gpunets.StreamOrderError` when a value is read before its producer
  finished or a cross-lane edge was read without a wait.
"""

from __future__ import annotations

import random
import threading
from typing import Any, Callable

from ..devices import gpu_available
from ..exceptions import StreamOrderError
from ..scheduler import Run
from .base import Executor, task_context

__all__ = ["StreamsExecutor", "EmulatedBackend", "CudaBackend", "StreamChecker"]


class StreamChecker:
    """Records event records, waits and reads on emulated streams and checks their order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: list[tuple[str, int, int]] = []      # (what, task, other task)
        self.recorded: set[int] = set()
        self.waited: set[tuple[int, int]] = set()
        self.violations: list[str] = []

    def record(self, key: int) -> None:
        with self.lock:
            self.recorded.add(key)
            self.log.append(("record", key, key))

    def wait(self, consumer: int, producer: int) -> None:
        with self.lock:
            if producer not in self.recorded:
                self.violations.append(f"task {consumer} waited on the event of task {producer} before it was recorded")
            self.waited.add((consumer, producer))
            self.log.append(("wait", consumer, producer))

    def read(self, consumer: Any, producer: Any, cross_lane: bool, finished: bool) -> None:
        problem = None
        with self.lock:
            self.log.append(("read", consumer.key, producer.key))
            if cross_lane and (consumer.key, producer.key) not in self.waited:
                problem = (f"cross-lane edge without a wait: task {consumer.key} ({consumer.label}, lane "
                           f"{consumer.lane}) read the value of task {producer.key} ({producer.label}, lane "
                           f"{producer.lane}) without waiting on its event")
            elif not finished:
                problem = (f"task {consumer.key} ({consumer.label}) read the value of task {producer.key} "
                           f"({producer.label}) before its producer finished")
            if problem:
                self.violations.append(problem)
        if problem:
            raise StreamOrderError(problem + ". The plan is missing a dependency.")


class _HostEvent:
    __slots__ = ("flag",)

    def __init__(self) -> None:
        self.flag = threading.Event()

    def query(self) -> bool:
        return self.flag.is_set()

    def synchronize(self) -> None:
        self.flag.wait()


class EmulatedBackend:
    """CPU-emulated streams: a lane is its worker thread, an event a host-side flag."""

    name = "emulated"

    def __init__(self, delays: tuple[float, float] | None = None, seed: int | None = None,
                 check: bool = False) -> None:
        self.delays = delays
        self.rng = random.Random(seed)
        self.checker = StreamChecker() if check else None

    def lane_context(self, lane: int) -> Any:
        return _Null()

    def event(self) -> _HostEvent:
        return _HostEvent()

    def record(self, event: _HostEvent, key: int) -> None:
        if self.checker is not None:
            self.checker.record(key)
        event.flag.set()

    def wait(self, event: _HostEvent, consumer: int, producer: int) -> None:
        if self.checker is not None:
            self.checker.wait(consumer, producer)
        event.flag.wait()

    def task_context(self, task: Any) -> Any:
        return _Null()

    def before_task(self) -> Callable[[], None] | None:
        if not self.delays:
            return None
        lo, hi = self.delays
        pause = self.rng.uniform(lo, hi)

        def sleep() -> None:
            threading.Event().wait(pause)

        return sleep


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


class CudaBackend:
    """Real CUDA streams and events through CuPy (imported only here, only when used)."""

    name = "cuda"

    def __init__(self, stream: str = "ptds") -> None:
        import cupy

        self.cupy = cupy
        self.kind = stream
        self.checker = None
        self.delays = None

    def lane_context(self, lane: int) -> Any:
        cp = self.cupy
        stream = cp.cuda.Stream.ptds if self.kind == "ptds" else cp.cuda.Stream(non_blocking=True)
        return stream

    def event(self) -> Any:
        return self.cupy.cuda.Event(disable_timing=True)

    def record(self, event: Any, key: int) -> None:
        event.record(self.cupy.cuda.get_current_stream())

    def wait(self, event: Any, consumer: int, producer: int) -> None:
        self.cupy.cuda.get_current_stream().wait_event(event)

    def before_task(self) -> None:
        return None

    def task_context(self, task: Any) -> Any:
        """Make the task's GPU current while it is issued (CuPy and cuML run on the current device)."""
        dev = str(task.device)
        if not dev.startswith("cuda"):
            return _Null()
        from ..devices import Device, local_ordinal

        return self.cupy.cuda.Device(local_ordinal(Device.parse(dev).index))


class _StreamsRun(Run):
    """A run whose released values wait for their consumers' events (cupy issue 8068)."""

    events: list[Any]
    graveyard: list[tuple[int, list[Any]]]

    def release(self, key: int) -> None:
        if self.plan.tasks[key].kind == "source":
            return
        pending = [self.events[c] for c in self.plan.consumers[key]]
        self.graveyard.append((key, pending))
        keep = []
        for k, evs in self.graveyard:
            if all(e.query() for e in evs):
                self.values[k] = None
            else:
                keep.append((k, evs))
        self.graveyard = keep


class StreamsExecutor(Executor):
    """One worker thread per lane; CUDA streams on a GPU, emulated streams without one.

    Parameters
    ----------
    workers : int, optional
        The most lanes (streams); default: the cores.
    emulate : bool, optional
        Force CPU-emulated streams even where a GPU exists (default: emulate
        only when no GPU is available or no task is on a CUDA device).
    delays : (float, float), optional
        Emulation only: sleep a random time in ``[lo, hi]`` seconds before each task.
    seed : int, optional
        Seed of those delays.
    check : bool
        Emulation only: record events and fail on an ordering violation.
    stream : {"ptds", "new"}
        GPU only: each lane on its thread's per-thread default stream (where
        cuML runs) or on a new non-blocking stream.
    skip_wait : callable, optional
        Testing only: ``skip_wait(consumer_task, producer_task) -> bool`` drops
        that cross-lane wait, to show that the checker catches a missing dependency.

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> X = gn.source(np.ones(2), name="X")
    >>> ex = StreamsExecutor(workers=2, check=True)
    >>> gn.mean(X + 1, X * 3)(executor=ex).tolist()
    [2.5, 2.5]
    """

    name = "streams"

    def __init__(self, workers: int | None = None, *, emulate: bool | None = None,
                 delays: tuple[float, float] | None = None, seed: int | None = None, check: bool = False,
                 stream: str = "ptds", skip_wait: Callable[[Any, Any], bool] | None = None) -> None:
        super().__init__(workers)
        if stream not in ("ptds", "new"):
            msg = f"stream={stream!r}: use 'ptds' (per-thread default stream) or 'new' (non-blocking stream)."
            raise ValueError(msg)
        self.emulate = emulate
        self.delays = delays
        self.seed = seed
        self.check = check
        self.stream = stream
        self.skip_wait = skip_wait
        self.last_checker: StreamChecker | None = None

    def _backend(self, plan: Any) -> Any:
        on_gpu = any(str(t.device).startswith("cuda") for t in plan.tasks)
        if self.emulate or (self.emulate is None and not (on_gpu and gpu_available())):
            return EmulatedBackend(self.delays, self.seed, self.check)
        return CudaBackend(self.stream)

    def run(self, plan: Any, on_task_done: Any = None) -> Run:
        plan.n_lanes  # noqa: B018 - assigns the lanes (done on first use)
        backend = self._backend(plan)
        self.last_checker = backend.checker
        name = self.name if backend.name == "cuda" else f"{self.name} (emulated)"
        run = _StreamsRun(plan, executor_name=name, on_task_done=on_task_done)
        run.events = [backend.event() for _ in plan.tasks]
        run.graveyard = []
        host_ready = [threading.Event() for _ in plan.tasks]
        for t in plan.tasks:
            if t.kind == "source":
                host_ready[t.key].set()
        lanes: dict[int, list[int]] = {}
        for t in plan.tasks:
            if t.kind != "source":
                lanes.setdefault(t.lane, []).append(t.key)
        if self.workers and len(lanes) > self.workers:  # a plan compiled for more lanes: fold them
            folded: dict[int, list[int]] = {}
            for t in plan.tasks:
                if t.kind != "source":
                    t.lane = t.lane % self.workers
                    folded.setdefault(t.lane, []).append(t.key)
            lanes = folded
        threads = [threading.Thread(target=task_context().run,
                                    args=(self._lane, run, backend, lane, keys, host_ready),
                                    name=f"gpunets-stream-{lane}", daemon=True)
                   for lane, keys in sorted(lanes.items())]
        for th in threads:
            th.start()
        try:
            for k in plan.outputs:   # the host blocks only for the outputs
                while not host_ready[k].wait(0.1):
                    pass
                if run.error is None and backend.name == "cuda":
                    run.events[k].synchronize()
        except BaseException as e:
            run.abort(e)
            for ev in host_ready:
                ev.set()
            raise
        finally:
            for th in threads:
                th.join()
            run.graveyard = []
        return run

    def _lane(self, run: _StreamsRun, backend: Any, lane: int, keys: list[int],
              host_ready: list[threading.Event]) -> None:
        tasks = run.plan.tasks
        checker = backend.checker
        try:
            with backend.lane_context(lane):
                for k in keys:
                    if run.error is not None:
                        break
                    task = tasks[k]
                    for d in task.deps:
                        prod = tasks[d]
                        if prod.kind == "source" or prod.lane == lane:
                            continue
                        if self.skip_wait is not None and self.skip_wait(task, prod):
                            continue
                        host_ready[d].wait()
                        if run.error is not None:
                            break
                        backend.wait(run.events[d], k, d)
                    if run.error is not None:
                        break
                    if checker is not None:
                        try:
                            for d in task.deps:
                                prod = tasks[d]
                                if prod.kind != "source":
                                    checker.read(task, prod, prod.lane != lane, run.done[d])
                        except StreamOrderError as e:
                            run.claim(k)
                            run.fail(k, e)
                            break
                    inputs = tuple(run.values[d] for d in task.deps)
                    if not run.claim(k):
                        break
                    with backend.task_context(task):
                        ok = run.run_task(k, lane=lane, inputs=inputs, before=backend.before_task())
                        if ok:
                            backend.record(run.events[k], k)
                    host_ready[k].set()
                    if not ok:
                        break
        finally:
            if run.error is not None:  # wake every lane waiting on this one
                for ev in host_ready:
                    ev.set()

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

    def begin(self, tasks: Any) -> None:
        return None

    def lane_context(self, lane: int) -> Any:
        return _Null()

    def done(self, event: _HostEvent | None) -> bool:
        return event is not None and event.flag.is_set()

    def record(self, task: Any) -> _HostEvent:
        if self.checker is not None:
            self.checker.record(task.key)
        event = _HostEvent()
        event.flag.set()
        return event

    def wait(self, event: _HostEvent, consumer: Any, producer: Any, cross_lane: bool) -> None:
        if not cross_lane:  # a lane runs its tasks in order: nothing to wait for
            return
        if self.checker is not None:
            self.checker.wait(consumer.key, producer.key)
        event.flag.wait()

    def wait_source(self, consumer: Any, source: Any) -> None:
        return None

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


def _ordinal(device: str) -> int | None:
    """The CUDA ordinal of a task's device name in this process; None for the CPU."""
    if not device.startswith("cuda"):
        return None
    from ..devices import Device, local_ordinal

    return local_ordinal(Device.parse(device).index)


class _CudaTask:
    """One task on a CUDA lane: its GPU current, then the lane's stream for that GPU current."""

    __slots__ = ("backend", "ordinal", "device", "stream")

    def __init__(self, backend: CudaBackend, ordinal: int) -> None:
        self.backend, self.ordinal = backend, ordinal

    def __enter__(self) -> None:
        self.device = self.backend.cupy.cuda.Device(self.ordinal)
        self.device.__enter__()
        try:
            self.stream = self.backend._stream(self.ordinal)
            self.stream.__enter__()   # CuPy's current stream is per thread and per device
        except BaseException:
            self.device.__exit__(None, None, None)
            raise

    def __exit__(self, *a: object) -> None:
        try:
            self.stream.__exit__(*a)
        finally:
            self.device.__exit__(*a)


class CudaBackend:
    """Real CUDA streams and events through CuPy (imported only here, only when used).

    A lane has one stream per GPU it runs tasks on (``Stream.ptds`` or a
    non-blocking stream made on that GPU), current while each of its tasks is
    issued on that GPU.  Every task records an event (made and recorded in its
    own task context, so on its own GPU: an event must be recorded on a stream
    of the device it was created on).  A GPU task waits (GPU-side) on the events
    of its producers on another stream; a CPU task waits on the host for its
    producers' events, since it reads their values on the host.  The streams
    also wait for an event recorded on the caller's current stream when the run
    started, where the sources were made.
    """

    name = "cuda"

    def __init__(self, stream: str = "ptds") -> None:
        from .._gpulibs import cupy as _cupy; cupy = _cupy()  # noqa: E702 - real CuPy or the fake GPU

        self.cupy = cupy
        self.kind = stream
        self.checker = None
        self.delays = None
        self.start: list[Any] = []      # events on the caller's streams at the start of the run
        self._local = threading.local()

    def begin(self, tasks: Any) -> None:
        """In the calling thread: record, on its current stream of every GPU the plan uses, the start events."""
        cp = self.cupy
        for o in sorted({o for t in tasks if (o := _ordinal(str(t.device))) is not None}):
            with cp.cuda.Device(o):
                ev = cp.cuda.Event(disable_timing=True)
                ev.record(cp.cuda.get_current_stream())   # this thread's current stream on this device
                self.start.append(ev)

    def lane_context(self, lane: int) -> Any:
        self._local.streams = {}       # ordinal -> this lane's stream on that GPU
        self._local.start_synced = False
        return _Null()

    def _stream(self, ordinal: int) -> Any:
        """This lane's stream on GPU ``ordinal`` (current device), made on first use; it waits for the start."""
        streams = self._local.streams
        s = streams.get(ordinal)
        if s is None:
            cp = self.cupy
            s = cp.cuda.Stream.ptds if self.kind == "ptds" else cp.cuda.Stream(non_blocking=True)
            for ev in self.start:   # an event may be waited on by a stream of another device
                s.wait_event(ev)
                if self.kind == "new":
                    cp.cuda.Stream.ptds.wait_event(ev)
            streams[ordinal] = s
        return s

    def done(self, event: Any) -> bool:
        if event is None:  # not recorded yet (cudaEventQuery would say cudaSuccess for it)
            return False
        if isinstance(event, _HostEvent):
            return event.flag.is_set()
        return event.done   # CuPy's Event: .done is cudaEventQuery; it has no .query()

    def record(self, task: Any) -> Any:
        """An event recorded on the current stream, after the task's work (inside its task context).

        A CPU task's value is host data, ready when the task returns: its event is a host flag (an
        event recorded on the legacy default stream would be a device-wide barrier).
        """
        if _ordinal(str(task.device)) is None:
            host = _HostEvent()
            host.flag.set()
            return host
        cp = self.cupy
        ev = cp.cuda.Event(disable_timing=True)
        if self.kind == "new":
            # cuML runs on the per-thread default stream whatever CuPy's current stream is: join it in
            cp.cuda.get_current_stream().wait_event(cp.cuda.Stream.ptds.record(cp.cuda.Event(disable_timing=True)))
        ev.record(cp.cuda.get_current_stream())
        return ev

    def wait(self, event: Any, consumer: Any, producer: Any, cross_lane: bool) -> None:
        """Order ``consumer`` after ``producer``'s event (called inside the consumer's task context)."""
        if event is None or isinstance(event, _HostEvent):  # a CPU task's value: on the host, and ready
            return
        mine = _ordinal(str(consumer.device))
        if mine is None:    # a CPU task reads its inputs on the host
            event.synchronize()
            return
        cp = self.cupy
        if cross_lane or _ordinal(str(producer.device)) != mine:   # else: the same stream, in issue order
            cp.cuda.get_current_stream().wait_event(event)
        if self.kind == "new":  # cuML's work goes to the per-thread default stream
            cp.cuda.Stream.ptds.wait_event(event)

    def wait_source(self, consumer: Any, source: Any) -> None:
        """A CPU task reading a GPU source waits on the host for the start events (once per lane)."""
        if _ordinal(str(consumer.device)) is None and _ordinal(str(source.device)) is not None \
                and not self._local.start_synced:
            for ev in self.start:
                ev.synchronize()
            self._local.start_synced = True

    def before_task(self) -> None:
        return None

    def task_context(self, task: Any) -> Any:
        """Make the task's GPU and this lane's stream on it current while the task is issued."""
        o = _ordinal(str(task.device))
        return _Null() if o is None else _CudaTask(self, o)


class _StreamsRun(Run):
    """A run whose released values wait for their consumers' events (cupy issue 8068).

    A value nobody needs any more goes to the graveyard and is dropped once
    every consumer's event has been recorded *and* has completed.  An event
    that was never recorded is not "done" here (CUDA's ``cudaEventQuery`` says
    ``cudaSuccess`` for it), and the last consumer releases its inputs before
    it records its own event, so the graveyard is swept again after each record.
    """

    events: list[Any]
    graveyard: list[tuple[int, list[int]]]
    backend: Any

    def release(self, key: int) -> None:   # called under self.lock
        if self.plan.tasks[key].kind == "source":
            return
        self.graveyard.append((key, self.plan.consumers[key]))
        self._sweep()

    def _sweep(self) -> None:
        events, done = self.events, self.backend.done
        keep = []
        for k, consumers in self.graveyard:
            if all(done(events[c]) for c in consumers):
                self.values[k] = None
            else:
                keep.append((k, consumers))
        self.graveyard = keep

    def recorded(self, key: int, event: Any) -> None:
        """Task ``key``'s event is recorded (before its lane tells the others)."""
        with self.lock:
            self.events[key] = event
            if self.graveyard:
                self._sweep()

    def drain(self) -> None:
        """At the end of the run: wait for the consumers of what is left in the graveyard, then drop it."""
        for k, consumers in self.graveyard:
            for c in consumers:
                ev = self.events[c]
                if ev is not None:
                    ev.synchronize()
            self.values[k] = None
        self.graveyard = []


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
        run.events = [None] * len(plan.tasks)   # each made and recorded by its task's lane
        run.graveyard = []
        run.backend = backend
        backend.begin(plan.tasks)
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
                ev = run.events[k]
                if run.error is None and backend.name == "cuda" and ev is not None:
                    ev.synchronize()
        except BaseException as e:
            run.abort(e)
            for ev in host_ready:
                ev.set()
            raise
        finally:
            for th in threads:
                th.join()
            if run.error is None:
                run.drain()
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
                    ok = False
                    # The waits are issued inside the task's context: on a GPU, on the stream the task runs on.
                    with backend.task_context(task):
                        for d in task.deps:
                            prod = tasks[d]
                            if prod.kind == "source":
                                backend.wait_source(task, prod)
                                continue
                            cross = prod.lane != lane
                            if cross:
                                if self.skip_wait is not None and self.skip_wait(task, prod):
                                    continue
                                host_ready[d].wait()   # its event is recorded (waiting on an unrecorded one is a no-op)
                                if run.error is not None:
                                    break
                            backend.wait(run.events[d], task, prod, cross)
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
                        ok = run.run_task(k, lane=lane, inputs=inputs, before=backend.before_task())
                        if ok:
                            run.recorded(k, backend.record(task))
                    host_ready[k].set()
                    if not ok:
                        break
        except BaseException as e:  # noqa: BLE001 - e.g. a CUDA error recording an event: the run fails with it
            run.abort(e)
        finally:
            if run.error is not None:  # wake every lane waiting on this one
                for ev in host_ready:
                    ev.set()

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

import os
import random
import sys
import threading
import time
import warnings
from typing import Any, Callable

from .. import _gpulibs
from ..devices import Device, gpu_available, local_ordinal
from ..exceptions import StreamOrderError
from ..gpu_memory import ensure_gpu_memory
from ..scheduler import Run
from . import pool
from ._args import check_callable, check_delays, check_flag, check_optional_flag, check_seed
from .base import Executor, gpu_timing_requested, task_context

__all__ = ["StreamsExecutor", "EmulatedBackend", "CudaBackend", "StreamChecker", "wants_cuda", "run_on_cuda",
           "MAX_GPU_LANES", "LegacyStreamWarning", "check_default_streams"]


class LegacyStreamWarning(UserWarning):
    """Some GPU work will go to CUDA's legacy default stream, a device-wide barrier between lanes."""


_WARNED: set[str] = set()


def check_default_streams(kind: str) -> None:
    """Check, when the CUDA backend starts, that no library puts the lanes' work on the legacy default stream.

    * cuDF without ``CUDF_PER_THREAD_STREAM=1`` (read once, when libcudf starts) runs every operation
      on the legacy default stream.  With ``stream="new"`` (non-blocking lane streams, which the
      legacy stream does not wait for) that is a race: refused.  With ``stream="ptds"`` it is
      correct but serializes the lanes: a warning, once.
    * CuPy without ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1`` (read when CuPy is imported): the lanes
      issue on their own streams, but CuPy work outside them (where the sources were made, where
      the outputs are read) goes to the legacy stream: a warning, once.
    """
    # cuDF switches to per-thread default streams only for the value "1" (libcudf's own test): "0", "true" or
    # any other value leaves it on the legacy default stream
    if "cudf" in sys.modules and os.environ.get("CUDF_PER_THREAD_STREAM") != "1":
        if kind == "new":
            msg = ("stream='new' cannot be used with cuDF on the legacy default stream: cuDF runs its work on "
                   "the legacy default stream unless CUDF_PER_THREAD_STREAM=1, and a non-blocking lane "
                   "stream is not ordered with it, so a lane could read a cuDF result before it is written. "
                   "Set CUDF_PER_THREAD_STREAM=1 in the environment before starting Python, or use "
                   "stream='ptds'.")
            raise StreamOrderError(msg)
        _warn_once("cudf", "cuDF runs on CUDA's legacy default stream (CUDF_PER_THREAD_STREAM is not 1), a "
                           "device-wide barrier: the GPU lanes will not overlap while cuDF works. Set "
                           "CUDF_PER_THREAD_STREAM=1 in the environment before starting Python.")
    try:
        ptds = int(os.environ.get("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "0")) != 0
    except ValueError:
        ptds = False
    if not ptds:
        _warn_once("cupy", "CuPy's default stream is CUDA's legacy default stream "
                           "(CUPY_CUDA_PER_THREAD_DEFAULT_STREAM is not set): the GPU lanes run on their own "
                           "streams, but CuPy work outside them (where the sources are made, where the outputs "
                           "are read) is a device-wide barrier. Set CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1 in the "
                           "environment before CuPy is imported.")


def _warn_once(what: str, msg: str) -> None:
    if what not in _WARNED:
        _WARNED.add(what)
        warnings.warn(msg, LegacyStreamWarning, stacklevel=4)


def _max_gpu_lanes() -> int:
    try:
        return max(1, int(os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "8")))
    except ValueError:
        return 8


#: The most lanes (streams, worker threads) per GPU: the number of hardware queues
#: (``CUDA_DEVICE_MAX_CONNECTIONS``, 8 by default); more streams than that share queues.
MAX_GPU_LANES = _max_gpu_lanes()

_THREAD = threading.local()    # per worker thread: its streams, made once and kept for the thread's life


def _cupy() -> Any:
    """CuPy (or the fake GPU), imported here only when the CUDA backend is used (tests replace this function)."""
    return _gpulibs.cupy()


def wants_cuda(plan: Any) -> bool:
    """True if ``plan`` has a task on a CUDA device and a GPU is usable here (the CUDA backend runs it)."""
    return any(str(d).startswith("cuda") for d in {t.device for t in plan.tasks}) and gpu_available()


def run_on_cuda(plan: Any, workers: int, name: str, on_task_done: Any = None) -> Run:
    """Run ``plan`` on the CUDA backend of the streams executor, with ``workers`` lanes per device.

    The ``serial`` and ``threads`` executors hand plans with GPU tasks to this: a GPU
    task needs its device current, a stream of its own lane, events on the edges
    between threads and its inputs kept alive until it completed, which only the
    streams executor's CUDA backend provides.
    """
    ex = StreamsExecutor(workers=workers)
    return ex._run(plan, CudaBackend(ex.stream, timing=gpu_timing_requested()), name, on_task_done)


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

    def device_key(self, task: Any) -> None:
        return None   # every emulated lane is a CPU thread

    def pool_key(self, group: tuple) -> tuple:
        return ("cpu", group[1])

    def lane_context(self, group: tuple) -> Any:
        return _Null()

    def done(self, event: _HostEvent | None) -> bool:
        return event is not None and event.flag.is_set()

    def quiesce(self, run: Any) -> None:
        return None

    def timings(self, run: Any) -> None:
        return None

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

    def before_task(self, task: Any = None) -> Callable[[], None] | None:
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


class _LaneDevice:
    """A GPU lane's whole job: its GPU made current for the worker thread (which serves only that GPU)."""

    __slots__ = ("backend", "ordinal")

    def __init__(self, backend: CudaBackend, ordinal: int) -> None:
        self.backend, self.ordinal = backend, ordinal

    def __enter__(self) -> None:
        # A lane thread serves one GPU for life (pool key): cuML's per-thread handle, made on the GPU
        # current when it is first used, and CuPy's per-thread handles stay on this GPU.
        self.backend.cupy.cuda.Device(self.ordinal).use()

    def __exit__(self, *a: object) -> None:
        return None


class CudaBackend:
    """Real CUDA streams and events through CuPy (imported only here, only when used).

    A lane is a worker thread of one device for life (the pool key is
    ``("cuda", ordinal, lane)`` or ``("cpu", lane)``); a GPU lane issues its
    tasks on its stream (``Stream.ptds`` of its thread, or a non-blocking stream
    made once per thread), current while each task is issued.  Every GPU task
    records an event (made and recorded in its own task context, so on its own
    GPU: an event must be recorded on a stream of the device it was created
    on).  A GPU task waits (GPU-side) on the events of its producers on another
    stream; a CPU task waits on the host for its producers' events, since it
    reads their values on the host.  The streams also wait for an event
    recorded on the caller's current stream when the run started, where the
    sources were made.
    """

    name = "cuda"

    def __init__(self, stream: str = "ptds", timing: bool = False) -> None:
        check_default_streams(stream)
        self.cupy = _cupy()
        self.timing = timing
        self.clock: dict[int, tuple[Any, float]] = {}   # ordinal -> (timed event at the start, host time then)
        self.timed: dict[int, list[Any]] = {}           # task key -> [ordinal, start event, end event]
        self.kind = stream
        self.checker = None
        self.delays = None
        self.start: list[Any] = []      # events on the caller's streams at the start of the run
        self.ordinals: list[int] = []   # the GPUs the plan uses
        self.tasks: list[Any] = []
        self._local = threading.local()

    def begin(self, tasks: Any) -> None:
        """In the calling thread: record, on its current stream of every GPU the plan uses, the start events."""
        cp = self.cupy
        self.tasks = tasks
        self.ordinals = sorted({o for t in tasks if (o := _ordinal(str(t.device))) is not None})

        ensure_gpu_memory(self.ordinals)   # gn.set_config(gpu_memory=...) made before a GPU was seen
        for o in self.ordinals:
            with cp.cuda.Device(o):
                # blocking: a CPU lane that waits for it on the host sleeps instead of spinning a core
                ev = cp.cuda.Event(block=True, disable_timing=True)
                ev.record(cp.cuda.get_current_stream())   # this thread's current stream on this device
                self.start.append(ev)
                if self.timing:
                    t0 = cp.cuda.Event()   # timing on: the zero of this GPU's clock
                    t0.record(cp.cuda.get_current_stream())
                    self.clock[o] = (t0, time.perf_counter())

    def device_key(self, task: Any) -> int | None:
        """The GPU ordinal of a task (its lane's device), None for the CPU."""
        return _ordinal(str(task.device))

    def pool_key(self, group: tuple) -> tuple:
        ordinal, lane = group
        return ("cpu", lane) if ordinal is None else ("cuda", ordinal, lane)

    def lane_context(self, group: tuple) -> Any:
        self._local.streams = {}       # ordinal -> this lane's stream on that GPU, in this run
        self._local.start_synced = False
        return _Null() if group[0] is None else _LaneDevice(self, group[0])

    def _stream(self, ordinal: int) -> Any:
        """This lane's stream on GPU ``ordinal`` (current device); it waits for the start of the run."""
        streams = self._local.streams
        s = streams.get(ordinal)
        if s is None:
            cp = self.cupy
            if self.kind == "ptds":
                s = cp.cuda.Stream.ptds
            else:   # made once per worker thread and device, kept for the thread's life
                made = getattr(_THREAD, "streams", None)
                if made is None:
                    made = _THREAD.streams = {}
                key = (id(cp), ordinal)   # per CuPy module: a test's stand-in never gets another's stream
                s = made.get(key)
                if s is None:
                    s = made[key] = cp.cuda.Stream(non_blocking=True)
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
        # GPU consumers wait for it on the GPU (Stream.wait_event); a CPU consumer waits on the host, and a
        # blocking event lets that thread sleep instead of spinning a core (cudaEventBlockingSync)
        ev = cp.cuda.Event(block=True, disable_timing=True)
        if self.kind == "new":
            # cuML runs on the per-thread default stream whatever CuPy's current stream is: join it in
            cp.cuda.get_current_stream().wait_event(cp.cuda.Stream.ptds.record(cp.cuda.Event(disable_timing=True)))
        ev.record(cp.cuda.get_current_stream())
        if self.timing and task.key in self.timed:
            end = cp.cuda.Event()
            end.record(cp.cuda.get_current_stream())
            self.timed[task.key].append(end)
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

    def before_task(self, task: Any = None) -> Callable[[], None] | None:
        """With timing on, a GPU task records a timed event on its stream just before its work is issued."""
        if not self.timing or task is None or (o := _ordinal(str(task.device))) is None:
            return None
        cp = self.cupy

        def start() -> None:
            ev = cp.cuda.Event()
            ev.record(cp.cuda.get_current_stream())
            self.timed[task.key] = [o, ev]

        return start

    def timings(self, run: Any) -> None:
        """After the run: GPU start/end of each timed task into its trace record (host issue time kept)."""
        if not self.timed:
            return
        cp = self.cupy
        gpu: dict[int, tuple[float, float]] = {}
        for key, (o, *evs) in self.timed.items():
            if len(evs) != 2 or o not in self.clock:
                continue   # the task failed: no end event
            t0, host0 = self.clock[o]
            for ev in (t0, *evs):   # cudaEventElapsedTime needs both events complete
                ev.synchronize()
            base = host0 - run.t0
            gpu[key] = (base + cp.cuda.get_elapsed_time(t0, evs[0]) / 1e3,
                        base + cp.cuda.get_elapsed_time(t0, evs[1]) / 1e3)
        for r in run.trace.records:
            if r.key in gpu and r.issued is None:
                r.issued = (r.start, r.end)
                r.start, r.end = gpu[r.key]

    def task_context(self, task: Any) -> Any:
        """Make the task's GPU and this lane's stream on it current while the task is issued.

        A CPU task that reads GPU values (a move to the host, a host-only function) runs with its first
        GPU input's device and this lane's stream on it current: ``cupy.asnumpy(x)`` copies on the
        current stream, which would otherwise be the legacy default stream, a device-wide barrier.
        """
        o = _ordinal(str(task.device))
        if o is None:
            tasks = self.tasks
            o = next((p for d in task.deps if (p := _ordinal(str(tasks[d].device))) is not None), None)
        return _Null() if o is None else _CudaTask(self, o)

    def quiesce(self, run: Any) -> None:
        """After a failed run: wait until no kernel of the run can still read a value, before any is freed.

        A failed task may have issued work without recording its event, and lanes stopped early leave
        values their readers never finished with: synchronize every GPU the run used.
        """
        cp = self.cupy
        for o in self.ordinals:
            cp.cuda.Device(o).synchronize()


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
    timing : bool, optional
        GPU only: time each GPU task with CUDA events, so that its trace record shows when the GPU
        ran it (``issued`` keeps the host issue time).  Default: on inside
        ``gn.evaluate(..., trace=True)``, else off (timed events cost a little).
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
                 stream: str = "ptds", skip_wait: Callable[[Any, Any], bool] | None = None,
                 timing: bool | None = None) -> None:
        owner = "StreamsExecutor"
        check_optional_flag("emulate", emulate, owner, "emulate only where no GPU is used")
        delays = check_delays(delays, owner)
        check_seed(seed, owner)
        check_flag("check", check, owner)
        check_callable("skip_wait", skip_wait, owner, "skip_wait(consumer_task, producer_task) -> bool")
        check_optional_flag("timing", timing, owner, "time GPU tasks only when the run is traced")
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
        self.timing = timing
        self.last_checker: StreamChecker | None = None

    def _backend(self, plan: Any) -> Any:
        on_gpu = any(str(t.device).startswith("cuda") for t in plan.tasks)
        if self.emulate or (self.emulate is None and not (on_gpu and gpu_available())):
            return EmulatedBackend(self.delays, self.seed, self.check)
        timing = gpu_timing_requested() if self.timing is None else self.timing
        return CudaBackend(self.stream, timing=timing)

    def run(self, plan: Any, on_task_done: Any = None) -> Run:
        plan.n_lanes  # noqa: B018 - assigns the lanes (done on first use)
        backend = self._backend(plan)
        name = self.name if backend.name == "cuda" else f"{self.name} (emulated)"
        return self._run(plan, backend, name, on_task_done)

    def _groups(self, plan: Any, backend: Any) -> tuple[dict[tuple, list[int]], list[Any]]:
        """The lanes of a run: ``(device, lane) -> task keys in plan order``, and each task's group.

        A plan compiled for more lanes than ``workers`` is folded onto them, and the lanes of one GPU
        onto at most :data:`MAX_GPU_LANES`.  A plan lane with tasks on two devices becomes two
        lanes: a lane thread serves one device for life.  Keys are in plan (topological) order, so a
        lane that waits only ever waits for an earlier task: folding cannot deadlock.
        """
        plan.n_lanes  # noqa: B018 - assigns the lanes (done on first use)
        group: list[Any] = [None] * len(plan.tasks)
        lanes: dict[tuple, list[int]] = {}
        for t in plan.tasks:
            if t.kind == "source":
                continue
            dev = backend.device_key(t)
            lane = t.lane % self.workers if self.workers else t.lane
            if dev is not None:
                lane %= MAX_GPU_LANES
            t.lane = lane
            group[t.key] = g = (dev, lane)
            lanes.setdefault(g, []).append(t.key)
        return lanes, group

    def _run(self, plan: Any, backend: Any, name: str, on_task_done: Any = None) -> Run:
        self.last_checker = backend.checker
        run = _StreamsRun(plan, executor_name=name, on_task_done=on_task_done)
        run.events = [None] * len(plan.tasks)   # each made and recorded by its task's lane
        run.graveyard = []
        run.backend = backend
        host_ready = [threading.Event() for _ in plan.tasks]
        for t in plan.tasks:
            if t.kind == "source":
                host_ready[t.key].set()
        lanes, group = self._groups(plan, backend)
        jobs = []
        try:
            backend.begin(plan.tasks)
            for g, keys in sorted(lanes.items(), key=lambda kv: kv[1][0]):
                ctx = task_context()
                worker = pool.checkout(backend.pool_key(g))
                jobs.append(worker.submit(lambda ctx=ctx, g=g, keys=keys: ctx.run(
                    self._lane, run, backend, g, keys, host_ready, group)))
            for k in plan.outputs:   # the host blocks only for the outputs
                while not host_ready[k].wait(0.1):
                    pass
                ev = run.events[k]
                if run.error is None and backend.name == "cuda" and ev is not None:
                    ev.synchronize()
            run.outputs_ready = backend.name == "cuda" and run.error is None
        except BaseException as e:
            run.abort(e)
            for ev in host_ready:
                ev.set()
            raise
        finally:
            for j in jobs:
                j.join()
            if run.error is None:
                run.drain()
            else:   # GPU work of the run may still read the values it holds: let it finish first
                backend.quiesce(run)
            run.graveyard = []
            if run.error is None:
                backend.timings(run)
        return run

    def _lane(self, run: _StreamsRun, backend: Any, g: tuple, keys: list[int],
              host_ready: list[threading.Event], group: list[Any]) -> None:
        tasks = run.plan.tasks
        checker = backend.checker
        lane = g[1]
        try:
            with backend.lane_context(g):
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
                            cross = group[d] != g
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
                                        checker.read(task, prod, group[d] != g, run.done[d])
                            except StreamOrderError as e:
                                run.claim(k)
                                run.fail(k, e)
                                break
                        inputs = tuple(run.values[d] for d in task.deps)
                        if not run.claim(k):
                            break
                        ok = run.run_task(k, lane=lane, inputs=inputs, before=backend.before_task(task))
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

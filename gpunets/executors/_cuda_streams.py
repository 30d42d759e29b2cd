"""The streams executor's backends: real CUDA streams and events through CuPy, or CPU-emulated streams.

Part of :mod:`gpunets.executors.streams` (see there for the model): the check of the default streams
(``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM``, ``CUDF_PER_THREAD_STREAM``), the race checker of emulated streams,
and :class:`CudaBackend`: a lane per worker thread and device, events recorded after each GPU task, consumers
waiting on the GPU (a CPU consumer on the host, on a blocking event).
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from gpunets.base.exceptions import StreamOrderError
from gpunets.devices import _gpulibs
from gpunets.devices.gpu_memory import ensure_gpu_memory
from gpunets.devices.placement import Device, local_ordinal

__all__ = ["EmulatedBackend", "CudaBackend", "StreamChecker", "MAX_GPU_LANES", "LegacyStreamWarning",
           "check_default_streams", "ISSUER", "blocks_host", "ordinals"]


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

#: The thread key of the thread that issues the non-blocking GPU tasks of a run (one for every GPU).
ISSUER = ("cuda", "issue")

_THREAD = threading.local()    # per worker thread: its streams, made once and kept for the thread's life


def _cupy() -> Any:
    """CuPy (or the fake GPU), imported here only when the CUDA backend is used (tests replace this function)."""
    return _gpulibs.cupy()


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

    def covered(self, consumer: int, producer: int, by: int) -> None:
        """``consumer`` waited on ``by``, a later task of ``producer``'s lane: stream order covers ``producer``."""
        with self.lock:
            if (consumer, by) in self.waited:
                self.waited.add((consumer, producer))
                self.log.append(("covered", consumer, producer))

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
    """CPU-emulated streams: a lane is its worker thread, an event a host-side flag.

    With ``issue=True`` the tasks that are not fits are run by one thread in plan order, as the CUDA
    backend's issuer issues them (so the race checker covers that order too); by default every lane is
    a thread, since on the CPU a task's work is done by the thread that runs it.
    """

    name = "emulated"

    def __init__(self, delays: tuple[float, float] | None = None, seed: int | None = None,
                 check: bool = False, issue: bool = False) -> None:
        self.delays = delays
        self.rng = random.Random(seed)
        self.checker = StreamChecker() if check else None
        self.issue = issue

    def begin(self, tasks: Any) -> None:
        return None

    def device_key(self, task: Any) -> None:
        return None   # every emulated lane is a CPU thread

    def blocks(self, task: Any) -> bool:
        return not self.issue or task.kind == "fit"

    def pool_key(self, thread: tuple) -> tuple:
        return ("cpu", "issue") if thread == ISSUER else ("cpu", thread[1])

    def lane_context(self, thread: tuple) -> Any:
        return _Null()

    def enter(self, task: Any, lane: int) -> None:
        return None

    def done(self, event: _HostEvent | None) -> bool:
        return event is not None and event.flag.is_set()

    def quiesce(self, run: Any) -> None:
        return None

    def timings(self, run: Any) -> None:
        return None

    def finish(self) -> None:
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

    def before_task(self, task: Any = None) -> Callable[[], None] | None:
        if not self.delays:
            return None
        lo, hi = self.delays
        pause = self.rng.uniform(lo, hi)

        def sleep() -> None:
            threading.Event().wait(pause)

        return sleep

    def after_task(self, task: Any) -> None:
        return None


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


def _ordinal(device: str) -> int | None:
    """The CUDA ordinal of a task's device name in this process; None for the CPU."""
    if not device.startswith("cuda"):
        return None
    index = Device.parse(device).index
    assert index is not None   # a CUDA device always has an index
    return local_ordinal(index)


def ordinals(tasks: Any) -> list[int | None]:
    """Each task's CUDA ordinal (None: the CPU), resolved once per plan: one look-up per distinct device name."""
    seen: dict[str, int | None] = {}
    out: list[int | None] = []
    for t in tasks:
        d = str(t.device)
        o = seen.get(d, -1)
        if o == -1:
            o = seen[d] = _ordinal(d)
        out.append(o)
    return out


def blocks_host(task: Any) -> bool:
    """Whether a GPU task blocks its host thread while it runs, so that it needs a lane thread of its own.

    A fit does (a cuML fit synchronises; scikit-learn's array-API fits read the host several times), and so
    does any call of a machine fitted by cuML (its calls are synchronous, on the calling thread's default
    stream).  Everything else a GPU lane runs (array-API predictions and transforms, CuPy operations, the
    combine kernels, moves to the GPU) only issues work: one thread issues it all, in plan order.
    """
    if task.kind == "fit":
        return True
    m = task.machine
    if m is None:
        return False
    st = getattr(m, "_state", None)
    path = getattr(st, "path", None)
    return path == "cuml" or (path is None and "cuml" in sys.modules)


# CuPy module (a test's stand-in gets its own) -> ordinal -> idle events, reused run after run
_EVENTS: weakref.WeakKeyDictionary[Any, dict[int, list[Any]]] = weakref.WeakKeyDictionary()
_EVENTS_LOCK = threading.Lock()


class CudaBackend:
    """Real CUDA streams and events through CuPy (imported only here, only when used).

    Two kinds of host threads issue a run's GPU work:

    * **the issuer** (pool key :data:`ISSUER`), one thread for every GPU: the tasks that do not block
      the host (:func:`blocks_host`), issued in plan order, each on its lane's stream (a non-blocking
      stream per lane and GPU, made once for the thread's life).  One thread issuing means no GIL
      convoy between lane threads (CuPy releases the GIL around every launch);
    * **lane threads** (pool key ``("cuda", ordinal, lane)`` or ``("cpu", lane)``), a worker of one
      device for life: the tasks that block (fits, cuML calls, CPU tasks), each lane on its thread's
      per-thread default stream (``Stream.ptds``, where cuML runs) or, with ``stream="new"``, a
      non-blocking stream made once per thread.

    A task's device and stream are made current only when they change from the previous task of the
    same thread.  Events are recorded only where needed: after a task with a consumer on another
    stream, after a task that read another stream's value (its inputs are freed once it has
    completed: cupy issue 8068) and after the outputs; they come from a per-device pool (blocking,
    no timing) and go back to it when the run ends.  A GPU task waits (GPU-side) on its producers'
    events from other streams; a CPU task waits on the host, since it reads their values there.
    Every stream also waits for an event recorded on the caller's current stream when the run
    started, where the sources were made.  Ordinals are resolved once per plan (:func:`ordinals`).
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
        self.ordinal: list[int | None] = []   # each task's ordinal
        self.tasks: list[Any] = []
        self.taken: list[tuple[tuple[Any, int], Any]] = []   # pooled events this run took: ((cupy, ordinal), event)
        self._local = threading.local()

    # --- set-up ---------------------------------------------------------------------------
    def begin(self, tasks: Any) -> None:
        """In the calling thread: each task's ordinal, then the start events on the caller's current streams."""
        cp = self.cupy
        self.tasks = tasks
        self.ordinal = ordinals(tasks)
        self.ordinals = sorted({o for o in self.ordinal if o is not None})
        ensure_gpu_memory(self.ordinals)   # gn.set_config(gpu_memory=...) made before a GPU was seen
        for o in self.ordinals:
            with cp.cuda.Device(o):
                # blocking: a CPU lane that waits for it on the host sleeps instead of spinning a core
                ev = self._event(o)
                ev.record(cp.cuda.get_current_stream())   # this thread's current stream on this device
                self.start.append(ev)
                if self.timing:
                    t0 = cp.cuda.Event()   # timing on: the zero of this GPU's clock
                    t0.record(cp.cuda.get_current_stream())
                    self.clock[o] = (t0, time.perf_counter())

    def device_key(self, task: Any) -> int | None:
        """The GPU ordinal of a task (its lane's device), None for the CPU."""
        return self.ordinal[task.key]

    def blocks(self, task: Any) -> bool:
        """Whether the task runs on a lane thread of its own (else the issuer issues it)."""
        return self.ordinal[task.key] is None or blocks_host(task)

    def pool_key(self, thread: tuple) -> tuple:
        if thread == ISSUER:
            return ISSUER
        ordinal, lane = thread
        return ("cpu", lane) if ordinal is None else ("cuda", ordinal, lane)

    def lane_context(self, thread: tuple) -> Any:
        """The context of one thread's job in a run: its per-run state reset, its GPU current (lane threads)."""
        loc = self._local
        loc.issuer = thread == ISSUER
        loc.device = None        # the ordinal made current last (None: not set in this run)
        loc.stream = None        # the stream made current last
        loc.lane = None          # the lane of the last GPU task (None: none yet, or a CPU task since)
        loc.started = set()      # ids of the streams that waited for the start events in this run
        loc.start_synced = False
        if not loc.issuer and thread[0] is not None:
            # A lane thread serves one GPU for life (pool key): cuML's per-thread handle, made on the GPU
            # current when it is first used, and CuPy's per-thread handles stay on this GPU.
            self.cupy.cuda.Device(thread[0]).use()
            loc.device = thread[0]
        return _Null()

    # --- per task -------------------------------------------------------------------------
    def enter(self, task: Any, lane: int) -> None:
        """Make the task's GPU and its stream current for this thread, where they changed since its last task.

        A CPU task that reads GPU values (a move to the host, a host-only function) runs with its first
        GPU input's device and this thread's stream on it current: ``cupy.asnumpy(x)`` copies on the
        current stream, which would otherwise be the legacy default stream, a device-wide barrier.
        """
        loc = self._local
        o = self.ordinal[task.key]
        if o is not None and o == loc.device and lane == loc.lane:   # as the thread's last task
            return
        if o is None:
            ordinal = self.ordinal
            o = next((p for d in task.deps if (p := ordinal[d]) is not None), None)
            if o is None:
                return
        cp = self.cupy
        if o != loc.device:
            cp.cuda.Device(o).use()
            loc.device = o
        s = self._stream(o, lane)
        if s is not loc.stream:
            s.use()
            loc.stream = s
        loc.lane = lane if self.ordinal[task.key] is not None else None

    def _stream(self, ordinal: int, lane: int) -> Any:
        """This thread's stream for ``lane`` on GPU ``ordinal`` (current); the first use in a run waits for its start."""
        cp = self.cupy
        loc = self._local
        if loc.issuer or self.kind == "new":   # made once per thread, device (and issuer lane), kept for life
            by_module = getattr(_THREAD, "streams", None)
            if by_module is None:
                by_module = _THREAD.streams = weakref.WeakKeyDictionary()
            made = by_module.setdefault(cp, {})   # per CuPy module: a test's stand-in gets its own
            key = (ordinal, lane if loc.issuer else -1)
            s = made.get(key)
            if s is None:
                s = made[key] = cp.cuda.Stream(non_blocking=True)
        else:
            s = cp.cuda.Stream.ptds
        if id(s) not in loc.started:
            loc.started.add(id(s))
            for ev in self.start:   # an event may be waited on by a stream of another device
                s.wait_event(ev)
                if self.kind == "new" and not loc.issuer:
                    cp.cuda.Stream.ptds.wait_event(ev)
        return s

    def _event(self, ordinal: int) -> Any:
        """An idle event of GPU ``ordinal`` from the pool (made, blocking and untimed, when none is idle)."""
        key = (self.cupy, ordinal)
        with _EVENTS_LOCK:
            idle = _EVENTS.get(self.cupy, {}).get(ordinal)
            ev = idle.pop() if idle else None
        if ev is None:
            # GPU consumers wait for it on the GPU (Stream.wait_event); a CPU consumer waits on the host, and a
            # blocking event lets that thread sleep instead of spinning a core (cudaEventBlockingSync)
            ev = self.cupy.cuda.Event(block=True, disable_timing=True)
        self.taken.append((key, ev))
        return ev

    def finish(self) -> None:
        """After the run (its events complete or never waited on again): the pooled events go back."""
        taken, self.taken = self.taken, []
        with _EVENTS_LOCK:
            for (cp, ordinal), ev in taken:
                _EVENTS.setdefault(cp, {}).setdefault(ordinal, []).append(ev)

    def done(self, event: Any) -> bool:
        if event is None:  # not recorded yet (cudaEventQuery would say cudaSuccess for it)
            return False
        if isinstance(event, _HostEvent):
            return event.flag.is_set()
        return event.done   # CuPy's Event: .done is cudaEventQuery; it has no .query()

    def record(self, task: Any) -> Any:
        """An event recorded on the current stream, after the task's work.

        A CPU task's value is host data, ready when the task returns: its event is a host flag (an
        event recorded on the legacy default stream would be a device-wide barrier).
        """
        o = self.ordinal[task.key]
        if o is None:
            host = _HostEvent()
            host.flag.set()
            return host
        cp = self.cupy
        if self.kind == "new" and not self._local.issuer:
            # cuML runs on the per-thread default stream whatever CuPy's current stream is: join it in
            cp.cuda.get_current_stream().wait_event(cp.cuda.Stream.ptds.record(self._event(o)))
        ev = self._event(o)
        ev.record(cp.cuda.get_current_stream())
        return ev

    def wait(self, event: Any, consumer: Any, producer: Any, cross_lane: bool) -> None:
        """Order ``consumer`` after ``producer``'s event (called with the consumer's stream current)."""
        if event is None or isinstance(event, _HostEvent):  # a CPU task's value: on the host, and ready
            return
        ordinal = self.ordinal
        mine = ordinal[consumer.key]
        if mine is None:    # a CPU task reads its inputs on the host
            event.synchronize()
            return
        cp = self.cupy
        if cross_lane or ordinal[producer.key] != mine:   # else: the same stream, in issue order
            cp.cuda.get_current_stream().wait_event(event)
        if self.kind == "new" and not self._local.issuer:  # cuML's work goes to the per-thread default stream
            cp.cuda.Stream.ptds.wait_event(event)

    def wait_source(self, consumer: Any, source: Any) -> None:
        """A CPU task reading a GPU source waits on the host for the start events (once per lane)."""
        ordinal = self.ordinal
        if ordinal[consumer.key] is None and ordinal[source.key] is not None and not self._local.start_synced:
            for ev in self.start:
                ev.synchronize()
            self._local.start_synced = True

    def before_task(self, task: Any = None) -> Callable[[], None] | None:
        """With timing on, a GPU task records a timed event on its stream just before its work is issued."""
        if not self.timing or task is None or (o := self.ordinal[task.key]) is None:
            return None
        cp = self.cupy

        def start() -> None:
            ev = cp.cuda.Event()
            ev.record(cp.cuda.get_current_stream())
            self.timed[task.key] = [o, ev]

        return start

    def after_task(self, task: Any) -> None:
        """With timing on, a timed event on the task's stream just after its work (its GPU span's end)."""
        if self.timing and task.key in self.timed:
            end = self.cupy.cuda.Event()
            end.record(self.cupy.cuda.get_current_stream())
            self.timed[task.key].append(end)

    # --- after the run --------------------------------------------------------------------
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

    def quiesce(self, run: Any) -> None:
        """After a failed run: wait until no kernel of the run can still read a value, before any is freed.

        A failed task may have issued work without recording its event, and lanes stopped early leave
        values their readers never finished with: synchronize every GPU the run used.
        """
        cp = self.cupy
        for o in self.ordinals:
            cp.cuda.Device(o).synchronize()

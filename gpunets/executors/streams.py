"""Streams: the plan's lanes as CUDA streams; on a GPU one thread issues, lane threads only for what blocks.

The plan's lanes (GrCUDA's policy, see :mod:`gpunets.planning.plan`) become streams.
A stream runs its work in issue order, so an edge inside a lane needs nothing.
An edge between lanes is an event: the producer's thread records it after the
producer, the consumer's thread waits on it before the consumer (on a GPU
``stream.wait_event``: the GPU waits, the host does not).

* **On a GPU** the tasks that only issue work (array-API predictions and
  transforms, CuPy operations, the combine kernels) are issued in plan order by
  **one thread**, each onto its lane's stream (a non-blocking stream per lane):
  Python issues a CuPy kernel every 15-33 us and CuPy releases the GIL around
  every launch, so several issuing threads only take the GIL from each other.
  Tasks that block the host (fits, cuML calls, CPU tasks) run on a **lane
  thread** of their own, on its per-thread default stream
  (``cupy.cuda.Stream.ptds``, where cuML runs its work) or, with
  ``stream="new"``, a non-blocking stream.  Events (blocking, untimed, from a
  per-device pool) are recorded only after a task with a consumer on another
  stream, after a task that read another stream's value, and after the outputs.
  A value handed to another stream is kept alive until the consumer's own
  event has completed (CuPy's pool may otherwise reuse its memory too early:
  cupy issue 8068).  The host blocks only on the outputs' events.
* **Without a GPU** (or with ``emulate=True``) the same executor runs on
  CPU-emulated streams: a lane is its worker thread (with ``issuer=True`` the
  non-fit tasks go to one thread, as on a GPU), an event is a host-side
  flag.  ``delays=(lo, hi)`` sleeps a random time before each task, and
  ``check=True`` records every record/wait/read and raises
  :class:`gpunets.StreamOrderError` when a value is read before its producer
  finished or a cross-lane edge was read without a wait.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from gpunets.base.exceptions import StreamOrderError
from gpunets.compute.estimators import sklearn_config
from gpunets.devices.placement import gpu_available
from gpunets.executors import pool
from gpunets.executors._args import check_callable, check_delays, check_flag, check_optional_flag, check_seed
from gpunets.executors.base import Executor, gpu_timing_requested, task_context
from gpunets.executors.scheduler import Run

__all__ = ["StreamsExecutor", "EmulatedBackend", "CudaBackend", "StreamChecker", "wants_cuda", "run_on_cuda",
           "MAX_GPU_LANES", "LegacyStreamWarning", "check_default_streams"]


from gpunets.executors._cuda_streams import (
    ISSUER,
    MAX_GPU_LANES,
    CudaBackend,
    EmulatedBackend,
    LegacyStreamWarning,
    StreamChecker,
    check_default_streams,
)


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
    return ex._run(plan, CudaBackend(ex.stream, timing=_timing(plan)), name, on_task_done)


def _timing(plan: Any) -> bool:
    """Whether a run times its GPU tasks with CUDA events: inside ``gn.evaluate(..., trace=True)``, and every fit
    (its report shows the GPU-busy fraction; a fit's GPU work is long next to two timed events)."""
    return gpu_timing_requested() or plan.kind == "fit"


class _StreamsRun(Run):
    """A run whose released values wait for their cross-stream consumers' events (cupy issue 8068).

    A value read only on the stream that made it is dropped at once (CuPy's pool reuses its memory in
    that stream's order).  A value read on another stream goes to the graveyard and is dropped once
    each of those consumers has recorded its event *and* that event has completed.  The graveyard is
    indexed by the consumers still pending (``waiting[c]``: the values that wait for consumer ``c``;
    ``pending[k]``: how many consumers value ``k`` still waits for), and the recorded events are
    checked oldest first, stopping at the first one not complete: each release and each record costs
    O(1) amortised, so a node with N inputs costs O(N), not O(N^2).  An event that was never recorded
    is not "done" here (CUDA's ``cudaEventQuery`` says ``cudaSuccess`` for it).
    """

    events: list[Any]
    backend: Any
    cross_readers: list[tuple[int, ...]]   # per task: its consumers on another stream
    waiting: dict[int, list[int]]          # consumer -> values waiting for its event to complete
    pending: dict[int, int]                # value -> consumers it still waits for
    fifo: collections.deque[int]           # consumers whose event is recorded, not yet seen complete
    seen_done: list[bool]                  # per task: its event is known to have completed

    def release(self, key: int) -> None:   # called under self.lock
        if self.plan.tasks[key].kind == "source":
            return
        seen_done, waiting, n = self.seen_done, self.waiting, 0
        for c in self.cross_readers[key]:
            if not seen_done[c]:
                waiting.setdefault(c, []).append(key)
                n += 1
        if n:
            self.pending[key] = n
            self._sweep()
        else:
            self.values[key] = None

    def _sweep(self) -> None:
        fifo, events, done = self.fifo, self.events, self.backend.done
        while fifo and done(events[fifo[0]]):
            c = fifo.popleft()
            self.seen_done[c] = True
            for k in self.waiting.pop(c, ()):
                self.pending[k] -= 1
                if self.pending[k] == 0:
                    del self.pending[k]
                    self.values[k] = None

    def recorded(self, key: int, event: Any) -> None:
        """Task ``key``'s event is recorded (before its lane tells the others)."""
        with self.lock:
            self.events[key] = event
            self.fifo.append(key)
            if self.pending:
                self._sweep()

    def drain(self) -> None:
        """At the end of the run: wait for the consumers of what is left in the graveyard, then drop it."""
        for c in self.waiting:
            ev = self.events[c]
            if ev is not None:
                ev.synchronize()
        self.clear_graveyard()

    def clear_graveyard(self) -> None:
        for k in self.pending:
            self.values[k] = None
        self.pending, self.waiting = {}, {}
        self.fifo.clear()


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
        ran it (``issued`` keeps the host issue time) and the trace its GPU-busy fraction.  Default: on
        inside ``gn.evaluate(..., trace=True)`` and for fits, else off (timed events cost a little).
    skip_wait : callable, optional
        Testing only: ``skip_wait(consumer_task, producer_task) -> bool`` drops
        that cross-lane wait, to show that the checker catches a missing dependency.
    issuer : bool, optional
        One thread issues the tasks that do not block the host, in plan order, each onto its lane's
        stream; only tasks that block (fits, cuML calls, CPU tasks) get a lane thread.  Default
        (None): on a GPU yes, emulated no (on the CPU a task's work is its thread's); ``True``
        also emulates it (the race checker then checks that order), ``False`` turns it off.

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
                 timing: bool | None = None, issuer: bool | None = None) -> None:
        owner = "StreamsExecutor"
        check_optional_flag("emulate", emulate, owner, "emulate only where no GPU is used")
        delays = check_delays(delays, owner)
        check_seed(seed, owner)
        check_flag("check", check, owner)
        check_callable("skip_wait", skip_wait, owner, "skip_wait(consumer_task, producer_task) -> bool")
        check_optional_flag("timing", timing, owner, "time GPU tasks only when the run is traced")
        check_optional_flag("issuer", issuer, owner, "one issuing thread on a GPU, none when emulated")
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
        self.issuer = issuer
        self.last_layout: _Layout | None = None
        self.last_checker: StreamChecker | None = None

    def _backend(self, plan: Any) -> Any:
        on_gpu = any(str(t.device).startswith("cuda") for t in plan.tasks)
        if self.emulate or (self.emulate is None and not (on_gpu and gpu_available())):
            return EmulatedBackend(self.delays, self.seed, self.check, issue=bool(self.issuer))
        timing = _timing(plan) if self.timing is None else self.timing
        return CudaBackend(self.stream, timing=timing)

    def run(self, plan: Any, on_task_done: Any = None) -> Run:
        plan.n_lanes  # noqa: B018 - assigns the lanes (done on first use)
        backend = self._backend(plan)
        name = self.name if backend.name == "cuda" else f"{self.name} (emulated)"
        return self._run(plan, backend, name, on_task_done)

    def _issues(self, backend: Any) -> bool:
        """Whether the run has an issuing thread: on a GPU unless ``issuer=False`` (or classic cuDF, whose
        legacy-stream work non-blocking streams would not be ordered with); emulated only with ``issuer=True``."""
        if backend.name != "cuda":
            return bool(self.issuer)
        if self.issuer is False:
            return False
        return not ("cudf" in sys.modules and os.environ.get("CUDF_PER_THREAD_STREAM") != "1")

    def _groups(self, plan: Any, backend: Any, issue: bool) -> _Layout:
        """The streams and threads of a run (see :class:`_Layout`).

        A plan compiled for more lanes than ``workers`` is folded onto them, and the lanes of one GPU
        onto at most :data:`MAX_GPU_LANES`.  A plan lane with tasks on two devices becomes two
        lanes: a lane thread serves one device for life.  Keys are in plan (topological) order, so a
        thread that waits only ever waits for an earlier task: folding cannot deadlock.
        """
        plan.n_lanes  # noqa: B018 - assigns the lanes (done on first use)
        tasks = plan.tasks
        n = len(tasks)
        group: list[Any] = [None] * n
        thread: list[Any] = [None] * n
        threads: dict[tuple, list[int]] = {}
        workers = self.workers
        lanes: list[Any] = [None] * n
        gpu_lanes = set()
        for t in tasks:
            if t.kind == "source":
                continue
            dev = backend.device_key(t)
            lane = t.lane % workers if workers else t.lane
            if dev is not None:
                lane %= MAX_GPU_LANES
                gpu_lanes.add((dev, lane))
            t.lane = lane
            lanes[t.key] = (dev, lane)
        # one stream per GPU (serial, or a chain) has no lane threads to keep from taking the GIL from each
        # other: its tasks stay on one lane thread, with no hand-over between the issuer and a fit's thread
        issue = issue and (len(gpu_lanes) > 1 or backend.name != "cuda")
        for t in tasks:
            if t.kind == "source":
                continue
            dev, lane = lanes[t.key]
            issued = issue and not backend.blocks(t)
            group[t.key] = (dev, lane, issued)
            thread[t.key] = th = ISSUER if issued else (dev, lane)
            threads.setdefault(th, []).append(t.key)
        outputs = set(plan.outputs)
        consumers = plan.consumers
        cross_readers: list[tuple[int, ...]] = [()] * n
        needs_event = [False] * n
        host_ready: dict[int, threading.Event] = {}
        waits: list[tuple[int, ...]] = [()] * n
        covered: list[tuple[tuple[int, int], ...]] = [()] * n
        sources: list[tuple[int, ...]] = [()] * n
        for t in tasks:
            k = t.key
            if t.kind == "source":
                continue
            g = group[k]
            cross_readers[k] = tuple(c for c in consumers[k] if group[c] != g)
            if k in outputs:
                needs_event[k] = True
            th = thread[k]
            latest: dict[Any, int] = {}   # producer stream -> its last task this one reads (stream order covers the rest)
            for d in t.deps:
                gd = group[d]
                if gd is None:
                    sources[k] += (d,)
                elif gd != g and d > latest.get(gd, -1):
                    latest[gd] = d
            if not latest:
                continue
            needs_event[k] = True   # its inputs from other streams are freed once it has completed
            waits[k] = tuple(sorted(latest.values()))
            for d in waits[k]:
                needs_event[d] = True
                if thread[d] != th:
                    host_ready.setdefault(d, threading.Event())
            covered[k] = tuple((d, latest[group[d]]) for d in t.deps
                               if group[d] is not None and group[d] != g and latest[group[d]] != d)
        return _Layout(group, thread, threads, cross_readers, needs_event, host_ready, waits, covered, sources)

    def _run(self, plan: Any, backend: Any, name: str, on_task_done: Any = None) -> Run:
        self.last_checker = backend.checker
        run = _StreamsRun(plan, executor_name=name, on_task_done=on_task_done)
        run.events = [None] * len(plan.tasks)   # each recorded by its task's thread, where one is needed
        run.backend = backend
        run.waiting, run.pending, run.fifo = {}, {}, collections.deque()
        run.seen_done = [False] * len(plan.tasks)
        jobs = []
        layout: _Layout | None = None
        try:
            backend.begin(plan.tasks)
            layout = self._groups(plan, backend, self._issues(backend))
            run.cross_readers = layout.cross_readers
            self.last_layout = layout
            for th, keys in sorted(layout.threads.items(), key=lambda kv: kv[1][0]):
                ctx = task_context()
                worker = pool.checkout(backend.pool_key(th))
                jobs.append(worker.submit(partial(ctx.run, self._lane, run, backend, th, keys, layout)))
            for j in jobs:   # the host blocks only for the outputs (waking regularly, so Ctrl-C is seen)
                while not j.join(0.1):
                    pass
            if run.error is None and backend.name == "cuda":
                for k in plan.outputs:
                    ev = run.events[k]
                    if ev is not None:
                        ev.synchronize()
            run.outputs_ready = backend.name == "cuda" and run.error is None
        except BaseException as e:
            run.abort(e)
            if layout is not None:
                for ev in layout.host_ready.values():
                    ev.set()
            raise
        finally:
            for j in jobs:
                j.join()
            if run.error is None:
                run.drain()
            else:   # GPU work of the run may still read the values it holds: let it finish first
                backend.quiesce(run)
            run.clear_graveyard()
            if run.error is None:
                backend.timings(run)
            backend.finish()
        return run

    def _lane(self, run: _StreamsRun, backend: Any, th: tuple, keys: list[int], layout: _Layout) -> None:
        """One thread's job: its tasks in plan order (a lane thread's lane, or every issued task)."""
        if run.sklearn_config:   # the caller's scikit-learn configuration, once for the whole loop
            with sklearn_config(run.sklearn_config):
                self._lane_loop(run, backend, th, keys, layout)
        else:
            self._lane_loop(run, backend, th, keys, layout)

    def _lane_loop(self, run: _StreamsRun, backend: Any, th: tuple, keys: list[int], layout: _Layout) -> None:
        tasks = run.plan.tasks
        checker = backend.checker
        group, thread, needs_event, host_ready = layout.group, layout.thread, layout.needs_event, layout.host_ready
        waits, covered, sources = layout.waits, layout.covered, layout.sources
        flags = layout.flags
        events, vals = run.events, run.values
        skip_wait = self.skip_wait
        enter = backend.enter
        # timing or delays: a call before and after each task; else none
        hooks = bool(getattr(backend, "timing", False) or backend.delays)
        before_task, after_task = backend.before_task, backend.after_task
        last_g: Any = None
        record, t0, perf = run.trace.add, run.t0, time.perf_counter
        name = threading.current_thread().name
        try:
            with backend.lane_context(th):
                for k in keys:
                    if run.error is not None:
                        break
                    task = tasks[k]
                    g = group[k]
                    lane = g[1]
                    if g != last_g or g[0] is None:   # the task's GPU and stream current: its waits go there
                        enter(task, lane)
                        last_g = g
                    for d in sources[k]:
                        backend.wait_source(task, tasks[d])
                    # the last task this one reads from each other stream: stream order covers the earlier ones
                    for d in waits[k]:
                        prod = tasks[d]
                        if skip_wait is not None and skip_wait(task, prod):
                            continue
                        if thread[d] != th:
                            host_ready[d].wait()   # its event is recorded (waiting on an unrecorded one is a no-op)
                            if run.error is not None:
                                break
                        backend.wait(events[d], task, prod, True)
                    if run.error is not None:
                        break
                    if checker is not None:
                        for d, by in covered[k]:
                            checker.covered(k, d, by)
                        try:
                            for d in task.deps:
                                if group[d] is not None:
                                    checker.read(task, tasks[d], group[d] != g, run.done[d])
                        except StreamOrderError as e:
                            run.claim(k)
                            run.fail(k, e)
                            break
                    if not run.claim(k):
                        break
                    inputs = [vals[d] for d in task.deps]
                    before = before_task(task) if hooks else None
                    fn = task.fn
                    assert fn is not None   # only source tasks have no function, and they never run
                    start = perf()
                    try:
                        if before is not None:
                            before()
                        value = fn(*inputs)
                    except BaseException as e:  # noqa: BLE001 - re-raised by raise_error
                        record(task, lane, start - t0, perf() - t0, name, None, True)
                        run.fail(k, e)
                        ok = False
                    else:
                        record(task, lane, start - t0, perf() - t0, name, None, False)
                        run.complete(k, value)
                        ok = True
                        if hooks:
                            after_task(task)
                        if needs_event[k]:
                            run.recorded(k, backend.record(task))
                    del inputs
                    flag = flags[k]
                    if flag is not None:
                        flag.set()
                    if not ok:
                        break
        except BaseException as e:  # noqa: BLE001 - e.g. a CUDA error recording an event: the run fails with it
            run.abort(e)
        finally:
            if run.error is not None:  # wake every thread waiting on this one
                for ev in host_ready.values():
                    ev.set()


class _Layout:
    """Where each task of a run goes: its stream (``group[k] = (ordinal, lane, issued)``), its thread
    (``thread[k]``: :data:`ISSUER` or ``(ordinal, lane)``), each thread's tasks in plan order, each task's
    consumers on another stream, whether it records an event, the host flags of the tasks that a
    task on another thread reads, and what each task waits for: from each other stream, only the last
    task it reads there (``waits``; the earlier ones, ``covered``, are ordered before it on their stream),
    and its sources (``sources``)."""

    __slots__ = ("group", "thread", "threads", "cross_readers", "needs_event", "host_ready", "flags", "waits",
                 "covered", "sources")

    def __init__(self, group: list[Any], thread: list[Any], threads: dict[tuple, list[int]],
                 cross_readers: list[tuple[int, ...]], needs_event: list[bool],
                 host_ready: dict[int, threading.Event], waits: list[tuple[int, ...]],
                 covered: list[tuple[tuple[int, int], ...]], sources: list[tuple[int, ...]]) -> None:
        self.group, self.thread, self.threads = group, thread, threads
        self.cross_readers, self.needs_event, self.host_ready = cross_readers, needs_event, host_ready
        self.waits, self.covered, self.sources = waits, covered, sources
        self.flags: list[threading.Event | None] = [None] * len(group)   # host_ready as a list, by task key
        for k, ev in host_ready.items():
            self.flags[k] = ev

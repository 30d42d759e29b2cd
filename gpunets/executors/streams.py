"""One worker thread per lane; on a GPU each lane is a CUDA stream.

The plan's lanes (GrCUDA's policy, see :mod:`gpunets.planning.plan`) become streams.
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

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from gpunets.base.exceptions import StreamOrderError
from gpunets.devices.placement import gpu_available
from gpunets.executors import pool
from gpunets.executors._args import check_callable, check_delays, check_flag, check_optional_flag, check_seed
from gpunets.executors.base import Executor, gpu_timing_requested, task_context
from gpunets.executors.scheduler import Run

__all__ = ["StreamsExecutor", "EmulatedBackend", "CudaBackend", "StreamChecker", "wants_cuda", "run_on_cuda",
           "MAX_GPU_LANES", "LegacyStreamWarning", "check_default_streams"]


from gpunets.executors._cuda_streams import (
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
    return ex._run(plan, CudaBackend(ex.stream, timing=gpu_timing_requested()), name, on_task_done)


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
                jobs.append(worker.submit(partial(ctx.run, self._lane, run, backend, g, keys, host_ready, group)))
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

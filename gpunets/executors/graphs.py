"""Graph mode: a fitted network called again with inputs of the same shapes replays captured CUDA graphs.

Python issues a CuPy kernel every 15-33 us; a replayed CUDA graph issues thousands in one launch.  With
``gn.config(graphs=True)`` (or ``node(X, graphs=True)``) a call of a fitted network on a GPU goes through
:func:`run_graphs` instead of its executor:

1. **the first call** with new input shapes tries each GPU task in a capture of its own, on a non-blocking
   stream, and launches it (its result is this call's): a task CuPy refuses during a capture (cuBLAS,
   cuSOLVER, cuRAND: ``Ridge.predict``, ``PCA.transform``), or one that reads the host or synchronises (which
   invalidates the capture), runs eagerly instead.  The verdict is cached per (node, state, input shapes);
2. **the second call** captures each *segment* (consecutive capturable GPU tasks in plan order) as one CUDA
   graph, under a private memory pool (``cupy.cuda.using_allocator``), its independent branches forked onto
   side streams and joined by events, its outside inputs read from static buffers; then launches it;
3. **later calls** copy their inputs into the static buffers, launch each segment's graph, run the eager
   tasks between them, and copy the values others read out of the graph's buffers.

The cache key is the plan (its tasks, their fitted states and devices), the input shapes, dtypes and
devices, and scikit-learn's configuration; an entry whose machines were refitted since is dropped at the next
call (a replay in progress finishes on the old state it holds).  Each entry has a lock: a second caller
while it replays runs eagerly on its executor.  The run's trace says what happened (``trace.graphs``).

Graph mode applies to calls (not fits) on one GPU, in this process (not on ``dask``); elsewhere it is a no-op
that the trace states in one line.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from gpunets.compute.estimators import sklearn_config
from gpunets.devices import _gpulibs
from gpunets.devices.gpu_memory import ensure_gpu_memory
from gpunets.devices.placement import gpu_available
from gpunets.executors._capture import (
    VERDICTS,
    Entry,
    NotStatic,
    Segment,
    copy_out,
    meta,
    reason_of,
    remember,
    run_trial,
    state_of,
    uncapturable,
    verdict_key,
)
from gpunets.executors._cuda_streams import ordinals
from gpunets.executors.base import inside_task, task_context
from gpunets.executors.scheduler import Run

__all__ = ["run_graphs", "GraphReport", "clear", "entries", "MAX_ENTRIES"]

#: The most plans (with their input shapes) whose graphs are kept; the least recently used go first.
MAX_ENTRIES = 32

_CACHE: collections.OrderedDict[tuple, Entry] = collections.OrderedDict()
_LOCK = threading.Lock()


@dataclass
class GraphReport:
    """What graph mode did in one call: ``mode`` is ``"replay"``, ``"capture"`` (segments captured, then
    launched), ``"trial"`` (the first call: each task tried alone), ``"busy"`` (another caller was replaying:
    eager) or ``"off"`` (not applicable: ``note`` says why)."""

    mode: str
    segments: list[list[str]] = field(default_factory=list)
    eager: list[tuple[str, str]] = field(default_factory=list)
    note: str = ""
    held_bytes: int = 0

    def lines(self) -> list[str]:
        if self.mode in ("off", "busy"):
            return [f"graphs: {self.note}"]
        what = {"replay": "replayed", "capture": "captured and launched", "trial": "tried alone, captured"}
        n = sum(len(s) for s in self.segments)
        out = [f"graphs: {what[self.mode]} {len(self.segments)} segment(s) ({n} task(s)); "
               f"{len(self.eager)} task(s) eager; {self.held_bytes:,} bytes held in the graphs' pool"]
        out += [f"  graph {i}: {', '.join(s)}" for i, s in enumerate(self.segments)]
        out += [f"  eager {label}: {why}" for label, why in self.eager]
        if self.note:
            out.append(f"  {self.note}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def clear() -> None:
    """Drop every captured graph (and the memory its pool holds)."""
    with _LOCK:
        _CACHE.clear()
        VERDICTS.clear()


def entries() -> int:
    """How many plans have captured graphs now."""
    with _LOCK:
        return len(_CACHE)


def _off(plan: Any, executor: Any) -> str | None:
    """Why graph mode does not apply to ``plan`` (None: it does)."""
    if inside_task():
        return "graphs=True does nothing inside another run's task (a nested network): it ran eagerly."
    if plan.kind != "call" or any(t.kind == "fit" for t in plan.tasks):
        return "graphs=True applies to calls of fitted networks; this run fits, so it ran eagerly."
    gpus = {o for o in ordinals(plan.tasks) if o is not None}
    if not gpus or not gpu_available():
        return "graphs=True does nothing here: no task of this call runs on a GPU (the CPU runs it eagerly)."
    if len(gpus) > 1:
        return "graphs=True captures calls on one GPU; this one spans several, so it ran eagerly."
    if getattr(executor, "name", "") == "dask":
        return "graphs=True does nothing on dask (tasks run in worker processes); it ran eagerly."
    return None


def _key(plan: Any, config: Any) -> tuple:
    import sklearn  # lazy: scikit-learn's configuration is part of the key, read per call

    parts = []
    for t in plan.tasks:
        node = t.node._uid if t.node is not None else t.label
        head = (t.kind, node, t.device, t.deps, id(state_of(t)))
        parts.append(head + (meta(t.value),) if t.kind == "source" else head)
    skl = tuple(sorted((k, repr(v)) for k, v in sklearn.get_config().items()))
    return (tuple(parts), tuple(plan.outputs), skl, repr(sorted((config or {}).items())))


def _states(plan: Any) -> list[tuple[Any, Any]]:
    out = []
    for t in plan.tasks:
        st = state_of(t)
        if st is not None and t.machine is not None:
            out.append((t.machine, st))
    return out


def _lookup(key: tuple) -> Entry | None:
    with _LOCK:
        for k in [k for k, e in _CACHE.items() if e.stale()]:   # a machine upstream refitted: drop its graphs
            del _CACHE[k]
        e = _CACHE.get(key)
        if e is not None:
            _CACHE.move_to_end(key)
        return e


def _store(key: tuple, entry: Entry) -> None:
    with _LOCK:
        _CACHE[key] = entry
        while len(_CACHE) > MAX_ENTRIES:
            _CACHE.popitem(last=False)


def run_graphs(plan: Any, executor: Any) -> Run:
    """Run the call ``plan`` in graph mode (see the module); ``executor`` runs it where graph mode does not
    apply, and when another caller is replaying the same graphs."""
    why = _off(plan, executor)
    if why is not None:
        run = executor.run(plan)
        run.trace.graphs = GraphReport("off", note=why)
        return run
    cp = _gpulibs.cupy()
    plan.n_lanes  # noqa: B018 - assigns the lanes: independent branches go to side streams in a capture
    ordinal = next(o for o in ordinals(plan.tasks) if o is not None)
    ensure_gpu_memory([ordinal])   # gn.set_config(gpu_memory=...) made before a GPU was seen, as the executors do
    run = Run(plan, executor_name="graphs")
    key = _key(plan, run.sklearn_config)
    entry = _lookup(key)
    if entry is not None and not entry.lock.acquire(blocking=False):
        run = executor.run(plan)
        run.trace.graphs = GraphReport("busy", note="another caller was replaying these graphs: ran eagerly.")
        return run
    if entry is None:
        entry = Entry(cp, ordinal, _states(plan))
        entry.lock.acquire()
        mode = "trial"
    else:
        mode = "capture" if any(isinstance(st, Segment) and st.graph is None for st in entry.steps) else "replay"
    try:   # the tasks run marked as inside a task, as on the executors (a nested network runs eagerly)
        report = task_context().run(_go, entry, plan, run, cp, mode)
        if mode == "trial" and run.error is None:
            _store(key, entry)
    finally:
        entry.lock.release()
    report.held_bytes = entry.held_bytes()
    run.trace.graphs = report
    return run


def _go(entry: Entry, plan: Any, run: Run, cp: Any, mode: str) -> GraphReport:
    with _context(entry, run):
        report = _trial(entry, plan, run, cp) if mode == "trial" else _steps(entry, plan, run, cp, mode)
        if run.error is None:   # the outputs complete before the caller reads them, on any stream
            done = entry.stream.record(cp.cuda.Event(block=True, disable_timing=True))
            done.synchronize()
            run.outputs_ready = True
    return report


@contextlib.contextmanager
def _context(entry: Entry, run: Run) -> Any:
    """The entry's GPU and stream current (after the caller's current stream: the sources were made there),
    under the caller's scikit-learn configuration."""
    cp = entry.cp
    with cp.cuda.Device(entry.ordinal):
        caller = cp.cuda.get_current_stream()
        entry.stream.wait_event(caller.record(cp.cuda.Event(disable_timing=True)))
        with entry.stream, sklearn_config(run.sklearn_config):
            yield


def _eager(run: Run, k: int) -> bool:
    if not run.claim(k):
        return False
    return run.run_task(k, configured=True)


def _trial(entry: Entry, plan: Any, run: Run, cp: Any) -> GraphReport:
    """The first call: each GPU task captured alone and launched, or run eagerly; verdicts cached."""
    gpu = ordinals(plan.tasks)
    report = GraphReport("trial", note="first call with these shapes: verdicts cached; the next call captures "
                                       "the segments")
    segments: list[list[int]] = []
    current: list[int] = []
    verdicts: dict[int, str | None] = {}
    for t in plan.tasks:
        if t.kind == "source":
            continue
        k = t.key
        inputs = [run.values[d] for d in t.deps]
        why: str | None = "a CPU task"
        if gpu[k] is not None:
            vk = verdict_key(t, inputs)
            why = VERDICTS.get(vk) or uncapturable(t)
        if gpu[k] is not None and why is None:
            if not run.claim(k):
                break
            start = run.t0
            t0 = time.perf_counter()
            value, why = run_trial(t, inputs, entry.stream, entry.pool, cp)
            remember(vk, why)
            if why is None:
                run.trace.add(t, "graph", t0 - start, time.perf_counter() - start, threading.current_thread().name, None)
                run.complete(k, value)
                current.append(k)
                verdicts[k] = None
                continue
            with run.lock:
                run.n_running -= 1   # claimed for the trial; the eager run claims it again
        verdicts[k] = why
        if current:
            segments.append(current)
            current = []
        report.eager.append((t.label, why or "not capturable"))
        if not _eager(run, k):
            break
    if current:
        segments.append(current)
    entry.steps = _plan_steps(plan, verdicts)
    report.segments = [[plan.tasks[k].label for k in s] for s in segments]
    return report


def _plan_steps(plan: Any, verdicts: dict[int, str | None]) -> list[Any]:
    """The entry's steps from the trial's verdicts: segments of capturable GPU tasks, eager tasks between."""
    steps: list[Any] = []
    current: list[int] = []
    for t in plan.tasks:
        if t.kind == "source":
            continue
        why = verdicts.get(t.key, "not run (the trial call failed before it)")
        if why is None:
            current.append(t.key)
            continue
        if current:
            steps.append(Segment(current, plan))
            current = []
        steps.append((t.key, why))
    if current:
        steps.append(Segment(current, plan))
    return steps


def _steps(entry: Entry, plan: Any, run: Run, cp: Any, mode: str) -> GraphReport:
    """Run the entry's steps: eager tasks, and segments captured (first time) or replayed."""
    report = GraphReport(mode)
    refused: dict[int, list[Any]] = {}   # segments CuPy refused as a whole: eager from the next call on too
    try:
        _run_steps(entry, plan, run, cp, report, refused)
    finally:
        if refused:
            entry.steps = [s for i, st in enumerate(entry.steps) for s in refused.get(i, [st])]
    entry.replays += mode == "replay"
    return report


def _run_steps(entry: Entry, plan: Any, run: Run, cp: Any, report: GraphReport, refused: dict[int, Any]) -> None:
    name = threading.current_thread().name
    for i, step in enumerate(entry.steps):
        if isinstance(step, tuple):
            k, why = step
            report.eager.append((plan.tasks[k].label, why))
            if not _eager(run, k):
                return
            continue
        seg: Segment = step
        t0 = time.perf_counter()
        why = None
        try:
            if seg.graph is None:
                try:
                    entry.capture(seg, plan, run.values)
                except Exception as e:  # noqa: BLE001 - CuPy refused the segment as a whole: eager from now on
                    why = f"its segment's capture failed ({reason_of(e)})"
                    refused[i] = [(k, why) for k in seg.keys]
            if why is None:
                why = entry.launch(seg, run.values)
        except NotStatic as e:
            why = reason_of(e)
        if why is not None:   # never a replay on the wrong buffers: this segment runs eagerly this time
            for k in seg.keys:
                report.eager.append((plan.tasks[k].label, why))
                if not _eager(run, k):
                    return
            continue
        t1 = time.perf_counter()
        report.segments.append(seg.labels(plan))
        for k in seg.keys:
            if not run.claim(k):
                return
            value = copy_out(seg.values[k], cp) if k in seg.needed else None
            run.trace.add(plan.tasks[k], "graph", t0 - run.t0, t1 - run.t0, name, None)
            run.complete(k, value)

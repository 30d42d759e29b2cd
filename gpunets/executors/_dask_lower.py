"""Lowering a plan to a Dask graph, submitting it and collecting what comes back (the Dask executor's engine).

Part of :mod:`gpunets.executors.dask` (see there for the model): which keys to compute, the graph layers and
their recipes, placing GPU tasks on the workers that own their GPUs, waiting for futures within the run's
deadline, and the run's trace from the scheduler's task stream.  The functions take the executor as their first
argument (its retries, timeout, GPU map and kept states).
"""

from __future__ import annotations

import atexit
import re
import time
import weakref
from functools import partial
from typing import TYPE_CHECKING, Any

from gpunets.base.exceptions import EvaluationError, FitError, wrap_exception
from gpunets.base.trace import TraceRecord
from gpunets.executors._dask_state import SUMMARY_ATTRIBUTES, ClientValue, DaskState, GraphKey, Recipe, StateInput
from gpunets.executors._dask_worker import (
    _owners,
    _run_on_gpu,
    _run_remote,
    _state_of,
    _summary_of,
    _visible_devices,
    pop_gpu_spans,
)
from gpunets.executors.base import gpu_timing_requested
from gpunets.executors.scheduler import Run
from gpunets.planning.plan import _apply_state, _training_output

if TYPE_CHECKING:  # pragma: no cover
    from gpunets.executors.dask import DaskExecutor


def _cuda_index(task: Any) -> int | None:
    """The physical GPU a task is placed on (its ``device``, else its machine's or node's), or None."""
    for dev in (getattr(task, "device", None), getattr(task.machine, "device", None),
                getattr(task.node, "device", None)):
        spec = str(dev) if dev is not None else ""
        if spec.startswith("cuda"):
            _, _, idx = spec.partition(":")
            return int(idx) if idx.isdigit() else 0
    return None


_KEY_RE = re.compile(r"[^A-Za-z0-9_]+")


def _dask_key(task: Any, run_id: str) -> str:
    label = _KEY_RE.sub("_", task.label).strip("_")[:40] or task.kind
    return f"gpunets_{label}-{run_id}-{task.key}"


def _describe(task: Any) -> str:
    if task.kind == "fit":
        label = task.machine.label if task.machine is not None else task.label
        return f"Machine {label}"
    mach = f" (machine {task.machine.label})" if task.machine is not None else ""
    return f"Node {task.label}{mach}"


def submit_and_collect(ex, client: Any, distributed: Any, run: Run, run_id: str, wanted: list[int],
                        finished: set[int], restrict: dict[int, tuple[list[str], int]],
                        payloads: dict[int, bytes], deadline: float | None, ctx: _RunContext) -> bool:
    """Submit what is still needed; collect it.  True if the cluster lost data (resubmit)."""
    plan = run.plan
    tasks = plan.tasks
    # what to compute: the unfinished wanted keys and their dependencies, down to known values
    # (a fit already committed in a kept state is known by its state's key, unless a task
    # still to run takes its training output, which only the fit itself gives)
    kept_fits = {k: fut for k in finished if (h := ctx.handles.get(k)) is not None
                 and (fut := h.future_on(client)) is not None}
    takes_output = {d for t in tasks if t.fn is _training_output for d in t.deps}
    kept_fits = {k: f for k, f in kept_fits.items() if k not in takes_output}
    have = ({k for k in finished if tasks[k].kind != "fit"} | set(kept_fits)) if ctx.persistent else finished
    known = {t.key for t in tasks if t.kind == "source"} | have
    todo: set[int] = set()
    stack = [k for k in wanted if k not in finished]
    while stack:
        k = stack.pop()
        if k in todo or k in known:
            continue
        todo.add(k)
        stack.extend(tasks[k].deps)
    order = [t for t in tasks if t.key in todo]
    keys = {t.key: _dask_key(t, run_id) for t in order}

    # 1. the values the workers need from the client (the sources; after a loss, finished fits),
    #    scattered in one call
    needed = sorted({d for t in order for d in t.deps if d in known and d not in kept_fits})
    refs: dict[int, Any] = {d: kept_fits[d] for t in order for d in t.deps if d in kept_fits}
    if needed:
        try:
            futs = client.scatter([run.values[k] for k in needed], hash=False)
        except Exception as e:  # noqa: BLE001
            names = ", ".join(tasks[k].label for k in needed)
            msg = (f"The data of {names} could not be sent to the Dask cluster "
                   f"({type(e).__name__}: {e}).")
            _set_error(run, needed[0], msg, e)
            return False
        refs.update(zip(needed, futs))
    refs.update(keys)

    # 2. one graph: one layer for anywhere, one per GPU restriction (GPU tasks timed as on one machine:
    #    a fit's, or a traced evaluation's)
    timed = bool(ex.trace) and (gpu_timing_requested() or run.plan.kind == "fit")
    layers: dict[Any, dict[str, tuple[Any, ...]]] = {}
    for t in order:
        gpu = restrict.get(t.key)
        # a GPU task: with its GPU current on the worker (the ordinal inside the owners' CUDA_VISIBLE_DEVICES,
        # else its index: no worker owns a GPU in particular), on the worker thread's stream, synchronized
        where = gpu[1] if gpu is not None else _cuda_index(t)
        head: tuple[Any, ...] = ((_run_remote,) if where is None else
                                 (partial(_run_on_gpu, timed=True) if timed else _run_on_gpu, where))
        state = (ctx.state_refs[t.key],) if t.key in ctx.state_refs else ()
        layers.setdefault(None if gpu is None else tuple(gpu[0]), {})[keys[t.key]] = (
            head + (run_id, t.key, payloads[t.key]) + tuple(refs[d] for d in t.deps) + state)
    want = [k for k in wanted if k in keys]
    # a fit on a cluster that outlives the run: its state stays there under its own key (held),
    # and only its info and a few small attributes come back
    keep = [k for k in want if ctx.persistent and tasks[k].kind == "fit" and tasks[k].machine is not None]
    skeys: dict[int, str] = {}
    for k in keep:
        m = tasks[k].machine
        assert m is not None
        mark = _KEY_RE.sub("_", m.label).strip("_")[:40] or "machine"
        skeys[k] = f"gpunets-state-{mark}-v{m._version + 1}-{run_id}-{k}"
        # first in line on their worker: the fit is committed as soon as it is done
        layers.setdefault(_KEPT_LAYER, {})[skeys[k]] = (_state_of, keys[k])
        layers[_KEPT_LAYER][f"gpunets-summary-{run_id}-{k}"] = (_summary_of, keys[k], SUMMARY_ATTRIBUTES)
    asked = [f"gpunets-summary-{run_id}-{k}" if k in skeys else keys[k] for k in want]
    futures = client.get(_graph(layers), asked + [skeys[k] for k in keep], sync=False,
                         retries=ex.retries or None)
    state_futs = dict(zip(keep, futures[len(asked):]))
    futures = futures[:len(asked)]
    by_key = {f.key: k for f, k in zip(futures, want)}
    inputs_of = _source_inputs(tasks, keep, refs, needed) if keep else {}
    markers: dict[Any, Any] = {}
    if keep:
        markers.update({refs[d].key: ClientValue(run.values[d]) for d in needed})
        markers.update({f.key: StateInput(ctx.handles[d]) for d, f in kept_fits.items()})
        markers.update({f.key: StateInput(ctx.states[t]) for t, f in ctx.state_refs.items()})

    # 3. what comes back: fits (committed on arrival) and outputs
    lost = False

    def take(fut: Any, draining: bool = False) -> None:
        k = by_key[fut.key]
        value = fut.result()
        if k in state_futs:   # (info, small attributes): the state stays on the workers
            info, attrs = value
            attrs["_path"] = info.get("path", "sklearn")
            attrs["_device"] = info.get("device", "cpu")   # fetched states go back to this device
            handle = DaskState(_describe(tasks[k]).removeprefix("Machine "), client, state_futs.pop(k),
                               attrs, [distributed.Future(f.key, client) for f in inputs_of[k]],
                               timeout=ex.timeout, recipe=_recipe(layers, skeys[k], markers))
            ctx.handles[k] = handle
            with ex._own_lock:
                ex._states.add(handle)
            value = (handle, info)
        finished.add(k)
        if run.claim(k):
            run.complete(k, value)
        elif draining:   # the run has failed: a fit that was running still commits (claimed as running)
            with run.lock:
                run.n_running += 1
            run.complete(k, value)

    def finish_running(stopped: BaseException | None = None) -> None:
        """After a failure (or Ctrl-C): the fits already running on a worker finish and commit, as on the
        other executors, where running tasks finish; what has not started is released unstarted."""
        left = [f for f in futures if by_key[f.key] not in finished and tasks[by_key[f.key]].kind == "fit"]
        if not left:
            return
        started = _started(client, [keys[by_key[f.key]] for f in left])
        for fut in _completed(distributed, client, [f for f in left if keys[by_key[f.key]] in started],
                              deadline):
            if fut.status == "finished":
                take(fut, draining=True)

    try:
        for fut in _completed(distributed, client, futures, deadline):
            k = by_key[fut.key]
            if fut.status == "cancelled":
                lost = True   # its inputs were lost with a worker: resubmit what is left
                break
            if fut.status == "error":
                exc = fut.exception()
                failed = getattr(exc, "_gn_dask_task", k)   # the task that raised (maybe upstream of k)
                if not isinstance(failed, int) or not 0 <= failed < len(tasks):
                    failed = k
                if run.claim(failed):
                    run.fail(failed, exc)
                finish_running()
                break
            take(fut)
    except _TimeoutSignal:
        pending = [tasks[k] for k in wanted if k not in finished]
        names = ", ".join(t.label for t in pending[:5]) + (" ..." if len(pending) > 5 else "")
        timeout = ex.timeout
        msg = (f"{_describe(pending[0])} did not finish on Dask within timeout={timeout}s "
               f"(unfinished: {names}); the run's outstanding tasks were released.")
        _set_error(run, pending[0].key, msg, TimeoutError(msg))
    except _cancelled_errors(distributed):
        lost = True
    except BaseException as e:  # KeyboardInterrupt: the running fits commit, the rest is released; re-raise
        try:
            finish_running(e)
        except BaseException:  # noqa: BLE001, S110 - a second Ctrl-C while they finish: stop at once
            pass
        run.abort(e)
        raise
    finally:
        # Release this attempt's own keys (never client.cancel: distributed's cancel walks the
        # dependents of a cancelled key and asserts that some client wants each of them, which
        # fails for a run's intermediates and drops the whole client, cancelling every other
        # future the user holds on it).  A key no client wants any more is forgotten by the
        # scheduler, and a task still running for it is stopped on its worker.
        _release(futures)
        _release(state_futs.values())   # fits that did not finish: their states are not kept
        _release(refs[k] for k in needed)
    return lost


def placement(ex, client: Any, tasks: list[Any]) -> dict[int, tuple[list[str], int]] | str:
    """``{task key: (worker addresses, GPU ordinal inside those workers)}`` for tasks on a GPU,
    or a message if a task is placed on a GPU that no worker owns (on a cluster of one worker per GPU)."""
    want = {t.key: i for t in tasks if (i := _cuda_index(t)) is not None}
    if not want:
        return {}
    gpus = ex._gpu_map_of(client)
    out: dict[int, tuple[list[str], int]] = {}
    for k, gpu in want.items():
        where = gpus.get(gpu)
        if where is None:
            if gpus:   # each worker owns a GPU, none this one: it would run on the wrong GPU
                task = next(t for t in tasks if t.key == k)
                return (f"{_describe(task)} is placed on cuda:{gpu}, but no worker of the Dask cluster owns "
                        f"GPU {gpu} (the workers own GPUs {sorted(gpus)}). Nothing was sent. Place it on one "
                        "of those, or start a worker for that GPU (dask_cuda.LocalCUDACluster, "
                        "CUDA_VISIBLE_DEVICES).")
            continue   # no worker owns a GPU in particular: anywhere (the model layer decides CPU/GPU)
        out[k] = where
    return out


def gpu_map_of(ex, client: Any) -> dict[int, tuple[list[str], int]]:
    """``{physical GPU: (owning workers, its ordinal inside them)}``, asked of the workers once per
    client and set of workers (one ``client.run``)."""
    workers = frozenset(client.scheduler_info().get("workers", {}))
    got = ex._gpu_map
    if got is not None and got[0] is client and got[1] == workers:
        return got[2]
    seen = client.run(_visible_devices, on_error="ignore")
    gpus: dict[int, tuple[list[str], int]] = {}
    for gpu, addrs in _owners(seen).items():
        cvd = [x.strip() for x in (seen.get(addrs[0]) or "").split(",")]
        gpus[gpu] = (addrs, cvd.index(str(gpu)) if str(gpu) in cvd else 0)
    ex._gpu_map = (client, workers, gpus)
    return gpus


def collect_trace(ex, client: Any, run: Run, run_id: str, t0_wall: float) -> None:
    """The run's trace from Dask's own task stream (the scheduler's ``TaskStreamPlugin``): one
    record per task of this run that finished or failed, on its worker's lane."""
    try:
        got = client.get_task_stream(start=t0_wall - 1.0)
    except Exception:  # noqa: BLE001 - a trace is not worth failing a run for
        return
    tasks = run.plan.tasks
    for rec in got:
        key = str(rec.get("key", ""))
        if not key.startswith("gpunets_"):
            continue
        head, rid, k = key.rsplit("-", 2)
        if not rid.startswith(run_id) or not k.isdigit() or int(k) >= len(tasks):
            continue
        compute = [ss for ss in rec.get("startstops", ()) if ss.get("action") == "compute"]
        if not compute:
            continue
        t = tasks[int(k)]
        start, end = compute[0]["start"], compute[-1]["stop"]
        run.trace.records.append(TraceRecord(
            key=t.key, kind=t.kind, label=t.label, lane=str(rec.get("worker")), device=str(t.device),
            start=start - t0_wall, end=end - t0_wall, thread=str(rec.get("thread", "")),
            failed=rec.get("status") == "error"))
    if run.error is None and any(r.device.startswith("cuda") for r in run.trace.records):
        # only then: client.run waits for every worker, and one still busy with a cancelled task (a run
        # that timed out) would keep the caller waiting for it
        _gpu_spans(client, run, run_id, t0_wall)
    run.trace.records.sort(key=lambda r: r.start)


def _gpu_spans(client: Any, run: Run, run_id: str, t0_wall: float) -> None:
    """The GPU spans the workers kept for this run's timed GPU tasks: each record's ``start``/``end`` become
    its GPU span and ``issued`` its task-stream (host) span, as the streams executor's records."""
    try:
        per_worker = client.run(pop_gpu_spans, run_id)
    except Exception:  # noqa: BLE001 - a trace is not worth failing a run for
        return
    spans = {k: v for got in per_worker.values() for k, v in got.items()}
    for r in run.trace.records:
        span = spans.get(r.key)
        if span is not None and r.issued is None:
            wall, seconds = span
            r.issued = (r.start, r.end)
            r.start = wall - t0_wall
            r.end = r.start + seconds




# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------
class _TimeoutSignal(Exception):
    pass


class _RunContext:
    """What one run keeps across its attempts: the states it applies and the states its fits keep."""

    def __init__(self, states: dict[int, Any], persistent: bool) -> None:
        self.states = states                  # task key -> the fitted state it applies
        self.state_refs: dict[int, Any] = {}  # task key -> that state's future on the cluster
        self.persistent = persistent          # the cluster outlives the run: fitted states stay there
        self.handles: dict[int, DaskState] = {}   # fit task key -> its kept state


def _recipe(layers: dict[Any, dict[str, tuple[Any, ...]]], root: str, markers: dict[Any, Any]) -> Recipe:
    """The part of a run's graph that computes ``root``, with its inputs as markers (see :class:`Recipe`)."""
    graph = {k: v for dsk in layers.values() for k, v in dsk.items()}
    out: dict[str, tuple[Any, ...]] = {}
    stack = [root]
    while stack:
        key = stack.pop()
        if key in out:
            continue
        task = []
        for e in graph[key]:
            if isinstance(e, str) and e in graph:
                task.append(GraphKey(e))
                stack.append(e)
            elif getattr(e, "key", None) in markers:
                task.append(markers[e.key])
            else:
                task.append(e)
        out[key] = tuple(task)
    return Recipe(out, root)


_STREAMED: weakref.WeakSet[Any] = weakref.WeakSet()   # clients whose scheduler records the task stream


def _record_task_stream(client: Any) -> None:
    """Make the scheduler record its task stream (once per client: the first ``get_task_stream``
    installs the ``TaskStreamPlugin``, which then records every task that finishes or fails)."""
    if client in _STREAMED:
        return
    try:
        client.get_task_stream(count=0)
    except Exception:  # noqa: BLE001, S110 - no trace then, the run goes on
        return
    _STREAMED.add(client)


def _applies_state(fn: Any) -> bool:
    """Does task function ``fn`` apply a machine's fitted state (:func:`gpunets.planning.plan._apply_state`)?"""
    return isinstance(fn, partial) and fn.func is _apply_state


def _source_inputs(tasks: list[Any], fits: list[int], refs: dict[int, Any], needed: list[int]) -> dict[int, list[Any]]:
    """For each fit, the scattered values among its ancestors (held with its state, so Dask can
    recompute the state from them if the worker holding it dies)."""
    scattered = set(needed)
    out: dict[int, list[Any]] = {}
    for k in fits:
        seen: set[int] = set()
        stack = list(tasks[k].deps)
        found = []
        while stack:
            d = stack.pop()
            if d in seen:
                continue
            seen.add(d)
            if d in scattered:
                found.append(refs[d])
            else:
                stack.extend(tasks[d].deps)
        out[k] = found
    return out


def _started(client: Any, keys: list[str]) -> set[str]:
    """Which of ``keys`` a worker is running or has finished (the scheduler's ``processing`` / ``memory``)."""
    def states(dask_scheduler: Any, keys: list[str] = keys) -> list[str]:
        return [k for k in keys if (ts := dask_scheduler.tasks.get(k)) is not None
                and ts.state in ("processing", "memory")]

    try:
        return set(client.run_on_scheduler(states))
    except Exception:  # noqa: BLE001 - the scheduler cannot be asked: wait for none
        return set()


def _completed(distributed: Any, client: Any, futures: list[Any], deadline: float | None) -> Any:
    """Yield futures as they finish; raise _TimeoutSignal at ``deadline`` (``time.monotonic()``).

    ``client.loop`` is passed explicitly: without it ``as_completed`` (like
    ``distributed.wait``) needs a *default* client, and a cluster this executor
    starts is deliberately not made the default.
    """
    left = None if deadline is None else max(deadline - time.monotonic(), 1e-3)
    try:
        yield from distributed.as_completed(futures, loop=client.loop, timeout=left)
    except TimeoutError:
        raise _TimeoutSignal from None


def _release(futures: Any) -> None:
    """Drop this client's wants on ``futures`` (each ``Future.release()``; idempotent)."""
    for f in futures:
        try:
            f.release()
        except Exception:  # noqa: BLE001, S110 - a client already closed: nothing is held any more
            pass


def _cancelled_errors(distributed: Any) -> tuple[type[BaseException], ...]:
    import asyncio

    from distributed.client import FuturesCancelledError

    return (FuturesCancelledError, asyncio.CancelledError, getattr(distributed, "CancelledError",
                                                                    asyncio.CancelledError))


_KEPT_LAYER = "kept"   # the layer of the fits' kept states and summaries (run first)


def _graph(layers: dict[Any, dict[str, tuple[Any, ...]]]) -> Any:
    """A plain dict graph, or a HighLevelGraph with one annotated layer per worker restriction."""
    if list(layers) == [None]:
        return layers[None]
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    hl: dict[str, Any] = {}
    for i, (restriction, dsk) in enumerate(layers.items()):
        ann = (None if restriction is None else {"priority": 100} if restriction == _KEPT_LAYER
               else {"workers": list(restriction), "allow_other_workers": False})
        hl[f"gpunets-layer-{i}"] = MaterializedLayer(dsk, annotations=ann)
    return HighLevelGraph(hl, {name: set() for name in hl})


def _set_error(run: Run, key: int, message: str, exc: BaseException) -> None:
    """Fail ``run`` at ``key`` with ``message`` (an error of the task's kind that is also ``type(exc)``)."""

    task = run.plan.tasks[key]
    kind = FitError if task.kind == "fit" else EvaluationError
    err = wrap_exception(kind, message, exc)
    err._gn_task_named = True
    err._gn_original = exc
    with run.lock:
        if run.error is None:
            run.error = err
        run.changed.notify_all()


_KEPT: weakref.WeakSet[DaskExecutor] = weakref.WeakSet()
_ATEXIT = False


def _register_atexit(ex: DaskExecutor) -> None:
    global _ATEXIT
    _KEPT.add(ex)
    if not _ATEXIT:
        _ATEXIT = True
        atexit.register(_close_kept)


def _close_kept() -> None:
    for ex in list(_KEPT):
        try:
            ex.close()
        except Exception:  # noqa: BLE001, S110 - interpreter exit
            pass

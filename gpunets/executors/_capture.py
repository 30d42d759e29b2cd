"""Graph mode's mechanics: trial captures, the plan's segments captured on a stream, and their replays.

Part of :mod:`gpunets.executors.graphs` (see there for the model).  An :class:`Entry` holds what one plan
(with its input shapes) captured: a non-blocking stream of its own, side streams for independent branches, a
private memory pool, and its steps in plan order: a :class:`Segment` (consecutive capturable GPU tasks, one
CUDA graph) or an eager task.  A segment reads what comes from outside it (sources, eager tasks' values,
earlier segments' values) from static buffers of its own, filled before each launch, and its values that
others read are copied out after it, so no caller ever holds a buffer that the next replay overwrites.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

from gpunets.core.machines import FittedState
from gpunets.executors._cuda_streams import blocks_host
from gpunets.planning.tasks import _store

__all__ = ["Entry", "Segment", "meta", "state_of", "VERDICTS", "verdict_key", "copyable", "reason_of",
           "NotStatic", "uncapturable"]

#: (task, fitted state, device, its inputs' metadata) -> None (captured alone, once) or why it cannot be.
VERDICTS: dict[tuple, str | None] = {}
_VLOCK = threading.Lock()


class NotStatic(TypeError):
    """A value a segment would read or give that is neither a device array nor a constant."""


def meta(v: Any) -> tuple:
    """What a captured graph depends on in a value: an array's type, shape, dtype and device; a container's
    items; a constant's value (constants are baked into a graph); else its type."""
    if hasattr(v, "shape") and hasattr(v, "dtype") and not hasattr(v, "columns"):
        dev = getattr(getattr(v, "device", None), "id", None)
        return (type(v).__name__, tuple(v.shape), str(v.dtype), dev)
    if hasattr(v, "shape") and hasattr(v, "dtypes"):   # a data frame: its shape and column types
        return (type(v).__name__, tuple(v.shape), tuple(str(d) for d in v.dtypes))
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, tuple(meta(x) for x in v))
    if v is None or isinstance(v, (bool, int, float, str)):
        return ("const", v)
    return ("object", type(v).__name__)


def state_of(task: Any) -> Any:
    """The fitted state a call task applies (bound into its function by the compiler), or None."""
    todo = [task.fn]
    while todo:
        fn = todo.pop()
        if isinstance(fn, functools.partial):
            for a in fn.args:
                if isinstance(a, FittedState):
                    return a
                if isinstance(a, functools.partial):
                    todo.append(a)
            todo.append(fn.func)
    return None


def uncapturable(task: Any) -> str | None:
    """Why ``task`` is never tried in a capture (None: it may be): work CuPy's capture would not see."""
    if blocks_host(task):
        return "a cuML call (synchronous, on its own stream: a capture would not record it)"
    todo = [task.fn]
    while todo:
        fn = todo.pop()
        if isinstance(fn, functools.partial):
            if fn.func is _store:
                return "it stores its value in the node-output cache (a captured value is garbage until launched)"
            todo.extend(a for a in fn.args if isinstance(a, functools.partial))
            todo.append(fn.func)
    return None


def verdict_key(task: Any, inputs: list[Any]) -> tuple:
    """A task's verdict holds for its node, its estimator's kind and route, its device and its inputs' shapes."""
    node = task.node._uid if task.node is not None else task.label
    st = state_of(task)
    kind = None if st is None else (type(st.estimator).__name__, st.path)
    return (task.kind, node, kind, task.device, tuple(meta(v) for v in inputs))


def reason_of(exc: BaseException) -> str:
    text = str(exc).split("\n", 1)[0]
    return f"{type(exc).__name__}: {text[:160]}"


def copyable(v: Any, cp: Any) -> bool:
    """Whether ``v`` can cross a segment's edge: device arrays (in tuples/lists) and constants."""
    if isinstance(v, cp.ndarray):
        return True
    if isinstance(v, (tuple, list)):
        return all(copyable(x, cp) for x in v)
    return v is None or isinstance(v, (bool, int, float, str))


def copy_out(v: Any, cp: Any) -> Any:
    """A segment's value as the caller gets it: a copy of each array, never the graph's own buffer."""
    if isinstance(v, cp.ndarray):
        return v.copy()
    if isinstance(v, (tuple, list)):
        items = [copy_out(x, cp) for x in v]
        return type(v)(*items) if hasattr(v, "_fields") else type(v)(items)
    return v


def _static(v: Any, cp: Any) -> Any:
    """A static buffer holding ``v`` (allocated now, under the entry's pool); constants are kept as they are."""
    if isinstance(v, cp.ndarray):
        return v.copy()
    if isinstance(v, (tuple, list)):
        items = [_static(x, cp) for x in v]
        return type(v)(*items) if hasattr(v, "_fields") else type(v)(items)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise NotStatic(f"a {type(v).__name__} is neither a device array nor a constant")


def _fill(static: Any, v: Any, cp: Any) -> str | None:
    """Copy ``v`` into ``static`` (on the current stream); None, or why it does not fit the captured buffers."""
    if isinstance(static, cp.ndarray):
        if not isinstance(v, cp.ndarray):
            return f"a {type(v).__name__} where a device array was captured"
        if v.shape != static.shape or v.dtype != static.dtype or v.device.id != static.device.id:
            return (f"an input of shape {v.shape} {v.dtype} on cuda:{v.device.id} where {static.shape} "
                    f"{static.dtype} was captured")
        static[...] = v
        return None
    if isinstance(static, (tuple, list)):
        if type(v) is not type(static) or len(v) != len(static):
            return f"a {type(v).__name__} where a {type(static).__name__} was captured"
        for s, x in zip(static, v, strict=True):
            why = _fill(s, x, cp)
            if why:
                return why
        return None
    if type(v) is not type(static) or v != static:
        return f"the constant {v!r} where {static!r} was captured"
    return None


class Segment:
    """Consecutive capturable GPU tasks of a plan, captured as one CUDA graph."""

    def __init__(self, keys: list[int], plan: Any) -> None:
        self.keys = keys
        inside = set(keys)
        self.external = list(dict.fromkeys(d for k in keys for d in plan.tasks[k].deps if d not in inside))
        outputs = set(plan.outputs)
        self.needed = {k for k in keys if k in outputs or any(c not in inside for c in plan.consumers[k])}
        self.statics: dict[int, Any] = {}
        self.values: dict[int, Any] = {}
        self.graph: Any = None

    def labels(self, plan: Any) -> list[str]:
        return [plan.tasks[k].label for k in self.keys]


class Entry:
    """What one plan captured on one GPU: its steps, stream, side streams and private pool (see the module)."""

    def __init__(self, cp: Any, ordinal: int, states: list[tuple[Any, Any]]) -> None:
        self.cp, self.ordinal = cp, ordinal
        self.lock = threading.Lock()
        with cp.cuda.Device(ordinal):
            self.stream = cp.cuda.Stream(non_blocking=True)
        self.sides: dict[int, Any] = {}
        self.pool = cp.cuda.MemoryPool()
        self.steps: list[Any] = []           # Segment, or (task key, why it runs eagerly)
        self.states = states                 # (machine, the state its tasks apply): stale once it refits
        self.keep: list[Any] = []            # the captured tasks' functions (and what they bind), kept alive
        self.replays = 0

    def stale(self) -> bool:
        return any(m._state is not st for m, st in self.states)

    def side(self, lane: int) -> Any:
        s = self.sides.get(lane)
        if s is None:
            with self.cp.cuda.Device(self.ordinal):
                s = self.sides[lane] = self.cp.cuda.Stream(non_blocking=True)
        return s

    def held_bytes(self) -> int:
        return int(self.pool.total_bytes())

    # --- capture ------------------------------------------------------------------------------
    def capture(self, seg: Segment, plan: Any, values: list[Any]) -> None:
        """Capture ``seg`` on this entry's stream, reading its outside inputs from new static buffers."""
        cp, origin = self.cp, self.stream
        # what the graph reads besides its own buffers must live as long as it: the arrays bound into the tasks'
        # functions (array constants moved to the GPU once per plan, fitted states), kept with their functions
        self.keep.extend(plan.tasks[k].fn for k in seg.keys)
        with cp.cuda.using_allocator(self.pool.malloc):
            seg.statics = {d: _static(values[d], cp) for d in seg.external}
            vals: dict[int, Any] = dict(seg.statics)
            ev = functools.partial(cp.cuda.Event, disable_timing=True)
            origin.begin_capture()
            try:
                fork = origin.record(ev())
                ran: dict[int, Any] = {}      # task -> (stream, event after it)
                first = plan.tasks[seg.keys[0]].lane
                joined: dict[int, Any] = {}   # side streams used: stream id -> stream
                for k in seg.keys:
                    t = plan.tasks[k]
                    s = origin if t.lane == first else self.side(t.lane % 8)
                    if s is not origin and id(s) not in joined:
                        s.wait_event(fork)
                        joined[id(s)] = s
                    for d in t.deps:
                        if d in ran and ran[d][0] is not s:
                            s.wait_event(ran[d][1])
                    with s:
                        vals[k] = t.fn(*[vals[d] for d in t.deps])
                        ran[k] = (s, s.record(ev()))
                    if not copyable(vals[k], cp):
                        raise NotStatic(f"task {t.label} gives a {type(vals[k]).__name__}, not a device array")
                for s in joined.values():
                    origin.wait_event(s.record(ev()))
            except BaseException:
                try:
                    origin.end_capture()
                except Exception:  # noqa: BLE001, S110 - an invalidated capture: the error that matters is above
                    pass
                raise
            seg.graph = origin.end_capture()
        seg.values = {k: vals[k] for k in seg.keys}

    # --- replay -------------------------------------------------------------------------------
    def launch(self, seg: Segment, values: list[Any]) -> str | None:
        """Fill ``seg``'s static buffers from ``values`` and launch its graph; None, or why it could not."""
        for d in seg.external:
            why = _fill(seg.statics[d], values[d], self.cp)
            if why:
                return why
        seg.graph.launch(self.stream)
        return None


def run_trial(task: Any, inputs: list[Any], entry_stream: Any, pool: Any, cp: Any) -> tuple[Any, str | None]:
    """Capture ``task`` alone on ``entry_stream`` and launch it: (its value, None), or (None, why it cannot be
    captured).  The verdict is cached by the caller."""
    host = next((v for v in inputs if not copyable(v, cp)), None)
    if host is not None:
        return None, (f"it reads a {type(host).__name__} on the host (a copy to the GPU: CuPy refuses host-to-device "
                      f"copies during a capture)" if task.kind == "move" else
                      f"an input is a {type(host).__name__}, neither a device array nor a constant")
    with cp.cuda.using_allocator(pool.malloc):
        entry_stream.begin_capture()
        try:
            value = task.fn(*inputs)
        except Exception as e:  # noqa: BLE001 - CuPy refuses it during capture (or a host read invalidated it)
            try:
                entry_stream.end_capture()
            except Exception:  # noqa: BLE001, S110 - an invalidated capture
                pass
            return None, reason_of(e)
        try:
            g = entry_stream.end_capture()
        except Exception as e:  # noqa: BLE001 - invalidated midway
            return None, reason_of(e)
    if not copyable(value, cp):
        return None, f"its value is a {type(value).__name__}, not a device array"
    g.launch(entry_stream)
    return value, None


def remember(key: tuple, why: str | None) -> None:
    with _VLOCK:
        if len(VERDICTS) > 4096:
            VERDICTS.clear()
        VERDICTS[key] = why


def now() -> float:
    return time.perf_counter()

"""The fake GPU's CUDA graphs: stream capture, replay, private memory pools and reused buffers.

Part of :mod:`gpunets.devices.fakegpu`, modelled on CuPy 14 (``cupy/cuda/stream.pyx``, ``cupy/cuda/graph.pyx``,
``cupy/cuda/memory.pyx`` and ``cupy_backends/cuda/libs/*.pyx``):

* ``Stream.begin_capture()`` / ``end_capture()`` (refused on the legacy stream) record the operations issued on
  the stream, and on the streams that joined it by waiting on an event recorded in it, into a :class:`Graph`;
  the work is **not run** by the capture: its outputs hold garbage (bytes ``0xA5``) and buffers it updated in
  place keep their old contents until :meth:`Graph.launch`;
* ``Graph.launch(stream=None)`` replays the recorded operations on the *current* contents of the buffers they
  read, writing into the same output buffers in place; ``upload`` only issues;
* during a capture, as CuPy: cuBLAS (``matmul``, ``dot``...), cuSOLVER (``linalg``) and cuRAND (``random``) calls
  raise ``NotImplementedError`` (the capture stays valid); a host read (``get``, ``item``, ``float()``, a
  data-dependent shape such as ``nonzero``), a synchronisation, a host-to-device copy, work on the legacy
  stream or a wait on an event recorded outside the capture raise ``CUDARuntimeError`` and invalidate the
  capture (``end_capture`` then raises too);
* memory: an array made under ``cupy.cuda.using_allocator(pool.malloc)`` belongs to that private
  :class:`MemoryPool`.  A graph does not own the memory it uses: when every array on a buffer of the
  default pool that a live graph reads or writes is gone, the pool may hand that buffer out again, and the
  fake does so (to the next array of the same size) and **poisons** the new array: reading it raises
  :class:`PoisonedBufferError`, since each replay of the graph would overwrite it.
"""

from __future__ import annotations

import contextlib
import sys
import types
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np

from gpunets.devices._fakecuda import (
    _CAPTURES,
    _POISONED,
    CUDARuntimeError,
    PoisonedBufferError,
    _allocator,
    _buffers,
    _issue,
    _lock,
    _refuse_in_capture,
    _tls,
    get_current_stream,
)

__all__ = ["Capture", "Graph", "MemoryPool", "using_allocator", "refuse", "record", "allocated",
           "PoisonedBufferError"]

GARBAGE = 0xA5
#: cuBLAS calls (``cupy_backends/cuda/libs/cublas.pyx`` ``setStream`` refuses a capturing stream).
BLAS = frozenset({"matmul", "__matmul__", "__rmatmul__", "dot", "vdot", "inner", "tensordot", "einsum", "vecdot",
                  "matrix_power"})
#: Library namespaces refused during a capture: cuSOLVER (``linalg``, except the reductions of ``norm``), cuRAND.
_LIBS = {"linalg": "cuSOLVER", "random": "cuRAND"}
_REDUCTIONS = frozenset({"norm", "vector_norm", "matrix_norm", "matrix_transpose", "trace", "diagonal"})
#: Operations whose output shape depends on the data: CuPy reads a count on the host.
_DATA_DEPENDENT = frozenset({"boolean mask", "nonzero", "flatnonzero", "argwhere", "unique", "compress", "extract", "unique_values",
                             "unique_counts", "unique_inverse", "unique_all"})


def _caller() -> str:
    f: Any = sys._getframe(1)
    while f is not None and f.f_code.co_filename.endswith(("fakegpu.py", "_fakecuda.py", "_fakegraph.py")):
        f = f.f_back
    return f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno}" if f is not None else "?"


# ----------------------------------------------------------------- capture


class Capture:
    """The operations recorded on a capturing stream (and the streams that joined it) so far."""

    def __init__(self, origin: Any, mode: int, device: int) -> None:
        self.origin, self.mode = origin, mode
        self.device = origin.device_id if origin.device_id != -1 else device
        self.streams = [origin.key]
        self.ops: list[_Op] = []
        self.invalid: str | None = None
        self.produced: list[np.ndarray] = []                  # buffers made in the capture (garbage until launch)
        self.saved: dict[int, tuple[np.ndarray, np.ndarray]] = {}   # buffers updated in place: their contents before
        self.roots: dict[int, list[Any]] = {}                # id(root) -> [root, pool, device, [weakrefs]]
        self.external: list[weakref.ref[Any]] = []          # arrays read that the capture did not make
        self.outputs: list[weakref.ref[Any]] = []           # arrays it wrote
        self.where = _caller()

    def track(self, arr: Any, *, output: bool) -> None:
        root = _root(arr._a)
        entry = self.roots.get(id(root))
        if entry is None:
            entry = self.roots[id(root)] = [root, arr._pool, arr._dev, []]
            if not output:
                self.external.append(weakref.ref(arr))
        entry[3].append(weakref.ref(arr))
        if output:
            self.outputs.append(weakref.ref(arr))

    def save(self, buf: np.ndarray) -> None:
        """Before an in-place update of ``buf``: keep its contents, restored when the capture ends."""
        root = _root(buf)
        if id(root) not in self.saved and not any(p is root for p in self.produced):
            self.saved[id(root)] = (root, root.copy())

    def restore(self) -> None:
        for root, old in self.saved.values():
            np.copyto(root, old)
        for buf in self.produced:   # captured work does not run: its outputs hold garbage until a launch
            if buf.flags.c_contiguous and buf.flags.writeable and buf.dtype.kind in "biufc":
                buf.reshape(-1).view(np.uint8)[...] = GARBAGE

    def discard(self) -> None:
        self.restore()
        self.ops = []


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class _Op:
    __slots__ = ("fn", "a", "k", "outs")

    def __init__(self, fn: Any, a: Any, k: Any, outs: list[np.ndarray]) -> None:
        self.fn, self.a, self.k, self.outs = fn, a, k, outs

    def run(self) -> None:
        res = self.fn(*self.a, **self.k)
        if self.outs:
            for o, r in zip(self.outs, _flat(res), strict=False):
                if o is not r:
                    np.copyto(o, r, casting="unsafe")


def _flat(obj: Any) -> list[Any]:
    if isinstance(obj, (np.ndarray, np.generic)):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [x for o in obj for x in _flat(o)]
    return []


def refuse(what: str, namespace: str = "") -> Capture | None:
    """Before an operation on the current stream: its capture (None if it is not capturing), after refusing
    what CuPy refuses during a capture."""
    cap = _CAPTURES.get(get_current_stream().key)
    if cap is None:
        return None
    lib = "cuBLAS" if what in BLAS else _LIBS.get(namespace.rsplit(".", 1)[-1]) if what not in _REDUCTIONS else None
    if lib is not None:   # raised before any CUDA call: the capture stays valid
        raise NotImplementedError(f"calling {lib} API during stream capture is currently unsupported")
    if what in _DATA_DEPENDENT:
        _refuse_in_capture([cap.origin.key], "cudaErrorStreamCaptureUnsupported",
                           f"{what} (its output shape is read on the host)")
    return cap


def host_copy(what: str) -> None:
    """A host-to-device copy on a capturing stream: refused (CuPy copies from a staging buffer that a replay
    would read again, long after it was reused; from pageable memory CUDA refuses it)."""
    key = get_current_stream().key
    if key in _CAPTURES:
        _refuse_in_capture([key], "cudaErrorStreamCaptureUnsupported", what)


def host_read(what: str, stream: Any) -> None:
    """A read of device data on the host from a capturing stream: refused, and the capture invalidated."""
    s = stream if stream is not None else get_current_stream()
    if s.key in _CAPTURES:
        _refuse_in_capture([s.key], "cudaErrorStreamCaptureUnsupported", f"{what} (a host read)")


def record(cap: Capture, fn: Any, a: Any, k: Any, ins: list[Any], outs: list[Any]) -> None:
    """Record one operation: ``fn(*a, **k)`` on the NumPy buffers ``a``/``k``, its array results copied into
    the buffers of the device arrays ``outs`` on replay (``outs`` empty: ``fn`` writes in place)."""
    with _lock:
        for arr in ins:
            cap.track(arr, output=False)
        roots = [_root(i._a) for i in ins]
        for arr in outs:
            cap.track(arr, output=True)
            # made by the operation (not an input handed back as it is, e.g. ascontiguousarray of a contiguous one)
            if arr._a.base is None and not any(r is arr._a for r in roots):
                cap.produced.append(arr._a)
        cap.ops.append(_Op(fn, a, k, [o._a for o in outs]))


def record_inplace(cap: Capture, fn: Any, target: Any, a: Any, ins: list[Any]) -> None:
    """Record an in-place update of ``target`` (``x += y``, ``x[i] = v``, ``fill``): call before running it."""
    with _lock:
        cap.save(target._a)
        for arr in ins:
            if arr is not target:
                cap.track(arr, output=False)
        cap.track(target, output=True)
        cap.ops.append(_Op(fn, a, {}, []))


# ----------------------------------------------------------------- graphs


class Graph:
    """``cupy.cuda.graph.Graph``: made by ``Stream.end_capture()`` only."""

    def __init__(self, cap: Capture) -> None:
        if not isinstance(cap, Capture):
            raise NotImplementedError("currently this class cannot be initiated by the user and must be created "
                                      "via stream capture")
        self._ops = cap.ops
        self.device = cap.device
        self.where = cap.where
        self._buffers = [e[0] for e in cap.roots.values()]   # the memory it reads and writes (not owned)
        self._external, self._outputs = cap.external, cap.outputs
        self.launches = 0
        cap.restore()
        me = weakref.ref(self)
        desc = f"a CUDA graph captured at {cap.where} (on {cap.origin!r})"
        for root, pool, dev, refs in cap.roots.values():
            if pool is not None or root.base is not None or not root.flags.c_contiguous:
                continue   # a private pool's memory goes only to arrays made under that pool
            alive = [r() for r in refs if r() is not None]
            if not alive:
                _release(me, root, dev, desc)
                continue
            count = [len(alive)]
            for arr in alive:
                weakref.finalize(arr, _dropped, me, root, dev, desc, count)
        weakref.finalize(self, _graph_gone, id(self))

    def launch(self, stream: Any = None) -> None:
        """Replay the recorded operations on ``stream`` (default: the current stream)."""
        ctx = stream if stream is not None else contextlib.nullcontext()
        with ctx:
            ins = [a for r in self._external if (a := r()) is not None]
            cap = _CAPTURES.get(get_current_stream().key)
            issued = _issue("graph launch", ins)
            if cap is not None:   # launched inside another capture: a child graph node
                with _lock:
                    cap.ops.append(_Op(self._replay, (), {}, []))
                return
            self._replay()
            for r in self._outputs:
                arr = r()
                if arr is not None:
                    arr._key, arr._seq = issued
        self.launches += 1

    def _replay(self) -> None:
        for op in self._ops:
            op.run()

    def upload(self, stream: Any = None) -> None:
        """Upload the graph to ``stream``'s device (no work is run)."""
        ctx = stream if stream is not None else contextlib.nullcontext()
        with ctx:
            _issue("graph upload", [])

    def __repr__(self) -> str:
        return f"<fake cupy.cuda.graph.Graph: {len(self._ops)} operations, captured at {self.where}>"


# ----------------------------------------------------------------- memory: pools and reused buffers

#: (device, bytes) -> [(root buffer, description, graph ref)]: default-pool memory no array uses any more but a
#: live graph still reads or writes; the next array of that size on that device gets it (and is poisoned).
_FREE: dict[tuple[int, int], list[tuple[np.ndarray, str, weakref.ref[Graph]]]] = {}


def _dropped(graph: weakref.ref[Graph], root: np.ndarray, dev: int, desc: str, count: list[int]) -> None:
    count[0] -= 1
    if count[0] == 0:
        _release(graph, root, dev, desc)


def _release(graph: weakref.ref[Graph], root: np.ndarray, dev: int, desc: str) -> None:
    if graph() is not None:
        with _lock:
            _FREE.setdefault((dev, root.nbytes), []).append((root, desc, graph))


def _graph_gone(gid: int) -> None:
    with _lock:
        for key in list(_FREE):
            _FREE[key] = [e for e in _FREE[key] if e[2]() is not None]
            if not _FREE[key]:
                del _FREE[key]


def allocated(arr: Any) -> None:
    """A new array ``arr`` owning its buffer: count it in its private pool, or hand it a buffer of the default
    pool that a live graph still uses (poisoning it)."""
    pool = arr._pool
    if pool is not None:
        pool._take(arr)
        return
    a = arr._a
    if not _FREE or a.base is not None or not a.flags.c_contiguous:
        return
    with _lock:
        free = _FREE.get((arr._dev, a.nbytes))
        entry = None
        while free:
            cand = free.pop()
            if cand[2]() is not None:
                entry = cand
                break
    if entry is None:
        return
    root, desc, _ = entry
    view = np.frombuffer(root.reshape(-1).view(np.uint8), dtype=a.dtype, count=a.size).reshape(a.shape)
    view[...] = a
    arr._a = view
    msg = (f"fake GPU: this {a.shape} {a.dtype} array was given memory that {desc} still reads or writes: every "
           f"array on that buffer of the default memory pool was freed while the graph lived, so the pool handed "
           f"it out again, and each replay of the graph overwrites it. Capture under a private pool "
           f"(`with cupy.cuda.using_allocator(pool.malloc):`, pool = cupy.cuda.MemoryPool()) or keep the "
           f"graph's arrays alive as long as the graph.")
    with _lock:
        _POISONED[id(arr)] = msg
    weakref.finalize(arr, _POISONED.pop, id(arr), None)


class MemoryPool:
    """``cupy.cuda.MemoryPool``: a pool of its own; arrays made under ``using_allocator(pool.malloc)`` use it."""

    def __init__(self, allocator: Any = None) -> None:
        self._used = 0
        self._cached = 0

    def malloc(self, size: int) -> Any:
        raise NotImplementedError("fake GPU: arrays allocate through the pool themselves (use using_allocator)")

    def _take(self, arr: Any) -> None:
        n = arr._a.nbytes
        with _lock:
            self._used += n
        weakref.finalize(arr, self._give_back, n)

    def _give_back(self, n: int) -> None:
        with _lock:
            self._used -= n
            self._cached += n

    def used_bytes(self) -> int:
        return self._used

    def total_bytes(self) -> int:
        return self._used + self._cached

    def free_bytes(self) -> int:
        return self._cached

    def free_all_blocks(self, stream: Any = None) -> None:
        with _lock:
            self._cached = 0


#: How many ``using_allocator`` blocks are open in all threads (new arrays look up their thread's pool only then).
ACTIVE = [0]


@contextlib.contextmanager
def using_allocator(allocator: Any = None) -> Iterator[None]:
    """``cupy.cuda.using_allocator``: this thread allocates from ``allocator`` (a pool's ``malloc``) inside."""
    pool = getattr(allocator, "__self__", None)
    prev = getattr(_tls, "pool", None)
    _tls.pool = pool if isinstance(pool, MemoryPool) else None
    with _lock:
        ACTIVE[0] += 1
    try:
        yield
    finally:
        _tls.pool = prev
        with _lock:
            ACTIVE[0] -= 1


class OutOfMemoryError(MemoryError):
    """``cupy.cuda.memory.OutOfMemoryError``: an allocation the device (or the pool's limit) could not serve."""

    def __init__(self, size: int, total: int, limit: int = 0) -> None:
        msg = f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes)."
        if limit:
            msg = msg[:-2] + f", limit set to: {limit:,} bytes)."
        super().__init__(msg)


class _MemoryPool:
    """``cupy.get_default_memory_pool()``: the fake allocates nothing through a pool (both counts are 0)."""

    def used_bytes(self) -> int:
        return 0

    def total_bytes(self) -> int:
        return 0

    def free_all_blocks(self, stream: Any = None) -> None:
        return None


_POOL = _MemoryPool()


def _memory_pool() -> _MemoryPool:
    return _POOL


def _set_allocator(allocator: Any = None) -> None:
    _allocator[:] = [allocator]


def _pointer_attributes(ptr: int) -> Any:
    """``cudaPointerGetAttributes`` for the data pointer of a live fake array (``x.data.ptr``)."""
    arr = _buffers.get(int(ptr))
    if arr is None:
        raise CUDARuntimeError(f"cudaErrorInvalidValue: invalid argument (no fake device memory at {int(ptr):#x})")
    return types.SimpleNamespace(device=arr._dev, type=2, devicePointer=int(ptr))

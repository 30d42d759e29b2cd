"""A fake GPU: a strict, NumPy-backed stand-in for CuPy with one or two CUDA devices.

Set ``GPUNETS_FAKE_GPU=1`` (or ``2``) before running to make gpunets see that
many CUDA devices on a machine without one: ``gn.gpu_available()`` is True,
``device="auto"`` is ``cuda:0``, and every CuPy call gpunets makes (through
:func:`gpunets._gpulibs.cupy`) goes to this module.  cuDF and cuML count as
absent, so models take the routes they take on a GPU image without RAPIDS
(scikit-learn's array-API dispatch, or a logged CPU fallback).

It is as strict as CuPy on the rules that break GPU code:

* no implicit move to the host: ``np.asarray(x)``, ``x.__array__()``,
  ``float(x)`` on a non-scalar and ``pandas.Series(x)`` raise ``TypeError``;
  only :func:`asnumpy` and ``x.get()`` (and ``item``/``tolist``) read on the host;
* NumPy arrays are not accepted where a device array is expected (only
  :func:`asarray`/:func:`array` copy host data to the device);
* each array has a ``.device`` (``.id``); mixing devices in one operation raises ``ValueError``;
* the current device (``with cupy.cuda.Device(i):``) and the current stream
  (``with stream:``) are per thread; ``Stream.null`` is the legacy stream,
  ``Stream.ptds`` this thread's default stream (the default current stream
  when ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``, else the legacy one);
* stream order is checked: reading a value made on another stream, with no
  ``wait_event`` on an event recorded after it was made (and no host
  synchronisation since), raises :class:`gpunets.StreamOrderError`;
* streams and events belong to a device, as CuPy's: ``with stream:`` / ``stream.use()`` under another
  current device raise ``RuntimeError`` ("does not match with the current device"), recording an event
  on a stream of another device raises ``CUDARuntimeError`` (invalid resource handle); the current
  stream is per thread *and per device*; waiting on another device's event is allowed, as in CUDA;
* events and streams do not complete at once: ``done`` answers at random until the work has been waited
  for (``synchronize``), from a generator seeded by ``GPUNETS_FAKE_GPU_SEED`` (default 0; :func:`seed`),
  so a host that polls once and reads without waiting fails on some runs, replayably;
* the legacy stream orders blocking streams only: a non-blocking stream (``Stream(non_blocking=True)``,
  the streams executor's ``stream="new"``) reading legacy-stream work, or the other way round, needs an event;
* ``pickle`` copies through the host and unpickles on the *current* device (not the one it came from);
  ``np.f(x)`` runs as ``cupy.f(x)`` where CuPy has an ``f`` (a host operand is refused) and raises
  ``TypeError`` where it has none; ``operator.index`` takes integer 0-d arrays only;
* ``cuda.get_elapsed_time`` needs two completed timing events of one device;
* every operation issued on the legacy stream is logged in :func:`legacy_work`
  (a device-wide barrier on a real GPU), and every refused implicit conversion
  in :func:`implicit_conversions`, so a test can assert neither happened.

What it cannot see: real timing and overlap, memory use and the pool, kernels
that fail to compile for a GPU, cuML/cuDF behaviour, and races that only show
as wrong numbers (the fake computes every operation at once, in issue order; only
the answers of ``done`` and the order checks model work still in flight).

>>> import gpunets.fakegpu as fg
>>> cp = fg.module(2)
>>> x = cp.asarray([1.0, 2.0])
>>> x.device.id, type(x).__name__
(0, 'ndarray')
>>> import numpy as np
>>> np.asarray(x)
Traceback (most recent call last):
...
TypeError: Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy array explicitly.
>>> cp.asnumpy(x * 2).tolist()
[2.0, 4.0]
>>> with cp.cuda.Device(1):
...     y = cp.ones(2)
>>> x + y
Traceback (most recent call last):
...
ValueError: The device where the array resides (1) is different from the current device (0). (fake GPU: arrays on cuda:0 and cuda:1 mixed in one operation)
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import threading
import time
import weakref
import types
from typing import Any, Callable

import numpy as np

from ._gpulibs import fake_gpu_count
from .exceptions import StreamOrderError

__all__ = ["module", "ndarray", "legacy_work", "implicit_conversions", "order_violations", "reset_log", "launch",
           "seed"]

_lock = threading.RLock()
_tls = threading.local()
_keys = itertools.count(3)
_LEGACY = 0
_IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. "
             "Please use `.get()` to construct a NumPy array explicitly.")

_legacy: list[str] = []
_implicit: list[str] = []
_violations: list[str] = []
_host_seen: dict[int, int] = {}          # stream key -> last op the host has synchronised with
_seq: dict[int, int] = {}                # stream key -> ops issued on it so far
_waited: dict[int, dict[int, int]] = {}  # stream key -> {producer key: op it waited for}
_nonblocking: set[int] = set()          # keys of streams made with non_blocking=True
_streams_by_ptr: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_buffers: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()   # data pointer -> array
_allocator: list[Any] = []               # what set_allocator was given (the fake does not allocate through it)
_rng = random.Random(int(os.environ.get("GPUNETS_FAKE_GPU_SEED", "0") or 0))


def legacy_work() -> list[str]:
    """Operations issued on the legacy default stream (``Stream.null``) since the last :func:`reset_log`."""
    with _lock:
        return list(_legacy)


def implicit_conversions() -> list[str]:
    """Refused implicit host conversions (each also raised ``TypeError``) since the last :func:`reset_log`."""
    with _lock:
        return list(_implicit)


def order_violations() -> list[str]:
    """Stream-order violations (each also raised :class:`StreamOrderError`) since the last :func:`reset_log`."""
    with _lock:
        return list(_violations)


def seed(value: int) -> None:
    """Reseed the generator that decides when queued work has finished (see ``Event.done``); default
    ``GPUNETS_FAKE_GPU_SEED`` (0).  The same seed and the same single-threaded calls give the same answers."""
    with _lock:
        _rng.seed(int(value))


def reset_log() -> None:
    """Forget the logged legacy-stream work, implicit conversions and order violations."""
    with _lock:
        _legacy.clear()
        _implicit.clear()
        _violations.clear()


# ----------------------------------------------------------------- devices, streams, events


class CUDARuntimeError(RuntimeError):
    """What CuPy raises for a bad CUDA call (here: an invalid device ordinal)."""


class Device:
    """``cupy.cuda.Device``: a device ordinal and a per-thread context manager making it current."""

    def __init__(self, device: Any = None) -> None:
        if device is None:
            device = _current_device()
        device = int(getattr(device, "id", device))
        if not 0 <= device < _count():
            raise CUDARuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {device} "
                                   f"(fake GPU with {_count()} device(s))")
        self.id = device
        self._prev: list[int] = []

    def __enter__(self) -> "Device":
        self._prev.append(_current_device())
        _tls.device = self.id
        return self

    def __exit__(self, *exc: object) -> None:
        _tls.device = self._prev.pop()

    def use(self) -> None:
        _tls.device = self.id

    def synchronize(self) -> None:
        with _lock:
            for key, n in _seq.items():
                _host_seen[key] = max(_host_seen.get(key, 0), n)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("fake-cuda", self.id))

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"


def _count() -> int:
    return _state.count


def _current_device() -> int:
    return getattr(_tls, "device", 0)


class _StreamMeta(type):
    @property
    def null(cls) -> "Stream":
        """The legacy default stream (a device-wide barrier on a real GPU)."""
        return _NULL

    @property
    def ptds(cls) -> "Stream":
        """This thread's per-thread default stream."""
        s = getattr(_tls, "ptds", None)
        if s is None:
            s = _tls.ptds = Stream(_ptds=True)
        return s


class Stream(metaclass=_StreamMeta):
    """``cupy.cuda.Stream``: a queue of work; ``with stream:`` makes it this thread's current stream."""

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False,
                 *, _ptds: bool = False) -> None:
        if (null or ptds) and not _ptds and _NULL_READY:
            raise ValueError("Use cupy.cuda.Stream.null / cupy.cuda.Stream.ptds for the default streams.")
        self.key = _LEGACY if null else next(_keys)
        self.ptr = 0 if null else (2 if _ptds else 0x7F000000 + self.key)
        self.non_blocking = non_blocking
        self.is_ptds = _ptds
        # as CuPy: the default streams belong to whichever device is current (-1), others to their creator's
        self.device_id = -1 if (null or _ptds) else _current_device()
        self._prev: list[tuple[int, Stream]] = []
        with _lock:
            _seq.setdefault(self.key, 0)
            _waited.setdefault(self.key, {})
            if non_blocking:
                _nonblocking.add(self.key)
        if not (null or _ptds):
            _streams_by_ptr[self.ptr] = self

    @classmethod
    def from_external(cls, stream: Any, device_id: int = -1) -> "Stream":
        """``Stream.from_external`` (CuPy >= 14): the stream behind an object with ``__cuda_stream__``."""
        return _external(int(stream.__cuda_stream__()[1]))

    def _check_device(self) -> int:
        cur = _current_device()
        if self.device_id not in (-1, cur):   # CuPy's check_stream_device_match
            raise RuntimeError(f"The device that the stream is created on ({self.device_id}) does not match with "
                               f"the current device ({cur})")
        return cur

    def __enter__(self) -> "Stream":
        dev = self._check_device()
        self._prev.append((dev, get_current_stream()))
        _current_streams()[dev] = self
        return self

    def __exit__(self, *exc: object) -> None:
        dev, prev = self._prev.pop()
        _current_streams()[dev] = prev

    def use(self) -> "Stream":
        _current_streams()[self._check_device()] = self
        return self

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol: (version, pointer), as CuPy's."""
        return (0, self.ptr)

    @property
    def is_non_blocking(self) -> bool:
        return self.non_blocking

    def record(self, event: "Event | None" = None) -> "Event":
        event = event if event is not None else Event()
        event.record(self)
        return event

    def wait_event(self, event: "Event") -> None:
        if event._snapshot is None:
            return
        with _lock:
            mine = _waited[self.key]
            for key, n in event._snapshot.items():
                if n > mine.get(key, 0):
                    mine[key] = n

    def synchronize(self) -> None:
        with _lock:
            snap = dict(_waited[self.key])
            snap[self.key] = _seq[self.key]
            _host_sees(snap)

    @property
    def done(self) -> bool:
        """``cudaStreamQuery``: all work done?  Random (seeded) until the stream is synchronised."""
        with _lock:
            snap = dict(_waited[self.key])
            snap[self.key] = _seq[self.key]
            if _seen_all(snap) or _finished():
                _host_sees(snap)
                return True
            return False

    def __repr__(self) -> str:
        name = "null" if self.key == _LEGACY else ("ptds" if self.is_ptds else str(self.key))
        return f"<fake Stream {name} (device {self.device_id})>"


def _external(ptr: int) -> Stream:
    if ptr == 0:
        return _NULL
    if ptr == 2:
        return Stream.ptds
    s = _streams_by_ptr.get(ptr)
    if s is None:
        raise CUDARuntimeError(f"cudaErrorInvalidResourceHandle: invalid resource handle (no fake stream {ptr:#x})")
    return s


def ExternalStream(ptr: int, device_id: int = -1) -> Stream:  # noqa: N802 - CuPy's name
    """``cupy.cuda.ExternalStream`` (deprecated in CuPy 14): the fake stream with pointer ``ptr``."""
    return _external(int(ptr))


def _host_sees(snap: dict[int, int]) -> None:
    for key, n in snap.items():
        if n > _host_seen.get(key, 0):
            _host_seen[key] = n


def _seen_all(snap: dict[int, int]) -> bool:
    return all(_host_seen.get(key, 0) >= n for key, n in snap.items())


def _finished() -> bool:
    """Whether queued GPU work has finished by the time the host asks (``query``/``done``): random, seeded.

    On a GPU, work completes some time after it is issued; the fake answers a query at random (with
    ``GPUNETS_FAKE_GPU_SEED``, default 0, seeding one generator per process), so code that polls once and
    then reads without waiting shows its missing wait on some runs, and a failing run can be replayed.
    """
    return _rng.random() < 0.5


def _device_error(what: str, event_dev: int, stream_dev: int) -> "CUDARuntimeError":
    return CUDARuntimeError(f"cudaErrorInvalidResourceHandle: invalid resource handle ({what}: the event was "
                            f"created on device {event_dev}, the stream belongs to device {stream_dev}; create "
                            f"the event under `with cupy.cuda.Device({stream_dev}):`)")


class Event:
    """``cupy.cuda.Event``: a point in a stream's work; ``wait_event`` on it orders another stream after it."""

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False) -> None:
        if interprocess and not disable_timing:
            raise ValueError("Timing must be disabled for interprocess events")
        self._snapshot: dict[int, int] | None = None
        self._complete = False
        self._time = 0.0
        self.timing = not disable_timing
        self.block = block
        self.device_id = _current_device()   # an event belongs to the device current when it is made
        self.ptr = 0x7E000000 + next(_keys)

    def record(self, stream: Stream | None = None) -> None:
        stream = stream if stream is not None else get_current_stream()
        sdev = stream.device_id if stream.device_id != -1 else _current_device()
        if sdev != self.device_id:   # cudaEventRecord: event and stream on one device
            raise _device_error("Event.record", self.device_id, sdev)
        with _lock:
            snap = dict(_waited[stream.key])
            snap[stream.key] = _seq[stream.key]
            self._snapshot = snap
            self._complete = False
            self._time = time.perf_counter()

    @property
    def done(self) -> bool:
        """``cudaEventQuery``: has the recorded work finished?  Random (seeded) until it has been waited for."""
        if self._snapshot is None or self._complete:
            return True
        with _lock:
            if _seen_all(self._snapshot) or _finished():
                _host_sees(self._snapshot)
                self._complete = True
        return self._complete

    def synchronize(self) -> None:
        if self._snapshot is not None:
            with _lock:
                _host_sees(self._snapshot)
                self._complete = True


def get_elapsed_time(start_event: Event, end_event: Event) -> float:
    """``cupy.cuda.get_elapsed_time``: milliseconds between two completed timing events of one device."""
    for ev in (start_event, end_event):
        if not ev.timing:
            raise CUDARuntimeError("cudaErrorInvalidResourceHandle: invalid resource handle (get_elapsed_time on "
                                   "an event made with disable_timing=True)")
        if ev._snapshot is None:
            raise CUDARuntimeError("cudaErrorInvalidResourceHandle: invalid resource handle (get_elapsed_time on "
                                   "an event that was never recorded)")
        if not ev._complete:
            raise CUDARuntimeError("cudaErrorNotReady: device not ready (get_elapsed_time before the event "
                                   "completed: synchronize it first)")
    if start_event.device_id != end_event.device_id:
        raise _device_error("get_elapsed_time", start_event.device_id, end_event.device_id)
    return (end_event._time - start_event._time) * 1e3


_NULL_READY = False
_NULL = Stream(null=True)
_NULL_READY = True


def _current_streams() -> dict[int, Stream]:
    d = getattr(_tls, "streams", None)
    if d is None:
        d = _tls.streams = {}
    return d


def get_current_stream(device_id: int = -1) -> Stream:
    """This thread's current stream on ``device_id`` (default: the current device), as CuPy's: one per device;
    ``Stream.ptds`` when ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``, else ``Stream.null``."""
    s = _current_streams().get(_current_device() if device_id == -1 else int(device_id))
    if s is not None:
        return s
    return Stream.ptds if os.environ.get("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "0") == "1" else _NULL


def _issue(what: str, inputs: list["ndarray"]) -> tuple[int, int]:
    """Check that the current stream may read ``inputs``; count one operation on it; return (stream, op)."""
    s = get_current_stream()
    with _lock:
        if s.key == _LEGACY:
            _legacy.append(what)
        mine = _waited[s.key]
        for a in inputs:
            k, n = a._key, a._seq
            if k == s.key:
                continue
            # the legacy stream synchronises with blocking streams only (not with non_blocking=True ones)
            if (k == _LEGACY and s.key not in _nonblocking) or (s.key == _LEGACY and k not in _nonblocking):
                continue
            if mine.get(k, 0) >= n or _host_seen.get(k, 0) >= n:
                continue
            msg = (f"fake GPU: {what} on stream {s!r} (thread {threading.current_thread().name}) reads a value "
                   f"made on another stream (op {n} of stream {k}) without waiting for an event recorded after "
                   f"it (Stream.wait_event) or a host synchronisation.")
            _violations.append(msg)
            raise StreamOrderError(msg)
        _seq[s.key] += 1
        return s.key, _seq[s.key]


# ----------------------------------------------------------------- arrays


class _FlatIter:
    """``ndarray.flat`` as CuPy's ``flatiter``: indexing reads the flattened array on the device."""

    __slots__ = ("base",)

    def __init__(self, base: "ndarray") -> None:
        self.base = base

    def __len__(self) -> int:
        return self.base.size

    def __getitem__(self, key: Any) -> "ndarray":
        return _wrap_call("flat", lambda a, k: a.reshape(-1)[k], (self.base, key), {})

    def __iter__(self) -> Any:
        flat = _wrap_call("ravel", lambda a: a.reshape(-1), (self.base,), {})
        return (flat[i] for i in range(len(self)))


class ndarray:  # noqa: N801 - CuPy's name
    """A device array: a NumPy buffer that only moves to the host explicitly."""

    __slots__ = ("_a", "_dev", "_key", "_seq", "__weakref__")
    __array_priority__ = 100

    def __init__(self, shape: Any, dtype: Any = float) -> None:
        _init(self, np.empty(shape, dtype=dtype), _current_device(), _issue("ndarray", []))

    # --- host moves
    def get(self, stream: Stream | None = None, out: Any = None, order: str = "C", blocking: bool = True) -> np.ndarray:
        _read("get", [self], stream)
        if blocking:   # a blocking copy waits, on the host, for the stream it ran on
            (stream if stream is not None else get_current_stream()).synchronize()
        return np.array(self._a, order=order)

    def item(self) -> Any:
        return self.get().item()

    def tolist(self) -> Any:
        return self.get().tolist()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        with _lock:
            _implicit.append(f"__array__ on a {self.shape} array on cuda:{self._dev}")
        raise TypeError(_IMPLICIT)

    def __float__(self) -> float:
        return float(self._scalar("float"))

    def __int__(self) -> int:
        return int(self._scalar("int"))

    def __index__(self) -> int:
        if self._a.dtype.kind not in "iu":   # as NumPy and CuPy: a bool is no index
            raise TypeError("only integer scalar arrays can be converted to a scalar index")
        return int(self._scalar("index"))

    def __bool__(self) -> bool:
        return bool(self._scalar("bool"))

    def __complex__(self) -> complex:
        return complex(self._scalar("complex"))

    def _scalar(self, what: str) -> Any:
        if self._a.ndim != 0:
            with _lock:
                _implicit.append(f"{what}() on a {self.shape} array on cuda:{self._dev}")
            raise TypeError(f"{what}() is only allowed on 0-dimensional arrays (fake GPU, as strict as CuPy); "
                            f"got shape {self.shape}. Use .get() to read it on the host.")
        return self.get()[()]

    def __reduce__(self) -> Any:
        # pickling copies through the host, as CuPy's does; it may run on any thread (dask's comms), so it is
        # treated as a device-wide synchronisation first (lenient: the fake does not model serialisers' streams)
        Device(self._dev).synchronize()
        return _rebuild, (self.get(),)

    # --- attributes
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)

    @property
    def device(self) -> Device:
        return Device(self._dev)

    @property
    def data(self) -> Any:
        """``MemoryPointer``-like: ``ptr`` (the buffer's address, known to ``runtime.pointerGetAttributes``)
        and ``device_id``."""
        ptr = int(self._a.__array_interface__["data"][0])
        with _lock:
            _buffers[ptr] = self
        return types.SimpleNamespace(ptr=ptr, device_id=self._dev)

    @property
    def T(self) -> "ndarray":  # noqa: N802
        return _wrap_call("T", lambda a: a.T, (self,), {})

    @property
    def flat(self) -> "_FlatIter":
        return _FlatIter(self)

    @property
    def mT(self) -> "ndarray":  # noqa: N802
        return _wrap_call("mT", lambda a: np.swapaxes(a, -1, -2), (self,), {})

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return repr(self._a)   # CuPy's repr also copies to the host

    def __array_namespace__(self, api_version: str | None = None) -> Any:
        return _state.xp

    def to_device(self, device: Any, stream: Any = None) -> Any:
        return _state.xp.asarray(self, device=device)

    def __getitem__(self, key: Any) -> "ndarray":
        return _wrap_call("getitem", lambda a, k: a[k], (self, key), {})

    def __setitem__(self, key: Any, value: Any) -> None:
        _read("setitem", _arrays((self, key, value)), None)
        self._a[_unwrap(key, "setitem")] = _unwrap(value, "setitem")

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if kwargs.get("out") is not None:
            return NotImplemented
        return _wrap_call(ufunc.__name__, getattr(ufunc, method), inputs, kwargs)

    def __array_function__(self, func: Any, types_: Any, args: Any, kwargs: Any) -> Any:
        # CuPy runs ``np.f(x)`` as ``cupy.f(x)`` when CuPy has an ``f`` in the matching module, else NumPy
        # raises TypeError ("no implementation found"); a NumPy array among the operands is refused by ``cupy.f``
        name, mod = func.__name__, getattr(func, "__module__", "") or ""
        if name in ("asarray", "array", "asanyarray", "ascontiguousarray") or mod not in _CUPY_MODULES \
                or name in _NOT_IN_CUPY or not all(t in (ndarray, np.ndarray) for t in types_):
            with _lock:
                _implicit.append(f"{mod}.{name} on a device array (CuPy has no {name})")
            return NotImplemented
        return _wrap_call(name, func, args, kwargs)


#: NumPy modules CuPy mirrors (``np.linalg.norm`` -> ``cupy.linalg.norm``); functions of others (``numpy.ma``,
#: ``numpy.char``, ``numpy.rec``, ``numpy.strings``...) have no CuPy twin.
_CUPY_MODULES = frozenset({"numpy", "numpy.linalg", "numpy.fft", "numpy.lib.stride_tricks"})
#: NumPy functions CuPy does not have (checked against CuPy 14's namespace): ``np.f(device_array)`` raises.
_NOT_IN_CUPY = frozenset("""apply_over_axes asmatrix bmat einsum_path genfromtxt loadtxt savetxt fromregex
busday_count busday_offset is_busday datetime_as_string""".split())


def _init(arr: ndarray, a: np.ndarray, dev: int, issued: tuple[int, int]) -> ndarray:
    arr._a, arr._dev = a, dev
    arr._key, arr._seq = issued
    return arr


def _new(a: Any, dev: int, issued: tuple[int, int]) -> ndarray:
    return _init(ndarray.__new__(ndarray), np.asarray(a), dev, issued)


def _rebuild(host: np.ndarray, dev: int | None = None) -> ndarray:
    """Unpickle as CuPy does (``cupy.array(host)``): on the thread's *current* device, whatever device the
    array was pickled from (``dev`` is kept only to read older pickles)."""
    if _state.cupy is None:   # unpickled in a fresh process (a dask worker)
        module()
    out = asarray(host)
    get_current_stream().synchronize()   # unpickled on any thread (dask's comms): complete before use
    return out


_METHODS = ("copy astype reshape ravel flatten transpose squeeze swapaxes sum mean min max prod any all argmax "
            "argmin std var cumsum cumprod round clip nonzero take repeat dot conj sort argsort fill view").split()


def _method(name: str) -> Callable[..., Any]:
    def call(self: ndarray, *args: Any, **kwargs: Any) -> Any:
        if name == "copy":   # CuPy: copies to the *current* device
            return _wrap_call(name, lambda a, *r, **k: a.copy(*r, **k), (self, *args), kwargs,
                              device=Device(_current_device()))
        if name == "fill":
            _read("fill", [self], None)
            self._a.fill(*args)
            return None
        return _wrap_call(name, lambda a, *r, **k: getattr(a, name)(*r, **k), (self, *args), kwargs)

    call.__name__ = name
    return call


for _m in _METHODS:
    setattr(ndarray, _m, _method(_m))

_OPS = ("add sub mul truediv floordiv mod pow matmul and or xor lshift rshift lt le gt ge eq ne").split()
for _op in _OPS:
    for _fmt in ("__{}__", "__r{}__"):
        _name = _fmt.format(_op)
        if _op in ("lt", "le", "gt", "ge", "eq", "ne") and _fmt == "__r{}__":
            continue
        _np = getattr(np.ndarray, _name)
        setattr(ndarray, _name, (lambda f, n: lambda self, other: _wrap_call(n, f, (self, other), {}))(_np, _name))
    _iname = f"__i{_op}__"
    if hasattr(np.ndarray, _iname):
        setattr(ndarray, _iname, (lambda f, n: lambda self, other: _inplace(self, f, other, n))(
            getattr(np.ndarray, _iname), _iname))
for _name in ("__neg__", "__pos__", "__abs__", "__invert__"):
    setattr(ndarray, _name, (lambda f, n: lambda self: _wrap_call(n, f, (self,), {}))(getattr(np.ndarray, _name), _name))
ndarray.__hash__ = None  # type: ignore[assignment]


def _inplace(self: ndarray, f: Any, other: Any, name: str) -> ndarray:
    _read(name, _arrays((self, other)), None)
    f(self._a, _unwrap(other, name))
    return self


# ----------------------------------------------------------------- calls


def _arrays(obj: Any) -> list[ndarray]:
    if isinstance(obj, ndarray):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [a for o in obj for a in _arrays(o)]
    if isinstance(obj, dict):
        return [a for o in obj.values() for a in _arrays(o)]
    return []


def _unwrap(obj: Any, what: str) -> Any:
    if isinstance(obj, ndarray):
        return obj._a
    if isinstance(obj, np.ndarray):
        raise TypeError(f"Unsupported type {type(obj)} in {what} (fake GPU, as strict as CuPy): move host data to "
                        f"the device first with cupy.asarray(...).")
    if isinstance(obj, tuple):
        return tuple(_unwrap(o, what) for o in obj)
    if isinstance(obj, list):
        return [_unwrap(o, what) for o in obj]
    if isinstance(obj, dict):
        return {k: _unwrap(v, what) for k, v in obj.items()}
    return obj


def _one_device(arrays: list[ndarray], what: str, device: Any = None) -> int:
    devs = sorted({a._dev for a in arrays})
    if len(devs) > 1:
        raise ValueError(f"The device where the array resides ({devs[1]}) is different from the current device "
                         f"({devs[0]}). (fake GPU: arrays on {', '.join(f'cuda:{d}' for d in devs)} mixed in one "
                         f"operation)")
    if device is not None:
        return _device_id(device)
    return devs[0] if devs else _current_device()


def _device_id(device: Any) -> int:
    if isinstance(device, Device):
        return device.id
    if isinstance(device, int):
        return Device(device).id
    text = str(device)
    if text.startswith("cuda"):
        return Device(int(text.split(":")[1]) if ":" in text else 0).id
    raise ValueError(f"fake GPU: device {device!r} is not a CUDA device of this fake GPU; "
                     f"move to the host with cupy.asnumpy(x) or x.get().")


def _read(what: str, arrays: list[ndarray], stream: Stream | None) -> tuple[int, int]:
    if stream is not None:
        with stream:
            return _issue(what, arrays)
    return _issue(what, arrays)


def _wrap_out(out: Any, dev: int, issued: tuple[int, int]) -> Any:
    if isinstance(out, (np.ndarray, np.generic)):
        return _new(out, dev, issued)
    if isinstance(out, tuple):
        items = [_wrap_out(o, dev, issued) for o in out]
        return type(out)(*items) if hasattr(out, "_fields") else tuple(items)
    if isinstance(out, list):
        return [_wrap_out(o, dev, issued) for o in out]
    return out


def _wrap_call(what: str, fn: Callable[..., Any], args: Any, kwargs: dict[str, Any], *, host_ok: bool = False,
               device: Any = None) -> Any:
    ins = _arrays((args, kwargs))
    dev = _one_device(ins, what, device)
    issued = _issue(what, ins)
    if host_ok:
        a, k = _unwrap_host_ok(args), _unwrap_host_ok(kwargs)
    else:
        a, k = _unwrap(args, what), _unwrap(kwargs, what)
    return _wrap_out(fn(*a, **k), dev, issued)


def _unwrap_host_ok(obj: Any) -> Any:
    if isinstance(obj, ndarray):
        return obj._a
    if isinstance(obj, (tuple, list)):
        return type(obj)(_unwrap_host_ok(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _unwrap_host_ok(v) for k, v in obj.items()}
    return obj


def asarray(a: Any, dtype: Any = None, order: Any = None, *, blocking: bool = False, device: Any = None,
            copy: Any = None) -> ndarray:
    """Copy host data to the current device (or return a device array, cast or moved as asked)."""
    if isinstance(a, ndarray) and (device is None or _device_id(device) == a._dev):
        if copy:
            return a.astype(a.dtype if dtype is None else dtype, copy=True)
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
    if isinstance(a, ndarray):   # to another device: a device-to-device copy
        issued = _issue("copy to device", [a])
        return _new(np.array(a._a, dtype=dtype), _device_id(device), issued)
    if hasattr(a, "__array_namespace__") and not isinstance(a, (np.ndarray, np.generic)):
        raise TypeError(f"Unsupported type {type(a)}: the fake GPU copies NumPy data and Python sequences only.")
    dev = _device_id(device) if device is not None else _current_device()
    return _new(np.array(_unwrap_host_ok(a), dtype=dtype, copy=True), dev, _issue("host-to-device copy", []))


def asnumpy(a: Any, stream: Stream | None = None, order: str = "C", out: Any = None, blocking: bool = True) -> Any:
    """Copy a device array to the host (``stream`` or the current stream); other values through ``numpy.asarray``."""
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order)
    return np.asarray(a, order=order)


def launch(fn: Callable[..., Any], arrays: Any, what: str = "kernel") -> Any:
    """Run ``fn`` on the device buffers of ``arrays`` as one kernel launch on the current stream.

    The stand-in for a CUDA kernel: ``fn`` receives the NumPy buffers (the
    arrays must be on one device and readable on the current stream) and its
    array results come back as device arrays on that device.
    """
    return _wrap_call(what, fn, (arrays,), {}, device=None)


# ----------------------------------------------------------------- the modules


def _numpy_function(name: str, impl: Any, *, array_api: bool) -> Any:
    if name in ("asarray", "array", "asanyarray"):
        if not array_api:
            return asarray

        def xp_asarray(obj: Any, /, *, dtype: Any = None, device: Any = None, copy: Any = None) -> ndarray:
            return asarray(obj, dtype=dtype, device=device, copy=copy)

        return xp_asarray
    if not callable(impl) or isinstance(impl, type) and not name.startswith("__"):
        return impl

    @functools.wraps(impl)
    def call(*args: Any, **kwargs: Any) -> Any:
        device = kwargs.pop("device", None) if array_api or "device" in kwargs else None
        if device is not None and str(device) == "cpu":
            raise ValueError(f"fake GPU: {name}(device='cpu') asked for; move to the host with cupy.asnumpy(x).")
        return _wrap_call(name, impl, args, kwargs, device=device)

    return call


class _Namespace(types.ModuleType):
    """A module whose functions run NumPy's (or array-api-compat's) on device arrays."""

    def __init__(self, name: str, base: Any, *, array_api: bool, extra: dict[str, Any]) -> None:
        super().__init__(name)
        self._base = base
        self._array_api = array_api
        self.__dict__.update(extra)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name not in ("__array_api_version__",):
            raise AttributeError(name)
        impl = getattr(self._base, name)
        if isinstance(impl, types.ModuleType):
            value: Any = _Namespace(f"{self.__name__}.{name}", impl, array_api=self._array_api, extra={})
        elif isinstance(impl, type) or not callable(impl):
            value = impl
        else:
            value = _numpy_function(name, impl, array_api=self._array_api)
        setattr(self, name, value)
        return value


class _Info:
    def default_device(self) -> Device:
        return Device(_current_device())

    def devices(self) -> list[Device]:
        return [Device(i) for i in range(_count())]

    def capabilities(self) -> dict[str, Any]:
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": 64}

    def default_dtypes(self, *, device: Any = None) -> dict[str, Any]:
        return {"real floating": np.dtype(np.float64), "complex floating": np.dtype(np.complex128),
                "integral": np.dtype(np.int64), "indexing": np.dtype(np.int64)}

    def dtypes(self, *, device: Any = None, kind: Any = None) -> dict[str, Any]:
        from sklearn.externals.array_api_compat import numpy as compat  # noqa: PLC0415

        return compat.__array_namespace_info__().dtypes(kind=kind)


def _set_allocator(allocator: Any = None) -> None:
    _allocator[:] = [allocator]


def _pointer_attributes(ptr: int) -> Any:
    """``cudaPointerGetAttributes`` for the data pointer of a live fake array (``x.data.ptr``)."""
    arr = _buffers.get(int(ptr))
    if arr is None:
        raise CUDARuntimeError(f"cudaErrorInvalidValue: invalid argument (no fake device memory at {int(ptr):#x})")
    return types.SimpleNamespace(device=arr._dev, type=2, devicePointer=int(ptr))


def _device_attribute(attr: int, device: int) -> int:
    Device(device)   # an invalid ordinal raises, as CUDA does
    if attr == 16:   # cudaDevAttrMultiProcessorCount: a small GPU
        return 4
    raise CUDARuntimeError(f"fake GPU: device attribute {attr} is not modelled (only the SM count, 16)")


class _State:
    count = 0
    cupy: Any = None
    xp: Any = None


_state = _State()


def _build(count: int) -> Any:
    from sklearn.externals.array_api_compat import numpy as compat  # noqa: PLC0415

    cuda = types.ModuleType("gpunets.fakegpu.cuda")
    runtime = types.ModuleType("gpunets.fakegpu.cuda.runtime")
    runtime.__dict__.update(getDeviceCount=lambda: _state.count, getDevice=_current_device,
                            pointerGetAttributes=_pointer_attributes,
                            CUDARuntimeError=CUDARuntimeError, cudaDevAttrMultiProcessorCount=16,
                            deviceGetAttribute=_device_attribute)
    cuda.__dict__.update(Device=Device, Stream=Stream, Event=Event, runtime=runtime,
                         get_current_stream=get_current_stream, is_available=lambda: _state.count > 0,
                         get_elapsed_time=get_elapsed_time, CUDARuntimeError=CUDARuntimeError,
                         ExternalStream=ExternalStream, set_allocator=_set_allocator)
    shared = dict(ndarray=ndarray, cuda=cuda, asnumpy=asnumpy, is_available=lambda: _state.count > 0,
                  legacy_work=legacy_work, implicit_conversions=implicit_conversions, launch=launch,
                  order_violations=order_violations, reset_log=reset_log, __version__="fake")
    _state.cupy = _Namespace("gpunets.fakegpu.cupy", np, array_api=False, extra=shared)
    # named "cupy": scikit-learn moves arrays of a namespace called "cupy" to the host with .get(), as for CuPy
    _state.xp = _Namespace("cupy", compat, array_api=True,
                           extra=dict(shared, __array_namespace_info__=_Info,
                                      __array_api_version__=compat.__array_api_version__))
    _state.count = count


def module(count: int | None = None) -> Any:
    """The fake ``cupy`` module with ``count`` devices (default: ``GPUNETS_FAKE_GPU``).

    Calling it again with another ``count`` changes the number of devices the fake has.
    """
    if count is None:
        count = fake_gpu_count() or 1
    if count not in (1, 2):
        raise ValueError(f"fake GPU: count={count!r}; expected 1 or 2 devices.")
    with _lock:
        if _state.cupy is None:
            _build(count)
        _state.count = count
    return _state.cupy

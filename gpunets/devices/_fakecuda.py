"""The fake GPU's CUDA runtime: devices, streams, events and the logs of what the lane checks.

Part of :mod:`gpunets.devices.fakegpu` (see there): the legacy and per-thread default streams, non-blocking
streams, events that complete at a random (seeded) moment, the order checker, and the logs (legacy-stream work,
implicit conversions, order violations).
"""

from __future__ import annotations

import itertools
import os
import random
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from gpunets.base.exceptions import StreamOrderError

if TYPE_CHECKING:  # pragma: no cover
    from gpunets.devices.fakegpu import ndarray


class _State:
    """How many fake devices there are, and the fake modules once built."""

    count = 0
    cupy: Any = None
    xp: Any = None


_state = _State()
_lock = threading.RLock()
_tls = threading.local()
_keys = itertools.count(3)
_LEGACY = 0
_IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. "
             "Please use `.get()` to construct a NumPy array explicitly.")

_legacy: list[str] = []
_implicit: list[str] = []
_violations: list[str] = []
_host_reads: list[str] = []              # each read of device data on the host (a sync on a real GPU)
_host_seen: dict[int, int] = {}          # stream key -> last op the host has synchronised with
_seq: dict[int, int] = {}                # stream key -> ops issued on it so far
_waited: dict[int, dict[int, int]] = {}  # stream key -> {producer key: op it waited for}
_nonblocking: set[int] = set()          # keys of streams made with non_blocking=True
_streams_by_ptr: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_buffers: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()   # data pointer -> array
_allocator: list[Any] = []               # what set_allocator was given (the fake does not allocate through it)
_rng = random.Random(int(os.environ.get("GPUNETS_FAKE_GPU_SEED", "0") or 0))
_CAPTURES: dict[int, Any] = {}           # stream key -> its capture in progress (gpunets.devices._fakegraph)
_POISONED: dict[int, str] = {}           # id(array) -> why reading it is refused (memory a live graph uses)


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


def host_reads() -> list[str]:
    """Each read of device data on the host since the last :func:`reset_log`: ``.get()``, ``asnumpy``,
    ``item()``, ``tolist()``, ``float()``/``int()``/``bool()`` of an array (each one a host synchronisation on a
    real GPU), as ``"what at file:line"`` of the first caller outside the fake GPU."""
    with _lock:
        return list(_host_reads)


def count_host_read(what: str) -> None:
    """Log one host read (see :func:`host_reads`), naming the first caller outside the fake GPU."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.endswith(("fakegpu.py", "_fakecuda.py")):
        f = f.f_back
    where = f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}" if f is not None else "?"
    with _lock:
        _host_reads.append(f"{what} at {where}")


def seed(value: int) -> None:
    """Reseed the generator that decides when queued work has finished (see ``Event.done``); default
    ``GPUNETS_FAKE_GPU_SEED`` (0).  The same seed and the same single-threaded calls give the same answers."""
    with _lock:
        _rng.seed(int(value))


def reset_log() -> None:
    """Forget the logged legacy-stream work, implicit conversions, order violations and host reads."""
    with _lock:
        _legacy.clear()
        _implicit.clear()
        _violations.clear()
        _host_reads.clear()


# ----------------------------------------------------------------- devices, streams, events


class CUDARuntimeError(RuntimeError):
    """What CuPy raises for a bad CUDA call (here: an invalid device ordinal)."""


class PoisonedBufferError(RuntimeError):
    """Fake GPU only: an array was read whose memory a live CUDA graph still writes (see ``_fakegraph``)."""


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

    def __enter__(self) -> Device:
        self._prev.append(_current_device())
        _tls.device = self.id
        return self

    def __exit__(self, *exc: object) -> None:
        _tls.device = self._prev.pop()

    def use(self) -> None:
        _tls.device = self.id

    def synchronize(self) -> None:
        if _CAPTURES:   # cudaDeviceSynchronize is illegal while any stream of the device captures
            _refuse_in_capture([k for k, c in list(_CAPTURES.items()) if c.device == self.id],
                               "cudaErrorStreamCaptureUnsupported", "Device.synchronize()")
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
    def null(cls) -> Stream:
        """The legacy default stream (a device-wide barrier on a real GPU)."""
        return _NULL

    @property
    def ptds(cls) -> Stream:
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
    def from_external(cls, stream: Any, device_id: int = -1) -> Stream:
        """``Stream.from_external`` (CuPy >= 14): the stream behind an object with ``__cuda_stream__``."""
        return _external(int(stream.__cuda_stream__()[1]))

    def _check_device(self) -> int:
        cur = _current_device()
        if self.device_id not in (-1, cur):   # CuPy's check_stream_device_match
            raise RuntimeError(f"The device that the stream is created on ({self.device_id}) does not match with "
                               f"the current device ({cur})")
        return cur

    def __enter__(self) -> Stream:
        dev = self._check_device()
        self._prev.append((dev, get_current_stream()))
        _current_streams()[dev] = self
        return self

    def __exit__(self, *exc: object) -> None:
        dev, prev = self._prev.pop()
        _current_streams()[dev] = prev

    def use(self) -> Stream:
        _current_streams()[self._check_device()] = self
        return self

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol: (version, pointer), as CuPy's."""
        return (0, self.ptr)

    @property
    def is_non_blocking(self) -> bool:
        return self.non_blocking

    def record(self, event: Event | None = None) -> Event:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        if event._snapshot is None:
            return
        if _CAPTURES or event._capture is not None:
            _capture_wait(self, event)
        with _lock:
            mine = _waited[self.key]
            for key, n in event._snapshot.items():
                if n > mine.get(key, 0):
                    mine[key] = n

    def synchronize(self) -> None:
        if _CAPTURES:
            _refuse_in_capture([self.key], "cudaErrorStreamCaptureUnsupported", "Stream.synchronize()")
        with _lock:
            snap = dict(_waited[self.key])
            snap[self.key] = _seq[self.key]
            _host_sees(snap)

    # --- graph capture (CuPy 14's cupy/cuda/stream.pyx; the graph itself: gpunets.devices._fakegraph)
    def begin_capture(self, mode: int | None = None) -> None:
        """``Stream.begin_capture``: record this stream's work into a graph instead of running it (CuPy refuses
        the legacy stream; ``mode`` is a ``streamCaptureMode*`` of ``runtime``, default relaxed)."""
        if self.ptr in (0, 1):
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if mode is None:
            mode = 2
        if mode not in (0, 1, 2):
            raise CUDARuntimeError(f"cudaErrorInvalidValue: invalid argument (capture mode {mode!r})")
        from gpunets.devices import _fakegraph  # lazy: it builds on this module

        with _lock:
            if self.key in _CAPTURES:
                raise CUDARuntimeError("cudaErrorIllegalState: operation not permitted (this stream is already "
                                       "capturing)")
            _CAPTURES[self.key] = _fakegraph.Capture(self, mode, _current_device())

    def end_capture(self) -> Any:
        """``Stream.end_capture``: the :class:`~gpunets.devices._fakegraph.Graph` of the work recorded since
        :meth:`begin_capture`; raises ``CUDARuntimeError`` if the capture was invalidated or a forked stream
        was not joined back."""
        with _lock:
            cap = _CAPTURES.get(self.key)
            if cap is None or cap.origin is not self:
                raise CUDARuntimeError("cudaErrorIllegalState: end_capture on a stream that is not capturing "
                                       "(or that joined another stream's capture)")
            for k in cap.streams:
                _CAPTURES.pop(k, None)
            unjoined = [k for k in cap.streams if k != self.key and _waited[self.key].get(k, 0) < _seq[k]]
        if cap.invalid is not None:
            cap.discard()
            raise CUDARuntimeError(f"cudaErrorStreamCaptureInvalidated: operation failed due to a previous error "
                                   f"during capture ({cap.invalid})")
        if unjoined:
            cap.discard()
            raise CUDARuntimeError("cudaErrorStreamCaptureUnjoined: capture was not joined: a stream forked from "
                                   "the capture (Stream.wait_event on an event recorded in it) has work the "
                                   "capturing stream did not wait for")
        from gpunets.devices import _fakegraph  # lazy: it builds on this module

        return _fakegraph.Graph(cap)

    def is_capturing(self) -> bool:
        """``Stream.is_capturing``; ``RuntimeError`` when an error has invalidated the capture, as CuPy's."""
        cap = _CAPTURES.get(self.key)
        if cap is not None and cap.invalid is not None:
            raise RuntimeError("the stream was capturing, but an error has invalidated the capture sequence")
        return cap is not None

    @property
    def done(self) -> bool:
        """``cudaStreamQuery``: all work done?  Random (seeded) until the stream is synchronised."""
        if _CAPTURES:
            _refuse_in_capture([self.key], "cudaErrorStreamCaptureUnsupported", "Stream.done")
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


def _live(cap: Any) -> bool:
    return cap is not None and _CAPTURES.get(cap.origin.key) is cap


def _refuse_in_capture(keys: list[int], code: str, what: str) -> None:
    """Raise as CUDA does for a call not permitted while the streams ``keys`` capture, invalidating their
    captures (a later ``end_capture`` raises); nothing when none of them captures."""
    caps = [c for k in keys if (c := _CAPTURES.get(k)) is not None]
    if not caps:
        return
    for c in caps:
        if c.invalid is None:
            c.invalid = what
    raise CUDARuntimeError(f"{code}: operation not permitted when stream is capturing ({what} while "
                           f"{caps[0].origin!r} captures a CUDA graph; the capture is now invalid)")


def _capture_wait(stream: Stream, event: Any) -> None:
    """``wait_event`` and captures: a stream waiting on an event recorded in a capture joins it (a fork); a
    capturing stream may not wait on work outside its capture (isolation) nor merge two captures."""
    ev_cap = event._capture if _live(event._capture) else None
    with _lock:
        mine = _CAPTURES.get(stream.key)
        if ev_cap is not None and mine is None:
            _CAPTURES[stream.key] = ev_cap
            ev_cap.streams.append(stream.key)
            return
    if mine is not None and ev_cap is None and event._capture is None:
        _refuse_in_capture([stream.key], "cudaErrorStreamCaptureIsolation",
                           "Stream.wait_event on an event recorded outside the capture")
    if mine is not None and ev_cap is not None and mine is not ev_cap:
        ev_cap.invalid = ev_cap.invalid or "wait_event merging two captures"
        _refuse_in_capture([stream.key], "cudaErrorStreamCaptureMerge", "wait_event merging two captures")


def _event_in_capture(event: Any, what: str) -> None:
    if event._capture is not None and _live(event._capture):
        _refuse_in_capture([event._capture.origin.key], "cudaErrorStreamCaptureUnsupported",
                           f"{what} of an event recorded in the capture")


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


def _device_error(what: str, event_dev: int, stream_dev: int) -> CUDARuntimeError:
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
        self._capture: Any = None   # the capture it was recorded in (a node of that graph, no host point)

    def record(self, stream: Stream | None = None) -> None:
        stream = stream if stream is not None else get_current_stream()
        sdev = stream.device_id if stream.device_id != -1 else _current_device()
        if sdev != self.device_id:   # cudaEventRecord: event and stream on one device
            raise _device_error("Event.record", self.device_id, sdev)
        with _lock:
            self._capture = _CAPTURES.get(stream.key)
            snap = dict(_waited[stream.key])
            snap[stream.key] = _seq[stream.key]
            self._snapshot = snap
            self._complete = False
            self._time = time.perf_counter()

    @property
    def done(self) -> bool:
        """``cudaEventQuery``: has the recorded work finished?  Random (seeded) until it has been waited for."""
        _event_in_capture(self, "Event.done")
        if self._snapshot is None or self._complete:
            return True
        with _lock:
            if _seen_all(self._snapshot) or _finished():
                _host_sees(self._snapshot)
                self._complete = True
        return self._complete

    def synchronize(self) -> None:
        _event_in_capture(self, "Event.synchronize()")
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
        with _lock:   # complete: synchronized itself, or covered by a later event the host waited for (stream order)
            complete = ev._complete or _seen_all(ev._snapshot)
        if not complete:
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


def _issue(what: str, inputs: list[ndarray]) -> tuple[int, int]:
    """Check that the current stream may read ``inputs``; count one operation on it; return (stream, op)."""
    s = get_current_stream()
    if _CAPTURES and s.key == _LEGACY:   # implicit synchronisation with the capturing streams
        _refuse_in_capture([k for k, c in list(_CAPTURES.items()) if c.device == _current_device()],
                           "cudaErrorStreamCaptureImplicit", f"{what} on the legacy default stream")
    with _lock:
        if s.key == _LEGACY:
            _legacy.append(what)
        mine = _waited[s.key]
        for a in inputs:
            if _POISONED and id(a) in _POISONED:
                raise PoisonedBufferError(_POISONED[id(a)])
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


# --- device attributes and memory -----------------------------------------------------------------------------

def _device_attribute(attr: int, device: int) -> int:
    Device(device)   # an invalid ordinal raises, as CUDA does
    if attr == 16:   # cudaDevAttrMultiProcessorCount: a small GPU
        return 4
    raise CUDARuntimeError(f"fake GPU: device attribute {attr} is not modelled (only the SM count, 16)")


# --- the array API's info ---------------------------------------------------------------------------------------

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

"""A fake GPU: a strict, NumPy-backed stand-in for CuPy with one or two CUDA devices.

Set ``GPUNETS_FAKE_GPU=1`` (or ``2``) before running to make gpunets see that
many CUDA devices on a machine without one: ``gn.gpu_available()`` is True,
``device="auto"`` is ``cuda:0``, and every CuPy call gpunets makes (through
:func:`gpunets.devices._gpulibs.cupy`) goes to this module.  cuDF and cuML count as
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
* every read of device data on the host (``get``, ``asnumpy``, ``item``, ``tolist``, ``float()``/``bool()``
  of an array: a host synchronisation on a real GPU) is logged in :func:`host_reads`, with its caller;
* every operation issued on the legacy stream is logged in :func:`legacy_work`
  (a device-wide barrier on a real GPU), and every refused implicit conversion
  in :func:`implicit_conversions`, so a test can assert neither happened.

What it cannot see: real timing and overlap, memory use and the pool, kernels
that fail to compile for a GPU, cuML/cuDF behaviour, and races that only show
as wrong numbers (the fake computes every operation at once, in issue order; only
the answers of ``done`` and the order checks model work still in flight).

>>> import gpunets.devices.fakegpu as fg
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
import operator
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from gpunets.devices._gpulibs import fake_gpu_count

__all__ = ["module", "ndarray", "legacy_work", "implicit_conversions", "order_violations", "reset_log", "launch",
           "seed", "host_reads"]

from gpunets.devices import _fakegraph as _fg
from gpunets.devices._fakecuda import (
    _CAPTURES,
    _IMPLICIT,
    CUDARuntimeError,
    Device,
    Event,
    ExternalStream,
    Stream,
    _buffers,
    _current_device,
    _device_attribute,
    _implicit,
    _Info,
    _issue,
    _lock,
    _state,
    _tls,
    count_host_read,
    get_current_stream,
    get_elapsed_time,
    host_reads,
    implicit_conversions,
    legacy_work,
    order_violations,
    reset_log,
    seed,
)
from gpunets.devices._fakegraph import _FREE
from gpunets.devices._fakegraph import ACTIVE as _POOLS

# ----------------------------------------------------------------- arrays


class _FlatIter:
    """``ndarray.flat`` as CuPy's ``flatiter``: indexing reads the flattened array on the device."""

    __slots__ = ("base",)

    def __init__(self, base: ndarray) -> None:
        self.base = base

    def __len__(self) -> int:
        return self.base.size

    def __getitem__(self, key: Any) -> ndarray:
        return _wrap_call("flat", lambda a, k: a.reshape(-1)[k], (self.base, key), {})

    def __iter__(self) -> Any:
        flat = _wrap_call("ravel", lambda a: a.reshape(-1), (self.base,), {})
        return (flat[i] for i in range(len(self)))


class ndarray:  # noqa: N801 - CuPy's name
    """A device array: a NumPy buffer that only moves to the host explicitly."""

    __slots__ = ("_a", "_dev", "_key", "_seq", "_pool", "__weakref__")
    __array_priority__ = 100

    def __init__(self, shape: Any, dtype: Any = float) -> None:
        _init(self, np.empty(shape, dtype=dtype), _current_device(), _issue("ndarray", []))

    # --- host moves
    def get(self, stream: Stream | None = None, out: Any = None, order: str = "C", blocking: bool = True) -> np.ndarray:
        if _CAPTURES:
            _fg.host_read("get", stream)
        _read("get", [self], stream)
        count_host_read("get")
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
    def T(self) -> ndarray:  # noqa: N802
        return _wrap_call("T", lambda a: a.T, (self,), {})

    @property
    def flat(self) -> _FlatIter:
        return _FlatIter(self)

    @property
    def mT(self) -> ndarray:  # noqa: N802
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

    def __getitem__(self, key: Any) -> ndarray:
        mask = isinstance(key, ndarray) and key._a.dtype == bool   # a data-dependent shape
        return _wrap_call("boolean mask" if mask else "getitem", lambda a, k: a[k], (self, key), {})

    def __setitem__(self, key: Any, value: Any) -> None:
        cap = _fg.refuse("setitem") if _CAPTURES else None
        ins = _arrays((self, key, value))
        _read("setitem", ins, None)
        k, v = _unwrap(key, "setitem"), _unwrap(value, "setitem")
        if cap is not None:
            _fg.record_inplace(cap, operator.setitem, self, (self._a, k, v), ins)
        self._a[k] = v

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
        if _CAPTURES:
            _fg.refuse(name, mod)
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
    pool = arr._pool = getattr(_tls, "pool", None) if _POOLS[0] else None   # cupy.cuda.using_allocator's pool
    if pool is not None or _FREE:   # counted in its pool; or handed memory a live graph still uses
        _fg.allocated(arr)
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
            cap = _fg.refuse("fill") if _CAPTURES else None
            _read("fill", [self], None)
            if cap is not None:
                _fg.record_inplace(cap, np.ndarray.fill, self, (self._a, *args), [self])
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
    cap = _fg.refuse(name) if _CAPTURES else None
    ins = _arrays((self, other))
    _read(name, ins, None)
    o = _unwrap(other, name)
    if cap is not None:
        _fg.record_inplace(cap, f, self, (self._a, o), ins)
    f(self._a, o)
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
    cap = _fg.refuse(what) if _CAPTURES else None   # a capturing stream records the operation (_fakegraph)
    issued = _issue(what, ins)
    if host_ok:
        a, k = _unwrap_host_ok(args), _unwrap_host_ok(kwargs)
    else:
        a, k = _unwrap(args, what), _unwrap(kwargs, what)
    out = _wrap_out(fn(*a, **k), dev, issued)
    if cap is not None:
        _fg.record(cap, fn, a, k, ins, _arrays(out))
    return out


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
        return _wrap_call("copy to device", lambda x: np.array(x, dtype=dtype), (a,), {}, device=device)
    if hasattr(a, "__array_namespace__") and not isinstance(a, (np.ndarray, np.generic)):
        raise TypeError(f"Unsupported type {type(a)}: the fake GPU copies NumPy data and Python sequences only.")
    dev = _device_id(device) if device is not None else _current_device()
    if _CAPTURES:
        _fg.host_copy("host-to-device copy")
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


def _numpy_function(name: str, impl: Any, *, array_api: bool, namespace: str = "") -> Any:
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
        if _CAPTURES and namespace:
            _fg.refuse(name, namespace)
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
            value = _numpy_function(name, impl, array_api=self._array_api, namespace=self.__name__)
        setattr(self, name, value)
        return value


def _build(count: int) -> Any:
    from sklearn.externals.array_api_compat import numpy as compat  # noqa: PLC0415

    cuda = types.ModuleType("gpunets.devices.fakegpu.cuda")
    runtime = types.ModuleType("gpunets.devices.fakegpu.cuda.runtime")
    runtime.__dict__.update(getDeviceCount=lambda: _state.count, getDevice=_current_device,
                            pointerGetAttributes=_fg._pointer_attributes,
                            CUDARuntimeError=CUDARuntimeError, cudaDevAttrMultiProcessorCount=16,
                            deviceGetAttribute=_device_attribute)
    memory = types.ModuleType("gpunets.devices.fakegpu.cuda.memory")
    memory.__dict__.update(OutOfMemoryError=_fg.OutOfMemoryError, MemoryPool=_fg.MemoryPool)
    runtime.__dict__.update(streamCaptureModeGlobal=0, streamCaptureModeThreadLocal=1, streamCaptureModeRelaxed=2)
    graph = types.ModuleType("gpunets.devices.fakegpu.cuda.graph")
    graph.Graph = _fg.Graph   # type: ignore[attr-defined]
    cuda.__dict__.update(Device=Device, Stream=Stream, Event=Event, runtime=runtime, memory=memory, graph=graph,
                         Graph=_fg.Graph, MemoryPool=_fg.MemoryPool, using_allocator=_fg.using_allocator,
                         get_current_stream=get_current_stream, is_available=lambda: _state.count > 0,
                         get_elapsed_time=get_elapsed_time, CUDARuntimeError=CUDARuntimeError,
                         ExternalStream=ExternalStream, set_allocator=_fg._set_allocator)
    shared = dict(ndarray=ndarray, cuda=cuda, asnumpy=asnumpy, is_available=lambda: _state.count > 0,
                  get_default_memory_pool=_fg._memory_pool,
                  legacy_work=legacy_work, implicit_conversions=implicit_conversions, launch=launch,
                  host_reads=host_reads,
                  order_violations=order_violations, reset_log=reset_log, __version__="fake")
    _state.cupy = _Namespace("gpunets.devices.fakegpu.cupy", np, array_api=False, extra=shared)
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

"""CUDA kernels: ``numba.cuda.jit`` grid-stride loops over a tuple of K device arrays.

Imported lazily, on the first ``target="cuda"`` call.  On a real GPU the inputs are
CuPy arrays (or any object with ``__cuda_array_interface__``), the output is a CuPy
array and the kernel runs on the caller's stream (``stream=None``: CuPy's current
stream, where the inputs were made).  Under numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``) the kernels take and return NumPy arrays, run on a
grid of at most 2 blocks of 64 threads, and ``stream`` is ignored.  With the fake GPU on
(``GPUNETS_FAKE_GPU``, :mod:`gpunets.devices.fakegpu`) under the simulator, the fake's arrays take the GPU
path (stream conversion, GPU-side event wait, allocation on the kernel's stream, launch
configuration) and only the launch runs in the simulator: a fake stream becomes a simulator stream
(the simulator's ``external_stream`` raises), and the launch reads and writes the fake arrays on the
kernel's stream, where the fake checks stream order.
"""

from __future__ import annotations

import builtins
import functools
import math
import threading
from typing import Any

import numba
import numpy as np
from numba import cuda

from gpunets.base.exceptions import DeviceUnavailableError
from gpunets.devices import _gpulibs
from gpunets.kernels import _cached, _labels
from gpunets.kernels import _validate as V
from gpunets.kernels._cached import LAUNCH, LAUNCHES, launch_info, set_launch_path  # noqa: F401 - the path's API

SIMULATOR = bool(numba.config.ENABLE_CUDASIM)
# Host code below reaches the CUDA API as ``numba.cuda``, never through the global ``cuda``: numba's simulator
# swaps every global bound to ``numba.cuda`` in a kernel's module for its per-kernel fake while the kernel runs,
# so another thread launching or checking at that moment would see the fake (no ``is_available``).  For the same
# reason simulated launches run one at a time: two overlapping swaps can restore each other's fake for good.
_SIMULATOR_LAUNCH = threading.Lock()

if SIMULATOR:
    accepted = "numpy.ndarray (under the CUDA simulator)"
    hint = "np.asarray(...)"
else:
    accepted = "CuPy arrays and objects with __cuda_array_interface__"
    hint = "cupy.asarray(...)"


_ROUTE = threading.local()   # .fake: this thread's current call has the fake GPU's arrays


def _fake_gpu() -> bool:
    """The fake-GPU lane (``GPUNETS_FAKE_GPU`` under the simulator) with the fake's arrays: they take the GPU
    path below (streams, event wait, output allocation, launch) and only the launch goes to the simulator."""
    return SIMULATOR and getattr(_ROUTE, "fake", False)


def _routed(fn: Any) -> Any:
    """Entry point: route this call by its inputs (the fake GPU's arrays, or NumPy arrays on the simulator)."""
    @functools.wraps(fn)
    def call(arrays: tuple, *args: Any, **kwargs: Any) -> Any:
        if not SIMULATOR:
            return fn(arrays, *args, **kwargs)
        before = getattr(_ROUTE, "fake", False)
        _ROUTE.fake = bool(_gpulibs.fake_gpu_count()) and not isinstance(arrays[0], np.ndarray)
        try:
            return fn(arrays, *args, **kwargs)
        finally:
            _ROUTE.fake = before

    return call


def _host_path() -> bool:
    """The simulator with NumPy arrays: no CuPy, no streams."""
    return SIMULATOR and not _fake_gpu()


def accept(a: Any) -> bool:
    if SIMULATOR:
        return isinstance(a, np.ndarray) or (bool(_gpulibs.fake_gpu_count()) and isinstance(a, _cupy().ndarray))
    # a CuPy array by its type first: CuPy builds its __cuda_array_interface__ dict at every access
    return type(a) is _cupy_ndarray() or hasattr(a, "__cuda_array_interface__")


def _cupy_ndarray() -> Any:
    try:
        return getattr(_cupy(), "ndarray", None)
    except ImportError:   # numba-cuda without CuPy: device arrays are numba's (or any __cuda_array_interface__)
        return None


def _load_numpy_support() -> None:
    """Import numba-cuda's NumPy support, as its first kernel compile does (a test replaces this)."""
    import importlib

    importlib.import_module("numba.cuda.np.npyimpl")


@functools.cache
def numba_cuda_problem() -> str | None:
    """Why numba-cuda cannot compile kernels with the NumPy installed here, or None; checked once per process.

    numba-cuda loads its NumPy support at the first kernel compile: numba-cuda 0.30 and older register
    ``np.row_stack``, which NumPy 2.5 removed, so there every compile raises an AttributeError far from
    its cause. This imports that support up front and names the versions instead.
    """
    if SIMULATOR:
        return None
    try:
        _load_numpy_support()
    except ModuleNotFoundError:   # another layout of numba-cuda: its first compile will tell
        return None
    except Exception as exc:   # noqa: BLE001 - AttributeError (NumPy 2.5), or any import-time break
        from importlib.metadata import PackageNotFoundError, version

        try:
            nc = version("numba-cuda")
        except PackageNotFoundError:
            nc = "(version unknown)"
        text = str(exc).strip()
        why = f"{type(exc).__name__}: {text.splitlines()[0] if text else repr(exc)}"
        hint = ('NumPy 2.5 removed np.row_stack, which numba-cuda 0.30 and older use: install NumPy below 2.5 '
                '(pip install "numpy<2.5", as gpunets\' gpu extra asks)' if "row_stack" in text else
                "Install versions of numba-cuda, numba and NumPy that support each other (see gpunets' gpu extra)")
        return (f"numba-cuda {nc} cannot compile CUDA kernels with NumPy {np.__version__} and numba "
                f"{numba.__version__}: loading its NumPy support failed ({why}). {hint}.")
    return None


def check_available() -> None:
    problem = numba_cuda_problem()
    if problem is not None:
        raise ImportError(problem)
    if not numba.cuda.is_available():
        msg = ('target="cuda" needs a CUDA GPU, and none is available here; use target="cpu", '
               "or set NUMBA_ENABLE_CUDASIM=1 before numba is imported to run the CUDA kernels on the simulator")
        raise DeviceUnavailableError(msg)


# ---- kernels ------------------------------------------------------------------------------------------------

@cuda.jit
def _k_mean(arrays, div, out):
    K = len(arrays)
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        acc = 0.0
        for k in range(K):
            acc += np.float64(arrays[k][i])
        out[i] = acc / div


@cuda.jit
def _k_wmean(arrays, w, div, out):
    K = len(arrays)
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        acc = 0.0
        for k in range(K):
            acc += w[k] * np.float64(arrays[k][i])
        out[i] = acc / div


@cuda.jit
def _k_sum(arrays, zero, out):
    K = len(arrays)
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        acc = zero
        for k in range(K):
            acc += arrays[k][i]
        out[i] = acc


@cuda.jit
def _k_min(arrays, out):
    K = len(arrays)
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        m = arrays[0][i]
        for k in range(1, K):
            v = arrays[k][i]
            if v < m or v != v:
                m = v
        out[i] = m


@cuda.jit
def _k_max(arrays, out):
    K = len(arrays)
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        m = arrays[0][i]
        for k in range(1, K):
            v = arrays[k][i]
            if v > m or v != v:
                m = v
        out[i] = m


@cuda.jit
def _k_var(arrays, ddof, out):
    K = len(arrays)
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        s = 0.0
        for k in range(K):
            s += np.float64(arrays[k][i])
        m = s / K
        ss = 0.0
        for k in range(K):
            d = np.float64(arrays[k][i]) - m
            ss += d * d
        out[i] = ss / (K - ddof)


@cuda.jit
def _k_vote(arrays, out):
    K = len(arrays)
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        best = arrays[0][i]
        best_count = 0
        for k in range(K):
            v = arrays[k][i]
            c = 0
            for j in range(K):
                if arrays[j][i] == v:
                    c += 1
            if c > best_count or (c == best_count and v < best):
                best = v
                best_count = c
        out[i] = best


@cuda.jit
def _k_hstack(arrays, offsets, out):
    # One thread per output element, in the output's (C) memory order: the threads of a warp store
    # consecutive addresses (coalesced), and read consecutive elements of each input's rows.
    K = len(arrays)
    width = out.shape[1]
    for t in range(cuda.grid(1), out.shape[0] * width, cuda.gridsize(1)):
        i = t // width
        c = t - i * width
        for k in range(K):
            a = arrays[k]
            j = c - offsets[k]
            if j >= 0 and j < a.shape[1]:
                out[i, c] = a[i, j]


_KERNELS = {"mean": _k_mean, "wmean": _k_wmean, "sum": _k_sum, "min": _k_min, "max": _k_max,
            "var": _k_var, "vote": _k_vote, "hstack": _k_hstack}


# ---- what the entry points launch (for the PTX check: ``python -m gpunets.kernels --ptx``) -------------------

#: Every dtype the numeric kernels accept (``_validate.check_numeric``) and ``hstack`` runs in its kernel.
NUMERIC_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                  "float32", "float64")
#: The dtypes each kernel is launched with: ``vote`` votes integer labels, and integer codes of any other labels.
KERNEL_DTYPES: dict[str, tuple[str, ...]] = {name: NUMERIC_DTYPES for name in _KERNELS}
KERNEL_DTYPES["vote"] = tuple(d for d in NUMERIC_DTYPES if np.dtype(d).kind in "iu")


def launch_types(name: str, dtype: Any, k: int) -> tuple:
    """The numba types of kernel ``name``'s arguments when the entry points below launch it on K arrays of ``dtype``.

    Built with ``numba.typeof`` from small host arguments made as the entry points make them (a device array
    has the numba type of the host array of its dtype, shape and layout).
    """
    dtype = np.dtype(dtype)
    ndim = 2 if name == "hstack" else 1
    arrays = tuple(np.zeros((1,) * ndim, dtype) for _ in range(k))
    args: tuple[Any, ...]
    if name == "mean":
        args = (float(k), np.zeros(1, V.mean_dtype(dtype)))
    elif name == "wmean":
        args = (tuple(1.0 for _ in range(k)), float(k), np.zeros(1, V.mean_dtype(dtype)))
    elif name == "sum":
        args = (V.sum_zero(dtype), np.zeros(1, V.sum_dtype(dtype)))
    elif name in ("min", "max", "vote"):
        args = (np.zeros(1, dtype),)
    elif name == "var":
        args = (0.0, np.zeros(1, V.mean_dtype(dtype)))
    elif name == "hstack":
        args = (tuple(int(j) for j in range(k)), np.zeros((1, k), dtype))
    else:
        raise KeyError(name)
    return tuple(numba.typeof(x) for x in (arrays, *args))


# ---- launch configuration and streams -----------------------------------------------------------------------

#: Threads per block on a GPU.
THREADS = 256
#: At most this many blocks per SM: a grid-stride loop then still fills every SM (2048 resident threads
#: = 8 blocks of 256 on an H100/H200), with blocks to spare for the tail; fewer than 8 capped occupancy.
BLOCKS_PER_SM = 32
#: SM count per CUDA device id, read once per device.
_SMS: dict[int, int] = {}


def sm_count() -> int:
    """The SM count of CuPy's current device (where the arrays and the stream are), cached per device."""
    rt = _cupy().cuda.runtime
    dev = int(rt.getDevice())
    n = _SMS.get(dev)
    if n is None:
        n = _SMS[dev] = int(rt.deviceGetAttribute(rt.cudaDevAttrMultiProcessorCount, dev))
    return n


def launch_config(n: int) -> tuple[int, int]:
    """(blocks, threads) for n work items: at most 2 x 64 on the simulator; on a GPU 256 threads per block,
    one item per thread up to ``BLOCKS_PER_SM`` blocks per SM of the current device (then grid-stride)."""
    if SIMULATOR:
        threads = 64
        return builtins.min(2, builtins.max(1, math.ceil(n / threads))), threads
    return builtins.min(BLOCKS_PER_SM * sm_count(), builtins.max(1, math.ceil(n / THREADS))), THREADS



def _is_cupy_stream(stream: Any) -> bool:
    return type(stream).__module__.startswith("cupy") or (_fake_gpu() and isinstance(stream, _cupy().cuda.Stream))


def numba_stream(stream: Any) -> Any:
    """A numba stream for ``stream``: None (numba's default stream), a CuPy stream, or a numba stream."""
    if stream is None:
        return numba.cuda.default_stream()
    if _is_cupy_stream(stream):
        if _fake_gpu():   # the one seam of the fake-GPU lane: the simulator has no external (nor per-thread,
            return numba.cuda.stream()   # nor legacy) streams in every numba version; it runs in issue order
        ptr = int(stream.ptr)
        if ptr == 0:  # cupy.cuda.Stream.null: the legacy default stream
            return numba.cuda.legacy_default_stream()
        if ptr == 2:  # cupy.cuda.Stream.ptds: cudaStreamPerThread
            return numba.cuda.per_thread_default_stream()
        return numba.cuda.external_stream(ptr)
    if hasattr(stream, "handle") and hasattr(stream, "synchronize"):  # a numba stream
        return stream
    msg = (f"stream must be None, a cupy.cuda.Stream or a numba.cuda stream, got {type(stream).__name__}")
    raise TypeError(msg)


class _Handle:
    """A raw stream pointer behind the CUDA stream protocol (for ``cupy.cuda.Stream.from_external``)."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


def _cupy_stream_for(cp: Any, nb: Any) -> Any:
    """The CuPy stream of numba stream ``nb`` (to allocate and copy on the stream the kernel runs on)."""
    ptr = int(nb)   # numba's Stream.__int__: its handle (0 for the default stream)
    if ptr == 0:
        return cp.cuda.Stream.null
    if ptr == 2:
        return cp.cuda.Stream.ptds
    if hasattr(cp.cuda.Stream, "from_external"):   # CuPy >= 14 (ExternalStream is deprecated there)
        return cp.cuda.Stream.from_external(_Handle(ptr))
    return cp.cuda.ExternalStream(ptr)


# ---- array handling ------------------------------------------------------------------------------------------

def _cupy():
    return _gpulibs.cupy()   # real CuPy or the fake GPU


class _Launch:
    """Prepares device views, allocates the output and launches, on the simulator or a GPU.

    On a GPU everything runs on one stream: ``stream``, or CuPy's current stream when
    ``stream`` is None.  The inputs were made on CuPy's current stream (which their
    ``__cuda_array_interface__`` exports); ``as_cuda_array(..., sync=False)`` skips the
    host-side synchronisation of that stream, so when the kernel runs on another stream,
    that stream first waits (on the GPU) for an event recorded on CuPy's current stream.
    Contiguous copies and the output are made on the kernel's stream, so that CuPy's
    pool, which is ordered per stream, never hands their memory out while the kernel runs.
    """

    def __init__(self, stream: Any) -> None:
        self._stream: Any = None
        self._given: Any = None
        self.cupy_stream = None
        if _host_path():
            return
        cp = _cupy()
        current = cp.cuda.get_current_stream()
        if stream is None:
            stream = current
        self._given = stream
        if _is_cupy_stream(stream):
            self.cupy_stream = stream   # numba's stream is made only if numba's dispatcher launches (see stream)
        else:
            self.cupy_stream = _cupy_stream_for(cp, self.stream)
        if int(self.cupy_stream.ptr) != int(current.ptr):
            ev = cp.cuda.Event(disable_timing=True)
            ev.record(current)
            self.cupy_stream.wait_event(ev)

    @property
    def stream(self) -> Any:
        """numba's stream for the kernel's (None on the simulator's host path), made at its first use."""
        if self._stream is None and self._given is not None:
            self._stream = numba_stream(self._given)
        return self._stream

    def _on_stream(self, make: Any) -> Any:
        if self.cupy_stream is None:
            return make()
        with self.cupy_stream:
            return make()

    def flat(self, arrays: tuple) -> tuple:
        if _host_path():
            return tuple(np.ascontiguousarray(a).reshape(-1) for a in arrays)
        cp = _cupy()
        nd = getattr(cp, "ndarray", None)
        if not SIMULATOR and nd is not None and all(type(a) is nd and a.ndim == 1 and a.flags.c_contiguous
                                                    for a in arrays):
            return tuple(arrays)   # already flat (the common case): no CuPy call, no stream switch
        return self._on_stream(lambda: tuple(cp.ascontiguousarray(cp.asarray(a)).reshape(-1) for a in arrays))

    def contiguous(self, arrays: tuple) -> tuple:
        if _host_path():
            return tuple(np.ascontiguousarray(a) for a in arrays)
        cp = _cupy()
        return self._on_stream(lambda: tuple(cp.ascontiguousarray(cp.asarray(a)) for a in arrays))

    def empty(self, shape: tuple, dtype: Any) -> Any:
        if _host_path():
            return np.empty(shape, dtype=dtype)
        cp = _cupy()
        return self._on_stream(lambda: cp.empty(shape, dtype=dtype))

    def _simulate(self, kernel: Any, blocks: int, threads: int, bufs: tuple) -> None:
        arrays, args = bufs
        with _SIMULATOR_LAUNCH:
            kernel[blocks, threads, self.stream](tuple(arrays), *args)

    def run(self, name: str, n: int, arrays: tuple, *args) -> None:
        if n == 0:
            return
        blocks, threads = launch_config(n)
        kernel = _KERNELS[name]
        if not SIMULATOR and _cached.LAUNCH["path"] != "dispatcher":
            cached = cached_kernel(name, arrays[0].dtype, len(arrays))
            if cached is not None:   # numba's PTX through CuPy: no dispatcher on the host (see _cached)
                cached.launch(blocks, threads, self.cupy_stream, (arrays, *args))
                _cached.LAUNCHES["cached"] += 1
                return
        if _host_path():
            with _SIMULATOR_LAUNCH:
                kernel[blocks, threads](arrays, *args)
            return
        if _fake_gpu():   # the fake GPU's arrays, read and written by one launch on the kernel's stream
            with self.cupy_stream:  # type: ignore[union-attr]  # set whenever the fake GPU is on
                _cupy().launch(lambda bufs: self._simulate(kernel, blocks, threads, bufs), (arrays, args),
                               what=f"kernel {name}")
            _cached.LAUNCHES["dispatcher"] += 1
            return
        # sync=False: no host-side synchronisation of the exported stream (ordered on the GPU instead, above)
        dev = tuple(numba.cuda.as_cuda_array(a, sync=False) for a in arrays)
        rest = tuple(numba.cuda.as_cuda_array(x, sync=False) if hasattr(x, "__cuda_array_interface__") else x
                     for x in args)
        kernel[blocks, threads, self.stream](dev, *rest)
        _cached.LAUNCHES["dispatcher"] += 1


# ---- the launch path: numba's dispatcher, or numba's PTX through a cached CuPy handle (see _cached) ---------

def _device_cc(cp: Any) -> tuple[int, tuple[int, int]]:
    dev = int(cp.cuda.runtime.getDevice())
    text = str(cp.cuda.Device(dev).compute_capability)   # "90" -> (9, 0), "100" -> (10, 0)
    return dev, (int(text[:-1]), int(text[-1]))


def cached_kernel(name: str, dtype: Any, k: int) -> Any:
    """The cached launcher of kernel ``name`` for K arrays of ``dtype`` on the current device, compiled and
    loaded at its first use; None where it cannot be (then the dispatcher launches, and the reason is kept)."""
    return _cached.cached_kernel(name, dtype, k, _cupy(), _compile_cached)


def _compile_cached(name: str, dtype: np.dtype, k: int, cp: Any) -> Any:
    """A kernel's CachedKernel, or why it has none (NVVM, the loader or an ABI mismatch: the dispatcher runs it)."""
    try:
        _, cc = _device_cc(cp)
        return _cached.compile_kernel(name, _KERNELS[name].py_func, launch_types(name, dtype, k), cc, cp)
    except Exception as exc:   # noqa: BLE001 - reported by launch_info(); numba's dispatcher launches it
        text = str(exc).strip()
        return f"{type(exc).__name__}: {text.splitlines()[0] if text else repr(exc)}"


def _elementwise(name: str, arrays: tuple, out_dtype: Any, stream: Any, *args) -> Any:
    shape = tuple(arrays[0].shape)
    launch = _Launch(stream)
    flats = launch.flat(arrays)
    n = int(flats[0].shape[0])
    out = launch.empty((n,), out_dtype)
    launch.run(name, n, flats, *args, out)
    return launch._on_stream(lambda: out.reshape(shape))   # the output is the kernel stream's


@_routed
def mean(arrays: tuple, weights: tuple | None, stream: Any = None) -> Any:
    out_dtype = V.mean_dtype(arrays[0].dtype)
    if weights is None:
        return _elementwise("mean", arrays, out_dtype, stream, float(len(arrays)))
    return _elementwise("wmean", arrays, out_dtype, stream, weights, float(np.sum(weights)))


@_routed
def weighted_sum(arrays: tuple, weights: tuple, stream: Any = None) -> Any:
    return _elementwise("wmean", arrays, V.mean_dtype(arrays[0].dtype), stream, weights, 1.0)


@_routed
def sum(arrays: tuple, stream: Any = None) -> Any:  # noqa: A001
    dtype = np.dtype(arrays[0].dtype)
    return _elementwise("sum", arrays, V.sum_dtype(dtype), stream, V.sum_zero(dtype))


@_routed
def min(arrays: tuple, stream: Any = None) -> Any:  # noqa: A001
    return _elementwise("min", arrays, np.dtype(arrays[0].dtype), stream)


@_routed
def max(arrays: tuple, stream: Any = None) -> Any:  # noqa: A001
    return _elementwise("max", arrays, np.dtype(arrays[0].dtype), stream)


@_routed
def var(arrays: tuple, ddof: int, stream: Any = None) -> Any:
    return _elementwise("var", arrays, V.mean_dtype(arrays[0].dtype), stream, float(ddof))


@_routed
def vote_int(arrays: tuple, stream: Any = None) -> Any:
    return _elementwise("vote", arrays, np.dtype(arrays[0].dtype), stream)


@_routed
def vote(arrays: tuple, stream: Any = None) -> Any:
    """Majority labels; labels that are not integers are encoded, voted and decoded, all on the kernel's stream.

    The encoding (``unique``), the kernel and the decoding (a gather) run inside ``with stream:``,
    after one GPU-side wait on CuPy's current stream (where the inputs were made): nothing of the
    vote is left on the current stream to race with the kernel.
    """
    if _labels.is_int_labels(arrays[0].dtype):
        return vote_int(arrays, stream)
    shape = tuple(arrays[0].shape)
    launch = _Launch(stream)   # the kernel's stream now waits for the current one

    def work() -> Any:
        mod = xp()
        codes, uniq = _labels.encode(arrays, mod)
        return uniq[vote_int(codes, launch.cupy_stream)].reshape(shape)

    return launch._on_stream(work)


def xp() -> Any:
    """The array module of this target's arrays (NumPy on the simulator, CuPy on a GPU)."""
    return np if _host_path() else _cupy()


@_routed
def hstack(arrays: tuple, stream: Any = None) -> Any:
    mod = xp()
    cols = tuple(mod.reshape(a, (a.shape[0], 1)) if len(a.shape) == 1 else a for a in arrays)
    dtype = np.dtype(arrays[0].dtype)
    launch = _Launch(stream)
    if dtype.kind not in "biuf" or dtype == np.float16:
        return launch._on_stream(lambda: mod.concatenate(cols, axis=1))
    mats = launch.contiguous(cols)
    widths = [int(m.shape[1]) for m in mats]
    offsets = tuple(int(x) for x in np.concatenate([[0], np.cumsum(widths)[:-1]]).astype(np.int64))
    n = int(mats[0].shape[0])
    out = launch.empty((n, int(np.sum(widths))), dtype)
    if out.size:
        launch.run("hstack", int(out.size), mats, offsets, out)   # one thread per output element
    return out

"""CPU kernels: ``numba.njit`` loops over a tuple of K arrays.

Each kernel is one fused loop over the n output elements that reads the K
inputs (a numba ``UniTuple``) at position i and writes the output once: no
``np.stack``, no temporary of size K*n.  Every kernel exists twice, compiled
serially and with ``parallel=True`` (``prange``); calls with fewer than
:data:`PARALLEL_MIN` elements take the serial one, which avoids the thread
pool's start-up cost.  Both are cached on disk (``cache=True``).

Outputs come from a small pool of freed output buffers (see :func:`output_pool`):
a fresh ``np.empty`` of tens of MB costs a page fault per page on first write,
which is a large share of a memory-bound kernel's time.
"""

from __future__ import annotations

import threading
import types as _pytypes
from typing import Any

import numba
import numpy as np
from numba import prange

from gpunets.kernels import _labels
from gpunets.kernels import _validate as V

#: Calls with at least this many output elements use the ``parallel=True`` kernels.  Set high:
#: these kernels are memory-bound, and on a small or busy machine (2 cores, measured 2026-12-02)
#: the thread pool's start and barrier cost 5 ms at 10^5 elements, while one thread already
#: streams at close to copy bandwidth; at 10^7 both take the same time there.
PARALLEL_MIN = 1 << 22

accepted = "numpy.ndarray"
hint = "np.asarray(...)"


def accept(a: Any) -> bool:
    return isinstance(a, np.ndarray)


# ---- kernels (written once; compiled serial and parallel) --------------------------------------------------

def _k_mean(arrays, div, out):
    K = len(arrays)
    for i in prange(out.shape[0]):
        acc = 0.0
        for k in range(K):
            acc += arrays[k][i]
        out[i] = acc / div


def _k_wmean(arrays, w, div, out):
    K = len(arrays)
    for i in prange(out.shape[0]):
        acc = 0.0
        for k in range(K):
            acc += w[k] * arrays[k][i]
        out[i] = acc / div


def _k_sum(arrays, zero, out):
    K = len(arrays)
    for i in prange(out.shape[0]):
        acc = zero
        for k in range(K):
            acc += arrays[k][i]
        out[i] = acc


def _k_min(arrays, out):
    K = len(arrays)
    for i in prange(out.shape[0]):
        m = arrays[0][i]
        for k in range(1, K):
            v = arrays[k][i]
            if v < m or v != v:  # v != v: NaN propagates (it is never replaced: NaN < x is False)
                m = v
        out[i] = m


def _k_max(arrays, out):
    K = len(arrays)
    for i in prange(out.shape[0]):
        m = arrays[0][i]
        for k in range(1, K):
            v = arrays[k][i]
            if v > m or v != v:
                m = v
        out[i] = m


def _k_var(arrays, ddof, out):
    K = len(arrays)
    for i in prange(out.shape[0]):
        s = 0.0
        for k in range(K):
            s += arrays[k][i]
        m = s / K
        ss = 0.0
        for k in range(K):
            d = arrays[k][i] - m
            ss += d * d
        out[i] = ss / (K - ddof)


def _k_vote(arrays, out):
    # Majority by pairwise counting: O(K^2) per element, no allocation; ties go to the smallest label.
    K = len(arrays)
    for i in prange(out.shape[0]):
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


def _k_hstack(arrays, offsets, out):
    K = len(arrays)
    for i in prange(out.shape[0]):
        for k in range(K):
            a = arrays[k]
            off = offsets[k]
            for j in range(a.shape[1]):
                out[i, off + j] = a[i, j]


def _twin(f):
    """(serial, parallel) dispatchers of ``f``.

    The parallel one is compiled from a copy of ``f`` with its own ``__qualname__``: numba's cache
    is keyed by qualified name and signature, not by options, so two dispatchers of one function
    would load each other's cached code.
    """
    g = _pytypes.FunctionType(f.__code__, f.__globals__, f.__name__ + "_parallel", f.__defaults__, f.__closure__)
    g.__qualname__ = f.__qualname__ + "_parallel"
    g.__module__ = f.__module__
    g.__doc__ = f.__doc__
    return numba.njit(cache=True)(f), numba.njit(cache=True, parallel=True)(g)


_KERNELS = {f.__name__[3:]: _twin(f) for f in (_k_mean, _k_wmean, _k_sum, _k_min, _k_max, _k_var, _k_vote, _k_hstack)}


def _launch(name: str, n: int, *args) -> None:
    serial, parallel = _KERNELS[name]
    (parallel if n >= PARALLEL_MIN else serial)(*args)


# ---- output pool -------------------------------------------------------------------------------------------

class _Pool:
    """Freed output buffers of >= 1 MiB, kept (up to ``limit`` bytes) for reuse by later outputs."""

    MIN_BYTES = 1 << 20

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.free: dict[int, list[np.ndarray]] = {}
        self.lock = threading.RLock()

    def take(self, nbytes: int) -> np.ndarray:
        if nbytes >= self.MIN_BYTES and self.limit > 0:
            with self.lock:
                bufs = self.free.get(nbytes)
                if bufs:
                    self.held -= nbytes
                    return bufs.pop()
        return np.empty(nbytes, dtype=np.uint8)

    def give(self, buf: np.ndarray) -> None:
        with self.lock:
            if self.held + buf.nbytes <= self.limit:
                self.free.setdefault(buf.nbytes, []).append(buf)
                self.held += buf.nbytes

    def clear(self) -> None:
        with self.lock:
            self.free.clear()
            self.held = 0


_POOL = _Pool(512 << 20)


class _Owner:
    """Owns a pooled buffer for the array made from it (and every view of that array: NumPy stops
    collapsing ``.base`` at a non-array object); gives the buffer back when the last one dies."""

    def __init__(self, buf: np.ndarray, shape: tuple, dtype: np.dtype) -> None:
        self.buf = buf
        self.__array_interface__ = {"data": (buf.ctypes.data, False), "shape": shape,
                                    "typestr": dtype.str, "version": 3}

    def __del__(self) -> None:
        try:
            _POOL.give(self.buf)
        except Exception:  # interpreter shutdown
            pass


def empty(shape: tuple, dtype: Any) -> np.ndarray:
    """An uninitialised C-contiguous array, from the pool when a freed buffer of that size is there."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < _Pool.MIN_BYTES or _POOL.limit <= 0:
        return np.empty(shape, dtype=dtype)
    return np.asarray(_Owner(_POOL.take(nbytes), tuple(shape), dtype))


def output_pool(limit: int | None = None) -> dict:
    """Read (and with ``limit``, set) the output pool's size limit in bytes; 0 disables and empties it."""
    if limit is not None:
        if limit < 0:
            msg = f"output_pool(): limit must be >= 0 bytes, got {limit}"
            raise ValueError(msg)
        with _POOL.lock:
            _POOL.limit = int(limit)
            if limit == 0:
                _POOL.clear()
    return {"limit": _POOL.limit, "held": _POOL.held}


# ---- entry points (inputs already validated) ---------------------------------------------------------------

def _flat(arrays: tuple) -> tuple:
    """1-D contiguous, aligned views (copies only where needed), all of one numba type."""
    flats = [np.require(a, requirements=["C", "A"]).reshape(-1) for a in arrays]
    if len({f.flags.writeable for f in flats}) > 1:  # read-only and writeable arrays differ in numba type
        flats = [f if f.flags.writeable else f.copy() for f in flats]
    return tuple(flats)


def _elementwise(name: str, arrays: tuple, out_dtype: np.dtype, *args) -> np.ndarray:
    shape = tuple(arrays[0].shape)
    flats = _flat(arrays)
    n = flats[0].shape[0]
    out = empty((n,), out_dtype)
    if n:
        _launch(name, n, flats, *args, out)
    return out.reshape(shape)


def mean(arrays: tuple, weights: tuple | None, stream: Any = None) -> np.ndarray:
    out_dtype = V.mean_dtype(arrays[0].dtype)
    if weights is None:
        return _elementwise("mean", arrays, out_dtype, float(len(arrays)))
    return _elementwise("wmean", arrays, out_dtype, weights, float(np.sum(weights)))


def weighted_sum(arrays: tuple, weights: tuple, stream: Any = None) -> np.ndarray:
    return _elementwise("wmean", arrays, V.mean_dtype(arrays[0].dtype), weights, 1.0)


def sum(arrays: tuple, stream: Any = None) -> np.ndarray:  # noqa: A001
    dtype = np.dtype(arrays[0].dtype)
    return _elementwise("sum", arrays, V.sum_dtype(dtype), V.sum_zero(dtype))


def min(arrays: tuple, stream: Any = None) -> np.ndarray:  # noqa: A001
    return _elementwise("min", arrays, np.dtype(arrays[0].dtype))


def max(arrays: tuple, stream: Any = None) -> np.ndarray:  # noqa: A001
    return _elementwise("max", arrays, np.dtype(arrays[0].dtype))


def var(arrays: tuple, ddof: int, stream: Any = None) -> np.ndarray:
    return _elementwise("var", arrays, V.mean_dtype(arrays[0].dtype), float(ddof))


def vote_int(arrays: tuple, stream: Any = None) -> np.ndarray:
    return _elementwise("vote", arrays, np.dtype(arrays[0].dtype))


def vote(arrays: tuple, stream: Any = None) -> np.ndarray:
    """Majority labels; labels that are not integers are voted as their codes and decoded."""
    if _labels.is_int_labels(arrays[0].dtype):
        return vote_int(arrays)
    codes, uniq = _labels.encode(arrays, np)
    return uniq[vote_int(codes)].reshape(tuple(arrays[0].shape))


def hstack(arrays: tuple, stream: Any = None) -> np.ndarray:
    cols = [a.reshape(a.shape[0], 1) if a.ndim == 1 else a for a in arrays]
    dtype = np.dtype(arrays[0].dtype)
    if dtype.kind not in "biuf" or dtype == np.float16:  # strings, objects, ...: NumPy does it
        return np.concatenate(cols, axis=1)
    mats = [np.require(c, requirements=["C", "A"]) for c in cols]
    if len({m.flags.writeable for m in mats}) > 1:
        mats = [m if m.flags.writeable else m.copy() for m in mats]
    widths = [m.shape[1] for m in mats]
    offsets = tuple(int(x) for x in np.concatenate([[0], np.cumsum(widths)[:-1]]))
    n = mats[0].shape[0]
    out = empty((n, int(np.sum(widths))), dtype)
    if out.size:
        _launch("hstack", n * len(mats), tuple(mats), offsets, out)
    return out

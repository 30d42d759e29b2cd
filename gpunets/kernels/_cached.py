"""Cached launches of the CUDA combine kernels: numba's PTX, loaded once per signature, launched through CuPy.

numba-cuda's dispatcher prepares every launch on the host: it types each argument, wraps each array through
its CUDA array interface into a device array, and converts each parameter to ctypes (hundreds of
microseconds for eight arrays). The kernels stay numba's: for each (kernel, dtype, K) this module compiles
the kernel's Python function once with ``numba.cuda.compile_ptx`` for the current GPU's compute capability,
loads the PTX with CuPy (``cupy.RawModule(path=...)``) and keeps the kernel's CuPy ``Function``. A
launch then packs the parameters into one preallocated buffer with a precompiled ``struct`` format and calls
the function with pointers into that buffer (CuPy's ``CPointer``, ``cupy/cuda/function.pyx``): the same PTX as the
dispatcher's, the same parameters, so the same bits.

numba's kernel ABI (``numba/cuda/dispatcher.py``, ``_Kernel._prepare_args`` in numba-cuda 0.30): the
arguments are flattened in order; an array becomes ``meminfo`` (0), ``parent`` (0), ``nitems``, ``itemsize``,
``data`` (its device pointer), then its ``shape`` and its ``strides`` (bytes), one parameter each; a tuple is
its elements in turn; an integer, a float or a bool is one parameter of its own width. The PTX entry's
parameter list is checked against this layout (count and width) before a kernel is used, so a numba-cuda
with another ABI falls back to the dispatcher instead of launching garbage.

Every parameter here takes one 8-byte slot of the buffer (a narrower one in the slot's low bytes: the GPUs
are little-endian, and the driver copies each parameter's declared width from its pointer).
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["param_format", "param_values", "ptx_entry", "ptx_param_sizes", "check_abi", "CachedKernel",
           "AbiMismatch"]

SLOT = 8   # bytes per parameter in the buffer


class AbiMismatch(RuntimeError):
    """The PTX entry's parameters do not match numba's kernel ABI as this module packs it."""


# ---- the layout, from numba types ---------------------------------------------------------------------------

#: struct codes of the scalars, each padded to one slot
_INT = {(8, True): "q", (8, False): "Q", (4, True): "i4x", (4, False): "I4x", (2, True): "h6x",
        (2, False): "H6x", (1, True): "b7x", (1, False): "B7x"}


def _scalar_code(ty: Any) -> str:
    from numba.core import types

    if ty == types.float64:
        return "d"
    if ty == types.float32:
        return "f4x"
    if ty == types.boolean:
        return "?7x"
    if isinstance(ty, types.Integer):
        return _INT[(ty.bitwidth // 8, bool(ty.signed))]
    msg = f"cached kernel launch: parameters of numba type {ty} are not packed here (use the dispatcher)"
    raise NotImplementedError(msg)


def param_format(sig: Sequence[Any]) -> str:
    """The ``struct`` format (little-endian, one 8-byte slot per parameter) of numba types ``sig``, flattened
    as numba-cuda's dispatcher flattens kernel arguments.

    >>> from numba.core import types
    >>> param_format((types.float64[::1], types.UniTuple(types.int64, 2), types.float32))
    '<QQqqQqqqqf4x'
    """
    from numba.core import types

    def codes(ty: Any) -> str:
        if isinstance(ty, types.Array):
            return "QQqqQ" + "q" * (2 * ty.ndim)   # meminfo, parent, nitems, itemsize, data, shape..., strides...
        if isinstance(ty, types.BaseTuple):
            return "".join(codes(t) for t in ty)
        return _scalar_code(ty)

    return "<" + "".join(codes(t) for t in sig)


def data_pointer(a: Any) -> int:
    """The device address of array ``a``: CuPy's ``a.data.ptr``, else its CUDA (or, for tests, host) array
    interface."""
    data = getattr(a, "data", None)
    ptr = getattr(data, "ptr", None)
    if ptr is not None:
        return int(ptr)
    iface = getattr(a, "__cuda_array_interface__", None) or a.__array_interface__
    return int(iface["data"][0])


def param_values(sig: Sequence[Any], args: Sequence[Any]) -> list:
    """The values of arguments ``args`` (of numba types ``sig``) in :func:`param_format`'s order.

    >>> import numpy as np
    >>> from numba.core import types
    >>> a = np.zeros(3, np.float32)
    >>> v = param_values((types.float32[::1], types.float64), (a, 2.5))
    >>> v[:4], v[5:]
    ([0, 0, 3, 4], [3, 4, 2.5])
    """
    from numba.core import types

    out: list = []

    def add(ty: Any, val: Any) -> None:
        if isinstance(ty, types.Array):
            if len(val.shape) != ty.ndim:
                msg = f"cached kernel launch: an array of {len(val.shape)} dimensions where {ty} was compiled"
                raise ValueError(msg)
            out.extend((0, 0, int(val.size), int(np.dtype(val.dtype).itemsize), data_pointer(val)))
            out.extend(val.shape)
            out.extend(val.strides)
        elif isinstance(ty, types.BaseTuple):
            if len(ty) != len(val):
                msg = f"cached kernel launch: a tuple of {len(val)} where {ty} was compiled"
                raise ValueError(msg)
            for t, v in zip(ty, val):
                add(t, v)
        else:
            out.append(val)

    for t, v in zip(sig, args, strict=True):
        add(t, v)
    return out


# ---- the PTX side -------------------------------------------------------------------------------------------

_ENTRY = re.compile(r"\.entry\s+([A-Za-z_$][\w$]*)\s*\(([^)]*)\)", re.S)
_PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.([a-z]+)(\d+)\s+[\w$]+(?:\[(\d+)\])?")


def ptx_entry(ptx: str) -> tuple[str, str]:
    """(name, parameter list) of the single kernel entry of ``ptx``."""
    found = _ENTRY.findall(ptx)
    if len(found) != 1:
        msg = f"expected one kernel entry in numba's PTX, found {len(found)}"
        raise AbiMismatch(msg)
    return found[0]


def ptx_param_sizes(params: str) -> list[int]:
    """The byte width of each parameter of a PTX entry's parameter list (``.param .u64 x`` is 8).

    >>> ptx_param_sizes(".param .u64 a_param_0, .param .f64 a_param_1, .param .u32 a_param_2")
    [8, 8, 4]
    """
    sizes = []
    for _kind, bits, count in _PARAM.findall(params):
        sizes.append(int(bits) // 8 * (int(count) if count else 1))
    return sizes


def check_abi(fmt: str, sizes: Sequence[int]) -> None:
    """Raise :class:`AbiMismatch` unless format ``fmt`` packs exactly ``sizes`` (the PTX entry's parameters)."""
    packed = [struct.calcsize("<" + code[0]) for code in _codes(fmt)]
    if list(packed) != list(sizes):
        msg = (f"numba's PTX entry takes {len(sizes)} parameters of widths {list(sizes)}, but numba's kernel ABI "
               f"as packed here gives {len(packed)} of widths {packed}: this numba-cuda lays kernel arguments out "
               "differently, so its own dispatcher launches the kernel")
        raise AbiMismatch(msg)


def _codes(fmt: str) -> list[str]:
    """One struct code per parameter (with its padding) of a :func:`param_format` string."""
    return re.findall(r"[qQdf?bBhHiI](?:\dx)?", fmt.lstrip("<"))


# ---- one compiled kernel ------------------------------------------------------------------------------------

_ARRAY, _ARRAYS, _TUPLE, _SCALAR = range(4)


def _itemsize(dtype: Any) -> int:
    from numba.np.numpy_support import as_dtype

    return int(as_dtype(dtype).itemsize)


def _plan(sig: Sequence[Any]) -> tuple:
    """How to flatten each argument of ``sig`` fast: (kind, ndim, itemsize, count) per argument."""
    from numba.core import types

    def one(ty: Any) -> tuple:
        if isinstance(ty, types.Array):
            return (_ARRAY, ty.ndim, _itemsize(ty.dtype), 1)
        if isinstance(ty, types.UniTuple) and isinstance(ty.dtype, types.Array):
            return (_ARRAYS, ty.dtype.ndim, _itemsize(ty.dtype.dtype), ty.count)
        if isinstance(ty, types.BaseTuple) and not any(isinstance(t, (types.Array, types.BaseTuple)) for t in ty):
            return (_TUPLE, 0, 0, len(ty))
        if isinstance(ty, types.BaseTuple):
            raise NotImplementedError(f"cached kernel launch: a tuple of {ty} is not packed here (use the dispatcher)")
        return (_SCALAR, 0, 0, 1)

    return tuple(one(t) for t in sig)


def _flatten(plan: tuple, args: Sequence[Any]) -> list:
    """:func:`param_values` on a precomputed plan (one call per launch: this is the host's cost per launch)."""
    out: list = []
    ext = out.extend
    for (kind, ndim, itemsize, count), a in zip(plan, args, strict=True):
        if kind == _SCALAR:
            out.append(a)
        elif kind == _TUPLE:
            if len(a) != count:
                raise ValueError(f"cached kernel launch: a tuple of {len(a)} where {count} were compiled")
            ext(a)
        else:
            for x in ((a,) if kind == _ARRAY else a):
                shape = x.shape
                if len(shape) != ndim:
                    raise ValueError(f"cached kernel launch: an array of {len(shape)} dimensions where {ndim} "
                                     "were compiled")
                try:
                    ptr = x.data.ptr   # CuPy
                except AttributeError:
                    ptr = data_pointer(x)
                ext((0, 0, x.size, itemsize, ptr))
                ext(shape)
                ext(x.strides)
            if kind == _ARRAYS and len(a) != count:
                raise ValueError(f"cached kernel launch: a tuple of {len(a)} where {count} were compiled")
    return out


class CachedKernel:
    """A kernel loaded once, launched with its parameters packed into one preallocated buffer.

    Parameters
    ----------
    name : str
        For messages.
    sig : tuple of numba types
        The signature it was compiled for.
    function : callable
        ``function(grid, block, args, shared_mem, stream)``: a CuPy ``Function`` (``cupy/cuda/function.pyx``).
    pointer : callable
        ``pointer(address)``: CuPy's ``CPointer`` (the kernel's arguments point into the buffer).
    """

    def __init__(self, name: str, sig: tuple, function: Callable[..., Any], pointer: Callable[[int], Any]) -> None:
        fmt = param_format(sig)
        self.name, self.sig, self.function = name, sig, function
        self.plan = _plan(sig)
        self.layout = struct.Struct(fmt)
        n = len(_codes(fmt))
        assert self.layout.size == n * SLOT, (fmt, self.layout.size)
        self.buffer = ctypes.create_string_buffer(max(1, n) * SLOT)   # a fixed address for the kernel's pointers
        base = ctypes.addressof(self.buffer)
        self.args = tuple(pointer(base + SLOT * i) for i in range(n))
        self.launches = 0
        # the driver copies the parameters when the launch is issued: the buffer is free again once the call
        # returns, and the lock keeps two threads from packing into it at once
        self._lock = threading.Lock()

    def launch(self, blocks: int, threads: int, stream: Any, args: Sequence[Any]) -> None:
        """Launch on ``stream`` (a CuPy stream) with the kernel's arguments ``args`` (arrays, tuples, scalars)."""
        values = _flatten(self.plan, args)
        with self._lock:
            self.layout.pack_into(self.buffer, 0, *values)
            self.function((blocks,), (threads,), self.args, 0, stream)
            self.launches += 1


def compile_kernel(name: str, py_func: Any, sig: tuple, cc: tuple[int, int], cupy_module: Any) -> CachedKernel:
    """Compile ``py_func`` for ``sig`` with numba (PTX for ``cc``), check the entry's ABI, load it with CuPy."""
    from numba import cuda

    ptx, _ = cuda.compile_ptx(py_func, sig, cc=cc)
    entry, params = ptx_entry(ptx)
    check_abi(param_format(sig), ptx_param_sizes(params))
    fd, path = tempfile.mkstemp(prefix=f"gpunets-{name}-", suffix=".ptx")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(ptx)
        module = cupy_module.RawModule(path=path)
        function = module.get_function(entry).kernel   # CuPy's Function on the current device: loaded now
    finally:
        os.remove(path)   # the module is loaded (cuModuleLoad): the file is no longer needed
    # Real CuPy only: on the fake GPU the kernels run on numba's simulator, through its dispatcher
    return CachedKernel(name, sig, function, cupy_module.cuda.function.CPointer)


# ---- the launch path and the registry of cached kernels -------------------------------------------------------

#: ``LAUNCH["path"]``: ``"auto"`` (the cached handle where the kernel compiles and loads, else the dispatcher),
#: ``"cached"`` (the cached handle, or an error naming why not) or ``"dispatcher"`` (numba's dispatcher always).
#: Set it with :func:`set_launch_path` or the ``GPUNETS_KERNEL_LAUNCH`` environment variable.
LAUNCH_PATHS = ("auto", "cached", "dispatcher")
LAUNCH: dict[str, str] = {"path": "auto"}
#: launches per path in this process (for tests and benchmarks)
LAUNCHES: dict[str, int] = {"cached": 0, "dispatcher": 0}
#: (kernel, dtype, K, device) -> its CachedKernel, or the reason it has none (then the dispatcher launches it)
_REGISTRY: dict[tuple, Any] = {}
_REGISTRY_LOCK = threading.Lock()


def set_launch_path(path: str) -> str:
    """Choose how the CUDA kernels are launched (``"auto"``, ``"cached"`` or ``"dispatcher"``); returns the old.

    Process-wide. ``"auto"`` (the default) launches numba's PTX through a handle cached per (kernel, dtype, K,
    device), and falls back to numba's dispatcher for a kernel whose PTX cannot be loaded that way (the
    reason is kept: :func:`launch_info`).

    >>> old = set_launch_path("dispatcher"); set_launch_path(old)
    'dispatcher'
    """
    if path not in LAUNCH_PATHS:
        msg = f"launch path {path!r} is not one of {list(LAUNCH_PATHS)} (see docs/kernels.md, 'Launch path')"
        raise ValueError(msg)
    old, LAUNCH["path"] = LAUNCH["path"], path
    return old


def launch_info() -> dict[str, Any]:
    """The launch path, the launches per path, and each cached signature's state ("ok" or why it fell back)."""
    return {"path": LAUNCH["path"], "launches": dict(LAUNCHES),
            "kernels": {f"{k[0]}[{k[1]}, K={k[2]}, device {k[3]}]": ("ok" if not isinstance(v, str) else v)
                        for k, v in list(_REGISTRY.items())}}


def cached_kernel(name: str, dtype: Any, k: int, cupy: Any, compile: Callable[..., Any]) -> CachedKernel | None:
    """Kernel ``name``'s launcher for K arrays of ``dtype`` on CuPy's current device: ``compile(name, dtype, k,
    cupy)`` at its first use (a CachedKernel, or why there is none), then the same one; None where there is
    none (the dispatcher launches), an error naming why under ``LAUNCH["path"] == "cached"``."""
    dtype = np.dtype(dtype)
    key = (name, dtype.str, k, int(cupy.cuda.runtime.getDevice()))
    got = _REGISTRY.get(key)
    if got is None:
        with _REGISTRY_LOCK:
            got = _REGISTRY.get(key)
            if got is None:
                got = _REGISTRY[key] = compile(name, dtype, k, cupy)
    if isinstance(got, str):
        if LAUNCH["path"] == "cached":
            raise RuntimeError(f"kernel {name} ({dtype}, K={k}) has no cached launch: {got}")
        return None
    return got


def _launch_from_env() -> None:
    raw = os.environ.get("GPUNETS_KERNEL_LAUNCH", "")
    path = raw.strip().lower()
    if path:
        if path not in LAUNCH_PATHS:
            msg = (f"GPUNETS_KERNEL_LAUNCH={raw!r} is not a launch path: set it to one of {list(LAUNCH_PATHS)}, "
                   "or unset it (the default, 'auto')")
            raise ValueError(msg)
        set_launch_path(path)


_launch_from_env()

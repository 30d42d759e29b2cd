"""Recognising values: which library a value comes from, which device it lives on, its array namespace.

CuPy and cuDF are never imported to *recognise* a value: if ``"cupy"`` is not in
:data:`sys.modules`, no value can be a CuPy array (the narwhals trick).  Moving
values is :mod:`gpunets.devices.data`'s; every name here is also importable from there.

>>> import numpy as np
>>> device_of(np.zeros(3))
Device('cpu')
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

import numpy as np

from gpunets.devices._gpulibs import cupy as _cupy
from gpunets.devices._gpulibs import hidden_by_fake, loaded_cupy
from gpunets.devices.placement import CPU, Device, physical_index

__all__ = ["device_of", "array_namespace", "is_cupy_array", "is_cudf", "is_pandas", "is_sparse", "is_frame",
           "fortran_only", "installed"]

_SCALARS = (bool, int, float, complex, str, bytes, np.generic)
_ACCEPTED = ("NumPy arrays, pandas DataFrame/Series, CuPy arrays, cuDF DataFrame/Series, "
             "other array-API arrays, scalars and None (scipy.sparse matrices on the CPU only)")


# ----------------------------------------------------------------- recognising


def is_cupy_array(x: Any) -> bool:
    """Whether ``x`` is a CuPy array, without importing CuPy.

    >>> is_cupy_array(np.zeros(1))
    False
    """
    cp = loaded_cupy()
    return cp is not None and isinstance(x, cp.ndarray)


def fortran_only(a: Any) -> bool:
    """Whether the array ``a`` (NumPy or CuPy) is Fortran-ordered and not also C-ordered.  CuPy copies arrays
    to the host, and pickles them, in C order; a fitted state's arrays keep their layout through the store and
    through files, so the matrix products of the loaded state round as the fitted one's did.

    >>> fortran_only(np.zeros((2, 3), order="F")), fortran_only(np.zeros((2, 3))), fortran_only(np.zeros(3))
    (True, False, False)
    """
    flags = getattr(a, "flags", None)
    return flags is not None and getattr(a, "ndim", 0) > 1 and bool(flags.f_contiguous) and not flags.c_contiguous


def is_cudf(x: Any) -> bool:
    """Whether ``x`` is a cuDF DataFrame, Series or Index, without importing cuDF.

    >>> is_cudf(np.zeros(1))
    False
    """
    cudf = sys.modules.get("cudf")
    if cudf is None:
        return False
    kinds = tuple(k for k in (getattr(cudf, n, None) for n in ("DataFrame", "Series", "Index"))
                  if isinstance(k, type))
    return bool(kinds) and isinstance(x, kinds)


def is_pandas(x: Any) -> bool:
    """Whether ``x`` is a pandas DataFrame or Series.

    >>> import pandas as pd
    >>> is_pandas(pd.Series([1])), is_pandas([1])
    (True, False)
    """
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(x, (pd.DataFrame, pd.Series))


def is_frame(x: Any) -> bool:
    """Whether ``x`` is a pandas or cuDF frame/series."""
    return is_pandas(x) or is_cudf(x)


def is_sparse(x: Any) -> bool:
    """Whether ``x`` is a scipy.sparse matrix or array.

    >>> import scipy.sparse as sp
    >>> is_sparse(sp.eye(2)), is_sparse(np.eye(2))
    (True, False)
    """
    sp = sys.modules.get("scipy.sparse")
    return sp is not None and bool(sp.issparse(x))


def host_only(x: Any) -> bool:
    """True for data that no GPU array can hold, so a machine placed by default trains on the CPU.

    Sparse matrices, NumPy arrays of strings, objects or datetimes, and pandas data with such columns
    (unless cuDF, which holds strings on the GPU, is installed).

    >>> host_only(np.array(["a", "b"])), host_only(np.ones(2))
    (True, False)
    """
    if is_sparse(x):
        return True
    if isinstance(x, np.ndarray):
        return x.dtype.kind in "OUSMmV"
    if is_pandas(x) and not installed("cudf"):
        dtypes = [x.dtype] if getattr(x, "ndim", 2) == 1 else list(getattr(x, "dtypes", []))
        return any(getattr(d, "kind", "O") in "OUSMmV" for d in dtypes)
    return False


def _is_other_array_api(x: Any) -> bool:
    """An array-API array that is neither NumPy nor CuPy (e.g. array_api_strict)."""
    return (hasattr(type(x), "__array_namespace__") and not isinstance(x, np.ndarray)
            and not is_cupy_array(x) and not is_frame(x))


def installed(name: str) -> bool:
    """Whether module ``name`` can be imported here, without importing it.

    A ``None`` entry in :data:`sys.modules` (how tests hide a module) counts as absent.

    >>> installed("numpy"), installed("surely_not_a_module")
    (True, False)
    """
    if hidden_by_fake(name):   # GPUNETS_FAKE_GPU: cuDF and cuML are absent, as on a GPU image without RAPIDS
        return name.split(".")[0] == "cupy"
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _is_scalar(x: Any) -> bool:
    return isinstance(x, _SCALARS)


def _host_numpy(x: Any) -> np.ndarray:
    """``x`` as a NumPy array on the host (DLPack where it can, else ``np.asarray``)."""
    try:
        return np.from_dlpack(x)
    except Exception:
        return np.asarray(x)


def _describe(x: Any) -> str:
    t = type(x)
    return f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__


# ----------------------------------------------------------------- device_of


def _cudf_device(x: Any) -> Device:
    cp = _cupy()

    try:
        col = x if not hasattr(x, "columns") else (x[x.columns[0]] if len(x.columns) else None)
        ptr = col.__cuda_array_interface__["data"][0] if col is not None else 0
        if ptr:
            return Device("cuda", physical_index(int(cp.cuda.runtime.pointerGetAttributes(ptr).device)))
    except Exception:  # strings, nulls, empty frames: fall back to the current device
        pass
    return Device("cuda", physical_index(int(cp.cuda.Device().id)))


def device_of(value: Any) -> Device:
    """The device ``value`` lives on.

    NumPy, pandas, scipy.sparse, scalars and None are on the CPU; a CuPy array
    on ``cuda:<x.device.id>`` (as a physical index: mapped back through
    ``CUDA_VISIBLE_DEVICES``, see :func:`~gpunets.devices.placement.physical_index`);
    a cuDF object on the GPU holding its first column (else CuPy's current
    device).  For tuples, lists and dicts, the device of their array
    elements, which must agree.

    Raises
    ------
    ValueError
        When a container holds arrays on different devices.

    Examples
    --------
    >>> import pandas as pd
    >>> device_of((np.ones(2), pd.Series([1.0]), None, 3))
    Device('cpu')
    """
    if is_cupy_array(value):
        return Device("cuda", physical_index(int(value.device.id)))
    if is_cudf(value):
        return _cudf_device(value)
    if isinstance(value, (tuple, list)):
        return _agree(value)
    if isinstance(value, dict):
        return _agree(value.values())
    if _is_other_array_api(value):
        dev = str(getattr(value, "device", "cpu"))
        if dev.startswith("cuda"):
            return Device.parse(dev if ":" in dev else "cuda:0")
    return CPU


def _agree(values: Any) -> Device:
    found = sorted({device_of(v) for v in values if v is not None and not _is_scalar(v)}, key=str)
    if len(found) > 1:
        raise ValueError(f"The container holds arrays on different devices: {[str(d) for d in found]}. "
                         f"Move them to one device first with gn.to_device(value, device).")
    return found[0] if found else CPU


def array_namespace(value: Any) -> types.ModuleType:
    """The array-API namespace of ``value`` (for a frame: that of its values).

    >>> array_namespace(np.zeros(2)).__name__
    'numpy'
    """
    if isinstance(value, np.ndarray) or is_pandas(value):
        return np
    if is_cupy_array(value):
        ns = getattr(value, "__array_namespace__", None)
        return ns() if ns is not None else sys.modules["cupy"]
    if is_cudf(value):
        cp = _cupy()

        return cp
    if hasattr(type(value), "__array_namespace__"):
        return value.__array_namespace__()
    raise TypeError(f"A {_describe(value)} has no array namespace: it is not an array-API array. "
                    f"Convert it with numpy.asarray(...) first.")

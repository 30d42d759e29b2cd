"""Values and devices: where a value lives, moving it, selecting rows, checking types.

Supported values: NumPy arrays, pandas DataFrame/Series, scipy.sparse matrices
(CPU only), CuPy arrays, cuDF DataFrame/Series, other array-API arrays (e.g.
``array_api_strict``; treated as host memory unless their ``.device`` says
``cuda``), Python/NumPy scalars and None.  Tuples, lists and dicts of these move
element-wise.

CuPy and cuDF are never imported to *recognise* a value: if ``"cupy"`` is not in
:data:`sys.modules`, no value can be a CuPy array (the narwhals trick).  They are
imported only to move data to or from a GPU.

Moves keep what the user gave:

* NumPy <-> CuPy keeps dtype and shape (``cupy.asarray`` under
  ``cupy.cuda.Device(N)``; ``cupy.asnumpy``).  CuPy between GPUs copies with
  ``ndarray.copy()`` under the target device.
* pandas <-> cuDF keeps column names, dtypes and index (``cudf.from_pandas(...,
  nan_as_null=False)`` so NaN stays NaN; ``.to_pandas()``).  cuDF stores
  pandas' nullable extension dtypes (``Int64``, ``boolean``, ``string``) as
  plain columns with nulls, and ``to_pandas()`` returns NumPy dtypes: an
  ``Int64`` column comes back ``int64`` (``float64`` where it holds nulls).
* a cuDF frame to a CuPy array (``frames="array"``) uses ``.to_cupy()`` on the
  GPU, without a round trip through the host.
* pandas to a GPU where cuDF is not installed raises :class:`ImportError`,
  unless ``frames="array"``: then the *values* move as a CuPy array (numeric
  and boolean columns only, else :class:`TypeError`).  Never silently on the
  wrong device.

>>> import numpy as np
>>> device_of(np.zeros(3))
Device('cpu')
>>> x = np.arange(3); to_device(x, "cpu") is x
True
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any, Union

import numpy as np

from .devices import CPU, Device, device_exists, local_ordinal, physical_index, same_device, why_unavailable
from ._gpulibs import cupy as _cupy, hidden_by_fake, loaded_cupy
from .exceptions import DeviceUnavailableError

__all__ = [
    "device_of",
    "to_device",
    "to_host_like",
    "check_placeable",
    "take_rows",
    "n_rows",
    "same_data",
    "array_namespace",
    "is_cupy_array",
    "is_cudf",
    "is_pandas",
    "is_sparse",
    "is_frame",
    "installed",
]

_SCALARS = (bool, int, float, complex, str, bytes, np.generic)
_ACCEPTED = ("NumPy arrays, pandas DataFrame/Series, CuPy arrays, cuDF DataFrame/Series, "
             "other array-API arrays, scalars and None (scipy.sparse matrices on the CPU only)")

DeviceLike = Union[str, Device]


# ----------------------------------------------------------------- recognising


def is_cupy_array(x: Any) -> bool:
    """Whether ``x`` is a CuPy array, without importing CuPy.

    >>> is_cupy_array(np.zeros(1))
    False
    """
    cp = loaded_cupy()
    return cp is not None and isinstance(x, cp.ndarray)


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
    ``CUDA_VISIBLE_DEVICES``, see :func:`~gpunets.devices.physical_index`);
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


# ----------------------------------------------------------------- to_device


def _require(dev: Device, what: str) -> None:
    if not device_exists(dev):
        raise DeviceUnavailableError(
            f"Cannot move {what} to {dev}: {why_unavailable(dev)}. Place it on 'cpu', or run where "
            f"a GPU is present; gn.config(fallback='warn') runs placed work on the CPU with a warning.")


def _host_numpy(x: Any) -> np.ndarray:
    try:
        return np.from_dlpack(x)
    except Exception:
        return np.asarray(x)


def _frame_dtypes(value: Any) -> list[tuple[Any, Any]]:
    if hasattr(value, "columns"):
        return list(zip(value.columns, value.dtypes))
    return [(value.name, value.dtype)]


def _common_numeric_dtype(value: Any, dev: Device) -> Any:
    pd = sys.modules["pandas"]
    dtypes = _frame_dtypes(value)
    bad = [str(c) for c, dt in dtypes
           if not (pd.api.types.is_numeric_dtype(dt) or pd.api.types.is_bool_dtype(dt))]
    if bad:
        kind = "cuDF" if is_cudf(value) else "pandas"
        raise TypeError(f"Cannot move a {kind} {type(value).__name__} with non-numeric column(s) {bad} "
                        f"to {dev} as a CuPy array. Install cuDF to keep it a data frame, encode those "
                        f"columns first, or place it on 'cpu'.")
    try:  # one common dtype, so bool + float columns give float, not object
        return np.result_type(*[np.dtype(dt) for _, dt in dtypes])
    except TypeError:  # pandas extension dtypes: let pandas choose
        return None


def _numeric_frame_values(value: Any, dev: Device) -> np.ndarray:
    return value.to_numpy(dtype=_common_numeric_dtype(value, dev))


def to_device(value: Any, device: DeviceLike, *, stream: Any = None, frames: str = "cudf") -> Any:
    """Return ``value`` on ``device``; a value already there is returned unchanged (same object).

    Parameters
    ----------
    value : array, frame, scalar, None, or a tuple/list/dict of these
    device : str or Device
    stream : cupy.cuda.Stream, optional
        The stream used for CuPy copies (host-to-device copies may then be
        asynchronous: keep the source alive and synchronise before reading on
        another stream).  cuDF copies use cuDF's own stream.
    frames : {"cudf", "array"}
        How pandas data go to a GPU: as cuDF (``ImportError`` when cuDF is not
        installed) or as a CuPy array of their values (numeric columns only).

    Raises
    ------
    DeviceUnavailableError
        When ``device`` is a CUDA device that does not exist here.
    TypeError
        For values that cannot be placed there (see :func:`check_placeable`).

    Examples
    --------
    >>> import pandas as pd
    >>> df = pd.DataFrame({"a": [1, 2]}, index=[10, 20])
    >>> to_device({"X": df, "n": 3}, "cpu")["X"] is df
    True
    >>> to_device(np.ones(2), "cuda:7")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    gpunets.exceptions.DeviceUnavailableError: Cannot move a numpy.ndarray to cuda:7: ...
    """
    dev = Device.parse(device)
    if frames not in ("cudf", "array"):
        raise ValueError(f"frames={frames!r}: expected 'cudf' or 'array'.")
    if isinstance(value, tuple):
        moved = [to_device(v, dev, stream=stream, frames=frames) for v in value]
        return type(value)._make(moved) if hasattr(value, "_fields") else type(value)(moved)
    if isinstance(value, list):
        return type(value)(to_device(v, dev, stream=stream, frames=frames) for v in value)
    if isinstance(value, dict):
        return type(value)((k, to_device(v, dev, stream=stream, frames=frames)) for k, v in value.items())
    if value is None or _is_scalar(value):
        return value
    here = device_of(value)
    if same_device(here, dev) and not (dev.is_cuda and frames == "array" and is_cudf(value)):
        return value
    _require(dev, f"a {_describe(value)}")
    if dev.is_cpu:
        return _to_host(value, stream)
    return _to_gpu(value, dev, stream, frames)


def _to_host(value: Any, stream: Any) -> Any:
    if is_cupy_array(value):
        cp = _cupy()

        return cp.asnumpy(value, stream=stream)
    if is_cudf(value):
        return value.to_pandas()
    if _is_other_array_api(value):  # e.g. a torch tensor on cuda
        raise TypeError(f"Cannot move a {_describe(value)} on {device_of(value)} to the CPU: "
                        f"convert it to NumPy or CuPy first.")
    raise TypeError(f"Cannot move a {_describe(value)} to the CPU. Accepted: {_ACCEPTED}.")


def _to_gpu(value: Any, dev: Device, stream: Any, frames: str) -> Any:
    cp = _cupy()

    if is_sparse(value):
        raise TypeError(f"Cannot move a scipy.sparse {type(value).__name__} to {dev}: densify it with "
                        f".toarray() or place it on 'cpu'.")
    with cp.cuda.Device(local_ordinal(dev.index)):
        if is_pandas(value) or is_cudf(value):
            if frames == "array":
                if is_cudf(value):  # on the GPU already: cuDF's own to_cupy, no round trip via the host
                    common = _common_numeric_dtype(value, dev)
                    floating = common is not None and np.issubdtype(common, np.floating)
                    arr = value.to_cupy(dtype=common, na_value=np.nan if floating else None)
                    return arr if arr.device.id == local_ordinal(dev.index) else _with_stream(stream, arr.copy)
                return _with_stream(stream, lambda: cp.asarray(_numeric_frame_values(value, dev)))
            if not installed("cudf"):
                raise ImportError(
                    f"Cannot move a pandas {type(value).__name__} to {dev}: cuDF is not installed. "
                    f"Install cuDF (e.g. pip install cudf-cu12), or pass frames='array' to move its "
                    f"values as a CuPy array (numeric columns only), or place it on 'cpu'.")
            import cudf  # noqa: PLC0415

            host = value.to_pandas() if is_cudf(value) else value  # cuDF between GPUs goes via the host
            return cudf.from_pandas(host, nan_as_null=False)
        if is_cupy_array(value):  # another GPU: ndarray.copy() copies to the current device
            return _with_stream(stream, value.copy)
        if isinstance(value, np.ndarray) or _is_other_array_api(value):
            host = value if isinstance(value, np.ndarray) else _host_numpy(value)
            return _with_stream(stream, lambda: cp.asarray(host))
    raise TypeError(f"Cannot move a {_describe(value)} to {dev}. Accepted: {_ACCEPTED}.")


def _with_stream(stream: Any, fn: Any) -> Any:
    if stream is None:
        return fn()
    with stream:
        return fn()


def to_host_like(value: Any, like: Any) -> Any:
    """Return ``value`` in the type family and on the device of ``like`` (what the user gave).

    Frames follow frames (pandas <-> cuDF), arrays follow arrays (NumPy <->
    CuPy); if ``like`` is an array and ``value`` a frame, the frame's values are
    returned.  An array is never turned into a frame (there is no index to
    invent).

    Examples
    --------
    >>> import pandas as pd
    >>> to_host_like(pd.Series([1.0, 2.0]), np.zeros(2))
    array([1., 2.])
    """
    target = device_of(like)
    wants_array = isinstance(like, np.ndarray) or is_cupy_array(like)
    if wants_array and is_pandas(value):
        value = value.to_numpy()
    elif wants_array and is_cudf(value):
        value = value.to_cupy()
    if isinstance(like, np.ndarray) and _is_other_array_api(value) and device_of(value).is_cpu:
        value = _host_numpy(value)
    return to_device(value, target)


# ----------------------------------------------------------------- checks


def check_placeable(value: Any, *, what: str, device: DeviceLike) -> None:
    """Raise ``TypeError`` unless ``value`` can live on ``device``.

    Parameters
    ----------
    value : Any
    what : str
        The culprit for the message, e.g. ``"source X"``.
    device : str or Device

    Examples
    --------
    >>> check_placeable(np.ones(2), what="source X", device="cuda")
    >>> check_placeable([[1, 2]], what="source X", device="cpu")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: source X: cannot place a list on cpu. Accepted: ...
    """
    dev = Device.parse(device)
    if isinstance(value, tuple):
        for v in value:
            check_placeable(v, what=what, device=dev)
        return
    if (value is None or _is_scalar(value) or isinstance(value, np.ndarray) or is_frame(value)
            or is_cupy_array(value) or _is_other_array_api(value)):
        return
    if is_sparse(value):
        if dev.is_cuda:
            raise TypeError(f"{what}: a scipy.sparse {type(value).__name__} cannot be placed on {dev}; "
                            f"densify it with .toarray() or place it on 'cpu'.")
        return
    if isinstance(value, list):
        hint = "Convert it with numpy.asarray(...) or wrap it in a pandas.DataFrame."
    elif isinstance(value, dict):
        hint = "Wrap it in a pandas.DataFrame(...) (or pass its values as separate sources)."
    elif isinstance(value, (types.GeneratorType, map, filter, zip, range)) or hasattr(value, "__next__"):
        hint = "Materialise it first, e.g. numpy.asarray(list(...))."
    else:
        hint = "Convert it to one of these types first."
    raise TypeError(f"{what}: cannot place a {_describe(value)} on {dev}. Accepted: {_ACCEPTED}. {hint}")


def n_rows(value: Any) -> int:
    """The number of rows (samples) of ``value``.

    >>> n_rows(np.zeros((4, 2)))
    4
    """
    if is_frame(value):
        return len(value)
    shape = getattr(value, "shape", None)
    if shape is not None and len(shape) >= 1 and (isinstance(value, np.ndarray) or is_cupy_array(value)
                                                  or is_sparse(value) or _is_other_array_api(value)):
        return int(shape[0])
    if shape is not None and len(shape) == 0:
        raise TypeError(f"A 0-dimensional {_describe(value)} has no rows.")
    raise TypeError(f"Cannot count the rows of a {_describe(value)}. Accepted: {_ACCEPTED}.")


def _row_index(rows: Any, n: int) -> Union[slice, np.ndarray]:
    if isinstance(rows, slice):
        return rows
    if isinstance(rows, (bool, int, np.integer)):
        raise TypeError(f"rows={rows!r}: expected a list/array of row indices, a slice or a boolean "
                        f"mask; for one row write [{rows!r}].")
    if is_cupy_array(rows):
        cp = _cupy()

        rows = cp.asnumpy(rows)
    elif is_pandas(rows):
        rows = rows.to_numpy()
    elif _is_other_array_api(rows):
        rows = _host_numpy(rows)
    arr = np.asarray(list(rows) if isinstance(rows, (range, set)) or not hasattr(rows, "__len__")
                     else rows)
    if arr.ndim != 1:
        raise TypeError(f"rows must be one-dimensional; got shape {arr.shape}.")
    if arr.dtype == bool:
        if len(arr) != n:
            raise IndexError(f"The boolean row mask has length {len(arr)}, but the data have {n} rows.")
        return np.flatnonzero(arr)
    if arr.size == 0:
        return arr.astype(np.intp)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"rows must be integers or a boolean mask; got dtype {arr.dtype}.")
    bad = (arr >= n) | (arr < -n)
    if bad.any():
        raise IndexError(f"Row index {int(arr[bad][0])} is out of range for data with {n} rows "
                         f"(valid: 0 to {n - 1}, or -{n} to -1).")
    return arr.astype(np.intp)


def take_rows(value: Any, rows: Any) -> Any:
    """Select ``rows`` of ``value``, respecting its type (``.iloc`` for frames).

    ``rows`` is a list/array of ints, a slice or a boolean mask; indices are
    checked against the number of rows before anything is selected.  None
    stays None and tuples are selected element-wise.

    Raises
    ------
    IndexError
        Naming the number of rows and the first offending index.

    Examples
    --------
    >>> take_rows(np.arange(5), [0, 4])
    array([0, 4])
    >>> take_rows(np.arange(5), [5])
    Traceback (most recent call last):
    ...
    IndexError: Row index 5 is out of range for data with 5 rows (valid: 0 to 4, or -5 to -1).
    """
    if value is None:
        return None
    if isinstance(value, tuple):
        return type(value)(take_rows(v, rows) for v in value)
    idx = _row_index(rows, n_rows(value))
    if is_frame(value):  # a cuDF Index (a "frame" here) has no .iloc but takes positions
        return value.iloc[idx] if hasattr(value, "iloc") else value[idx]
    if is_sparse(value):
        if value.format not in ("csr", "csc", "lil"):
            value = value.tocsr()
        return value[idx]
    if isinstance(value, np.ndarray):
        return value[idx]
    if is_cupy_array(value):
        if isinstance(idx, slice):
            return value[idx]
        cp = _cupy()

        with cp.cuda.Device(value.device.id):
            return value[cp.asarray(idx)]
    xp = value.__array_namespace__()
    if isinstance(idx, slice):
        return value[idx, ...]
    return xp.take(value, xp.asarray(idx, device=value.device), axis=0)


def same_data(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` hold the same data: identity first, then equality (NaN equals NaN).

    Used to tell whether a network was given new data.

    Examples
    --------
    >>> x = np.array([1.0, np.nan])
    >>> same_data(x, x.copy()), same_data(x, np.array([1.0, 2.0]))
    (True, False)
    """
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same_data(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_data(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        try:
            return bool(np.array_equal(a, b, equal_nan=True))
        except TypeError:  # non-numeric dtypes
            return bool(np.array_equal(a, b))
    if is_frame(a):
        return bool(a.equals(b))
    if is_cupy_array(a):
        cp = _cupy()

        if a.shape != b.shape or a.dtype != b.dtype or a.device.id != b.device.id:
            return False
        return bool(cp.array_equal(a, b, equal_nan=True))
    if is_sparse(a):
        return a.shape == b.shape and a.dtype == b.dtype and (a != b).nnz == 0
    if _is_other_array_api(a):
        if getattr(a, "device", None) != getattr(b, "device", None):
            return False
        return same_data(_host_numpy(a), _host_numpy(b))
    if isinstance(a, float) and a != a:
        return b != b
    try:
        return bool(a == b)
    except Exception:
        return False


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

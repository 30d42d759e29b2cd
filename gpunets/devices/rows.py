"""Rows of values: counting them, selecting them, and telling whether two values hold the same data.

Every name here is also importable from :mod:`gpunets.devices.data`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpunets.devices._gpulibs import cupy as _cupy
from gpunets.devices.value_types import (
    _ACCEPTED,
    _describe,
    _host_numpy,
    _is_other_array_api,
    is_cupy_array,
    is_frame,
    is_pandas,
    is_sparse,
)

__all__ = ["n_rows", "take_rows", "same_data"]


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


def _row_index(rows: Any, n: int) -> slice | np.ndarray:
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

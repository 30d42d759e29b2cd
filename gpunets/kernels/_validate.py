"""Input checks shared by every target.

Each check builds its message first and raises it after, and every message
names the offending position, what was expected and how to fix it.  All checks
run before anything is compiled or launched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

TARGETS = ("cpu", "cuda")

# dtypes the numeric kernels compile for (bool, signed/unsigned integers, float32/64).
_NUMERIC_KINDS = "biuf"


def check_target(target: Any) -> str:
    """Return ``target`` if it is a known target, else raise ``ValueError``."""
    if target not in TARGETS:
        msg = f"unknown target {target!r}; valid targets are {list(TARGETS)} (e.g. target=\"cpu\")"
        raise ValueError(msg)
    return target


def _type_name(x: Any) -> str:
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def check_sequence(arrays: Any, func: str) -> tuple:
    """``arrays`` must be a non-empty list or tuple; returns it as a tuple."""
    if not isinstance(arrays, (list, tuple)):
        hint = " (to combine the rows of one array, pass list(a))" if hasattr(arrays, "shape") else ""
        msg = (f"{func}() takes a list or tuple of arrays, got {_type_name(arrays)}{hint}")
        raise TypeError(msg)
    if len(arrays) == 0:
        msg = f"{func}() needs at least one array, got an empty {_type_name(arrays)}"
        raise ValueError(msg)
    return tuple(arrays)


def check_arrays(arrays: tuple, func: str, accept: Callable[[Any], bool], accepted: str, hint: str) -> None:
    """Every element is an accepted array, all of one shape and one dtype."""
    for k, a in enumerate(arrays):
        if not accept(a):
            msg = (f"{func}(): arrays[{k}] is a {_type_name(a)}; accepted are {accepted}; "
                   f"convert it with {hint}")
            raise TypeError(msg)
    shape0, dtype0 = tuple(arrays[0].shape), np.dtype(arrays[0].dtype)
    for k, a in enumerate(arrays[1:], start=1):
        if tuple(a.shape) != shape0:
            msg = (f"{func}(): arrays[{k}] has shape {tuple(a.shape)}, expected {shape0} like arrays[0]; "
                   "all arrays must have the same shape")
            raise ValueError(msg)
    for k, a in enumerate(arrays[1:], start=1):
        if np.dtype(a.dtype) != dtype0:
            msg = (f"{func}(): arrays[{k}] has dtype {np.dtype(a.dtype)}, expected {dtype0} like arrays[0]; "
                   f"all arrays must have the same dtype: cast with .astype(np.{dtype0.name})")
            raise TypeError(msg)


def check_numeric(dtype: np.dtype, func: str) -> None:
    """The numeric kernels take bool, integer, float32 and float64 arrays."""
    dtype = np.dtype(dtype)
    if dtype.kind not in _NUMERIC_KINDS or dtype == np.float16:
        msg = (f"{func}(): dtype {dtype} is not supported; accepted are bool, integer, float32 and float64 "
               "arrays: cast with .astype(np.float64)")
        raise TypeError(msg)


def check_weights(weights: Any, k: int, func: str, *, nonzero_sum: bool) -> tuple:
    """Weights: ``k`` finite numbers (non-zero sum for a weighted mean); returns a tuple of floats."""
    try:
        w = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        msg = f"{func}(): weights must be {k} real numbers, got {weights!r} ({exc})"
        raise TypeError(msg) from None
    if w.ndim != 1 or w.shape[0] != k:
        msg = (f"{func}(): weights must be a 1-D sequence of length {k} (one per array), "
               f"got shape {w.shape}")
        raise ValueError(msg)
    if not np.all(np.isfinite(w)):
        msg = f"{func}(): weights must be finite, got {w.tolist()}"
        raise ValueError(msg)
    if nonzero_sum and w.sum() == 0:
        msg = f"{func}(): weights sum to zero, so the weighted average is undefined; got {w.tolist()}"
        raise ValueError(msg)
    return tuple(float(x) for x in w)


def check_ddof(ddof: Any, k: int) -> int:
    """``0 <= ddof < k``, an integer."""
    if isinstance(ddof, bool) or not isinstance(ddof, (int, np.integer)):
        msg = f"var(): ddof must be an integer, got {ddof!r}"
        raise TypeError(msg)
    if not 0 <= ddof < k:
        msg = f"var(): ddof must satisfy 0 <= ddof < {k} (the number of arrays), got {ddof}"
        raise ValueError(msg)
    return int(ddof)


def check_hstack_shapes(arrays: tuple, accept: Callable[[Any], bool], accepted: str, hint: str) -> None:
    """1-D or 2-D arrays, one dtype, all with the same number of rows."""
    for k, a in enumerate(arrays):
        if not accept(a):
            msg = f"hstack(): arrays[{k}] is a {_type_name(a)}; accepted are {accepted}; convert it with {hint}"
            raise TypeError(msg)
    for k, a in enumerate(arrays):
        if len(a.shape) not in (1, 2):
            msg = (f"hstack(): arrays[{k}] has {len(a.shape)} dimensions (shape {tuple(a.shape)}); "
                   "expected 1-D (a column) or 2-D (columns); reshape it first")
            raise ValueError(msg)
    rows0 = arrays[0].shape[0]
    for k, a in enumerate(arrays[1:], start=1):
        if a.shape[0] != rows0:
            msg = (f"hstack(): arrays[{k}] has {a.shape[0]} rows, expected {rows0} like arrays[0]; "
                   "all arrays must have the same number of rows")
            raise ValueError(msg)
    dtype0 = np.dtype(arrays[0].dtype)
    for k, a in enumerate(arrays[1:], start=1):
        if np.dtype(a.dtype) != dtype0:
            msg = (f"hstack(): arrays[{k}] has dtype {np.dtype(a.dtype)}, expected {dtype0} like arrays[0]; "
                   f"cast with .astype(np.{dtype0.name})")
            raise TypeError(msg)


# ---- output dtypes (NumPy's rules) -----------------------------------------------------------------------

def mean_dtype(dtype: np.dtype) -> np.dtype:
    """float32 stays float32; everything else (ints, bool, float64) gives float64."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float32 else np.dtype(np.float64)


def sum_dtype(dtype: np.dtype) -> np.dtype:
    """NumPy's ``add.reduce`` default: small ints widen to int64 / uint64, floats are kept."""
    return np.add.reduce(np.zeros((1, 1), dtype=dtype), axis=0).dtype


def sum_zero(dtype: np.dtype) -> Any:
    """The accumulator's starting value: float64 for floats (more accurate), else the output type."""
    out = sum_dtype(dtype)
    return np.float64(0.0) if out.kind == "f" else out.type(0)


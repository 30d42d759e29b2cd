"""Combine kernels: elementwise reductions across the K outputs of a network's branches.

Every function takes a non-empty list or tuple of K arrays of one shape and one
dtype and combines them position by position, in one fused pass that reads each
input once and writes the output once (no ``np.stack``).

========================  =============================================================
``mean``                  elementwise mean, or weighted average (``np.average``)
``weighted_sum``          ``sum_k w_k * a_k`` (no normalisation)
``sum`` / ``min`` / ``max``  elementwise reductions across the arrays
``var``                   elementwise variance across the arrays (``ddof=0``)
``vote``                  elementwise majority label, ties to the smallest label
``hstack``                1-D arrays as columns, 2-D arrays side by side
========================  =============================================================

``target="cpu"`` runs ``numba.njit`` kernels (``prange``-parallel for large
inputs); ``target="cuda"`` runs ``numba.cuda.jit`` kernels on CuPy arrays, or on
NumPy arrays under numba's CUDA simulator. On a GPU they are launched through a
handle cached per signature (numba's PTX loaded by CuPy: ``_cached``), not through
numba's dispatcher (its host time per launch was estimated at 0.3-0.7 ms on an H200).  NaN propagates: a NaN in any input
gives NaN at that position (like ``np.mean(np.stack(a), 0)`` and
``np.minimum.reduce``).

``import gpunets.kernels`` imports numba but not ``numba.cuda`` or CuPy: the CUDA
backend is imported on the first ``target="cuda"`` call.

>>> import numpy as np
>>> from gpunets import kernels
>>> kernels.mean([np.array([1.0, 2.0]), np.array([3.0, 6.0])])
array([2., 4.])
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np

from gpunets.kernels import _cpu
from gpunets.kernels import _validate as V
from gpunets.kernels._cpu import output_pool

__all__ = ["mean", "weighted_sum", "vote", "hstack", "sum", "min", "max", "var", "targets", "output_pool"]

ArrayLike = Any


def targets() -> tuple[str, ...]:
    """The targets every kernel accepts.

    >>> targets()
    ('cpu', 'cuda')
    """
    return V.TARGETS


def _backend(target: str) -> ModuleType:
    V.check_target(target)
    if target == "cpu":
        return _cpu
    from gpunets.kernels import _cuda  # lazy: imports numba.cuda

    _cuda.check_available()
    return _cuda


def _prepare(arrays: Sequence[ArrayLike], func: str, target: str, numeric: bool = True) -> tuple[ModuleType, tuple]:
    be = _backend(target)
    arrs = V.check_sequence(arrays, func)
    V.check_arrays(arrs, func, be.accept, be.accepted, be.hint)
    if numeric:
        V.check_numeric(arrs[0].dtype, func)
    return be, arrs


def mean(arrays: Sequence[ArrayLike], weights: Sequence[float] | None = None, *, target: str = "cpu",
         stream: Any = None) -> ArrayLike:
    """Elementwise mean (or weighted average) across K arrays.

    Parameters
    ----------
    arrays : list or tuple of arrays
        K >= 1 arrays of one shape and one dtype (bool, integer, float32 or float64).
    weights : sequence of float, optional
        K finite weights with a non-zero sum; the result is ``sum_k w_k a_k / sum_k w_k``
        (``np.average`` semantics).
    target : {"cpu", "cuda"}
        Where the kernel runs.
    stream : optional
        ``target="cuda"`` only: None (CuPy's current stream), a CuPy stream or a numba stream.

    Returns
    -------
    array
        Same shape; float32 for float32 input, float64 otherwise (accumulated in float64).
        NaN in any input gives NaN at that position.

    Examples
    --------
    >>> import numpy as np
    >>> a, b = np.array([1.0, np.nan]), np.array([3.0, 1.0])
    >>> mean([a, b])
    array([ 2., nan])
    >>> mean([a, b], weights=[1, 3])
    array([2.5, nan])
    >>> mean([np.array([1, 2], dtype=np.int64), np.array([2, 2], dtype=np.int64)]).dtype
    dtype('float64')
    """
    be, arrs = _prepare(arrays, "mean", target)
    w = None if weights is None else V.check_weights(weights, len(arrs), "mean", nonzero_sum=True)
    return be.mean(arrs, w, stream)


def weighted_sum(arrays: Sequence[ArrayLike], weights: Sequence[float], *, target: str = "cpu",
                 stream: Any = None) -> ArrayLike:
    """Elementwise ``sum_k w_k * a_k`` across K arrays, not normalised.

    Parameters
    ----------
    arrays : list or tuple of arrays
        K >= 1 arrays of one shape and one dtype (bool, integer, float32 or float64).
    weights : sequence of float
        K finite weights (any sum, zero included).
    target : {"cpu", "cuda"}
    stream : optional
        See :func:`mean`.

    Returns
    -------
    array
        float32 for float32 input, float64 otherwise; NaN propagates.

    Examples
    --------
    >>> import numpy as np
    >>> weighted_sum([np.array([1.0, 2.0]), np.array([10.0, 20.0])], [2, -1])
    array([ -8., -16.])
    """
    be, arrs = _prepare(arrays, "weighted_sum", target)
    w = V.check_weights(weights, len(arrs), "weighted_sum", nonzero_sum=False)
    return be.weighted_sum(arrs, w, stream)


def sum(arrays: Sequence[ArrayLike], *, target: str = "cpu", stream: Any = None) -> ArrayLike:  # noqa: A001
    """Elementwise sum across K arrays.

    Output dtype follows NumPy's ``np.sum(np.stack(arrays), axis=0)``: floats are kept
    (float32 is accumulated in float64), bool and small integers widen to int64 / uint64.
    NaN propagates.

    Examples
    --------
    >>> import numpy as np
    >>> sum([np.array([1.0, 2.0]), np.array([3.0, np.nan])])
    array([ 4., nan])
    """
    be, arrs = _prepare(arrays, "sum", target)
    return be.sum(arrs, stream)


def min(arrays: Sequence[ArrayLike], *, target: str = "cpu", stream: Any = None) -> ArrayLike:  # noqa: A001
    """Elementwise minimum across K arrays (``np.minimum.reduce``): dtype kept, NaN propagates.

    Examples
    --------
    >>> import numpy as np
    >>> min([np.array([1.0, 5.0, 0.0]), np.array([3.0, 2.0, np.nan])])
    array([ 1.,  2., nan])
    """
    be, arrs = _prepare(arrays, "min", target)
    return be.min(arrs, stream)


def max(arrays: Sequence[ArrayLike], *, target: str = "cpu", stream: Any = None) -> ArrayLike:  # noqa: A001
    """Elementwise maximum across K arrays (``np.maximum.reduce``): dtype kept, NaN propagates.

    Examples
    --------
    >>> import numpy as np
    >>> max([np.array([1, 5]), np.array([3, 2])])
    array([3, 5])
    """
    be, arrs = _prepare(arrays, "max", target)
    return be.max(arrs, stream)


def var(arrays: Sequence[ArrayLike], *, ddof: int = 0, target: str = "cpu", stream: Any = None) -> ArrayLike:
    """Elementwise variance across K arrays, ``sum_k (a_k - mean)^2 / (K - ddof)``.

    ``0 <= ddof < K`` (else ``ValueError``).  float32 for float32 input, float64 otherwise;
    NaN propagates.

    Examples
    --------
    >>> import numpy as np
    >>> var([np.array([1.0, 0.0]), np.array([3.0, 0.0])])
    array([1., 0.])
    >>> var([np.array([1.0, 0.0]), np.array([3.0, 0.0])], ddof=1)
    array([2., 0.])
    """
    be, arrs = _prepare(arrays, "var", target)
    d = V.check_ddof(ddof, len(arrs))
    return be.var(arrs, d, stream)


def vote(arrays: Sequence[ArrayLike], *, target: str = "cpu", stream: Any = None) -> ArrayLike:
    """Elementwise majority label across K arrays of class labels; ties go to the smallest label.

    Integer labels are voted in the kernel directly.  Other labels (strings, floats, bools,
    objects) are encoded with ``np.unique(..., return_inverse=True)`` across all arrays,
    voted as integer codes and decoded back, so the output has the labels' dtype.
    String labels may differ in width (``<U1`` and ``<U5``); the output takes the widest.

    Examples
    --------
    >>> import numpy as np
    >>> vote([np.array([1, 2, 3]), np.array([1, 3, 2]), np.array([2, 3, 1])])
    array([1, 3, 1])
    >>> vote([np.array(["cat", "dog"]), np.array(["dog", "dog"])])
    array(['cat', 'dog'], dtype='<U3')
    """
    be = _backend(target)
    arrs = V.check_sequence(arrays, "vote")
    accepted = builtins.all(be.accept(a) for a in arrs)
    if accepted and len({np.dtype(a.dtype).kind for a in arrs}) == 1 and np.dtype(arrs[0].dtype).kind in "US":
        # strings of different widths are one label type: compare them at the widest width
        widest = np.result_type(*[a.dtype for a in arrs])
        arrs = tuple(a.astype(widest, copy=False) for a in arrs)
    V.check_arrays(arrs, "vote", be.accept, be.accepted, be.hint)
    return be.vote(arrs, stream)


def hstack(arrays: Sequence[ArrayLike], *, target: str = "cpu", stream: Any = None) -> ArrayLike:
    """Stack arrays as columns: 1-D arrays become columns, 2-D arrays are joined along axis 1.

    All arrays need the same number of rows and one dtype.

    Examples
    --------
    >>> import numpy as np
    >>> hstack([np.array([1.0, 2.0]), np.array([[3.0, 4.0], [5.0, 6.0]])])
    array([[1., 3., 4.],
           [2., 5., 6.]])
    """
    be = _backend(target)
    arrs = V.check_sequence(arrays, "hstack")
    V.check_hstack_shapes(arrs, be.accept, be.accepted, be.hint)
    return be.hstack(arrs, stream)

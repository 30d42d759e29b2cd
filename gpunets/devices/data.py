"""Values and devices: where a value lives, moving it, selecting rows, checking types.

Supported values: NumPy arrays, pandas DataFrame/Series, scipy.sparse matrices
(CPU only), CuPy arrays, cuDF DataFrame/Series, other array-API arrays (e.g.
``array_api_strict``; treated as host memory unless their ``.device`` says
``cuda``), Python/NumPy scalars and None.  Tuples, lists and dicts of these move
element-wise.

CuPy and cuDF are never imported to *recognise* a value: if ``"cupy"`` is not in
:data:`sys.modules`, no value can be a CuPy array (the narwhals trick).  They are
imported only to move data to or from a GPU.

This module moves values; recognising them (``is_*``, :func:`device_of`,
:func:`array_namespace`) lives in :mod:`gpunets.devices.value_types` and rows
(:func:`n_rows`, :func:`take_rows`, :func:`same_data`) in :mod:`gpunets.devices.rows`.
Every one of those names is importable from here too.

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

import contextlib
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any, cast

import numpy as np

from gpunets.base.exceptions import DeviceUnavailableError
from gpunets.devices._gpulibs import cupy as _cupy
from gpunets.devices.placement import Device, device_exists, local_ordinal, same_device, why_unavailable
from gpunets.devices.rows import n_rows, same_data, take_rows
from gpunets.devices.value_types import (
    _ACCEPTED,
    _describe,
    _host_numpy,
    _is_other_array_api,
    _is_scalar,
    array_namespace,
    device_of,
    fortran_only,
    installed,
    is_cudf,
    is_cupy_array,
    is_frame,
    is_pandas,
    is_sparse,
)

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
    "fortran_only",
    "installed",
]

DeviceLike = str | Device


# ----------------------------------------------------------------- to_device


def _require(dev: Device, what: str) -> None:
    if not device_exists(dev):
        raise DeviceUnavailableError(
            f"Cannot move {what} to {dev}: {why_unavailable(dev)}. Place it on 'cpu', or run where "
            f"a GPU is present; gn.config(fallback='warn') runs placed work on the CPU with a warning.")


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
    gpunets.base.exceptions.DeviceUnavailableError: Cannot move a numpy.ndarray to cuda:7: ...
    """
    dev = Device.parse(device)
    if frames not in ("cudf", "array"):
        raise ValueError(f"frames={frames!r}: expected 'cudf' or 'array'.")
    if isinstance(value, tuple):
        moved = [to_device(v, dev, stream=stream, frames=frames) for v in value]
        return cast(Any, type(value))._make(moved) if hasattr(value, "_fields") else type(value)(moved)
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
    assert dev.index is not None   # a CUDA device always has an index
    ordinal = local_ordinal(dev.index)
    with cp.cuda.Device(ordinal):
        if is_pandas(value) or is_cudf(value):
            if frames == "array":
                if is_cudf(value):  # on the GPU already: cuDF's own to_cupy, no round trip via the host
                    common = _common_numeric_dtype(value, dev)
                    floating = common is not None and np.issubdtype(common, np.floating)
                    arr = value.to_cupy(dtype=common, na_value=np.nan if floating else None)
                    return arr if arr.device.id == ordinal else _with_stream(stream, arr.copy)
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


_COPY_STREAMS = threading.local()   # this thread's non-blocking copy stream of each GPU


@contextlib.contextmanager
def off_the_legacy_stream(value: Any) -> Iterator[None]:
    """Run the block (a copy of the *ready* GPU ``value`` to the host) on a stream that serialises nothing.

    On a thread whose current CuPy stream is the legacy default stream (no
    ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``), a copy would wait for the work of every blocking
    stream of the device (another thread's concurrent run included) and stop that work while it runs.
    Here the block runs on a non-blocking stream of this thread instead, synchronised at the end.  Only
    for values whose producing work is known to be complete (the streams executor waits on the host for
    its outputs' events): the copy does not wait for anything.  Other values, host values and
    per-thread default streams: nothing changes.
    """
    arr = _first_cupy(value)
    if arr is None:
        yield
        return
    cp = _cupy()
    with cp.cuda.Device(arr.device.id):
        if cp.cuda.get_current_stream().ptr != 0:   # a per-thread default stream, or the caller's own stream
            yield
            return
        streams: dict[Any, Any] = _COPY_STREAMS.__dict__   # keyed by (CuPy module, device), not by name
        key = (id(cp), arr.device.id)
        stream = streams.get(key)
        if stream is None:
            stream = streams[key] = cp.cuda.Stream(non_blocking=True)
        with stream:
            try:
                yield
            finally:
                stream.synchronize()


def _first_cupy(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return next((a for v in value if (a := _first_cupy(v)) is not None), None)
    if isinstance(value, dict):
        return _first_cupy(list(value.values()))
    return value if is_cupy_array(value) else None


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

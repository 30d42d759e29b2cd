"""What the tasks of a plan call when they run: fitting, applying fitted states, moving values, cache keys.

The compiler (:mod:`gpunets.planning.plan`) decides which task runs what; these are the functions it binds
into tasks, run later by an executor (on a worker thread, a CUDA lane or a Dask worker: they take everything
they need as arguments).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gpunets.compute.estimators import (
    apply_estimator,
    fit_estimator,
    fit_transform_estimator,
    partial_fit_estimator,
    static_estimator,
)
from gpunets.core.fitted_machine import FittedMachine
from gpunets.core.graph import machine_sources
from gpunets.core.machines import STATIC, FittedState, Machine
from gpunets.core.nodes import Source
from gpunets.core.weights import check_weight_values
from gpunets.devices._gpulibs import loaded_cupy
from gpunets.devices.cache import CACHE, digest, operation_key, value_key
from gpunets.devices.data import device_of, is_cupy_array, n_rows, to_device
from gpunets.devices.placement import Device, local_ordinal, same_device


def _combine(recipe: tuple[tuple[int, ...], Any], memo: dict[int, bytes | None]) -> bytes | None:
    deps, head = recipe
    if callable(head):
        head = head()
    if head is None:
        return None
    parts = [head]
    for d in deps:
        k = memo[d]
        if k is None:
            return None
        parts.append(k)
    return digest(*parts)


def _source_head(s: Source, rows: Any) -> bytes:
    """A source's part of a cache key: its data's content and the rows taken (uid-free)."""
    r = b"all" if rows is None else repr(rows).encode() if isinstance(rows, slice) else value_key(rows)
    return digest(b"source", value_key(s._data), r)


def _constants_key(spec: tuple[tuple[bool, Any], ...] | list[tuple[bool, Any]]) -> bytes:
    return digest(*[b"node" if is_dep else value_key(v) for is_dep, v in spec])


def _function_head(op: Any, spec: tuple[tuple[bool, Any], ...]) -> bytes | None:
    name = operation_key(op)
    return None if name is None else digest(b"fn", name, _constants_key(spec))


def _cached(value: Any) -> Any:
    return value


def _store(key: bytes, owner: int, budget: int, fn: Callable[..., Any], *values: Any) -> Any:
    value = fn(*values)
    CACHE.put(key, value, budget=budget, owner=owner)
    return value


def _constant_on(value: Any, dev: Any) -> Any:
    """An array constant of an operation node (``W @ np.ones(2)``), moved once per plan to where the node runs.

    CuPy refuses NumPy operands in device operations, so weights, masks or offsets given as NumPy arrays go to the
    node's device with the node's other inputs; other constants (numbers, strings, slices) are used as they are.
    """
    if (isinstance(value, np.ndarray) or is_cupy_array(value)) and not same_device(device_of(value), dev):
        return to_device(value, dev, frames="array")
    return value


def _call_with_constants(fn: Callable[..., Any], spec: tuple[tuple[bool, Any], ...], *values: Any) -> Any:
    return fn(*[values[i] if is_dep else i for is_dep, i in spec])


def _apply_state(op: str, spec: tuple[tuple[bool, Any], ...], st: Any, *values: Any) -> Any:
    """Apply a machine's fitted state ``st`` (a :class:`~gpunets.core.machines.FittedState`)."""
    return apply_estimator(st.estimator, op, tuple(values[i] if is_dep else i for is_dep, i in spec), st.path)


def _apply_fitted(op: str, spec: tuple[tuple[bool, Any], ...], *values: Any) -> Any:
    est, info = values[-1][:2]       # a fit task's value: (estimator, info[, training output])
    return apply_estimator(est, op, tuple(values[i] if is_dep else i for is_dep, i in spec),
                           info.get("path", "sklearn"))


def _move(dev: Any, frames: str, value: Any) -> Any:
    if isinstance(value, FittedMachine):   # gn.node(f, mach): its fitted params follow f to ``dev``
        return value.on(dev)
    return to_device(value, dev, frames=frames)


def _fit_task(est: Any, n_args: int, resolved: Any, *values: Any, keywords: tuple[str, ...] = (),
              weights: Any = None) -> tuple[Any, dict[str, Any]]:
    check_weight_values(weights, values)
    return fit_estimator(est, tuple(values[:n_args]), resolved, keywords=keywords)


def _partial_fit_task(est: Any, n_args: int, resolved: Any, times: int, *values: Any,
                      keywords: tuple[str, ...] = (), weights: Any = None) -> tuple[Any, dict[str, Any]]:
    check_weight_values(weights, values)
    return partial_fit_estimator(est, tuple(values[:n_args]), resolved, times, keywords=keywords)


def _static_task(est: Any, resolved: Any) -> tuple[Any, dict[str, Any]]:
    return static_estimator(est, resolved)


def _static_state(m: Machine) -> Any:
    """The state a call uses for a static machine that was never fitted: a fresh copy of its model, not kept."""
    pending = m._prepare_fit(STATIC, None, b"")
    return FittedState(pending.estimator, pending.params, None, b"", 0, STATIC, 0.0)


def _fit_transform_task(est: Any, n_args: int, resolved: Any, *values: Any, keywords: tuple[str, ...] = (),
                        weights: Any = None, check: bool = False) -> tuple[Any, dict[str, Any], Any]:
    check_weight_values(weights, values)
    return fit_transform_estimator(est, tuple(values[:n_args]), resolved, keywords=keywords, check=check)


def _refit_output_task(est: Any, n_args: int, resolved: Any, *values: Any, keywords: tuple[str, ...] = (),
                       weights: Any = None) -> Any:
    """``fit_transform``'s output on a fresh copy, the copy dropped (gpunets.planning.outputs)."""
    return _fit_transform_task(est, n_args, resolved, *values, keywords=keywords, weights=weights)[2]


def _training_output(fitted: tuple[Any, ...]) -> Any:
    return fitted[2]


def _commit_fit(m: Machine, pending: Any, asked: str, est: Any, info: dict[str, Any], *output: Any) -> None:
    dev = str(info.get("device", "cpu"))
    if dev.startswith("cuda"):
        # a committed state is read at once by calls in other threads, on their own streams, with no event to
        # wait for: its arrays must be complete before it is installed (the fit's stream, synchronised here)
        cp = loaded_cupy()
        if cp is not None:
            with cp.cuda.Device(local_ordinal(Device.parse(dev).index or 0)):
                cp.cuda.get_current_stream().synchronize()
    m._commit(pending, est, {**info, "asked": asked})


def _rows_key(rows: Any, n: int | None = None) -> Any:
    """The rows a fit trains on, by value: ``slice(0, 10)``, ``np.arange(10)`` and a mask give one key.

    With ``n`` (the number of rows of the data) rows become positions, in the order given; without it
    (no data known) a slice stays a slice.  ``rows=None`` stays distinct from every row listed (MLJ's rule).
    """
    if rows is None:
        return None
    import numpy as np

    if n is None:
        return rows if isinstance(rows, slice) else np.asarray(rows).copy()
    if isinstance(rows, slice):
        idx = np.arange(n)[rows]
    else:
        r = np.asarray(rows)
        idx = np.flatnonzero(r) if r.dtype == bool else np.where(r < 0, r + n, r).astype(np.int64, copy=False)
    return np.asarray(idx, dtype=np.int64)


def _n_rows_of(machines: Sequence[Any]) -> int | None:
    """The number of rows of the first source with data that the machines train on."""
    for m in machines:
        for s in machine_sources(m):
            if s._data is not None:
                try:
                    return n_rows(s._data)
                except Exception:  # noqa: BLE001 - a value without rows: compare rows as given
                    return None
    return None

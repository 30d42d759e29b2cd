"""Validate once, then run without syncs: the finite check of a run's sources.

scikit-learn checks every array it is given for NaN and infinity (``sklearn/utils/validation.py``); on a GPU
each check is a host synchronisation (``Ridge.predict``, ``PCA.transform``, ``StandardScaler.transform`` one
each).  A run whose tasks are on a GPU checks each of its sources once instead (:func:`all_finite`: one host
read for a GPU array, none for host data) and, where every source is finite, runs its estimator calls under
``sklearn.config_context(assume_finite=True)`` (:func:`run_config`).  A source that is not finite (or whose
finiteness cannot be told cheaply: a list, a sparse matrix, an object column) leaves scikit-learn's own checks
on, so a NaN meets the same error as without this module, raised by the estimator that refuses it.

>>> import numpy as np
>>> all_finite(np.array([1.0, 2.0])), all_finite(np.array([1.0, np.nan])), all_finite(np.arange(3))
(True, False, True)
>>> all_finite([1.0, 2.0]) is None   # not checked: scikit-learn's own checks stay on
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpunets.devices.value_types import is_cupy_array, is_pandas

__all__ = ["all_finite", "on_gpu", "run_config"]


def all_finite(value: Any) -> bool | None:
    """Whether ``value`` holds no NaN or infinity: True, False, or None where it cannot be told cheaply.

    One host read for a GPU array (``bool`` of a 0-d device array), none for host data.  Integer and
    boolean data are finite; pandas frames and series of numeric columns are checked column by column.
    """
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biu":
            return True
        if value.dtype.kind in "fc":
            return bool(np.isfinite(value).all())
        return None
    if is_cupy_array(value):
        if value.dtype.kind in "biu":
            return True
        if value.dtype.kind not in "fc":
            return None
        xp = value.__array_namespace__() if hasattr(value, "__array_namespace__") else None
        if xp is None:   # pragma: no cover - every CuPy array has it
            return None
        return bool(xp.all(xp.isfinite(value)))   # the one host read of this source
    if is_pandas(value):
        cols = [value] if value.ndim == 1 else [value.iloc[:, i] for i in range(value.shape[1])]
        for col in cols:
            kind = getattr(col.dtype, "kind", "O")
            if kind in "biu":
                continue
            if kind != "f":
                return None
            if not bool(np.isfinite(col.to_numpy()).all()):
                return False
        return True
    return None


def on_gpu(plan: Any) -> bool:
    """Whether a task of ``plan`` runs on a CUDA device."""
    return any(str(t.device).startswith("cuda") for t in plan.tasks)


def run_config(plan: Any) -> dict[str, Any] | None:
    """The scikit-learn configuration the tasks of ``plan`` run under: the caller's (``plan.sklearn_config``),
    with ``assume_finite=True`` where the plan has a task on a GPU and every array source is finite.

    Each source is checked once per run (:func:`all_finite`); sources that are not arrays (a scalar, a
    fitted state) need no check.  A source that is not finite, or cannot be told, keeps scikit-learn's
    own checks on, so the error a NaN meets is the one it meets without this check.
    """
    base = plan.sklearn_config
    if (base and base.get("assume_finite")) or not on_gpu(plan):
        return base
    for t in plan.tasks:
        if t.kind != "source":
            continue
        v = t.value
        if v is None or isinstance(v, (int, float, str, bool)):
            continue
        if all_finite(v) is not True:
            return base
    return {**(base or {}), "assume_finite": True}

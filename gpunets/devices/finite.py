"""Validate once, then run without syncs: the finite check of a run's sources.

scikit-learn checks every array it is given for NaN and infinity (``sklearn/utils/validation.py``); on a GPU
each check is a host synchronisation (``Ridge.predict``, ``PCA.transform``, ``StandardScaler.transform`` one
each).  A run whose tasks are on a GPU checks each of its sources once instead (:func:`all_finite`: one host
read for a GPU array, none for host data) and, where every source is finite, runs its estimator calls under
``sklearn.config_context(assume_finite=True)`` (:func:`run_config`).  A source that is not finite (or whose
finiteness cannot be told cheaply: a list, a sparse matrix, an object column) leaves scikit-learn's own checks
on, so a NaN meets the same error as without this module, raised by the estimator that refuses it.

A source that holds a NaN or an infinity and is read directly only by machines of scikit-learn estimators that
refuse NaN (their ``allow_nan`` tag is False) is refused at the source instead (:func:`refuse_nonfinite`),
before any task runs: the error is scikit-learn's own message for that input, naming the source and the
machines, so no machine upstream of the one that would have refused it is fitted first.

>>> import numpy as np
>>> all_finite(np.array([1.0, 2.0])), all_finite(np.array([1.0, np.nan])), all_finite(np.arange(3))
(True, False, True)
>>> all_finite([1.0, 2.0]) is None   # not checked: scikit-learn's own checks stay on
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpunets.base.exceptions import EvaluationError, FitError, wrap_exception
from gpunets.devices.value_types import is_cupy_array, is_pandas

__all__ = ["all_finite", "on_gpu", "run_config", "refuse_nonfinite"]


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
        finite = all_finite(v)
        if finite is False:
            refuse_nonfinite(plan, t)
        if finite is not True:
            return base
    return {**(base or {}), "assume_finite": True}


def _refuses_nan(model: Any) -> bool:
    """True for a scikit-learn (or cuML, or gpunets) estimator whose ``allow_nan`` tag is False.

    Other models (a user's class) may take NaN whatever their tags say: they keep their own checks.
    """
    module = type(model).__module__ or ""
    if not module.startswith(("sklearn.", "cuml.", "gpunets.")):
        return False
    try:
        from sklearn.utils import get_tags  # lazy: only on the error path (a source that is not finite)

        return not get_tags(model).input_tags.allow_nan
    except Exception:   # no tags (an old scikit-learn, a model without them): its own checks decide
        return False


def refuse_nonfinite(plan: Any, source_task: Any) -> None:
    """Raise scikit-learn's error for a source holding NaN or infinity, before anything of ``plan`` runs,
    where every task that reads it directly is a machine (a fit or a machine's call) whose estimator refuses
    NaN; else return (an operation may impute, or a model take NaN: the estimators' own checks decide).

    The error is a ``gn.FitError`` (a fit) or ``gn.EvaluationError`` (a call) that is also a ``ValueError``;
    its message is scikit-learn's ``check_array`` message for the input the machines take it as (``X`` or
    ``y``), naming the source and the machines.
    """
    consumers, todo = [], [source_task.key]
    while todo and plan.consumers:   # through the moves between devices: they pass the value on as it is
        for k in plan.consumers[todo.pop()]:
            c = plan.tasks[k]
            if c.kind == "move":
                todo.append(k)
            else:
                consumers.append(c)
    machines = [c.machine for c in consumers if c.kind in ("fit", "eval") and c.machine is not None]
    if not consumers or len(machines) != len(consumers) or not all(_refuses_nan(m.model) for m in machines):
        return
    node = source_task.node
    names = {"y" if i == 1 else "X" for i in (_position(m, node) for m in machines) if i is not None}
    input_name = names.pop() if len(names) == 1 else "X"
    value = source_task.value
    host = value.get() if is_cupy_array(value) else value   # the error path only: one more host read
    try:
        from sklearn.utils import check_array  # lazy: only on the error path

        check_array(host, ensure_2d=False, dtype=None, input_name=input_name, ensure_min_samples=0)
    except ValueError as e:
        why = str(e)
    else:   # pragma: no cover - all_finite said it is not finite
        why = f"Input {input_name} contains NaN or infinity."
    label = getattr(node, "label", "source")
    who = ", ".join(dict.fromkeys(plan.machine_label(m) for m in machines))
    kind = FitError if plan.kind == "fit" else EvaluationError
    msg = (f"Source {label!r} cannot be read by {who}: {why} It was checked once at the source, before any "
           "task ran: nothing was fitted or changed. Hint: impute the missing values in the network (a "
           "machine of sklearn.impute.SimpleImputer on this source), or use an estimator that accepts NaN "
           "(e.g. HistGradientBoostingRegressor).")
    raise wrap_exception(kind, msg, ValueError(msg))


def _position(machine: Any, node: Any) -> int | None:
    for i, a in enumerate(getattr(machine, "args", ())):
        if a is node:
            return i
    return None

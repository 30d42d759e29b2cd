"""Training outputs that only a fit gives (docs/learning-networks.md, "Training outputs").

A machine's ``transform`` of its own training input, in a plan that fits a machine downstream, is what
scikit-learn's ``Pipeline.fit`` passes on: ``fit_transform``'s result.  When the machine fits in the same plan
its fit task gives it (:meth:`gpunets.planning.plan._Builder._training_output`).  When it does not (it was
fitted before and skips, or its state is loaded from the store) and its ``fit_transform`` may differ from
``fit(X).transform(X)`` (:func:`~gpunets.compute.estimators.training_output_differs`: ``TargetEncoder``'s
cross-fitting, ``PCA``'s last bits), transforming again would train the downstream machine on other values
than a fresh fit of the whole network would, unless its fit found that its ``transform`` gives the same bits
(:func:`~gpunets.compute.estimators.transform_gives`, kept as ``FittedState.same_output`` and in the store's
entry).  Otherwise the task made here computes ``fit_transform`` on a fresh copy of the machine's model and
keeps only its output: the machine's fitted state is not replaced (its version,
and what depends on it, stay as they are).  A machine keeping its outputs (``cache=True``) serves it from
memory instead.  That task is a fit that runs: its label says "fit_transform again" in the trace.

A search's steps do the same in their own tasks (:func:`gpunets.tuning.tasks._training_rows`), where the
search's report counts each such fit (``search_report_.again``, a nested record of its trace) and a store
opened with ``outputs=True`` keeps the outputs instead (:mod:`gpunets.tuning.stored`).
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace
from typing import Any

from gpunets.compute.estimators import fresh_estimator, training_output_differs
from gpunets.core.machines import STATIC
from gpunets.devices.placement import Device
from gpunets.planning.placement import _fit_keywords, _resolve_fit
from gpunets.planning.stored import STORED
from gpunets.planning.tasks import _refit_output_task, _store

__all__ = ["recomputed_output", "cached_operation", "own_training_output"]


def own_training_output(x: Any, m: Any) -> bool:
    """Is ``x`` ``m.transform`` of ``m``'s own training input (what a fit of ``m`` gives by fit_transform)?"""
    return x.operation == "transform" and len(x._args) == 1 and bool(m.args) and x._args[0] is m.args[0]


def cached_operation(mode: str, x: Any, m: Any) -> str:
    """The operation a cache key names for ``x``: in a fit plan, the output of a machine whose
    ``fit_transform`` may differ from its ``transform`` is ``"fit_transform"``'s (a call on the training data
    must not be served the fit's output, nor a fit the call's)."""
    op = str(x.operation)
    if mode == "fit" and own_training_output(x, m) and training_output_differs(m.model):
        return "fit_transform"
    return op


def recomputed_output(b: Any, x: Any, m: Any, fk: int | None, st: Any, frames: str, ck: bytes | None,
                      owner: int) -> int | None:
    """The task giving ``x`` (``m.transform`` of ``m``'s training input) as ``fit_transform`` does, when
    ``m`` does not fit in this fit plan and its ``fit_transform`` may differ; None: transform as usual."""
    if b.mode != "fit" or not own_training_output(x, m) or m.static or m.frozen:
        return None
    if fk is None:
        if st is None or st.action == STATIC or st.same_output or st.is_remote and st.stored.lost:
            return None
        where = (Device.parse(st.device), st.path)
    elif b.fit_action.get(m._uid) == STORED:
        if m._uid in b.same_output:
            return None
        where = b.mach_dev[m._uid]
    else:
        return None                     # it fits in this plan: its fit task gives the output
    if not training_output_differs(m.model):
        return None
    est = fresh_estimator(m.model)
    resolved, dev, path = _resolve_fit(b, m, SimpleNamespace(estimator=est, warm=None))
    if (dev, path) != where:
        return None                     # it would run elsewhere than it was fitted: its transform it is
    if resolved is not None:
        est = resolved.estimator
    deps = tuple(b.moved(b.node(a), dev, frames) for a in m.args)
    fn: Any = partial(_refit_output_task, est, len(deps), resolved, **_fit_keywords(m))   # (no check: dropped)
    if ck is not None:
        fn = partial(_store, ck, owner, b.budget, fn)
    return b.add(kind="eval", fn=fn, deps=deps, node=x, machine=m, cost=10.0, device=dev,
                 label=f"{x._short()} (fit_transform again: {m.label}'s training output)")

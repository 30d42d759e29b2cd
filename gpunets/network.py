"""Fit and evaluate networks: compile a plan, pick an executor, run, report.

This is the one place where the user-facing verbs meet the planner and the
executors; nodes and machines call into it.
"""

from __future__ import annotations

import contextvars
import threading
from dataclasses import dataclass
from typing import Any, Sequence

from .exceptions import NetworkError
from .nodes import AbstractNode, Source, is_node
from .plan import compile_call, compile_fit
from .trace import Trace

__all__ = ["fit", "evaluate", "Evaluation", "last_trace"]

_LAST_TRACE: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("gpunets_last_trace", default=None)


def last_trace() -> Trace | None:
    """The trace of the last fit or evaluation run in this context."""
    return _LAST_TRACE.get()


def _max_lanes(executor: Any, workers: int | None) -> int:
    from .config import get_config
    from .executors.base import default_workers

    if workers is None:
        workers = get_config()["workers"]
    if workers is None:
        workers = getattr(executor, "workers", None)
    return max(1, workers or default_workers())


def fit(*targets: Any, rows: Any = None, force: bool = False, executor: Any = None,
        workers: int | None = None, device: Any = None, progress: bool | None = None) -> Any:
    """Train every machine upstream of ``targets``, dependencies first.

    Each machine trains, updates or skips by the retraining rules (see
    :mod:`gpunets.machines`).

    Parameters
    ----------
    *targets : Node or Machine
        What to fit for.
    rows : index, slice or mask, optional
        Train every machine on these rows of the sources' data.
    force : bool
        Retrain every machine from scratch (except frozen ones).
    executor : {"auto", "serial", "threads", "streams", "dask"} or Executor, optional
        Where tasks run; default from :func:`gpunets.config` (``"auto"``).
    workers : int, optional
        Threads (``threads``) or lanes (``streams``); default: the cores.
    device : str, optional
        Run the whole network on this device for this fit: ``device="cpu"``
        is the CPU fallback path (every node on the CPU, cuML models replaced
        by their scikit-learn twins).
    progress : bool, optional
        Show a tqdm progress bar.

    Returns
    -------
    FitReport
        ``actions`` maps every machine upstream to ``"train"``, ``"update"`` or ``"skip"``.

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> from sklearn.linear_model import Ridge
    >>> X = gn.source(np.arange(10.0).reshape(5, 2), name="X")
    >>> y = gn.source(np.arange(5.0), name="y")
    >>> m = gn.machine(Ridge(), X, y)
    >>> report = gn.fit(m.predict(X))
    >>> report.actions["Ridge"]
    'train'
    >>> gn.fit(m.predict(X)).actions["Ridge"]
    'skip'
    """
    from .config import config, get_config
    from .executors import get_executor
    from .report import FitReport, explain

    if not targets:
        msg = "gn.fit needs at least one node or machine to fit, e.g. gn.fit(yhat)."
        raise TypeError(msg)
    _remember_site()
    if device is not None:
        with config(device=device), _override_placement(device):
            return fit(*targets, rows=rows, force=force, executor=executor, workers=workers, progress=progress)
    plan = compile_fit(list(targets), rows=rows, force=force, max_lanes=_max_lanes(executor, workers))
    reasons = explain(plan, rows, force)
    ex = get_executor(executor, workers, plan)
    show = get_config()["progress"] if progress is None else progress
    n_fits = sum(1 for t in plan.tasks if t.kind == "fit")
    outer = _PROGRESS.get()
    token = None
    if outer is not None:          # a fit inside a task of another fit (a stack's folds): same bar
        outer.add(n_fits)
        progress_bar = None
    else:
        progress_bar = _Progress.open(n_fits, show)
        if progress_bar is not None:
            token = _PROGRESS.set(progress_bar)   # before the run: its worker threads copy this context
    callback = (outer or progress_bar).on_task_done if (outer or progress_bar) is not None else None
    try:
        run = ex.run(plan, on_task_done=callback)
    finally:
        if token is not None:
            _PROGRESS.reset(token)
        if progress_bar is not None:
            progress_bar.close()
    _LAST_TRACE.set(run.trace)
    run.raise_error()
    report = FitReport(plan, run.trace, run.trace.executor, reasons)
    _adopt_nested_traces(report)
    return report


def _adopt_nested_traces(report: Any) -> None:
    """Put the fits a composite ran inside its machine's task (a stack's folds) on the report's trace."""
    from .report import FitReport

    for m, action in report.actions.items():
        st = m._state
        inner = getattr(st.estimator, "fit_report_", None) if st is not None and action != "skip" else None
        if isinstance(inner, FitReport) and inner.trace is not report.trace:
            report.trace.adopt(inner.trace, report.labels[m], inner.task_labels())


def reject_fit_data(target: Any, data: tuple[Any, ...]) -> None:
    """``node.fit(X, y)`` (a scikit-learn habit): a TypeError that says where data goes in a network."""
    if not data:
        return
    what = ", ".join(type(d).__name__ for d in data)
    sources = [s.label for s in (target.sources if is_node(target) else _machine_sources(target))]
    msg = (f"{target!r}.fit() takes no data, got {len(data)} positional argument(s) ({what}). A network trains on "
           f"the data of its sources ({', '.join(sources) or 'none'}): create them with gn.source(X, name='X'), "
           "or replace their data with X.data = new_X, then call fit(). To train on some of the rows, "
           "use fit(rows=...); for a scikit-learn estimator with fit(X, y), export the network as a "
           "composite (gn.CompositeRegressor).")
    raise TypeError(msg)


def _machine_sources(m: Any) -> tuple[Source, ...]:
    from .graph import all_sources

    return all_sources(list(m.args))


def _remember_site() -> None:
    from .executors.base import inside_task

    if not inside_task():   # warnings from worker threads of this run point at the user's call
        from ._warn import remember_user_site

        remember_user_site()


def _override_placement(device: Any) -> Any:
    from .devices import override_placement

    return override_placement(device)


def tqdm_class() -> Any:
    """tqdm's notebook widget where ipywidgets is installed, else its text bar; None without tqdm.

    ``tqdm.auto`` alone warns "IProgress not found" in a notebook without ipywidgets.
    """
    import importlib.util

    if importlib.util.find_spec("tqdm") is None:
        return None
    if importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.auto import tqdm
    else:
        from tqdm.std import tqdm
    return tqdm


class _Progress:
    """The progress bar of one top-level fit; fits run inside its tasks (a stack's folds) count on it too."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar
        self.lock = threading.Lock()

    @classmethod
    def open(cls, n_fits: int, show: bool) -> "_Progress | None":
        tqdm = tqdm_class() if show and n_fits else None
        return None if tqdm is None else cls(tqdm(total=n_fits, desc="fitting", unit="fit", leave=False))

    def add(self, n: int) -> None:
        with self.lock:
            self.bar.total += n
            self.bar.refresh()

    def on_task_done(self, task: Any) -> None:
        if task.kind == "fit":
            with self.lock:
                self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


_PROGRESS: contextvars.ContextVar[_Progress | None] = contextvars.ContextVar("gpunets_progress", default=None)


@dataclass
class Evaluation:
    """The value of an evaluation and its trace."""

    value: Any
    trace: Trace


def _bindings(target: AbstractNode, data: Sequence[Any], named: dict[str, Any]) -> dict[int, Any]:
    origins = target.origins
    bindings: dict[int, Any] = {}
    if len(data) > 1:
        msg = (f"{target!r} takes new data for one origin positionally, got {len(data)} values; "
               f"pass the others by source name, e.g. node(X=..., Z=...).")
        raise TypeError(msg)
    if data:
        if len(origins) != 1:
            names = [s.label for s in origins]
            if all(s.name is not None for s in origins) and len(set(names)) == len(names):
                hint = f"by source name: node({', '.join(f'{n}=...' for n in names)})."
            else:
                hint = ("by source name, and some origins have no (distinct) name: create them with "
                        "gn.source(data, name='X') (a name per source), then call node(X=..., Z=...).")
            msg = f"{target!r} has {len(origins)} origins ({names}), so new data must be passed {hint}"
            raise NetworkError(msg)
        bindings[origins[0]._uid] = data[0]
    if named:
        by_name: dict[str, list[Source]] = {}
        for s in origins:
            if s.name is not None:
                by_name.setdefault(s.name, []).append(s)
        for name, value in named.items():
            found = by_name.get(name)
            if not found:
                valid = sorted(by_name)
                others = [s.name for s in target.sources if s.name == name]
                why = (f" Source {name!r} is upstream only through a machine's training data, so new data "
                       "for it would not change this node." if others else "")
                msg = (f"{target!r} has no origin named {name!r}.{why} Valid names are: {valid}"
                       + ("" if valid else " (no origin has a name: create sources with gn.source(data, name=...))")
                       + ".")
                raise NetworkError(msg)
            if len(found) > 1:
                msg = f"{len(found)} origins of {target!r} are named {name!r}: give the sources distinct names."
                raise NetworkError(msg)
            if found[0]._uid in bindings:
                msg = f"Data for origin {name!r} was given twice (positionally and by name)."
                raise TypeError(msg)
            bindings[found[0]._uid] = value
    if bindings:
        from .data import check_placeable

        labels = {s._uid: s.label for s in origins}
        for uid, value in bindings.items():
            check_placeable(value, what=f"the data given for source {labels[uid]!r}", device="cpu")
    return bindings


def evaluate(target: AbstractNode, *data: Any, rows: Any = None, executor: Any = None,
             workers: int | None = None, output: str | None = None, trace: bool = False, **named: Any) -> Any:
    """Evaluate ``target``: ``target()``, ``target(Xnew)``, ``target(X=...)``, ``target(rows=r)``.

    With ``trace=True`` return an :class:`Evaluation` holding the value and the trace.

    >>> import numpy as np, gpunets as gn
    >>> X = gn.source(np.ones(2), name="X")
    >>> r = gn.evaluate(X + 1, trace=True)
    >>> r.value.tolist(), len(r.trace)
    ([2.0, 2.0], 1)
    """
    from .executors import get_executor

    if not is_node(target):
        msg = f"evaluate needs a node, got {target!r} of type {type(target).__name__}."
        raise TypeError(msg)
    from .config import OUTPUT_TYPES, get_config

    if output is None:
        output = get_config()["output"]
    if output not in OUTPUT_TYPES:
        msg = (f"output={output!r}: use 'auto' (the type family given), 'device' (where it was computed), "
               "'numpy' or 'pandas'; gn.set_config(output=...) sets the default.")
        raise ValueError(msg)
    _remember_site()
    bindings = _bindings(target, data, named)
    plan = compile_call([target], bindings, rows=rows, max_lanes=_max_lanes(executor, workers))
    ex = get_executor(executor, workers, plan)
    run = ex.run(plan)
    _LAST_TRACE.set(run.trace)
    (value,) = run.results()
    if output == "auto":
        value = _like_input(value, plan)
    elif output in ("numpy", "pandas"):
        value = _as_host(value, output, plan)
    return Evaluation(value, run.trace) if trace else value


def _as_host(value: Any, kind: str, plan: Any) -> Any:
    """``value`` as a NumPy array or a pandas object on the host (``output="numpy"`` / ``"pandas"``)."""
    import numpy as np
    import pandas as pd

    from .data import is_pandas, to_device

    value = to_device(value, "cpu")
    if hasattr(value, "to_pandas"):            # cuDF moved to the host, or an Arrow-like object
        value = value.to_pandas()
    if kind == "numpy":
        return value.to_numpy() if is_pandas(value) else np.asarray(value)
    if is_pandas(value):
        return value
    arr = np.asarray(value)
    sources = [t.value for t in plan.tasks if t.kind == "source" and is_pandas(t.value)]
    index = sources[0].index if sources and arr.ndim and len(sources[0]) == len(arr) else None
    return pd.Series(arr, index=index) if arr.ndim == 1 else pd.DataFrame(arr, index=index)


def _like_input(value: Any, plan: Any) -> Any:
    """Return ``value`` in the type family of the data the caller gave (pandas in, pandas out)."""
    from .data import device_of, to_host_like

    sources = [t.value for t in plan.tasks if t.kind == "source" and t.value is not None]
    if not sources:
        return value
    try:
        if device_of(sources[0]) == device_of(value):
            return value
    except TypeError:
        return value
    return to_host_like(value, sources[0])

"""Fit and evaluate networks: compile a plan, pick an executor, run, report.

This is the one place where the user-facing verbs meet the planner and the
executors; nodes and machines call into it.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpunets.api.report import FitReport, explain
from gpunets.base._warn import remember_user_site
from gpunets.base.config import check_run_options, config, get_config
from gpunets.base.exceptions import FitError, NetworkError
from gpunets.base.trace import Trace
from gpunets.core.graph import all_sources
from gpunets.core.nodes import AbstractNode, Source, is_node
from gpunets.devices.data import check_placeable, device_of, is_pandas, off_the_legacy_stream, to_device, to_host_like
from gpunets.devices.placement import override_placement
from gpunets.executors import get_executor, gpu_auto
from gpunets.executors.base import default_workers, gpu_timing, inside_task
from gpunets.executors.graphs import GraphReport, run_graphs
from gpunets.planning.plan import compile_call, compile_fit

__all__ = ["fit", "fit_with_outputs", "evaluate", "Evaluation", "last_trace", "remember_costs"]

_LAST_TRACE: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("gpunets_last_trace", default=None)


def last_trace() -> Trace | None:
    """The trace of the last fit or evaluation run in this context."""
    return _LAST_TRACE.get()


def _max_lanes(executor: Any, workers: int | None) -> int:
    if workers is None:
        workers = get_config()["workers"]
    if workers is None:
        workers = getattr(executor, "workers", None)
    return max(1, workers or default_workers())


def fit(*targets: Any, rows: Any = None, force: bool = False, executor: Any = None,
        workers: int | None = None, device: Any = None, progress: bool | None = None, only: bool = False) -> Any:
    """Train every machine upstream of ``targets``, dependencies first.

    Each machine trains, updates or skips by the retraining rules (see
    :mod:`gpunets.core.machines`).

    Parameters
    ----------
    *targets : Node or Machine
        What to fit for.
    rows : index, slice or mask, optional
        Train every machine on these rows of the sources' data.
    force : bool
        Retrain every machine from scratch (except frozen ones).
    executor : {"auto", "serial", "threads", "streams", "dask"} or Executor, optional
        Where tasks run; default from :func:`gpunets.base.config` (``"auto"``).
    workers : int, optional
        Threads (``threads``) or lanes (``streams``); default: the cores.
    device : str, optional
        Run the whole network on this device for this fit: ``device="cpu"``
        is the CPU fallback path (every node on the CPU, cuML models replaced
        by their scikit-learn twins).
    progress : bool, optional
        Show a tqdm progress bar.
    only : bool, default False
        Train the target machines alone (MLJ's ``fit_only!``; the targets must be machines): their
        training data are computed with the upstream machines' current fitted states, and no upstream
        machine retrains. An upstream machine that is not fitted raises
        :class:`~gpunets.base.exceptions.NotFittedError` naming it.

    Returns
    -------
    FitReport
        ``actions`` maps every machine upstream to ``"train"``, ``"update"``, ``"update (warm)"`` (continued
        from its fitted state), ``"static"`` (a machine with no training arguments) or ``"skip"``.

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
    if not targets:
        msg = "gn.fit needs at least one node or machine to fit, e.g. gn.fit(yhat)."
        raise TypeError(msg)
    check_run_options(executor=executor, workers=workers, progress=progress, force=force, only=only)
    _remember_site()
    return _fit(targets, rows=rows, force=force, executor=executor, workers=workers, device=device,
                progress=progress, only=only)[0]


def fit_with_outputs(targets: Sequence[Any], outputs: Sequence[AbstractNode], *, executor: Any = None,
                     workers: int | None = None, device: Any = None) -> tuple[Any, list[Any]]:
    """:func:`fit` the ``targets``, and give the values of ``outputs`` on the training data *as the fit
    passes them on* (a machine fitted now gives its ``fit_transform``'s output: scikit-learn's
    ``fit_transform`` of a composition), in one run; the values in the caller's type family, as a call's.

    >>> import numpy as np, gpunets as gn
    >>> from sklearn.preprocessing import StandardScaler
    >>> X = gn.source(np.array([[0.0], [2.0]]))
    >>> Z = gn.machine(StandardScaler(), X).transform(X)
    >>> report, (z,) = fit_with_outputs([Z], [Z])
    >>> report.actions["StandardScaler"], z.ravel().tolist()
    ('train', [-1.0, 1.0])
    """
    check_run_options(executor=executor, workers=workers)
    _remember_site()
    report, plan, run = _fit(tuple(targets), rows=None, force=False, executor=executor, workers=workers,
                             device=device, progress=None, only=False, outputs=tuple(outputs))
    values = run.results()[len(run.plan.outputs) - len(outputs):]
    output = get_config()["output"]
    return report, [_as_output(value, output, plan, run) for value in values]


def _fit(targets: Sequence[Any], *, rows: Any, force: bool, executor: Any, workers: int | None, device: Any,
         progress: bool | None, only: bool, outputs: tuple[AbstractNode, ...] = ()) -> tuple[Any, Any, Any]:
    """:func:`fit`'s run: the report, the plan and the run (its values, for ``outputs``)."""
    if device is not None:
        with config(device=device), _override_placement(device):
            return _fit(targets, rows=rows, force=force, executor=executor, workers=workers, device=None,
                        progress=progress, only=only, outputs=outputs)
    plan = compile_fit(list(targets), rows=rows, force=force, max_lanes=_max_lanes(executor, workers), only=only,
                       cache=_cache_allowed(executor), outputs=outputs)
    reasons = explain(plan, rows, force)
    ex = get_executor(executor, workers, plan)
    show = get_config()["progress"] if progress is None else progress
    before = {m: m._version for m in plan.actions}
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
    bar = outer or progress_bar
    callback = bar.on_task_done if bar is not None else None
    try:
        run = ex.run(plan, on_task_done=callback)
    finally:
        if token is not None:
            _PROGRESS.reset(token)
        if progress_bar is not None:
            progress_bar.close()
    _LAST_TRACE.set(run.trace)
    remember_costs(plan, run.trace)
    try:
        run.raise_error()
    except FitError as e:
        _say_what_will_retrain(e, plan, before)
        raise
    report = FitReport(plan, run.trace, run.trace.executor, reasons)
    _adopt_nested_traces(report)
    return report, plan, run


def _cache_allowed(executor: Any) -> bool:
    """The cache of node outputs is off on Dask: intermediate values stay on the workers (docs/caching.md)."""
    spec = get_config()["executor"] if executor is None or executor == "auto" else executor
    return (spec if isinstance(spec, str) else getattr(spec, "name", None)) != "dask"


def _adopt_nested_traces(report: Any) -> None:
    """Put the fits a composite ran inside its machine's task (a stack's folds) on the report's trace."""
    for m, action in report.actions.items():
        st = m._state
        inner = st.peek("fit_report_") if st is not None and action not in ("skip", "stored") else None
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
    return all_sources(list(m.args))


def _remember_site() -> None:
    if not inside_task():   # warnings from worker threads of this run point at the user's call
        remember_user_site()


def _say_what_will_retrain(err: FitError, plan: Any, before: dict[Any, int]) -> None:
    """Append to a fit's error exactly which machines the next fit retrains: those this one did not commit."""
    if not getattr(err, "_gn_task_named", False) or getattr(err, "_gn_retrain_said", False) or not err.args:
        return
    left = [plan.machine_label(m) for m, a in plan.actions.items() if a != "skip" and m._version == before[m]]
    if left:
        err.args = (f"{err.args[0]} The next fit() retrains exactly: {', '.join(left)} (the failed machine and "
                    "those that had not trained yet in this fit).",) + err.args[1:]
        err._gn_retrain_said = True


def remember_costs(plan: Any, trace: Trace) -> None:
    """Keep each operation's last two measured durations on its node, for ``auto``'s next choice.

    (A fit's duration is kept in its machine's state already.)
    """
    tasks = plan.tasks
    timed = [(r[0], r[3] - r[2]) for r in trace._raw]   # the cheap form: no TraceRecord (nor label) built
    timed += [(tasks[r.key], r.end - r.start) for r in trace._records if 0 <= r.key < len(tasks)]
    gpu_auto.remember(plan, trace._records)   # GPU-timed tasks: their GPU and host spans, for auto on one GPU
    for t, seconds in timed:
        if t.kind == "eval":
            # the last two durations: their minimum is the estimate, so one run slowed by a neighbour
            # (a preempted thread, a GC pause) does not change auto's choice
            prev = getattr(t.node, "_cost", None)
            t.node._cost = (prev[1] if prev is not None else seconds, seconds)


def _override_placement(device: Any) -> Any:
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
    def open(cls, n_fits: int, show: bool) -> _Progress | None:
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
    """The value of an evaluation, its trace, and why its executor was chosen."""

    value: Any
    trace: Trace
    executor_reason: str = ""

    @property
    def graphs(self) -> Any:
        """What graph mode did in this call (``gpunets.executors.graphs.GraphReport``); None unless it was asked
        for (``graphs=True``)."""
        return self.trace.graphs


def _bindings(target: AbstractNode, data: Sequence[Any], named: dict[str, Any],
              keep_training: Sequence[str] = ()) -> dict[int, Any]:
    if not data and not named:
        return {}                     # nothing to bind: no walk for the origins
    origins = target.origins
    if isinstance(keep_training, str):
        keep_training = (keep_training,)
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
    if keep_training:
        valid = sorted({s.name for s in origins if s.name is not None})
        unknown = [k for k in keep_training if k not in valid]
        if unknown:
            msg = (f"keep_training={tuple(keep_training)!r}: {target!r} has no origin named {unknown}. "
                   f"Valid names are: {valid}.")
            raise NetworkError(msg)
    if bindings:
        missing = [s for s in origins if s._uid not in bindings and s.name not in keep_training]
        if missing:
            names = [s.label for s in missing]
            unnamed = any(s.name is None for s in missing)
            hint = (" An unnamed source cannot receive new data by name: create it with gn.source(data, name=...)."
                    if unnamed else "")
            msg = (f"New data were given for some origins of {target!r} but not for {names}: the call would "
                   f"mix the new rows with these sources' training data. Pass new data for every origin, e.g. "
                   f"node({', '.join(f'{s.label}=...' for s in origins)}), or say which sources keep their "
                   f"training data: keep_training={tuple(names)!r}.{hint}")
            raise NetworkError(msg)
        labels = {s._uid: s.label for s in origins}
        for uid, value in bindings.items():
            check_placeable(value, what=f"the data given for source {labels[uid]!r}", device="cpu")
    return bindings


def evaluate(target: AbstractNode, *data: Any, rows: Any = None, executor: Any = None,
             workers: int | None = None, output: str | None = None, trace: bool = False,
             keep_training: Sequence[str] = (), graphs: bool | str | None = None, **named: Any) -> Any:
    """Evaluate ``target``: ``target()``, ``target(Xnew)``, ``target(X=...)``, ``target(rows=r)``.

    With ``trace=True`` return an :class:`Evaluation` holding the value and the trace.  ``graphs=True`` (default
    ``gn.get_config()["graphs"]``) replays captured CUDA graphs when a fitted network is called again with
    inputs of the same shapes (:mod:`gpunets.executors.graphs`; ``trace.graphs`` says what it did).  When new data
    are given for some origins, every origin must be given new data, except the sources named in
    ``keep_training``, which keep their own data.

    >>> import numpy as np, gpunets as gn
    >>> X = gn.source(np.ones(2), name="X")
    >>> r = gn.evaluate(X + 1, trace=True)
    >>> r.value.tolist(), len(r.trace)
    ([2.0, 2.0], 1)
    """
    if not is_node(target):
        msg = f"evaluate needs a node, got {target!r} of type {type(target).__name__}."
        raise TypeError(msg)
    if output is None:
        output = get_config()["output"]
    check_run_options(executor=executor, workers=workers, output=output, trace=trace, graphs=graphs)
    if graphs is None:
        graphs = get_config()["graphs"]
    _remember_site()
    bindings = _bindings(target, data, named, keep_training)
    plan = compile_call([target], bindings, rows=rows, max_lanes=_max_lanes(executor, workers),
                        cache=_cache_allowed(executor))
    ex = get_executor(executor, workers, plan)
    auto_note = None
    if graphs == "auto":   # replay where earlier calls were host-bound (None: not timed yet: time this one)
        graphs, auto_note = gpu_auto.graphs_pay(plan)
    # on a GPU the trace shows GPU time (timed CUDA events), not host issue time
    with gpu_timing(trace or graphs is None):
        run = run_graphs(plan, ex) if graphs else ex.run(plan)
    if auto_note is not None:   # graph mode's own report, with why auto chose it; else why auto ran eagerly
        if graphs and run.trace.graphs is not None:
            run.trace.graphs.note = f"{run.trace.graphs.note} {auto_note}".strip()
        else:
            run.trace.graphs = GraphReport("off", note=auto_note)
    _LAST_TRACE.set(run.trace)
    remember_costs(plan, run.trace)
    (value,) = run.results()
    value = _as_output(value, output, plan, run)
    return Evaluation(value, run.trace, plan.executor_reason) if trace else value


def _as_output(value: Any, output: str, plan: Any, run: Any) -> Any:
    """A run's output in the form ``output`` asks for (``"auto"``: the caller's type family)."""
    # a ready GPU value is copied to the host on a stream that does not serialise a concurrent run
    with off_the_legacy_stream(value) if run.outputs_ready and output != "device" else contextlib.nullcontext():
        if output == "auto":
            return _like_input(value, plan)
        if output in ("numpy", "pandas"):
            return _as_host(value, output, plan)
    return value


def _as_host(value: Any, kind: str, plan: Any) -> Any:
    """``value`` as a NumPy array or a pandas object on the host (``output="numpy"`` / ``"pandas"``)."""
    import numpy as np
    import pandas as pd

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
    sources = [t.value for t in plan.tasks if t.kind == "source" and t.value is not None]
    if not sources:
        return value
    try:
        if device_of(sources[0]) == device_of(value):
            return value
    except TypeError:
        return value
    return to_host_like(value, sources[0])

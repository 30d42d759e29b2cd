"""What a fit did and what the machines learned, keyed by readable labels.

Labels are the model's class name, with ``#2``, ``#3``... for further
machines of the same class, in dependency order (``Ridge``, ``Ridge#2``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpunets.core.graph import machine_parents, machine_sources, upstream_machines
from gpunets.core.machines import WARM_UPDATE, Machine, _equal, _same_rows, labels, snapshot_params
from gpunets.core.nodes import is_node
from gpunets.planning.placement import placed_reason
from gpunets.planning.plan import _n_rows_of, _rows_key

if TYPE_CHECKING:  # pragma: no cover
    from gpunets.base.trace import Trace
    from gpunets.planning.plan import Plan

# labels (Ridge, Ridge#2) are made in machines.py, below the compile layer that needs them too
__all__ = ["FitReport", "ActionMap", "Report", "labels", "report", "fitted_params", "explain", "is_internal"]


def explain(plan: Plan, rows: Any = None, force: bool = False) -> dict[Machine, str]:
    """Why each machine of a fit plan trains, updates or skips: the retraining rule that fired.

    Call it after the plan is compiled and before it runs (it reads the machines' last fitted state).

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> from sklearn.linear_model import Ridge
    >>> X, y = gn.source(np.eye(3), name="X"), gn.source(np.ones(3), name="y")
    >>> m = gn.machine(Ridge(), X, y)
    >>> m.fit().why["Ridge"]
    'never trained'
    >>> m.model.alpha = 2.0
    >>> m.fit().why["Ridge"]
    'hyperparameter alpha changed'
    """
    names = labels(list(plan.actions))
    rows_key = _rows_key(rows, _n_rows_of(list(plan.actions)) if rows is not None else None)
    out: dict[Machine, str] = {}
    for m, action in plan.actions.items():
        st = m._state
        if m.frozen:
            out[m] = "frozen"
            continue
        if action == "skip":
            out[m] = "nothing changed"
            continue
        if st is None:
            out[m] = "never trained"
            continue
        if force:
            out[m] = "force=True"
            continue
        retrained = [names.get(p, p.label) for p in machine_parents(m) if plan.actions.get(p, "skip") != "skip"]
        if retrained:
            out[m] = f"upstream {', '.join(retrained)} retrained"
            continue
        if not _same_rows(st.rows, rows_key):
            out[m] = "new rows"
            continue
        if st.upstream != m._upstream_versions():
            # the digest says something upstream changed; the nearest machines' versions say whether it was one
            # of them, else it was a source's data (replaced or changed in place)
            parents = [names.get(p, p.label) for p, v in st.parents if p._version != v]
            srcs = [s.label for s in machine_sources(m)]
            if parents:
                out[m] = f"upstream {', '.join(parents)} retrained since"
            elif len(srcs) == 1:
                out[m] = f"new data in source {srcs[0]}"
            else:
                out[m] = f"new data in one of sources {', '.join(srcs)}"
            continue
        params = snapshot_params(m.model)
        changed = sorted(k for k in set(params) | set(st.params)
                         if k not in params or k not in st.params or not _equal(params[k], st.params[k]))
        word = "hyperparameter" if len(changed) == 1 else "hyperparameters"
        if action == WARM_UPDATE and changed:
            grown = ", ".join(f"{k} ({st.params.get(k)!r} -> {params.get(k)!r})" for k in changed)
            out[m] = f"{word} {grown} grew: continued from the fitted state"
            continue
        out[m] = f"{word} {', '.join(changed)} changed" if changed else action
    for m, action in plan.actions.items():
        if action == "stored":   # it would have trained, for this reason; its state came from the store
            why = out[m] if out[m] != "stored" else "same state"
            out[m] = f"{why}: the same fit was in the store, loaded instead of fitted"
            if plan.stored_from.get(m):
                out[m] += f" ({plan.stored_from[m]})"
    return out


def asked_device(m: Machine) -> str:
    """Where the user placed ``m``: its own ``device=``, else what its last fit was asked under (a ``gn.device``
    block, a composite's or ``from_sklearn``'s ``device``, the config); "auto" when nowhere in particular."""
    d = m.device
    if d is None or d == "auto":
        st = m._state
        return st.asked if st is not None else "auto"
    return str(d)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class Report(dict):
    """``{label: machine report}`` with :meth:`to_frame`."""

    def to_frame(self) -> Any:
        """A pandas DataFrame, one row per machine (index: the label)."""
        import pandas as pd

        return pd.DataFrame.from_dict({k: dict(v) for k, v in self.items()}, orient="index")


class ActionMap(dict):
    """``{machine: action}`` that also accepts a machine's label as key."""

    def __init__(self, actions: dict[Machine, str], names: dict[Machine, str]) -> None:
        super().__init__(actions)
        self._by_label = {names[m]: m for m in actions}

    def _key(self, key: Any) -> Any:
        if isinstance(key, str):
            if key not in self._by_label:
                msg = f"No machine labelled {key!r}; labels are {sorted(self._by_label)}."
                raise KeyError(msg)
            return self._by_label[key]
        return key

    def __getitem__(self, key: Any) -> str:
        return super().__getitem__(self._key(key))

    def __contains__(self, key: object) -> bool:
        return key in self._by_label if isinstance(key, str) else super().__contains__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default

    def by_label(self) -> dict[str, str]:
        return {label: super(ActionMap, self).__getitem__(m) for label, m in self._by_label.items()}


class FitReport:
    """What one :func:`gpunets.fit` did.

    Attributes
    ----------
    actions : ActionMap
        Every machine upstream -> ``"train"``, ``"update"``, ``"update (warm)"``, ``"static"``, ``"stored"``
        (its state loaded from the store instead of fitted: docs/store.md) or ``"skip"`` (also by label).
    trace : Trace
        One record per task: kind, lane, device, start, end.
    executor : str
        The executor that ran it.
    executor_reason : str
        Why: ``"executor='threads'"`` when asked for, or ``auto``'s reason (e.g. the tasks
        were too short for threads to repay their hand-over).
    labels : dict
        Machine -> readable label.
    """

    def __init__(self, plan: Plan, trace: Trace, executor: str,
                 reasons: dict[Machine, str] | None = None) -> None:
        machines = list(plan.actions)
        self.labels = labels(machines)
        self.reasons = reasons or {}
        self.actions = ActionMap(dict(plan.actions), self.labels)
        self.trace = trace
        self.executor = executor
        self.executor_reason = getattr(plan, "executor_reason", "")
        self.placed_why = {m: placed_reason(m) for m in machines}   # as the plan that ran decided
        lanes: dict[Any, Any] = {}
        times: dict[Any, float] = {}
        self._fit_tasks: dict[int, Machine] = {}
        for r in trace.records:
            if r.kind == "fit":
                task = plan.tasks[r.key]
                assert task.machine is not None   # a fit task fits its machine
                lanes[task.machine] = r.lane
                times[task.machine] = r.seconds
                self._fit_tasks[r.key] = task.machine
        self.lanes = lanes
        self.times = times

    def task_labels(self) -> dict[int, str]:
        """Trace key of each fit task -> ``"fit <machine label>"`` (labels as this report shows them)."""
        return {k: f"fit {self.labels[m]}" for k, m in self._fit_tasks.items()}

    @property
    def machines(self) -> list[Machine]:
        return list(self.actions)

    def where(self, mach: Any) -> str:
        """The device the machine actually ran on at its last fit ("cpu", "cuda:0", ...)."""
        m = self.actions._key(mach)
        st = m._state
        return st.device if st is not None else "-"

    @property
    def devices(self) -> dict[str, str]:
        return {self.labels[m]: self.where(m) for m in self.actions}

    @property
    def placed(self) -> dict[str, str]:
        """Label -> why the machine runs where it does: ``"asked for cuda:0"``, or ``device="auto"``'s reason
        (``"auto: 5,000 rows < 50,000, the GPU crossover for Ridge"``, ``"auto: no GPU here"``...)."""
        return {self.labels[m]: self.placed_why.get(m, "") for m in self.actions}

    @property
    def why(self) -> dict[str, str]:
        """Label -> the retraining rule that fired ("never trained", "hyperparameter alpha changed", ...)."""
        return {self.labels[m]: self.reasons.get(m, "") for m in self.actions}

    def rows(self) -> list[dict[str, Any]]:
        """One dict per machine: machine, action, why, asked (placement), device (used), path, lane, seconds, and
        placed (why it runs on that device)."""
        out = []
        for m, action in self.actions.items():
            st = m._state
            out.append({"machine": self.labels[m], "action": action, "why": self.reasons.get(m, ""),
                        "asked": asked_device(m), "device": self.where(m),
                        "path": st.path if st is not None else "-", "lane": self.lanes.get(m, "-"),
                        "seconds": self.times.get(m, 0.0), "placed": self.placed_why.get(m, "")})
        return out

    def to_frame(self) -> Any:
        """A pandas DataFrame, one row per machine, the columns of :meth:`rows`."""
        import pandas as pd

        cols = ["machine", "action", "why", "asked", "device", "path", "lane", "seconds"]
        return pd.DataFrame(self.rows(), columns=cols)

    def _title(self, shown: int | None = None) -> str:
        n = len(self.actions) if shown is None else shown
        return f"FitReport ({self.executor}, {_plural(n, 'machine')}, {self.trace.wall_time * 1e3:.1f} ms)"

    def _shown(self) -> tuple[list[dict[str, Any]], int]:
        """The rows of the machines the user wrote, and how many internal helpers are left out of the display
        (:func:`is_internal`; :meth:`rows`, :meth:`to_frame` and ``actions`` still hold every machine)."""
        rows = self.rows()
        shown = [r for r in rows if not is_internal(r["machine"])]
        return shown, len(rows) - len(shown)

    @property
    def gpu_busy(self) -> float | None:
        """The fit's GPU-busy fraction (GPU time over wall time; None: no task ran on a GPU)."""
        return self.trace.gpu_busy

    @property
    def routes(self) -> dict[str, str]:
        """Label -> the route of the machine's last fit: ``"cuml"``, ``"array_api"``, ``"cpu_fallback"``
        (a GPU placement run on the CPU) or ``"sklearn"`` (on the CPU as asked)."""
        return {self.labels[m]: (m._state.path if m._state is not None else "-") for m in self.actions}

    @staticmethod
    def _device_text(r: dict[str, Any]) -> str:
        asked = r["asked"]
        return r["device"] if asked in ("auto", r["device"]) else f"{r['device']} (asked {asked})"

    def __repr__(self) -> str:
        rows, hidden = self._shown()
        m = max([7] + [len(r["machine"]) for r in rows])   # every column as wide as its widest cell
        w = max([8] + [len(self._device_text(r)) for r in rows])
        a = max([7] + [len(r["action"]) for r in rows])   # "update (warm)" widens the column
        n = max([4] + [len(str(r["lane"])) for r in rows])
        lines = [self._title(len(rows)), f"  {'machine':<{m}}  {'action':<{a}}  {'device':<{w}}  {'lane':<{n}}  "
                 f"{'ms':>9}  why"]
        for r in rows:
            lines.append(f"  {r['machine']:<{m}}  {r['action']:<{a}}  {self._device_text(r):<{w}}  "
                         f"{str(r['lane']):<{n}}  {r['seconds'] * 1e3:>9.2f}  {r['why']}".rstrip())
        if hidden:
            lines.append(f"  (and {_plural(hidden, 'internal helper machine')} of the network: rows() lists them)")
        gpu = [r for r in rows if r["path"] in ("cuml", "array_api", "cpu_fallback")]
        if gpu:
            lines.append("  routes: " + ", ".join(f"{r['machine']} {r['path']}" for r in gpu))
        summary = self.trace.gpu_summary()
        if summary:
            lines.append("  " + summary)
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        from html import escape

        cells = "".join(
            f"<tr><td>{escape(r['machine'])}</td><td>{r['action']}</td><td>{escape(r['why'])}</td>"
            f"<td>{escape(self._device_text(r))}</td><td>{escape(str(r['path']))}</td><td>{r['lane']}</td>"
            f"<td>{r['seconds'] * 1e3:.2f}</td></tr>"
            for r in self._shown()[0])
        return ("<table><caption>" + escape(self._title(len(self._shown()[0]))) + "</caption>"
                "<tr><th>machine</th><th>action</th><th>why</th><th>device</th><th>path</th><th>lane</th>"
                "<th>ms</th></tr>" + cells + "</table>")


def is_internal(label: str) -> bool:
    """Whether a machine label names a helper gpunets adds to a network, not a machine the user wrote: its last
    ``__`` part is in angle brackets or square brackets (a ColumnTransformer's ``<stack>``, a stack's
    ``[cv report]``). A fold of the user's estimator (``ridge[fold 0]``) is the user's.

    >>> [is_internal(x) for x in ("columntransformer__<stack>", "[cv report]", "ridge[fold 0]", "pre__num")]
    [True, True, False, False]
    """
    last = label.rsplit("__", 1)[-1]
    return last.startswith(("<", "[")) or last.endswith(">")


def _machines_of(target: Any) -> tuple[Machine, ...]:
    if isinstance(target, Machine):
        return upstream_machines(list(target.args)) + (target,)
    if is_node(target):
        return upstream_machines([target])
    msg = f"expected a node or a machine, got {target!r:.200} of type {type(target).__name__}."
    if hasattr(type(target), "fit_report_") or hasattr(type(target), "report_"):   # a composite (from_sklearn's)
        msg += (" Hint: a composite reports on its own network: model.report_ (per machine) and "
                "model.fit_report_ (its last fit).")
    raise TypeError(msg)


def report(target: Any) -> Report:
    """``{label: machine.report()}`` for every machine upstream of ``target``.

    Parameters
    ----------
    target : Node or Machine
        The network's output (or a machine); every machine upstream of it is reported.

    Returns
    -------
    dict
        One entry per machine, keyed by its readable label (``Ridge``, ``Ridge#2``): what it did at
        its last fit (``action``, ``seconds``, ``n_rows``, ``asked`` (the placement asked for),
        ``device`` (where it ran), ``path``, ``history``, ...).  ``.to_frame()`` makes it a pandas
        DataFrame, one row per machine.

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> from sklearn.linear_model import Ridge
    >>> X, y = gn.source(np.eye(3), name="X"), gn.source(np.ones(3), name="y")
    >>> p = gn.machine(Ridge(), X, y, device="cpu").predict(X)
    >>> _ = p.fit()
    >>> gn.report(p)["Ridge"]["action"]
    'train'
    >>> gn.report(p).to_frame().loc["Ridge", "device"]
    'cpu'
    """
    ms = _machines_of(target)
    return Report({label: {**m.report(), "asked": asked_device(m)} for m, label in labels(ms).items()})


def fitted_params(target: Any) -> dict[str, dict[str, Any]]:
    """``{label: machine.fitted_params()}`` for every machine upstream of ``target``.

    Parameters
    ----------
    target : Node or Machine
        The network's output (or a machine).

    Returns
    -------
    dict
        One entry per machine, keyed by its readable label: the fitted estimator's learned
        attributes (those ending in ``_``).

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> from sklearn.linear_model import LinearRegression
    >>> X, y = gn.source(np.arange(3.0).reshape(3, 1), name="X"), gn.source(np.arange(3.0), name="y")
    >>> p = gn.machine(LinearRegression(), X, y).predict(X)
    >>> _ = p.fit()
    >>> round(float(gn.fitted_params(p)["LinearRegression"]["coef_"][0]), 6)
    1.0
    """
    ms = _machines_of(target)
    return {label: m.fitted_params() for m, label in labels(ms).items()}

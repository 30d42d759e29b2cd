"""What a fit did and what the machines learned, keyed by readable labels.

Labels are the model's class name, with ``#2``, ``#3``... for further
machines of the same class, in dependency order (``Ridge``, ``Ridge#2``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from .graph import upstream_machines
from .nodes import is_node

if TYPE_CHECKING:  # pragma: no cover
    from .machines import Machine
    from .plan import Plan
    from .trace import Trace

__all__ = ["FitReport", "ActionMap", "labels", "report", "fitted_params"]


def labels(machines: Iterable["Machine"]) -> dict["Machine", str]:
    """Readable, unique labels for ``machines`` (in the order given).

    Examples
    --------
    >>> import gpunets as gn
    >>> from sklearn.linear_model import Ridge
    >>> ms = [gn.machine(Ridge(), gn.source(name="X")) for _ in range(2)]
    >>> list(labels(ms).values())
    ['Ridge', 'Ridge#2']
    """
    out: dict[Machine, str] = {}
    count: dict[str, int] = {}
    for m in machines:
        base = m.label
        count[base] = count.get(base, 0) + 1
        out[m] = base if count[base] == 1 else f"{base}#{count[base]}"
    return out


class ActionMap(dict):
    """``{machine: action}`` that also accepts a machine's label as key."""

    def __init__(self, actions: dict["Machine", str], names: dict["Machine", str]) -> None:
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
        Every machine upstream -> ``"train"``, ``"update"`` or ``"skip"`` (also by label).
    trace : Trace
        One record per task: kind, lane, device, start, end.
    executor : str
        The executor that ran it.
    labels : dict
        Machine -> readable label.
    """

    def __init__(self, plan: "Plan", trace: "Trace", executor: str) -> None:
        machines = list(plan.actions)
        self.labels = labels(machines)
        self.actions = ActionMap(dict(plan.actions), self.labels)
        self.trace = trace
        self.executor = executor
        lanes: dict[Any, Any] = {}
        times: dict[Any, float] = {}
        self._fit_tasks: dict[int, Machine] = {}
        for r in trace.records:
            if r.kind == "fit":
                task = plan.tasks[r.key]
                lanes[task.machine] = r.lane
                times[task.machine] = r.seconds
                self._fit_tasks[r.key] = task.machine
        self.lanes = lanes
        self.times = times

    def task_labels(self) -> dict[int, str]:
        """Trace key of each fit task -> ``"fit <machine label>"`` (labels as this report shows them)."""
        return {k: f"fit {self.labels[m]}" for k, m in self._fit_tasks.items()}

    @property
    def machines(self) -> list["Machine"]:
        return list(self.actions)

    def where(self, mach: Any) -> str:
        """The device the machine actually ran on at its last fit ("cpu", "cuda:0", ...)."""
        m = self.actions._key(mach)
        st = m._state
        return st.device if st is not None else "-"

    @property
    def devices(self) -> dict[str, str]:
        return {self.labels[m]: self.where(m) for m in self.actions}

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for m, action in self.actions.items():
            st = m._state
            out.append({"machine": self.labels[m], "action": action, "device": self.where(m),
                        "path": st.path if st is not None else "-", "lane": self.lanes.get(m, "-"),
                        "seconds": self.times.get(m, 0.0)})
        return out

    def __repr__(self) -> str:
        head = f"FitReport ({self.executor}, {len(self.actions)} machines, {self.trace.wall_time * 1e3:.1f} ms)"
        lines = [head, f"  {'machine':<24} {'action':<7} {'device':<8} {'lane':<5} {'ms':>9}"]
        for r in self.rows():
            lines.append(f"  {r['machine']:<24} {r['action']:<7} {r['device']:<8} {str(r['lane']):<5} "
                         f"{r['seconds'] * 1e3:>9.2f}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        from html import escape

        cells = "".join(
            f"<tr><td>{escape(r['machine'])}</td><td>{r['action']}</td><td>{escape(r['device'])}</td>"
            f"<td>{escape(str(r['path']))}</td><td>{r['lane']}</td><td>{r['seconds'] * 1e3:.2f}</td></tr>"
            for r in self.rows())
        return ("<table><caption>" + escape(f"FitReport ({self.executor})") + "</caption>"
                "<tr><th>machine</th><th>action</th><th>device</th><th>path</th><th>lane</th><th>ms</th></tr>"
                + cells + "</table>")


def _machines_of(target: Any) -> tuple["Machine", ...]:
    from .machines import Machine

    if isinstance(target, Machine):
        return upstream_machines(list(target.args)) + (target,)
    if is_node(target):
        return upstream_machines([target])
    msg = f"expected a node or a machine, got {target!r} of type {type(target).__name__}."
    raise TypeError(msg)


def report(target: Any) -> dict[str, dict[str, Any]]:
    """``{label: machine.report()}`` for every machine upstream of ``target``.

    Parameters
    ----------
    target : Node or Machine
        The network's output (or a machine); every machine upstream of it is reported.

    Returns
    -------
    dict
        One entry per machine, keyed by its readable label (``Ridge``, ``Ridge#2``): what it did at
        its last fit (``action``, ``seconds``, ``n_rows``, ``device``, ``path``, ``history``, ...).

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> from sklearn.linear_model import Ridge
    >>> X, y = gn.source(np.eye(3), name="X"), gn.source(np.ones(3), name="y")
    >>> p = gn.machine(Ridge(), X, y).predict(X)
    >>> _ = p.fit()
    >>> gn.report(p)["Ridge"]["action"]
    'train'
    """
    ms = _machines_of(target)
    return {label: m.report() for m, label in labels(ms).items()}


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

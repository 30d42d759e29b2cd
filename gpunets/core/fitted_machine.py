"""A trained machine as a node's function receives it: ``gn.node(f, mach)``.

A machine given to :func:`gpunets.node` among the arguments is a dependency
like any node (MLJ's ``node(f, mach)``): fitting the node trains the machine,
and calling it applies ``f`` to a :class:`FittedMachine`, a snapshot of the
machine's fitted state (the fitted estimator and what its fit reported).  The
snapshot holds no training data and no graph, so it is what a dask worker
receives too: the same object on every executor.  Like any node's input, it
is moved to the device where ``f`` runs: its :meth:`FittedMachine.fitted_params`
are then on that device (those a GPU array can hold), whatever device the
estimator computed them on (a model that fell back to the CPU, say).

In the graph, the machine stands behind a node with operation
:data:`MACHINE_VALUE` and no arguments, whose value is that snapshot; its
machine's training edges make it depend on the machine.

>>> import numpy as np, gpunets as gn
>>> from sklearn.linear_model import LinearRegression
>>> X = gn.source(np.arange(4.0).reshape(4, 1), name="X")
>>> mach = gn.machine(LinearRegression(), X, gn.source(3 * np.arange(4.0), name="y"))
>>> coef = gn.node(lambda m: m.fitted_params()["coef_"], mach, name="coef")
>>> coef
<Node coef(machine(LinearRegression))>
>>> _ = coef.fit()
>>> coef().round(6).tolist()
[3.0]
"""

from __future__ import annotations

from typing import Any

from gpunets.base.saved import saved_operation
from gpunets.devices.data import to_device

__all__ = ["MACHINE_VALUE", "FittedMachine", "learned_attributes"]

#: The operation of the node standing for a machine among ``gn.node``'s arguments.
MACHINE_VALUE = "machine"


def learned_attributes(est: Any) -> dict[str, Any]:
    """The learned attributes of a fitted estimator (scikit-learn's trailing ``_``), by name.

    A composite's ``fitted_params_`` (its components', and its fitted-params nodes' values) come
    under ``"components"``, as :meth:`gpunets.Machine.report` has its ``report_``.
    """
    out: dict[str, Any] = {}
    for k in sorted(vars(est)) if hasattr(est, "__dict__") else []:
        if k.endswith("_") and not k.startswith("_") and not k.endswith("__"):
            out[k] = getattr(est, k)
    extra = getattr(est, "fitted_params_", None)   # a composite: its components' (as report() has them)
    if isinstance(extra, dict):
        out["components"] = extra
    return out


class FittedMachine:
    """A machine's fitted state, as ``f`` receives it in ``gn.node(f, mach)``.

    Attributes
    ----------
    label : str
        The machine's label.
    model : estimator
        The machine's model (its hyperparameters), as it was when the node was evaluated.
    estimator_ : estimator
        The fitted estimator.
    device : Device or None
        Where :meth:`fitted_params` puts array attributes (None: where the estimator keeps them).

    Examples
    --------
    >>> from sklearn.linear_model import Ridge
    >>> import numpy as np
    >>> fm = FittedMachine("Ridge", Ridge(), Ridge().fit(np.eye(2), [0.0, 1.0]), {"action": "train"})
    >>> fm, fm.is_fitted, sorted(fm.fitted_params())[:2], fm.report()["action"]
    (<FittedMachine Ridge (train)>, True, ['coef_', 'intercept_'], 'train')
    """

    __slots__ = ("label", "model", "estimator_", "_report", "device")
    is_fitted = True

    def __init__(self, label: str, model: Any, estimator: Any, report: dict[str, Any], device: Any = None) -> None:
        self.label = label
        self.model = model
        self.estimator_ = estimator
        self._report = report
        self.device = device

    def on(self, device: Any) -> FittedMachine:
        """This snapshot, with :meth:`fitted_params` on ``device`` (what a move of the value does)."""
        return FittedMachine(self.label, self.model, self.estimator_, self._report, device)

    def fitted_params(self) -> dict[str, Any]:
        """The learned attributes of the fitted estimator (as :meth:`gpunets.Machine.fitted_params`).

        On :attr:`device` when set (the device where the node's function runs); an attribute no array
        there can hold (strings, objects) stays as it is.
        """
        out = learned_attributes(self.estimator_)
        if self.device is None:
            return out
        return {k: _on(v, self.device) for k, v in out.items()}

    def report(self) -> dict[str, Any]:
        """What the machine's fit did: ``label``, ``model``, ``action``, ``seconds``, ``n_rows``, ``device``, ``path``."""
        out = {"label": self.label, "model": type(self.model).__name__, "trained": True, **self._report}
        extra = getattr(self.estimator_, "report_", None)
        if isinstance(extra, dict):
            out["components"] = extra
        return out

    def __repr__(self) -> str:
        return f"<FittedMachine {self.label} ({self._report.get('action', 'trained')})>"


def _on(value: Any, device: Any) -> Any:
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):   # arrays only: not the estimators, dicts...
        return value
    try:
        return to_device(value, device, frames="array")
    except TypeError:   # a value no array on that device holds (strings, objects): where it is
        return value


def _report_of(action: str, info: dict[str, Any]) -> dict[str, Any]:
    return {"action": action, "seconds": info.get("seconds", 0.0), "n_rows": info.get("n_rows"),
            "device": info.get("device", "cpu"), "path": info.get("path", "sklearn")}


def view_of_fit(label: str, model: Any, action: str, fitted: tuple[Any, ...]) -> FittedMachine:
    """The snapshot of a machine trained in the running plan (``fitted``: its fit task's value)."""
    est, info = fitted[0], fitted[1]
    return FittedMachine(label, model, est, _report_of(action, info))


@saved_operation
def view_of_estimator(label: str, model: Any, est: Any) -> FittedMachine:
    """The snapshot of a machine a search trained (its fit's estimator only)."""
    return FittedMachine(label, model, est, {"action": "train"})


def state_report(st: Any) -> dict[str, Any]:
    """The report fields of a :class:`gpunets.core.machines.FittedState` (plain values: safe to send to a worker)."""
    return {"action": st.action, "seconds": st.seconds, "n_rows": st.n_rows, "device": st.device, "path": st.path}

"""Report and fitted-params nodes of a composite (MLJ's ``prefit`` returning ``report=`` / ``fitted_params=``).

Beside its operations, the dict a composite's ``network`` returns may hold
``"report"`` and ``"fitted_params"``: each a dict ``{name: node}``.  Fitting
the composite trains what those nodes depend on too, then evaluates them once
on the training data (with the composite's executor and device); their values
join the composite's ``report_`` / ``fitted_params_`` under their names, beside
the components' entries.

>>> import numpy as np, gpunets as gn
>>> from sklearn.linear_model import LinearRegression
>>> class Line(gn.CompositeRegressor):
...     def __init__(self, model=None):
...         self.model = model
...     def network(self, X, y):
...         m = gn.machine(self.model or LinearRegression(), X, y)
...         slope = gn.node(lambda fm: float(fm.fitted_params()["coef_"][0]), m)
...         return {"predict": m.predict(X), "fitted_params": {"slope": slope},
...                 "report": {"n_train": gn.node(len, X)}}
>>> line = Line(LinearRegression()).fit(np.arange(5.0).reshape(5, 1), 2 * np.arange(5.0))
>>> round(line.fitted_params_["slope"], 6), line.report_["n_train"], sorted(line.report_)
(2.0, 5, ['model', 'n_train'])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpunets.api.network import evaluate
from gpunets.base.config import config
from gpunets.base.saved import saved_operation
from gpunets.core.machines import Machine
from gpunets.core.nodes import AbstractNode, is_node, node
from gpunets.devices.placement import override_placement

__all__ = ["EXTRA_KEYS", "Outputs", "check_extra", "check_extra_names", "extra_nodes", "evaluate_extras"]

#: Keys of a network's dict that hold named nodes for the composite's report / fitted params.
EXTRA_KEYS = ("report", "fitted_params")


class Outputs(dict):
    """``{operation: node}`` of a composite's network, with its report and fitted-params nodes in ``extras``."""

    def __init__(self, operations: Mapping[str, AbstractNode], extras: dict[str, dict[str, AbstractNode]]) -> None:
        super().__init__(operations)
        self.extras = extras


def check_extra(owner: str, key: str, value: Any) -> dict[str, AbstractNode]:
    """``value`` (the network's entry ``key``) checked: a dict ``{name: node}`` with string names."""
    if not isinstance(value, Mapping):
        msg = (f"{owner}.network returned {value!r} of type {type(value).__name__} for {key!r}; expected a dict "
               f"{{name: node}}. Hint: return {{'predict': ..., '{key}': {{'coef': gn.node(f, mach)}}}}.")
        raise TypeError(msg)
    out: dict[str, AbstractNode] = {}
    for name, n in value.items():
        if not isinstance(name, str) or not name:
            msg = (f"{owner}.network returned the name {name!r} in {key!r}; names must be non-empty strings "
                   f"(they become keys of the composite's {key}_).")
            raise TypeError(msg)
        if not is_node(n):
            hint = (f" Hint: pass the machine to a node, e.g. gn.node(lambda m: m.{key}(), mach)."
                    if isinstance(n, Machine) else " Hint: build it with gn.node(fn, ...).")
            msg = (f"{owner}.network returned {n!r} of type {type(n).__name__} for {key}[{name!r}]; expected a "
                   f"gpunets node.{hint}")
            raise TypeError(msg)
        out[name] = n
    return out


def check_extra_names(owner: str, extras: dict[str, dict[str, AbstractNode]], components: set[str]) -> None:
    """Names of report / fitted-params nodes must not hide a component's entry (checked before any fit)."""
    for key, nodes in extras.items():
        clash = sorted(set(nodes) & components)
        if clash:
            msg = (f"{owner}.network returned {key} nodes named {clash}, which are also component names of its "
                   f"network (its {key}_ keys: {sorted(components)}). Hint: rename them, e.g. "
                   f"{clash[0] + '_value'!r}.")
            raise ValueError(msg)


def extra_nodes(extras: dict[str, dict[str, AbstractNode]]) -> list[AbstractNode]:
    """Every report / fitted-params node, in order."""
    return [n for nodes in extras.values() for n in nodes.values()]


@saved_operation
def _collect(*values: Any) -> tuple[Any, ...]:
    return values


def evaluate_extras(extras: dict[str, dict[str, AbstractNode]], opts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The values of the report / fitted-params nodes on the training data, in one call of the network."""
    nodes = extra_nodes(extras)
    if not nodes:
        return {}
    both = node(_collect, *nodes, name="composite extras")
    run = {"executor": opts["executor"], "workers": opts["workers"], "output": "device"}
    if opts["device"] is not None:
        with config(device=opts["device"]), override_placement(opts["device"]):
            values = iter(evaluate(both, **run))
    else:
        values = iter(evaluate(both, **run))
    return {key: {name: next(values) for name in named} for key, named in extras.items()}

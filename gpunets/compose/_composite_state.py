"""A composite's fitted network state, and the small checks its estimator API shares.

Part of :mod:`gpunets.compose.composite`: :class:`NetworkState` is what a fitted composite keeps of its
network (outputs, machines, the parameters it was built from); the helpers tell estimators from other values,
relabel machines and compare parameters the way ``get_params`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
from sklearn.base import is_regressor
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from gpunets.api.report import ActionMap, asked_device
from gpunets.base import verbs
from gpunets.compose._composite_extras import EXTRA_KEYS, Outputs, check_extra
from gpunets.compose._composite_ops import same_value
from gpunets.core.machines import Machine
from gpunets.core.nodes import AbstractNode, Node, Source, is_node
from gpunets.core.ops import combine

#: The operations a composite may offer (those its network returns nodes for).
COMPOSITE_OPERATIONS = ("predict", "predict_proba", "predict_log_proba", "decision_function", "transform",
                        "inverse_transform")



@dataclass(frozen=True)
class NetworkState:
    """The fitted network of a composite; replaced as a whole at each successful fit, never mutated."""

    sources: dict[str, Source]
    data: dict[str, Any]
    outputs: dict[str, AbstractNode]
    machines: tuple[Machine, ...]
    names: dict[int, str]                      # id(machine) -> component name or label
    plain_params: dict[str, Any] = field(default_factory=dict)
    fingerprints: dict[str, Any] = field(default_factory=dict)   # of ``data``, taken at the fit
    extras: dict[str, dict[str, Any]] = field(default_factory=dict)  # values of the report / fitted_params nodes

    def __getstate__(self) -> dict[str, Any]:
        """``names`` is keyed by ``id(machine)``, which a copy does not keep (pickle, a dask worker's result,
        ``deepcopy``): it travels as a list in the machines' order and is keyed again by :meth:`__setstate__`."""
        return {**self.__dict__, "names": [self.names.get(id(m)) for m in self.machines]}

    def __setstate__(self, state: dict[str, Any]) -> None:
        names = state["names"]
        if isinstance(names, list):
            state = {**state, "names": {id(m): n for m, n in zip(state["machines"], names) if n is not None}}
        self.__dict__.update(state)


def _is_estimator(v: Any) -> bool:
    return not isinstance(v, type) and callable(getattr(v, "fit", None))


def _has_operation(op: str) -> Any:
    def check(self: Any) -> bool:   # self: a Composite
        if op in self._gn_available_operations():
            return True
        self._gn_explain_missing(op)   # may raise the component's own error, chained by available_if
        return False

    check.__name__ = f"has_{op}"
    return check


def _relabel(report: Any, names: dict[int, str]) -> None:
    """Key the report by component name (``report.actions["first"]``) instead of class labels."""
    labels = {m: names.get(id(m), lab) for m, lab in report.labels.items()}
    if len(set(labels.values())) == len(labels):
        report.labels = labels
        report.actions = ActionMap(dict(report.actions), labels)


def _same_param(a: Any, b: Any) -> bool:
    """Equal hyperparameter values; objects without ``==`` (splitters...) compare by their repr."""
    if same_value(a, b):
        return True
    if type(a) is not type(b) or type(a).__repr__ is object.__repr__:
        return False
    try:
        return repr(a) == repr(b)
    except Exception:
        return False


def _is_pandas(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "pandas"


def _is_hstack(node: Node) -> bool:
    op = node.operation
    return isinstance(op, partial) and op.func is combine and op.args == ("hstack",)


def feature_names_of(node: AbstractNode, names: np.ndarray, owner: str) -> list[str]:
    """Output feature names of ``node`` in a fitted network, given the names of source ``X``.

    The rule (:meth:`CompositeTransformer.get_feature_names_out`): source ``X`` gives ``names``;
    ``mach.transform(a)`` gives the fitted estimator's ``get_feature_names_out(names of a)``;
    ``gn.hstack(a, b, ...)`` the concatenation of its branches' names.  Anything else raises
    an ``AttributeError`` naming the node (scikit-learn's type when names cannot be given).
    """
    # "does not provide get_feature_names_out": scikit-learn's set_output then falls back to unnamed columns
    hint = (f"So {owner} does not provide get_feature_names_out for this network. Hint: define "
            f"get_feature_names_out(self, input_features=None) in {owner}, or end its 'transform' branch with machine "
            "transforms (of estimators that have get_feature_names_out) and gn.hstack.")
    if isinstance(node, Source):
        if node.name == "X":
            return [str(n) for n in names]
        msg = (f"{owner}.get_feature_names_out: the 'transform' output depends on source {node.label!r}, whose "
               f"columns have no names; only source 'X' has (its input features). {hint}")
        raise AttributeError(msg)
    if isinstance(node, Node) and node.machine is not None and node.operation == "transform" and node.args:
        inner = feature_names_of(node.args[0], names, owner)
        est = node.machine.estimator_
        if not callable(getattr(est, "get_feature_names_out", None)):
            msg = (f"{owner}.get_feature_names_out: machine {node.machine.label!r} ({type(est).__name__}) has no "
                   f"get_feature_names_out, so the names of its transform's columns are unknown. {hint}")
            raise AttributeError(msg)
        return [str(n) for n in est.get_feature_names_out(np.asarray(inner, dtype=object))]
    if isinstance(node, Node) and _is_hstack(node):
        return [n for a in node.args for n in feature_names_of(a, names, owner)]
    what = f"{node.op_name} of machine {node.machine.label!r}" if isinstance(node, Node) and node.machine else (
        node.op_name if isinstance(node, Node) else type(node).__name__)
    msg = (f"{owner}.get_feature_names_out: cannot derive names through node {node!r} ({what}); names are "
           f"derived through source 'X', machine transforms and gn.hstack only. {hint}")
    raise AttributeError(msg)


class CompositeViews:
    """What a fitted composite shows: its report, fitted parameters, machines and pictures (mixed into Composite)."""

    if TYPE_CHECKING:  # pragma: no cover - Composite's (its fitted state is set on the instance by fit)
        _gn_state: NetworkState

        def _gn_build(self, sources: dict[str, Source],
                      extra: dict[str, Any] | None = None) -> dict[str, AbstractNode]: ...

    # --- reports -------------------------------------------------------------------------------------
    @property
    def report_(self) -> dict[str, dict[str, Any]]:
        """``{component name: machine report}`` of the fitted network, and the values of its report nodes.

        Each machine's report says where it ran (``device``) and what was asked (``asked``: the composite's
        ``device``, or the machine's own placement), so a fallback to the CPU shows.
        """
        check_is_fitted(self, "fit_report_")
        st = self._gn_state
        return {**{st.names[id(m)]: {**m.report(), "asked": asked_device(m)} for m in st.machines},
                **st.extras.get("report", {})}

    @property
    def fitted_params_(self) -> dict[str, dict[str, Any]]:
        """``{component name: learned attributes}`` of the fitted network, and the values of its fitted-params nodes."""
        check_is_fitted(self, "fit_report_")
        st = self._gn_state
        return {**{st.names[id(m)]: m.fitted_params() for m in st.machines}, **st.extras.get("fitted_params", {})}

    @property
    def machines_(self) -> dict[str, Machine]:
        """``{component name: machine}`` of the fitted network."""
        check_is_fitted(self, "fit_report_")
        st = self._gn_state
        return {st.names[id(m)]: m for m in st.machines}

    # --- display (Jupyter) ------------------------------------------------------------------------
    def _gn_display_outputs(self) -> dict[str, AbstractNode] | None:
        """The fitted network's outputs, else the network built on data-less sources, else None."""
        st = self.__dict__.get("_gn_state")
        if st is not None:
            return dict(st.outputs)
        try:
            return self._gn_build({"X": Source(name="X"), "y": Source(name="y")})
        except Exception:  # noqa: BLE001 - a network that needs data to be built: no picture before fit
            return None

    def to_dot(self) -> str:
        """Graphviz source of the composite's network (the fitted one, else as it would be built).

        Raises
        ------
        ValueError
            If the network can only be built from data and the composite is not fitted yet.
        """
        outs = self._gn_display_outputs()
        if outs is None:
            msg = (f"{type(self).__name__}.network cannot be built without data; fit the composite first, "
                   "then call to_dot() again.")
            raise ValueError(msg)
        return verbs.get("to_dot")(list(outs.values()))   # display.py stays lazy

    def _repr_html_(self) -> str:
        """scikit-learn's estimator diagram, then the network as SVG (Graphviz where ``dot`` exists)."""
        import html

        try:
            from sklearn.utils import estimator_html_repr

            head = estimator_html_repr(self)
        except Exception:  # noqa: BLE001 - the display must not fail
            head = f"<pre>{html.escape(repr(self))}</pre>"
        outs = self._gn_display_outputs()
        if outs is None:
            return head + "<p>network: built at fit (it needs the data)</p>"
        targets = list(outs.values())
        ops = ", ".join(outs)
        fitted = "fitted" if "_gn_state" in self.__dict__ else "not fitted"
        picture = verbs.get("repr_html")(targets)   # the graph as inline SVG, rendered once per display
        return head + f"<p>network ({fitted}; operations: {html.escape(ops)}):</p>" + picture

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, str]:
        return {"text/plain": repr(self), "text/html": self._repr_html_()}


class CompositeChecks:
    """The checks of a composite's network and of the data given to fit and to its calls (mixed into Composite)."""

    if TYPE_CHECKING:  # pragma: no cover - Composite's class attribute, and scikit-learn's BaseEstimator method
        _default_operation: str

        def __sklearn_tags__(self) -> Any: ...

    def _gn_check_outputs(self, result: Any) -> dict[str, AbstractNode]:
        name = type(self).__name__
        if is_node(result):
            return {self._default_operation: result}
        if isinstance(result, Machine):
            msg = (f"{name}.network returned the machine {result!r}; it must return a node or a dict of "
                   f"nodes. Hint: return {{'{self._default_operation}': mach.{self._default_operation}(X)}}.")
            raise TypeError(msg)
        if not isinstance(result, Mapping):
            msg = (f"{name}.network must return a node or a dict {{operation: node}}; it returned {result!r} "
                   f"of type {type(result).__name__}. Hint: return {{'predict': mach.predict(X)}}.")
            raise TypeError(msg)
        if not result:
            msg = (f"{name}.network returned an empty dict; it must expose at least one operation "
                   f"among {list(COMPOSITE_OPERATIONS)}.")
            raise ValueError(msg)
        out: dict[str, AbstractNode] = {}
        extras: dict[str, dict[str, AbstractNode]] = {}
        for op, node in result.items():
            if op in EXTRA_KEYS:   # named nodes for report_ / fitted_params_ (gpunets.compose._composite_extras)
                extras[op] = check_extra(name, op, node)
                continue
            if op not in COMPOSITE_OPERATIONS:
                msg = (f"{name}.network returned an unknown operation {op!r}. Valid operations are "
                       f"{list(COMPOSITE_OPERATIONS)}. Hint: key the dict by the method the model should "
                       "offer, e.g. {'predict': ...}.")
                raise ValueError(msg)
            if not is_node(node):
                hint = (f" Hint: return mach.{op}(X), not the machine." if isinstance(node, Machine) else
                        " Hint: build it with gn.machine(...).predict(X) or gn.node(fn, ...).")
                msg = (f"{name}.network returned {node!r} of type {type(node).__name__} for operation {op!r}; "
                       f"expected a gpunets node.{hint}")
                raise TypeError(msg)
            out[op] = node
        if not out:
            msg = (f"{name}.network returned only {sorted(extras)}; it must expose at least one operation "
                   f"among {list(COMPOSITE_OPERATIONS)} beside them. Hint: add {{'predict': mach.predict(X)}}.")
            raise ValueError(msg)
        return Outputs(out, extras) if extras else out

    def _gn_validate_fit(self, X: Any, y: Any) -> tuple[Any, Any]:
        """Validate training data like scikit-learn; return what the network's sources get."""
        tags = self.__sklearn_tags__()
        kw = dict(accept_sparse=["csr", "csc"] if tags.input_tags.sparse else False, dtype="numeric",
                  ensure_all_finite="allow-nan" if tags.input_tags.allow_nan else True)
        if y is None and not tags.target_tags.required:
            Xv = validate_data(self, X, reset=True, **kw)
            yv = None
        else:
            Xv, yv = validate_data(self, X, y, reset=True, multi_output=tags.target_tags.multi_output,
                                   y_numeric=is_regressor(self), **kw)
        Xo = X if _is_pandas(X) and getattr(X, "ndim", 2) == 2 else Xv
        yo = y if _is_pandas(y) and getattr(y, "ndim", 1) == 1 else yv
        return Xo, yo

    def _gn_validate_call(self, X: Any, op: str) -> Any:
        tags = self.__sklearn_tags__()
        kw = dict(accept_sparse=["csr", "csc"] if tags.input_tags.sparse else False, dtype="numeric",
                  ensure_all_finite="allow-nan" if tags.input_tags.allow_nan else True)
        if op == "inverse_transform":
            Xv = check_array(X, **kw)
        else:
            Xv = validate_data(self, X, reset=False, **kw)
        return X if _is_pandas(X) and getattr(X, "ndim", 2) == 2 else Xv

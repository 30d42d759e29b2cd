"""Sample weights and metadata routing for composites and stacks.

``fit(X, y, sample_weight=w)`` on a composite whose ``network`` does not take
``sample_weight`` routes the weights to the members (the machines) of its
network:

* without metadata routing (scikit-learn's default), every member trains
  with ``sample_weight=w``; a member whose ``fit`` cannot take it is named in
  a ``TypeError`` raised before anything trains (scikit-learn's meta-estimators
  raise too, once that member's fit fails);
* with ``sklearn.set_config(enable_metadata_routing=True)``, the composite is a
  scikit-learn *router* (:meth:`get_metadata_routing`): a member gets the
  metadata it requested with ``set_fit_request(sample_weight=True)``, not what
  it declined (``False``), and metadata passed to a member that neither
  requested nor declined them raise scikit-learn's own
  :class:`~sklearn.exceptions.UnsetMetadataPassedError`
  (:func:`sklearn.utils.metadata_routing.process_routing` decides).

The weights become a source named ``"sample_weight"``, passed to each routed
machine as the keyword training argument ``sample_weight=`` (see
:mod:`gpunets.core.weights`): they follow the rows of the data, so a network that
trains a member on a subset of the rows must take ``sample_weight`` in
``network(X, y, sample_weight=None)`` and route it itself (stacks do).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np
from sklearn.utils.metadata_routing import MetadataRouter, MethodMapping, _routing_enabled, process_routing
from sklearn.utils.validation import has_fit_parameter

from gpunets.core.graph import upstream_machines
from gpunets.core.machines import Machine
from gpunets.core.nodes import Source
from gpunets.core.weights import add_fit_keyword
from gpunets.devices.rows import n_rows

__all__ = ["routing_enabled", "network_takes", "routed_names", "check_fit_metadata", "route_to_members", "members_router",
           "composite_members", "takes_sample_weight", "weights_refused"]

WEIGHTS = "sample_weight"


def routing_enabled() -> bool:
    """Whether scikit-learn's metadata routing is on (``sklearn.set_config(enable_metadata_routing=True)``)."""
    return bool(_routing_enabled())


def takes_sample_weight(model: Any) -> bool:
    """Whether ``model.fit`` takes ``sample_weight`` by name (a gpunets composite routes it, so it does).

    >>> from sklearn.linear_model import Ridge
    >>> from sklearn.neighbors import KNeighborsRegressor
    >>> takes_sample_weight(Ridge()), takes_sample_weight(KNeighborsRegressor())
    (True, False)
    """
    return bool(getattr(model, "_gn_routes_metadata", False)) or has_fit_parameter(model, WEIGHTS)


def weights_refused(owner: str, culprits: Mapping[str, Any]) -> TypeError:
    """The error for members that cannot take ``sample_weight`` (``{name: model}``)."""
    what = ", ".join(f"{n!r} ({type(m).__name__})" for n, m in culprits.items())
    one = len(culprits) == 1
    msg = (f"{owner}.fit(..., sample_weight=...): the member{'' if one else 's'} {what} cannot take sample_weight "
           f"(no sample_weight parameter in {'its' if one else 'their'} fit), so the weights cannot reach "
           f"{'it' if one else 'them'}; nothing was trained. Every member must accept the weights, as in "
           "scikit-learn (\"Underlying estimator ... does not support sample weights\"). Hint: use members that "
           "take sample weights, or turn on metadata routing (sklearn.set_config(enable_metadata_routing=True)) "
           "and call set_fit_request(sample_weight=True) only on the members that should get them.")
    return TypeError(msg)


def network_takes(composite: Any) -> tuple[set[str], bool]:
    """The keyword parameters of ``composite.network`` beyond ``X`` and ``y``, and whether it has ``**kwargs``."""
    try:
        params = list(inspect.signature(composite.network).parameters.values())
    except (TypeError, ValueError):
        return set(), True
    names = {p.name for p in params[2:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return names, any(p.kind is p.VAR_KEYWORD for p in params)


def routed_names(composite: Any, fit_params: Mapping[str, Any]) -> set[str]:
    """The names of ``fit``'s keyword arguments routed to the members: those ``network`` does not take."""
    takes, var_kw = network_takes(composite)
    return set() if var_kw else {k for k in fit_params if k not in takes}


def check_fit_metadata(composite: Any, X: Any, fit_params: dict[str, Any]) -> dict[str, Any]:
    """Validate ``fit``'s keyword arguments before any work; return them (weights as arrays).

    ``sample_weight=None`` is dropped; list weights become arrays; weights must be 1-D with one value per
    row of ``X``.  Arguments ``network`` takes go to ``network``; others are metadata routed to the
    members (only ``sample_weight`` unless metadata routing is on).

    Raises
    ------
    ValueError
        Weights of the wrong shape or length.
    TypeError
        An argument that neither ``network`` nor the routing can take.
    """
    cls = type(composite).__name__
    params = dict(fit_params)
    if WEIGHTS in params:
        w = params[WEIGHTS]
        if w is None:
            del params[WEIGHTS]
        else:
            if not hasattr(w, "shape"):
                w = np.asarray(w)
            shape = tuple(getattr(w, "shape", ()))
            n = n_rows(X)
            if len(shape) != 1 or shape[0] != n:
                got = f"{shape[0]} values" if len(shape) == 1 else f"shape {shape}"
                msg = (f"{cls}.fit: sample_weight has {got}, but X has {n} rows; expected a 1-D array with one "
                       "weight per row of X.")
                raise ValueError(msg)
            params[WEIGHTS] = w
    routed = routed_names(composite, params)
    if not routed:
        return params
    allowed = set(getattr(composite, "_gn_routable", None) or ((WEIGHTS,) if not routing_enabled() else routed))
    bad = sorted(routed - allowed)
    if bad:
        why = ("only sample_weight is routed to the members without metadata routing"
               if not routing_enabled() else f"{cls} routes only {sorted(allowed)} to its members")
        msg = (f"{cls}.fit got unexpected keyword argument(s) {bad}: its network(X, y) does not take them and "
               f"{why}. Hint: add the parameter to network(), or turn on metadata routing "
               "(sklearn.set_config(enable_metadata_routing=True)) and request it with set_fit_request on the "
               "members that need it.")
        raise TypeError(msg)
    for k in routed:   # metadata are data: sources, cut to rows like X
        if not hasattr(params[k], "shape"):
            params[k] = np.asarray(params[k])
    return params


def members_router(owner: Any, members: Mapping[str, Any]) -> MetadataRouter:
    """A scikit-learn router sending ``owner.fit``'s metadata to each member's ``fit`` (``{name: model}``)."""
    router = MetadataRouter(owner=owner)
    for name, model in members.items():
        router.add(**{name: model}, method_mapping=MethodMapping().add(caller="fit", callee="fit"))
    return router


def route_to_members(composite: Any, machines: tuple[Machine, ...], names: Mapping[int, str],
                     metadata: Mapping[str, Source]) -> None:
    """Give each machine of a freshly built network the metadata routed to it, as keyword training arguments.

    ``names`` maps ``id(machine)`` to its component name; ``metadata`` the routed names to their sources.
    Everything is decided (and every error raised) before a machine is touched.
    """
    if not metadata:
        return
    cls = type(composite).__name__
    free = [m for m in machines if not set(metadata) & set(m.fit_keywords)]   # the network routed these itself
    plan: dict[int, dict[str, Source]] = {}
    if routing_enabled():
        router = members_router(composite, {names[id(m)]: m.model for m in free})
        values = {k: s.data for k, s in metadata.items()}
        routed = process_routing(router, "fit", **values)
        for m in free:
            got = routed[names[id(m)]]["fit"]
            plan[id(m)] = {k: metadata[k] for k in got}
    else:
        refused = {names[id(m)]: m.model for m in free if not takes_sample_weight(m.model)}
        if refused:
            raise weights_refused(cls, refused)
        plan = {id(m): dict(metadata) for m in free}
    for m in free:
        for k, s in plan.get(id(m), {}).items():
            add_fit_keyword(m, k, s)


def composite_members(composite: Any) -> dict[str, Any]:
    """``{component name: model}`` of every machine of ``composite``'s network, as a fit would name them.

    The network is built on data-less sources (graph only); one that needs data to be built gives the
    fitted network's machines, else the composite's component hyperparameters.
    """
    try:
        outs = composite._gn_build({"X": Source(name="X"), "y": Source(name="y")})
        machines = upstream_machines(list(outs.values()))
    except Exception:  # noqa: BLE001 - a network that needs data to be built
        st = composite.__dict__.get("_gn_state")
        if st is None:
            return dict(composite._gn_components())
        machines = st.machines
    names = composite._gn_names(machines)
    return {names[id(m)]: m.model for m in machines}

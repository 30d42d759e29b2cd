"""Placement decisions of the planner: where each task runs, what moves there, and the route of each fit.

Part of :mod:`gpunets.planning.plan`: :class:`PlacementRules` holds the compiler's placement methods (the
device of an operation node, a source's value on a task's device, one move per value and device), and the
functions decide a fit's route (GPU twin, array API or CPU fallback) and report where a machine was asked to run.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from gpunets.base.config import get_config
from gpunets.base.exceptions import NetworkError
from gpunets.compute.estimators import is_frozen_estimator
from gpunets.compute.models import is_cuml_estimator, resolve_estimator
from gpunets.core.graph import machine_sources
from gpunets.core.machines import Machine
from gpunets.core.nodes import AbstractNode, Node, Source, data_not_saved, is_node
from gpunets.core.weights import check_weight_rows, keywords_fallback
from gpunets.devices.data import check_placeable, installed, n_rows, take_rows
from gpunets.devices.placement import (
    CPU,
    check_available,
    current_placement,
    device_exists,
    is_host_only,
    placement_override,
    resolve,
    same_device,
)
from gpunets.devices.value_types import host_only
from gpunets.planning import crossover
from gpunets.planning.tasks import _move

if TYPE_CHECKING:  # pragma: no cover
    from gpunets.planning.plan import Task, _Builder


def _resolve_fit(b: _Builder, m: Machine, pending: Any, deps: Sequence[int] = ()) -> Any:
    """Where machine ``m`` trains and as which estimator (None: the CPU clone as it is).

    A machine placed by default (no ``device=``, no block: ``"auto"``) whose training data no GPU
    array can hold (sparse, strings: :func:`~gpunets.devices.value_types.host_only`) trains on the CPU, as the
    data decide (docs/devices.md); an explicit GPU placement of such data stays an error.
    """
    what = f"machine {m.label}"
    dev = b.placed(m.device, what, owner=m)
    why = _PLACED   # machine -> why it went where it did at its last fit plan (the fit report's "placed")
    asked = _asked(m.device)
    if dev.is_cuda and _placed_by_default(m.device) and (
            any(host_only(s._data) for s in _raw_sources(m)) or is_frozen_estimator(pending.estimator)):
        dev = CPU   # host-only data, or a FrozenEstimator: its fitted state is the host object it wraps
        why[m] = ("auto: a FrozenEstimator (its state is a host object)" if is_frozen_estimator(pending.estimator)
                  else "auto: data no GPU array holds (sparse, strings)")
    elif dev.is_cuda and asked == "auto":
        on_gpu, why[m] = _crossover(b, m, pending.estimator)
        if not on_gpu:
            dev = CPU
    elif asked == "auto":
        why[m] = "auto: no GPU here" if not device_exists("cuda") else "auto"
    else:
        why[m] = f"asked for {asked}" + ("" if dev.is_cuda or asked == "cpu" else ", no GPU here")
    if dev.is_cpu and not is_cuml_estimator(pending.estimator):
        return None, dev, "sklearn"
    r = keywords_fallback(resolve_estimator(pending.estimator, dev, what=what), pending.estimator,
                          m.fit_keywords, what)
    if r.path in ("cpu_fallback", "array_api") and (getattr(pending.estimator, "_gn_incremental", False)
                                                    or pending.warm is not None):
        # the model's own class runs: keep the pending estimator, which for an update is the fitted
        # composite's incremental copy, or a warm update's copy of the fitted state (resolving clones
        # it, and a clone would retrain from scratch)
        import dataclasses

        r = dataclasses.replace(r, estimator=pending.estimator)
    return r, r.device, r.path


_PLACED: weakref.WeakKeyDictionary[Machine, str] = weakref.WeakKeyDictionary()


def placed_reason(m: Machine) -> str:
    """Why machine ``m`` trains where it does, as decided by its last fit plan ("" before any):
    ``"asked for cuda:0"``, or ``device="auto"``'s reason (``"auto: 5,000 rows < 50,000, the GPU crossover for
    Ridge"``, ``"auto: no GPU here"``...)."""
    return _PLACED.get(m, "")


def _crossover(b: _Builder, m: Machine, estimator: Any) -> tuple[bool, str]:
    """(on the GPU?, why) for machine ``m`` placed by default where a GPU is: its training rows against the
    crossover of its kind (:mod:`gpunets.planning.crossover`)."""
    table = crossover.table()
    kind = type(estimator).__name__
    if not table or crossover.threshold(kind, table)[0] is None:
        return crossover.decide(kind, None, table)
    return crossover.decide(kind, _training_rows(b, m), table)


def _training_rows(b: _Builder, m: Machine) -> int | None:
    """The rows ``m`` trains on: the fit's ``rows=``, else its sources' (the most of them); None if unknown."""
    rows = b.rows
    if rows is not None and not isinstance(rows, slice):
        try:
            return len(rows)
        except TypeError:
            return None
    counts = []
    for s in machine_sources(m):
        data = b.bindings.get(s._uid, s.data)
        if data is not None:
            try:
                counts.append(n_rows(data))
            except TypeError:
                continue
    if not counts:
        return None
    return len(range(*rows.indices(max(counts)))) if isinstance(rows, slice) else max(counts)


def _raw_sources(m: Machine) -> list[Source]:
    """The sources whose data reach ``m``'s training arguments untransformed by a model (row selections,
    user functions and combines pass them on; a machine's output stops the walk)."""
    out: list[Source] = []
    stack = list(m.args)
    seen: set[int] = set()
    while stack:
        a = stack.pop()
        if not is_node(a) or a._uid in seen:
            continue
        seen.add(a._uid)
        if isinstance(a, Source):
            out.append(a)
        elif getattr(a, "machine", None) is None:
            stack.extend(a.args)
    return out


def _placed_by_default(spec: Any) -> bool:
    """True when ``spec`` (a machine's ``device``) leaves the choice to the block or config ("auto")."""
    if spec is not None and not (spec.__class__ is str and spec.strip().lower() == "auto"):
        return False
    return placement_override() is None


def _warm_route_ok(m: Machine, dev: Any, path: str) -> bool:
    """A warm update continues only where its fitted state lives: the same device and route as its last fit."""
    st = m._state
    return st is not None and st.path == path and st.device == str(dev)


def _fit_keywords(m: Machine) -> dict[str, Any]:
    """The keyword arguments of ``m``'s fit task: its keyword training arguments' names, and the check of
    its sample weights' rows where it could not be made now (:func:`gpunets.core.weights.check_weight_rows`)."""
    out: dict[str, Any] = {}
    if m.fit_keywords:
        out["keywords"] = m.fit_keywords
    pending = check_weight_rows(m, lambda s: s.data)   # all rows: fit(rows=...) must not hide a mismatch
    if pending is not None:
        out["weights"] = (*pending, m.label)
    return out


def _asked(spec: Any) -> str:
    """The placement asked for a machine: its own ``device=``, else a block's (a composite's ``device``
    included), else the configured one; ``"auto"`` when none asks (the report's ``asked`` column)."""
    for level in (spec, placement_override(), current_placement(), get_config().get("device")):
        if level is not None and not (isinstance(level, str) and level.strip().lower() == "auto"):
            return str(level if isinstance(level, str) else level)
    return "auto"


class PlacementRules:
    """The compiler's placement methods (mixed into the plan builder, whose state they use)."""

    if TYPE_CHECKING:  # pragma: no cover - the plan builder's state (set in its __init__) and methods
        rows: Any
        bindings: dict[int, Any]
        mode: str
        tasks: list[Task]
        memo: dict[int, int]
        dev: list[Any]
        moves: dict[tuple[int, Any, str], int]
        _placed: dict[Any, Any]
        floating: set[int]
        cache: bool

        def add(self, *, device: Any = None, recipe: Any = None, **kw: Any) -> int: ...

    def placed(self, spec: Any, what: str | Callable[[], str], owner: Any = None) -> Any:
        """The device ``spec`` resolves to here (explicit, block, config), after the availability check.

        ``what`` names the culprit in messages; it may be a function, called only when a message is
        needed (labels of deep nodes are not free, and most placements need none).
        """
        key = spec if spec is None or spec.__class__ is str else str(spec)
        dev = self._placed.get(key)
        if dev is None:
            dev = self._placed[key] = resolve(spec)
        if dev.is_cuda and not device_exists(dev):   # each machine or node placed there is named (warned once each)
            dev = check_available(dev, what=what() if callable(what) else what, owner=owner)
        return dev

    def fell_back(self, spec: Any, dev: Any) -> Any:
        """The CUDA device ``spec`` asked for where what was placed there runs on the CPU ``dev`` instead (no GPU
        here, or no GPU route for the estimator), else None."""
        if not dev.is_cpu:
            return None
        asked = self._placed.get(spec if spec is None or spec.__class__ is str else str(spec))
        return asked if asked is not None and asked.is_cuda else None

    def moved(self, key: int, dev: Any, frames: str = "auto") -> int:
        """The key of task ``key``'s value on ``dev``: a move task, made once per (value, device)."""
        have = self.dev[key]
        if have is dev or same_device(have, dev):
            return key
        if frames == "auto":
            frames = "cudf" if installed("cudf") else "array"
        mk = self.moves.get((key, dev, frames))
        if mk is None:
            src = self.tasks[key]
            if src.kind == "source" and dev.is_cuda:
                check_placeable(src.value, what=f"source {src.label!r} (moved to {dev})", device=dev)
            mk = self.add(kind="move", fn=partial(_move, dev, frames), deps=(key,), device=dev,
                          label=f"move {src.label} to {dev}",
                          recipe=((key,), f"move {dev} {frames}".encode()) if self.cache else None)
            self.moves[(key, dev, frames)] = mk
        return mk

    def _op_device(self, x: Node) -> Any:
        """Where operation node ``x`` runs (docs/devices.md, "Operation nodes follow their inputs").

        A host-only operation (:func:`~gpunets.devices.placement.host_only`) runs on the CPU, always; then an
        ``override_placement`` block, then the node's explicit placement (``device=`` or a ``gn.device``
        block); else the node runs where its inputs live when they agree, and where the config/``"auto"``
        says when they do not (or when it has no node inputs).
        """
        if is_host_only(x.operation):
            return CPU
        spec = x.device
        explicit = spec is not None and not (spec.__class__ is str and spec.strip().lower() == "auto")
        if not explicit and placement_override() is None:
            found = None
            inputs = False
            for a in x._args:
                if isinstance(a, AbstractNode):
                    inputs = True
                    k = self.memo[a._uid]
                    if k in self.floating:   # a constant follows its consumers: it has no say in where they run
                        continue
                    d = self.dev[k]
                    if found is None:
                        found = d
                    elif not same_device(found, d):
                        found = None
                        break
            if found is not None:
                return found
            if not inputs and current_placement() is None:
                # an input-less node (a constant, a search's parameters) is made on the host, and moved once to
                # each consumer's device; placed on "auto" it would drag its CPU consumers to a GPU
                self.floating.add(len(self.tasks))
                return CPU
        return self.placed(spec, lambda: f"node {x._short()}", owner=x)

    def _source_value(self, s: Source) -> Any:
        if s._uid in self.bindings:
            value = self.bindings[s._uid]
            what = "the data given for"
        else:
            value = s.data
            what = "the data of"
            if value is None:
                hint = (f"set it with {s.label}.data = ..." if self.mode == "fit"
                        else f"set it with {s.label}.data = ..., or pass data: node({s.label}=...)")
                msg = f"Source {s.label!r} has no data, so the network cannot be {'trained' if self.mode == 'fit' else 'evaluated'}: {hint}."
                if data_not_saved(s):   # a network from gn.load: say why the data are missing
                    msg = (f"Source {s.label!r} has no data: the network was loaded with gn.load, and gn.save never "
                           f"stores training data, so it cannot be {'trained' if self.mode == 'fit' else 'evaluated'} "
                           f"on its own data. {hint[0].upper() + hint[1:]}"
                           f"{' (and give every source its data) before fitting again' if self.mode == 'fit' else ''}.")
                raise NetworkError(msg)
        if self.rows is None:
            return value
        try:
            return take_rows(value, self.rows)
        except IndexError as e:
            msg = f"rows out of range for {what} source {s.label!r} ({n_rows(value)} rows): {e}"
            raise IndexError(msg) from None
